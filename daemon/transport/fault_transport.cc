// fault_transport.cc: see fault_transport.h.
#include "fault_transport.h"

#include <algorithm>
#include <string>
#include <utility>

namespace mkernel::daemon::net {

FaultTransport::FaultTransport(std::unique_ptr<Transport> inner) : inner_(std::move(inner)) {
  caps_ = inner_->capabilities();
  caps_.provider = "fault(" + caps_.provider + ")";
}

void FaultTransport::fail_nth_post(uint64_t n, Status status) {
  fail_post_at_ = n == 0 ? 0 : posts_seen_ + n;
  fail_post_status_ = std::move(status);
}

void FaultTransport::drop_completion(uint64_t cookie) { drop_[cookie] = true; }

void FaultTransport::drop_nth_completion(uint64_t n) {
  drop_completion_at_ = n == 0 ? 0 : completions_seen_ + n;
}

void FaultTransport::fail_nth_completion(uint64_t n, Status status) {
  fail_completion_at_ = n == 0 ? 0 : completions_seen_ + n;
  fail_completion_status_ = std::move(status);
}

void FaultTransport::reorder_completions(uint32_t window) { reorder_window_ = window; }

void FaultTransport::stall_for(std::chrono::milliseconds d, uint64_t at_post) {
  if (at_post == 0) {
    stall_until_ = std::chrono::steady_clock::now() + d;
    return;
  }
  stall_at_post_ = posts_seen_ + at_post;
  stall_length_ = d;
}

bool FaultTransport::stalled() const { return std::chrono::steady_clock::now() < stall_until_; }

void FaultTransport::break_endpoint(Status status, uint64_t at_post) {
  if (at_post != 0) {
    break_at_post_ = posts_seen_ + at_post;
    break_status_ = std::move(status);
    return;
  }
  if (broken_.ok()) broken_ = std::move(status);
}

void FaultTransport::arm_at_post() {
  const uint64_t n = posts_seen_ + 1;  // the post being attempted
  if (stall_at_post_ != 0 && n == stall_at_post_) {
    stall_at_post_ = 0;
    stall_until_ = std::chrono::steady_clock::now() + stall_length_;
  }
  if (break_at_post_ != 0 && n == break_at_post_) {
    break_at_post_ = 0;
    if (broken_.ok()) broken_ = std::move(break_status_);
  }
}

void FaultTransport::delay_completion(uint64_t cookie, uint32_t polls) { delay_[cookie] = polls; }

void FaultTransport::delay_all_completions(uint32_t polls) { delay_all_ = polls; }

void FaultTransport::fail_completion(uint64_t cookie, Status status) {
  fail_[cookie] = std::move(status);
}

void FaultTransport::drop_arrivals(uint32_t signal_idx) {
  dropped_arrival_flags_.push_back(signal_idx);
}

void FaultTransport::refuse_add_peer(Status status) { refuse_peer_ = std::move(status); }

void FaultTransport::corrupt_next_peer_address() { corrupt_peer_ = true; }

void FaultTransport::refuse_register_memory(Status status) {
  refuse_register_ = std::move(status);
}

void FaultTransport::corrupt_next_descriptor() { corrupt_descriptor_ = true; }

void FaultTransport::refuse_import_region(Status status) { refuse_import_ = std::move(status); }

StatusOr<uint32_t> FaultTransport::add_peer(std::span<const uint8_t> address) {
  if (refuse_peer_) {
    Status status = std::move(*refuse_peer_);
    refuse_peer_.reset();
    return status;
  }
  if (corrupt_peer_) {
    corrupt_peer_ = false;
    Blob bad(address.begin(), address.end());
    for (uint8_t& b : bad) b = static_cast<uint8_t>(b ^ 0xa5);
    return inner_->add_peer(bad);
  }
  return inner_->add_peer(address);
}

StatusOr<Registration> FaultTransport::register_memory(const RegisterRequest& request) {
  if (refuse_register_) {
    Status status = std::move(*refuse_register_);
    refuse_register_.reset();
    return status;
  }
  auto reg = inner_->register_memory(request);
  if (reg.ok() && corrupt_descriptor_) {
    corrupt_descriptor_ = false;
    for (uint8_t& b : reg->descriptor) b = static_cast<uint8_t>(b ^ 0x5a);
  }
  return reg;
}

StatusOr<uint64_t> FaultTransport::import_region(uint32_t peer,
                                                 std::span<const uint8_t> descriptor) {
  if (refuse_import_) {
    Status status = std::move(*refuse_import_);
    refuse_import_.reset();
    return status;
  }
  return inner_->import_region(peer, descriptor);
}

Status FaultTransport::post_write(const WriteOp& op) {
  arm_at_post();
  if (!async_error().ok()) return async_error();
  if (stalled())
    return Status(StatusCode::kUnavailable, "write " + std::to_string(op.cookie) +
                                                ": the endpoint is stalled (injected); poll and retry");
  ++posts_seen_;
  if (fail_post_at_ != 0 && posts_seen_ == fail_post_at_) {
    fail_post_at_ = 0;
    return fail_post_status_;
  }
  Status st = inner_->post_write(op);
  // A full queue is not a post: the caller posts the same op again (note 2).
  if (st.code() == StatusCode::kUnavailable) --posts_seen_;
  return st;
}

bool FaultTransport::transform(Completion& c) {
  ++completions_seen_;
  if (drop_completion_at_ != 0 && completions_seen_ == drop_completion_at_) {
    drop_completion_at_ = 0;
    ++completions_dropped_;
    return false;
  }
  if (auto drop = drop_.find(c.cookie); drop != drop_.end()) {
    drop_.erase(drop);
    ++completions_dropped_;
    return false;
  }
  if (fail_completion_at_ != 0 && completions_seen_ == fail_completion_at_) {
    fail_completion_at_ = 0;
    c.status = fail_completion_status_;
  }
  if (auto fail = fail_.find(c.cookie); fail != fail_.end()) {
    c.status = std::move(fail->second);
    fail_.erase(fail);
  }
  if (!broken_.ok()) c.status = broken_;  // note 7 of the contract: in flight fails with it
  return true;
}

size_t FaultTransport::poll(std::vector<Completion>* completions, std::vector<Arrival>* arrivals) {
  scratch_completions_.clear();
  scratch_arrivals_.clear();
  (void)inner_->poll(&scratch_completions_, &scratch_arrivals_);
  const bool frozen = stalled();

  // Completions held from earlier polls come due first, in arrival order (a stall stops the
  // clock of delays too).
  std::vector<Completion> due;
  if (!frozen) {
    for (auto it = held_.begin(); it != held_.end();) {
      if (it->polls_left == 0) {
        due.push_back(std::move(it->completion));
        it = held_.erase(it);
      } else {
        --it->polls_left;
        ++it;
      }
    }
  }
  for (Completion& c : scratch_completions_) {
    if (!transform(c)) continue;
    uint32_t polls = delay_all_;
    if (auto delay = delay_.find(c.cookie); delay != delay_.end()) {
      polls = delay->second;
      delay_.erase(delay);
    }
    if (polls > 0) {
      // Counted from the next poll: it is reported by the poll `polls` calls after this one.
      held_.push_back(Held{std::move(c), polls - 1});
      continue;
    }
    due.push_back(std::move(c));
  }

  // Reordering (note 4): a group fills and goes out back to front.
  if (reorder_window_ > 1) {
    const bool nothing_new = due.empty();
    for (Completion& c : due) group_.push_back(std::move(c));
    due.clear();
    auto release = [&](size_t n) {
      for (size_t i = n; i-- > 0;) ready_.push_back(std::move(group_[i]));
      if (n > 1) completions_reordered_ += n;
      group_.erase(group_.begin(), group_.begin() + static_cast<std::ptrdiff_t>(n));
    };
    while (group_.size() >= reorder_window_) release(reorder_window_);
    if (nothing_new && !group_.empty()) release(group_.size());
  } else {
    for (Completion& c : group_) ready_.push_back(std::move(c));  // turned off: let them go
    group_.clear();
  }
  for (Completion& c : due) ready_.push_back(std::move(c));

  for (const Arrival& a : scratch_arrivals_) {
    if (std::find(dropped_arrival_flags_.begin(), dropped_arrival_flags_.end(), a.signal_idx) !=
        dropped_arrival_flags_.end()) {
      continue;
    }
    ready_arrivals_.push_back(a);
  }
  if (frozen) return 0;

  size_t appended = 0;
  if (completions != nullptr) {
    appended += ready_.size();
    for (Completion& c : ready_) completions->push_back(std::move(c));
    ready_.clear();
  }
  if (arrivals != nullptr) {
    appended += ready_arrivals_.size();
    arrivals->insert(arrivals->end(), ready_arrivals_.begin(), ready_arrivals_.end());
    ready_arrivals_.clear();
  }
  return appended;
}

}  // namespace mkernel::daemon::net
