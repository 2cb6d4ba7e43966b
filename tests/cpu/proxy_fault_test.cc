// proxy_fault_test.cc: a real Proxy driven through the fault wrapper (fault_transport.h).
//
// Two sessions of one communicator, ranks 0 and 1, on one proxy; rank 0's route to rank 1 goes
// through a FaultTransport around a real transport: the loopback endpoint (always) and
// libfabric's tcp;ofi_rxm on lo (when built with libfabric and offered here; skipped with the
// reason otherwise). A host thread plays the GPU: it pushes commands into rank 0's ring and
// checks what lands in rank 1's region and flags. Every case ends bounded (each wait has a
// deadline) and with exact accounting: consumed = ok + error + rejected, nothing in flight, the
// ring's `completed` at consumed, and for a failing case the ring's error word naming the cause.
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "fault_transport.h"
#include "loopback_transport.h"
#include "network.h"
#include "proxy.h"
#include "session.h"
#if defined(MKERNEL_HAVE_FABRIC)
#include "fabric_transport.h"
#endif

namespace mkernel::daemon {
namespace {

namespace mp = mkernel::protocol;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kEpoch = 77;
constexpr uint64_t kRegionBytes = 1 << 20;
constexpr uint32_t kFlags = 256;
constexpr uint32_t kInflightQuota = 64;  // below kFlags: no two signals of one flag in flight
constexpr auto kCommandTimeout = 400ms;
constexpr auto kSettle = 3s;             // bound on every wait for the proxy to finish

// Polls `done` until it holds or `bound` passes; false on expiry (never hangs).
template <class Pred>
bool wait_until(Pred done, Clock::duration bound = kSettle) {
  const auto deadline = Clock::now() + bound;
  while (!done()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(200us);
  }
  return true;
}

std::shared_ptr<Session> make_session(uint64_t id, uint32_t rank) {
  int sv[2];
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv), 0);
  ::close(sv[1]);
  SessionQuota q;
  q.max_rings = 1;
  q.max_regions = 4;
  q.max_registered_bytes = 16 << 20;
  q.max_inflight = kInflightQuota;
  q.max_ring_capacity_log2 = 12;
  q.max_flags = kFlags;
  auto s = std::make_shared<Session>(id, mp::UniqueFd(sv[0]), ucred{}, q);
  s->set_identity({"proxy-fault", "pf", rank, 2, 0});
  s->mark_hello();
  return s;
}

uint64_t stats_total(const ProxyStats& s) { return s.by_outcome[0] + s.by_outcome[1] + s.by_outcome[2]; }

// One inner transport kind: how rank 0 reaches rank 1 beneath the fault wrapper.
enum class Inner { kLoopback, kFabricTcp };

// Test listings show the inner transport, not the bytes of the enum.
[[maybe_unused]] void PrintTo(Inner i, std::ostream* os) { *os << (i == Inner::kLoopback ? "loopback" : "tcp;ofi_rxm"); }

std::string inner_name(const ::testing::TestParamInfo<Inner>& info) {
  return info.param == Inner::kLoopback ? "loopback" : "fabric_tcp";
}

