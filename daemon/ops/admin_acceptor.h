// admin_acceptor.h: the accept loop of the admin and health service's Unix sockets.
//
// Why it exists: gRPC's own listener (1.51, Debian 12's) gives up on a listening socket for
// good when accept4() fails with EMFILE or ENFILE: after one moment without descriptors the
// admin and health service never accepts again, even once descriptors are free. So mkerneld
// binds and listens on its admin Unix sockets itself, accepts here, and hands each connection
// to the gRPC server (grpc::AddInsecureChannelFromFd), which serves it like any other.
//
// 1. One owned thread ("mkd-admin-accept") polls the listening sockets and an eventfd for stop.
// 2. Running out of descriptors is survived (spare_fd.h): the waiting connection is taken off
//    the backlog and closed, the event is counted and reported to `on_out_of_descriptors` (the
//    daemon counts it as refusal out_of_descriptors and logs it rate-limited; without a
//    callback the acceptor logs it at most once a second), the sockets rest for 100 ms, and
//    accepting resumes by itself once descriptors are free. The client (mkerneldctl, a health
//    checker) sees a closed connection and retries.
// 3. TCP listeners (TLS) stay with gRPC's own listener: credentials cannot be added to a
//    connection handed over this way. The descriptor reserve (config::kReservedDescriptors)
//    keeps clients from ever taking the descriptors they need.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "mkernel/common/status.h"
#include "mkernel/protocol/session_wire.h"

namespace grpc {
class Server;
}

namespace mkernel::daemon {

class AdminAcceptor {
 public:
  // Binds and listens on `path` (a stream socket), mode bits applied at once (note: the
  // runtime directory keeps others out until then). The path must be free (claim it first).
  static StatusOr<protocol::UniqueFd> listen_unix(const std::string& path);

  // Called on the acceptor's thread for each accept that found no descriptor (note 2); it must
  // not wait.
  using ShortageReport = std::function<void(const Status& why)>;

  // Starts accepting on `listeners` for `server` (which must outlive the acceptor).
  static StatusOr<std::unique_ptr<AdminAcceptor>> start(grpc::Server* server,
                                                        std::vector<protocol::UniqueFd> listeners,
                                                        ShortageReport on_out_of_descriptors = {});
  ~AdminAcceptor();
  AdminAcceptor(const AdminAcceptor&) = delete;
  AdminAcceptor& operator=(const AdminAcceptor&) = delete;

  // Connections accepted, and accepts that found no descriptor (note 2).
  uint64_t accepted() const { return accepted_.load(); }
  uint64_t out_of_descriptors() const { return out_of_descriptors_.load(); }
  // Stops accepting and joins the thread; the listening sockets close. Idempotent.
  void stop();

 private:
  AdminAcceptor(grpc::Server* server, std::vector<protocol::UniqueFd> listeners, ShortageReport report);
  void run();

  grpc::Server* server_;
  std::vector<protocol::UniqueFd> listeners_;
  ShortageReport report_;
  protocol::UniqueFd wake_fd_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> accepted_{0};
  std::atomic<uint64_t> out_of_descriptors_{0};
};

}  // namespace mkernel::daemon
