// daemon.h: mkerneld's core: the client socket and its event loop, sessions, proxies, the
// communicator table, drain and reload. It implements DaemonControl for the operations surface.
//
// Threads: one event-loop thread (accepts clients, answers setup requests, ends sessions), one
// thread per proxy. The caller of start() keeps its own thread for signals.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "control.h"
#include "network.h"
#include "mkernel/config/config.h"
#include "mkernel/protocol/session_wire.h"
#include "proxy.h"
#include "session.h"

namespace grpc {
class Server;
}

namespace mkernel::session::v1 {
class Request;
class Reply;
class ImportRegion;
}  // namespace mkernel::session::v1

namespace mkernel::daemon {

class RendezvousService;

struct DaemonOptions {
  config::DaemonConfig config;
  std::string config_source = "built-in default";  // file path or "built-in default"
  bool test_hooks = false;
};

class Daemon final : public DaemonControl {
 public:
  explicit Daemon(DaemonOptions options);
  ~Daemon() override;
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Creates the runtime directory and the client socket, starts every proxy and the event loop.
  // Returns once all proxies run (the moment for READY=1).
  Status start();
  // Ends every session (clients are told), stops the event loop and the proxies. Idempotent.
  void stop();

  const config::DaemonConfig& config() const;
  std::string client_socket_path() const { return socket_path_; }
  uint64_t epoch() const { return epoch_; }
  // The address other daemons dial for rendezvous ("unix:/abs" or "host:port").
  std::string peer_address() const { return peer_address_; }

  // DaemonControl
  DaemonStatus status() const override;
  std::vector<ProxyStats> stats() const override;
  std::vector<ClientInfo> clients() const override;
  std::vector<HealthEntry> health() const override;
  Status drain() override;
  Status undrain() override;
  ReloadResult reload(const std::string& path) override;
  Status stall_proxy(uint32_t gpu, std::chrono::milliseconds duration) override;
  bool all_proxies_alive() const override;

 private:
  Status open_client_socket();
  void event_loop();
  void accept_clients();
  void handle_readable(const std::shared_ptr<Session>& s);
  Status handle_request(Session& s, const session::v1::Request& req, session::v1::Reply* reply,
                        std::vector<int>* fds);
  // ImportRegion: a GPU-memory region handed over as a dmabuf descriptor.
  Status import_region(Session& s, const session::v1::ImportRegion& r, protocol::UniqueFd dmabuf,
                       session::v1::Reply* reply);
  Status handle_hello(const std::shared_ptr<Session>& s, const session::v1::Request& req,
                      session::v1::Reply* reply);
  // Ends a session (once): stops its producers, tells the client why unless the client itself
  // left (closed or said goodbye), and lets go of it.
  void finish_session(const std::shared_ptr<Session>& s, Status why, bool client_left = false);
  void republish_peers();
  // Multi-daemon communicators (network.h): the peer service, connect workers.
  Status start_peer_service();
  Status start_connect(const std::shared_ptr<Session>& s, const session::v1::Request& req);
  void finish_connects();
  void cancel_connects(uint64_t session_id);  // 0 = all
  void end_sessions_of_stuck_proxies();
  std::string node_name() const;
  void wake();
  bool proxy_alive(const Proxy& p) const;
  SessionQuota quota_from_config() const;

  DaemonOptions options_;
  mutable std::mutex config_mu_;
  uint64_t config_generation_ = 0;
  const uint64_t epoch_;
  const std::chrono::steady_clock::time_point started_at_ = std::chrono::steady_clock::now();
  std::string runtime_dir_;
  std::string socket_path_;

  std::vector<std::unique_ptr<Proxy>> proxies_;
  protocol::UniqueFd listen_fd_;
  protocol::UniqueFd wake_fd_;  // eventfd: proxies and control calls wake the event loop
  std::thread loop_thread_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> stopped_{false};
  std::atomic<bool> draining_{false};

  // Sessions: owned by the event loop; the mutex guards the map for readers (ListClients).
  mutable std::mutex sessions_mu_;
  std::map<uint64_t, std::shared_ptr<Session>> sessions_;
  uint64_t next_session_id_ = 1;
  std::vector<uint64_t> ended_by_proxy_;  // guarded by sessions_mu_

  // Network side.
  std::vector<TransportProbe> probes_;  // by position in proxies_
  // What the probe found for the proxy of `gpu` (a configured index); nullptr when none.
  const TransportProbe* probe_for(uint32_t gpu) const;
  std::string peer_address_;
  std::unique_ptr<RendezvousService> rendezvous_;
  std::unique_ptr<grpc::Server> peer_server_;
  struct ConnectJob {
    std::shared_ptr<Session> session;
    uint64_t request_id = 0;
    std::shared_ptr<JoinCancel> cancel = std::make_shared<JoinCancel>();
    std::thread worker;
    std::atomic<bool> finished{false};
    Status status;
    std::unique_ptr<SessionNetwork> network;
  };
  std::mutex connects_mu_;
  std::vector<std::unique_ptr<ConnectJob>> connects_;
};

// GPUs this node has, without the CUDA runtime: NVIDIA's driver lists them (by PCI address)
// under /proc/driver/nvidia/gpus. Sorted in PCI bus order; empty without the driver.
std::vector<std::string> list_nvidia_gpus();
uint32_t count_nvidia_gpus();
// Parses a Linux CPU list ("0-3,8,10-11"); empty on malformed text.
std::vector<uint32_t> parse_cpu_list(const std::string& text);
// The CPUs local to a PCI device (its NUMA node), from sysfs; empty when unknown.
std::vector<uint32_t> cpus_near_pci_device(const std::string& pci_address);

}  // namespace mkernel::daemon
