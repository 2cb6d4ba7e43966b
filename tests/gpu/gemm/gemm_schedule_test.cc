// gemm_schedule_test.cc: the GEMM's work decomposition, replayed on the CPU (no GPU needed; runs
// in CI). For random shapes from the seeded family, the benchmark's list and random caller
// constraints (tile width, cluster, split-K, stream-K units, fewer blocks), the decision rule's
// schedule is walked exactly as the kernel's producer and consumers walk it
// (common/tile_scheduler.cuh), and checked:
//   - every k block of every tile is computed exactly once, by launched clusters only;
//   - the participants the fix-up expects for a tile are exactly the units that touched it;
//   - every split tile has its own counter and accumulator inside the workspace the plan sizes;
//   - a split last wave (whole tiles in full waves, then the last wave's tiles split) is one round of
//     at most one unit per cluster, every split tile cut the same number of ways;
//   - the arrival protocol (last participant takes the sum) sees every partial added, for
//     random arrival orders.
// With --model [SEED] [COUNT] it prints instead what the cost model predicts over COUNT shapes
// of the family (docs/kernels.md, "No cliffs"): the choices, and the predicted efficiency of
// the rule against the earlier fixed rule.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "common/tile_scheduler.cuh"
#include "gemm/gemm_random_family.h"
#include "gemm/sm90_bf16_gemm_schedule.h"

namespace mk = mkernel::kernels;

