// The command ring with host threads standing in for GPU blocks: wraparound, back-pressure,
// many producers exactly once, uncommitted slots, bounded waits and the error lines.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#include "mkernel/protocol/ring_host.h"

namespace mp = mkernel::protocol;
using namespace std::chrono_literals;

namespace {

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

// A ring in ordinary host memory, as the daemon's memfd segment would be.
class TestRing {
 public:
  explicit TestRing(uint32_t log2, uint64_t epoch = 1) {
    bytes_ = mp::ring_segment_bytes(log2);
    mem_.reset(std::aligned_alloc(4096, (bytes_ + 4095) / 4096 * 4096));
    const std::string err = mp::init_ring(mem_.get(), bytes_, log2, 77, epoch, &view_);
    EXPECT_EQ(err, "");
  }
  const mp::RingView& view() const { return view_; }
  void* mem() const { return mem_.get(); }
  size_t bytes() const { return bytes_; }

 private:
  std::unique_ptr<void, FreeDeleter> mem_;
  size_t bytes_ = 0;
  mp::RingView view_;
};

// Encodes (producer, sequence) into a command so the consumer can check exactly-once and order.
mp::Command tagged(uint32_t producer, uint64_t seq) {
  return mp::make_write(producer % 4, 0, seq * 8, 1, seq * 8, 8, (uint64_t{producer} << 40) | seq);
}
uint32_t producer_of(const mp::Command& c) { return static_cast<uint32_t>(c.tag >> 40); }
uint64_t seq_of(const mp::Command& c) { return c.tag & ((uint64_t{1} << 40) - 1); }

auto no_reject = [](const mp::CommandRecord&, mp::RejectReason why, uint64_t pos) {
  ADD_FAILURE() << "unexpected reject at " << pos << ": " << mp::reject_reason_name(why);
};

// Drains until `total` records were taken or the deadline passes; returns the number taken.
template <class OnCommand>
uint64_t drain(mp::RingConsumer& consumer, uint64_t total, std::chrono::seconds bound,
               OnCommand&& on_command) {
  const auto deadline = std::chrono::steady_clock::now() + bound;
  uint64_t taken = 0;
  while (taken < total && std::chrono::steady_clock::now() < deadline) {
    const size_t n = consumer.poll(256, on_command, no_reject);
    taken += n;
    if (n == 0) std::this_thread::yield();
  }
  return taken;
}

}  // namespace

TEST(RingSetup, RejectsBadGeometryWithTheFieldNamed) {
  alignas(4096) static unsigned char small[8192];
  mp::RingView v;
  EXPECT_EQ(mp::init_ring(small, sizeof(small), 0, 1, 1, &v),
            "capacity_log2: 0; expected 1..20");
  EXPECT_EQ(mp::init_ring(small, sizeof(small), 21, 1, 1, &v),
            "capacity_log2: 21; expected 1..20");
  EXPECT_EQ(mp::init_ring(small, sizeof(small), 10, 1, 1, &v),
            "segment size: 8192 bytes; expected at least 69632 for 2^10 slots");
  EXPECT_EQ(mp::init_ring(small + 8, 4096, 1, 1, 1, &v),
            "segment: address not 64-byte aligned; expected a page-aligned mapping");
}

TEST(RingSetup, AttachChecksIdentityAndRealSize) {
  TestRing ring(6);
  mp::RingView v;
  EXPECT_EQ(mp::attach_ring(ring.mem(), ring.bytes(), &v), "");
  EXPECT_EQ(v.capacity_log2, 6u);
  EXPECT_EQ(v.slots, ring.view().slots);
  // A header that claims more slots than the segment holds is refused.
  ring.view().header->capacity_log2 = 12;
  EXPECT_EQ(mp::attach_ring(ring.mem(), ring.bytes(), &v),
            "segment size: 8192 bytes; expected at least 266240 for 2^12 slots");
  ring.view().header->capacity_log2 = 6;
  ring.view().header->version = 99;
  EXPECT_EQ(mp::attach_ring(ring.mem(), ring.bytes(), &v),
            "ring protocol version: 99; expected 1");
  ring.view().header->version = mp::kProtocolVersion;
  ring.view().header->magic = 0;
  EXPECT_EQ(mp::attach_ring(ring.mem(), ring.bytes(), &v),
            "ring magic: 0; expected " + std::to_string(mp::kRingMagic));
}

