#include "mkernel/protocol/session_wire.h"

#include <google/protobuf/message_lite.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <thread>

namespace mkernel::protocol {

void UniqueFd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

namespace {

Status wait_fd(int sock, short events, std::chrono::milliseconds timeout, const char* what) {
  pollfd p{sock, events, 0};
  for (;;) {
    const int r = ::poll(&p, 1, static_cast<int>(timeout.count()));
    if (r > 0) return Status::Ok();
    if (r == 0)
      return Status(StatusCode::kDeadlineExceeded,
                    std::string(what) + ": no progress within " + std::to_string(timeout.count()) +
                        " ms");
    if (errno != EINTR) return errno_status(what, errno);
  }
}

void close_all(std::vector<int>& fds) {
  for (int f : fds) ::close(f);
  fds.clear();
}

Status recv_impl(int sock, google::protobuf::MessageLite* msg, int min_fds, int max_fds,
                 std::vector<UniqueFd>* fds_out, std::chrono::milliseconds timeout) {
  MK_RETURN_IF_ERROR(wait_fd(sock, POLLIN, timeout, "receive"));
  // One byte more than the largest legal packet, so an oversized one shows as MSG_TRUNC. Kept
  // per thread: a daemon receives many small messages and need not allocate 64 KiB for each.
  thread_local std::string buf(4 + kMaxMessageBytes + 1, '\0');
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)];
  iovec iov{buf.data(), buf.size()};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = control;
  mh.msg_controllen = sizeof(control);
  ssize_t n;
  do {
    n = ::recvmsg(sock, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
  } while (n < 0 && errno == EINTR);
  if (n < 0 && errno == ECONNRESET) {
    // The peer closed with something of ours unread (a daemon refusing a connection before it
    // read the hello). The kernel reports that reset once, before the messages still queued for
    // us: read again, so the peer's last word (its refusal) is not lost.
    mh.msg_controllen = sizeof(control);
    do {
      n = ::recvmsg(sock, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    } while (n < 0 && errno == EINTR);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == ECONNRESET))
      return Status(StatusCode::kUnavailable, "peer closed the connection");
  }
  if (n < 0) return errno_status("recvmsg", errno);
  // Take ownership of every descriptor that arrived before judging anything else.
  std::vector<int> fds;
  for (cmsghdr* c = CMSG_FIRSTHDR(&mh); c != nullptr; c = CMSG_NXTHDR(&mh, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int f;
        std::memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        fds.push_back(f);
      }
    }
  }
  if (n == 0) {
    close_all(fds);
    return Status(StatusCode::kUnavailable, "peer closed the connection");
  }
  if (mh.msg_flags & MSG_CTRUNC) {
    close_all(fds);
    return Status(StatusCode::kProtocolError,
                  "ancillary data truncated; expected at most " + std::to_string(max_fds) +
                      " file descriptor(s)");
  }
  if (mh.msg_flags & MSG_TRUNC) {
    close_all(fds);
    return Status(StatusCode::kProtocolError, "message larger than " +
                                                  std::to_string(kMaxMessageBytes) + " bytes");
  }
  if (static_cast<int>(fds.size()) < min_fds || static_cast<int>(fds.size()) > max_fds) {
    const size_t got = fds.size();
    close_all(fds);
    return Status(StatusCode::kProtocolError,
                  "file descriptors: " + std::to_string(got) + " attached; expected " +
                      (min_fds == max_fds ? std::to_string(min_fds)
                                          : std::to_string(min_fds) + ".." + std::to_string(max_fds)));
  }
  if (n < 4) {
    close_all(fds);
    return Status(StatusCode::kProtocolError,
                  "message of " + std::to_string(n) + " bytes; expected a 4-byte length first");
  }
  uint32_t len = 0;
  for (int i = 3; i >= 0; --i) len = (len << 8) | static_cast<uint8_t>(buf[static_cast<size_t>(i)]);
  if (len > kMaxMessageBytes) {
    close_all(fds);
    return Status(StatusCode::kProtocolError, "message body of " + std::to_string(len) +
                                                  " bytes; expected at most " +
                                                  std::to_string(kMaxMessageBytes));
  }
  if (len != static_cast<uint64_t>(n) - 4) {
    close_all(fds);
    return Status(StatusCode::kProtocolError,
                  "length prefix: " + std::to_string(len) + "; expected " + std::to_string(n - 4) +
                      " (the packet's payload size)");
  }
  if (!msg->ParseFromArray(buf.data() + 4, static_cast<int>(len))) {
    close_all(fds);
    return Status(StatusCode::kProtocolError, "message body of " + std::to_string(len) +
                                                  " bytes does not parse as " + msg->GetTypeName());
  }
  if (fds_out) {
    fds_out->clear();
    for (int f : fds) fds_out->emplace_back(f);
  } else {
    close_all(fds);
  }
  return Status::Ok();
}

}  // namespace

