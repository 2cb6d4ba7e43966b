// loopback_transport.h: the in-daemon transport. Ranks of a communicator whose sessions use this
// daemon reach each other's regions with a memmove; no NIC, nothing to exchange. It implements
// the same contract as the network transports (net_transport.h), so the proxy carries every
// command the same way: post, then finish on the Completion.
//
// Design notes
//  1. One endpoint per session, owned by the Session and driven by the session's proxy thread
//     (net_transport.h note 1). deliver() is the one member other threads call: a peer's
//     post_write hands this endpoint a signal through it.
//  2. Addressing is by rank (Addressing::kRanks): WriteOp::peer is the destination rank,
//     local_region the session's own region id, remote_region the destination's region id.
//     The destination is found in the communicator's table of this daemon's sessions
//     (set_peers, the proxy's current snapshot), so there is nothing to register or import:
//     the endpoint set-up members answer kFailedPrecondition.
//  3. post_write checks the destination (connected, region exists and is remote-writable,
//     range inside it, flag index inside the array) before touching anything, copies the data
//     at once and queues the Completion for the next poll(): ordered_writes holds, and an ok
//     Completion means the data is in place.
//  4. Signals are arrivals (SignalDelivery::kArrivals): the data is copied first, then the
//     signal is handed to the destination's endpoint (deliver), whose proxy raises the flag
//     when it polls, as for a signal that came over the network. The inbox's mutex orders the
//     copy before the flag: whoever acquires the flag sees the data.
//  5. GPU memory is never mapped by the daemon; a command that would copy from or into it is
//     refused (routes send other ranks' GPU memory through the network transport, so only a
//     rank writing to itself over a transport that cannot address itself gets here).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "net_transport.h"

namespace mkernel::daemon {

class Session;

// Ranks of one communicator that have a session on this node, by rank. Only ranks that said
// hello are in it, so its size (and what building it costs) follows the sessions that exist,
// never the world size a hello claims: a communicator of 2^20 ranks with two sessions here is
// two entries.
class PeerList {
 public:
  PeerList() = default;
  // `ranks` in any order; one session per rank.
  explicit PeerList(std::vector<std::pair<uint32_t, std::shared_ptr<Session>>> ranks);
  // The session holding `rank`; nullptr when none does.
  Session* find(uint32_t rank) const;
  size_t size() const { return ranks_.size(); }

 private:
  std::vector<std::pair<uint32_t, std::shared_ptr<Session>>> ranks_;  // sorted by rank
};

class LoopbackTransport final : public net::Transport {
 public:
  // Completions waiting for poll() before post_write answers kUnavailable.
  static constexpr uint32_t kMaxInflight = 1u << 16;

  // `self`: the session whose regions are the sources; it outlives this endpoint.
  explicit LoopbackTransport(const Session& self);
  LoopbackTransport(const LoopbackTransport&) = delete;
  LoopbackTransport& operator=(const LoopbackTransport&) = delete;

  // The communicator's sessions on this daemon, by rank (note 2). Proxy thread.
  void set_peers(std::shared_ptr<const PeerList> peers);
  // A peer's signal for this endpoint (note 4). Any thread; takes a short mutex, never waits
  // for the proxy.
  void deliver(const net::Arrival& arrival);

  // ---- net::Transport ----
  const net::Capabilities& capabilities() const override { return caps_; }
  StatusOr<net::Blob> local_address() override;
  StatusOr<uint32_t> add_peer(std::span<const uint8_t> address) override;
  StatusOr<net::Registration> register_memory(const net::RegisterRequest& request) override;
  Status deregister_memory(uint64_t local_id) override;
  StatusOr<uint64_t> import_region(uint32_t peer, std::span<const uint8_t> descriptor) override;
  Status set_signal_region(uint64_t local_id) override;
  Status post_write(const net::WriteOp& op) override;
  size_t poll(std::vector<net::Completion>* completions, std::vector<net::Arrival>* arrivals) override;
  // Never set: a memmove does not fail as a whole.
  const Status& async_error() const override { return no_error_; }

 private:
  const Session& self_;
  net::Capabilities caps_;
  const Status no_error_;
  std::shared_ptr<const PeerList> peers_;   // proxy thread
  std::vector<net::Completion> done_;       // proxy thread: posted, reported by the next poll

  std::mutex inbox_mu_;
  std::vector<net::Arrival> inbox_;         // guarded by inbox_mu_
  std::atomic<bool> inbox_filled_{false};   // lets poll() skip the mutex when idle
};

}  // namespace mkernel::daemon
