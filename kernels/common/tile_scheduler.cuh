// tile_scheduler.cuh: the persistent tile scheduler shared by every warp role of a GEMM block
// (host and device code: the host uses the same arithmetic to size the workspace, and the CPU
// schedule test replays it).
//
// Design notes
//  1. Tiles. A cluster tile is (m group, n group): an m group is kClusterM consecutive m blocks,
//     an n group kClusterN consecutive n blocks, one tile per CTA of a cluster (CTA rank r takes
//     m block m_group * kClusterM + r % kClusterM and n block n_group * kClusterN + r /
//     kClusterM). CTAs of one n block share its weight tile, CTAs of one m block its A tile
//     (loaded once, multicast). With kClusterN == 1 the n groups are the n blocks.
//     Tiles are numbered in a grouped ("swizzled") raster: bands of `group` m groups
//     (kRasterAlongN) or of `group` n groups (kRasterAlongM) are completed before the next band
//     starts, so the tiles in flight at any time share rows of A and columns of the weight in L2;
//     `m_group_offset` rotates the m groups so a fused kernel starts with the rows whose data is
//     local (ordering by availability) and reaches remote rows last.
//  2. Work. Tiles [0, dp_tiles) are the data-parallel region: whole tiles, cluster c takes tiles
//     c, c + G, c + 2G, ... (G clusters). The k iterations (k blocks) of tiles
//     [dp_tiles, num_tiles) form one line of sk_iters() iterations, cut into sk_units contiguous
//     ranges ("units"); cluster c takes units c, c + G, ... after its data-parallel tiles. A unit
//     that crosses tile boundaries yields one work item per tile it touches.
//       - sk_per_tile == 0 (stream-K): the ranges are balanced over the whole line, so every
//         unit has the same number of iterations (+-1) whatever the tile boundaries are.
//       - sk_per_tile == s (split-K): every tile is cut into s ranges of its own (units
//         t * s .. t * s + s - 1), never crossing a tile boundary.
//     Data-parallel only: dp_tiles == num_tiles, sk_units == 0.
//  3. Fix-up. A tile whose k range is covered by P > 1 units ("participants", consecutive unit
//     numbers) is finished by whichever participant arrives last: each participant, after its
//     main loop, adds its fp32 partial tile into the tile's accumulator in the workspace
//     (vector reductions in L2) and then takes a ticket (acquire-release add on the tile's
//     arrival counter); the one with ticket P - 1 reads the sum, zeroes the accumulator and the
//     counter for the next launch, and runs the epilogue. Nobody waits for anybody, so the
//     scheme cannot deadlock whatever the unit order, and its cost does not grow with P. Since
//     every cluster visits its tiles in increasing schedule order (data-parallel tiles, then its
//     units in order, each unit's tiles in order), an epilogue that itself waits on other
//     ranks' tiles (a fused role) sees the same order argument as with whole tiles. The order
//     of the additions varies from run to run, so a tile of three or more parts is not bitwise
//     reproducible (rounding differences of fp32 sums only; two parts are: a + b == b + a).
//     The deterministic variant (GemmParams::split_slots) stores each work item's partial into
//     a slot of its own instead, numbered unit + (tile - dp_tiles): along the line every step
//     crosses one unit boundary or one tile boundary, so the numbers are distinct and below
//     sk_units + sk_tiles(); the last participant sums the slots of units first_unit ..
//     first_unit + P - 1 in that order.
//  4. Workspace. Split tiles are the tiles of the stream-K region (index tile - dp_tiles); each
//     has one counter and one fp32 accumulator tile per CTA of its cluster.
//  5. Compatibility. get(unit, cta_rank) keeps the earlier uniform split-K numbering (unit =
//     tile * num_splits + split) for code that walks units itself.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define MKERNEL_HOST_DEVICE __host__ __device__
#else
#define MKERNEL_HOST_DEVICE
#endif

