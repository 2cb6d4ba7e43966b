// sm90_bf16_grouped_gemm.h: host API of the grouped bf16 GEMM (mixture-of-experts layers). The
// device code is the persistent GEMM's (sm90_bf16_gemm.cuh) instantiated with Traits::kGrouped;
// the group -> tile mapping is gemm/sm90_bf16_grouped_gemm_map.h.
//
//   for every group g:  D[r, :] = A[r, :] * W[g]^T   for the rows r in [offsets[g], offsets[g + 1])
//
// Layouts: A row-major [capacity, k], the rows of all groups packed one group after the other;
// W row-major [num_groups, n, k] (each expert's nn.Linear weight, K-major); D row-major
// [capacity, n], packed like A. All bf16, fp32 accumulation. `offsets` (num_groups + 1 entries,
// uint32 or non-negative int32) lives in device memory and may be written by an earlier kernel
// on the same stream: the host never reads it. Group g may be empty (offsets[g] == offsets[g+1]).
//
// Design notes
//  1. Fixed launch. Grid, parameters and tensor maps depend only on host-known bounds (capacity,
//     num_groups, n, k) and the configuration, never on the counts, so one plan can be captured
//     in a CUDA graph and replayed with different counts. Every block reads the offsets at its
//     start (map note 3) and runs the tiles of all groups in one persistent loop.
//  2. Rows past a group's end belong to the next group: they may be loaded (TMA reads a whole
//     128-row box), never stored. Rows in [offsets[G], capacity) are neither read into any output
//     nor written.
//  3. Offsets are checked on the device: decreasing offsets or offsets[G] > capacity run no tile
//     and report kDeviceBadArgument (detail kArgGroupOffsets, step kStepGroupOffsets with the
//     first bad group) in args.wait.status. grouped_gemm_check_offsets does the same check on
//     the host for callers that hold the counts there.
//  4. Determinism: whole tiles only (no split of k), each tile's k loop in the same order, so the
//     same inputs and counts give the same bits whichever block computes a tile.
//  5. Limits (checked by grouped_gemm_plan, message naming the field, the value and what is
//     expected): num_groups >= 1; capacity >= 1; n and k positive multiples of 8 (TMA's 16-byte
//     rows; neither needs to be a multiple of the tile); num_groups * n <= 2^31 - 1025; pointers
//     16-byte aligned, offsets 4-byte aligned; a compute capability 9.0 device.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "gemm/sm90_bf16_gemm.h"
#include "gemm/sm90_bf16_grouped_gemm_map.h"

