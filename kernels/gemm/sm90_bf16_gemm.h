// sm90_bf16_gemm.h: host API of the persistent bf16 GEMM (device code: sm90_bf16_gemm.cuh).
//
//   D[m, n] = A[m, k] * W[n, k]^T   (or D += ... with the atomic-add epilogue)
//
// Layouts ("TN" in BLAS terms): A row-major [m, k] (activations, token-major); W row-major
// [n, k], which is how nn.Linear stores its weight; D row-major [m, n]. All bf16; fp32
// accumulation. Leading dimensions are in elements and default to the packed values.
//
// Limits: any m >= 1 (partial tiles are handled in the kernel, not padded by the caller); n and
// k multiples of 8 and every leading dimension a multiple of 8, because TMA needs 16-byte
// aligned rows; pointers 16-byte aligned. Violations return a GemmError with a message naming
// the dimension and the required multiple; nothing is launched.
//
// Errors inside the kernel (a readiness flag or pipeline wait that expired, a ring marked in
// error while waiting) are recorded in the caller's status word (DeviceStatus, common/status.h);
// the kernel then returns early.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/status.h"
#include "common/tile_scheduler.cuh"
#include "gemm/sm90_bf16_gemm_schedule.h"
#include "gemm/sm90_bf16_gemm_params.h"

