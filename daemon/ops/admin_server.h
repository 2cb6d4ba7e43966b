// admin_server.h: mkerneld's gRPC operations endpoint.
//
// 1. One grpc::Server carries two services: mkernel.admin.v1.Admin (protocol/proto/admin.proto)
//    and the standard grpc.health.v1 Health service, with one entry for the whole server (""),
//    one per GPU ("mkerneld.gpu<N>") and one per NIC ("mkerneld.nic.<name>").
// 2. Listeners: a Unix socket by default (unix:<runtime_dir>/admin.sock). A TCP
//    listener is refused unless a TLS certificate and key are given; with a client CA, client
//    certificates are required as well. Unix sockets are accepted by the daemon's own acceptor
//    (admin_acceptor.h), so running out of descriptors does not stop them for good; each accept
//    that found no descriptor goes to DaemonControl::count_out_of_descriptors.
// 3. Health follows DaemonControl::health(): an owned, named thread polls it every
//    `health_poll` (100 ms by default) and publishes changes, so a drain or a proxy that stops
//    checking in shows NOT_SERVING well within a second. Drain and Undrain publish at once.
// 4. Every RPC handler only calls DaemonControl, whose methods return within milliseconds.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "control.h"
#include "mkernel/common/status.h"

namespace mkernel::daemon {

struct AdminOptions {
  // gRPC server URIs: "unix:/abs/path.sock" or "host:port" (TCP, TLS only). Empty: one Unix
  // socket, unix:<runtime_dir>/<kDefaultAdminSocketName>.
  std::vector<std::string> listen;
  std::string runtime_dir = "/run/mkerneld";
  // Permission bits and group of every Unix socket file, set right after the server starts.
  // The socket is created with the process umask first; the runtime directory (0750 under
  // systemd) keeps others out during that moment.
  uint32_t socket_mode = 0660;
  std::string socket_group;  // "" = leave the daemon's group; a group name or a numeric gid
  // TLS for TCP listeners (PEM files). Both cert and key are needed for any TCP listener.
  std::string tls_cert_path;
  std::string tls_key_path;
  std::string tls_client_ca_path;  // optional: require and verify client certificates
  std::chrono::milliseconds health_poll{100};
};

inline constexpr const char* kDefaultAdminSocketName = "admin.sock";

// The health service names DaemonControl::health() uses, for callers that build them.
std::string gpu_health_service(uint32_t gpu);
std::string nic_health_service(const std::string& nic);

class AdminServer {
 public:
  // Starts listening on every address of `options`; fails (and listens on none) if any address
  // cannot be bound, if a TCP address has no TLS, or if a Unix socket path is in use by a live
  // server. A stale socket file left by a dead daemon is replaced. `control` must outlive the
  // server.
  static StatusOr<std::unique_ptr<AdminServer>> start(DaemonControl& control,
                                                      const AdminOptions& options);
  ~AdminServer();
  AdminServer(const AdminServer&) = delete;
  AdminServer& operator=(const AdminServer&) = delete;

  // Marks every health entry NOT_SERVING, stops the health thread, then shuts the server down
  // (in-flight RPCs get up to one second) and removes the Unix socket files. Idempotent.
  void stop();

  // The URIs actually listened on (TCP port 0 replaced by the chosen port).
  const std::vector<std::string>& addresses() const;

  // Publishes control.health() now instead of at the next poll.
  void refresh_health();

  class Impl;

 private:
  explicit AdminServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace mkernel::daemon