namespace mkernel::kernels {

// Zero / -1 means "choose" (docs/kernels.md, "Grouped GEMM": the rule and why).
struct GroupedGemmConfig {
  int block_n = 0;          // 128 or 256
  int cluster_m = 0;        // 1, or 2 (two m blocks of one group share each weight tile)
  int raster = -1;          // GemmRaster inside a group
  int band = 0;             // band width of the swizzled raster inside a group
  int num_gemm_blocks = 0;  // blocks that run tiles; 0 = all that fit beside the role blocks
  int num_role_blocks = 0;  // extra blocks that run the launch's role function
  int l2_promotion = -1;    // the operand maps' L2 promotion (GemmConfig::l2_promotion)
};

struct GroupedGemmHooks {
  // Per group: before loading rows of group g, wait (bounded) until group_ready[g] >=
  // ready_value. num_groups entries. A fused MoE kernel raises a group's flag once its rows
  // have arrived, and the group's tiles start then.
  const uint64_t* group_ready = nullptr;
  // Per band of packed rows: row r is ready when ready_flags[r / ready_rows_per_flag] >=
  // ready_value (ceil(capacity / ready_rows_per_flag) entries). A tile waits for the bands of
  // its own rows only. Both hooks may be on at once.
  const uint64_t* ready_flags = nullptr;
  uint32_t ready_rows_per_flag = 128;
  uint64_t ready_value = 0;
  // When set, the value is read from here at the start of the launch instead (a launch counter,
  // so a graph replay waits for its own launch's flags).
  const unsigned long long* ready_value_ptr = nullptr;
  // Raise tile_flags[flat_m_block * num_n_blocks + n_block] = tile_flag_value once the tile's
  // stores are visible at system scope (flat_m_block: map note 5). Length:
  // grouped_gemm_num_tile_flags(args).
  uint64_t* tile_flags = nullptr;
  uint64_t tile_flag_value = 0;
  // Raise mblock_flags[flat_m_block] = tile_flag_value once every n block of the flat m block is
  // stored: one flag for a band of up to 128 rows of all n (a reader that needs whole rows waits
  // on one word instead of num_n_blocks). Needs tile_flags; mblock_counts is the count per flat m
  // block (device memory, zeroed once; GemmParams::mblock_counts). Length of each:
  // grouped_gemm_num_mblock_flags(args).
  uint64_t* mblock_flags = nullptr;
  unsigned long long* mblock_counts = nullptr;
  void* role_args = nullptr;
  const void* role_ptrs[2] = {nullptr, nullptr};
};

struct GroupedGemmArgs {
  const void* a = nullptr;            // bf16 [capacity, k]
  const void* w = nullptr;            // bf16 [num_groups, n, k]
  void* d = nullptr;                  // bf16 [capacity, n]
  const uint32_t* offsets = nullptr;  // device memory, num_groups + 1 entries
  int64_t capacity = 0;               // rows of A and D (an upper bound on offsets[num_groups])
  int64_t num_groups = 0;
  int64_t n = 0, k = 0;
  GroupedGemmConfig config;
  GroupedGemmHooks hooks;
  WaitContext wait{nullptr, nullptr, nullptr, nullptr, 5'000'000'000ull, 0};
};

// A resolved launch. `engine` is the persistent GEMM's plan (parameters, tensor maps, block
// counts): a fused kernel launches launch_sm90_bf16_gemm<GroupedTraits, MyRole>(plan.engine, s)
// with grouped traits of the same block_n / cluster_m.
struct GroupedGemmPlan {
  GroupedGemmArgs args;
  GroupedGemmConfig config;  // no zeros left
  GemmPlan engine;
};

// Validates `args` (note 5) and resolves the configuration for the current device.
[[nodiscard]] GemmResult grouped_gemm_plan(const GroupedGemmArgs& args, GroupedGemmPlan* plan);

// Launches a plan (asynchronous; device-side errors appear in *args.wait.status).
[[nodiscard]] GemmResult grouped_gemm_launch(const GroupedGemmPlan& plan, cudaStream_t stream);

// Plans and launches.
[[nodiscard]] GemmResult grouped_gemm_bf16_tn(const GroupedGemmArgs& args, cudaStream_t stream);

// Points a plan at other buffers of the same shape (re-encodes the tensor maps only).
[[nodiscard]] GemmResult grouped_gemm_rebind(GroupedGemmPlan* plan, const void* a, const void* w, void* d,
                                             const uint32_t* offsets);

// Length of the tile flag array: the most m blocks any counts can give times the n blocks of the
// resolved tile width (0 when args are invalid).
uint64_t grouped_gemm_num_tile_flags(const GroupedGemmArgs& args);
// Entries of hooks.mblock_flags and of hooks.mblock_counts (0: the arguments are out of bounds).
uint64_t grouped_gemm_num_mblock_flags(const GroupedGemmArgs& args);

// Host check of offsets the caller holds in host memory (note 3): non-decreasing, and
// offsets[num_groups] <= capacity. The message names the first bad entry.
[[nodiscard]] GemmResult grouped_gemm_check_offsets(const uint32_t* host_offsets, int64_t num_groups, int64_t capacity);

// "grouped n256 c1 rN b8 blocks132 G128 cap32768" (tile width, cluster, raster, band, blocks, bounds).
std::string grouped_gemm_config_string(const GroupedGemmPlan& plan);

}  // namespace mkernel::kernels
