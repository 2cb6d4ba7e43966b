// sm90_bf16_grouped_gemm_map.h: which output tile of which group a tile index of a grouped GEMM
// launch stands for. Host- and device-compilable plain C++ (the CPU test replays it; the kernel
// runs the same functions on the offsets it finds in device memory).
//
// Design notes
//  1. Groups. Group g owns the packed rows [offsets[g], offsets[g + 1]) of A and D (any count,
//     0 included) and the weight W[g] ([n, k]). Its tiles are ceil(m_g / 128) m blocks times
//     num_n_blocks. With clusters of 2 the two CTAs of a cluster tile normally take two
//     consecutive m blocks of one group and share (multicast) the weight tile; a group with an
//     odd m block count runs its last m block as "split" cluster tiles instead: the two CTAs
//     take the same m block and two consecutive n blocks, each loading its own weight tile. So
//     no CTA idles for a whole row of n blocks; only when num_n_blocks is odd does the last
//     split tile pad one CTA (no rows).
//  2. Order. Tile indices run group by group (all tiles of group 0, then group 1, ...); inside a
//     group they follow the dense engine's swizzled raster (TileScheduler::tile_coord with the
//     group's own m block count), so the tiles in flight share the group's weight columns and A
//     rows in L2, and a group's weight is streamed from DRAM about once.
//  3. No host synchronisation. The host knows only bounds (row capacity, number of groups, n, k);
//     every block of the launch reads the offsets at its start and builds the same small table
//     in shared memory: the groups are cut into at most kGroupedMaxChunks chunks of
//     `groups_per_chunk` consecutive groups, and the table holds, per chunk, the tiles and the m
//     blocks of all groups before it. A lookup is a binary search over the chunks, then a walk
//     over at most groups_per_chunk groups (offsets read from global memory, cached); a cursor
//     carries the walk over from one lookup to the next, since a block visits its tiles in
//     increasing order. With G <= 128 every chunk is one group.
//  4. Checks on the device. Offsets that decrease, or a last offset past the row capacity, make
//     the table empty (no tile runs) and name the first offending group (`bad_group`); the kernel
//     reports it in the status word (kDeviceBadArgument, kArgGroupOffsets). The host checks the
//     bounds (G, capacity, n) so that no count computed here overflows 32 bits.
//  5. Flat m blocks. flat_m_block numbers the m blocks of all groups in order (padding CTAs
//     excluded): the index of a tile's rows for per-tile flags (flat_m_block * num_n_blocks +
//     n_block), bounded by grouped_max_m_blocks(capacity, G) whatever the counts are.
#pragma once

#include <cstdint>
#include <string>

#include "common/tile_scheduler.cuh"

