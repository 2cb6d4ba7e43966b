// fault_transport_test.cc: the fault-injecting wrapper over an in-memory transport: the Nth post
// fails, a dropped completion is caught by a bounded wait, a delayed one comes late, completions
// are reordered, a stalled endpoint holds everything until the stall is over, a broken one fails
// everything after, a completion turns into each error status, and peers and registrations are
// refused or corrupted. (tests/cpu/proxy_fault_test.cc drives a real Proxy through the wrapper.)
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <cstring>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "fault_transport.h"

namespace mkernel::daemon::net {
namespace {

using Clock = std::chrono::steady_clock;

// A transport that writes with memcpy within one process and completes on the next poll: enough
// for the wrapper, and strict about blobs so that corruption shows.
class MemoryTransport final : public Transport {
 public:
  MemoryTransport() {
    caps_.provider = "memory";
    caps_.version = "test";
    caps_.remote_write = true;
    caps_.signals = SignalDelivery::kArrivals;
    caps_.max_inflight = 8;
  }
  const Capabilities& capabilities() const override { return caps_; }
  StatusOr<Blob> local_address() override {
    Blob b(8);
    const auto self = reinterpret_cast<uintptr_t>(this);
    std::memcpy(b.data(), &self, sizeof(self));
    return b;
  }
  StatusOr<uint32_t> add_peer(std::span<const uint8_t> address) override {
    if (address.size() != 8) return Status(StatusCode::kProtocolError, "bad address");
    uintptr_t p = 0;
    std::memcpy(&p, address.data(), sizeof(p));
    if (known().count(p) == 0) return Status(StatusCode::kUnavailable, "no such endpoint");
    peers_.push_back(reinterpret_cast<MemoryTransport*>(p));
    return static_cast<uint32_t>(peers_.size() - 1);
  }
  StatusOr<Registration> register_memory(const RegisterRequest& r) override {
    const uint64_t id = next_id_++;
    regions_[id] = r;
    Registration reg;
    reg.local_id = id;
    reg.descriptor.resize(9);
    std::memcpy(reg.descriptor.data(), &id, 8);
    reg.descriptor[8] = 0x7e;
    return reg;
  }
  Status deregister_memory(uint64_t id) override {
    return regions_.erase(id) ? Status::Ok() : Status(StatusCode::kNotFound, "no region");
  }
  StatusOr<uint64_t> import_region(uint32_t peer, std::span<const uint8_t> d) override {
    if (peer >= peers_.size()) return Status(StatusCode::kNotFound, "no peer");
    if (d.size() != 9 || d[8] != 0x7e) return Status(StatusCode::kProtocolError, "bad descriptor");
    uint64_t id = 0;
    std::memcpy(&id, d.data(), 8);
    imports_.push_back({peer, id});
    return static_cast<uint64_t>(imports_.size());
  }
  Status set_signal_region(uint64_t) override {
    return Status(StatusCode::kFailedPrecondition, "arrivals, no signal region");
  }
  const Status& async_error() const override { return ok_; }
  Status post_write(const WriteOp& op) override {
    if (queue_.size() >= caps_.max_inflight) return Status(StatusCode::kUnavailable, "full");
    if (op.remote_region == 0 || op.remote_region > imports_.size()) {
      return Status(StatusCode::kNotFound, "no remote region");
    }
    auto [peer, id] = imports_[op.remote_region - 1];
    MemoryTransport* dst = peers_[peer];
    const RegisterRequest& to = dst->regions_.at(id);
    if (!to.remote_writable) return Status(StatusCode::kPermissionDenied, "not writable");
    if (op.length > 0) {
      const RegisterRequest& from = regions_.at(op.local_region);
      std::memcpy(static_cast<uint8_t*>(to.addr) + op.remote_offset,
                  static_cast<uint8_t*>(from.addr) + op.local_offset, op.length);
    }
    if (op.has_signal) dst->arrivals_.push_back(Arrival{0, op.signal_idx, op.signal_value});
    queue_.push_back(op.cookie);
    return Status::Ok();
  }
  size_t poll(std::vector<Completion>* completions, std::vector<Arrival>* arrivals) override {
    size_t n = queue_.size() + arrivals_.size();
    for (uint64_t c : queue_) completions->push_back(Completion{c, Status::Ok()});
    queue_.clear();
    if (arrivals != nullptr) arrivals->insert(arrivals->end(), arrivals_.begin(), arrivals_.end());
    arrivals_.clear();
    return n;
  }
  ~MemoryTransport() override { known().erase(reinterpret_cast<uintptr_t>(this)); }
  void announce() { known()[reinterpret_cast<uintptr_t>(this)] = true; }