Status frame_message(const google::protobuf::MessageLite& msg, std::string* packet) {
  const size_t body = msg.ByteSizeLong();
  if (body > kMaxMessageBytes)
    return Status(StatusCode::kInvalidArgument,
                  "message size: " + std::to_string(body) + " bytes; expected at most " +
                      std::to_string(kMaxMessageBytes));
  packet->assign(4 + body, '\0');
  for (int i = 0; i < 4; ++i) (*packet)[static_cast<size_t>(i)] = static_cast<char>((body >> (8 * i)) & 0xFF);
  if (!msg.SerializeToArray(packet->data() + 4, static_cast<int>(body)))
    return Status(StatusCode::kInternal, "cannot serialize " + msg.GetTypeName());
  return Status::Ok();
}

StatusOr<bool> try_send_packet(int sock, const std::string& packet, const std::vector<int>& fds) {
  if (fds.size() > static_cast<size_t>(kMaxFdsPerMessage))
    return Status(StatusCode::kInvalidArgument,
                  "file descriptors: " + std::to_string(fds.size()) + "; expected at most " +
                      std::to_string(kMaxFdsPerMessage));
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)] = {};
  iovec iov{const_cast<char*>(packet.data()), packet.size()};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  if (!fds.empty()) {
    mh.msg_control = control;
    mh.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  for (;;) {
    const ssize_t n = ::sendmsg(sock, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n == static_cast<ssize_t>(packet.size())) return true;
    if (n >= 0) return Status(StatusCode::kIoError, "sendmsg: short write of a packet");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
    if (errno == EPIPE || errno == ECONNRESET || errno == ENOTCONN)
      return Status(StatusCode::kUnavailable, "peer closed the connection");
    return errno_status("sendmsg", errno);
  }
}

Status send_message(int sock, const google::protobuf::MessageLite& msg, const std::vector<int>& fds,
                    std::chrono::milliseconds timeout) {
  std::string packet;
  MK_RETURN_IF_ERROR(frame_message(msg, &packet));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    MK_ASSIGN_OR_RETURN(const bool sent, try_send_packet(sock, packet, fds));
    if (sent) return Status::Ok();
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0)
      return Status(StatusCode::kDeadlineExceeded,
                    "send: no progress within " + std::to_string(timeout.count()) + " ms");
    MK_RETURN_IF_ERROR(wait_fd(sock, POLLOUT, left, "send"));
  }
}

Status recv_message(int sock, google::protobuf::MessageLite* msg, int expected_fds,
                    std::vector<UniqueFd>* fds_out, std::chrono::milliseconds timeout) {
  return recv_impl(sock, msg, expected_fds, expected_fds, fds_out, timeout);
}

Status recv_message_any_fds(int sock, google::protobuf::MessageLite* msg,
                            std::vector<UniqueFd>* fds_out, std::chrono::milliseconds timeout) {
  return recv_impl(sock, msg, 0, kMaxFdsPerMessage, fds_out, timeout);
}

StatusOr<UniqueFd> connect_unix(const std::string& path, std::chrono::milliseconds timeout) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path))
    return Status(StatusCode::kInvalidArgument,
                  "socket path: \"" + path + "\" is " + std::to_string(path.size()) +
                      " bytes; expected fewer than " + std::to_string(sizeof(addr.sun_path)));
  UniqueFd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return errno_status("socket", errno);
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size());
  // Note 5: a full backlog (EAGAIN) is retried with a growing pause until the bound expires.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto pause = std::chrono::milliseconds(1);
  for (;;) {
    if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) break;
    const int e = errno;
    if (e == EINTR) continue;
    if (e == EINPROGRESS) {
      MK_RETURN_IF_ERROR(wait_fd(fd.get(), POLLOUT, timeout, "connect"));
      break;
    }
    if (e == EAGAIN) {
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline)
        return Status(StatusCode::kUnavailable,
                      "cannot connect to mkerneld at " + path + ": its listen backlog stayed full for " +
                          std::to_string(timeout.count()) + " ms (the daemon is overloaded or not accepting)");
      std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(pause, deadline - now));
      pause = std::min(pause * 2, std::chrono::milliseconds(50));
      continue;
    }
    return Status(e == ENOENT || e == ECONNREFUSED ? StatusCode::kUnavailable : StatusCode::kIoError,
                  "cannot connect to mkerneld at " + path + ": " + std::strerror(e) +
                      (e == ENOENT ? " (is mkerneld running with this runtime directory?)" : ""));
  }
  return fd;
}

}  // namespace mkernel::protocol
