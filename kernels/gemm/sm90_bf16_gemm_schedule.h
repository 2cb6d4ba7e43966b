// sm90_bf16_gemm_schedule.h: how the persistent GEMM cuts a problem into work (tile width,
// cluster size, data-parallel tiles, stream-K or split-K units), chosen by a small cost model.
// Plain C++ (no CUDA): the host launcher uses it, and so do the CPU schedule test and the
// model's evaluation over random shapes (gemm_schedule_test --model).
//
// The rule (docs/kernels.md, "No cliffs"): for every candidate the model predicts the time of
// the busiest cluster and the time to move the operands through DRAM once; the candidate with
// the lowest prediction wins. Candidates:
//   tile width    one of kGemmBlockWidths (128 to 256 columns, BLOCK_M is 128): a narrower
//                 tile wastes less of a last column of tiles (n = 280: two 144-wide tiles
//                 instead of three 128-wide or two 256-wide ones), a wider one loads less
//                 per flop;
//   tile height   128 rows; 256 (kGemmTallWidths) only when the caller asks for it, or with
//                 GemmScheduleRequest::allow_tall (measured: not a win the model can predict,
//                 docs/kernels.md section 7, so the library leaves it off);
//   cluster       1, or 2 CTAs sharing the weight tile (an odd number of m blocks then pads a
//                 tile of zeros, which the model counts; the shared loads pay only with every SM
//                 busy, GemmCostModel::cluster_partial_penalty);
//   operands      as given, or swapped (plain GEMMs only: the kernel computes D^T = W A^T and
//                 stores it transposed), so that the caller's m is the tile's width: any
//                 multiple of 16 (kGemmSwapWidths) instead of whole 128-row blocks. Small m then
//                 streams the weight with a stage of 128 weight rows and a few activation rows
//                 (twice the stages of the 128 x 128 tile); m just above a multiple of 128
//                 wastes 16 rows at most instead of up to 127. The swapped problem (n x m x k)
//                 goes through the same rule, with the costs of the caller's m;
//   decomposition data-parallel (whole tiles in waves); uniform split-K (s units per tile) when
//                 the tiles fill at most half the clusters; data-parallel waves followed by
//                 the last wave's tiles split the same way when they fill at most half the
//                 clusters ("split last wave"); or data-parallel waves followed by
//                 a stream-K region of the last one or two waves' tiles whose k iterations are
//                 spread evenly over U units (U <= the clusters; fewer when there is little
//                 work, since each split tile costs a fix-up through the workspace). Stream-K
//                 is a candidate only with enough k blocks per tile and, for m > 64, a last
//                 wave less than half full (GemmCostModel, measured guards).
// An explicit num_splits in the configuration gives uniform split-K instead (1 = none); an
// explicit block_n / cluster_m / stream_k / sk_units narrows the candidates.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <string>
#include <utility>

#include "common/tile_scheduler.cuh"