 private:
  static std::map<uintptr_t, bool>& known() {
    static std::map<uintptr_t, bool> endpoints;
    return endpoints;
  }
  Capabilities caps_;
  const Status ok_;
  uint64_t next_id_ = 1;
  std::map<uint64_t, RegisterRequest> regions_;
  std::vector<std::pair<uint32_t, uint64_t>> imports_;
  std::vector<MemoryTransport*> peers_;
  std::vector<uint64_t> queue_;
  std::vector<Arrival> arrivals_;
};

class FaultTransportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto inner = std::make_unique<MemoryTransport>();
    inner->announce();
    fault_ = std::make_unique<FaultTransport>(std::move(inner));
    peer_.announce();
    auto addr = peer_.local_address();
    ASSERT_TRUE(addr.ok());
    auto p = fault_->add_peer(addr.value());
    ASSERT_TRUE(p.ok());
    peer_idx_ = p.value();
    RegisterRequest src{MemoryKind::kHost, src_.data(), src_.size(), -1, 0, false};
    RegisterRequest dst{MemoryKind::kHost, dst_.data(), dst_.size(), -1, 0, true};
    auto s = fault_->register_memory(src);
    auto d = peer_.register_memory(dst);
    ASSERT_TRUE(s.ok() && d.ok());
    src_id_ = s->local_id;
    auto r = fault_->import_region(peer_idx_, d->descriptor);
    ASSERT_TRUE(r.ok());
    remote_id_ = r.value();
  }

  WriteOp op(uint64_t cookie) const {
    return WriteOp{cookie, peer_idx_, src_id_, 0, remote_id_, 0, 16, true, 1, cookie};
  }

  // Polls until `cookie` completes or `polls` polls pass (bounded; never hangs).
  bool wait_for(uint64_t cookie, int polls, Completion* out = nullptr, int* taken = nullptr) {
    for (int i = 1; i <= polls; ++i) {
      std::vector<Completion> got;
      (void)fault_->poll(&got, &arrivals_);
      for (Completion& c : got) {
        if (c.cookie == cookie) {
          if (out != nullptr) *out = std::move(c);
          if (taken != nullptr) *taken = i;
          return true;
        }
      }
    }
    return false;
  }

  std::vector<uint8_t> src_ = std::vector<uint8_t>(64, 0x42);
  std::vector<uint8_t> dst_ = std::vector<uint8_t>(64, 0);
  MemoryTransport peer_;
  std::unique_ptr<FaultTransport> fault_;
  uint32_t peer_idx_ = 0;
  uint64_t src_id_ = 0;
  uint64_t remote_id_ = 0;
  std::vector<Arrival> arrivals_;
};

TEST_F(FaultTransportTest, PassesThroughWhenNothingIsArmed) {
  EXPECT_EQ(fault_->capabilities().provider, "fault(memory)");
  ASSERT_TRUE(fault_->post_write(op(1)).ok());
  Completion c;
  ASSERT_TRUE(wait_for(1, 10, &c));
  EXPECT_TRUE(c.status.ok());
  EXPECT_EQ(dst_[0], 0x42);
}

TEST_F(FaultTransportTest, NthPostFailsWithChosenStatus) {
  fault_->fail_nth_post(3, Status(StatusCode::kDeviceError, "injected post failure"));
  EXPECT_TRUE(fault_->post_write(op(1)).ok());
  EXPECT_TRUE(fault_->post_write(op(2)).ok());
  Status third = fault_->post_write(op(3));
  EXPECT_EQ(third.code(), StatusCode::kDeviceError);
  EXPECT_EQ(third.message(), "injected post failure");
  EXPECT_TRUE(fault_->post_write(op(4)).ok()) << "only the Nth post fails";
  EXPECT_EQ(fault_->posts_seen(), 4u);
  // A failed post yields no completion.
  EXPECT_FALSE(wait_for(3, 20));
}

TEST_F(FaultTransportTest, InjectedUnavailableIsRetriedByTheCaller) {
  fault_->fail_nth_post(1, Status(StatusCode::kUnavailable, "queue full"));
  int attempts = 0;
  Status s;
  do {
    s = fault_->post_write(op(1));
    ++attempts;
    (void)fault_->poll(nullptr, nullptr);
  } while (s.code() == StatusCode::kUnavailable && attempts < 10);
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(attempts, 2);
}