namespace mkernel::kernels {

enum GemmRaster : uint32_t {
  // Bands of `group` m groups; inside a band, m varies fastest, then n.
  kRasterAlongN = 0,
  // Bands of `group` n blocks; inside a band, n varies fastest, then m.
  kRasterAlongM = 1,
};

struct TileCoord {
  uint32_t m_block;
  uint32_t n_block;
  uint32_t split;
};

// One piece of work: k blocks [k_begin, k_end) of cluster tile `tile` (schedule order).
struct WorkItem {
  static constexpr uint32_t kWholeTile = 0xFFFFFFFFu;
  uint32_t tile;
  uint32_t k_begin, k_end;
  uint32_t unit;  // stream-K / split-K unit, kWholeTile for a tile of the data-parallel region
};

// Where a cluster is in its sequence of work items (note 2).
struct WorkCursor {
  uint32_t dp_next;  // next data-parallel tile
  uint32_t unit;     // current unit
  uint32_t pos;      // next iteration of the unit on the stream-K line
  uint32_t end;      // end of the unit on the line
};

// Split-K inside a cluster (GEMM traits kClusterK > 1): the CTAs of a cluster walk the same work
// items, and CTA `rank` of `cluster_k` computes the rank-th of cluster_k contiguous, balanced
// shares of each item's k blocks (none when the item has fewer k blocks than the cluster has
// CTAs; its partial is then zero). The CTAs' partials are summed inside the cluster.
MKERNEL_HOST_DEVICE inline void cluster_k_share(WorkItem& item, uint32_t rank, uint32_t cluster_k) {
  const uint32_t len = item.k_end - item.k_begin;
  const uint32_t b = item.k_begin + len * rank / cluster_k;
  item.k_end = item.k_begin + len * (rank + 1) / cluster_k;
  item.k_begin = b;
}

template <int kClusterM, int kClusterN = 1>
struct TileScheduler {
  uint32_t num_m_blocks;
  uint32_t num_n_blocks;
  uint32_t num_splits;  // get() only (note 5)
  uint32_t raster;
  uint32_t group;
  uint32_t m_group_offset;
  // Work decomposition (note 2).
  uint32_t num_k_blocks = 0;
  uint32_t dp_tiles = 0;
  uint32_t sk_units = 0;
  uint32_t sk_per_tile = 0;

  MKERNEL_HOST_DEVICE static uint32_t umin(uint32_t a, uint32_t b) { return a < b ? a : b; }

  MKERNEL_HOST_DEVICE uint32_t num_m_groups() const { return (num_m_blocks + kClusterM - 1) / kClusterM; }
  MKERNEL_HOST_DEVICE uint32_t num_n_groups() const { return (num_n_blocks + kClusterN - 1) / kClusterN; }
  MKERNEL_HOST_DEVICE uint32_t num_tiles() const { return num_m_groups() * num_n_groups(); }
  MKERNEL_HOST_DEVICE uint32_t num_units() const { return num_tiles() * num_splits; }

  // m and n block (of CTA cta_rank) of cluster tile `tile`. Either may reach past the last block
  // (an odd block count with clusters of 2): that CTA's loads of the padded operand are then all
  // out of bounds, TMA fills zeros, and the epilogue writes nothing.
  MKERNEL_HOST_DEVICE TileCoord tile_coord(uint32_t tile, uint32_t cta_rank) const {
    const uint32_t groups = num_m_groups();
    const uint32_t n_groups = num_n_groups();
    uint32_t mg, ng;
    if (raster == kRasterAlongN) {
      const uint32_t band = group * n_groups;
      const uint32_t first = (tile / band) * group;
      const uint32_t width = umin(group, groups - first);
      const uint32_t in_band = tile % band;
      mg = first + in_band % width;
      ng = in_band / width;
    } else {
      const uint32_t band = group * groups;
      const uint32_t first = (tile / band) * group;
      const uint32_t width = umin(group, n_groups - first);
      const uint32_t in_band = tile % band;
      ng = first + in_band % width;
      mg = in_band / width;
    }
    mg += m_group_offset;
    if (mg >= groups) mg -= groups;
    return TileCoord{mg * kClusterM + cta_rank % kClusterM, ng * kClusterN + cta_rank / kClusterM, 0};
  }

