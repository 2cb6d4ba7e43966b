// sm90_bf16_gemm_params.h: the launch parameters of the persistent bf16 GEMM, shared by the
// device code (sm90_bf16_gemm.cuh) and its host launcher (sm90_bf16_gemm.cu). Plain data only.
#pragma once

#include <cstdint>

#include "common/split_control.h"
#include "common/wait.cuh"
#include "gemm/sm90_bf16_grouped_gemm_map.h"

namespace mkernel::kernels {

// What the epilogue does with a finished 128 x BLOCK_N tile. The output pointer may be local or
// a peer GPU's buffer mapped into this process (IPC / VMM); the instructions are the same.
enum GemmEpilogue : uint32_t {
  kEpilogueStore = 0,      // D = A * W^T (bf16, round to nearest)
  kEpilogueAtomicAdd = 1,  // D += A * W^T with packed bf16x2 atomic adds (reductions into a peer)
};

struct GemmParams {
  // Problem: D[m, n] = A[m, k] * W[n, k]^T. A and W travel as TMA tensor maps (kernel
  // arguments); D is written with ordinary stores at row pitch ldd (elements).
  uint32_t m, n, k;
  uint32_t ldd;
  void* d;

  // Schedule (common/tile_scheduler.cuh explains the decomposition).
  uint32_t num_m_blocks, num_n_blocks, num_k_blocks;
  uint32_t num_splits;          // uniform split-K: k splits per tile (1 = none), as sk_per_tile
  uint32_t k_blocks_per_split;  // uniform split-K: the most k blocks one split gets
  uint32_t raster, group, m_group_offset;
  uint32_t num_gemm_blocks;     // blocks [0, num_gemm_blocks) run GEMM tiles; the rest run Role
  // The adaptive split (common/split_control.h), or null; read only by roles with
  // kAdaptiveSplit (the role contract in sm90_bf16_gemm.cuh). When set, every block reads this
  // launch's split from it at its start (num_gemm_blocks is then gridDim.x less its
  // communication blocks), the GEMM blocks' producers add their readiness waits, and every
  // block stamps when its role's work was done; the role's last block (block_exit) ends the
  // launch's measurement (split_launch_end). The decomposition (dp_tiles, sk_units, splits) is
  // the plan's whatever the split, so results do not depend on it.
  SplitControl* split;
  // Cluster tiles [0, dp_tiles) are computed whole, in waves; the k iterations of the others are
  // cut into sk_units units: balanced over all of them (sk_per_tile == 0, stream-K) or
  // sk_per_tile units per tile (split-K). sk_units == 0: data-parallel only.
  uint32_t dp_tiles;
  uint32_t sk_units;
  uint32_t sk_per_tile;

  // Fix-up of tiles covered by several units (tile_scheduler.cuh, notes 3 and 4): one fp32
  // accumulator tile and one arrival counter per CTA of each stream-K tile (zero before the
  // first launch; the last participant of a tile zeroes both, so they stay zero between
  // launches).
  float* split_workspace;
  uint32_t* split_counters;
  // 1: deterministic fix-up. Every work item of a split tile stores its partial into a slot of
  // its own (slot = unit + tile - dp_tiles, per CTA of the cluster) and the last to arrive sums
  // the tile's slots in unit order, so the result is bitwise the same whichever arrives last.
  // 0: every participant adds into one accumulator (fp32 reductions in L2, arrival order).
  uint32_t split_slots;

  // Hook: ordering by availability (GemmHooks). Row g of A is ready when
  //   ready_flags[(g / ready_shard_rows) * ready_chunks_per_shard + (g % ready_shard_rows) /
  //               ready_rows_per_flag] >= ready_value;
  // before loading a tile's A rows the producer waits for every flag covering them
  // (ready_flags == nullptr: no wait). Tiles whose rows all lie in [local_rows_begin,
  // local_rows_end) load from the fourth tensor map (A's locally held rows) and never wait.
  const uint64_t* ready_flags;
  uint64_t ready_value;
  const unsigned long long* ready_value_ptr;  // when set, ready_value is *ready_value_ptr (a launch counter)
  uint32_t ready_rows_per_flag;
  uint32_t ready_shard_rows;
  uint32_t ready_chunks_per_shard;
  uint32_t local_rows_begin, local_rows_end;

  // Hook: per-tile completion flag. After a tile's stores are visible system-wide,
  // tile_flags[m_block * num_n_blocks + n_block] = tile_flag_value (nullptr: no flags).
  uint64_t* tile_flags;
  uint64_t tile_flag_value;
  const unsigned long long* tile_flag_value_ptr;  // when set, tile_flag_value is *tile_flag_value_ptr (a launch counter)
  // Grouped only: mblock_flags[flat_m_block] = tile_flag_value once every n block of that flat m
  // block is stored (after the tiles' own flags; nullptr: none). mblock_counts: one word per
  // flat m block, (low 32 bits of the flag value) << 32 | tiles stored
  // (grouped_mblock_count_next: a word an aborted launch of another value left counts as zero).
  uint64_t* mblock_flags;
  unsigned long long* mblock_counts;

  // Grouped GEMM only (Traits::kGrouped; gemm/sm90_bf16_grouped_gemm.h): the groups, read from
  // device memory at the start of the launch (sm90_bf16_grouped_gemm_map.h), and the per-group
  // readiness hook: before loading rows of group g, wait until group_ready_flags[g] >= the ready
  // value (nullptr: no wait). The row readiness above applies too, with packed row indices.
  // Weight rows of group g start at row g * n of W's [num_groups * n, k] tensor map.
  GroupedMapParams grouped;
  const uint64_t* group_ready_flags;
  // When set, every GEMM block waits until *grouped_offsets_ready >= the ready value before it
  // reads the offsets: a fused kernel whose other blocks write them during the launch (they are
  // then read with coherent loads, GroupedMapParams::coherent).
  const uint64_t* grouped_offsets_ready;

  // Errors: where the first error of the launch goes, what else ends a wait, and the bound on
  // every wait (common/wait.cuh).
  WaitContext wait;

  // Opaque argument for the role function of blocks >= num_gemm_blocks (device memory the host
  // prepared once), and pointers that change from launch to launch (kernel parameters, so a
  // CUDA graph captures them).
  void* role_args;
  const void* role_ptrs[4];
};

}  // namespace mkernel::kernels
