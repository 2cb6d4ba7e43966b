// daemon_state.h: what mkerneld's parts share: the running config, the epoch, the proxies with
// what each one's transport probe found, the drain switch and the table of sessions. The event
// loop (event_loop.h), the request handlers (requests.h), the connect jobs (peering.h) and the
// control implementation (daemon_control.h) each hold a reference to one DaemonState, which
// Daemon (daemon.h) owns.
//
// Design notes
//  1. Daemon::start() fills in the paths, the peer address and the proxies before any thread
//     that reads them runs; they do not change afterwards, so they are read without a lock.
//  2. The config is guarded by its mutex; readers copy what they need (config(), quota(),
//     node_name()). A reload replaces it whole.
//  3. The session table: the event loop adds and removes sessions; anyone looks them up under
//     the table's mutex and gets shared pointers. What other threads may touch in a Session is
//     its lock-free tables and atomics (session.h); what only the event loop touches lives in
//     the loop's own ClientState (event_loop.h).
//  4. What clients hold is added up in the ledger (ledger.h) and checked against limits() at
//     every request; every refusal is counted and logged through `refusals` (refusals.h).
//  5. Command-line settings (--runtime-dir, --log-level) override the file at start and at every
//     reload, so a reload of the same file changes nothing and reports nothing.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ledger.h"
#include "mkernel/config/config.h"
#include "network.h"
#include "proxy.h"
#include "refusals.h"
#include "session.h"

namespace mkernel::daemon {

struct DaemonOptions {
  config::DaemonConfig config;
  std::string config_source = "built-in default";  // file path or "built-in default"
  bool test_hooks = false;
  // Note 5: what the command line set, applied over every config loaded.
  std::optional<std::string> runtime_dir_override;
  std::optional<config::LogLevel> log_level_override;
};

// Sessions by id (note 3).
class SessionTable {
 public:
  void insert(std::shared_ptr<Session> s);
  void erase(uint64_t id);
  std::shared_ptr<Session> find(uint64_t id) const;
  std::vector<std::shared_ptr<Session>> all() const;
  size_t size() const;
  // Calls f(const Session&) for each session under the table's mutex (f must not call back in).
  void for_each(const std::function<void(const std::shared_ptr<Session>&)>& f) const;

 private:
  mutable std::mutex mu_;
  std::map<uint64_t, std::shared_ptr<Session>> sessions_;
};

class DaemonState {
 public:
  explicit DaemonState(DaemonOptions options);

  // ---- config (note 2) ----
  config::DaemonConfig config() const;
  std::string config_source() const;
  uint64_t config_generation() const;
  // A reload: the new config and where it came from.
  void replace_config(config::DaemonConfig next, std::string source);
  // The quota a new session gets, from clients.quota.
  SessionQuota quota() const;
  // Note 5: `loaded` with the command line's settings applied.
  config::DaemonConfig with_overrides(config::DaemonConfig loaded) const;
  // The limits the ledger checks now: clients.* and the descriptor budget.
  LedgerLimits limits() const;
  // Descriptors: the process's limit (RLIMIT_NOFILE, raised to its hard limit at start) and the
  // clients' budget under it (ledger.h note 3). Set by Daemon::start().
  void set_descriptor_limit(uint64_t limit);
  uint64_t descriptor_limit() const { return descriptor_limit_.load(std::memory_order_relaxed); }
  // node.name, else the host name.
  std::string node_name() const;
  bool test_hooks() const { return test_hooks_; }

  // ---- fixed at start (note 1) ----
  const uint64_t epoch;  // wall-clock nanoseconds at construction, odd: distinct per start
  const std::chrono::steady_clock::time_point started_at = std::chrono::steady_clock::now();
  std::string runtime_dir;
  std::string socket_path;     // the client socket
  std::string peer_address;    // what other daemons dial for rendezvous
  std::vector<std::unique_ptr<Proxy>> proxies;
  std::vector<TransportProbe> probes;  // by position in `proxies`
  // The proxy of GPU (or host slot) `gpu`, and what its probe found; nullptr when none.
  Proxy* proxy_for(uint32_t gpu) const;
  const TransportProbe* probe_for(uint32_t gpu) const;

  // ---- shared, any thread ----
  std::atomic<bool> draining{false};
  SessionTable sessions;
  Ledger ledger;        // note 4
  Refusals refusals;    // note 4
  // Session lines (opened, closed, connecting) at most this many a second: a client that opens
  // and closes sessions in a loop cannot flood the log either.
  LogRateLimiter session_log{100};
  // Gives every proxy a fresh table of communicators -> sessions by rank (live sessions that
  // said hello), after a session joined or went.
  void republish_peers();

 private:
  mutable std::mutex config_mu_;
  config::DaemonConfig config_;
  std::string config_source_;
  uint64_t config_generation_ = 0;
  const bool test_hooks_;
  const std::optional<std::string> runtime_dir_override_;
  const std::optional<config::LogLevel> log_level_override_;
  std::atomic<uint64_t> descriptor_limit_{0};
};

}  // namespace mkernel::daemon
