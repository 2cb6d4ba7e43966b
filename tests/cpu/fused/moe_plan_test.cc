// moe_plan_test: the fused MoE's routing functions, row layout and movement protocol, replayed
// on the CPU for layouts up to 8 x 8 (kernels/fused/moe/moe_plan.h).
#include "fused/moe/moe_plan.h"

#include <gtest/gtest.h>

#include <numeric>
#include <set>

namespace mkernel::kernels {
namespace {

MoeGeometry geometry(FusedLayout l, uint32_t rank, uint32_t tokens, uint32_t experts, uint32_t top_k) {
  return moe_geometry(l, rank, tokens, 7168, 2048, experts, top_k);
}

TEST(MoeGeometry, BadInputIsNamed) {
  const FusedLayout l{2, 4};
  EXPECT_EQ(moe_check_geometry(geometry(l, 0, 128, 256, 8)), "");
  auto expect = [](MoeGeometry g, const std::string& field) {
    const std::string e = moe_check_geometry(g);
    EXPECT_EQ(e.rfind(field, 0), 0u) << e;
  };
  expect(geometry(l, 8, 128, 256, 8), "rank: 8");
  expect(geometry(l, 0, 0, 256, 8), "tokens: 0");
  expect(geometry(l, 0, 128, 252, 8), "experts: 252");
  expect(geometry(l, 0, 128, 256, 0), "top_k: 0");
  expect(geometry(l, 0, 128, 256, 33), "top_k: 33");
  auto g = geometry(l, 0, 128, 256, 8);
  g.hidden = 7170;
  expect(g, "hidden: 7170");
  g = geometry(l, 0, 128, 256, 8);
  g.out_hidden = 0;
  expect(g, "out_hidden: 0");
  g = geometry(l, 0, 128, 256, 8);
  g.recv_tokens_per_source = 129;
  expect(g, "recv_tokens_per_source: 129");
  g = geometry(l, 0, 128, 256, 8);
  g.expert_rows_capacity = uint64_t{8} * 128 * 8 + 1;
  expect(g, "expert_rows_capacity: 8193");
  g = geometry(l, 0, 128, 256, 8);
  g.chunk_tokens = 200;
  expect(g, "chunk_tokens: 200");
}

TEST(MoeGeometry, WorstCaseSizesAreDocumented) {
  // T = 4096, H = 7168, N = 2048, top-8 of 256 on 2 GPUs of one node.
  auto g = geometry(FusedLayout{1, 2}, 0, 4096, 256, 8);
  EXPECT_EQ(g.capacity(), 4096u);
  EXPECT_EQ(g.rows_capacity(), uint64_t{2} * 4096 * 8);
  EXPECT_EQ(g.net_bytes_needed(), 0u);
  EXPECT_EQ(g.meta_words(), 28u);  // 3 x 8 + 2 positions + the token, padded to 16 bytes
  EXPECT_EQ(g.count_stride(), 528u);  // 1 + 128 words, padded to 16 bytes
  const uint64_t nvl = 2 * 528 + uint64_t{2} * 4096 * (7168 * 2 + g.meta_words() * 4) +
                       uint64_t{2} * 1 * 4096 * 2048 * 2;
  EXPECT_EQ(g.nvl_bytes_needed(), nvl);
  EXPECT_EQ(g.off_tokens() % 16, 0u);
  EXPECT_EQ(g.off_meta() % 16, 0u);
  EXPECT_EQ(g.off_partials() % 16, 0u);
  EXPECT_EQ(g.local_bytes_needed(), g.rows_capacity() * (7168 + 2048) * 2);
  // Few experts per rank bound the rows: top-8 of 8 experts on 8 ranks is one row per rank.
  auto few = geometry(FusedLayout{1, 8}, 0, 100, 8, 8);
  EXPECT_EQ(few.rows_capacity(), uint64_t{8} * 100 * 1);
  // Two nodes: flags and network workspace.
  auto two = geometry(FusedLayout{2, 4}, 5, 256, 64, 4);
  EXPECT_EQ(two.net_bytes_needed(), 2 * 2 * two.net_slot());
  EXPECT_EQ(two.net_data(), 160u);  // 1 + 4 x (1 + 8) words, padded
  EXPECT_EQ(two.net_chunk_bytes() % 16, 0u);
  EXPECT_EQ(two.net_part(), two.net_data() + two.chunks() * two.net_chunk_bytes());
  EXPECT_EQ(two.net_flags_needed(), two.net_partial_flag(2, 0));
  EXPECT_GT(two.net_partial_flag(0, 0), two.net_token_flag(1, two.chunks() - 1));
  EXPECT_GT(two.token_flag(0, 0), two.count_flag(7));
  EXPECT_GT(two.partial_flag(0, 0, 0), two.token_flag(7, two.chunks() - 1));
}

TEST(MoeBlocks, StandaloneLaunchesTakeABlockPerItemWithinTheirBounds) {
  // The fused rule: 32 + 8 per node peer + 4 per other node, at most 96 and the SMs, at least 2.
  EXPECT_EQ(moe_default_blocks(FusedLayout{1, 1}, 132), 32);
  EXPECT_EQ(moe_default_blocks(FusedLayout{1, 2}, 132), 40);
  EXPECT_EQ(moe_default_blocks(FusedLayout{2, 1}, 132), 36);
  EXPECT_EQ(moe_default_blocks(FusedLayout{8, 8}, 132), 96);
  EXPECT_EQ(moe_default_blocks(FusedLayout{1, 8}, 40), 40);
  EXPECT_EQ(moe_default_blocks(FusedLayout{1, 1}, 1), 2);
  // Standalone: world x chunks (64 tokens a chunk at T = 4096), within [the fused rule, SMs].
  auto one = geometry(FusedLayout{1, 1}, 0, 4096, 256, 8);
  ASSERT_EQ(one.chunks(), 64u);
  EXPECT_EQ(moe_standalone_blocks(one, 132), 64);
  EXPECT_EQ(moe_standalone_blocks(one, 48), 48);  // no more than the SMs
  auto two = geometry(FusedLayout{1, 2}, 1, 4096, 256, 8);
  EXPECT_EQ(moe_standalone_blocks(two, 132), 128);
  EXPECT_EQ(moe_standalone_blocks(geometry(FusedLayout{8, 8}, 9, 4096, 512, 8), 132), 132);
  // Few tokens: few items, the fused rule's count stays the floor.
  auto small = geometry(FusedLayout{1, 1}, 0, 128, 256, 8);
  EXPECT_EQ(small.chunks(), 8u);
  EXPECT_EQ(moe_standalone_blocks(small, 132), 32);
  EXPECT_EQ(moe_standalone_blocks(geometry(FusedLayout{1, 2}, 0, 128, 256, 8), 132), 40);
  // A tiny GPU: the floor is itself bounded by the SMs.
  EXPECT_EQ(moe_standalone_blocks(one, 1), 2);
}

TEST(MoeRouting, FirstChoicePerRankAndNodeAndBadChoices) {
  const MoeShape s{FusedLayout{2, 2}, 16, 4};  // 4 experts per rank, 8 per node
  const int32_t c[4] = {1, 3, 9, 14};          // ranks 0, 0, 2, 3; nodes 0, 0, 1, 1
  EXPECT_TRUE(moe_first_on_rank(s, c, 0));
  EXPECT_FALSE(moe_first_on_rank(s, c, 1));
  EXPECT_TRUE(moe_first_on_rank(s, c, 2));
  EXPECT_TRUE(moe_first_on_rank(s, c, 3));
  EXPECT_TRUE(moe_first_on_node(s, c, 0));
  EXPECT_FALSE(moe_first_on_node(s, c, 1));
  EXPECT_TRUE(moe_first_on_node(s, c, 2));
  EXPECT_FALSE(moe_first_on_node(s, c, 3));
  const int32_t masked[4] = {-1, 3, -1, 2};
  EXPECT_FALSE(moe_first_on_rank(s, masked, 0));
  EXPECT_TRUE(moe_first_on_rank(s, masked, 1));
  EXPECT_FALSE(moe_first_on_rank(s, masked, 3));
  EXPECT_EQ(moe_bad_choice(s, masked), 0u);
  const int32_t twice[4] = {5, -1, 5, 0};
  EXPECT_EQ(moe_bad_choice(s, twice), 3u);
  const int32_t out[4] = {0, 16, 1, 2};
  EXPECT_EQ(moe_bad_choice(s, out), 2u);
  const int32_t neg[4] = {0, 1, -2, 2};
  EXPECT_EQ(moe_bad_choice(s, neg), 3u);
}

TEST(MoeRouting, SourceOrderIsAPermutationStartingWithSelf) {
  for (uint32_t nodes : {1u, 2u, 3u, 8u})
    for (uint32_t gpus : {1u, 2u, 5u, 8u}) {
      const FusedLayout l{nodes, gpus};
      for (uint32_t d = 0; d < l.world(); ++d) {
        std::set<uint32_t> seen;
        for (uint32_t i = 0; i < l.world(); ++i) {
          const uint32_t s = moe_source_order(l, d, i);
          ASSERT_LT(s, l.world());
          seen.insert(s);
          EXPECT_EQ(moe_source_index(l, d, s), i) << nodes << "x" << gpus << " d " << d << " s " << s;
          // own node first, then the others
          EXPECT_EQ(l.node_of(s) == l.node_of(d), i < gpus);
        }
        EXPECT_EQ(seen.size(), l.world());
        EXPECT_EQ(moe_source_order(l, d, 0), d);
      }
    }
}

TEST(MoeRouting, PositionsSlotsAndCountsMatchTheDefinition) {
  const FusedLayout l{2, 2};
  auto g = geometry(l, 1, 300, 32, 6);
  for (MoeRouteKind kind : {MoeRouteKind::kUniform, MoeRouteKind::kZipf, MoeRouteKind::kAllToOneRank,
                            MoeRouteKind::kSomeEmpty, MoeRouteKind::kNoChoices}) {
    const auto ch = moe_make_routing(kind, g.tokens, g.experts, g.top_k, l.world(), g.rank, 5);
    const MoeRouting r = moe_route(g, ch.data());
    ASSERT_EQ(r.error, "");
    const uint32_t epr = g.experts_per_rank();
    std::vector<uint32_t> next_pos(4, 0), next_npos(2, 0), next_slot(32, 0);
    for (uint32_t t = 0; t < g.tokens; ++t) {
      std::set<uint32_t> ranks, nodes;
      for (uint32_t j = 0; j < g.top_k; ++j) {
        const int32_t e = ch[t * g.top_k + j];
        if (e < 0) {
          EXPECT_EQ(r.slot[t * g.top_k + j], kMoeNoChoice);
          continue;
        }
        EXPECT_EQ(r.slot[t * g.top_k + j], next_slot[e]++);
        ranks.insert(e / epr);
        nodes.insert(e / epr / 2);
      }
      for (uint32_t d = 0; d < 4; ++d)
        EXPECT_EQ(r.pos[t * 4 + d], ranks.count(d) ? next_pos[d]++ : kMoeNoChoice);
      EXPECT_EQ(r.npos[t * 2 + 0], kMoeNoChoice) << "own node";
      EXPECT_EQ(r.npos[t * 2 + 1], nodes.count(1) ? next_npos[1]++ : kMoeNoChoice);
    }
    for (uint32_t d = 0; d < 4; ++d) EXPECT_EQ(r.send_tokens[d], next_pos[d]);
    for (uint32_t e = 0; e < 32; ++e) EXPECT_EQ(r.rows[e], next_slot[e]);
    EXPECT_EQ(r.node_tokens[1], next_npos[1]);
    if (kind == MoeRouteKind::kAllToOneRank) {
      EXPECT_EQ(r.send_tokens[0], g.tokens);
      EXPECT_EQ(r.send_tokens[1] + r.send_tokens[2] + r.send_tokens[3], 0u);
    }
  }
}

TEST(MoeRouting, BadChoicesAndOverflowAreNamed) {
  auto g = geometry(FusedLayout{1, 2}, 0, 4, 8, 2);
  std::vector<int32_t> ch = {0, 5, 1, 2, 3, 8, 4, 7};
  MoeRouting r = moe_route(g, ch.data());
  EXPECT_NE(r.error.find("token 2 choice 1: expert 8; expected -1 (no choice) or 0 .. 7"), std::string::npos) << r.error;
  ch[5] = 3;
  r = moe_route(g, ch.data());
  EXPECT_NE(r.error.find("token 2 choice 1: expert 3; chosen twice"), std::string::npos) << r.error;
  ch[5] = -1;
  g.recv_tokens_per_source = 2;
  r = moe_route(g, ch.data());  // tokens 0, 1 and 2 go to rank 0
  EXPECT_NE(r.error.find("routing sends 3 tokens from rank 0 to rank 0; recv_tokens_per_source is 2"), std::string::npos)
      << r.error;
}

TEST(MoeRowLayout, ExpertThenSourceInArrivalOrder) {
  auto g = geometry(FusedLayout{2, 2}, 3, 10, 8, 2);  // 2 experts per rank; rank 3 hosts experts 6, 7
  // counts[s] = {tokens, rows of expert 6, rows of expert 7}
  std::vector<std::vector<uint32_t>> counts = {{3, 1, 2}, {2, 2, 0}, {4, 3, 1}, {5, 4, 4}};
  const MoeRowLayout r = moe_row_layout(g, counts);
  ASSERT_EQ(r.error, "");
  // arrival order for rank 3: 3, 2, then node 0: 0, 1
  EXPECT_EQ(r.expert_base, (std::vector<uint64_t>{0, 10, 17}));
  EXPECT_EQ(r.row_of(0, 3, 0), 0u);
  EXPECT_EQ(r.row_of(0, 2, 0), 4u);
  EXPECT_EQ(r.row_of(0, 0, 0), 7u);
  EXPECT_EQ(r.row_of(0, 1, 1), 9u);
  EXPECT_EQ(r.row_of(1, 3, 3), 13u);
  EXPECT_EQ(r.row_of(1, 2, 0), 14u);
  EXPECT_EQ(r.row_of(1, 0, 1), 16u);
  EXPECT_EQ(r.total_rows, 17u);
  g.expert_rows_capacity = 16;
  EXPECT_NE(moe_row_layout(g, counts).error.find("receives 17 expert rows; expert_rows_capacity is 16"), std::string::npos);
  g.expert_rows_capacity = 0;
  g.recv_tokens_per_source = 4;
  EXPECT_NE(moe_row_layout(g, counts).error.find("rank 3 sends 5 tokens to rank 3; recv_tokens_per_source is 4"),
            std::string::npos);
}

struct Case {
  uint32_t nodes, gpus, tokens, experts, top_k;
};

TEST(MoeReplay, EveryLayoutUpToEightByEightEveryRouting) {
  const Case cases[] = {{1, 1, 37, 8, 2},  {1, 2, 70, 16, 4},  {1, 8, 50, 64, 8},  {2, 1, 45, 16, 4},
                        {2, 2, 64, 32, 8}, {2, 8, 24, 64, 8},  {3, 3, 29, 18, 3},  {4, 2, 33, 32, 6},
                        {8, 1, 20, 16, 4}, {8, 8, 12, 128, 8}, {1, 4, 40, 8, 8},   {5, 3, 17, 15, 15}};
  for (const Case& c : cases)
    for (MoeRouteKind kind : {MoeRouteKind::kUniform, MoeRouteKind::kZipf, MoeRouteKind::kAllToOneRank,
                              MoeRouteKind::kSomeEmpty, MoeRouteKind::kNoChoices, MoeRouteKind::kOnlyRankZeroSends}) {
      MoeReplayOptions o;
      o.route = kind;
      o.seed = c.nodes * 100 + c.gpus * 10 + static_cast<uint32_t>(kind);
      o.chunk_tokens = c.tokens > 20 ? 8 : 0;
      const MoeReplayReport r = moe_replay(FusedLayout{c.nodes, c.gpus}, c.tokens, c.experts, c.top_k, o);
      ASSERT_EQ(r.error, "") << c.nodes << "x" << c.gpus << " T " << c.tokens << " E " << c.experts << " k " << c.top_k
                             << " routing " << int(kind);
      for (const auto& e : r.launch_errors) EXPECT_EQ(e, "");
      if (c.nodes == 1) {
        EXPECT_EQ(r.network_token_transfers, 0u);
      }
      if (kind == MoeRouteKind::kUniform || kind == MoeRouteKind::kZipf) {
        EXPECT_EQ(r.rows, uint64_t{3} * c.nodes * c.gpus * c.tokens * std::min(c.top_k, c.experts))
            << "every (token, choice) computed once per launch";
      }
      if (c.nodes > 1 && kind == MoeRouteKind::kUniform) {
        EXPECT_GT(r.network_token_transfers, 0u);
        EXPECT_EQ(r.network_partial_transfers, r.network_token_transfers) << "combine mirrors dispatch";
      }
    }
}

TEST(MoeReplay, ManyInterleavingsOfTwoByFour) {
  for (uint64_t seed = 1; seed <= 30; ++seed) {
    MoeReplayOptions o;
    o.seed = seed;
    o.launches = 4;
    o.chunk_tokens = 4;
    o.route = seed % 2 ? MoeRouteKind::kZipf : MoeRouteKind::kUniform;
    o.fast_rank = seed % 3 == 0 ? static_cast<uint32_t>(seed % 8) : ~0u;
    const MoeReplayReport r = moe_replay(FusedLayout{2, 4}, 31, 32, 4, o);
    ASSERT_EQ(r.error, "") << "seed " << seed;
  }
}

TEST(MoeReplay, TheGemmStartsBandsBeforeEverySourceIsIn) {
  uint64_t early = 0;
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    MoeReplayOptions o;
    o.seed = seed;
    o.chunk_tokens = 4;
    const MoeReplayReport r = moe_replay(FusedLayout{2, 2}, 200, 4, 2, o);  // big experts: several bands each
    ASSERT_EQ(r.error, "");
    early += r.gemm_bands_started_early;
  }
  EXPECT_GT(early, 0u);
}

TEST(MoeReplay, CapacityOverflowEndsTheLaunchEverywhereWithTheCause) {
  for (const FusedLayout l : {FusedLayout{1, 4}, FusedLayout{2, 2}, FusedLayout{4, 2}}) {
    MoeReplayOptions o;
    o.route = MoeRouteKind::kAllToOneRank;  // every token of every rank to rank 0
    o.recv_tokens_per_source = 20;
    const MoeReplayReport r = moe_replay(l, 32, 16, 2, o);
    ASSERT_EQ(r.error, "") << l.nodes << "x" << l.gpus;
    ASSERT_EQ(r.launch_errors.size(), l.world());
    for (const auto& e : r.launch_errors) EXPECT_NE(e.find("recv_tokens_per_source is 20"), std::string::npos) << e;
  }
  // Rows over the receiver's capacity: found by the receiver once the counts are in.
  MoeReplayOptions o;
  o.route = MoeRouteKind::kAllToOneRank;
  o.expert_rows_capacity = 50;
  const MoeReplayReport r = moe_replay(FusedLayout{1, 2}, 32, 8, 2, o);
  ASSERT_EQ(r.error, "");
  for (const auto& e : r.launch_errors) EXPECT_NE(e.find("expert_rows_capacity is 50"), std::string::npos) << e;
}

TEST(MoeReplay, TheChecksCatchBrokenProtocols) {
  struct F {
    MoePlanFault fault;
    FusedLayout layout;
    MoeRouteKind route;
    const char* expect;
  };
  // Without the done() waits, only the count records can be overwritten early: every data
  // region's last reader of a launch finishes before its writer's launch ends (the home sum
  // waits for it), but a count record also goes to ranks that get no token (docs/kernels.md);
  // so that fault needs a rank racing ahead while the others are idle.
  const F faults[] = {
      {MoePlanFault::kDropLastToken, FusedLayout{1, 4}, MoeRouteKind::kUniform, "not expanded"},
      {MoePlanFault::kExpandUnflagged, FusedLayout{2, 2}, MoeRouteKind::kUniform, "holds launch"},
      {MoePlanFault::kForwardTwice, FusedLayout{2, 2}, MoeRouteKind::kUniform, "written twice"},
      {MoePlanFault::kSendPerChoice, FusedLayout{1, 2}, MoeRouteKind::kUniform, "written twice"},
      {MoePlanFault::kNoDoneWait, FusedLayout{1, 4}, MoeRouteKind::kOnlyRankZeroSends, "count record overwritten"},
  };
  for (const F& f : faults) {
    bool caught = false;
    std::string last;
    for (uint64_t seed = 1; seed <= 40 && !caught; ++seed) {
      MoeReplayOptions o;
      o.fault = f.fault;
      o.route = f.route;
      o.seed = seed;
      o.fast_rank = seed % 2 ? 0 : ~0u;
      o.launches = 4;
      o.chunk_tokens = 2;
      const MoeReplayReport r = moe_replay(f.layout, 24, 16, 4, o);
      last = r.error;
      caught = r.error.find(f.expect) != std::string::npos;
    }
    EXPECT_TRUE(caught) << "fault " << int(f.fault) << " not caught; last error: '" << last << "'";
  }
}

}  // namespace
}  // namespace mkernel::kernels