class ProxyFaultTest : public ::testing::TestWithParam<Inner> {
 protected:
  // Sessions, regions, the wrapped route from rank 0 to rank 1; `arm` arms the wrapper before
  // the proxy thread owns it (fault_transport.h note 2). Skips when the inner transport is
  // missing.
  template <class Arm>
  void build(Arm arm) {
    a_ = make_session(1, 0);
    b_ = make_session(2, 1);
    ASSERT_TRUE(a_->add_ring(10, kEpoch).ok());
    ASSERT_TRUE(a_->add_region(kRegionBytes, false).ok());
    ASSERT_TRUE(a_->add_flags(kFlags).ok());
    ASSERT_TRUE(b_->add_region(kRegionBytes, true).ok());   // region 0: the destination
    ASSERT_TRUE(b_->add_region(4096, false).ok());          // region 1: not remote-writable
    ASSERT_TRUE(b_->add_flags(kFlags).ok());
    std::mt19937_64 rng(11);
    for (uint64_t i = 0; i < kRegionBytes; ++i) a_->region(0)->data()[i] = static_cast<uint8_t>(rng());
    peers_ = std::make_shared<const PeerList>(PeerList({{0, a_}, {1, b_}}));

    auto net_a = std::make_unique<SessionNetwork>();
    net_a->ranks.resize(2);
    RankRoute& to_b = net_a->ranks[1];
    to_b.rank = 1;
    to_b.network = true;
    to_b.flags = kFlags;
    to_b.region_bytes = {b_->region(0)->bytes, b_->region(1)->bytes};
    std::unique_ptr<net::Transport> inner;
    if (GetParam() == Inner::kLoopback) {
      // A second loopback endpoint of rank 0's, as its "network": addressed by rank and id.
      auto lb = std::make_unique<LoopbackTransport>(*a_);
      lb->set_peers(peers_);
      inner_loopback_ = lb.get();
      inner = std::move(lb);
      to_b.peer = 1;
      to_b.region_ids = {0, UINT64_MAX};
      net_a->local_regions = {0};
    } else {
#if defined(MKERNEL_HAVE_FABRIC)
      net::FabricOptions fo;
      fo.provider = "tcp;ofi_rxm";
      fo.domain = "lo";
      fo.completion_timeout_ms = 30000;  // longer than the proxy's bound: the proxy must notice
      auto ta = net::open_fabric(fo);
      if (!ta.ok() && ta.status().code() == StatusCode::kNotFound)
        GTEST_SKIP() << "tcp;ofi_rxm not offered here: " << ta.status().to_string();
      ASSERT_TRUE(ta.ok()) << ta.status().to_string();
      auto tb = net::open_fabric(fo);
      ASSERT_TRUE(tb.ok()) << tb.status().to_string();
      inner = std::move(ta).value();
      auto net_b = std::make_unique<SessionNetwork>();
      net_b->transport = std::move(tb).value();
      net_b->ranks.resize(2);
      auto regs_a = register_regions(*a_, inner.get());
      auto regs_b = register_regions(*b_, net_b->transport.get());
      ASSERT_TRUE(regs_a.ok() && regs_b.ok());
      auto addr_a = inner->local_address();
      auto addr_b = net_b->transport->local_address();
      ASSERT_TRUE(addr_a.ok() && addr_b.ok());
      auto peer_b = inner->add_peer(addr_b.value());
      ASSERT_TRUE(peer_b.ok()) << peer_b.status().to_string();
      ASSERT_TRUE(net_b->transport->add_peer(addr_a.value()).ok());
      auto imported = inner->import_region(peer_b.value(), regs_b.value()[0].descriptor);
      ASSERT_TRUE(imported.ok()) << imported.status().to_string();
      to_b.peer = peer_b.value();
      to_b.region_ids = {imported.value(), UINT64_MAX};
      net_a->local_regions = {regs_a.value()[0].local_id};
      b_->set_network(std::move(net_b));
#else
      GTEST_SKIP() << "built without libfabric (MKERNEL_WITH_FABRIC=OFF)";
#endif
    }
    auto fault = std::make_unique<net::FaultTransport>(std::move(inner));
    fault_ = fault.get();
    arm(*fault_);
    net_a->transport = std::move(fault);
    net_a->description = "fault";
    a_->set_network(std::move(net_a));

    ProxyOptions po;
    po.index = 0;
    po.name = "pf0";
    po.sleep_for = 20us;
    po.spin_for = 200us;
    po.batch = 16;
    po.command_timeout = kCommandTimeout;
    proxy_ = std::make_unique<Proxy>(po, [this](uint64_t id) {
      if (id == a_id_) a_ended_.store(true, std::memory_order_release);
    });
    auto table = std::make_shared<PeerTable>();
    table->emplace("pf", peers_);
    proxy_->add_session(a_);
    proxy_->add_session(b_);
    proxy_->set_peers(table);
    ASSERT_TRUE(proxy_->start().ok());
    producer_ = std::make_unique<mp::HostRingProducer>(a_->ring(0)->view, kEpoch);
  }
  void build() {
    build([](net::FaultTransport&) {});
  }

  void TearDown() override {
    if (!proxy_) return;
    const auto t0 = Clock::now();
    proxy_->stop();
    EXPECT_LT(Clock::now() - t0, 1s) << "stopping the proxy is bounded";
    // The endpoint's table holds both sessions: let go, so they are freed.
    if (inner_loopback_ != nullptr) inner_loopback_->set_peers(nullptr);
    inner_loopback_ = nullptr;
  }

  const mp::RingHeader& ring() const { return *a_->ring(0)->view.header; }
  uint64_t completed() const { return std::atomic_ref<const uint64_t>(ring().completed).load(std::memory_order_acquire); }
  uint32_t ring_error() const { return std::atomic_ref<const uint32_t>(ring().error).load(std::memory_order_acquire); }
  uint64_t flag_b(uint32_t i) const { return std::atomic_ref<uint64_t>(b_->flags()[i]).load(std::memory_order_acquire); }

