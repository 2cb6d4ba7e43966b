// proxy.h: one proxy per GPU: the polling thread that takes commands off the rings of every
// session bound to its GPU, checks them and hands them to the transport.
//
// Design notes
//  1. The proxy owns its thread (named "mkd-proxy<N>", pinned as configured); stop() sets the
//     stop flag and joins; the destructor stops. No detached loops.
//  2. Sessions reach the proxy through add/remove calls from the event loop, applied by the
//     proxy between polls (a version counter says when to look). Peer tables (communicator ->
//     sessions by rank) arrive the same way, as immutable snapshots.
//  3. Each record taken ends as exactly one of ok, error or rejected, and is counted; the ring's
//     completion counter advances for every one. A rejected or failed command ends its session
//     (ring error word set, the event loop told) and no other.
//  4. The thread stamps a heartbeat every loop; health turns NOT_SERVING when it goes stale.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "control.h"
#include "session.h"
#include "transport.h"

namespace mkernel::daemon {

// Communicator id -> ranks on this node.
using PeerTable = std::unordered_map<std::string, std::shared_ptr<const PeerList>>;

struct ProxyOptions {
  uint32_t index = 0;
  std::string name;                  // "gpu0"
  std::vector<uint32_t> cpus;        // pin to these CPUs; empty = no pinning
  bool spin = false;                 // busy-poll always
  std::chrono::microseconds spin_for{1000};
  std::chrono::microseconds sleep_for{20};
  uint32_t batch = 64;
};

class Proxy {
 public:
  // `on_session_ended` is called from the proxy thread when it ends a session (the event loop
  // then says goodbye to the client).
  Proxy(ProxyOptions options, std::unique_ptr<Transport> transport,
        std::function<void(uint64_t)> on_session_ended);
  ~Proxy();
  Proxy(const Proxy&) = delete;
  Proxy& operator=(const Proxy&) = delete;

  Status start();
  void stop();

  void add_session(std::shared_ptr<Session> s);
  void remove_session(uint64_t session_id);
  void set_peers(std::shared_ptr<const PeerTable> peers);
  // Hot settings (reload): polling and batching.
  void set_polling(bool spin, std::chrono::microseconds spin_for, std::chrono::microseconds sleep_for,
                   uint32_t batch);
  // Test hook: stop stamping the heartbeat for `d` (the thread sleeps).
  void stall_for(std::chrono::milliseconds d);

  ProxyStats stats() const;
  std::chrono::steady_clock::duration since_heartbeat() const;
  const ProxyOptions& options() const { return options_; }
  const Transport& transport() const { return *transport_; }
  bool started() const { return started_.load(std::memory_order_acquire); }

 private:
  struct Tracked {
    std::shared_ptr<Session> session;
    std::vector<std::unique_ptr<protocol::RingConsumer>> consumers;
    std::shared_ptr<const PeerList> peers;
  };

  void run();
  void apply_changes();
  size_t poll_session(Tracked& t);
  void refresh_consumers(Tracked& t);
  void end_session(Tracked& t, Status why, uint32_t code, uint32_t detail, uint64_t pos);
  void publish_occupancy();

  ProxyOptions options_;
  std::unique_ptr<Transport> transport_;
  std::function<void(uint64_t)> on_session_ended_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> started_{false};

  // Event loop -> proxy.
  std::mutex mu_;
  std::vector<std::shared_ptr<Session>> to_add_;
  std::vector<uint64_t> to_remove_;
  std::shared_ptr<const PeerTable> new_peers_;
  std::atomic<uint64_t> version_{0};
  std::atomic<bool> spin_;
  std::atomic<int64_t> spin_for_us_, sleep_for_us_;
  std::atomic<uint32_t> batch_;
  std::atomic<int64_t> stall_until_ns_{0};

  // Proxy thread only.
  uint64_t seen_version_ = 0;
  std::vector<Tracked> sessions_;
  std::shared_ptr<const PeerTable> peers_;

  // Anyone reads.
  std::atomic<int64_t> heartbeat_ns_{0};
  std::atomic<uint64_t> consumed_{0};
  std::array<std::atomic<uint64_t>, kNumOutcomes> by_outcome_{};
  std::atomic<uint64_t> bytes_{0};
  std::atomic<uint64_t> errors_{0};
  std::atomic<uint64_t> occupancy_{0};
  std::atomic<uint64_t> capacity_{0};
  std::atomic<uint32_t> num_sessions_{0};
  std::atomic<uint32_t> num_rings_{0};
  std::array<std::atomic<uint64_t>, kLatencyBuckets> latency_{};
};

}  // namespace mkernel::daemon