namespace mkernel::kernels {

inline constexpr uint32_t kGroupedBlockM = 128;
inline constexpr uint32_t kGroupedMaxChunks = 128;
inline constexpr uint32_t kGroupedNoBadGroup = 0xFFFFFFFFu;

// The launch's view of its groups (part of GemmParams; set by the host from bounds only).
struct GroupedMapParams {
  const uint32_t* offsets;  // num_groups + 1 entries, device memory (or host memory in tests)
  uint32_t num_groups;
  uint32_t capacity;  // rows of the packed A and D buffers
  uint32_t num_n_blocks;
  uint32_t raster;            // GemmRaster inside a group
  uint32_t band;              // width of the swizzled raster's bands (m groups or n blocks)
  uint32_t groups_per_chunk;  // note 3
  uint32_t num_chunks;        // ceil(num_groups / groups_per_chunk) <= kGroupedMaxChunks
  uint32_t coherent;          // 1: the offsets were written during this launch (read through L2, not the read-only path)
};

// The per-launch table (note 3): shared memory on the device.
struct GroupedTable {
  uint32_t total_tiles;  // cluster tiles of the launch
  uint32_t bad_group;    // kGroupedNoBadGroup, or the first group with invalid offsets (note 4)
  uint32_t tiles_before[kGroupedMaxChunks + 1];
  uint32_t m_blocks_before[kGroupedMaxChunks + 1];
};

// What one CTA of a cluster tile works on.
struct GroupedTile {
  uint32_t group;
  uint32_t m_block;       // m block inside the group
  uint32_t n_block;       // num_n_blocks for a padding CTA (note 1)
  uint32_t row_begin;     // packed row of the tile's first row: offsets[group] + m_block * 128
  uint32_t row_end;       // min(row_begin + 128, offsets[group + 1]); == row_begin: no rows
  uint32_t flat_m_block;  // note 5
  uint32_t split;         // 1: the cluster's CTAs share the m block, not the weight tile (note 1)
  MKERNEL_HOST_DEVICE uint32_t rows() const { return row_end - row_begin; }
};

// Where a walk over the groups stands (one per thread that looks tiles up).
struct GroupCursor {
  uint32_t chunk = 0xFFFFFFFFu;  // chunk of `group` (none yet)
  uint32_t group = 0;
  uint32_t tile_base = 0;     // first tile of `group`
  uint32_t m_block_base = 0;  // first flat m block of `group`
};

// Totals of one chunk (note 3) and whether its offsets are valid.
struct GroupedChunkTotals {
  uint32_t tiles = 0;
  uint32_t m_blocks = 0;
  uint32_t bad_group = kGroupedNoBadGroup;
};

// Host-side bounds (note 5): the most m blocks any counts can give.
MKERNEL_HOST_DEVICE constexpr uint64_t grouped_max_m_blocks(uint64_t capacity, uint64_t num_groups) {
  const uint64_t by_rows = (capacity + (kGroupedBlockM - 1) * num_groups) / kGroupedBlockM;
  return by_rows < capacity ? by_rows : capacity;
}

// The per-m-block count word (GroupedGemmHooks::mblock_counts) after one more stored tile of a
// launch whose flag value is `value`, for m blocks of n_blocks tiles: the low 32 bits of the
// value in the high half, the tiles counted in the low half. A word with another value's tag
// counts as zero (what an aborted launch left); the tile that completes the band leaves the
// count at zero again (a next launch with the same value starts clean) and is the only one
// that gets a word with a zero count back.
MKERNEL_HOST_DEVICE constexpr unsigned long long grouped_mblock_count_next(unsigned long long word, uint64_t value,
                                                                         uint32_t n_blocks) {
  const unsigned long long tag = (value & 0xffffffffull) << 32;
  const unsigned long long next = (word & ~0xffffffffull) == tag ? word + 1 : tag | 1ull;
  return (next & 0xffffffffull) >= n_blocks ? tag : next;
}

// Host checks of the bounds a launch is planned for (note 4); "" when they are fine, else a
// message naming the field, its value and what is expected. block_n: the tile width planned.
inline std::string grouped_bounds_error(int64_t capacity, int64_t num_groups, int64_t n, int64_t k, int64_t block_n) {
  const int64_t kMax = (int64_t{1} << 31) - 1;
  if (num_groups < 1 || num_groups > kMax) {
    return "num_groups = " + std::to_string(num_groups) + " is not supported: expected 1 .. 2^31 - 1";
  }
  if (capacity < 1 || capacity > kMax) {
    return "capacity = " + std::to_string(capacity) + " is not supported: expected 1 .. 2^31 - 1 rows";
  }
  if (n < 8 || n % 8 != 0 || n > kMax) {
    return "n = " + std::to_string(n) +
           " is not supported: it must be a positive multiple of 8 (rows of the weight "
           "and of the output must start on 16-byte boundaries for TMA)";
  }
  if (k < 8 || k % 8 != 0 || k > kMax) {
    return "k = " + std::to_string(k) +
           " is not supported: it must be a positive multiple of 8 (rows of A and of "
           "the weight must be 16-byte aligned for TMA)";
  }
  if (num_groups * n > kMax - 1024) {
    // The kernel addresses weight rows up to num_groups * n + 2.5 tiles (a padding CTA's loads)
    // as 32-bit TMA coordinates.
    return "num_groups * n = " + std::to_string(num_groups * n) +
           " is too large: the weights' rows are addressed as one [num_groups * n, k] tensor (at most 2^31 - 1025 "
           "rows)";
  }
  const int64_t n_blocks = (n + block_n - 1) / block_n;
  const uint64_t flags = grouped_max_m_blocks(static_cast<uint64_t>(capacity), static_cast<uint64_t>(num_groups)) *
                         static_cast<uint64_t>(n_blocks);
  if (flags + static_cast<uint64_t>(num_groups) * static_cast<uint64_t>(n_blocks) >= (uint64_t{1} << 32)) {
    return "capacity = " + std::to_string(capacity) + " with num_groups = " + std::to_string(num_groups) +
           " and n = " + std::to_string(n) + " gives up to " + std::to_string(flags) +
           " tiles: expected fewer than 2^32 (tile indices are 32-bit)";
  }
  return {};
}

// Host check of offsets held in host memory (note 4): "" or a message naming the first bad entry.
inline std::string grouped_offsets_error(const uint32_t* offsets, int64_t num_groups, int64_t capacity) {
  if (offsets == nullptr) return "offsets is null; expected num_groups + 1 entries";
  for (int64_t g = 0; g < num_groups; ++g) {
    if (offsets[g + 1] < offsets[g]) {
      return "offsets[" + std::to_string(g + 1) + "] = " + std::to_string(offsets[g + 1]) + " is less than offsets[" +
             std::to_string(g) + "] = " + std::to_string(offsets[g]) + ": expected non-decreasing offsets";
    }
  }
  if (static_cast<int64_t>(offsets[num_groups]) > capacity) {
    return "offsets[" + std::to_string(num_groups) + "] = " + std::to_string(offsets[num_groups]) +
           " exceeds capacity = " + std::to_string(capacity) + ": the groups' rows must fit in the buffers";
  }
  return {};
}

// Groups per chunk for G groups (note 3).
MKERNEL_HOST_DEVICE constexpr uint32_t grouped_groups_per_chunk(uint32_t num_groups) {
  return num_groups <= kGroupedMaxChunks ? 1u : (num_groups + kGroupedMaxChunks - 1) / kGroupedMaxChunks;
}

template <int kClusterM>
struct GroupedTileMap {
  GroupedMapParams p;

