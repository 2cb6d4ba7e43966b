// The ring-attention plan (kernels/fused/ring_attn/ring_attn_plan.h), replayed on the CPU for every
// layout up to 8 nodes x 8 GPUs and odd ones, several launches in a row, random interleavings of
// every rank's communication list, attention blocks and the proxies: every rank attends to every
// chunk exactly once per launch with the right data, no slot is overwritten before it is
// consumed, each chunk crosses the network once per other node, nobody waits on a flag nobody
// raises. The relations of each placement are checked against brute force over global positions
// (causal zigzag: equal work on every rank), the zigzag permutation both ways, bad geometry is
// refused with the field named, and broken plans prove the replay's checks can fail.
#include <gtest/gtest.h>

#include <initializer_list>
#include <set>
#include <string>
#include <vector>

#include "fused/ring_attn/ring_attn_plan.h"

namespace mk = mkernel::kernels;

namespace {

std::string layout_name(const mk::FusedLayout& l) { return std::to_string(l.nodes) + "x" + std::to_string(l.gpus); }

TEST(RingAttnPlan, EveryLayoutUpTo8x8) {
  for (uint32_t nodes = 1; nodes <= 8; ++nodes)
    for (uint32_t gpus = 1; gpus <= 8; ++gpus) {
      const mk::FusedLayout l{nodes, gpus};
      const uint32_t R = l.world();
      // The default slot count and the fewest the plan allows.
      const uint32_t least = R == 1 ? 1 : std::min(R - 1, nodes > 1 ? gpus : 1u);
      for (uint32_t slots : {0u, least}) {
        mk::RingReplayOptions o;
        o.launches = 3;
        o.attn_blocks = 2;
        o.slots = slots;
        o.seed = nodes * 131 + gpus * 7 + slots;
        const mk::RingReplayReport r = mk::ring_replay(l, o);
        ASSERT_EQ(r.error, "") << layout_name(l) << " slots " << slots;
        EXPECT_EQ(r.network_chunk_transfers, uint64_t{R} * (nodes - 1) * o.launches) << layout_name(l);
        EXPECT_EQ(r.nvlink_chunk_transfers, uint64_t{R} * (R - nodes) * o.launches) << layout_name(l);
        if (nodes > 1) {
          EXPECT_EQ(r.max_sends_per_chunk_node, 1u) << layout_name(l);
        }
      }
    }
}

// Many interleavings of a few layouts, more attention blocks, every placement (the movement does
// not depend on it, the replay's reads do not either: this guards that it stays so).
TEST(RingAttnPlan, ManyInterleavings) {
  const mk::FusedLayout layouts[] = {{1, 2}, {2, 1}, {2, 2}, {3, 2}, {2, 4}, {4, 3}, {1, 7}, {5, 1}};
  for (const auto& l : layouts)
    for (uint64_t seed = 1; seed <= 12; ++seed) {
      mk::RingReplayOptions o;
      o.launches = 4;
      o.attn_blocks = static_cast<uint32_t>(1 + seed % 4);
      o.comm_blocks = static_cast<uint32_t>(1 + seed % 3);
      o.placement = static_cast<uint32_t>(seed % 3);
      o.seed = seed * 977;
      const mk::RingReplayReport r = mk::ring_replay(l, o);
      ASSERT_EQ(r.error, "") << layout_name(l) << " seed " << seed;
    }
}

// Brute force: which (query, key) pairs of the global sequence a rank's chunk relation makes
// visible, against the causal rule on global positions.
struct Pair {
  uint64_t q, k;
  bool operator<(const Pair& o) const { return q != o.q ? q < o.q : k < o.k; }
};

// Global position of local position `l` of rank r under the placement.
uint64_t global_pos(uint32_t placement, uint32_t R, uint32_t s_local, uint32_t r, uint32_t l) {
  if (placement != mk::kRingCausalZigzag) return uint64_t{r} * s_local + l;
  return mk::ring_zigzag_source(uint64_t{R} * s_local, R, uint64_t{r} * s_local + l);
}

TEST(RingAttnPlan, RelationsMatchBruteForce) {
  const mk::FusedLayout layouts[] = {{1, 1}, {1, 2}, {2, 1}, {1, 3}, {2, 2}, {3, 2}, {2, 4}, {1, 8}};
  for (const auto& l : layouts)
    for (uint32_t placement : {mk::kRingNonCausal, mk::kRingCausalContiguous, mk::kRingCausalZigzag})
      for (uint32_t s_local : {2u, 6u, 10u}) {
        const uint32_t R = l.world();
        const bool causal = placement != mk::kRingNonCausal;
        std::set<Pair> all;
        uint64_t total = 0;
        std::vector<uint64_t> work(R);
        for (uint32_t r = 0; r < R; ++r) {
          mk::RingGeometry g{l, r, s_local, placement, mk::ring_default_slots(l)};
          ASSERT_EQ(mk::ring_check_geometry(g), "");
          std::set<uint32_t> sources;
          for (uint32_t t = 0; t < R; ++t) {
            const uint32_t q_rank = g.source_of(r, t);
            EXPECT_EQ(g.step_of(r, q_rank), t);
            sources.insert(q_rank);
            for (uint32_t grp = 0; grp < 2; ++grp) {
              const mk::RingChunk c = mk::ring_chunk(g, t, grp);
              if (grp >= g.groups()) {
                EXPECT_EQ(c.relation, mk::kRingSkip);
                continue;
              }
              for (uint32_t i = 0; i < g.group_rows(grp); ++i) {
                const uint32_t qi = g.group_row0(grp) + i;
                const uint64_t qg = global_pos(placement, R, s_local, r, qi);
                for (uint32_t j = 0; j < s_local; ++j) {
                  const uint64_t kg = global_pos(placement, R, s_local, q_rank, j);
                  const bool want = !causal || kg <= qg;
                  bool got = false;
                  if (c.relation == mk::kRingFull) got = j < c.kv_len;
                  if (c.relation == mk::kRingCausal)
                    got = j < c.kv_len && static_cast<int64_t>(j) <= static_cast<int64_t>(i) + c.causal_offset;
                  ASSERT_EQ(got, want) << layout_name(l) << " placement " << placement << " s_local " << s_local
                                       << " rank " << r << " step " << t << " group " << grp << " row " << i << " key "
                                       << j;
                  if (got) {
                    all.insert(Pair{qg, kg});
                    ++total;
                    ++work[r];
                  }
                }
              }
            }
          }
          EXPECT_EQ(sources.size(), R) << "every chunk once";
          EXPECT_EQ(mk::ring_visible_pairs(g), work[r]);
        }
        const uint64_t S = uint64_t{R} * s_local;
        EXPECT_EQ(total, all.size()) << "no pair twice";
        EXPECT_EQ(total, causal ? S * (S + 1) / 2 : S * S) << layout_name(l) << " placement " << placement;
        if (placement == mk::kRingCausalZigzag) {
          for (uint32_t r = 1; r < R; ++r) {
            EXPECT_EQ(work[r], work[0]) << layout_name(l) << ": zigzag must balance";
          }
        }
        if (placement == mk::kRingCausalContiguous && R > 1) {
          EXPECT_GT(work[R - 1], work[0]);
        }
      }
}

// Running-state flags: per group, the first non-skipped step starts the state, the last writes.
TEST(RingAttnPlan, RunningStateFlags) {
  for (uint32_t R : {1u, 2u, 5u, 8u}) {
    const mk::FusedLayout l{1, R};
    for (uint32_t placement : {mk::kRingNonCausal, mk::kRingCausalContiguous, mk::kRingCausalZigzag})
      for (uint32_t r = 0; r < R; ++r) {
        mk::RingGeometry g{l, r, 8, placement, mk::ring_default_slots(l)};
        for (uint32_t grp = 0; grp < g.groups(); ++grp) {
          int first = -1, last = -1, finals = 0, starts = 0;
          for (uint32_t t = 0; t < R; ++t) {
            const mk::RingChunk c = mk::ring_chunk(g, t, grp);
            if (c.relation == mk::kRingSkip) {
              EXPECT_EQ(c.flags, 0u);
              continue;
            }
            if (first < 0) first = static_cast<int>(t);
            last = static_cast<int>(t);
            finals += (c.flags & mk::kRingWriteFinal) != 0;
            starts += (c.flags & mk::kRingReadRunning) == 0;
          }
          ASSERT_GE(first, 0) << "every group attends to something (its own chunk)";
          EXPECT_EQ(finals, 1);
          EXPECT_EQ(starts, 1);
          EXPECT_EQ(mk::ring_chunk(g, static_cast<uint32_t>(last), grp).flags & mk::kRingWriteFinal,
                    static_cast<uint32_t>(mk::kRingWriteFinal));
          EXPECT_EQ(mk::ring_chunk(g, static_cast<uint32_t>(first), grp).flags & mk::kRingReadRunning, 0u);
        }
      }
  }
}

TEST(RingAttnPlan, ZigzagPermutation) {
  // 8 positions on 2 ranks: chunks of 2; rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2.
  EXPECT_EQ(mk::ring_zigzag_permutation(8, 2), (std::vector<uint64_t>{0, 1, 6, 7, 2, 3, 4, 5}));
  EXPECT_EQ(mk::ring_zigzag_permutation(4, 1), (std::vector<uint64_t>{0, 1, 2, 3}));
  for (uint32_t R : {1u, 2u, 3u, 8u, 64u})
    for (uint64_t c : {1ull, 3ull, 128ull}) {
      const uint64_t S = 2 * R * c;
      ASSERT_EQ(mk::ring_zigzag_check(S, R), "");
      const std::vector<uint64_t> perm = mk::ring_zigzag_permutation(S, R);
      std::vector<bool> hit(S, false);
      for (uint64_t p = 0; p < S; ++p) {
        ASSERT_LT(perm[p], S);
        EXPECT_FALSE(hit[perm[p]]) << "a bijection";
        hit[perm[p]] = true;
        EXPECT_EQ(mk::ring_zigzag_target(S, R, perm[p]), p);
      }
    }
  EXPECT_NE(mk::ring_zigzag_check(10, 4).find("seq: 10"), std::string::npos);
  EXPECT_NE(mk::ring_zigzag_check(8, 0).find("world: 0"), std::string::npos);
}

TEST(RingAttnPlan, BadGeometryIsRefused) {
  auto err = [](mk::RingGeometry g) { return mk::ring_check_geometry(g); };
  const mk::FusedLayout l22{2, 2};
  EXPECT_NE(err({{0, 2}, 0, 8, mk::kRingNonCausal, 1}).find("layout: 0 nodes"), std::string::npos);
  EXPECT_NE(err({l22, 4, 8, mk::kRingNonCausal, 2}).find("rank: 4"), std::string::npos);
  EXPECT_NE(err({l22, 0, 0, mk::kRingNonCausal, 2}).find("s_local: 0"), std::string::npos);
  EXPECT_NE(err({l22, 0, 7, mk::kRingCausalZigzag, 2}).find("s_local: 7 with zigzag"), std::string::npos);
  EXPECT_NE(err({l22, 0, 8, 9, 2}).find("placement: 9"), std::string::npos);
  EXPECT_NE(err({l22, 0, 8, mk::kRingNonCausal, 0}).find("slots: 0"), std::string::npos);
  EXPECT_NE(err({l22, 0, 8, mk::kRingNonCausal, 9}).find("slots: 9"), std::string::npos);
  EXPECT_NE(err({{1, 3}, 0, 8, mk::kRingNonCausal, 3}).find("at most world - 1 = 2"), std::string::npos);
  EXPECT_NE(err({l22, 0, 8, mk::kRingNonCausal, 1}).find("at least gpus = 2"), std::string::npos);
  EXPECT_EQ(err({l22, 0, 8, mk::kRingCausalZigzag, 2}), "");
  EXPECT_EQ(mk::ring_default_slots({1, 1}), 1u);
  EXPECT_EQ(mk::ring_default_slots({1, 2}), 1u);
  EXPECT_EQ(mk::ring_default_slots({1, 8}), 4u);
  EXPECT_EQ(mk::ring_default_slots({8, 8}), 8u);
  for (uint32_t n = 1; n <= 8; ++n)
    for (uint32_t g = 1; g <= 8; ++g)
      EXPECT_EQ(err({{n, g}, 0, 8, mk::kRingCausalZigzag, mk::ring_default_slots({n, g})}), "") << n << "x" << g;
}

// Each fault must be caught on some interleaving: a passing replay then means something. `must`
// lists what the error may say (any one of them).
void expect_caught(const mk::FusedLayout& l, mk::RingPlanFault fault, uint32_t slots,
                   std::initializer_list<const char*> must) {
  std::string seen;
  for (uint64_t seed = 1; seed <= 40 && seen.empty(); ++seed) {
    mk::RingReplayOptions o;
    o.launches = 3;
    o.slots = slots;
    o.fault = fault;
    o.seed = seed;
    seen = mk::ring_replay(l, o).error;
  }
  bool found = false;
  for (const char* m : must) found = found || seen.find(m) != std::string::npos;
  EXPECT_TRUE(found) << layout_name(l) << ": got \"" << seen << "\"";
}

TEST(RingAttnPlan, BrokenPlansAreCaught) {
  // A slot written before its reader of this launch (or of the previous one) read it.
  expect_caught({1, 4}, mk::RingPlanFault::kNoFreedWait, 1, {"still has", "another write is in progress"});
  expect_caught({2, 2}, mk::RingPlanFault::kNoFreedWait, 2, {"still has", "another write is in progress"});
  // A forwarded slot freed once the attention blocks are done with it, while the forward reads it.
  expect_caught({3, 2}, mk::RingPlanFault::kFreeBeforeForward, 2, {"still has"});
  expect_caught({3, 2}, mk::RingPlanFault::kFreeBeforeForward, 3, {"still has"});
  expect_caught({4, 3}, mk::RingPlanFault::kFreeBeforeForward, 4, {"still has"});
  // A missing push: its receiver waits for ever (or, for a forward, its slot is never freed).
  expect_caught({1, 3}, mk::RingPlanFault::kDropLastPush, 0, {"deadlock"});
  expect_caught({2, 2}, mk::RingPlanFault::kDropLastPush, 0, {"deadlock", "freed count of step 2"});
  // Staging or a rail peer's network slot overwritten while the previous launch still reads it.
  expect_caught({3, 1}, mk::RingPlanFault::kNoSlotFreeWait, 0, {"network"});
  // Fewer slots than GPUs per node across nodes: forwards wait for each other in a circle.
  expect_caught({2, 3}, mk::RingPlanFault::kTooFewSlots, 0, {"deadlock"});
}

// The kernel's first version counted an attention block out of step t's slot only when a unit of
// step t + 1 arrived; with one slot the writer of chunk t + 1 waits for that count: a deadlock.
// The kernel now counts at a step-end marker, before waiting for the next chunk.
TEST(RingAttnPlan, StepCountWaitingForTheNextChunkDeadlocks) {
  expect_caught({1, 3}, mk::RingPlanFault::kLateStepCount, 1, {"deadlock"});
  expect_caught({1, 4}, mk::RingPlanFault::kLateStepCount, 1, {"deadlock"});
  mk::RingReplayOptions o;  // with every chunk in its own slot the late count is merely late
  o.slots = 3;
  o.fault = mk::RingPlanFault::kLateStepCount;
  EXPECT_EQ(mk::ring_replay({1, 4}, o).error, "");
}

}  // namespace