TEST(Ring, WrapsAroundManyTimesInOrder) {
  TestRing ring(3);  // 8 slots
  mp::HostRingProducer producer(ring.view(), 1);
  mp::RingConsumer consumer(ring.view());
  uint64_t next = 0;
  constexpr uint64_t kTotal = 8 * 50 + 3;  // fifty laps and a bit
  for (uint64_t i = 0; i < kTotal; ++i) {
    ASSERT_EQ(producer.push(tagged(0, i), 1s), mp::kRingOk) << i;
    if (i % 5 == 4 || i + 1 == kTotal) {
      consumer.poll(
          64,
          [&](const mp::Command& c, uint64_t pos) {
            EXPECT_EQ(pos, next);
            EXPECT_EQ(seq_of(c), next);
            ++next;
          },
          no_reject);
    }
  }
  EXPECT_EQ(next, kTotal);
  EXPECT_EQ(consumer.tail(), kTotal);
  EXPECT_EQ(ring.view().header->tail, kTotal) << "tail published at the end of a poll";
  for (uint64_t i = 0; i < ring.view().capacity(); ++i)
    EXPECT_EQ(ring.view().slots[i].commit, 0u) << "slot " << i << " cleared after use";
}

TEST(Ring, BackPressureLosesNothingAndKeepsPerProducerOrder) {
  TestRing ring(4);  // 16 slots, far fewer than are pushed
  mp::RingConsumer consumer(ring.view());
  constexpr uint32_t kProducers = 4;
  constexpr uint64_t kEach = 5000;
  std::atomic<uint64_t> max_occupancy{0};
  std::vector<std::thread> threads;
  for (uint32_t p = 0; p < kProducers; ++p) {
    threads.emplace_back([&, p] {
      mp::HostRingProducer producer(ring.view(), 1);
      for (uint64_t i = 0; i < kEach; ++i)
        ASSERT_EQ(producer.push(tagged(p, i), 10s), mp::kRingOk);
    });
  }
  std::vector<uint64_t> next(kProducers, 0);
  uint64_t taken = 0;
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (taken < kProducers * kEach && std::chrono::steady_clock::now() < deadline) {
    // A slow consumer: let the ring fill before taking a few.
    std::this_thread::sleep_for(std::chrono::microseconds(taken % 997 == 0 ? 2000 : 20));
    max_occupancy = std::max<uint64_t>(max_occupancy, consumer.occupancy());
    taken += consumer.poll(
        7,
        [&](const mp::Command& c, uint64_t) {
          const uint32_t p = producer_of(c);
          ASSERT_LT(p, kProducers);
          EXPECT_EQ(seq_of(c), next[p]) << "producer " << p << " out of order";
          next[p] = seq_of(c) + 1;
        },
        no_reject);
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(taken, kProducers * kEach);
  for (uint32_t p = 0; p < kProducers; ++p) EXPECT_EQ(next[p], kEach);
  EXPECT_EQ(max_occupancy.load(), ring.view().capacity()) << "the ring never filled";
  EXPECT_EQ(consumer.stats().consumed, kProducers * kEach);
  EXPECT_EQ(consumer.stats().rejected, 0u);
}

TEST(Ring, TwelveProducersEveryRecordExactlyOnce) {
  TestRing ring(8);  // 256 slots
  mp::RingConsumer consumer(ring.view(), {.limits = {}, .tail_batch = 16});
  constexpr uint32_t kProducers = 12;
  constexpr uint64_t kEach = 20000;
  std::vector<std::thread> threads;
  for (uint32_t p = 0; p < kProducers; ++p) {
    threads.emplace_back([&, p] {
      mp::HostRingProducer producer(ring.view(), 1);
      std::vector<mp::Command> batch;
      for (uint64_t i = 0; i < kEach;) {
        if (p % 2 == 0) {  // half push one at a time, half in batches of up to 7
          ASSERT_EQ(producer.push(tagged(p, i), 10s), mp::kRingOk);
          ++i;
        } else {
          batch.clear();
          for (uint64_t k = 0; k < 1 + (i % 7) && i < kEach; ++k, ++i) batch.push_back(tagged(p, i));
          ASSERT_EQ(producer.push_batch(batch, 10s), mp::kRingOk);
        }
      }
    });
  }
  std::vector<std::vector<uint8_t>> seen(kProducers, std::vector<uint8_t>(kEach, 0));
  uint64_t duplicates = 0;
  const uint64_t taken = drain(consumer, kProducers * kEach, 60s, [&](const mp::Command& c, uint64_t) {
    const uint32_t p = producer_of(c);
    const uint64_t s = seq_of(c);
    ASSERT_LT(p, kProducers);
    ASSERT_LT(s, kEach);
    if (seen[p][s]++ != 0) ++duplicates;
  });
  for (auto& t : threads) t.join();
  EXPECT_EQ(taken, kProducers * kEach);
  EXPECT_EQ(duplicates, 0u);
  uint64_t missing = 0;
  for (auto& v : seen) missing += static_cast<uint64_t>(std::count(v.begin(), v.end(), 0));
  EXPECT_EQ(missing, 0u);
  EXPECT_EQ(ring.view().header->head, kProducers * kEach);
  EXPECT_EQ(ring.view().header->tail, kProducers * kEach);
}

TEST(Ring, UncommittedOrStaleSlotIsNeverTaken) {
  TestRing ring(2);  // 4 slots
  mp::RingConsumer consumer(ring.view());
  mp::CommandRecord& slot = ring.view().slots[0];
  mp::encode_payload(tagged(0, 0), slot);  // payload written, commit word not yet
  EXPECT_EQ(consumer.poll(8, [](const mp::Command&, uint64_t) { ADD_FAILURE(); }, no_reject), 0u);
  slot.commit = mp::commit_word(4, 2);  // the commit of the *next* lap: stale or early
  EXPECT_EQ(consumer.poll(8, [](const mp::Command&, uint64_t) { ADD_FAILURE(); }, no_reject), 0u);
  EXPECT_TRUE(consumer.slot_has_foreign_commit());
  slot.commit = mp::commit_word(0, 2);
  EXPECT_FALSE(consumer.slot_has_foreign_commit());
  int got = 0;
  EXPECT_EQ(consumer.poll(8, [&](const mp::Command&, uint64_t) { ++got; }, no_reject), 1u);
  EXPECT_EQ(got, 1);
  // Slot 2 committed before slot 1: nothing past the hole is taken.
  mp::encode_payload(tagged(0, 2), ring.view().slots[2]);
  ring.view().slots[2].commit = mp::commit_word(2, 2);
  EXPECT_EQ(consumer.poll(8, [](const mp::Command&, uint64_t) { ADD_FAILURE(); }, no_reject), 0u);
}

TEST(Ring, BoundedWaitExpiresWithItsCodeAndMarksTheAbandonedSlot) {
  TestRing ring(1);  // 2 slots, no consumer
  mp::HostRingProducer producer(ring.view(), 1);
  ASSERT_EQ(producer.push(tagged(0, 0), 1s), mp::kRingOk);
  ASSERT_EQ(producer.push(tagged(0, 1), 1s), mp::kRingOk);
  const auto t0 = std::chrono::steady_clock::now();
  uint64_t pos = 0;
  EXPECT_EQ(producer.push(tagged(0, 2), 50ms, &pos), mp::kRingTimeout);
  const auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(waited, 50ms);
  EXPECT_LT(waited, 5s);
  EXPECT_EQ(pos, 2u);
  mp::RingConsumer consumer(ring.view());
  uint32_t detail = 0;
  uint64_t at = 0;
  EXPECT_EQ(consumer.client_error(&detail, &at), mp::kRingTimeout);
  EXPECT_EQ(at, 2u);
  EXPECT_EQ(detail, 1u);
}

TEST(Ring, ConsumerErrorReleasesWaitingProducers) {
  TestRing ring(1);
  mp::HostRingProducer producer(ring.view(), 1);
  mp::RingConsumer consumer(ring.view());
  ASSERT_EQ(producer.push(tagged(0, 0), 1s), mp::kRingOk);
  ASSERT_EQ(producer.push(tagged(0, 1), 1s), mp::kRingOk);
  std::atomic<uint32_t> result{999};
  std::thread t([&] { result = producer.push(tagged(0, 2), 30s); });
  std::this_thread::sleep_for(20ms);
  const auto t0 = std::chrono::steady_clock::now();
  consumer.set_error(17, 3, 1);
  t.join();
  EXPECT_EQ(result.load(), mp::kRingConsumerError);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  // First error wins.
  consumer.set_error(18, 0, 0);
  EXPECT_EQ(ring.view().header->error, 17u);
  EXPECT_EQ(ring.view().header->error_detail, 3u);
}

TEST(Ring, EpochChangeTellsProducersTheDaemonRestarted) {
  TestRing ring(1, /*epoch=*/5);
  mp::HostRingProducer producer(ring.view(), 5);
  mp::RingConsumer consumer(ring.view());
  ASSERT_EQ(producer.push(tagged(0, 0), 1s), mp::kRingOk);
  ASSERT_EQ(producer.push(tagged(0, 1), 1s), mp::kRingOk);
  consumer.set_epoch(6);
  EXPECT_EQ(producer.push(tagged(0, 2), 30s), mp::kRingEpochChanged);
}

TEST(Ring, GarbageRecordIsRejectedCountedAndSkipped) {
  TestRing ring(3);
  mp::HostRingProducer producer(ring.view(), 1);
  mp::DecodeLimits lim;
  lim.num_ranks = 4;
  lim.num_regions = 2;
  mp::RingConsumer consumer(ring.view(), {.limits = lim, .tail_batch = 32});
  ASSERT_EQ(producer.push(tagged(0, 0), 1s), mp::kRingOk);
  ASSERT_EQ(producer.push(mp::make_write(9, 0, 0, 0, 0, 8), 1s), mp::kRingOk);  // rank 9 of 4
  ASSERT_EQ(producer.push(tagged(0, 2), 1s), mp::kRingOk);
  std::vector<uint64_t> ok_pos;
  std::vector<std::pair<uint64_t, mp::RejectReason>> bad;
  consumer.poll(
      8, [&](const mp::Command&, uint64_t pos) { ok_pos.push_back(pos); },
      [&](const mp::CommandRecord& r, mp::RejectReason why, uint64_t pos) {
        EXPECT_EQ(r.dst_rank, 9u);
        bad.emplace_back(pos, why);
      });
  EXPECT_EQ(ok_pos, (std::vector<uint64_t>{0, 2}));
  ASSERT_EQ(bad.size(), 1u);
  EXPECT_EQ(bad[0].first, 1u);
  EXPECT_EQ(bad[0].second, mp::kRejectBadRank);
  EXPECT_EQ(consumer.stats().consumed, 3u);
  EXPECT_EQ(consumer.stats().accepted, 2u);
  EXPECT_EQ(consumer.stats().rejected, 1u);
  EXPECT_EQ(consumer.stats().rejected_by_reason[mp::kRejectBadRank], 1u);
}

TEST(Ring, TailIsPublishedInBatches) {
  TestRing ring(8);
  mp::HostRingProducer producer(ring.view(), 1);
  mp::RingConsumer consumer(ring.view(), {.limits = {}, .tail_batch = 32});
  for (uint64_t i = 0; i < 100; ++i) ASSERT_EQ(producer.push(tagged(0, i), 1s), mp::kRingOk);
  std::vector<uint64_t> published_seen;
  consumer.poll(
      100,
      [&](const mp::Command&, uint64_t) { published_seen.push_back(ring.view().header->tail); },
      no_reject);
  // While taking 100 records the shared tail moved only at 32, 64 and 96, then once at the end.
  std::vector<uint64_t> distinct(published_seen);
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  EXPECT_EQ(distinct, (std::vector<uint64_t>{0, 32, 64, 96}));
  EXPECT_EQ(ring.view().header->tail, 100u);
}

TEST(Ring, HostileHeadDoesNotSteerTheConsumer) {
  TestRing ring(3);
  mp::RingConsumer consumer(ring.view());
  ring.view().header->head = ~uint64_t{0};
  EXPECT_EQ(consumer.occupancy(), 8u) << "clamped to capacity";
  EXPECT_EQ(consumer.poll(8, [](const mp::Command&, uint64_t) { ADD_FAILURE(); }, no_reject), 0u);
  ring.view().header->head = 0;
  EXPECT_EQ(consumer.occupancy(), 0u);
}

TEST(Ring, CompletionCounterAdvances) {
  TestRing ring(2);
  mp::RingConsumer consumer(ring.view());
  consumer.add_completed(3);
  consumer.add_completed(4);
  EXPECT_EQ(ring.view().header->completed, 7u);
}

TEST(Ring, BatchLargerThanTheRingIsAnArgumentError) {
  TestRing ring(2);
  mp::HostRingProducer producer(ring.view(), 1);
  std::vector<mp::Command> five(5, tagged(0, 0));
  EXPECT_EQ(producer.push_batch(five, 1s), mp::kRingInvalidArgument);
  EXPECT_EQ(producer.push_batch({}, 1s), mp::kRingInvalidArgument);
  EXPECT_EQ(ring.view().header->head, 0u) << "nothing claimed";
}

TEST(Ring, CallbackThatReturnsFalseStopsThePollAfterItsRecord) {
  TestRing ring(4);
  mp::HostRingProducer producer(ring.view(), 1);
  mp::RingConsumer consumer(ring.view());
  for (uint64_t i = 0; i < 6; ++i) ASSERT_EQ(producer.push(tagged(0, i), 1s), mp::kRingOk);
  uint64_t seen = 0;
  EXPECT_EQ(consumer.poll(16, [&](const mp::Command&, uint64_t pos) -> bool { ++seen; return pos < 2; },
                          no_reject),
            3u);
  EXPECT_EQ(seen, 3u);
  EXPECT_EQ(ring.view().header->tail, 3u) << "the records after the stop stay in the ring";
  EXPECT_EQ(consumer.poll(16, [](const mp::Command&, uint64_t) {}, no_reject), 3u);
}