  MKERNEL_HOST_DEVICE uint32_t offset(uint32_t g) const {
#if defined(__CUDA_ARCH__)
    return p.coherent ? __ldcg(p.offsets + g) : __ldg(p.offsets + g);
#else
    return p.offsets[g];
#endif
  }
  MKERNEL_HOST_DEVICE static uint32_t m_blocks_of(uint32_t rows) {
    return (rows + kGroupedBlockM - 1) / kGroupedBlockM;
  }
  // Cluster tiles of a group of m_blocks m blocks (note 1): pairs of m blocks times the n blocks,
  // then for an odd count the split tiles of the last m block (pairs of n blocks).
  MKERNEL_HOST_DEVICE uint32_t tiles_of(uint32_t m_blocks) const {
    if (kClusterM == 1) return m_blocks * p.num_n_blocks;
    return m_blocks / 2 * p.num_n_blocks + (m_blocks % 2) * ((p.num_n_blocks + 1) / 2);
  }

  // Totals of chunk c, checking every group's offsets on the way (note 4).
  MKERNEL_HOST_DEVICE GroupedChunkTotals chunk_totals(uint32_t c) const {
    GroupedChunkTotals t;
    const uint32_t g0 = c * p.groups_per_chunk;
    uint32_t g1 = g0 + p.groups_per_chunk;
    if (g1 > p.num_groups) g1 = p.num_groups;
    uint32_t lo = offset(g0);
    for (uint32_t g = g0; g < g1; ++g) {
      const uint32_t hi = offset(g + 1);
      if (hi < lo || hi > p.capacity) {
        t.bad_group = g;
        return t;
      }
      const uint32_t mb = m_blocks_of(hi - lo);
      t.m_blocks += mb;
      t.tiles += tiles_of(mb);
      lo = hi;
    }
    return t;
  }

