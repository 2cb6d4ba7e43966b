// The daemon core in-process: session quotas, the loopback transport's destination checks and
// the CPU-list parser used for proxy pinning.
#include <gtest/gtest.h>
#include <sys/socket.h>

#include "daemon.h"
#include "session.h"
#include "transport.h"

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
  auto a = make_session(1, "c", 0, 2);
  auto b = make_session(2, "c", 1, 2);
  ASSERT_TRUE(a->add_region(4096, false).ok());
  ASSERT_TRUE(b->add_region(4096, true).ok());   // region 0: writable
  ASSERT_TRUE(b->add_region(4096, false).ok());  // region 1: not writable
  ASSERT_TRUE(b->add_flags(8).ok());
  std::memset(a->region(0)->data(), 0xAB, 4096);
  md::PeerList peers = {a, b};
  md::LoopbackTransport t;
  mp::RejectReason why = mp::kRejectNone;
  ASSERT_TRUE(t.execute(*a, peers, mp::make_write_signal(1, 0, 0, 0, 100, 16, 3, 42), &why).ok());
  EXPECT_EQ(why, mp::kRejectNone);
  EXPECT_EQ(b->region(0)->data()[100], 0xAB);
  EXPECT_EQ(b->region(0)->data()[116], 0);
  EXPECT_EQ(b->flags()[3], 42u);
  // Not writable, past the end, a flag beyond the array: rejected, nothing written.
  ASSERT_TRUE(t.execute(*a, peers, mp::make_write(1, 0, 0, 1, 0, 16), &why).ok());
  EXPECT_EQ(why, mp::kRejectBadRegion);
  why = mp::kRejectNone;
  ASSERT_TRUE(t.execute(*a, peers, mp::make_write(1, 0, 0, 0, 4090, 16), &why).ok());
  EXPECT_EQ(why, mp::kRejectBadOffset);
  why = mp::kRejectNone;
  ASSERT_TRUE(t.execute(*a, peers, mp::make_write_signal(1, 0, 0, 0, 0, 16, 8, 1), &why).ok());
  EXPECT_EQ(why, mp::kRejectBadSignal);
  EXPECT_EQ(b->region(0)->data()[0], 0) << "a rejected write+signal writes no data either";
  // A rank nobody holds is a transport error, not a rejection.
  why = mp::kRejectNone;
  md::PeerList lonely = {a, nullptr};
  const mkernel::Status st = t.execute(*a, lonely, mp::make_signal(1, 0, 1), &why);
  EXPECT_EQ(st.code(), StatusCode::kUnavailable);
  EXPECT_EQ(why, mp::kRejectNone);
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
