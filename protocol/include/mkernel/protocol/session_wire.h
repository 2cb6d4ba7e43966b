// session_wire.h: framing of the setup messages between a client and mkerneld.
//
// Design notes
//  1. The client socket is a Unix SOCK_SEQPACKET socket: one packet is one message, so a short
//     read or a message spliced from two writes cannot happen. Each packet is a 4-byte
//     little-endian length and that many bytes of serialized protobuf; the length must equal the
//     packet's size minus 4 and be at most kMaxMessageBytes.
//  2. File descriptors travel in SCM_RIGHTS ancillary data of the packet they belong to. The
//     receiver states how many it expects; any other count, or truncated ancillary data
//     (MSG_CTRUNC), is an error, and every descriptor that did arrive is closed.
//  3. Every receive is bounded by a timeout (poll before recvmsg); expiry is kDeadlineExceeded.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "mkernel/common/status.h"

namespace google::protobuf {
class MessageLite;
}

namespace mkernel::protocol {

inline constexpr size_t kMaxMessageBytes = 65536;
inline constexpr int kMaxFdsPerMessage = 4;

// Owns a file descriptor; closes it on destruction.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { reset(); }
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) reset(o.release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    const int f = fd_;
    fd_ = -1;
    return f;
  }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// Sends one message, with `fds` (may be empty) attached. Never blocks longer than `timeout`.
Status send_message(int sock, const google::protobuf::MessageLite& msg, const std::vector<int>& fds,
                    std::chrono::milliseconds timeout);

// Receives one message into `msg`. Exactly `expected_fds` descriptors must be attached; they are
// returned in `fds_out`. Returns kUnavailable when the peer closed the connection.
Status recv_message(int sock, google::protobuf::MessageLite* msg, int expected_fds,
                    std::vector<UniqueFd>* fds_out, std::chrono::milliseconds timeout);

// As recv_message, but accepts 0..kMaxFdsPerMessage descriptors and reports how many came.
Status recv_message_any_fds(int sock, google::protobuf::MessageLite* msg,
                            std::vector<UniqueFd>* fds_out, std::chrono::milliseconds timeout);

// Connects a SOCK_SEQPACKET socket to `path`; a clear error names the socket when it is absent or
// refuses.
StatusOr<UniqueFd> connect_unix(const std::string& path, std::chrono::milliseconds timeout);

}  // namespace mkernel::protocol