  // Note 5: unit = tile * num_splits + split.
  MKERNEL_HOST_DEVICE TileCoord get(uint32_t unit, uint32_t cta_rank) const {
    TileCoord c = tile_coord(unit / num_splits, cta_rank);
    c.split = unit % num_splits;
    return c;
  }

  // ---- the stream-K line (note 2) ------------------------------------------------------------
  MKERNEL_HOST_DEVICE uint32_t sk_tiles() const { return num_tiles() - dp_tiles; }
  MKERNEL_HOST_DEVICE uint32_t sk_iters() const { return sk_tiles() * num_k_blocks; }

  // First iteration of unit u on the line (u == sk_units gives the end of the line).
  MKERNEL_HOST_DEVICE uint32_t unit_begin(uint32_t u) const {
    if (sk_per_tile != 0) {
      const uint32_t t = u / sk_per_tile, j = u % sk_per_tile;
      const uint32_t q = num_k_blocks / sk_per_tile, r = num_k_blocks % sk_per_tile;
      return t * num_k_blocks + j * q + umin(j, r);
    }
    const uint32_t total = sk_iters();
    const uint32_t q = total / sk_units, r = total % sk_units;
    return u * q + umin(u, r);
  }

  // The unit holding iteration i of the line.
  MKERNEL_HOST_DEVICE uint32_t unit_of(uint32_t i) const {
    uint32_t base = 0, n = sk_units, len = sk_iters();
    if (sk_per_tile != 0) {
      const uint32_t t = i / num_k_blocks;
      base = t * sk_per_tile;
      n = sk_per_tile;
      len = num_k_blocks;
      i -= t * num_k_blocks;
    }
    const uint32_t q = len / n, r = len % n;
    const uint32_t big = r * (q + 1);  // the first r units have q + 1 iterations
    return base + (i < big ? i / (q + 1) : r + (i - big) / q);
  }

  MKERNEL_HOST_DEVICE WorkCursor begin(uint32_t cluster_idx) const {
    WorkCursor c{cluster_idx, cluster_idx, 0, 0};
    if (cluster_idx < sk_units) {
      c.pos = unit_begin(cluster_idx);
      c.end = unit_begin(cluster_idx + 1);
    }
    return c;
  }

  // The cluster's next work item; false when it has none left.
  MKERNEL_HOST_DEVICE bool next(WorkCursor& c, uint32_t num_clusters, WorkItem& item) const {
    if (c.dp_next < dp_tiles) {
      item = WorkItem{c.dp_next, 0, num_k_blocks, WorkItem::kWholeTile};
      c.dp_next += num_clusters;
      return true;
    }
    while (c.unit < sk_units) {
      if (c.pos < c.end) {
        const uint32_t t = c.pos / num_k_blocks;
        const uint32_t kb0 = c.pos - t * num_k_blocks;
        const uint32_t kb1 = umin(num_k_blocks, c.end - t * num_k_blocks);
        item = WorkItem{dp_tiles + t, kb0, kb1, c.unit};
        c.pos = t * num_k_blocks + kb1;
        return true;
      }
      c.unit += num_clusters;
      if (c.unit < sk_units) {
        c.pos = unit_begin(c.unit);
        c.end = unit_begin(c.unit + 1);
      }
    }
    return false;
  }

  // ---- fix-up (notes 3, 4) ---------------------------------------------------------------------
  // Units covering tile `tile` are first_unit .. first_unit + participants - 1.
  MKERNEL_HOST_DEVICE uint32_t first_unit(uint32_t tile) const {
    return unit_of((tile - dp_tiles) * num_k_blocks);
  }
  MKERNEL_HOST_DEVICE uint32_t participants(uint32_t tile) const {
    if (tile < dp_tiles) return 1;
    const uint32_t t0 = (tile - dp_tiles) * num_k_blocks;
    return unit_of(t0 + num_k_blocks - 1) - unit_of(t0) + 1;
  }
  // Index of a split tile's counter and accumulator (per CTA of the cluster:
  // * kClusterM * kClusterN + rank).
  MKERNEL_HOST_DEVICE uint32_t counter(uint32_t tile) const { return tile - dp_tiles; }
};

}  // namespace mkernel::kernels
