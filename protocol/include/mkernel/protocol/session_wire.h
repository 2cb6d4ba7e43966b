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
//  4. A daemon never waits on a client: it frames a reply once (frame_message) and tries to
//     send it without waiting (try_send_packet); what does not fit stays queued on its side.
//  5. connect_unix: a Unix socket whose listen backlog is full answers connect() with EAGAIN
//     (not EINPROGRESS: nothing is in progress). The connect is retried with a growing pause
//     (1 ms doubling up to 50 ms) until it succeeds or the bound expires.
//  6. A peer that closes with a message of ours unread makes the kernel report a reset (once)
//     before the messages it sent us are read. A receive that meets the reset reads again, so a
//     daemon's last word before it closes (the refusal of a connection) reaches the client.
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

// The packet for `msg`: the 4-byte little-endian length and the serialized body. Refuses a
// body larger than kMaxMessageBytes.
Status frame_message(const google::protobuf::MessageLite& msg, std::string* packet);

// One attempt to send a framed packet with `fds` attached, never waiting: true when it went,
// false when the socket's buffer is full (try again when it is writable). kUnavailable when the
// peer closed the connection.
StatusOr<bool> try_send_packet(int sock, const std::string& packet, const std::vector<int>& fds);

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

// Connects a SOCK_SEQPACKET socket to `path` within `timeout` (note 5); a clear error names the
// socket when it is absent, refuses, or its backlog stayed full for the whole bound.
StatusOr<UniqueFd> connect_unix(const std::string& path, std::chrono::milliseconds timeout);

}  // namespace mkernel::protocol