TEST_F(FaultTransportTest, DroppedCompletionIsCaughtByBoundedWait) {
  fault_->drop_completion(7);
  ASSERT_TRUE(fault_->post_write(op(7)).ok());
  ASSERT_TRUE(fault_->post_write(op(8)).ok());
  const auto deadline = Clock::now() + std::chrono::milliseconds(200);
  bool seen = false;
  std::vector<Completion> got;
  while (!seen && Clock::now() < deadline) {
    (void)fault_->poll(&got, nullptr);
    for (const Completion& c : got) seen = seen || c.cookie == 7;
  }
  EXPECT_FALSE(seen) << "dropped completion was reported";
  EXPECT_EQ(fault_->completions_dropped(), 1u);
  EXPECT_TRUE(std::any_of(got.begin(), got.end(), [](const Completion& c) { return c.cookie == 8; }));
}

TEST_F(FaultTransportTest, DelayedCompletionComesAfterKPolls) {
  fault_->delay_completion(5, 4);
  ASSERT_TRUE(fault_->post_write(op(5)).ok());
  int taken = 0;
  Completion c;
  ASSERT_TRUE(wait_for(5, 50, &c, &taken));
  EXPECT_EQ(taken, 5) << "reported by the 4th poll after the one that saw it";
  EXPECT_TRUE(c.status.ok());

  fault_->delay_all_completions(2);
  ASSERT_TRUE(fault_->post_write(op(6)).ok());
  ASSERT_TRUE(wait_for(6, 50, &c, &taken));
  EXPECT_EQ(taken, 3);
  EXPECT_EQ(fault_->completions_held(), 0u);
}

TEST_F(FaultTransportTest, CompletionTurnsIntoEachErrorStatus) {
  const StatusCode codes[] = {
      StatusCode::kInvalidArgument,  StatusCode::kNotFound,         StatusCode::kAlreadyExists,
      StatusCode::kPermissionDenied, StatusCode::kResourceExhausted,
      StatusCode::kFailedPrecondition, StatusCode::kUnavailable,    StatusCode::kDeadlineExceeded,
      StatusCode::kIoError,          StatusCode::kProtocolError,    StatusCode::kDeviceError,
      StatusCode::kInternal};
  uint64_t cookie = 100;
  for (StatusCode code : codes) {
    ++cookie;
    fault_->fail_completion(cookie, Status(code, "injected " + std::to_string(cookie)));
    ASSERT_TRUE(fault_->post_write(op(cookie)).ok());
    Completion c;
    ASSERT_TRUE(wait_for(cookie, 10, &c)) << status_code_name(code);
    EXPECT_EQ(c.status.code(), code);
    EXPECT_EQ(c.status.message(), "injected " + std::to_string(cookie));
  }
}

TEST_F(FaultTransportTest, ArrivalsCanBeDropped) {
  fault_->drop_arrivals(1);
  ASSERT_TRUE(fault_->post_write(op(1)).ok());
  ASSERT_TRUE(wait_for(1, 10));
  std::vector<Arrival> peer_arrivals;
  std::vector<Completion> none;
  (void)peer_.poll(&none, &peer_arrivals);
  EXPECT_EQ(peer_arrivals.size(), 1u) << "the peer's own arrivals are untouched";
}

TEST_F(FaultTransportTest, AddPeerRefusedOrCorrupted) {
  auto addr = peer_.local_address();
  ASSERT_TRUE(addr.ok());
  fault_->refuse_add_peer(Status(StatusCode::kDeadlineExceeded, "connect timed out"));
  auto refused = fault_->add_peer(addr.value());
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kDeadlineExceeded);
  fault_->corrupt_next_peer_address();
  auto corrupted = fault_->add_peer(addr.value());
  ASSERT_FALSE(corrupted.ok()) << "the inner transport should reject a corrupted address";
  EXPECT_EQ(corrupted.status().code(), StatusCode::kUnavailable);
  EXPECT_TRUE(fault_->add_peer(addr.value()).ok()) << "one-shot faults";
}