namespace {

int g_failures = 0;

void fail(const std::string& what) {
  if (++g_failures <= 20) std::printf("FAIL  %s\n", what.c_str());
}

std::string shape_str(const mk::GemmScheduleRequest& r, const mk::GemmSchedule& s) {
  return std::string(s.swap_ab ? "T " : "") + std::to_string(r.m) + "x" + std::to_string(r.n) + "x" + std::to_string(r.k) + " [m" + std::to_string(s.block_m) +
         " n" + std::to_string(s.block_n) +
         " c" + std::to_string(s.cluster_m) + (s.cluster_n == 2 ? "x2" : "") + (s.cluster_k > 1 ? " k" + std::to_string(s.cluster_k) : "") + " G" +
         std::to_string(s.num_clusters) + " " + s.describe() + "]";
}

template <int kClusterM, int kClusterN>
void replay(const mk::GemmScheduleRequest& r, const mk::GemmSchedule& s, std::mt19937_64& rng) {
  const std::string name = shape_str(r, s);
  constexpr int kPair = kClusterM * kClusterN;
  mk::TileScheduler<kClusterM, kClusterN> sched{s.m_blocks, s.n_blocks, std::max<uint32_t>(1, s.sk_per_tile), 0, 8, 0};
  sched.num_k_blocks = s.k_blocks;
  sched.dp_tiles = s.dp_tiles;
  sched.sk_units = s.sk_units;
  sched.sk_per_tile = s.sk_per_tile;
  const uint32_t T = sched.num_tiles(), KB = s.k_blocks;
  if (T != s.tiles) return fail(name + ": tile count differs between the rule and the scheduler");
  const int blocks = s.cluster_k == 2   ? r.blocks_cluster_k2
                     : s.cluster_k == 4 ? r.blocks_cluster_k4
                     : s.cluster_k == 8 ? r.blocks_cluster_k8
                     : kPair == 1       ? r.blocks_cluster1
                     : kPair == 4       ? r.blocks_cluster4
                                        : r.blocks_cluster2;
  if (s.num_clusters < 1 || s.num_clusters * kPair * s.cluster_k > blocks) return fail(name + ": more clusters than blocks");
  // The CTAs of every cluster tile cover each (m block, n block) exactly once; the others are a
  // cluster's padding (past the last block along the pair's direction only), in both rasters.
  for (uint32_t raster : {uint32_t{mk::kRasterAlongN}, uint32_t{mk::kRasterAlongM}}) {
    mk::TileScheduler<kClusterM, kClusterN> order = sched;
    order.raster = raster;
    order.group = 1 + static_cast<uint32_t>(rng() % 9);
    order.m_group_offset = static_cast<uint32_t>(rng() % order.num_m_groups());
    std::vector<uint8_t> seen(static_cast<size_t>(s.m_blocks) * s.n_blocks, 0);
    for (uint32_t t = 0; t < T; ++t) {
      for (uint32_t rank = 0; rank < static_cast<uint32_t>(kPair); ++rank) {
        const mk::TileCoord c = order.tile_coord(t, rank);
        const bool pad_m = c.m_block >= s.m_blocks, pad_n = c.n_block >= s.n_blocks;
        if ((pad_m && (kClusterM == 1 || c.m_block >= s.m_blocks + kClusterM - 1)) ||
            (pad_n && (kClusterN == 1 || c.n_block >= s.n_blocks + kClusterN - 1)))
          return fail(name + ": a cluster tile's CTA lies past the padding of its last group");
        if (pad_m || pad_n) continue;
        if (seen[static_cast<size_t>(c.m_block) * s.n_blocks + c.n_block]++ != 0)
          return fail(name + ": m block " + std::to_string(c.m_block) + ", n block " + std::to_string(c.n_block) + " in two cluster tiles");
      }
    }
    if (std::count(seen.begin(), seen.end(), 0) != 0) return fail(name + ": a tile no cluster computes");
  }
  if (s.dp_tiles > T) return fail(name + ": dp_tiles > tiles");
  if (s.sk_units > 0 && s.sk_units > sched.sk_iters()) return fail(name + ": empty units");
  if (s.sk_units == 0 && s.dp_tiles != T) return fail(name + ": tiles left without units");
  if (s.sk_per_tile != 0 && s.sk_per_tile > KB) return fail(name + ": bad split-K");
  // Split last wave (whole tiles, then the last tiles split): every split tile has sk_per_tile units.
  if (s.sk_per_tile != 0 && s.sk_units != s.sk_tiles() * s.sk_per_tile) return fail(name + ": split units do not cover the split tiles");

  // Every cluster's items, as the kernel walks them.
  std::vector<uint32_t> covered(static_cast<size_t>(T) * KB, 0);
  std::vector<std::vector<uint32_t>> touched(T);       // units per tile, in walk order
  std::vector<std::vector<mk::WorkItem>> by_tile(T);   // items per tile
  std::vector<uint32_t> unit_iters(s.sk_units, 0);
  for (uint32_t c = 0; c < static_cast<uint32_t>(s.num_clusters); ++c) {
    mk::WorkCursor cur = sched.begin(c);
    mk::WorkItem it;
    uint32_t guard = 0;
    while (sched.next(cur, s.num_clusters, it)) {
      if (++guard > 4 * (T + s.sk_units) + 8) return fail(name + ": cursor does not end");
      if (it.tile >= T || it.k_begin >= it.k_end || it.k_end > KB) return fail(name + ": item out of range");
      if (s.cluster_k > 1) {
        // In-cluster split-K: the cluster's CTAs split the item; their shares are contiguous,
        // balanced (+-1) and together cover it exactly once.
        uint32_t next = it.k_begin, lo = KB, hi = 0;
        for (uint32_t rank = 0; rank < static_cast<uint32_t>(s.cluster_k); ++rank) {
          mk::WorkItem share = it;
          mk::cluster_k_share(share, rank, static_cast<uint32_t>(s.cluster_k));
          if (share.k_begin != next || share.k_end < share.k_begin || share.k_end > it.k_end)
            return fail(name + ": in-cluster shares not contiguous");
          next = share.k_end;
          lo = std::min(lo, share.k_end - share.k_begin);
          hi = std::max(hi, share.k_end - share.k_begin);
          for (uint32_t kb = share.k_begin; kb < share.k_end; ++kb) ++covered[static_cast<size_t>(it.tile) * KB + kb];
        }
        if (next != it.k_end || hi - lo > 1) return fail(name + ": in-cluster shares do not cover the item evenly");
      } else {
        for (uint32_t kb = it.k_begin; kb < it.k_end; ++kb) ++covered[static_cast<size_t>(it.tile) * KB + kb];
      }
      if (it.unit != mk::WorkItem::kWholeTile) {
        if (it.unit >= s.sk_units || it.unit % s.num_clusters != c) return fail(name + ": unit on the wrong cluster");
        unit_iters[it.unit] += it.k_end - it.k_begin;
        touched[it.tile].push_back(it.unit);
      } else if (it.tile >= s.dp_tiles || it.k_begin != 0 || it.k_end != KB) {
        return fail(name + ": data-parallel item not a whole tile of the region");
      }
      by_tile[it.tile].push_back(it);
    }
  }
  for (size_t i = 0; i < covered.size(); ++i) {
    if (covered[i] != 1) {
      return fail(name + ": tile " + std::to_string(i / KB) + " k block " + std::to_string(i % KB) + " computed " +
                  std::to_string(covered[i]) + " times");
    }
  }
  // Balanced units (stream-K): iteration counts differ by at most one.
  if (s.sk_units > 0 && s.sk_per_tile == 0) {
    const auto [lo, hi] = std::minmax_element(unit_iters.begin(), unit_iters.end());
    if (*hi - *lo > 1) return fail(name + ": unbalanced stream-K units");
  }
  // Participants, counters and accumulators.
  std::vector<bool> index_used(s.sk_tiles(), false);
  for (uint32_t t = 0; t < T; ++t) {
    const uint32_t parts = sched.participants(t);
    if (t < s.dp_tiles) {
      if (parts != 1 || by_tile[t].size() != 1) return fail(name + ": data-parallel tile with participants");
      continue;
    }
    std::vector<uint32_t> units = touched[t];
    std::sort(units.begin(), units.end());
    if (units.size() != parts) return fail(name + ": tile " + std::to_string(t) + " participants " + std::to_string(parts) +
                                           ", units that touched it " + std::to_string(units.size()));
    const uint32_t first = sched.first_unit(t);
    for (uint32_t i = 0; i < parts; ++i) {
      if (units[i] != first + i) return fail(name + ": participants of tile " + std::to_string(t) + " not consecutive from first_unit");
    }
    const uint32_t idx = sched.counter(t);
    if (idx >= s.sk_tiles() || index_used[idx]) return fail(name + ": counter/accumulator index out of range or shared");
    index_used[idx] = true;
    if (parts == 1) continue;
    // The arrival protocol, in a random order: every participant adds its partial, then takes a
    // ticket; the last ticket must see all P partials added.
    std::vector<uint32_t> order = units;
    std::shuffle(order.begin(), order.end(), rng);
    uint32_t arrived = 0, added = 0;
    for (uint32_t v : order) {
      (void)v;
      ++added;
      if (arrived++ == parts - 1 && added != parts) return fail(name + ": last participant misses a partial");
    }
  }
  // Deterministic fix-up: every work item of the stream-K line has its own slot, unit + tile
  // (in the region), inside the workspace; each tile's slots are those of units first_unit ..
  // first_unit + participants - 1.
  const size_t slots = s.deterministic ? static_cast<size_t>(s.sk_units) + s.sk_tiles() : s.sk_tiles();
  if (s.deterministic) {
    std::vector<bool> slot_used(slots, false);
    for (uint32_t t = s.dp_tiles; t < T; ++t) {
      for (const mk::WorkItem& it : by_tile[t]) {
        const size_t slot = static_cast<size_t>(it.unit) + sched.counter(t);
        if (slot >= slots || slot_used[slot]) return fail(name + ": deterministic slot out of range or shared");
        slot_used[slot] = true;
      }
    }
  }
  const size_t ws = s.workspace_bytes();
  if (s.sk_units > 0) {
    const size_t need = s.counter_bytes() + slots * kPair * s.block_m * s.block_n * sizeof(float);
    if (ws < need) return fail(name + ": workspace too small");
    if (s.counter_bytes() < static_cast<size_t>(s.sk_tiles()) * kPair * sizeof(uint32_t))
      return fail(name + ": counters too small");
  } else if (ws != 0) {
    return fail(name + ": workspace for a data-parallel schedule");
  }
}

int g_split_last_waves = 0;  // rule-chosen schedules with whole tiles then split ones
int g_cluster_k = 0;         // schedules with split-K inside clusters (free choices of the rule)
int g_quads = 0;             // schedules in 2 x 2 clusters (asked for)

void check(const mk::GemmScheduleRequest& r_in, std::mt19937_64& rng) {
  const mk::GemmSchedule s = mk::choose_gemm_schedule(r_in);
  if (s.sk_per_tile != 0 && s.dp_tiles > 0) {
    // The rule's split last wave: full waves of whole tiles, then one round of split units (at most
    // one per cluster), each split tile cut exactly sk_per_tile ways.
    if (r_in.num_splits == 0 && r_in.dp_tiles < 0) {
      ++g_split_last_waves;
      if (s.dp_tiles % s.num_clusters != 0 || s.sk_units > static_cast<uint32_t>(s.num_clusters) || 2 * s.sk_tiles() > static_cast<uint32_t>(s.num_clusters))
        fail(shape_str(r_in, s) + ": a split last wave that is not full waves then at most half a wave split");
    }
  }
  // A swapped schedule describes the problem n x m x k: everything below is checked against
  // that request.
  if (r_in.swap_ab == 0 && s.swap_ab) fail(shape_str(r_in, s) + ": swapped although swap_ab = 0");
  // In-cluster split-K: only as built (swapped, 128-row tiles of a width up to 64, clusters of 1
  // along m, whole tiles, no workspace), never when switched off, and as asked where it can be.
  if (s.cluster_k != 1) {
    if (s.cluster_k != 2 && s.cluster_k != 4 && s.cluster_k != 8) fail(shape_str(r_in, s) + ": a cluster_k not built");
    if (!s.swap_ab || s.block_m != 128 || s.cluster_m != 1 || !mk::gemm_swap_cluster_k_width_built(s.block_n) ||
        s.sk_units != 0 || s.dp_tiles != s.tiles || s.workspace_bytes() != 0)
      fail(shape_str(r_in, s) + ": in-cluster split-K outside what is built");
    if (r_in.cluster_k == 1) fail(shape_str(r_in, s) + ": in-cluster split-K although cluster_k = 1");
    if (r_in.cluster_k > 1 && r_in.cluster_k != s.cluster_k) fail(shape_str(r_in, s) + ": cluster_k not honoured");
    if (r_in.cluster_k == 0) ++g_cluster_k;
  } else if (r_in.cluster_k > 1 && r_in.swap_ab != 0 && (r_in.block_n == 0 || mk::gemm_swap_cluster_k_width_built(r_in.block_n)) &&
             (r_in.block_m == 0 || r_in.block_m == 128) && r_in.cluster_m != 2 && r_in.num_splits <= 1 && r_in.stream_k != 1 &&
             r_in.sk_units == 0 && r_in.dp_tiles < 0 &&
             (r_in.cluster_k == 2 ? r_in.blocks_cluster_k2 : r_in.cluster_k == 4 ? r_in.blocks_cluster_k4 : r_in.blocks_cluster_k8) >=
                 r_in.cluster_k) {
    fail(shape_str(r_in, s) + ": cluster_k = " + std::to_string(r_in.cluster_k) + " possible but not taken");
  }
  if (r_in.swap_ab == 1 && !s.swap_ab) fail(shape_str(r_in, s) + ": not swapped although swap_ab = 1");
  mk::GemmScheduleRequest r = r_in;
  if (s.swap_ab) {
    std::swap(r.m, r.n);
    r.swapped = true;
    r.swap_ab = 0;
    r.regime_m = r_in.m;
    if (s.block_m != 128 && s.block_m != 64) fail(shape_str(r_in, s) + ": swapped operands with a tile height other than 64 or 128");
    if (s.block_m == 64 && !mk::gemm_swap64_width_built(s.block_n))
      fail(shape_str(r_in, s) + ": a width not built with 64-row tiles");
    if (!mk::gemm_swap_width_built(s.block_n)) fail(shape_str(r_in, s) + ": a swapped width no translation unit builds");
  } else if (!mk::gemm_block_width_built(s.block_n)) {
    fail(shape_str(r, s) + ": a width no translation unit builds");
  }
  if (r.block_n && s.block_n != r.block_n) fail(shape_str(r, s) + ": block_n not honoured");
  if (!r.block_n && r.widths_128_256 && s.block_n != 128 && s.block_n != 256)
    fail(shape_str(r, s) + ": widths_128_256 not honoured");
  if (r.cluster_m && s.cluster_m != r.cluster_m) fail(shape_str(r, s) + ": cluster_m not honoured");
  if (s.deterministic != r.deterministic) fail(shape_str(r, s) + ": deterministic not honoured");
  if (r.max_participants > 0 && s.max_participants() > static_cast<uint32_t>(r.max_participants))
    fail(shape_str(r, s) + ": a tile split among more units than max_participants");
  if (r.block_m && s.block_m != r.block_m) fail(shape_str(r, s) + ": block_m not honoured");
  if (s.block_m != 128 && s.block_m != 256 && !(s.swap_ab && s.block_m == 64) && !(!s.swap_ab && s.block_m == 192))
    fail(shape_str(r, s) + ": a tile height no translation unit builds");
  if (s.block_m == 192 && !mk::gemm_m192_width_built(s.block_n)) fail(shape_str(r, s) + ": a width not built 192 rows tall");
  if (!r.block_m && s.block_m == 192 && (!r.allow_m192 || r.widths_128_256 || r.m <= 128))
    fail(shape_str(r, s) + ": a 192-row tile where the request does not allow one");
  if (s.block_m == 256 && !mk::gemm_tall_width_built(s.block_n)) fail(shape_str(r, s) + ": a width not built 256 rows tall");
  if (!r.block_m && s.block_m == 256 && (!r.allow_tall || r.widths_128_256 || r.m <= 128))
    fail(shape_str(r, s) + ": a 256-row tile where the request does not allow one");
  if (s.m_blocks != static_cast<uint32_t>((r.m + s.block_m - 1) / s.block_m)) fail(shape_str(r, s) + ": m blocks of the wrong height");
  if (r.num_splits > 0 && r.stream_k != 1) {
    uint32_t want = std::min<uint32_t>(r.num_splits, s.k_blocks);
    if (r.max_participants > 0 && want > static_cast<uint32_t>(r.max_participants)) want = 1;  // whole tiles instead
    if (r.dp_tiles > 0 && static_cast<uint32_t>(r.dp_tiles) >= s.tiles) want = 1;  // no tile left to split
    if ((want <= 1 && s.sk_units != 0) || (want > 1 && s.sk_per_tile != want)) fail(shape_str(r, s) + ": num_splits not honoured");
  }
  if (r.stream_k == 0 && s.sk_units != 0 && s.sk_per_tile == 0) fail(shape_str(r, s) + ": stream-K although switched off");
  // Pairs along n: as built (128- or 192-row tiles, not with a pair along m or in-cluster split-K),
  // never when switched off, always when asked for.
  // 2 x 2 clusters: only when asked for (cluster_m = cluster_n = 2), at their widths.
  if (s.cluster_n == 2) {
    if (s.cluster_k != 1 || (s.block_m != 128 && s.block_m != 192))
      fail(shape_str(r, s) + ": a pair along n outside what is built");
    const bool weighed = r_in.allow_quads && r_in.cluster_m == 0 && r_in.cluster_n != 2;
    if (s.cluster_m == 2 && ((r_in.cluster_m != 2 && !weighed) || !mk::gemm_quad_width_built(s.block_n)))
      fail(shape_str(r, s) + ": a 2 x 2 cluster not asked for or allowed, or at a width not built");
    if (s.cluster_m == 2 && weighed && (s.m_blocks < 2 || s.n_blocks < 2))
      fail(shape_str(r, s) + ": a weighed 2 x 2 cluster with half of its CTAs padding");
    if (s.cluster_m != 2 && r_in.cluster_m == 2) fail(shape_str(r, s) + ": 2 x 2 clusters asked for but not taken");
    if (r_in.cluster_n == 1 && !(s.cluster_m == 2 && weighed)) fail(shape_str(r, s) + ": a pair along n although cluster_n = 1");
  } else if (s.cluster_n != 1) {
    fail(shape_str(r, s) + ": a cluster_n not built");
  } else if (r_in.cluster_n == 2 && r_in.cluster_k <= 1) {
    fail(shape_str(r, s) + ": cluster_n = 2 asked for but not taken");
  }
  if (s.cluster_n == 2 && s.cluster_m == 2) {
    ++g_quads;
    replay<2, 2>(r, s, rng);
  } else if (s.cluster_n == 2) {
    replay<1, 2>(r, s, rng);
  } else if (s.cluster_m == 2) {
    replay<2, 1>(r, s, rng);
  } else {
    replay<1, 1>(r, s, rng);
  }
  // Planning again with the resolved configuration (what a fused op does with a plan's config)
  // gives the same schedule, so the workspace sized by the first plan fits the second.
  mk::GemmScheduleRequest again;
  again.m = r_in.m;
  again.n = r_in.n;
  again.k = r_in.k;
  again.swap_ab = s.swap_ab ? 1 : 0;
  if (s.swap_ab) again.block_m = s.block_m;
  (s.pair_ctas() == 4 ? again.blocks_cluster4 : s.pair_ctas() == 2 ? again.blocks_cluster2 : again.blocks_cluster1) =
      s.num_clusters * s.pair_ctas();
  again.cluster_n = s.cluster_n;
  again.cluster_k = s.cluster_k;
  if (s.cluster_k > 1) {
    (s.cluster_k == 2 ? again.blocks_cluster_k2 : s.cluster_k == 4 ? again.blocks_cluster_k4 : again.blocks_cluster_k8) =
        s.num_clusters * s.cluster_k;
    again.blocks_cluster1 = r_in.blocks_cluster1;  // as the launcher passes them (unused)
  }
  again.block_n = s.block_n;
  if (!s.swap_ab) again.block_m = s.block_m;
  again.deterministic = s.deterministic;
  again.cluster_m = s.cluster_m;
  const bool sk = s.sk_units != 0 && s.sk_per_tile == 0;
  again.num_splits = s.sk_per_tile != 0 ? static_cast<int>(s.sk_per_tile) : 1;
  again.stream_k = sk ? 1 : 0;
  again.sk_units = sk ? static_cast<int>(s.sk_units) : 0;
  again.dp_tiles = (sk || (s.sk_per_tile != 0 && s.dp_tiles > 0)) ? static_cast<int>(s.dp_tiles) : -1;
  const mk::GemmSchedule s2 = mk::choose_gemm_schedule(again);
  if (s2.swap_ab != s.swap_ab || s2.block_n != s.block_n || s2.block_m != s.block_m || s2.deterministic != s.deterministic || s2.cluster_m != s.cluster_m || s2.num_clusters != s.num_clusters ||
      s2.cluster_k != s.cluster_k || s2.cluster_n != s.cluster_n ||
      s2.dp_tiles != s.dp_tiles || s2.sk_units != s.sk_units || s2.sk_per_tile != s.sk_per_tile ||
      s2.workspace_bytes() != s.workspace_bytes()) {
    fail(shape_str(r, s) + ": planning again with the resolved configuration gives " + shape_str(again, s2));
  }
}

// The rule before stream-K (commit 10b72b3), for the model comparison.
mk::GemmSchedule old_rule(int64_t m, int64_t n, int64_t k) {
  const int64_t mb = (m + 127) / 128, kb = (k + 63) / 64;
  mk::GemmSchedule s;
  s.block_n = (m <= 64 || mb > 2) ? 256 : 128;
  s.cluster_m = mb >= 4 ? 2 : 1;
  s.m_blocks = static_cast<uint32_t>(mb);
  s.n_blocks = static_cast<uint32_t>((n + s.block_n - 1) / s.block_n);
  s.k_blocks = static_cast<uint32_t>(kb);
  s.tiles = static_cast<uint32_t>((mb + s.cluster_m - 1) / s.cluster_m * s.n_blocks);
  const int64_t tiles = static_cast<int64_t>(s.tiles) * s.cluster_m;
  int64_t splits = 1;
  if (tiles * 2 <= 132) splits = std::min<int64_t>({132 / tiles, std::max<int64_t>(1, kb / 8), 16});
  splits = (kb + (kb + splits - 1) / splits - 1) / ((kb + splits - 1) / splits);
  const int64_t G = 132 / s.cluster_m;
  if (splits > 1) {
    s.sk_per_tile = static_cast<uint32_t>(splits);
    s.sk_units = s.tiles * static_cast<uint32_t>(splits);
    s.num_clusters = static_cast<int>(std::min<int64_t>(G, s.sk_units));
  } else {
    s.dp_tiles = s.tiles;
    s.num_clusters = static_cast<int>(std::min<int64_t>(G, s.tiles));
  }
  mk::schedule_detail::predict(mk::GemmCostModel{}, m, n, k, 132, &s);
  return s;
}

int model(uint64_t seed, int count) {
  const mk::GemmCostModel cm;
  // Ideal: the useful flops at the model's best per-SM rate on all 132 SMs, or the operands
  // once through DRAM at the best rate seen, plus the launch.
  const mk::GemmCostRegime& g = cm.general;
  const double flop_per_us = 2.0 * 128 * 256 * 64 / g.iter_us_n256_c2 * 132;
  std::map<std::string, int> choices;
  std::vector<double> eff_new, eff_old, gain, repro, two_parts;
  const auto shapes = gemm_test::random_family(seed, count);
  for (const auto& sh : shapes) {
    mk::GemmScheduleRequest r;
    r.m = sh.m;
    r.n = sh.n;
    r.k = sh.k;
    r.blocks_cluster1 = 132;
    r.blocks_cluster2 = 132;
    // As the library asks for a plain GEMM on a full H200.
    r.swap_ab = -1;
    r.allow_m192 = true;
    r.cluster_n = 1;  // pairs along n only when asked for
    r.blocks_cluster_k2 = r.blocks_cluster_k4 = 132;
    r.blocks_cluster_k8 = 128;
    const mk::GemmSchedule s = mk::choose_gemm_schedule(r, cm);
    const mk::GemmSchedule o = old_rule(sh.m, sh.n, sh.k);
    mk::GemmScheduleRequest det = r;  // GemmConfig::deterministic (off by default)
    det.deterministic = true;
    const mk::GemmSchedule sd = mk::choose_gemm_schedule(det, cm);
    mk::GemmScheduleRequest two = r;
    two.max_participants = 2;
    const mk::GemmSchedule t2 = mk::choose_gemm_schedule(two, cm);
    repro.push_back(s.predicted_us / sd.predicted_us);
    two_parts.push_back(s.predicted_us / t2.predicted_us);
    const double flops = 2.0 * sh.m * sh.n * sh.k;
    const double bytes = 2.0 * (double(sh.m) * sh.k + double(sh.n) * sh.k + double(sh.m) * sh.n);
    const mk::GemmCostRegime& re = sh.m <= 64 ? cm.small_m : cm.general;
    const double ideal = re.launch_us + std::max(flops / flop_per_us, bytes / cm.small_m.dram_bytes_per_us);
    eff_new.push_back(ideal / s.predicted_us);
    eff_old.push_back(ideal / o.predicted_us);
    gain.push_back(o.predicted_us / s.predicted_us);
    const std::string kind = s.sk_units == 0 ? "dp" : (s.sk_per_tile ? "splitk" : (s.dp_tiles ? "dp+sk" : "sk"));
    ++choices[(s.swap_ab ? "T " : "") + std::string(s.block_m == 256 ? "m256 n" : s.block_m == 192 ? "m192 n" : "n") + std::to_string(s.block_n) + " c" + std::to_string(s.cluster_m) + (s.cluster_n == 2 ? "x2" : "") + " " + kind];
  }
  auto summary = [](const char* what, std::vector<double> v) {
    std::sort(v.begin(), v.end());
    double lg = 0;
    for (double x : v) lg += std::log(x);
    std::printf("  %-34s geomean %.3f  min %.3f  p5 %.3f  p50 %.3f\n", what, std::exp(lg / static_cast<double>(v.size())), v.front(),
                v[v.size() / 20], v[v.size() / 2]);
  };
  std::printf("cost model over %d shapes of the random family (seed %llu):\n", count, static_cast<unsigned long long>(seed));
  summary("predicted efficiency, rule", eff_new);
  summary("predicted efficiency, old rule", eff_old);
  summary("predicted speed-up over old rule", gain);
  summary("speed, deterministic / atomic fix-up", repro);
  summary("speed, <= 2 parts a tile / any", two_parts);
  std::printf("  choices:\n");
  for (const auto& [k, v] : choices) std::printf("    %-20s %6d (%.1f%%)\n", k.c_str(), v, 100.0 * v / count);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--model") {
    const uint64_t seed = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 20261201;
    const int count = argc > 3 ? std::atoi(argv[3]) : 10000;
    return model(seed, count);
  }
  std::mt19937_64 rng(12345);
  int cases = 0;
  // The benchmark's fixed list and edge shapes, with the device's full block counts.
  const int fixed[][3] = {{8192, 8192, 8192},  {8192, 14336, 4096}, {8192, 4096, 14336}, {4096, 28672, 8192},
                          {16384, 8192, 8192}, {16384, 14336, 2048}, {1, 8192, 8192},    {16, 8192, 8192},
                          {128, 8192, 8192},   {1000, 8192, 8192},  {8, 8, 8},           {1, 8, 8},
                          {137, 9440, 9016},   {22677, 280, 10664}, {604, 336, 8272},    {3, 960, 7920},
                          {1100, 1280, 1096},  {333, 1000, 520},    {2056, 1968, 8528},  {1, 256, 64}};
  for (const auto& f : fixed) {
    for (int b1 : {132, 116, 2}) {
      mk::GemmScheduleRequest r;
      r.m = f[0];
      r.n = f[1];
      r.k = f[2];
      r.blocks_cluster1 = b1;
      r.blocks_cluster2 = b1 - b1 % 2;
      r.allow_tall = b1 != 116;
      r.deterministic = b1 == 132;
      check(r, rng);
      ++cases;
    }
  }
  // Clusters of 2 below a full GPU: a partial wave of 128-wide tiles goes to clusters of 1 (the
  // multicast pays only with every SM busy, docs/kernels.md section 7); the same shape with the
  // other SMs running role blocks keeps clusters of 2.
  {
    mk::GemmScheduleRequest r;
    r.m = 845;
    r.n = 1024;
    r.k = 2640;  // deep enough that the k blocks, not the clusters' launch cost, decide
    r.blocks_cluster1 = 132;
    r.blocks_cluster2 = 132;
    r.block_n = 128;
    r.num_splits = 1;
    const mk::GemmSchedule idle = mk::choose_gemm_schedule(r);
    if (idle.cluster_m != 1) fail(shape_str(r, idle) + ": a partial wave should take clusters of 1");
    r.role_sms = 68;  // 64 GEMM blocks: 32 clusters of 2 for 32 cluster tiles, one wave either way
    r.blocks_cluster1 = r.blocks_cluster2 = 64;
    const mk::GemmSchedule busy = mk::choose_gemm_schedule(r);
    if (busy.cluster_m != 2) fail(shape_str(r, busy) + ": with the other SMs busy clusters of 2 should stay");
    cases += 2;
  }
  // Swapped operands where they pay: the rule takes them for small m streaming a large weight
  // and for m just above a multiple of 128, keeps the operands as given on large squares, and
  // a swapped width covers m with at most 15 rows to spare when it fits one tile.
  {
    struct Want {
      int m, n, k;
      bool swap;
    } wants[] = {{1, 21720, 2688, true},     {16, 8192, 8192, true},   {8, 6512, 1744, true},
                 {130, 8920, 1432, true},    {158, 6160, 3920, true},  {8192, 8192, 8192, false},
                 {4096, 28672, 8192, false}, {16384, 8192, 8192, false}};
    for (const auto& w : wants) {
      mk::GemmScheduleRequest r;
      r.m = w.m;
      r.n = w.n;
      r.k = w.k;
      r.blocks_cluster1 = 132;
      r.blocks_cluster2 = 132;
      r.swap_ab = -1;
      const mk::GemmSchedule s = mk::choose_gemm_schedule(r);
      if (s.swap_ab != w.swap) fail(shape_str(r, s) + (w.swap ? ": expected swapped operands" : ": expected the operands as given"));
      if (s.swap_ab && w.m <= 112 && s.n_blocks == 1 && (s.block_n < w.m || s.block_n - w.m > 15))
        fail(shape_str(r, s) + ": a swapped width that does not fit m");
      check(r, rng);
      cases += 1;
    }
  }
  // Random shapes of the family and random constraints.
  gemm_test::RandomFamily fam(20261201);
  std::uniform_int_distribution<int> pick(0, 99);
  for (int i = 0; i < 3000; ++i) {
    const auto sh = fam.next();
    mk::GemmScheduleRequest r;
    r.m = sh.m;
    r.n = sh.n;
    r.k = sh.k;
    if (i % 5 == 1) r.k = 8 * (1 + pick(rng));  // shallow k: fewer k blocks than units
    const int blocks[] = {132, 132, 132, 128, 116, 64, 7, 2, 1};
    r.blocks_cluster1 = blocks[pick(rng) % 9];
    r.blocks_cluster2 = r.blocks_cluster1 - r.blocks_cluster1 % 2;
    // Clusters of 4 and 8 as a GPU may offer them (whole clusters; 8-CTA clusters may leave SMs).
    r.blocks_cluster_k2 = r.blocks_cluster2;
    r.blocks_cluster_k4 = r.blocks_cluster1 - r.blocks_cluster1 % 4;
    r.blocks_cluster_k8 = pick(rng) < 50 ? r.blocks_cluster1 - r.blocks_cluster1 % 8 : std::min(r.blocks_cluster1, 128) / 8 * 8;
    if (pick(rng) < 20) r.block_n = mk::kGemmBlockWidths[pick(rng) % std::size(mk::kGemmBlockWidths)];
    if (pick(rng) < 10) r.widths_128_256 = true;
    if (pick(rng) < 60) r.allow_tall = true;
    if (pick(rng) < 50) r.deterministic = true;
    if (pick(rng) < 10) r.max_participants = 1 + pick(rng) % 3;
    if (pick(rng) < 10 && (!r.block_n || mk::gemm_tall_width_built(r.block_n))) {
      const int heights[] = {128, 256, 192};
      r.block_m = heights[pick(rng) % 3];  // the tall widths are also the 192-row ones
    }
    if (pick(rng) < 30) r.allow_m192 = true;
    if (pick(rng) < 20 && r.blocks_cluster2 >= 2) r.cluster_m = pick(rng) < 50 ? 1 : 2;
    const int mode = pick(rng);
    if (mode < 15) r.num_splits = 1 + pick(rng) % 8;
    else if (mode < 25) r.stream_k = 0;
    else if (mode < 35) r.stream_k = 1;
    if (pick(rng) < 15) r.sk_units = 1 + pick(rng);
    if (pick(rng) < 5) r.dp_tiles = pick(rng) * 3;
    // Swapped operands as the launcher allows them: 128-row tiles, not with widths_128_256; a
    // fixed width of the operands as given is also a swapped width.
    if (r.block_m != 256 && r.block_m != 192 && !r.widths_128_256 && pick(rng) < 50) r.swap_ab = pick(rng) < 80 ? -1 : 1;
    if (r.swap_ab == 1 && pick(rng) < 30) {  // 64-row swapped tiles (opt-in): their widths only
      r.block_m = 64;
      if (r.block_n != 0) r.block_n = mk::kGemmSwap64Widths[pick(rng) % std::size(mk::kGemmSwap64Widths)];
    }
    if (pick(rng) < 15) {  // in-cluster split-K switched off or asked for
      const int ck[] = {1, 2, 4, 8};
      r.cluster_k = ck[pick(rng) % 4];
      if (r.cluster_k > 1 && pick(rng) < 50) {  // mostly a request the launcher accepts
        if (r.swap_ab == 0) r.swap_ab = -1;
        if (r.block_m != 0 && r.block_m != 128) r.block_m = 0;
        if (r.block_n != 0) r.block_n = mk::kGemmSwapClusterKWidths[pick(rng) % std::size(mk::kGemmSwapClusterKWidths)];
        r.widths_128_256 = false;
        if (r.cluster_m == 2) r.cluster_m = 0;
        r.num_splits = 0;
        r.stream_k = -1;
        r.sk_units = 0;
        r.dp_tiles = -1;
      }
    }
    // Pairs along n: weighed (as the launcher asks for plain GEMMs), switched off or asked for
    // (where the launcher accepts it: no pair along m, no in-cluster split-K, 128- or 192-row
    // tiles).
    const int pn = pick(rng);
    if (pn < 40) {
      r.cluster_n = 0;
    } else if (pn < 55 && r.cluster_m != 2 && r.cluster_k <= 1 && r.block_m != 64 && r.block_m != 256 && r.blocks_cluster2 >= 2) {
      r.cluster_n = 2;
      if (r.swap_ab == 1 && r.block_n != 0 && !mk::gemm_swap_width_built(r.block_n)) r.block_n = 0;
    }
    if (i % 7 == 3) r.m = 1 + pick(rng) % 64;  // small m, where in-cluster split-K is a candidate
    // 2 x 2 clusters asked for, where the launcher accepts them (as pairs along n, at their
    // widths; a GPU offers whole clusters of 4).
    if (r.cluster_n == 2 && pick(rng) < 40) {
      r.cluster_m = 2;
      r.blocks_cluster4 = r.blocks_cluster1 - r.blocks_cluster1 % 4;
      if (r.block_n != 0) r.block_n = mk::kGemmQuadWidths[pick(rng) % std::size(mk::kGemmQuadWidths)];
      if (r.blocks_cluster4 < 4) r.blocks_cluster4 = 4;
    } else if (pick(rng) < 50) {  // weighed, as the library asks for plain GEMMs
      r.allow_quads = true;
      r.blocks_cluster4 = std::min(r.blocks_cluster1, 120) / 4 * 4;  // the H200 fits 30 clusters of 4
    }
    check(r, rng);
    ++cases;
  }
  // Whole tiles, then the last tiles split, named explicitly (num_splits with dp_tiles): the
  // schedule the plan's resolved configuration of a split last wave gives.
  for (int dp : {66, 132, 198}) {
    mk::GemmScheduleRequest r;
    r.m = 3389;
    r.n = 4208;
    r.k = 4200;
    r.blocks_cluster1 = r.blocks_cluster2 = 132;
    r.cluster_m = 2;
    r.block_n = 224;
    r.num_splits = 3;
    r.dp_tiles = dp;
    const mk::GemmSchedule s = mk::choose_gemm_schedule(r);
    if (s.dp_tiles != static_cast<uint32_t>(dp) || s.sk_per_tile != 3 || s.sk_units != (s.tiles - dp) * 3)
      fail(shape_str(r, s) + ": num_splits with dp_tiles not honoured");
    check(r, rng);
    ++cases;
  }
  // In-cluster split-K at widths above 64 (the owners receive the whole fp32 tile): the rule takes
  // them somewhere in the family, and a model limited to 64 columns (GemmCostModel::
  // clusterk_max_width, the bench's "k64w") never does.
  {
    gemm_test::RandomFamily wide_fam(20261203);
    int wide = 0, narrow_wide = 0;
    mk::GemmCostModel narrow;
    narrow.clusterk_max_width = 64;
    for (int i = 0; i < 2000; ++i) {
      const auto sh = wide_fam.next();
      mk::GemmScheduleRequest r;
      r.m = sh.m;
      r.n = sh.n;
      r.k = sh.k;
      r.blocks_cluster1 = r.blocks_cluster2 = r.blocks_cluster_k2 = r.blocks_cluster_k4 = 132;
      r.blocks_cluster_k8 = 128;
      r.swap_ab = -1;
      const mk::GemmSchedule s = mk::choose_gemm_schedule(r);
      if (s.cluster_k > 1 && s.block_n > 64) ++wide;
      const mk::GemmSchedule t = mk::choose_gemm_schedule(r, narrow);
      if (t.cluster_k > 1 && t.block_n > 64) ++narrow_wide;
      check(r, rng);
      ++cases;
    }
    if (wide == 0) fail("the rule chose no in-cluster split-K wider than 64 columns over the random family");
    if (narrow_wide != 0) fail("clusterk_max_width = 64 not honoured on " + std::to_string(narrow_wide) + " shapes");
    std::printf("in-cluster split-K wider than 64 columns chosen: %d of 2000\n", wide);
  }
  // The rule takes split last waves somewhere in the family (a last wave at most half full).
  if (g_split_last_waves == 0) fail("the rule chose no split last wave over the random family");
  std::printf("split last waves chosen: %d\n", g_split_last_waves);
  std::printf("2 x 2 clusters replayed: %d\n", g_quads);
  if (g_quads < 50) fail("fewer than 50 schedules in 2 x 2 clusters replayed: " + std::to_string(g_quads));
  std::printf("in-cluster split-K chosen: %d\n", g_cluster_k);
  if (g_failures) {
    std::printf("gemm_schedule_test: %d of %d cases FAILED\n", g_failures, cases);
    return 1;
  }
  std::printf("gemm_schedule_test: %d cases passed\n", cases);
  return 0;
}