namespace mkernel::kernels {

// The tile widths the library builds (one translation unit each, kernels/CMakeLists.txt), in the
// order the rule prefers them on a tie: the two measured most, then the rest, widest first. Any
// multiple of 16 from 64 to 256 compiles (a width that is not a multiple of 64 stores its last
// columns through shared memory with masked stores instead of TMA).
inline constexpr int kGemmBlockWidths[] = {256, 128, 224, 208, 192, 176, 160, 144};

inline constexpr bool gemm_block_width_built(int block_n) {
  for (int w : kGemmBlockWidths)
    if (w == block_n) return true;
  return false;
}

// The widths built with swapped operands (GemmConfig::swap_ab): every multiple of 16 up to 112
// (the caller's m for small m), then those of kGemmBlockWidths. The narrow ones hold many
// stages (10 at 16 columns: 128 x 64 weight rows and 16 x 64 activation rows a stage).
inline constexpr int kGemmSwapWidths[] = {256, 128, 224, 208, 192, 176, 160, 144, 112, 96, 80, 64, 48, 32, 16};

inline constexpr bool gemm_swap_width_built(int block_n) {
  for (int w : kGemmSwapWidths)
    if (w == block_n) return true;
  return false;
}

// Swapped operands with 64-row tiles (small m; GemmConfig::block_m = 64, never chosen by the
// rule): both consumers share the 64 weight rows, each takes half of the width, so a weight of
// n rows fills n / 64 tiles (the whole k each, where 128-row tiles would need split-K to fill
// the SMs) and up to 16 stages fit. Measured slower than the 128-row swapped tiles (0.80 against
// 0.94 of the faster library on the m <= 64 shapes of seed 31337).
// Widths built with 2 x 2 clusters (GemmConfig::cluster_m = cluster_n = 2; 128-row tiles with
// the operands as given or swapped, and 192-row tiles): opt-in, never chosen by the rule.
inline constexpr int kGemmQuadWidths[] = {256, 192, 128};

inline constexpr bool gemm_quad_width_built(int block_n) {
  for (int w : kGemmQuadWidths)
    if (w == block_n) return true;
  return false;
}

inline constexpr int kGemmSwap64Widths[] = {64, 48, 32, 16};

inline constexpr bool gemm_swap64_width_built(int block_n) {
  for (int w : kGemmSwap64Widths)
    if (w == block_n) return true;
  return false;
}

// Swapped operands with split-K inside a cluster (GemmConfig::cluster_k = 2, 4 or 8): the CTAs of
// a cluster share every tile, each taking a contiguous share of its k blocks, and sum their fp32
// partials through distributed shared memory, in rank order (bitwise reproducible, no workspace).
// For problems whose tiles fill a fraction of the SMs (small m and a weight of few 128-row
// blocks): more CTAs stream the weight, each a shorter k loop, without split-K's round trip
// through global memory. Widths up to 128: the owners receive a whole 128 x BLOCK_N fp32 tile
// in the epilogue's space (32 KB up to 64 columns; 40-64 KB above, at the cost of one or two
// pipeline stages). 128 x 128 tiles give m of 65-256 the bytes per flop of the library's
// square tile with the k loop shared by 2, 4 or 8 SMs.
inline constexpr int kGemmSwapClusterKWidths[] = {128, 112, 96, 80, 64, 48, 32, 16};
inline constexpr int kGemmClusterKSizes[] = {2, 4, 8};

inline constexpr bool gemm_swap_cluster_k_width_built(int block_n) {
  for (int w : kGemmSwapClusterKWidths)
    if (w == block_n) return true;
  return false;
}

// The widths built with 256-row tiles (store epilogue, no hooks): at most 192 columns, since a
// consumer then holds two 64 x BLOCK_N fp32 accumulators in registers.
inline constexpr int kGemmTallWidths[] = {192, 176, 160, 144, 128};

inline constexpr bool gemm_tall_width_built(int block_n) {
  for (int w : kGemmTallWidths)
    if (w == block_n) return true;
  return false;
}

// The widths built with 192-row tiles (three consumer warpgroups, plain GEMMs): at most 192
// columns, since the 512 threads of such a block compile with 128 registers each (an m64n192
// accumulator is 96 of them).
inline constexpr int kGemmM192Widths[] = {192, 176, 160, 144, 128};

inline constexpr bool gemm_m192_width_built(int block_n) {
  for (int w : kGemmM192Widths)
    if (w == block_n) return true;
  return false;
}

// Costs of the model, in microseconds and bytes per microsecond, one set for m <= 64 (the weight
// stream; one consumer warpgroup holds every row and the other issues no MMA) and one for larger
// m. Only their ratios matter for the choice; the absolute prediction is for reports.
//  * small_m: fitted to two H200 runs of this kernel (docs/kernels.md, "No cliffs": 320 random
//    shapes and the benchmark's list, six configurations each); a refit to the later records
//    did not choose better (regret 1.0116 -> 1.0112), so it was kept.
//  * general: fitted by bench/gemm/fit_cost_model.py to the records of commits 7411310 to
//    66af5f8 in bench/results/gemm.jsonl (5,821 timings of m > 64 in 1,249 groups, a group
//    being the configurations of one shape timed in the same rounds), minimising the error of
//    the predictions relative to each other within a group plus the cost of the choice.
//    Against the previous costs, with one random-family seed held out of the fit: the time of
//    the configuration the model ranks first over the fastest measured one 1.0249 -> 1.0171
//    (seed 31337) and 1.0281 -> 1.0105 (seed 60606); picks more than 5% slower than the fastest
//    17% -> 13% and 22% -> 8% of the shapes. Mostly through sk_iter_factor: the stream-K
//    regions over one or two waves of tiles ran 1.1-1.35x slower than predicted before.
//  * cluster2_launch_us (both regimes, 1.0): on problems the library finishes in under 15 us
//    the regret over the records fell 1.0094 -> 1.0080 with it (fits gave 0.4-1.7).
struct GemmCostRegime {
  double launch_us;  // launch, prologue, first loads, last store, as event-timed
  // One 64-deep k block of one CTA when every SM is busy, per tile width and cluster size. For
  // larger m the rates follow the bytes each CTA pulls from L2 per flop (A tile + its share of
  // the weight tile) more than the tensor cores: 128-wide tiles and clusters of one cost more.
  double iter_us_n256_c2, iter_us_n256_c1, iter_us_n128_c2, iter_us_n128_c1;
  // Fewer busy SMs run faster each (shared L2 and DRAM bandwidth, power): a k block costs
  // (1 - concurrency * (1 - busy SMs / all SMs)) of the above.
  double concurrency;
  double tile_us_n256, tile_us_n128;  // epilogue and pipeline refill per finished tile
  // Widths between 128 and 256 (not fitted): the k block's and the tile's costs interpolated
  // linearly in the width (the k block's cost follows the bytes a CTA pulls per k block, which
  // grow linearly with the width), plus, for a width that is not a multiple of 64, the masked
  // store of its last columns per finished tile (from the first run with these widths: 0.5-1.2
  // us more per tile than interpolated on shapes of 5 to 12 k blocks).
  // Fix-up of a split tile: every participant adds its fp32 partial into the tile's
  // accumulator (reductions in L2) and takes a ticket; the last also reads the sum and zeroes it.
  double fixup_latency_us;      // the round trips through memory around the ticket
  double sum_latency_us;        // the last participant's read of the sum
  double partial_bytes_per_us;  // one CTA adding, reading or zeroing a partial tile
  double dram_bytes_per_us;     // operands streamed once, as this kernel achieves it
  double cta_bytes_per_us;      // what one CTA alone can stream
  // A k block inside a stream-K unit costs this times a whole tile's: the units' tiles lie
  // further apart in the raster than a wave of whole tiles (less sharing in L2), and their
  // partials' reductions compete with the loads.
  double sk_iter_factor = 1.0;
  // Each work item of a stream-K or split-K unit after the unit's first: the pipeline restarts
  // on another tile.
  double sk_item_us = 0.0;
  // A launch in clusters of 2 costs this much more than one in clusters of 1 (cluster
  // scheduling, the cluster barriers at the start and the end).
  double cluster2_launch_us = 0.0;
  // In-cluster split-K (GemmSchedule::cluster_k > 1): the launch's extra cost (cluster
  // scheduling and barriers), and per finished tile the reduce-scatter (the partials sent to
  // their owners, the owners' sums and stores) on top of the tile's epilogue. Fitted to the
  // records of 5d2d2f5 (225 groups of one shape timed without and with clusters of 2, 4 and 8;
  // docs/kernels.md section 7, "Split-K inside clusters"): the launch costs nothing measurable,
  // a tile 1.2 us (m <= 64) and 1.6 us (larger m). Above 64 columns the partial's bytes grow with
  // the width: a tile's reduction costs clusterk_reduce_us x (1 + clusterk_wide x (width - 64) /
  // 64).
  double clusterk_launch_us = 0.0;
  double clusterk_reduce_us = 1.2;
  double clusterk_wide = 1.0;
};

struct GemmCostModel {
  // See GemmCostRegime: the masked columns of a tile (0.6 before the refit, which found no
  // measurable cost).
  double masked_tail_tile_us = 0.0;
  // A 256-row tile's k block and finished tile cost the 128 x 256 tile's per flop (same cluster
  // size) times this factor: the best single factor over 71 shapes timed both ways (rms error
  // of the predicted tall / 128-row time ratio 13%, docs/kernels.md section 7). It only chooses
  // the width and decomposition when a caller asks for 256 rows: the model cannot tell where the
  // tall tile wins, so allow_tall is not set by the library (sm90_bf16_gemm.cu).
  double tall_cost_factor = 1.10;
  // Deterministic fix-up: the last participant reads each other part's slot in turn, a round
  // trip per part on top of the bytes (measured at f425f6c's successor: 0.3-0.7 us a part for
  // m <= 64, where the partials are a few rows; about nothing beyond the bytes for larger m).
  double det_part_us_small_m = 0.5;
  double det_part_us = 0.1;
  // Clusters of 2 with part of the GPU busy: the weight multicast halves the bytes each CTA pulls
  // from L2, which pays only while those bytes are the limit, i.e. with every SM busy. Measured
  // over 753 random-family shapes timed in both cluster sizes (same width, whole tiles): at 95%
  // of the SMs busy or more clusters of 2 were 5-12% faster, below it clusters of 1 were faster,
  // by 12% with 128-wide tiles at half the SMs or fewer, 5-9% at 144-192 columns, about even at
  // 208-256 (docs/kernels.md section 7). So below `cluster_full_busy` of the SMs a k block in a
  // cluster of 2 costs the clusters-of-1 one times 1 + cluster_partial_penalty x (256 - width) /
  // 128, reaching the fitted clusters-of-2 cost linearly between cluster_fade_busy and
  // cluster_full_busy. (Refitted with the clusters-of-1 k blocks after the operand loads went to
  // 128-byte L2 promotion, it went to 0 and the clusters-of-1 costs down 6-8%, which chose worse
  // on 8192^3 and 8192x14336x4096 and no better over 358 groups: kept; docs/kernels.md section 7,
  // "The load path".)
  double cluster_partial_penalty = 0.15;
  double cluster_fade_busy = 0.90;
  double cluster_full_busy = 1.00;
  GemmCostRegime small_m{6.6, 1.11, 1.11, 0.75, 0.75, 0.67, 0.86, 0.0, 2.3, 0.05, 76e3, 3.94e6, 75e3,
                         1.0, 0.0, 1.0, 0.0, 1.2};
  GemmCostRegime general{5.17, 0.80, 1.006, 0.538, 0.637, 0.478, 1.13, 0.266, 0.385, 0.16, 28.7e3, 3.26e6, 94e3,
                         1.324, 0.24, 1.0, 0.0, 1.6};
  // Where stream-K is considered at all when the caller leaves it open (measured, not modelled:
  // with a last wave at least half full, or few k blocks per tile, the stream-K region ran
  // slower than whole tiles although the model called it even; docs/kernels.md).
  int min_k_blocks_stream_k_small_m = 96;
  int min_k_blocks_stream_k = 32;
  // Swapped operands are chosen when predicted faster than this fraction of the operands as
  // given (the model's costs are fitted on the latter).
  double swap_margin = 0.97;
  // For m <= 64 the swapped operands win unless predicted this much slower: over the m <= 64
  // shapes of seed 31337 and the decode list (2026-12-02, one H200) they ran 1.00-1.33x as fast
  // as the operands as given (1x21720x2688: 1.32x where the model called them 1% slower), and
  // lost by 4-5% on three shapes with n <= 1176.
  double swap_margin_small_m = 1.05;
  // 64-row swapped tiles (only when asked for): a k block costs half of the 128-row one times
  // this (not fitted: the fixed costs of a k block, its barriers and wgmma issue, do not halve).
  double half_rows_cost_factor = 1.2;
  // A narrow (swapped, < 128 columns) tile's k block costs at least this fraction of the
  // 128-wide clusters-of-1 one: it still pulls the 128-row weight tile.
  double narrow_iter_floor = 0.5;
  // A 192-row tile's k block costs 1.5 times the 128-row tile's of the same width and cluster
  // size times m192_cost_factor (fewer bytes per flop pulled into the SM), in a cluster of 2 times
  // m192_c2_factor more, its finished tile the 128-row tile's times m192_tile_factor. Fitted to
  // 5b97000's records (672 shapes, m > 128, each timed with the rule and held to 192-row tiles
  // in either cluster size; docs/kernels.md section 7, "192-row tiles"); fitted on either half
  // of the shapes, the other half's picks ran 1.004x and 1.006x the rule without them.
  double m192_cost_factor = 0.8785;
  double m192_tile_factor = 1.402;
  double m192_c2_factor = 1.108;
  // A pair along n's k block against the pair along m's of the same tile, beyond the ratio of
  // their bytes (GemmSchedule::cluster_n). Over eceb054's records (176 groups) 1.0 scored the
  // lowest regret (1.0164; 1.0200 without pairs along n), but on two seeds timed after it was set
  // (353d783, 128 groups) 1.0109 against 1.0081 without them: only weighed when asked for
  // (GemmScheduleRequest::cluster_n = 0).
  double pair_n_factor = 1.0;
  // A 2 x 2 cluster's k block (each CTA pulls half of its A tile and half of its weight tile):
  // half of the clusters-of-1 cost of its tile times quad_factor; and the launch's extra cost
  // (GemmSchedule::cluster_m = cluster_n = 2). Unlike clusters of 2 no penalty below a full GPU:
  // 764x2296x4120 in 108 CTAs ran 1.38x as fast in 2 x 2 clusters as in clusters of 1. 1.8 gave
  // the lowest regret over 147 groups of 2 x 2 clusters timed beside the rule (1.0117 against
  // 1.0141 without them; other forms of the cost did no better), too little to weigh them by
  // default: they are asked for (GemmConfig::quads; docs/kernels.md section 7, "2 x 2 clusters").
  double quad_factor = 1.8;
  double quad_launch_us = 0.0;
  // The widest tile in-cluster split-K candidates may have (a width of kGemmSwapClusterKWidths;
  // 64 gives the rule before the widths 80-128 were built, for side-by-side benchmarks).
  int clusterk_max_width = 128;
};

// What the caller fixed (0 / -1: free) and what the device offers.
struct GemmScheduleRequest {
  int64_t m = 0, n = 0, k = 0;
  int blocks_cluster1 = 0;  // GEMM blocks that can run at once with clusters of 1 (0: not allowed)
  int blocks_cluster2 = 0;  // ... of 2 (a multiple of 2; 0: not allowed)
  int blocks_cluster4 = 0;  // ... of 2 x 2 (a multiple of 4; 0: not allowed)
  // ... with split-K inside clusters of 2, 4 and 8 CTAs (swapped operands; 0: not allowed)
  int blocks_cluster_k2 = 0, blocks_cluster_k4 = 0, blocks_cluster_k8 = 0;
  // Split-K inside a cluster (kGemmClusterKSizes): 0 = choose, 1 = never, 2 / 4 / 8 = always
  // (swapped operands with a width of kGemmSwapClusterKWidths, whole tiles).
  int cluster_k = 0;
  int block_n = 0;          // a width of kGemmBlockWidths, 0 = choose
  int block_m = 0;          // 128, 192 (kGemmM192Widths) or 256 (kGemmTallWidths); 0 = choose
  bool allow_tall = false;  // block_m = 0 may choose 256 (plain GEMMs only; the library's
                            // launcher leaves this off: measured, not a predictable win)
  bool allow_m192 = false;  // block_m = 0 may choose 192 (plain GEMMs, operands as given)
  bool widths_128_256 = false;  // block_n = 0 chooses between 128 and 256 only
  int cluster_m = 0;        // 1 or 2, 0 = choose
  // Pairs along n (GemmConfig::cluster_n): 0 = weigh them, 1 = never, 2 = always. The library
  // asks for 1 unless the caller sets 2 (measured: not a predictable win); 0 is for the
  // benchmark's and the tests' model experiments. cluster_m = cluster_n = 2: 2 x 2 clusters
  // (kGemmQuadWidths), only then.
  int cluster_n = 1;
  // 2 x 2 clusters weighed beside the others (plain GEMMs; cluster_m 0, cluster_n not 2, at
  // kGemmQuadWidths, with blocks_cluster4 blocks). Asked for with cluster_m = cluster_n = 2.
  bool allow_quads = false;
  int num_splits = 0;       // > 0: uniform split-K with that many splits (1 = none)
  int stream_k = -1;        // 0: never, 1: always (when there are split-able tiles), -1: choose
  int sk_units = 0;         // > 0: that many stream-K units (at most the clusters), 0 = choose
  int dp_tiles = -1;        // >= 0 (with stream-K): tiles computed whole first, -1 = choose
  int num_sms = 132;        // the device's SMs (the model's "all SMs busy")
  int role_sms = 0;         // of them, SMs the launch's role blocks occupy (busy, not idle)
  // > 0: no tile is split among more units than this. 2 makes every result bitwise reproducible:
  // the fix-up adds at most two fp32 partials onto zero, and a + b == b + a exactly, whichever
  // arrives first (GemmConfig::deterministic).
  int max_participants = 0;
  // Deterministic fix-up (GemmParams::split_slots): every work item of a split tile stores its
  // partial into a slot of its own and the last participant sums them in unit order. Bitwise
  // reproducible for any number of participants; a larger workspace (one slot per work item)
  // and the last participant reads every partial.
  bool deterministic = false;
  // Swapped operands (plain GEMMs only): 0 never, 1 always, -1 the rule chooses (the better
  // prediction of the problem as given and of the swapped one, n x m x k, tiled with
  // kGemmSwapWidths). block_n then names a width of the swapped problem.
  int swap_ab = 0;
  // The m whose costs the model charges (0: m). The swapped problem is charged the caller's m's
  // regime: its tiles stream the same bytes.
  int64_t regime_m = 0;
  bool swapped = false;  // this request is the swapped problem (widths: kGemmSwapWidths)
  bool allow_split_last_wave = true;  // whole tiles then the last wave split may be chosen
};

struct GemmSchedule {
  bool deterministic = false;  // the fix-up with one slot per work item (see the request)
  // Swapped operands: m_blocks, n_blocks, block_n describe the swapped problem (its m is the
  // caller's n, its tile width covers the caller's m).
  bool swap_ab = false;
  int block_m = 128;
  int block_n = 256;
  int cluster_m = 1;
  int cluster_n = 1;         // 2: pairs along n (the A tile shared), or with cluster_m 2 a 2 x 2 cluster
  int cluster_k = 1;         // CTAs of a cluster sharing each tile's k blocks (swapped operands)
  int num_clusters = 1;      // clusters launched (GEMM blocks = num_clusters * cluster_ctas())
  uint32_t m_blocks = 0, n_blocks = 0, k_blocks = 0;
  uint32_t tiles = 0;        // cluster tiles (m groups x n groups)