namespace mkernel::kernels {

enum class GemmError : int {
  kOk = 0,
  kInvalidM,
  kInvalidN,
  kInvalidK,
  kInvalidLeadingDim,
  kInvalidPointer,
  kInvalidConfig,
  kWorkspaceTooSmall,
  kUnsupportedDevice,
  kCudaError,
  kInvalidGroups,  // grouped GEMM: num_groups, capacity or offsets
};

struct GemmResult {
  GemmError code = GemmError::kOk;
  std::string message;
  bool ok() const { return code == GemmError::kOk; }
};

// Tile configuration. Zero (or -1 for raster and stream_k) means "choose for this shape"; the
// choice is the cost model's (gemm/sm90_bf16_gemm_schedule.h, docs/kernels.md "No cliffs").
struct GemmConfig {
  int block_n = 0;          // tile width, one of kGemmBlockWidths: 128 to 256 in steps of 16
                            // (BLOCK_K is 64)
  int block_m = 0;          // tile height: 0 or 128; 192 (three consumer warpgroups; opt-in) or
                            // 256 (opt-in, never chosen by the rule) for plain GEMMs (no hooks,
                            // no role blocks, store epilogue) with a width of kGemmM192Widths or
                            // kGemmTallWidths (128 to 192); 64 (opt-in, never chosen) with
                            // swap_ab = 1 and a width of kGemmSwap64Widths (16 to 64)
  int cluster_m = 0;        // 1, or 2 to share (multicast) each weight tile between two CTAs
  int num_splits = 0;       // uniform split-K: k splits per output tile; 1 = none (and no stream-K)
  int raster = -1;          // GemmRaster
  int group = 0;            // band width of the swizzled raster, in m groups or n blocks
  int num_gemm_blocks = 0;  // blocks that run tiles; 0 = one per SM (less the role blocks)
  int num_role_blocks = 0;  // extra blocks that run the launch's role function
  int stream_k = -1;        // stream-K for the last waves' tiles: 0 never, 1 always, -1 choose
  int sk_units = 0;         // stream-K units (at most the clusters); 0 = choose
  int dp_tiles = -1;        // stream-K, or split-K with num_splits > 1: cluster tiles computed
                            // whole before the stream-K or split region (split-K: 0 or -1 splits
                            // every tile); -1 = choose (a plan's resolved config names it, so
                            // planning again with that config gives the same schedule and
                            // workspace)
  bool widths_128_256 = false;  // block_n = 0 chooses between 128 and 256 only (callers that
                                // instantiate the engine with those two widths: the fused ops)
  // Tiles split by stream-K or split-K are finished through the workspace. true: every work item
  // stores its partial into a slot of its own and the last one sums them in a fixed order, so
  // the same inputs give the same bits on every launch (a larger workspace, one more read per
  // extra part). false: the partials are added into one fp32 accumulator in arrival order
  // (tiles of three or more parts can differ in their last bits from launch to launch).
  bool deterministic = false;
  // Swapped operands: the kernel computes D^T = W A^T and stores it transposed, so the tile's
  // width covers m (any multiple of 16, kGemmSwapWidths) and its 128 rows cover n. Plain GEMMs
  // only (store epilogue, no hooks, no role blocks, 128-row tiles). -1: the rule chooses
  // (docs/kernels.md section 7, "Swapped operands"); 0: never; 1: always. With 1, block_n names
  // a width of kGemmSwapWidths.
  int swap_ab = -1;
  // Programmatic dependent launch (plain GEMMs; ignored for fused roles and grouped GEMMs): the
  // launch may begin while the previous kernel on the stream finishes, and waits for it inside
  // the kernel before touching memory, which hides its launch and prologue in a sequence of
  // launches (a CUDA graph, a model's layers). false: launched after the previous kernel ends.
  bool programmatic_launch = true;
  // Split-K inside a cluster (kGemmClusterKSizes; swapped operands, widths of
  // kGemmSwapClusterKWidths, plain GEMMs): the cluster_k CTAs of a cluster share each tile, each
  // taking a contiguous share of its k blocks, and sum their fp32 partials through distributed
  // shared memory in rank order (bitwise reproducible, no workspace). 0: the rule chooses; 1:
  // never; 2, 4 or 8: always (implies swap_ab = 1; whole tiles, no num_splits or stream-K).
  int cluster_k = 0;
  // Pairs along n (plain GEMMs: store epilogue, no hooks, no role blocks; 128- or 192-row tiles,
  // operands as given or swapped): the two CTAs of a cluster take adjacent n blocks of one m
  // block and share (multicast) its A tile instead of a weight tile. A k block then pulls
  // BLOCK_M / 2 + BLOCK_N rows per CTA instead of BLOCK_M + BLOCK_N / 2, which is fewer where the
  // tile is taller than wide, and an odd m block count pads nothing. 2: always (with cluster_m 0
  // or 1 and cluster_k 0 or 1; the rest is the rule's choice); 0 and 1: never. The rule does not
  // weigh them on its own: measured, they won on some shapes (up to 1.25x) and lost on others by
  // as much, and the cost model could not tell which (docs/kernels.md section 7, "Pairs along n").
  int cluster_n = 0;
  // 2 x 2 clusters (plain GEMMs, 128- or 192-row tiles of a width of kGemmQuadWidths, operands as
  // given or swapped): each CTA loads half of its A tile for its neighbour along n and half of
  // its weight tile for its neighbour along m, so a k block pulls half of both per CTA; clusters
  // of 4 fit 120 of the H200's 132 SMs. 0: never; -1: the rule weighs them (with cluster_m 0 and
  // cluster_n not 2); cluster_m = cluster_n = 2 asks for them. Not weighed by default: measured,
  // they ran up to 1.38x as fast as the rule's choice on some mid-size shapes and slower on most
  // others, and the cost model cannot yet tell which (docs/kernels.md section 7, "2 x 2 clusters").
  int quads = 0;
  // L2 fill size of the operand loads (the TMA maps' L2 promotion): 0 (none: a miss fills the
  // 128-byte lines the box touches), 64, 128 or 256 bytes; -1 = kGemmDefaultL2Promotion.
  int l2_promotion = -1;
};

// The operand maps' L2 promotion when GemmConfig::l2_promotion is -1 (docs/kernels.md section 7,
// "The load path").
inline constexpr int kGemmDefaultL2Promotion = 128;

struct GemmHooks {
  // Ordering by availability: before loading a tile's A rows, wait until every flag covering
  // them is >= ready_value. Row g is covered by flag
  //   (g / ready_shard_rows) * ceil(ready_shard_rows / ready_rows_per_flag)
  //     + (g % ready_shard_rows) / ready_rows_per_flag
  // i.e. A is a stack of shards of ready_shard_rows rows (0: one shard, all of A), each flagged
  // in chunks of ready_rows_per_flag rows. Both any positive value: a shard boundary may fall
  // inside a tile, whose producer then waits for the chunks of both shards.
  const uint64_t* ready_flags = nullptr;
  uint64_t ready_value = 0;
  // When set, the value is read from here at the start of the launch instead (a launch counter
  // in device memory, so a CUDA graph replay waits for its own launch's flags).
  const unsigned long long* ready_value_ptr = nullptr;
  uint32_t ready_rows_per_flag = 128;
  uint32_t ready_shard_rows = 0;
  // Rows [local_rows_begin, local_rows_end) of A are also held at a_local (row-major, pitch
  // lda, its row 0 being A's row local_rows_begin): tiles that lie entirely inside load from
  // there and do not wait (AllGather+GEMM: the rank's own shard, before it is copied into the
  // gathered buffer). a_local == nullptr: none.
  const void* a_local = nullptr;
  int64_t local_rows_begin = 0, local_rows_end = 0;
  // Rotate the m blocks so that tiles of these rows come first (e.g. the locally held rows).
  uint32_t first_m_block = 0;
  // Raise tile_flags[m_block * num_n_blocks + n_block] = tile_flag_value after the tile's
  // stores are visible at system scope. Array length: gemm_num_tiles().
  uint64_t* tile_flags = nullptr;
  uint64_t tile_flag_value = 0;
  void* role_args = nullptr;
  const void* role_ptrs[2] = {nullptr, nullptr};
};

struct GemmArgs {
  const void* a = nullptr;  // bf16 [m, lda]
  const void* w = nullptr;  // bf16 [n, ldw]
  void* d = nullptr;        // bf16 [m, ldd]
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldw = 0, ldd = 0;  // 0 = packed
  GemmEpilogue epilogue = kEpilogueStore;
  GemmConfig config;
  GemmHooks hooks;
  // Split-K scratch (gemm_workspace_bytes). Zero it once after allocation; the kernel leaves it
  // zeroed again, except after a launch that reported an error status.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  // Errors (common/wait.cuh): the status word the first error goes to (may be null), the words
  // that end a wait early (a ring's error word, a peer-abort word) and the bound of every wait.
  WaitContext wait{nullptr, nullptr, nullptr, nullptr, 5'000'000'000ull, 0};
};

// Everything a launch needs, resolved: the configuration actually used, the kernel parameters
// and the tensor maps. Fused kernels build one with gemm_plan and launch the kernel template
// with their own role (sm90_bf16_gemm_launch.cuh).
struct GemmPlan {
  GemmArgs args;      // what it was planned for (gemm_rebind changes the pointers only)
  GemmConfig config;  // no zeros left
  GemmSchedule schedule;  // the work decomposition and the model's prediction for it
  int num_stages = 0;
  GemmEpilogue epilogue = kEpilogueStore;
  GemmParams params{};
  CUtensorMap tma_a{};
  CUtensorMap tma_b{};
  CUtensorMap tma_d{};  // output, 64 x 64 boxes (store epilogue; unused by atomic add); with
                        // swapped operands 16 rows x 64 columns (transposed tiles)
  CUtensorMap tma_a_local{};  // A's locally held rows (GemmHooks::a_local), else a copy of tma_a
};

// Validates `args` and resolves the configuration for the current device.
[[nodiscard]] GemmResult gemm_plan(const GemmArgs& args, GemmPlan* plan);

// Stream-K / split-K scratch the plan for `args` needs (0 when no tile is split).
size_t gemm_workspace_bytes(const GemmArgs& args);

// Number of output tiles (length of the tile flag array).
uint32_t gemm_num_tiles(const GemmArgs& args);

// Plans and launches on `stream`. Asynchronous: device-side errors appear in *args.status.
[[nodiscard]] GemmResult gemm_bf16_tn(const GemmArgs& args, cudaStream_t stream);

// Points an existing plan at other operands of the same shape and layout: checks the pointers
// and re-encodes the tensor maps, nothing else (cheap enough for every call of a fused op).
// a_local may be null only when the plan was made without one.
[[nodiscard]] GemmResult gemm_rebind(GemmPlan* plan, const void* a, const void* w, void* d, const void* a_local);

// Launches an existing plan (no re-validation); for repeated launches of one shape.
[[nodiscard]] GemmResult gemm_launch(const GemmPlan& plan, cudaStream_t stream);

// Human-readable description of a resolved configuration, e.g. "n256 c2 s1 rN g8 b132 sk66/90t"
// (the last word: dp = data-parallel, skU/Tt = U stream-K units over T tiles, splitkS); "T"
// first for swapped operands ("T n16 c1 ...": the width covers m).
std::string gemm_config_string(const GemmPlan& plan);

}  // namespace mkernel::kernels
