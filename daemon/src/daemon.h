// daemon.h: mkerneld's core, put together: the shared state (daemon_state.h), one proxy per
// GPU (proxy.h), the event loop on the client socket (event_loop.h, answering with
// requests.h), the peer service and connect jobs (peering.h), and the control implementation
// the operations surface talks to (daemon_control.h). This file only starts and stops them.
//
// Threads: one event-loop thread, one thread per proxy, a worker per connect in progress, the
// peer service's gRPC threads. The caller of start() keeps its own thread for signals.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "control.h"
#include "daemon_control.h"
#include "daemon_state.h"
#include "event_loop.h"
#include "peering.h"

namespace mkernel::daemon {

class Daemon {
 public:
  explicit Daemon(DaemonOptions options);
  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Creates the runtime directory and the client socket, starts the peer service, every proxy
  // and the event loop. Returns once all proxies run (the moment for READY=1).
  Status start();
  // Ends every session (clients are told), stops the event loop, the connect jobs, the peer
  // service and the proxies, in that order. Idempotent.
  void stop();

  // What the operations surface (admin, health, metrics, systemd) drives.
  DaemonControl& control() { return control_; }
  // The running config (a copy: a reload may replace it meanwhile).
  config::DaemonConfig config() const { return state_.config(); }
  std::string client_socket_path() const { return state_.socket_path; }
  uint64_t epoch() const { return state_.epoch; }
  // The address other daemons dial for rendezvous ("unix:/abs" or "host:port").
  std::string peer_address() const { return state_.peer_address; }

 private:
  // One proxy per GPU found or listed, else host-only slots; each with its transport probe.
  Status start_proxies();

  // Declared in start order; stop() takes them down explicitly in its own order.
  DaemonState state_;
  PeerService peers_;
  ConnectJobs connects_;
  EventLoop loop_;
  Control control_;
  std::atomic<bool> stopped_{false};
};

}  // namespace mkernel::daemon
