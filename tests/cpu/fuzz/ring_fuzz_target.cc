#include "ring_fuzz_target.h"

#include <cstdlib>
#include <cstring>
#include <memory>

#include "mkernel/protocol/ring_host.h"

namespace mp = mkernel::protocol;

namespace {

struct Reader {
  const uint8_t* p;
  size_t n;
  uint8_t byte() {
    if (n == 0) return 0;
    --n;
    return *p++;
  }
  void fill(void* dst, size_t len) {
    const size_t k = len < n ? len : n;
    std::memcpy(dst, p, k);
    p += k;
    n -= k;
  }
  uint32_t u32() {
    uint32_t v = 0;
    fill(&v, sizeof(v));
    return v;
  }
};

struct FreeDeleter {
  void operator()(void* q) const { std::free(q); }
};

}  // namespace

std::string mkernel_ring_fuzz_one(const uint8_t* data, size_t size, RingFuzzCounts* counts) {
  Reader in{data, size};
  const uint32_t log2 = 1 + in.byte() % 6;  // 2..64 slots
  const size_t bytes = mp::ring_segment_bytes(log2);
  std::unique_ptr<void, FreeDeleter> mem(std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096));
  mp::RingView view;
  if (std::string err = mp::init_ring(mem.get(), bytes, log2, 1, 1, &view); !err.empty())
    return "init_ring: " + err;

  // Everything the producer side can write is attacker-controlled: the header's mutable lines
  // (identity line included) and every slot.
  in.fill(view.header, sizeof(mp::RingHeader));
  mp::DecodeLimits lim;
  lim.num_ranks = 1 + in.u32() % mp::kMaxRanks;
  lim.num_regions = in.u32() % (uint32_t{mp::kNoRegion} + 1);
  lim.num_signals = in.u32();
  lim.max_bytes = 1 + in.u32();
  mp::RingConsumer consumer(view, {.limits = lim, .tail_batch = 1 + in.byte() % 8u});
  const uint64_t start = consumer.tail();
  const uint64_t cap = view.capacity();
  for (uint64_t i = 0; i < cap; ++i) {
    const uint8_t control = in.byte();
    mp::CommandRecord& slot = view.slots[(start + i) & (cap - 1)];
    in.fill(&slot, sizeof(slot));
    // Steer part of the inputs past the cheap checks so the deeper ones are reached too.
    if (control & 1) slot.commit = mp::commit_word(start + i, log2);
    if (control & 2) slot.op = static_cast<uint8_t>(1 + slot.op % 4);
    if (control & 4) slot.flags = 0, slot.reserved0 = 0, slot.reserved1 = 0;
    if (control & 8) slot.dst_rank %= lim.num_ranks;
  }

  uint64_t accepted = 0, rejected = 0;
  std::string problem;
  auto on_command = [&](const mp::Command& c, uint64_t) {
    ++accepted;
    // An accepted command re-encodes to a record that decodes to the same command.
    mp::CommandRecord r{};
    mp::encode_payload(c, r);
    const mp::DecodeResult again = mp::decode(r, lim);
    if (!again.ok() || !(again.command == c)) problem = "accepted command does not round-trip";
    if (c.op == mp::kOpWrite || c.op == mp::kOpWriteSignal) {
      if (c.num_bytes == 0 || c.num_bytes > lim.max_bytes) problem = "accepted a bad byte count";
      if (c.src_region >= lim.num_regions || c.dst_region >= lim.num_regions)
        problem = "accepted a bad region";
      if (c.dst_offset + c.num_bytes < c.dst_offset) problem = "accepted an overflowing range";
    }
    if (c.op != mp::kOpFence && c.dst_rank >= lim.num_ranks) problem = "accepted a bad rank";
  };
  auto on_reject = [&](const mp::CommandRecord& r, mp::RejectReason why, uint64_t) {
    ++rejected;
    if (why == mp::kRejectNone || why >= mp::kNumRejectReasons) problem = "reject without reason";
    if (mp::decode(r, lim).reason != why) problem = "reject reason not deterministic";
  };
  const size_t taken = consumer.poll(4 * cap, on_command, on_reject);
  if (counts) {
    counts->accepted += accepted;
    counts->rejected += rejected;
  }
  if (!problem.empty()) return problem;
  const mp::ConsumerStats& st = consumer.stats();
  if (st.consumed != taken || st.consumed != st.accepted + st.rejected)
    return "counts do not reconcile";
  if (st.accepted != accepted || st.rejected != rejected) return "callbacks and counters disagree";
  uint64_t by_reason = 0;
  for (uint64_t v : st.rejected_by_reason) by_reason += v;
  if (by_reason != st.rejected) return "rejections by reason do not add up";
  if (taken > cap) return "took more records than the ring holds";
  if (consumer.tail() != start + taken) return "tail does not match records taken";
  if (view.header->tail != consumer.tail()) return "tail not published";
  if (consumer.occupancy() > cap) return "occupancy above capacity";
  for (uint64_t i = 0; i < taken; ++i)
    if (view.slots[(start + i) & (cap - 1)].commit != 0) return "taken slot not cleared";
  return {};
}