  // Pushes a write with a signal of `bytes` from and to `offset`, flag i % kFlags, value
  // next_value_; returns the position.
  uint64_t push_write(uint64_t offset, uint64_t bytes) {
    const uint32_t flag = static_cast<uint32_t>(pushed_ % kFlags);
    const uint64_t value = ++next_value_;
    last_value_[flag] = value;
    uint64_t pos = 0;
    EXPECT_EQ(producer_->push(mp::make_write_signal(1, 0, offset, 0, offset, bytes, flag, value), 2s, &pos), mp::kRingOk);
    ++pushed_;
    return pos;
  }
  void push(const mp::Command& c) {
    EXPECT_EQ(producer_->push(c, 2s), mp::kRingOk);
    ++pushed_;
  }
  // `n` writes of random sizes (4 B .. 16 KiB) into disjoint ranges, with a signal-only command
  // and a fence now and then.
  void push_mix(uint64_t n, uint64_t seed) {
    std::mt19937_64 rng(seed);
    uint64_t off = 0;
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t bytes = 4 + rng() % (16 << 10);
      if (off + bytes > kRegionBytes) off = 0;
      if (i % 37 == 36) {
        const uint32_t flag = static_cast<uint32_t>(pushed_ % kFlags);
        last_value_[flag] = ++next_value_;
        push(mp::make_signal(1, flag, next_value_));
      } else if (i % 50 == 49) {
        push(mp::make_fence());
      } else {
        push_write(off, bytes);
        written_.push_back({off, bytes});
      }
      off += bytes + rng() % 64;
    }
  }

  // Waits until the proxy has nothing in flight and its counters settled; checks the accounting.
  ProxyStats settle(uint64_t expect_consumed) {
    ProxyStats s;
    const bool ok = wait_until([&] {
      s = proxy_->stats();
      return s.in_flight == 0 && s.consumed == expect_consumed && stats_total(s) == s.consumed &&
             completed() == expect_consumed;
    });
    EXPECT_TRUE(ok) << "consumed " << s.consumed << " (expected " << expect_consumed << "), ok " << s.by_outcome[0]
                    << ", error " << s.by_outcome[1] << ", rejected " << s.by_outcome[2] << ", in flight "
                    << s.in_flight << ", ring completed " << completed();
    EXPECT_EQ(s.consumed, s.by_outcome[0] + s.by_outcome[1] + s.by_outcome[2]) << "consumed = ok + error + rejected";
    return s;
  }
  // Everything pushed finished ok: bytes and final flag values exact.
  void expect_all_delivered() {
    const ProxyStats s = settle(pushed_);
    EXPECT_EQ(s.by_outcome[0], pushed_);
    EXPECT_EQ(ring_error(), 0u);
    EXPECT_FALSE(a_->ended()) << a_->end_reason().to_string();
    for (const auto& [off, bytes] : written_)
      ASSERT_EQ(std::memcmp(b_->region(0)->data() + off, a_->region(0)->data() + off, bytes), 0)
          << bytes << " bytes at " << off;
    // Flags are raised by the proxy when rank 1's endpoint reports the arrival, which may come
    // a poll after the writer's completion.
    for (const auto& [flag, value] : last_value_)
      EXPECT_TRUE(wait_until([&] { return flag_b(flag) == value; }, 1s))
          << "flag " << flag << " is " << flag_b(flag) << ", expected " << value;
  }
  // The session ended within `bound` of `since`, with this ring error and detail; the counters
  // settle at whatever the proxy had taken.
  ProxyStats expect_ended(Clock::time_point since, Clock::duration bound, uint32_t code, uint32_t detail) {
    EXPECT_TRUE(wait_until([&] { return a_ended_.load(std::memory_order_acquire); }, bound + 2s));
    EXPECT_LE(Clock::now() - since, bound + 1s) << "ended within the bound";
    EXPECT_EQ(ring_error(), code) << mp::ring_error_name(ring_error());
    EXPECT_EQ(ring().error_detail, detail);
    ProxyStats s;
    EXPECT_TRUE(wait_until([&] {
      s = proxy_->stats();
      return s.in_flight == 0 && stats_total(s) == s.consumed && completed() == s.consumed;
    })) << "consumed " << s.consumed << ", ok " << s.by_outcome[0] << ", error " << s.by_outcome[1] << ", rejected "
        << s.by_outcome[2] << ", in flight " << s.in_flight << ", completed " << completed();
    EXPECT_LE(s.consumed, pushed_);
    return s;
  }

  std::shared_ptr<Session> a_, b_;
  const uint64_t a_id_ = 1;
  std::shared_ptr<const PeerList> peers_;
  net::FaultTransport* fault_ = nullptr;
  LoopbackTransport* inner_loopback_ = nullptr;
  std::unique_ptr<Proxy> proxy_;
  std::unique_ptr<mp::HostRingProducer> producer_;
  std::atomic<bool> a_ended_{false};
  uint64_t pushed_ = 0;
  uint64_t next_value_ = 0;
  std::map<uint32_t, uint64_t> last_value_;
  std::vector<std::pair<uint64_t, uint64_t>> written_;
};