  int cluster_ctas() const { return cluster_m * cluster_n * cluster_k; }
  // CTAs sharing operands (the workspace holds a split tile's partial per CTA of the pair).
  int pair_ctas() const { return cluster_m * cluster_n; }
  uint32_t n_groups() const { return (n_blocks + cluster_n - 1) / cluster_n; }
  uint32_t dp_tiles = 0;     // whole tiles, in waves
  uint32_t sk_units = 0;     // units over the k iterations of the other tiles
  uint32_t sk_per_tile = 0;  // 0: stream-K; s: split-K with s units per tile
  double predicted_us = 0;
  // Model terms of the chosen candidate, for reports: busiest cluster and DRAM floor.
  double busiest_us = 0, dram_us = 0;

  uint32_t sk_tiles() const { return tiles - dp_tiles; }
  // The most units any tile is split among (1 for data-parallel schedules).
  uint32_t max_participants() const {
    if (sk_units == 0) return 1;
    if (sk_per_tile != 0) return sk_per_tile;
    TileScheduler<1> ts{tiles / n_groups(), n_groups(), 1, kRasterAlongN, 8, 0};
    ts.num_k_blocks = k_blocks;
    ts.dp_tiles = dp_tiles;
    ts.sk_units = sk_units;
    uint32_t most = 1;
    for (uint32_t t = dp_tiles; t < tiles; ++t) most = std::max(most, ts.participants(t));
    return most;
  }
  // Workspace: one arrival counter per CTA of a stream-K tile (256-byte aligned), then one fp32
  // accumulator tile per CTA of a stream-K tile (tile_scheduler.cuh, notes 3 and 4).
  size_t counter_bytes() const {
    const size_t b = static_cast<size_t>(sk_units ? sk_tiles() : 0) * pair_ctas() * sizeof(uint32_t);
    return (b + 255) / 256 * 256;
  }
  // Deterministic: one accumulator tile per work item instead (at most units + tiles of them).
  size_t workspace_bytes() const {
    if (sk_units == 0) return 0;
    const size_t slots = deterministic ? static_cast<size_t>(sk_units) + sk_tiles() : sk_tiles();
    return counter_bytes() + slots * pair_ctas() * block_m * block_n * sizeof(float);
  }
  std::string describe() const {
    std::string s;
    if (sk_units == 0) {
      s = "dp";
    } else if (sk_per_tile != 0) {
      // whole tiles in waves, then the last tiles split: "splitk<s>/<tiles>t"
      s = "splitk" + std::to_string(sk_per_tile) + (dp_tiles > 0 ? "/" + std::to_string(sk_tiles()) + "t" : "");
    } else {
      s = "sk" + std::to_string(sk_units) + "/" + std::to_string(sk_tiles()) + "t";
    }
    return s;
  }
};

namespace schedule_detail {

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Predicted time of one decomposition of one tile shape (see the header comment). The work of
// every cluster is walked exactly as the kernel walks it (tile_scheduler.cuh): each work item
// costs its k blocks, plus the epilogue of a finished tile, or the store of a partial tile; the
// participant holding a split tile's first k block is charged the reads of the other partials
// (it is usually the last to arrive, since that block is at the end of its unit).
inline void predict(const GemmCostModel& model, int64_t m, int64_t n, int64_t k, int num_sms, GemmSchedule* s,
                    int role_sms = 0, int64_t regime_m = 0) {
  const GemmCostRegime& cm = (regime_m > 0 ? regime_m : m) <= 64 ? model.small_m : model.general;
  const uint32_t G = static_cast<uint32_t>(s->num_clusters);
  const int64_t active = std::min<int64_t>(G, std::max<int64_t>(s->dp_tiles, std::min<int64_t>(s->sk_units, G)));
  const int cluster_ctas = s->cluster_ctas();
  // Pairs along m (the weight tile shared) or along n (the A tile shared): the same fitted costs,
  // scaled below for the bytes of the pair along n.
  const bool pair = s->pair_ctas() >= 2;
  // 2 x 2 clusters: charged from the clusters-of-1 costs (see the scaling below).
  const bool quad = s->cluster_m == 2 && s->cluster_n == 2;
  const bool pair_costs = pair && !quad;
  const double busy_fraction = std::min(1.0, static_cast<double>(active * cluster_ctas) / std::max(1, num_sms));
  // 0 at 128 columns, 1 at 256; below 128 (swapped operands) extrapolated (floored below).
  const double wide = (s->block_n - 128) / 128.0;
  auto between = [wide](double at128, double at256) { return at128 + wide * (at256 - at128); };
  double it, tile;
  // A 192-row tile's k block against the 128-row one of its width and cluster size.
  const double rows192 = s->block_m == 192 ? 1.5 * model.m192_cost_factor : 1.0;
  if (s->block_m == 256) {
    // Tall tile: the 128 x 256 tile's cost per flop, times the margin; two 64-row sub-tiles per
    // consumer, each with its masked columns.
    const double area = s->block_n / 128.0;  // (256 x block_n) / (128 x 256)
    it = (pair_costs ? cm.iter_us_n256_c2 : cm.iter_us_n256_c1) * area * model.tall_cost_factor;
    tile = cm.tile_us_n256 * area * model.tall_cost_factor + (s->block_n % 64 != 0 ? 2 * model.masked_tail_tile_us : 0.0);
  } else {
    it = pair_costs ? between(cm.iter_us_n128_c2, cm.iter_us_n256_c2) : between(cm.iter_us_n128_c1, cm.iter_us_n256_c1);
    tile = between(cm.tile_us_n128, cm.tile_us_n256) + (s->block_n % 64 != 0 ? model.masked_tail_tile_us : 0.0);
    if (s->block_m == 192) {
      it *= rows192 * (pair_costs ? model.m192_c2_factor : 1.0);
      tile *= model.m192_tile_factor;
    }
  }
  // SMs running a launch's role blocks (communication) are not idle: they count as busy here.
  const double busy_with_roles =
      std::min(1.0, static_cast<double>(active * cluster_ctas + role_sms) / std::max(1, num_sms));
  if (pair_costs && (s->block_m == 128 || s->block_m == 192) && busy_with_roles < model.cluster_full_busy) {
    const double c1 = between(cm.iter_us_n128_c1, cm.iter_us_n256_c1) * rows192;
    const double partial = c1 * (1.0 + model.cluster_partial_penalty * (256 - s->block_n) / 128.0);
    const double w = std::clamp((busy_with_roles - model.cluster_fade_busy) /
                                    (model.cluster_full_busy - model.cluster_fade_busy), 0.0, 1.0);
    it = partial + w * (it - partial);
  }
  if (s->block_n < 128) {
    // Narrow (swapped) tiles. A k block still pulls the 128-row weight tile; its cost falls with
    // the activation rows' bytes (extrapolated above), but not below half the 128-wide
    // clusters-of-1 cost; the epilogue and refill cost what the 128-wide tile's do
    // (extrapolated they would be free). A 64-row tile's k block: half of that, times
    // half_rows_cost_factor for what does not halve.
    it = std::max(it, model.narrow_iter_floor * cm.iter_us_n128_c1);
    tile = std::max(tile, cm.tile_us_n128);
    if (s->block_m == 64) it *= 0.5 * model.half_rows_cost_factor;
  }
  if (quad) {
    // A 2 x 2 cluster's CTA pulls half of what a CTA alone pulls per k block (half of each tile):
    // the clusters-of-1 cost (which `it` holds) halved, times quad_factor.
    it *= 0.5 * model.quad_factor;
  } else if (s->cluster_n == 2) {
    // A pair along n pulls half the A tile and the whole weight tile per CTA, where a pair along m
    // (whose costs `it` holds) pulls the whole A tile and half the weight tile: scaled by the
    // ratio of those bytes (the k block's cost follows the bytes into the SM), times a factor.
    const double a = s->block_m, b = s->block_n;
    it *= (b + a / 2) / (a + b / 2) * model.pair_n_factor;
  }
  it *= 1.0 - cm.concurrency * (1.0 - busy_fraction);
  const double partial_bytes = static_cast<double>(std::min<int64_t>(m, s->block_m)) * s->block_n * 4;
  const double add_partial = partial_bytes / cm.partial_bytes_per_us + cm.fixup_latency_us;
  // The last participant reads the sum and zeroes it, or (deterministic) reads the other
  // participants' slots.
  const double det_part_us = m <= 64 ? model.det_part_us_small_m : model.det_part_us;
  auto take_sum = [&](uint32_t parts) {
    if (s->deterministic) {
      return (parts - 1) * (partial_bytes / cm.partial_bytes_per_us + det_part_us) + cm.sum_latency_us;
    }
    return 2 * partial_bytes / cm.partial_bytes_per_us + cm.sum_latency_us;
  };
  const uint32_t groups = s->tiles / s->n_groups();
  TileScheduler<1> ts{groups, s->n_groups(), 1, kRasterAlongN, 8, 0};
  ts.num_k_blocks = s->k_blocks;
  ts.dp_tiles = s->dp_tiles;
  ts.sk_units = s->sk_units;
  ts.sk_per_tile = s->sk_per_tile;
  double busiest = 0;
  // In-cluster split-K: a CTA's share of the k blocks (the largest), and the reduction.
  const double whole = s->cluster_k > 1
                           ? static_cast<double>(ceil_div(s->k_blocks, s->cluster_k)) * it + tile +
                                 cm.clusterk_reduce_us * (1.0 + cm.clusterk_wide * std::max(0, s->block_n - 64) / 64.0)
                           : s->k_blocks * it + tile;
  // Cluster c: data-parallel tiles c, c + G, ...; then units c, c + G, ... Every participant of
  // a split tile adds its partial; the one holding the tile's first k block is charged taking
  // the sum and the epilogue (it is usually the last to arrive: that block ends its unit).
  for (uint32_t c = 0; c < G; ++c) {
    const uint32_t dp = s->dp_tiles > c ? (s->dp_tiles - c + G - 1) / G : 0;
    double t = dp * whole;
    for (uint32_t u = c; u < s->sk_units; u += G) {
      WorkCursor cur{s->dp_tiles, u, ts.unit_begin(u), ts.unit_begin(u + 1)};
      WorkItem w;
      bool first_item = true;
      while (cur.unit == u && ts.next(cur, G, w)) {
        if (w.unit != u) break;
        t += (w.k_end - w.k_begin) * it * (s->sk_per_tile == 0 ? cm.sk_iter_factor : 1.0) +
             (first_item ? 0.0 : cm.sk_item_us);
        first_item = false;
        const uint32_t parts = ts.participants(w.tile);
        if (parts == 1) {
          t += tile;
        } else {
          t += add_partial;
          if (w.unit == ts.first_unit(w.tile)) t += tile + take_sum(parts);
        }
      }
    }
    busiest = std::max(busiest, t);
    if (c + 1 >= s->sk_units) break;  // later clusters: no units, no more whole tiles than this one
  }
  // DRAM: every operand once, at most what the active CTAs can stream.
  const double dm = static_cast<double>(m), dn = static_cast<double>(n), dk = static_cast<double>(k);
  const double bytes = 2.0 * (dm * dk + dn * dk + dm * dn);
  const double bw = std::min(cm.dram_bytes_per_us, static_cast<double>(active * cluster_ctas) * cm.cta_bytes_per_us);
  s->busiest_us = busiest;
  s->dram_us = bytes / bw;
  s->predicted_us = cm.launch_us + (pair ? cm.cluster2_launch_us : 0.0) + (quad ? model.quad_launch_us : 0.0) +
                    (s->cluster_k > 1 ? cm.clusterk_launch_us : 0.0) + std::max(s->busiest_us, s->dram_us);
}

}  // namespace schedule_detail

// The decision rule (see the header comment). Always returns a valid schedule for m, n, k >= 1
// and at least one allowed cluster size with blocks.
inline GemmSchedule choose_gemm_schedule(const GemmScheduleRequest& r, const GemmCostModel& cm = GemmCostModel{}) {
  using schedule_detail::ceil_div;
  if (r.swap_ab != 0 && !r.swapped) {
    // The swapped problem: n x m x k, 128-row tiles (64 only when asked for), widths of
    // kGemmSwapWidths, charged the caller's m's costs. A width the caller fixed applies to it.
    GemmScheduleRequest t = r;
    t.m = r.n;
    t.n = r.m;
    t.swap_ab = 0;
    t.swapped = true;
    t.regime_m = r.m;
    t.block_m = (r.block_m == 64 || r.block_m == 128) ? r.block_m : 0;  // 64 or 128 rows (kernel problem)
    t.allow_tall = false;
    t.widths_128_256 = false;
    GemmSchedule swapped = choose_gemm_schedule(t, cm);
    swapped.swap_ab = true;
    if (r.swap_ab == 1 || r.cluster_k > 1) return swapped;  // in-cluster split-K: swapped only
    GemmScheduleRequest u = r;
    u.swap_ab = 0;
    u.cluster_k = 1;
    if (u.block_n != 0 && !gemm_block_width_built(u.block_n)) return swapped;  // a width only swapped tiles have
    const GemmSchedule plain = choose_gemm_schedule(u, cm);
    // Ties go to the operands as given (the model was fitted on them), except for m <= 64,
    // where the swapped weight stream measured faster on nearly every shape.
    const double margin = r.m <= 64 ? cm.swap_margin_small_m : cm.swap_margin;
    return swapped.predicted_us < plain.predicted_us * margin ? swapped : plain;
  }
  GemmSchedule best;
  bool have = false;
  auto consider = [&](GemmSchedule s) {
    if (r.max_participants > 0 && s.max_participants() > static_cast<uint32_t>(r.max_participants)) return;
    schedule_detail::predict(cm, r.m, r.n, r.k, r.num_sms, &s, r.role_sms, r.regime_m);
    // Ties (within 1%) go to the earlier candidate: fewer split tiles, wider tiles, clusters;
    // except that where both are bound by the operands' stream from DRAM, one without a fix-up
    // through the workspace wins over one with it (the fix-up follows the stream: on
    // 1x8192x8192 and 16x8192x8192 in-cluster split-K 2 ran 5% faster than split-K 2 in two
    // runs, both predicted at the DRAM floor), unless it streams with fewer CTAs.
    const bool dram_tie = have && s.predicted_us < best.predicted_us * 1.01 && s.dram_us >= s.busiest_us &&
                          best.dram_us >= best.busiest_us && s.sk_units == 0 && best.sk_units > 0 &&
                          s.num_clusters * s.cluster_ctas() >= best.num_clusters * best.cluster_ctas();
    if (!have || s.predicted_us < best.predicted_us * 0.99 || dram_tie) {
      best = s;
      have = true;
    }
  };
  const int64_t k_blocks = ceil_div(r.k, 64);
  // In-cluster split-K candidates, considered after all others (ties go to the simpler ones).
  GemmSchedule cluster_k_candidates[3 * std::size(kGemmSwapClusterKWidths)];
  int num_cluster_k_candidates = 0;
  // Heights: 128 first (ties go to it); 256 when asked for, or allowed and m fills more than
  // one 128-row block (a single block is never better served by a taller tile).
  for (int bm : {128, 256, 64, 192}) {
    if (r.block_m != 0 && r.block_m != bm) continue;
    // 192-row tiles: operands as given, when asked for or allowed with more than 128 rows.
    if (bm == 192 && (r.swapped || (r.block_m == 0 && (!r.allow_m192 || r.widths_128_256 || r.m <= 128)))) continue;
    // 64-row tiles: swapped operands only, and only when asked for (measured slower than the
    // 128-row swapped tiles on every shape but one, docs/kernels.md section 7).
    if (bm == 64 && (!r.swapped || r.block_m != 64)) continue;
    if (bm == 256 && r.block_m == 0 && (!r.allow_tall || r.widths_128_256 || r.m <= 128)) continue;
    const int64_t m_blocks = ceil_div(r.m, bm);
    // Cluster shapes: pairs along m (the weight tile shared), single CTAs, pairs along n (the A
    // tile shared; last, so ties keep the others).
    // 2 x 2 clusters (both tiles shared): always when asked for (cluster_m = cluster_n = 2, then
    // nothing else), weighed when allowed (last, so ties keep the others).
    const bool quads_only = r.cluster_m == 2 && r.cluster_n == 2;
    const bool quads_weighed = r.allow_quads && r.cluster_m == 0 && r.cluster_n != 2;
    for (const auto& [cl, cn] : {std::pair{2, 1}, std::pair{1, 1}, std::pair{1, 2}, std::pair{2, 2}}) {
      const bool quad = cl == 2 && cn == 2;
      if (quad ? !(quads_only || quads_weighed) || (bm != 128 && bm != 192) : quads_only) continue;
      if (r.cluster_m != 0 && r.cluster_m != cl) continue;
      if (!quad && cn == 2 && (r.cluster_n == 1 || bm == 256 || bm == 64)) continue;
      if (cn == 1 && r.cluster_n == 2) continue;
      const int blocks = quad ? r.blocks_cluster4 : (cl == 2 || cn == 2) ? r.blocks_cluster2 : r.blocks_cluster1;
      if (blocks < cl * cn) continue;
      if (cl == 2 && r.cluster_m == 0 && m_blocks < 2) continue;  // a cluster of one real tile and padding
      for (int bn : kGemmSwapWidths) {
        if (!r.swapped && !gemm_block_width_built(bn)) continue;
        if (r.block_n != 0 && r.block_n != bn) continue;
        if (r.block_n == 0 && r.widths_128_256 && bn != 128 && bn != 256) continue;
        if (bm == 256 && !gemm_tall_width_built(bn)) continue;
        if (bm == 192 && !gemm_m192_width_built(bn)) continue;
        if (bm == 64 && !gemm_swap64_width_built(bn)) continue;
        if (quad && !gemm_quad_width_built(bn)) continue;
        if (r.swapped && r.block_n == 0 && bn < 128) {
          // A narrow swapped width is never better than a narrower one with as many tiles (it
          // only pulls more activation rows); without this, predictions bound by DRAM tie and
          // the tie goes to the wider one.
          bool narrower_same = false;
          for (int w : kGemmSwapWidths)
            if (w < bn && (bm != 64 || gemm_swap64_width_built(w)) && ceil_div(r.n, w) == ceil_div(r.n, bn)) narrower_same = true;
          if (narrower_same) continue;
        }
        GemmSchedule base;
        base.deterministic = r.deterministic;
        base.block_m = bm;
        base.block_n = bn;
        base.cluster_m = cl;
        base.cluster_n = cn;
        base.m_blocks = static_cast<uint32_t>(m_blocks);
        base.n_blocks = static_cast<uint32_t>(ceil_div(r.n, bn));
        base.k_blocks = static_cast<uint32_t>(k_blocks);
        // A pair along n with one n block is one real tile and padding.
        if (cn == 2 && (r.cluster_n == 0 || (quad && !quads_only)) && base.n_blocks < 2) continue;
        base.tiles = static_cast<uint32_t>(ceil_div(m_blocks, cl) * base.n_groups());
        const int64_t G = blocks / (cl * cn);
        const int64_t T = base.tiles;
        // Clusters launched: never more than there is work for.
        auto with_clusters = [&](GemmSchedule s, int64_t wanted) {
          s.num_clusters = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(G, wanted)));
          return s;
        };
        // Split-K inside a cluster: swapped operands, 128-row tiles, clusters of 1 along m, a
        // width of kGemmSwapClusterKWidths, whole tiles (no split-K or stream-K through the
        // workspace besides). Chosen freely only where every CTA gets two k blocks or more.
        if (r.cluster_k != 1 && r.swapped && bm == 128 && cl == 1 && cn == 1 && gemm_swap_cluster_k_width_built(bn) &&
            bn <= cm.clusterk_max_width &&
            r.num_splits <= 1 && r.stream_k != 1 && r.sk_units == 0 && r.dp_tiles < 0) {
          for (int ck : kGemmClusterKSizes) {
            if (r.cluster_k != 0 && r.cluster_k != ck) continue;
            const int avail = ck == 2 ? r.blocks_cluster_k2 : ck == 4 ? r.blocks_cluster_k4 : r.blocks_cluster_k8;
            if (avail < ck) continue;
            if (r.cluster_k == 0 && k_blocks < 2 * ck) continue;
            GemmSchedule s = base;
            s.cluster_k = ck;
            s.dp_tiles = s.tiles;
            s.num_clusters = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(avail / ck, T)));
            cluster_k_candidates[num_cluster_k_candidates++] = s;
          }
        }
        if (r.cluster_k > 1) continue;  // asked for in-cluster split-K: nothing else
        if (r.num_splits > 0 && r.stream_k != 1) {
          // Explicit uniform split-K (1 = data-parallel), of every tile or, with dp_tiles, of
          // the tiles after the first dp_tiles (computed whole).
          GemmSchedule s = base;
          const int64_t splits = std::min<int64_t>(r.num_splits, k_blocks);
          const int64_t dp = r.dp_tiles > 0 ? std::min<int64_t>(r.dp_tiles, T) : 0;
          if (splits <= 1 || dp == T) {
            s.dp_tiles = s.tiles;
            consider(with_clusters(s, T));
          } else {
            s.dp_tiles = static_cast<uint32_t>(dp);
            s.sk_per_tile = static_cast<uint32_t>(splits);
            s.sk_units = static_cast<uint32_t>((T - dp) * splits);
            consider(with_clusters(s, std::max<int64_t>(dp, (T - dp) * splits)));
          }
          continue;
        }
        if (r.stream_k != 1) {
          GemmSchedule s = base;
          s.dp_tiles = s.tiles;
          consider(with_clusters(s, T));
        }
        // Uniform split-K when the tiles fill less than half of the clusters: s units per tile,
        // one round, no unit crossing a tile.
        if (r.stream_k != 1 && r.sk_units == 0 && 2 * T <= G) {
          for (int64_t splits = std::min<int64_t>(G / T, k_blocks); splits >= 2; splits = splits * 2 / 3) {
            GemmSchedule s = base;
            s.dp_tiles = 0;
            s.sk_per_tile = static_cast<uint32_t>(splits);
            s.sk_units = static_cast<uint32_t>(T * splits);
            consider(with_clusters(s, T * splits));
          }
        }
        const int64_t full_waves = T / G;
        // Split last wave: whole tiles in full waves, then the last wave's tiles, when they fill at
        // most half of the clusters, split s ways (each k range of its own, like split-K). The
        // units of one split index start at the same k block, so the tail keeps the sharing in
        // L2 that whole tiles have, which the stream-K units (each starting anywhere on the
        // line) lose (GemmCostRegime::sk_iter_factor).
        const int64_t tail = T % G;
        if (r.allow_split_last_wave && r.stream_k < 0 && r.num_splits == 0 && r.sk_units == 0 && r.dp_tiles < 0 &&
            full_waves > 0 && tail > 0 && 2 * tail <= G) {
          for (int64_t splits = std::min<int64_t>(G / tail, k_blocks); splits >= 2; splits = splits * 2 / 3) {
            GemmSchedule s = base;
            s.dp_tiles = static_cast<uint32_t>(full_waves * G);
            s.sk_per_tile = static_cast<uint32_t>(splits);
            s.sk_units = static_cast<uint32_t>(tail * splits);
            consider(with_clusters(s, G));
          }
        }
        if (r.stream_k == 0) continue;
        if (r.stream_k < 0) {
          const bool small_m = (r.regime_m > 0 ? r.regime_m : r.m) <= 64;
          if (k_blocks < (small_m ? cm.min_k_blocks_stream_k_small_m : cm.min_k_blocks_stream_k)) continue;
          if (!small_m && full_waves > 0 && 2 * (T % G) >= G) continue;
        }
        // Stream-K over the last one or two waves' tiles (the rest in data-parallel waves), or
        // after the data-parallel tiles the caller named.
        int64_t dp_options[2] = {(full_waves - 1) * G, full_waves * G};
        if (r.dp_tiles >= 0) dp_options[0] = dp_options[1] = r.dp_tiles;
        for (int o = 0; o < (r.dp_tiles >= 0 ? 1 : 2); ++o) {
          const int64_t dp = dp_options[o];
          if (dp < 0) continue;
          const int64_t sk_tiles = T - dp;
          if (sk_tiles <= 0) continue;
          const int64_t iters = sk_tiles * k_blocks;
          auto add_units = [&](int64_t units) {
            units = std::min<int64_t>({units, G, iters});
            if (units < 1) return;
            GemmSchedule s = base;
            s.dp_tiles = static_cast<uint32_t>(dp);
            s.sk_units = static_cast<uint32_t>(units);
            s.sk_per_tile = 0;
            consider(with_clusters(s, std::max(dp, units)));
          };
          if (r.sk_units > 0) {
            add_units(r.sk_units);
          } else {
            for (int64_t div : {1, 2, 4, 8}) add_units(ceil_div(G, div));
          }
        }
      }
    }
  }
  for (int i = 0; i < num_cluster_k_candidates; ++i) consider(cluster_k_candidates[i]);
  if (!have && r.cluster_k > 1) {
    // No in-cluster split-K candidate (no width of kGemmSwapClusterKWidths, or no room for the
    // cluster size): the rule without it.
    GemmScheduleRequest no = r;
    no.cluster_k = 1;
    return choose_gemm_schedule(no, cm);
  }
  if (!have && (r.stream_k != 0 || r.num_splits > 1)) {
    // Nothing left for stream-K (the named data-parallel tiles cover the problem), or every
    // split the caller named exceeds max_participants: whole tiles.
    GemmScheduleRequest dp = r;
    dp.stream_k = 0;
    dp.num_splits = 1;
    dp.sk_units = 0;
    dp.dp_tiles = -1;
    return choose_gemm_schedule(dp, cm);
  }
  return best;
}

}  // namespace mkernel::kernels
