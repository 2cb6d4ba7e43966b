// spare_fd.h: accepting on a listening socket when the process has run out of descriptors.
//
// When accept4() fails with EMFILE or ENFILE the connection stays in the backlog and the socket
// stays readable, so a loop that polls it spins (and logs) as fast as it can, while every client
// in the backlog waits until its own timeout. A listener keeps one spare descriptor (on
// /dev/null) for this moment: it closes the spare, accepts the waiting connection with the
// freed slot, tells it why (if it can) and closes it, then takes the spare again. The backlog
// drains with answers instead of timeouts. The caller counts the event, logs it rate-limited,
// and stops polling the listener for a short pause so that the loop never spins.
// Header-only: the event loop, the admin acceptor and the metrics server use it.
#pragma once

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "mkernel/protocol/session_wire.h"

namespace mkernel::daemon {

// The process (EMFILE) or the system (ENFILE) has no descriptor to give; ENOBUFS and ENOMEM are
// the kernel's way of saying the same about socket memory.
inline bool is_descriptor_exhaustion(int err) {
  return err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM;
}

class SpareDescriptor {
 public:
  SpareDescriptor() { take(); }

  // Accepts one waiting connection on `listen_fd` with the spare's slot and closes it, after
  // sending `farewell` (one packet, never waiting) when not empty. True when a connection was
  // taken off the backlog.
  bool shed_one(int listen_fd, const std::string& farewell = {}) {
    spare_.reset();
    const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      if (!farewell.empty()) (void)::send(fd, farewell.data(), farewell.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
      ::close(fd);
    }
    take();
    return fd >= 0;
  }

  bool held() const { return spare_.valid(); }

 private:
  void take() { spare_ = protocol::UniqueFd(::open("/dev/null", O_RDONLY | O_CLOEXEC)); }

  protocol::UniqueFd spare_;
};

}  // namespace mkernel::daemon