TEST_P(ProxyFaultTest, NothingArmedEverythingArrivesExact) {
  build();
  if (IsSkipped() || HasFatalFailure()) return;
  push_mix(300, 1);
  expect_all_delivered();
  EXPECT_EQ(fault_->completions_dropped(), 0u);
}

TEST_P(ProxyFaultTest, DelayedAndReorderedCompletionsKeepTheFinishedPrefix) {
  build([](net::FaultTransport& f) {
    f.delay_all_completions(3);
    f.reorder_completions(8);
  });
  if (IsSkipped() || HasFatalFailure()) return;
  // `completed` only ever grows, whatever order the completions come in.
  std::atomic<bool> done{false};
  std::atomic<bool> went_back{false};
  std::thread watcher([&] {
    uint64_t last = 0;
    while (!done.load()) {
      const uint64_t c = completed();
      if (c < last) went_back = true;
      last = c;
    }
  });
  push_mix(400, 2);
  expect_all_delivered();
  done = true;
  watcher.join();
  EXPECT_FALSE(went_back.load());
  EXPECT_GT(fault_->completions_reordered(), 0u);
}

TEST_P(ProxyFaultTest, TransientQueueFullIsRetried) {
  build([](net::FaultTransport& f) { f.fail_nth_post(10, Status(StatusCode::kUnavailable, "queue full (injected)")); });
  if (IsSkipped() || HasFatalFailure()) return;
  push_mix(100, 3);
  expect_all_delivered();
}

TEST_P(ProxyFaultTest, AStallShorterThanTheTimeoutOnlyDelays) {
  build([](net::FaultTransport& f) { f.stall_for(150ms, /*at_post=*/20); });
  if (IsSkipped() || HasFatalFailure()) return;
  push_mix(120, 4);
  expect_all_delivered();
}

TEST_P(ProxyFaultTest, AFailedPostEndsTheSessionAtThatCommand) {
  build([](net::FaultTransport& f) { f.fail_nth_post(40, Status(StatusCode::kDeviceError, "post failed (injected)")); });
  if (IsSkipped() || HasFatalFailure()) return;
  const auto t0 = Clock::now();
  for (int i = 0; i < 100; ++i) push_write(uint64_t(i) * 4096, 4096);  // one post per command
  const ProxyStats s = expect_ended(t0, 0s, protocol::kRingErrTransport, static_cast<uint32_t>(StatusCode::kDeviceError));
  EXPECT_EQ(ring().error_pos, 39u) << "the 40th post is position 39";
  EXPECT_NE(a_->end_reason().message().find("post failed (injected)"), std::string::npos) << a_->end_reason().to_string();
  EXPECT_NE(a_->end_reason().message().find("position 39"), std::string::npos) << a_->end_reason().to_string();
  EXPECT_GE(s.by_outcome[1], 1u);
  EXPECT_LE(s.by_outcome[0], 39u);
  EXPECT_EQ(s.by_outcome[2], 0u);
}

TEST_P(ProxyFaultTest, AFailedCompletionEndsTheSession) {
  build([](net::FaultTransport& f) {
    f.fail_nth_completion(25, Status(StatusCode::kPermissionDenied, "remote access error (injected)"));
  });
  if (IsSkipped() || HasFatalFailure()) return;
  const auto t0 = Clock::now();
  for (int i = 0; i < 100; ++i) push_write(uint64_t(i) * 4096, 4096);
  const ProxyStats s =
      expect_ended(t0, 0s, protocol::kRingErrTransport, static_cast<uint32_t>(StatusCode::kPermissionDenied));
  EXPECT_NE(a_->end_reason().message().find("remote access error (injected)"), std::string::npos);
  EXPECT_GE(s.by_outcome[0], 24u) << "the 24 completions before it were ok";
  EXPECT_GE(s.by_outcome[1], 1u);
}

