// tile_scheduler.cuh: the persistent tile scheduler shared by every warp role of a GEMM block.
//
// A work unit is (m group, n block, k split). An m group is kClusterM consecutive m blocks, one
// per CTA of a cluster, which share the same weight tile (loaded once, multicast). Units are
// numbered so that
//   - the k splits of one tile are adjacent (they run in the same wave and finish together);
//   - tiles follow a grouped ("swizzled") raster: bands of `group` m groups (kRasterAlongN) or
//     of `group` n blocks (kRasterAlongM) are completed before the next band starts, so the
//     tiles in flight at any time share rows of A and columns of the weight in L2;
//   - `m_block_offset` rotates the m blocks so a fused kernel can start with the rows whose
//     data is local (ordering by availability) and reach remote rows last.
// Every role (producer, consumers) walks the same unit sequence: block `cluster_idx` takes units
// cluster_idx, cluster_idx + num_clusters, ... so no state is shared through memory.
#pragma once

#include <cstdint>

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

template <int kClusterM>
struct TileScheduler {
  uint32_t num_m_blocks;
  uint32_t num_n_blocks;
  uint32_t num_splits;
  uint32_t raster;
  uint32_t group;
  uint32_t m_group_offset;

  __host__ __device__ uint32_t num_m_groups() const {
    return (num_m_blocks + kClusterM - 1) / kClusterM;
  }
  __host__ __device__ uint32_t num_units() const {
    return num_m_groups() * num_n_blocks * num_splits;
  }

  // Coordinates of unit `unit` for CTA `cta_rank` of its cluster. m_block may reach past the
  // last m block (odd block count with clusters of 2): its A loads are then all out of bounds,
  // TMA fills zeros, and the epilogue writes nothing.
  __device__ __forceinline__ TileCoord get(uint32_t unit, uint32_t cta_rank) const {
    const uint32_t split = unit % num_splits;
    const uint32_t tile = unit / num_splits;
    const uint32_t groups = num_m_groups();
    uint32_t mg, nb;
    if (raster == kRasterAlongN) {
      const uint32_t band = group * num_n_blocks;
      const uint32_t first = (tile / band) * group;
      const uint32_t width = min(group, groups - first);
      const uint32_t in_band = tile % band;
      mg = first + in_band % width;
      nb = in_band / width;
    } else {
      const uint32_t band = group * groups;
      const uint32_t first = (tile / band) * group;
      const uint32_t width = min(group, num_n_blocks - first);
      const uint32_t in_band = tile % band;
      nb = first + in_band % width;
      mg = in_band / width;
    }
    mg += m_group_offset;
    if (mg >= groups) mg -= groups;
    return TileCoord{mg * kClusterM + cta_rank, nb, split};
  }
};

}  // namespace mkernel::kernels
