// fault_transport.h: a net::Transport that wraps another and injects failures, so tests drive
// the proxy's real error paths (failed posts, lost, late and failed completions, refused peers
// and registrations) without broken hardware.
//
// Design notes
//  1. Everything not armed passes straight through to the inner transport; the wrapper adds no
//     buffering of its own except for delayed completions.
//  2. Faults are armed by the test between calls (same single-thread rule as net_transport.h).
//     Counters ("the Nth post_write") count calls made after arming.
//  3. A dropped completion is never reported: the caller's bounded wait must notice. This breaks
//     note 6 of the contract on purpose.
#pragma once

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
  // The completion for `cookie` is held back for `polls` calls of poll() after it arrives.
  void delay_completion(uint64_t cookie, uint32_t polls);
  // Every completion is held back for `polls` calls of poll() (0 turns it off).
  void delay_all_completions(uint32_t polls);
  // The completion for `cookie` is reported with `status` instead of the inner result.
  void fail_completion(uint64_t cookie, Status status);
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
  size_t completions_held() const { return held_.size(); }
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
  Status post_write(const WriteOp& op) override;
  size_t poll(std::vector<Completion>* completions, std::vector<Arrival>* arrivals) override;

 private:
  struct Held {
    Completion completion;
    uint32_t polls_left = 0;
  };

  std::unique_ptr<Transport> inner_;
  Capabilities caps_;
  uint64_t posts_seen_ = 0;
  uint64_t fail_post_at_ = 0;  // absolute index of posts_seen_; 0 = none
  Status fail_post_status_;
  std::unordered_map<uint64_t, bool> drop_;
  std::unordered_map<uint64_t, uint32_t> delay_;
  std::unordered_map<uint64_t, Status> fail_;
  std::vector<uint32_t> dropped_arrival_flags_;
  uint32_t delay_all_ = 0;
  std::optional<Status> refuse_peer_;
  bool corrupt_peer_ = false;
  std::optional<Status> refuse_register_;
  bool corrupt_descriptor_ = false;
  std::optional<Status> refuse_import_;
  uint64_t completions_dropped_ = 0;
  std::deque<Held> held_;
  std::vector<Completion> scratch_completions_;
};

}  // namespace mkernel::daemon::net