  // The table after every chunk's totals are in tiles_before[c + 1] / m_blocks_before[c + 1]:
  // prefix sums in place (the device does the same sums with a warp scan).
  MKERNEL_HOST_DEVICE void finish_serial(GroupedTable& t) const {
    t.tiles_before[0] = 0;
    t.m_blocks_before[0] = 0;
    for (uint32_t c = 1; c <= p.num_chunks; ++c) {
      t.tiles_before[c] += t.tiles_before[c - 1];
      t.m_blocks_before[c] += t.m_blocks_before[c - 1];
    }
    t.total_tiles = t.bad_group == kGroupedNoBadGroup ? t.tiles_before[p.num_chunks] : 0;
  }

  // The whole table by one thread (the host, tests).
  MKERNEL_HOST_DEVICE void build_serial(GroupedTable& t) const {
    t.bad_group = kGroupedNoBadGroup;
    for (uint32_t c = 0; c < p.num_chunks; ++c) {
      const GroupedChunkTotals ct = chunk_totals(c);
      t.tiles_before[c + 1] = ct.tiles;
      t.m_blocks_before[c + 1] = ct.m_blocks;
      if (ct.bad_group < t.bad_group) t.bad_group = ct.bad_group;
    }
    finish_serial(t);
  }

  // The last chunk that starts at or before `tile` (tile < t.total_tiles).
  MKERNEL_HOST_DEVICE uint32_t chunk_of(const GroupedTable& t, uint32_t tile) const {
    uint32_t lo = 0, hi = p.num_chunks;  // tiles_before[lo] <= tile < tiles_before[hi]
    while (hi - lo > 1) {
      const uint32_t mid = (lo + hi) / 2;
      if (t.tiles_before[mid] <= tile) {
        lo = mid;
      } else {
        hi = mid;
      }
    }
    return lo;
  }

  // Cluster tile `tile` (< t.total_tiles) for the CTA of rank cta_rank (note 2).
  MKERNEL_HOST_DEVICE GroupedTile locate(const GroupedTable& t, uint32_t tile, uint32_t cta_rank,
                                         GroupCursor& cur) const {
    const uint32_t c = chunk_of(t, tile);
    if (cur.chunk != c || tile < cur.tile_base) {
      cur.chunk = c;
      cur.group = c * p.groups_per_chunk;
      cur.tile_base = t.tiles_before[c];
      cur.m_block_base = t.m_blocks_before[c];
    }
    uint32_t lo = offset(cur.group), hi = offset(cur.group + 1);
    uint32_t mb = m_blocks_of(hi - lo);
    // The table says the tile lies in this chunk, so the walk ends inside it (the bound on the
    // group only matters if the offsets changed during the launch, which the caller must not do).
    while (tile >= cur.tile_base + tiles_of(mb) && cur.group + 1 < p.num_groups) {
      cur.tile_base += tiles_of(mb);
      cur.m_block_base += mb;
      ++cur.group;
      lo = hi;
      hi = offset(cur.group + 1);
      mb = m_blocks_of(hi - lo);
    }
    // Whole m groups in the engine's raster (an even m block count with clusters of 2, so no
    // padding), then the split tiles of an odd last m block.
    const uint32_t paired = kClusterM == 1 ? mb : mb - mb % 2;
    const uint32_t local = tile - cur.tile_base;
    GroupedTile out;
    out.group = cur.group;
    out.split = 0;
    if (local < paired / kClusterM * p.num_n_blocks) {
      TileScheduler<kClusterM> in_group{paired, p.num_n_blocks, 1, p.raster, p.band, 0};
      const TileCoord tc = in_group.tile_coord(local, cta_rank);
      out.m_block = tc.m_block;
      out.n_block = tc.n_block;
    } else {
      out.split = 1;
      out.m_block = mb - 1;
      out.n_block = 2 * (local - paired / kClusterM * p.num_n_blocks) + cta_rank;
    }
    out.row_begin = lo + out.m_block * kGroupedBlockM;
    out.row_end = out.n_block < p.num_n_blocks
                      ? (hi - out.row_begin < kGroupedBlockM ? hi : out.row_begin + kGroupedBlockM)
                      : out.row_begin;
    out.flat_m_block = cur.m_block_base + out.m_block;
    return out;
  }
};

}  // namespace mkernel::kernels
