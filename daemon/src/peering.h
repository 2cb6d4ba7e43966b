// peering.h: the daemon's side of communicators that span daemons: the peer service other
// daemons join through (its rendezvous is rendezvous.h), and the connect jobs that run
// connect_session (network.h) on worker threads, never on the event loop or a proxy.
//
// Design notes
//  1. PeerService listens on `peer.listen` (a Unix socket by default; TCP for several nodes) and
//     serves the rendezvous; it refuses to start on a socket another live server answers on.
//  2. ConnectJobs owns its worker threads ("mkd-connect"): one per connect in progress, at most
//     kMaxConnectsAtOnce. A worker wakes the event loop when it finished; the event loop
//     collects finished jobs, joins their threads and answers the clients. cancel() ends a
//     rendezvous in progress at once (the gRPC call is cancelled); join_all() waits for every
//     worker, each bounded by its request's timeout.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "mkernel/common/status.h"
#include "mkernel/config/config.h"
#include "network.h"

namespace grpc {
class Server;
}

namespace mkernel::daemon {

class RendezvousService;
class Session;

class PeerService {
 public:
  PeerService();
  ~PeerService();
  PeerService(const PeerService&) = delete;
  PeerService& operator=(const PeerService&) = delete;

  // Listens on every `peer.listen` address; sets address() to what other daemons dial.
  Status start(const config::DaemonConfig& config);
  // "unix:/abs" or "host:port".
  const std::string& address() const { return address_; }
  // Reload: a new bound on communicators forming at once.
  void set_max_pending(size_t max_pending);
  // Stops taking joins; joins waiting at this root end by `deadline`. Then stop() waits for the
  // server and removes its Unix socket. Both idempotent.
  void shutdown(std::chrono::system_clock::time_point deadline);
  void stop();

 private:
  std::unique_ptr<RendezvousService> rendezvous_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

// One connect in progress (note 2).
struct ConnectJob {
  std::shared_ptr<Session> session;
  uint64_t request_id = 0;
  std::shared_ptr<JoinCancel> cancel = std::make_shared<JoinCancel>();
  std::thread worker;
  std::atomic<bool> finished{false};
  Status status;                            // the connect's result (set before `finished`)
  std::unique_ptr<SessionNetwork> network;  // on success
};

class ConnectJobs {
 public:
  static constexpr size_t kMaxConnectsAtOnce = 256;

  // `wake` is called from a worker when its job finished.
  explicit ConnectJobs(std::function<void()> wake);
  ~ConnectJobs();
  ConnectJobs(const ConnectJobs&) = delete;
  ConnectJobs& operator=(const ConnectJobs&) = delete;

  // Starts connect_session(session, request) on a worker; kResourceExhausted at the bound.
  Status start(std::shared_ptr<Session> session, uint64_t request_id, ConnectRequest request);
  // Finished jobs, their workers joined.
  std::vector<std::unique_ptr<ConnectJob>> collect_finished();
  // Cancels the jobs of `session_id` (0: all).
  void cancel(uint64_t session_id);
  // Joins every worker (each is bounded by its request's timeout; cancel first to end them now).
  void join_all();

 private:
  std::function<void()> wake_;
  std::mutex mu_;
  std::vector<std::unique_ptr<ConnectJob>> jobs_;
};

}  // namespace mkernel::daemon
