// fault_transport.h: a net::Transport that wraps another and injects failures, so tests drive
// the proxy's real error paths (failed posts, lost, late, reordered and failed completions, a
// stalled or broken endpoint, refused peers and registrations) without broken hardware.
//
// Design notes
//  1. Everything not armed passes straight through to the inner transport; the wrapper adds no
//     buffering of its own except for completions it holds (delayed, reordered, stalled).
//  2. Faults are armed by the test between calls (same single-thread rule as net_transport.h
//     note 1; a test that hands the wrapper to a proxy arms it before, or from the proxy's
//     thread). Counters ("the Nth post_write", "the Nth completion") count calls made or
//     completions seen after arming; a post the inner transport answered kUnavailable (queue
//     full: the caller posts the same op again) is not counted, nor one the wrapper refused
//     because it is stalled or broken.
//  3. A dropped completion is never reported: the caller's bounded wait must notice. This breaks
//     note 7 of the contract on purpose. Every other fault keeps the contract: a held
//     completion comes later, a failed one comes with the injected status.
//  4. Only completions are reordered: what the inner transport delivers, and in which order the
//     data lands, stays the inner transport's (ordered for the loopback and verbs, not for
//     fabric). The contract lets completions come in any order for every transport, so the
//     caller must cope with any order.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "net_transport.h"

namespace mkernel::daemon::net {

class FaultTransport final : public Transport {
 public:
  explicit FaultTransport(std::unique_ptr<Transport> inner);

  // ---- arming ----
  // The nth post_write from now (1 = the next one) returns `status` without reaching the inner
  // transport. A kUnavailable status imitates a full queue.
  void fail_nth_post(uint64_t n, Status status);
  // The completion for `cookie` is swallowed.
  void drop_completion(uint64_t cookie);
  // The nth completion from now (1 = the next one the inner transport reports) is swallowed.
  void drop_nth_completion(uint64_t n);
  // The completion for `cookie` is held back for `polls` calls of poll() after it arrives.
  void delay_completion(uint64_t cookie, uint32_t polls);
  // Every completion is held back for `polls` calls of poll() (0 turns it off).
  void delay_all_completions(uint32_t polls);
  // The completion for `cookie` is reported with `status` instead of the inner result.
  void fail_completion(uint64_t cookie, Status status);
  // The nth completion from now is reported with `status` instead of the inner result.
  void fail_nth_completion(uint64_t n, Status status);
  // Completions are reported in reverse order of arrival, a group at a time: a group is let
  // go when it holds `window` completions, or when a poll brings no new one (so nothing waits
  // for a group that never fills). 0 or 1 turns it off. Note 4.
  void reorder_completions(uint32_t window);
  // For `d` the endpoint makes no progress: post_write answers kUnavailable (queue full)
  // without reaching the inner transport, and poll() reports nothing (what the inner transport
  // completes meanwhile is held and reported once the stall is over). The stall starts now, or
  // with the `at_post`th post_write from now (so a test can arm it before handing the wrapper
  // to a proxy thread).
  void stall_for(std::chrono::milliseconds d, uint64_t at_post = 0);
  // The endpoint fails as a whole (net_transport.h note 7): async_error() reports `status`,
  // every later post_write fails with it, and every completion from then on carries it. Now,
  // or with the `at_post`th post_write from now (that post already fails).
  void break_endpoint(Status status, uint64_t at_post = 0);
  // Arrivals for this flag index are swallowed.
  void drop_arrivals(uint32_t signal_idx);
  // The next add_peer returns `status`; or passes a corrupted address to the inner transport.
  void refuse_add_peer(Status status);
  void corrupt_next_peer_address();
  // The next register_memory returns `status`; or returns a descriptor with flipped bytes.
  void refuse_register_memory(Status status);
  void corrupt_next_descriptor();
  // The next import_region returns `status`.
  void refuse_import_region(Status status);

  // ---- observation ----
  uint64_t posts_seen() const { return posts_seen_; }
  uint64_t completions_dropped() const { return completions_dropped_; }
  uint64_t completions_reordered() const { return completions_reordered_; }
  size_t completions_held() const { return held_.size() + group_.size(); }
  Transport& inner() { return *inner_; }

  // ---- net::Transport ----
  const Capabilities& capabilities() const override { return caps_; }
  StatusOr<Blob> local_address() override { return inner_->local_address(); }
  StatusOr<uint32_t> add_peer(std::span<const uint8_t> address) override;
  StatusOr<Registration> register_memory(const RegisterRequest& request) override;
  Status deregister_memory(uint64_t local_id) override {
    return inner_->deregister_memory(local_id);
  }
  StatusOr<uint64_t> import_region(uint32_t peer, std::span<const uint8_t> descriptor) override;
  Status set_signal_region(uint64_t local_id) override {
    return inner_->set_signal_region(local_id);
  }
  Status post_write(const WriteOp& op) override;
  size_t poll(std::vector<Completion>* completions, std::vector<Arrival>* arrivals) override;
  const Status& async_error() const override {
    return broken_.ok() ? inner_->async_error() : broken_;
  }

 private:
  struct Held {
    Completion completion;
    uint32_t polls_left = 0;
  };
  bool stalled() const;
  // Starts the stall or the break armed for the post about to be counted.
  void arm_at_post();
  // Applies drop / fail faults to one completion from the inner transport; false: dropped.
  bool transform(Completion& c);

  std::unique_ptr<Transport> inner_;
  Capabilities caps_;
  uint64_t posts_seen_ = 0;
  uint64_t fail_post_at_ = 0;  // absolute index of posts_seen_; 0 = none
  Status fail_post_status_;
  uint64_t completions_seen_ = 0;
  uint64_t drop_completion_at_ = 0;  // absolute index of completions_seen_; 0 = none
  uint64_t fail_completion_at_ = 0;
  Status fail_completion_status_;
  std::unordered_map<uint64_t, bool> drop_;
  std::unordered_map<uint64_t, uint32_t> delay_;
  std::unordered_map<uint64_t, Status> fail_;
  std::vector<uint32_t> dropped_arrival_flags_;
  uint32_t delay_all_ = 0;
  uint32_t reorder_window_ = 0;
  std::chrono::steady_clock::time_point stall_until_{};
  uint64_t stall_at_post_ = 0;  // absolute index of posts_seen_; 0 = none
  std::chrono::milliseconds stall_length_{0};
  Status broken_;
  uint64_t break_at_post_ = 0;
  Status break_status_;
  std::optional<Status> refuse_peer_;
  bool corrupt_peer_ = false;
  std::optional<Status> refuse_register_;
  bool corrupt_descriptor_ = false;
  std::optional<Status> refuse_import_;
  uint64_t completions_dropped_ = 0;
  uint64_t completions_reordered_ = 0;
  std::deque<Held> held_;             // delayed; reported in arrival order when due
  std::vector<Completion> group_;     // the reorder group being filled
  std::vector<Completion> ready_;     // due, waiting for a poll that takes completions
  std::vector<Arrival> ready_arrivals_;
  std::vector<Completion> scratch_completions_;
  std::vector<Arrival> scratch_arrivals_;
};

}  // namespace mkernel::daemon::net
