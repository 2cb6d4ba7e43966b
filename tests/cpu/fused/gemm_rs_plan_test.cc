// The GEMM+ReduceScatter plan (kernels/fused/gemm_rs/gemm_rs_plan.h), replayed on the CPU for
// every layout up to 8 nodes x 8 GPUs and odd ones, with the engine's scheduler (several cluster
// counts, clusters of 1 and 2, both orders), several launches in a row and random interleavings:
// every rank's rows hold every rank's partial exactly once, of the right launch; nothing is
// overwritten before it was read; each node sum crosses the network once per destination node;
// nobody waits on a flag nobody raises (no deadlock). Broken plans prove the checks can fail.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "fused/gemm_rs/gemm_rs_plan.h"

namespace mk = mkernel::kernels;

namespace {

std::string layout_name(const mk::FusedLayout& l) { return std::to_string(l.nodes) + "x" + std::to_string(l.gpus); }

// Tiles of the band of `rank` (one count per m block overlapping it, times the n blocks).
uint64_t band_tiles(const mk::RsGeometry& g, uint32_t rank) { return uint64_t{g.band_mb_count(rank)} * g.num_n_blocks(); }

TEST(GemmRsPlan, EveryLayoutUpTo8x8) {
  for (uint32_t nodes = 1; nodes <= 8; ++nodes)
    for (uint32_t gpus = 1; gpus <= 8; ++gpus) {
      const mk::FusedLayout l{nodes, gpus};
      // 128 rows per rank (rotated order on one node), 100 (tiles shared by two bands: the
      // identical order). One n block: the plan works per m block.
      for (uint32_t m_local : {128u, 100u}) {
        mk::RsReplayOptions o;
        o.launches = 2;
        o.clusters = 3;
        o.n = 256;
        o.seed = nodes * 131 + gpus * 7 + m_local;
        const mk::RsReplayReport r = mk::rs_replay(l, m_local, o);
        EXPECT_EQ(r.error, "") << layout_name(l) << " m_local " << m_local;
        const mk::RsGeometry g{l, 0, m_local, o.n, o.block_n};
        uint64_t own = 0, sends = 0;
        for (uint32_t b = 0; b < l.world(); ++b) {
          own += band_tiles(g, b);
          sends += band_tiles(g, b) * (nodes - 1);  // every other node sends each tile of the band once
        }
        EXPECT_EQ(r.tiles_finished, own * o.launches) << layout_name(l);
        EXPECT_EQ(r.network_tile_sends, sends * o.launches) << layout_name(l);
        if (nodes > 1) {
          EXPECT_EQ(r.max_sends_per_tile_node, 1u) << layout_name(l);
        }
      }
    }
}

// GEMM+AllReduce: every rank gets every band; final tiles cross the network once per node.
TEST(GemmRsPlan, AllReduceEveryLayoutUpTo8x8) {
  for (uint32_t nodes = 1; nodes <= 8; ++nodes)
    for (uint32_t gpus = 1; gpus <= 8; ++gpus) {
      const mk::FusedLayout l{nodes, gpus};
      for (uint32_t m_local : {100u}) {
        mk::RsReplayOptions o;
        o.launches = 2;
        o.clusters = 3;
        o.n = 256;
        o.all_reduce = true;
        o.seed = nodes * 17 + gpus * 5 + m_local;
        const mk::RsReplayReport r = mk::rs_replay(l, m_local, o);
        EXPECT_EQ(r.error, "") << layout_name(l) << " m_local " << m_local;
        const mk::RsGeometry g{l, 0, m_local, o.n, o.block_n, true};
        uint64_t all = 0;
        for (uint32_t b = 0; b < l.world(); ++b) all += band_tiles(g, b);
        EXPECT_EQ(r.results_taken, all * (l.world() - 1) * o.launches) << layout_name(l);
        EXPECT_EQ(r.network_result_sends, all * (nodes - 1) * o.launches) << layout_name(l);
        if (nodes > 1) {
          EXPECT_EQ(r.max_sends_per_tile_node, 1u) << layout_name(l);
        }
      }
    }
}

// Uneven bands (M not a multiple of the rank count, fewer rows than ranks): AllReduce takes any M.
TEST(GemmRsPlan, UnevenBands) {
  struct Case {
    mk::FusedLayout l;
    uint32_t m_rows;
  };
  for (const Case& c : {Case{{1, 3}, 1000}, Case{{2, 2}, 3}, Case{{3, 2}, 1001}, Case{{1, 8}, 5}, Case{{8, 1}, 1},
                        Case{{4, 4}, 700}, Case{{2, 3}, 129}}) {
    for (bool ar : {true, false}) {
      for (uint64_t seed = 1; seed <= 3; ++seed) {
        mk::RsReplayOptions o;
        o.all_reduce = ar;
        o.m_rows = c.m_rows;
        o.launches = 2;
        o.n = 264;
        o.block_n = 128;
        o.seed = seed;
        const mk::RsReplayReport r = mk::rs_replay(c.l, 0, o);
        EXPECT_EQ(r.error, "") << layout_name(c.l) << " M " << c.m_rows << (ar ? " all-reduce" : "");
        const mk::RsGeometry g{c.l, 0, 0, o.n, o.block_n, ar, c.m_rows};
        uint64_t all = 0;
        for (uint32_t b = 0; b < c.l.world(); ++b) all += band_tiles(g, b);
        EXPECT_EQ(r.tiles_finished, all * o.launches);
        if (ar) {
          EXPECT_EQ(r.results_taken, all * (c.l.world() - 1) * o.launches) << layout_name(c.l);
        }
      }
    }
  }
  // Band arithmetic: every row in exactly one band, bands differ by at most a row.
  const mk::RsGeometry g{{2, 4}, 0, 0, 256, 256, true, 1001};
  uint64_t rows = 0;
  for (uint32_t b = 0; b < 8; ++b) {
    rows += g.band_rows(b);
    EXPECT_TRUE(g.band_rows(b) == 125 || g.band_rows(b) == 126) << b;
    for (uint64_t x = g.band_lo(b); x < g.band_lo(b + 1); ++x) ASSERT_EQ(g.band_of_row(x), b) << x;
  }
  EXPECT_EQ(rows, 1001u);
  EXPECT_FALSE(mk::rs_order(mk::RsGeometry{{1, 2}, 0, 0, 256, 256, true, 1281}, 1, 8).rotated);  // uneven
  EXPECT_TRUE(mk::rs_order(mk::RsGeometry{{1, 2}, 0, 0, 256, 256, true, 1280}, 1, 8).rotated);   // 2 x 640 rows
}

TEST(GemmRsPlan, OddShapesClustersAndSchedules) {
  struct Case {
    mk::FusedLayout l;
    uint32_t m_local;
    uint32_t cluster_m, clusters, group, block_n, n;
  };
  for (const Case& c : {Case{{3, 2}, 1, 1, 2, 8, 128, 8}, Case{{1, 5}, 77, 1, 4, 8, 256, 264},
                        Case{{1, 2}, 4096, 2, 66, 8, 256, 1024}, Case{{1, 4}, 384, 2, 5, 8, 128, 256},
                        Case{{1, 3}, 1280, 2, 7, 4, 256, 512}, Case{{2, 3}, 129, 2, 3, 8, 256, 512},
                        Case{{5, 1}, 1000, 1, 4, 8, 128, 136}, Case{{4, 2}, 64, 2, 2, 8, 256, 256},
                        Case{{2, 8}, 8, 1, 3, 8, 256, 256}, Case{{7, 3}, 333, 2, 5, 3, 128, 200}}) {
    for (uint64_t seed = 1; seed <= 4; ++seed) {
      mk::RsReplayOptions o;
      o.all_reduce = seed % 2 == 0;
      o.launches = 3;
      o.cluster_m = c.cluster_m;
      o.clusters = c.clusters;
      o.group = c.group;
      o.block_n = c.block_n;
      o.n = c.n;
      o.seed = seed;
      const mk::RsReplayReport r = mk::rs_replay(c.l, c.m_local, o);
      EXPECT_EQ(r.error, "") << layout_name(c.l) << " m_local " << c.m_local << " seed " << seed;
    }
  }
}

// The order: rotated only on one node with bands of whole cluster tiles, the raster's group
// dividing the bands' groups; the same group on every rank; each rank starts after its own band.
TEST(GemmRsPlan, Order) {
  const mk::RsGeometry g{{1, 4}, 1, 1024, 4096, 256};
  const mk::RsOrder o = mk::rs_order(g, 2, 8);
  EXPECT_TRUE(o.rotated);
  EXPECT_EQ(o.first_m_block, 16u);  // band 2 starts at row 2048
  EXPECT_EQ(uint64_t{3} * (1024 / 256) % o.group, 0u);
  EXPECT_EQ(o.group, 4u);
  EXPECT_FALSE(mk::rs_order(mk::RsGeometry{{1, 4}, 1, 1000, 4096, 256}, 1, 8).rotated);  // shared tiles
  EXPECT_FALSE(mk::rs_order(mk::RsGeometry{{1, 4}, 1, 128, 4096, 256}, 2, 8).rotated);   // half a cluster
  EXPECT_FALSE(mk::rs_order(mk::RsGeometry{{2, 2}, 1, 1024, 4096, 256}, 1, 8).rotated);  // two nodes
  EXPECT_EQ(mk::rs_order(mk::RsGeometry{{1, 2}, 1, 4096, 4096, 256}, 2, 8).first_m_block, 0u);  // wraps
  // Three ranks, 5 groups per band: boundary 10, so the group is 5.
  EXPECT_EQ(mk::rs_order(mk::RsGeometry{{1, 3}, 0, 1280, 4096, 256}, 2, 8).group, 5u);
}

// Index arithmetic: positions of a rail's tiles are distinct and inside the staging; slot
// indices inside a slot.
TEST(GemmRsPlan, StagingPositionsAreDistinct) {
  for (const mk::FusedLayout l : {mk::FusedLayout{2, 3}, mk::FusedLayout{3, 2}, mk::FusedLayout{1, 8}})
    for (uint32_t m_local : {1u, 100u, 128u, 300u}) {
      const mk::RsGeometry g{l, 0, m_local, 520, 256};
      for (uint32_t rail = 0; rail < l.gpus; ++rail) {
        std::set<uint32_t> seen;
        for (uint32_t mb = 0; mb < g.num_m_blocks(); ++mb) {
          if (g.rail_band_in(mb, rail) >= l.world()) continue;
          for (uint32_t nb = 0; nb < g.num_n_blocks(); ++nb) {
            const uint32_t p = g.stage_position(mb, nb, rail);
            EXPECT_LT(p, g.stage_tiles());
            EXPECT_TRUE(seen.insert(p).second) << layout_name(l) << " m_local " << m_local << " rail " << rail;
          }
        }
      }
      for (uint32_t b = 0; b < l.world(); ++b)
        for (uint32_t mb = g.band_mb_begin(b); mb < g.band_mb_end(b); ++mb)
          EXPECT_LT(g.slot_index(b, mb, g.num_n_blocks() - 1), g.slot_tiles());
    }
}

// The kernel's per-tile path reads rs_tables instead of evaluating the geometry (gemm_rs.cuh):
// every entry must be the geometry's value, for every rank of every layout up to 8 x 8, even and
// uneven bands, and the index identities the kernel uses in place of stage_slot and node_peer.
TEST(GemmRsPlan, TablesMatchTheGeometry) {
  uint64_t checked = 0;
  for (uint32_t nodes = 1; nodes <= 8; ++nodes)
    for (uint32_t gpus = 1; gpus <= 8; ++gpus) {
      const mk::FusedLayout l{nodes, gpus};
      for (uint32_t m_local : {1u, 100u, 128u, 200u, 384u}) {
        for (uint32_t m_rows : {0u, 7u, 1000u}) {
          for (uint32_t rank = 0; rank < l.world(); ++rank) {
            mk::RsGeometry g{l, rank, m_local, 520, 256, m_rows != 0, m_rows};
            ASSERT_EQ(mk::rs_check_geometry(g), "");
            const mk::RsTables t = mk::rs_tables(g);
            const std::string what = layout_name(l) + " rank " + std::to_string(rank) + " m_local " +
                                     std::to_string(m_local) + " m_rows " + std::to_string(m_rows);
            ASSERT_EQ(t.mblocks.size(), g.num_m_blocks()) << what;
            ASSERT_EQ(t.rail_stage.size(), gpus > 1 ? uint64_t{g.num_m_blocks()} * gpus : 0u) << what;
            EXPECT_EQ(t.stage_tiles, gpus > 1 ? g.stage_tiles() : 0u) << what;
            EXPECT_EQ(t.slot_tiles, g.slot_tiles()) << what;
            EXPECT_EQ(t.band_lo, g.band_lo(rank)) << what;
            EXPECT_EQ(t.band_hi, g.band_lo(rank + 1)) << what;
            const uint32_t local = l.local_of(rank), nnb = g.num_n_blocks();
            for (uint32_t mb = 0; mb < g.num_m_blocks(); ++mb) {
              const mk::RsMBlock& e = t.mblocks[mb];
              EXPECT_EQ(e.first_band, g.first_band(mb)) << what << " mb " << mb;
              EXPECT_EQ(e.last_band, g.last_band(mb)) << what << " mb " << mb;
              if (g.rail_band_in(mb, local) < l.world()) {
                for (uint32_t nb = 0; nb < nnb; ++nb)
                  ASSERT_EQ(e.own_stage * nnb + nb, g.stage_position(mb, nb, local)) << what << " mb " << mb;
              } else {
                EXPECT_EQ(e.own_stage, mk::kRsNone) << what << " mb " << mb;
              }
              if (g.band_in_tile(rank, mb)) {
                for (uint32_t nb = 0; nb < nnb; ++nb)
                  ASSERT_EQ(e.own_slot * nnb + nb, g.slot_index(rank, mb, nb)) << what << " mb " << mb;
              } else {
                EXPECT_EQ(e.own_slot, mk::kRsNone) << what << " mb " << mb;
              }
              for (uint32_t rail = 0; rail < gpus && gpus > 1; ++rail) {
                const uint32_t at = t.rail_stage[uint64_t{mb} * gpus + rail];
                if (g.rail_band_in(mb, rail) < l.world()) {
                  EXPECT_EQ(at * nnb + nnb - 1, g.stage_position(mb, nnb - 1, rail)) << what << " mb " << mb;
                } else {
                  EXPECT_EQ(at, mk::kRsNone) << what << " mb " << mb;
                }
              }
              ++checked;
            }
            // The kernel's peer and slot arithmetic: the i-th node peer's local index is
            // local - i wrapping, this rank's slot in its staging is i - 1, and peer s's slot in
            // this rank's staging is s - local - 1 wrapping.
            for (uint32_t i = 1; i < gpus; ++i) {
              const uint32_t pl = local >= i ? local - i : local + gpus - i;
              EXPECT_EQ(l.node_peer(rank, i), l.rank_of(l.node_of(rank), pl)) << what;
              EXPECT_EQ(g.stage_slot(pl, local), i - 1) << what;
            }
            for (uint32_t s = 0; s < gpus; ++s) {
              if (s == local) continue;
              EXPECT_EQ(g.stage_slot(local, s), s > local ? s - local - 1 : s + gpus - local - 1) << what;
            }
          }
        }
      }
    }
  EXPECT_GT(checked, 100000u);
}

TEST(GemmRsPlan, TheReplayCatchesBrokenPlans) {
  struct Case {
    mk::RsPlanFault fault;
    mk::FusedLayout l;
    uint32_t m_local;
    const char* expect;
  };
  for (const Case& c : {Case{mk::RsPlanFault::kDropPush, {1, 2}, 256, "deadlock"},
                        Case{mk::RsPlanFault::kDropPush, {2, 2}, 200, "deadlock"},
                        Case{mk::RsPlanFault::kSendTwice, {2, 2}, 256, "times"},
                        Case{mk::RsPlanFault::kNoPeerFreeWait, {1, 3}, 256, "before it was read"},
                        Case{mk::RsPlanFault::kNoPeerFreeWait, {3, 1}, 100, "received node sum"}}) {
    bool caught = false;
    for (uint64_t seed = 1; seed <= 200 && !caught; ++seed) {
      mk::RsReplayOptions o;
      o.launches = 3;
      o.clusters = 2;
      o.n = 256;
      o.fault = c.fault;
      o.seed = seed;
      const mk::RsReplayReport r = mk::rs_replay(c.l, c.m_local, o);
      caught = r.error.find(c.expect) != std::string::npos;
    }
    EXPECT_TRUE(caught) << "fault " << static_cast<int>(c.fault) << " on " << layout_name(c.l);
  }
}

TEST(GemmRsPlan, GeometryErrorsNameTheField) {
  EXPECT_NE(mk::rs_check_geometry({{1, 2}, 0, 0, 256, 256}).find("m_local"), std::string::npos);
  EXPECT_NE(mk::rs_check_geometry({{1, 2}, 0, 64, 12, 256}).find("n: 12"), std::string::npos);
  EXPECT_NE(mk::rs_check_geometry({{1, 2}, 2, 64, 256, 256}).find("rank: 2"), std::string::npos);
  EXPECT_NE(mk::rs_check_geometry({{1, 2}, 0, 64, 256, 64}).find("block_n: 64"), std::string::npos);
  EXPECT_EQ(mk::rs_check_geometry({{1, 2}, 0, 64, 256, 128}), "");
}

}  // namespace