TEST_P(ProxyFaultTest, ADroppedCompletionEndsTheSessionAtTheCommandTimeout) {
  build([](net::FaultTransport& f) { f.drop_nth_completion(5); });
  if (IsSkipped() || HasFatalFailure()) return;
  const auto t0 = Clock::now();
  for (int i = 0; i < 20; ++i) push_write(uint64_t(i) * 4096, 4096);
  const ProxyStats s =
      expect_ended(t0, kCommandTimeout, protocol::kRingErrTransport, static_cast<uint32_t>(StatusCode::kDeadlineExceeded));
  EXPECT_GE(Clock::now() - t0, kCommandTimeout) << "not before the bound";
  EXPECT_NE(a_->end_reason().message().find("the transport reported nothing"), std::string::npos)
      << a_->end_reason().to_string();
  EXPECT_EQ(fault_->completions_dropped(), 1u);
  EXPECT_GE(s.by_outcome[1], 1u);
}

TEST_P(ProxyFaultTest, AStallLongerThanTheTimeoutEndsTheSessionInTheBound) {
  build([](net::FaultTransport& f) { f.stall_for(5s, /*at_post=*/20); });
  if (IsSkipped() || HasFatalFailure()) return;
  const auto t0 = Clock::now();
  for (int i = 0; i < 40; ++i) push_write(uint64_t(i) * 4096, 4096);
  const ProxyStats s =
      expect_ended(t0, kCommandTimeout, protocol::kRingErrTransport, static_cast<uint32_t>(StatusCode::kDeadlineExceeded));
  EXPECT_LT(Clock::now() - t0, 5s) << "the session ended long before the stall would have";
  EXPECT_GE(s.by_outcome[1], 1u) << "what was held or waiting counts as error";
  EXPECT_EQ(s.by_outcome[2], 0u);
}

TEST_P(ProxyFaultTest, ABrokenEndpointEndsTheSessionWithItsReason) {
  build([](net::FaultTransport& f) {
    f.break_endpoint(Status(StatusCode::kDeviceError, "completion queue overrun (injected)"), /*at_post=*/30);
  });
  if (IsSkipped() || HasFatalFailure()) return;
  const auto t0 = Clock::now();
  for (int i = 0; i < 60; ++i) push_write(uint64_t(i) * 4096, 4096);
  const ProxyStats s = expect_ended(t0, 0s, protocol::kRingErrTransport, static_cast<uint32_t>(StatusCode::kDeviceError));
  EXPECT_NE(a_->end_reason().message().find("completion queue overrun (injected)"), std::string::npos)
      << a_->end_reason().to_string();
  EXPECT_GE(s.by_outcome[1], 1u);
}

TEST_P(ProxyFaultTest, DestinationsOutsideTheRouteAreRejectedBeforePosting) {
  struct Case {
    const char* what;
    mp::Command cmd;
    mp::RejectReason reason;
  };
  const Case cases[] = {
      {"a region rank 1 did not make remote-writable", mp::make_write(1, 0, 0, 1, 0, 16), mp::kRejectBadRegion},
      {"a region rank 1 does not have", mp::make_write(1, 0, 0, 3, 0, 16), mp::kRejectBadRegion},
      {"past the end of the region", mp::make_write(1, 0, 0, 0, kRegionBytes - 8, 16), mp::kRejectBadOffset},
      {"a flag rank 1 does not have", mp::make_signal(1, kFlags, 1), mp::kRejectBadSignal},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    TearDown();
    proxy_.reset();
    a_ended_ = false;
    pushed_ = 0;
    build();
    if (IsSkipped() || HasFatalFailure()) return;
    for (int i = 0; i < 5; ++i) push_write(uint64_t(i) * 4096, 4096);
    ASSERT_TRUE(wait_until([&] { return completed() == 5; }));
    const uint64_t posts_before = fault_->posts_seen();
    push(c.cmd);
    const ProxyStats s = expect_ended(Clock::now(), 0s, protocol::kRingErrRejected, c.reason);
    EXPECT_EQ(fault_->posts_seen(), posts_before) << "nothing posted for the rejected command";
    EXPECT_EQ(s.by_outcome[0], 5u);
    EXPECT_EQ(s.by_outcome[2], 1u);
    EXPECT_EQ(s.consumed, 6u);
    EXPECT_EQ(ring().error_pos, 5u);
  }
}

INSTANTIATE_TEST_SUITE_P(Inner, ProxyFaultTest, ::testing::Values(Inner::kLoopback, Inner::kFabricTcp), inner_name);

}  // namespace
}  // namespace mkernel::daemon
