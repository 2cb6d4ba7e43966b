// The daemon core in-process: session quotas, the loopback transport (the in-daemon
// implementation of net_transport.h: destination checks, completions, signals as arrivals) and
// the CPU-list parser used for proxy pinning.
#include <gtest/gtest.h>
#include <sys/socket.h>

#include "loopback_transport.h"
#include "session.h"
#include "topology.h"

namespace md = mkernel::daemon;
namespace mp = mkernel::protocol;
using mkernel::StatusCode;

namespace {

std::shared_ptr<md::Session> make_session(uint64_t id, const std::string& comm, uint32_t rank,
                                          uint32_t world) {
  int sv[2];
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv), 0);
  ::close(sv[1]);
  md::SessionQuota q;
  q.max_rings = 2;
  q.max_regions = 4;
  q.max_registered_bytes = 1 << 20;
  q.max_inflight = 64;
  q.max_ring_capacity_log2 = 12;
  q.max_flags = 64;
  auto s = std::make_shared<md::Session>(id, mp::UniqueFd(sv[0]), ucred{}, q);
  s->set_identity({"t", comm, rank, world, 0});
  s->mark_hello();
  return s;
}

}  // namespace

TEST(DaemonCore, ParsesCpuLists) {
  EXPECT_EQ(md::parse_cpu_list("0-3,8,10-11"), (std::vector<uint32_t>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(md::parse_cpu_list("5"), (std::vector<uint32_t>{5}));
  EXPECT_TRUE(md::parse_cpu_list("x-3").empty());
  EXPECT_TRUE(md::parse_cpu_list("").empty());
}

TEST(DaemonCore, SessionQuotasNameTheLimit) {
  auto s = make_session(1, "c", 0, 1);
  ASSERT_TRUE(s->add_ring(4, 1).ok());
  ASSERT_TRUE(s->add_ring(4, 1).ok());
  auto third = s->add_ring(4, 1);
  ASSERT_FALSE(third.ok());
  EXPECT_EQ(third.status().message(), "rings: 3 requested; this client's quota is 2 (clients.quota.rings)");
  auto big = s->add_ring(13, 1);
  EXPECT_EQ(big.status().code(), StatusCode::kResourceExhausted);
  auto huge = s->add_region(2 << 20, true);
  EXPECT_EQ(huge.status().message(), "region bytes: 2097152; expected 1..1048576");
  EXPECT_EQ(s->add_flags(0).message(), "flags count: 0; expected 1..64");
  EXPECT_TRUE(s->add_flags(64).ok());
  EXPECT_EQ(s->add_flags(8).code(), StatusCode::kAlreadyExists);
}

TEST(DaemonCore, LoopbackChecksTheDestinationBeforeTouchingIt) {
  namespace net = md::net;
  auto a = make_session(1, "c", 0, 2);
  auto b = make_session(2, "c", 1, 2);
  ASSERT_TRUE(a->add_region(4096, false).ok());
  ASSERT_TRUE(b->add_region(4096, true).ok());   // region 0: writable
  ASSERT_TRUE(b->add_region(4096, false).ok());  // region 1: not writable
  ASSERT_TRUE(b->add_flags(8).ok());
  std::memset(a->region(0)->data(), 0xAB, 4096);
  auto peers = std::make_shared<const md::PeerList>(md::PeerList({{0, a}, {1, b}}));
  md::LoopbackTransport& t = a->loopback();
  t.set_peers(peers);
  EXPECT_EQ(t.capabilities().addressing, net::Addressing::kRanks);
  EXPECT_EQ(t.capabilities().signals, net::SignalDelivery::kArrivals);
  EXPECT_TRUE(t.capabilities().ordered_writes);
  auto write = [](uint64_t cookie, uint64_t dst_region, uint64_t dst_off, uint64_t len, bool signal, uint32_t idx,
                  uint64_t value) {
    return net::WriteOp{cookie, 1, 0, 0, dst_region, dst_off, len, signal, idx, value};
  };
  // Carried out at post: the data is in place; the completion comes with the next poll and the
  // signal goes to the destination's endpoint as an arrival (its proxy raises the flag).
  ASSERT_TRUE(t.post_write(write(7, 0, 100, 16, true, 3, 42)).ok());
  EXPECT_EQ(b->region(0)->data()[100], 0xAB);
  EXPECT_EQ(b->region(0)->data()[116], 0);
  EXPECT_EQ(b->flags()[3], 0u) << "the transport never raises a flag itself";
  std::vector<net::Completion> done;
  std::vector<net::Arrival> arrived;
  EXPECT_EQ(t.poll(&done, &arrived), 1u);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].cookie, 7u);
  EXPECT_TRUE(done[0].status.ok());
  EXPECT_TRUE(arrived.empty()) << "the signal is the destination's";
  EXPECT_EQ(b->loopback().poll(&done, &arrived), 1u);
  ASSERT_EQ(arrived.size(), 1u);
  EXPECT_EQ(arrived[0].peer, 0u);
  EXPECT_EQ(arrived[0].signal_idx, 3u);
  EXPECT_EQ(arrived[0].signal_value, 42u);
  // Not writable, past the end, a flag beyond the array: refused, nothing written, nothing to poll.
  EXPECT_EQ(t.post_write(write(8, 1, 0, 16, false, 0, 0)).code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(t.post_write(write(9, 0, 4090, 16, false, 0, 0)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(t.post_write(write(10, 0, 0, 16, true, 8, 1)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(b->region(0)->data()[0], 0) << "a refused write+signal writes no data either";
  done.clear();
  arrived.clear();
  EXPECT_EQ(t.poll(&done, &arrived), 0u);
  EXPECT_EQ(b->loopback().poll(&done, &arrived), 0u);
  // A rank nobody holds: refused for good (kUnavailable would mean "queue full, retry").
  t.set_peers(std::make_shared<const md::PeerList>(md::PeerList({{0, a}})));
  const mkernel::Status st = t.post_write(write(11, 0, 0, 0, true, 1, 1));
  EXPECT_EQ(st.code(), StatusCode::kNotFound);
  EXPECT_NE(st.message().find("rank 1 of communicator \"c\" is not connected to this daemon"), std::string::npos)
      << st.message();
  // Nothing to exchange or register: the set-up members say so.
  EXPECT_EQ(t.local_address().status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(t.set_signal_region(1).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(t.deregister_memory(1).code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(t.async_error().ok());
  t.set_peers(nullptr);  // the table holds this session: let go (as the proxy does)
}

TEST(DaemonCore, EndingASessionStopsItsProducers) {
  auto s = make_session(1, "c", 0, 1);
  ASSERT_TRUE(s->add_ring(4, 1).ok());
  EXPECT_TRUE(s->end(mkernel::Status(StatusCode::kInvalidArgument, "bad"), md::kRingErrRejected, 5, 9));
  EXPECT_FALSE(s->end(mkernel::Status(StatusCode::kInternal, "later"), md::kRingErrTransport, 0, 0));
  EXPECT_EQ(s->end_reason().message(), "bad");
  const mp::RingHeader* h = s->ring(0)->view.header;
  EXPECT_EQ(h->error, md::kRingErrRejected);
  EXPECT_EQ(h->error_detail, 5u);
  EXPECT_EQ(h->error_pos, 9u);
}

// A communicator's table holds the ranks that have sessions, whatever world size they claim.
TEST(DaemonCore, APeerListHoldsOnlyTheRanksThatExist) {
  auto a = make_session(1, "big", 7, 1u << 20);
  auto b = make_session(2, "big", 1048575, 1u << 20);
  const md::PeerList list({{1048575, b}, {7, a}});
  EXPECT_EQ(list.size(), 2u);
  EXPECT_EQ(list.find(7), a.get());
  EXPECT_EQ(list.find(1048575), b.get());
  EXPECT_EQ(list.find(0), nullptr);
  EXPECT_EQ(list.find(8), nullptr);
}