TEST_F(FaultTransportTest, RegisterRefusedOrDescriptorCorrupted) {
  std::vector<uint8_t> mem(32);
  RegisterRequest req{MemoryKind::kHost, mem.data(), mem.size(), -1, 0, true};
  fault_->refuse_register_memory(Status(StatusCode::kResourceExhausted, "no MR left"));
  auto refused = fault_->register_memory(req);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  fault_->corrupt_next_descriptor();
  auto reg = fault_->register_memory(req);
  ASSERT_TRUE(reg.ok());
  // The peer cannot import a corrupted descriptor.
  auto self_addr = fault_->local_address();
  ASSERT_TRUE(self_addr.ok());
  auto back = peer_.add_peer(self_addr.value());
  ASSERT_TRUE(back.ok());
  auto imported = peer_.import_region(back.value(), reg->descriptor);
  ASSERT_FALSE(imported.ok());
  EXPECT_EQ(imported.status().code(), StatusCode::kProtocolError);
  fault_->refuse_import_region(Status(StatusCode::kPermissionDenied, "wrong communicator"));
  auto imp = fault_->import_region(peer_idx_, reg->descriptor);
  ASSERT_FALSE(imp.ok());
  EXPECT_EQ(imp.status().code(), StatusCode::kPermissionDenied);
}

TEST_F(FaultTransportTest, NthCompletionIsDroppedOrFailed) {
  fault_->drop_nth_completion(2);
  fault_->fail_nth_completion(3, Status(StatusCode::kUnavailable, "peer reset"));
  for (uint64_t c = 1; c <= 4; ++c) ASSERT_TRUE(fault_->post_write(op(c)).ok());
  std::vector<Completion> got;
  for (int i = 0; i < 5; ++i) (void)fault_->poll(&got, nullptr);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].cookie, 1u);
  EXPECT_TRUE(got[0].status.ok());
  EXPECT_EQ(got[1].cookie, 3u);
  EXPECT_EQ(got[1].status.code(), StatusCode::kUnavailable);
  EXPECT_EQ(got[2].cookie, 4u);
  EXPECT_TRUE(got[2].status.ok());
  EXPECT_EQ(fault_->completions_dropped(), 1u);
}

TEST_F(FaultTransportTest, CompletionsAreReorderedInGroupsAndNoneIsLost) {
  fault_->reorder_completions(4);
  for (uint64_t c = 1; c <= 6; ++c) ASSERT_TRUE(fault_->post_write(op(c)).ok());
  std::vector<Completion> got;
  for (int i = 0; i < 4 && got.size() < 6; ++i) (void)fault_->poll(&got, nullptr);
  ASSERT_EQ(got.size(), 6u) << "a group that does not fill goes out on a poll with nothing new";
  std::vector<uint64_t> order;
  for (const Completion& c : got) order.push_back(c.cookie);
  EXPECT_EQ(order, (std::vector<uint64_t>{4, 3, 2, 1, 6, 5}));
  EXPECT_EQ(fault_->completions_reordered(), 6u);
  EXPECT_EQ(fault_->completions_held(), 0u);
}

TEST_F(FaultTransportTest, AStalledEndpointTakesNothingAndHoldsItsCompletions) {
  ASSERT_TRUE(fault_->post_write(op(1)).ok());
  fault_->stall_for(std::chrono::milliseconds(150));
  const auto stalled_at = Clock::now();
  EXPECT_EQ(fault_->post_write(op(2)).code(), StatusCode::kUnavailable) << "queue full while stalled";
  std::vector<Completion> got;
  EXPECT_EQ(fault_->poll(&got, &arrivals_), 0u);
  EXPECT_TRUE(got.empty());
  // Bounded wait for the held completion once the stall is over.
  while (got.empty() && Clock::now() < stalled_at + std::chrono::seconds(2)) {
    (void)fault_->poll(&got, &arrivals_);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(got.size(), 1u);
  EXPECT_GE(Clock::now() - stalled_at, std::chrono::milliseconds(150));
  EXPECT_EQ(got[0].cookie, 1u);
  EXPECT_TRUE(fault_->post_write(op(2)).ok());
}

TEST_F(FaultTransportTest, ABrokenEndpointFailsWhatIsInFlightAndEveryLaterPost) {
  EXPECT_TRUE(fault_->async_error().ok());
  ASSERT_TRUE(fault_->post_write(op(1)).ok());
  fault_->break_endpoint(Status(StatusCode::kDeviceError, "completion queue overrun"));
  EXPECT_EQ(fault_->async_error().code(), StatusCode::kDeviceError);
  EXPECT_EQ(fault_->post_write(op(2)).message(), "completion queue overrun");
  Completion c;
  ASSERT_TRUE(wait_for(1, 10, &c));
  EXPECT_EQ(c.status.code(), StatusCode::kDeviceError) << "what was in flight completes with the error";
  EXPECT_EQ(fault_->set_signal_region(1).code(), StatusCode::kFailedPrecondition) << "forwarded";
}

}  // namespace
}  // namespace mkernel::daemon::net
