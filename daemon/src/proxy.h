// proxy.h: one proxy per GPU: the polling thread that takes commands off the rings of every
// session bound to its GPU, checks them and hands them to a transport (net_transport.h), then
// finishes them on the transport's completions and raises the flags peers' signals name.
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
//  5. Every command goes the same way, whatever the destination: the proxy picks the route
//     (the session's loopback endpoint for a rank served by this daemon, its network transport
//     for a rank reached through the network, network.h note 3), checks the destination
//     against what the route knows (region exists and is remote-writable, range inside it,
//     flag index below the rank's flag count) and rejects before anything is posted, posts,
//     and finishes the command when the transport's Completion comes back, in any order. A
//     ring's `completed` counter advances only over the finished prefix, so a producer may
//     reuse a source buffer once `completed` passed its command. A signal-only command to a
//     rank waits until this ring's earlier writes to that rank completed (unless the transport
//     orders writes), a fence until every earlier command of the ring did; a command the
//     transport cannot take yet (queue full, or the session's in-flight quota) waits likewise.
//     A ring with a waiting command takes nothing else. Nothing waits longer than the command
//     timeout, posted or not: expiry is an error.
//  6. The proxy polls every transport of every session it serves on each pass (manual
//     progress), so peers' writes land and their signals arrive. Flags are raised in one
//     place, raise_flags(): for each Arrival, the session's flag, never lowered (signals of
//     one flag may arrive out of order on unordered transports), with release ordering. With
//     SignalDelivery::kSignalRegion (verbs) the writer's NIC writes the flag instead.
//  7. A transport whose async_error() is set ends the session (ring error kRingErrTransport,
//     detail the status code); whatever it had in flight is counted as error.
//  8. A session the proxy ends gets one log line, at most kEndedLinesPerSecond a second (a
//     client can make a session and have it rejected thousands of times a second); the next
//     line says how many were left out. The counters count every one.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "control.h"
#include "loopback_transport.h"
#include "refusals.h"
#include "session.h"

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
  std::chrono::milliseconds command_timeout{30000};
  std::string network;  // what multi-daemon communicators use, for stats ("fabric:tcp;ofi_rxm")
  std::string nic;      // its NIC / domain, "" when none
};

// How a command reaches its destination rank (design note 5): through `transport`, to `peer`,
// checked against the destination session (in this daemon) or its rendezvous entry.
struct Route {
  net::Transport* transport = nullptr;
  uint32_t peer = 0;
  const Session* local = nullptr;      // a rank served by this daemon
  const RankRoute* remote = nullptr;   // a rank reached through the network
  // The destination region `id` if it exists and peers may write into it: its size and the id
  // WriteOp::remote_region names. False otherwise.
  bool writable_region(uint32_t id, uint64_t* bytes, uint64_t* remote_id) const;
  uint32_t num_flags() const;
};

class Proxy {
 public:
  static constexpr int kEndedLinesPerSecond = 100;  // note 8

  // `on_session_ended` is called from the proxy thread when it ends a session (the event loop
  // then says goodbye to the client).
  Proxy(ProxyOptions options, std::function<void(uint64_t)> on_session_ended);
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
  // What the proxy's health names as its NIC: every proxy carries in-daemon commands on the
  // loopback, whatever network transport its sessions may also have.
  static constexpr const char* kLoopbackNic = "loopback";
  bool started() const { return started_.load(std::memory_order_acquire); }

 private:
  // A command taken off a ring and not finished yet, by ring position.
  struct Pending {
    int64_t taken_ns = 0;
    int64_t posted_ns = 0;  // when it was handed to the transport (the completion's bound)
    uint64_t bytes = 0;     // payload counted when it finishes ok
    uint32_t dst_rank = 0;
    bool posted = false;    // handed to the network transport
    bool done = false;
  };
  struct RingTrack {
    std::unique_ptr<protocol::RingConsumer> consumer;
    uint64_t base = 0;                 // first position not finished
    std::deque<Pending> pending;       // positions base, base + 1, ...
    uint32_t posted = 0;               // in the transport now
    std::unordered_map<uint32_t, uint32_t> posted_to;  // by destination rank
    bool waiting = false;              // a taken command waits to be carried out (note 5)
    protocol::Command waiting_cmd;
    uint64_t waiting_pos = 0;
    int64_t waiting_since_ns = 0;
    const char* waiting_for = "";
  };
  struct Tracked {
    std::shared_ptr<Session> session;
    std::vector<RingTrack> rings;
    std::shared_ptr<const PeerList> peers;
    uint32_t posted = 0;  // all rings
    bool flushed = false;
    bool end_unannounced = false;  // ended; on_session_ended_ not called yet (see announce_ended)
  };
  // Counted locally in a poll and published once.
  struct Tally {
    std::array<uint64_t, kNumOutcomes> outcomes{};
    std::array<uint64_t, kLatencyBuckets> latency{};
    uint64_t bytes = 0, errors = 0;
    void finish(Outcome o, int64_t taken_ns, int64_t now_ns);
  };
  enum class Exec : uint8_t { kDone, kPosted, kWaiting };

  void run();
  void apply_changes();
  size_t poll_session(Tracked& t);
  // Calls on_session_ended_ for sessions that ended since the last call. It runs after a poll's
  // counts are published, so whoever hears of the end reads statistics that include the command
  // that ended it.
  void announce_ended();
  Exec execute(Tracked& t, uint32_t ri, const protocol::Command& cmd, uint64_t pos, Tally& tally);
  // The route to `rank` (design note 5); not ok when a rank served here has no session.
  Status route_to(Tracked& t, uint32_t rank, Route* route);
  // Polls one transport of the session: finishes commands on its completions, raises the flags
  // its arrivals name, ends the session on its async error.
  size_t progress(Tracked& t, net::Transport& transport, Tally& tally);
  void raise_flags(Session& s);
  // Posted commands whose completion did not come within the command timeout (note 5).
  void expire_posted(Tracked& t, uint32_t ri, int64_t now, Tally& tally);
  void advance(RingTrack& r);
  void flush_ended(Tracked& t, Tally& tally);
  void publish(Tracked& t, const Tally& tally, size_t taken);
  void refresh_consumers(Tracked& t);
  void end_session(Tracked& t, Status why, uint32_t code, uint32_t detail, uint64_t pos);
  void publish_occupancy();

  ProxyOptions options_;
  std::function<void(uint64_t)> on_session_ended_;
  LogRateLimiter ended_log_{kEndedLinesPerSecond};  // note 8
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
  std::vector<net::Completion> completions_;
  std::vector<net::Arrival> arrivals_;

  // Anyone reads.
  std::atomic<int64_t> heartbeat_ns_{0};
  std::atomic<uint64_t> consumed_{0};
  std::array<std::atomic<uint64_t>, kNumOutcomes> by_outcome_{};
  std::atomic<uint64_t> bytes_{0};
  std::atomic<uint64_t> errors_{0};
  std::atomic<uint64_t> in_flight_{0};
  std::atomic<uint64_t> occupancy_{0};
  std::atomic<uint64_t> capacity_{0};
  std::atomic<uint32_t> num_sessions_{0};
  std::atomic<uint32_t> num_rings_{0};
  std::array<std::atomic<uint64_t>, kLatencyBuckets> latency_{};
};

}  // namespace mkernel::daemon
