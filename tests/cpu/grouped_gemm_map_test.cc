// The grouped GEMM's group -> tile mapping (kernels/gemm/sm90_bf16_grouped_gemm_map.h), the same
// __host__ __device__ code the kernel runs, replayed on the CPU against a plain enumeration of
// every group's tiles: random counts, empty groups, one group holding all rows, G = 1 and
// G = 1024 (and more), both cluster sizes, both rasters; offsets that the device must reject,
// and the host's argument checks with their messages.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "gemm/sm90_bf16_grouped_gemm_map.h"

namespace mk = mkernel::kernels;

namespace {

struct Layout {
  uint32_t num_n_blocks = 8;
  uint32_t raster = mk::kRasterAlongN;
  uint32_t band = 8;
};

mk::GroupedMapParams params_for(const std::vector<uint32_t>& offsets, uint32_t capacity, const Layout& l) {
  const uint32_t groups = static_cast<uint32_t>(offsets.size() - 1);
  const uint32_t per_chunk = mk::grouped_groups_per_chunk(groups);
  return mk::GroupedMapParams{offsets.data(), groups, capacity,  l.num_n_blocks,
                              l.raster,       l.band, per_chunk, (groups + per_chunk - 1) / per_chunk, 0u};
}

std::vector<uint32_t> offsets_from_counts(const std::vector<uint32_t>& counts, uint32_t first = 0) {
  std::vector<uint32_t> off(counts.size() + 1, first);
  for (size_t g = 0; g < counts.size(); ++g) off[g + 1] = off[g] + counts[g];
  return off;
}

// Every CTA tile of the launch, looked up in schedule order with one cursor (as a block that
// ran every tile would), checked against the enumeration; then again with the strided walks of
// `clusters` clusters, each with its own cursor (as the kernel's blocks do), which must agree.
template <int kClusterM>
void check_mapping(const std::vector<uint32_t>& offsets, uint32_t capacity, const Layout& l, uint32_t clusters = 66) {
  SCOPED_TRACE("G=" + std::to_string(offsets.size() - 1) + " cap=" + std::to_string(capacity) +
               " cluster=" + std::to_string(kClusterM) + " nb=" + std::to_string(l.num_n_blocks) +
               " raster=" + std::to_string(l.raster) + " band=" + std::to_string(l.band));
  const mk::GroupedTileMap<kClusterM> map{params_for(offsets, capacity, l)};
  const uint32_t groups = map.p.num_groups;
  ASSERT_LE(map.p.num_chunks, mk::kGroupedMaxChunks);
  mk::GroupedTable table{};
  map.build_serial(table);
  ASSERT_EQ(table.bad_group, mk::kGroupedNoBadGroup);

  // The enumeration: group g has ceil(m_g / 128) m blocks; with clusters of 2, pairs of them
  // times the n blocks, and an odd last one in split tiles over pairs of n blocks.
  uint64_t expect_tiles = 0, m_blocks_total = 0;
  std::vector<uint32_t> flat_base(groups + 1, 0);
  for (uint32_t g = 0; g < groups; ++g) {
    const uint32_t mb = (offsets[g + 1] - offsets[g] + 127) / 128;
    expect_tiles += kClusterM == 1
                        ? static_cast<uint64_t>(mb) * l.num_n_blocks
                        : static_cast<uint64_t>(mb / 2) * l.num_n_blocks + (mb % 2) * ((l.num_n_blocks + 1) / 2);
    flat_base[g + 1] = flat_base[g] + mb;
    m_blocks_total += mb;
  }
  ASSERT_EQ(table.total_tiles, expect_tiles);
  ASSERT_LE(m_blocks_total, mk::grouped_max_m_blocks(capacity, groups));
  ASSERT_EQ(table.m_blocks_before[map.p.num_chunks], m_blocks_total);

  // One cursor over all tiles.
  std::map<std::tuple<uint32_t, uint32_t, uint32_t>, int> seen;  // (group, m block, n block)
  std::set<uint64_t> flags;
  std::vector<mk::GroupedTile> by_tile(static_cast<size_t>(table.total_tiles) * kClusterM);
  uint64_t padding = 0;
  mk::GroupCursor cur;
  uint32_t last_group = 0;
  for (uint32_t t = 0; t < table.total_tiles; ++t) {
    for (uint32_t rank = 0; rank < static_cast<uint32_t>(kClusterM); ++rank) {
      const mk::GroupedTile gt = map.locate(table, t, rank, cur);
      by_tile[static_cast<size_t>(t) * kClusterM + rank] = gt;
      ASSERT_LT(gt.group, groups);
      ASSERT_GE(gt.group, last_group) << "tiles run group by group";
      last_group = gt.group;
      const uint32_t lo = offsets[gt.group], hi = offsets[gt.group + 1];
      ASSERT_LT(lo, hi) << "an empty group has no tiles";
      ASSERT_EQ(gt.row_begin, lo + gt.m_block * 128);
      ASSERT_LT(gt.row_begin, hi);
      if (gt.rows() == 0) {
        // A padding CTA: the second half of the last split tile when the n blocks are odd.
        ASSERT_EQ(kClusterM, 2);
        ASSERT_EQ(rank, 1u);
        ASSERT_EQ(gt.split, 1u);
        ASSERT_EQ(gt.n_block, l.num_n_blocks);
        ASSERT_EQ(l.num_n_blocks % 2, 1u);
        ++padding;
        continue;
      }
      ASSERT_LT(gt.n_block, l.num_n_blocks);
      if (gt.split) {
        ASSERT_EQ(kClusterM, 2) << "split tiles only with clusters of 2";
        ASSERT_EQ(gt.m_block, (hi - lo + 127) / 128 - 1) << "only an odd last m block is split";
        ASSERT_EQ((hi - lo + 127) / 128 % 2, 1u);
      }
      ASSERT_LE(gt.row_end, hi) << "a tile must not own rows of the next group";
      ASSERT_EQ(gt.row_end, std::min(gt.row_begin + 128, hi));
      ASSERT_EQ(gt.flat_m_block, flat_base[gt.group] + gt.m_block);
      ASSERT_LT(gt.flat_m_block, mk::grouped_max_m_blocks(capacity, groups));
      ASSERT_TRUE(flags.insert(static_cast<uint64_t>(gt.flat_m_block) * l.num_n_blocks + gt.n_block).second)
          << "two tiles share a flag";
      ++seen[{gt.group, gt.m_block, gt.n_block}];
    }
    if (kClusterM == 2) {
      const mk::GroupedTile a = by_tile[static_cast<size_t>(t) * 2], b = by_tile[static_cast<size_t>(t) * 2 + 1];
      ASSERT_EQ(a.group, b.group) << "a cluster's CTAs are in one group";
      ASSERT_EQ(a.split, b.split);
      if (a.split) {
        ASSERT_EQ(a.m_block, b.m_block);
        ASSERT_EQ(b.n_block, a.n_block + 1);
        ASSERT_EQ(a.n_block % 2, 0u);
      } else {
        ASSERT_EQ(a.n_block, b.n_block) << "the CTAs share (multicast) the weight tile";
        ASSERT_EQ(b.m_block, a.m_block + 1);
      }
    }
  }
  uint64_t expect_padding = 0;
  for (uint32_t g = 0; g < groups; ++g) {
    const uint32_t mb = (offsets[g + 1] - offsets[g] + 127) / 128;
    if (kClusterM == 2 && mb % 2 == 1) expect_padding += l.num_n_blocks % 2;
    for (uint32_t m = 0; m < mb; ++m)
      for (uint32_t n = 0; n < l.num_n_blocks; ++n) {
        auto it = seen.find({g, m, n});
        ASSERT_TRUE(it != seen.end()) << "tile (" << g << ", " << m << ", " << n << ") never visited";
        ASSERT_EQ(it->second, 1) << "tile (" << g << ", " << m << ", " << n << ") visited twice";
      }
  }
  ASSERT_EQ(seen.size(), m_blocks_total * l.num_n_blocks);
  ASSERT_EQ(padding, expect_padding);

  // Strided walks, one cursor per cluster and role; and fresh cursors.
  for (uint32_t c = 0; c < clusters; ++c) {
    for (uint32_t rank = 0; rank < static_cast<uint32_t>(kClusterM); ++rank) {
      mk::GroupCursor cc;
      for (uint32_t t = c; t < table.total_tiles; t += clusters) {
        const mk::GroupedTile gt = map.locate(table, t, rank, cc);
        const mk::GroupedTile& want = by_tile[static_cast<size_t>(t) * kClusterM + rank];
        ASSERT_EQ(gt.group, want.group);
        ASSERT_EQ(gt.m_block, want.m_block);
        ASSERT_EQ(gt.n_block, want.n_block);
        ASSERT_EQ(gt.flat_m_block, want.flat_m_block);
        mk::GroupCursor fresh;
        const mk::GroupedTile f = map.locate(table, t, rank, fresh);
        ASSERT_EQ(f.row_begin, want.row_begin);
        ASSERT_EQ(f.row_end, want.row_end);
      }
    }
  }
}

void check_both(const std::vector<uint32_t>& offsets, uint32_t capacity, const Layout& l) {
  check_mapping<1>(offsets, capacity, l);
  check_mapping<2>(offsets, capacity, l);
}

std::vector<uint32_t> random_counts(std::mt19937_64& rng, uint32_t groups, uint32_t total, double zipf) {
  // Rows routed one by one to groups drawn with weight 1 / (g + 1)^zipf (0: uniform).
  std::vector<double> w(groups);
  for (uint32_t g = 0; g < groups; ++g) w[g] = 1.0 / std::pow(g + 1.0, zipf);
  std::discrete_distribution<uint32_t> pick(w.begin(), w.end());
  std::vector<uint32_t> counts(groups, 0);
  for (uint32_t r = 0; r < total; ++r) ++counts[pick(rng)];
  std::shuffle(counts.begin(), counts.end(), rng);
  return counts;
}

TEST(GroupedGemmMap, RandomCounts) {
  std::mt19937_64 rng(20261201);
  for (int iter = 0; iter < 40; ++iter) {
    const uint32_t groups = std::vector<uint32_t>{1, 2, 3, 7, 64, 128, 129, 200, 1024}[iter % 9];
    const uint32_t total = static_cast<uint32_t>(rng() % 20000);
    const double zipf = iter % 2 ? 1.1 : 0.0;
    const auto counts = random_counts(rng, groups, total, zipf);
    const uint32_t slack = static_cast<uint32_t>(rng() % 300);
    Layout l;
    l.num_n_blocks = std::vector<uint32_t>{1, 8, 28, 3}[iter % 4];
    l.raster = iter % 3 == 0 ? mk::kRasterAlongM : mk::kRasterAlongN;
    l.band = std::vector<uint32_t>{8, 1, 3}[iter % 3];
    const auto off = offsets_from_counts(counts);
    check_both(off, total + slack + 1, l);
  }
}

TEST(GroupedGemmMap, EmptyGroups) {
  Layout l;
  // Every other group empty, runs of empty groups, empty first and last groups.
  std::vector<uint32_t> counts = {0, 5, 0, 0, 0, 128, 0, 129, 0, 0, 300, 0};
  check_both(offsets_from_counts(counts), 1000, l);
  // All groups empty: no tile at all.
  std::vector<uint32_t> none(17, 0);
  const auto off = offsets_from_counts(none);
  const mk::GroupedTileMap<1> map{params_for(off, 64, l)};
  mk::GroupedTable t{};
  map.build_serial(t);
  EXPECT_EQ(t.total_tiles, 0u);
  EXPECT_EQ(t.bad_group, mk::kGroupedNoBadGroup);
  // 1000 groups, 990 of them empty, over several chunks.
  std::mt19937_64 rng(7);
  std::vector<uint32_t> sparse(1000, 0);
  for (int i = 0; i < 10; ++i) sparse[rng() % 1000] = 1 + static_cast<uint32_t>(rng() % 700);
  uint32_t total = 0;
  for (uint32_t c : sparse) total += c;
  check_both(offsets_from_counts(sparse), total, l);
}

TEST(GroupedGemmMap, OneGroupHoldsAllRows) {
  Layout l;
  for (uint32_t groups : {2u, 128u, 1024u}) {
    for (uint32_t which : {0u, groups / 2, groups - 1}) {
      std::vector<uint32_t> counts(groups, 0);
      counts[which] = 32768 - 3;
      check_both(offsets_from_counts(counts), 32768, l);
    }
    // Nearly all rows in one group, a few rows scattered over the rest.
    std::vector<uint32_t> counts(groups, 0);
    counts[groups / 3] = 30000;
    for (uint32_t g = 0; g < groups; g += 5) counts[g] += 1;
    uint32_t total = 0;
    for (uint32_t c : counts) total += c;
    check_both(offsets_from_counts(counts), total, l);
  }
}

TEST(GroupedGemmMap, SingleGroup) {
  Layout l;
  for (uint32_t m : {1u, 127u, 128u, 129u, 255u, 256u, 257u, 4096u, 5000u}) {
    check_both({0, m}, m, l);
    check_both({0, m}, m + 1000, l);
  }
  // A first offset that is not 0: rows before it belong to no group.
  check_both({100, 400}, 512, l);
}

TEST(GroupedGemmMap, ManyGroups) {
  std::mt19937_64 rng(99);
  Layout l;
  for (uint32_t groups : {1024u, 1025u, 4096u}) {
    const auto counts = random_counts(rng, groups, 16384 * 8 / 4, groups == 1024 ? 1.1 : 0.0);
    uint32_t total = 0;
    for (uint32_t c : counts) total += c;
    const auto off = offsets_from_counts(counts);
    const mk::GroupedTileMap<1> map{params_for(off, total, l)};
    EXPECT_LE(map.p.num_chunks, mk::kGroupedMaxChunks);
    EXPECT_EQ(map.p.groups_per_chunk, (groups + 127) / 128);
    check_both(off, total, l);
  }
}

TEST(GroupedGemmMap, ChunkTotalsAddUp) {
  // The device sums chunks in parallel and scans them; every chunk's totals, added in any order,
  // give the serial table.
  std::mt19937_64 rng(5);
  Layout l;
  const auto counts = random_counts(rng, 1000, 50000, 1.1);
  const auto off = offsets_from_counts(counts);
  const mk::GroupedTileMap<2> map{params_for(off, 50000, l)};
  mk::GroupedTable serial{};
  map.build_serial(serial);
  mk::GroupedTable par{};
  par.bad_group = mk::kGroupedNoBadGroup;
  std::vector<uint32_t> order(map.p.num_chunks);
  for (uint32_t c = 0; c < map.p.num_chunks; ++c) order[c] = c;
  std::shuffle(order.begin(), order.end(), rng);
  for (uint32_t c : order) {
    const auto ct = map.chunk_totals(c);
    par.tiles_before[c + 1] = ct.tiles;
    par.m_blocks_before[c + 1] = ct.m_blocks;
  }
  map.finish_serial(par);
  for (uint32_t c = 0; c <= map.p.num_chunks; ++c) {
    EXPECT_EQ(par.tiles_before[c], serial.tiles_before[c]);
    EXPECT_EQ(par.m_blocks_before[c], serial.m_blocks_before[c]);
  }
  EXPECT_EQ(par.total_tiles, serial.total_tiles);
}

TEST(GroupedGemmMap, TotalPastCapacityIsRejected) {
  Layout l;
  // offsets[G] = 1001 > capacity 1000: the device runs no tile and names the first group whose
  // rows pass the capacity.
  const std::vector<uint32_t> off = {0, 300, 600, 900, 1001, 1001};
  const mk::GroupedTileMap<1> map{params_for(off, 1000, l)};
  mk::GroupedTable t{};
  map.build_serial(t);
  EXPECT_EQ(t.bad_group, 3u);
  EXPECT_EQ(t.total_tiles, 0u);
  const std::string e = mk::grouped_offsets_error(off.data(), 5, 1000);
  EXPECT_NE(e.find("offsets[5] = 1001 exceeds capacity = 1000"), std::string::npos) << e;
  EXPECT_EQ(mk::grouped_offsets_error(off.data(), 5, 1001), "");
  // The same over many chunks (G = 1024): the bad group is found in its chunk.
  std::vector<uint32_t> counts(1024, 10);
  auto big = offsets_from_counts(counts);
  const mk::GroupedTileMap<2> map2{params_for(big, 10239, l)};
  map2.build_serial(t);
  EXPECT_EQ(t.bad_group, 1023u);
  EXPECT_EQ(t.total_tiles, 0u);
}

TEST(GroupedGemmMap, DecreasingOffsetsAreRejected) {
  Layout l;
  const std::vector<uint32_t> off = {0, 300, 200, 400};
  const mk::GroupedTileMap<1> map{params_for(off, 1000, l)};
  mk::GroupedTable t{};
  map.build_serial(t);
  EXPECT_EQ(t.bad_group, 1u);
  EXPECT_EQ(t.total_tiles, 0u);
  const std::string e = mk::grouped_offsets_error(off.data(), 3, 1000);
  EXPECT_NE(e.find("offsets[2] = 200 is less than offsets[1] = 300"), std::string::npos) << e;
}

TEST(GroupedGemmMap, HostBoundsChecks) {
  EXPECT_EQ(mk::grouped_bounds_error(32768, 128, 2048, 7168, 256), "");
  EXPECT_EQ(mk::grouped_bounds_error(1, 1, 8, 8, 128), "");
  auto has = [](const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; };
  std::string e = mk::grouped_bounds_error(32768, 0, 2048, 7168, 256);
  EXPECT_TRUE(has(e, "num_groups = 0 is not supported")) << e;
  e = mk::grouped_bounds_error(0, 128, 2048, 7168, 256);
  EXPECT_TRUE(has(e, "capacity = 0 is not supported")) << e;
  e = mk::grouped_bounds_error(32768, 128, 2044, 7168, 256);
  EXPECT_TRUE(has(e, "n = 2044 is not supported: it must be a positive multiple of 8")) << e;
  e = mk::grouped_bounds_error(32768, 128, 2048, 7100, 256);
  EXPECT_TRUE(has(e, "k = 7100 is not supported")) << e;
  e = mk::grouped_bounds_error(32768, 1 << 20, 4096, 64, 256);
  EXPECT_TRUE(has(e, "num_groups * n = ")) << e;
  e = mk::grouped_bounds_error((int64_t{1} << 31) - 1, 1024, 65536, 64, 128);
  EXPECT_TRUE(has(e, "tile indices are 32-bit")) << e;
}

TEST(GroupedGemmMap, MaxMBlocksBound) {
  // Whatever the counts, the m blocks never exceed the bound the host sizes flag arrays with.
  std::mt19937_64 rng(11);
  for (int iter = 0; iter < 200; ++iter) {
    const uint32_t groups = 1 + static_cast<uint32_t>(rng() % 300);
    const uint32_t cap = 1 + static_cast<uint32_t>(rng() % 5000);
    std::vector<uint32_t> cuts(groups - 1);
    for (auto& c : cuts) c = static_cast<uint32_t>(rng() % (cap + 1));
    std::sort(cuts.begin(), cuts.end());
    std::vector<uint32_t> off = {0};
    off.insert(off.end(), cuts.begin(), cuts.end());
    off.push_back(cap);
    uint64_t mb = 0;
    for (uint32_t g = 0; g < groups; ++g) mb += (off[g + 1] - off[g] + 127) / 128;
    ASSERT_LE(mb, mk::grouped_max_m_blocks(cap, groups)) << "G=" << groups << " cap=" << cap;
  }
}

TEST(GroupedGemmMap, MBlockCountWord) {
  // The per-m-block count (hooks.mblock_counts): a launch's n blocks, counted in any order,
  // complete the band exactly once, by the last tile, starting from what an earlier launch (of
  // the same value or another) or an aborted one (another value) left in the word.
  for (const uint32_t n_blocks : {1u, 2u, 56u}) {
    for (const unsigned long long start : {0ull, (5ull << 32) | 3ull, 77ull << 32, (78ull << 32) | 1ull}) {
      unsigned long long w = start;
      for (const uint64_t value : {77ull, 77ull, 78ull, (1ull << 32) + 79ull}) {
        uint32_t completed = 0, at = 0;
        for (uint32_t t = 0; t < n_blocks; ++t) {
          w = mk::grouped_mblock_count_next(w, value, n_blocks);
          if ((w & 0xffffffffull) == 0) ++completed, at = t;
        }
        EXPECT_EQ(completed, 1u) << "n_blocks " << n_blocks << " start " << start << " value " << value;
        EXPECT_EQ(at, n_blocks - 1);
        EXPECT_EQ(w, (value & 0xffffffffull) << 32);
      }
    }
  }
}

}  // namespace
