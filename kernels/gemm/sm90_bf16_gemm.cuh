// sm90_bf16_gemm.cuh: persistent, warp-specialised bf16 GEMM for Hopper (sm_90a).
//
//   D[m, n] = A[m, k] * W[n, k]^T      A row-major, W row-major [n, k] (nn.Linear's weight),
//                                      fp32 accumulation, D bf16 row-major.
//
// Block = 3 warpgroups (384 threads), one block per SM, grid = persistent.
//   warpgroup 0   producer: one thread issues TMA loads of A (128 x 64) and W (BLOCK_N x 64)
//                 tiles into a kStages-deep ring of shared-memory stages; each stage completes
//                 on a "full" mbarrier and is handed back on an "empty" mbarrier.
//   warpgroups 1,2 consumers: each owns 64 rows of the 128-row tile and issues m64nBLOCK_Nk16
//                 wgmma from shared memory, keeping one k-block of wgmma in flight; then the
//                 epilogue stages its 64 x BLOCK_N slice in shared memory and stores it with
//                 TMA, overlapped with the next tile (or adds it from registers with atomics).
//                 Plain GEMMs may also use 256-row tiles (Traits::kBlockM): each consumer then
//                 owns two 64-row sub-tiles and issues two wgmma per k step.
// With kClusterM == 2 the two CTAs of a cluster work on vertically adjacent tiles with the same
// weight tile: each loads half of it and multicasts it to both, halving weight traffic into
// shared memory; a stage is free again only when the consumers of both CTAs released it. With
// kClusterN == 2 (plain GEMMs) the pair works on horizontally adjacent tiles with the same A tile
// and multicasts halves of that instead: fewer bytes where A's tile is the larger one (192-row
// tiles, swapped narrow tiles) or where the m blocks are odd and the n blocks even. Both at once
// (2 x 2 clusters, plain GEMMs): each CTA loads half of its A tile for its n neighbour and half of
// its weight tile for its m neighbour, so a k block pulls half of both operands per CTA.
// Work: whole tiles in waves, then stream-K or split-K units over the k blocks of the remaining
// tiles (common/tile_scheduler.cuh); a tile shared by several units is finished by the last of
// them to arrive, through an fp32 accumulator in the workspace (detail::fixup). The choice of
// tile width, cluster size and decomposition is the host's (gemm/sm90_bf16_gemm_schedule.h).
//
// Hooks for fused kernels (all off by default, see GemmParams): a bounded wait on an input
// readiness flag before a tile's loads, a role split (blocks past num_gemm_blocks run
// Role::run), the atomic-add epilogue and a per-tile flag raised after the stores are visible.
//
// Grouped instantiations (Traits::kGrouped, gemm/sm90_bf16_grouped_gemm.h) run the same
// pipeline over the tiles of many groups (experts): every block reads the groups' offsets at its
// start and builds a small table in shared memory (gemm/sm90_bf16_grouped_gemm_map.h); a tile's
// A rows are its group's packed rows, its weight tile comes from the group's [n, k] slice of a
// [groups * n, k] map, and the epilogue stores only rows inside the group (whole 64-row halves
// with TMA, a partial half through shared memory with masked 16-byte stores). Whole tiles only
// (no stream-K), so the results are bitwise reproducible.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <type_traits>

#include "common/phase_trace.cuh"
#include "common/ptx.cuh"
#include "common/status.h"
#include "common/split_control.cuh"
#include "common/tile_scheduler.cuh"
#include "common/wait.cuh"
#include "common/wgmma.cuh"
#include "mkernel/protocol/sync.cuh"
#include "gemm/sm90_bf16_gemm_fixup.cuh"
#include "gemm/sm90_bf16_gemm_params.h"

namespace mkernel::kernels {

// The role contract. A fused kernel instantiates the GEMM kernel with its own Role:
//   run(p, role_block, num_role_blocks)
//       called by all threads of every block past p.num_gemm_blocks (the role blocks); the
//       block's whole shared memory (T::kSmemBytes, 1024-aligned from the dynamic base) is the
//       role's. p.role_args is the role's opaque argument (device memory the host prepared).
//   block_exit(p)
//       called by thread 0 of every block, GEMM and role blocks alike, once the block has
//       finished all its work (for GEMM blocks: every tile stored, every load consumed); only
//       when kHasBlockExit. The place for "this launch is over" bookkeeping across blocks.
// A role may wait (bounded, common/wait.cuh) on flags raised by other blocks of the same launch
// only if those blocks cannot in turn wait on it: every block of a launch is resident at once
// (the grid never exceeds what fits), but GEMM blocks wait on readiness flags, so a role must
// never wait for a GEMM block's progress before raising a flag a GEMM block may wait on. Roles
// report failures through p.wait (status word) and return; they never trap.
// A role may let the split between GEMM and role blocks move from launch to launch
// (kAdaptiveSplit, optional; common/split_control.h): then, when p.split is set, every block reads
// this launch's split from it (gridDim.x less its communication blocks run GEMM tiles), the GEMM
// producers time their readiness waits, every block stamps its end, and the role's block_exit
// calls split_launch_end on the launch's last block. The decomposition stays the plan's.
// A role may let its kernel start early (kProgrammaticLaunch, optional): with
// GemmConfig::programmatic_launch the launch then overlaps the end of the kernel before it on the
// stream (for the fused ops, the launch's begin_launch), and every block, GEMM and role blocks
// alike, waits for that kernel (griddep_wait) before anything else, so nothing the role or the
// engine reads can be older than it. The kernel's launch and block scheduling are what overlap.
// A role may also own the epilogue (kHasEpilogue, optional; see detail::role_epilogue):
//   EpilogueState                   per-thread state of the consumer threads, across tiles
//   epilogue<T>(p, st, acc, m_block, n_block, ctid, tma_d, smem_epi)
//       called by the 256 consumer threads of a GEMM block for every finished tile (after the
//       split-K fix-up, never for a cluster's padding tile) instead of the engine's store; acc is
//       the thread's fp32 fragment (wgmma layout, ctid = consumer thread 0..255). It may wait
//       (bounded) on flags of other ranks, under the contract above, and may store through the
//       engine's output map and epilogue buffers (detail::store_tile_tma; the engine drains them
//       before the block exits).
//   epilogue_end<T>(p, st, ctid)
//       called by the same threads once after their last tile (the place for work that must
//       follow all of the block's tiles).
//   epilogue<T>(p, st, acc, const GroupedTile& tile, ctid, tma_d, smem_epi)
//       the same for grouped instantiations (T::kGrouped): `tile` names the group, the m block
//       inside it, the n block, the packed rows [row_begin, row_end) the tile owns (rows past
//       row_end belong to the next group and must not be written) and flat_m_block (the index
//       of per-tile flags). Never called for a padding CTA (no rows).
struct NoRole {
  static constexpr bool kHasBlockExit = false;
  __device__ static void run(const GemmParams&, uint32_t /*role_block*/, uint32_t /*num_role_blocks*/) {}
  __device__ static void block_exit(const GemmParams&) {}
};

template <int kBlockN_, int kStages_, int kClusterM_, uint32_t kEpilogue_, bool kGrouped_ = false,
          int kBlockM_ = 128, bool kSwapAB_ = false, int kClusterK_ = 1, int kClusterN_ = 1>
struct Sm90GemmTraits {
  // Swapped operands (plain GEMMs, store epilogue): the kernel computes D^T = W A^T, so its "m"
  // is the caller's n (the weight's rows fill the 128-row side of the tile and the wgmma M) and
  // its "n" is the caller's m (the activations' rows are the tile's width, any multiple of 16
  // from 16). The main loop is the same; the epilogue stores each tile transposed
  // (store_tile_transposed). For small m this is the weight stream: a stage holds 128 weight
  // rows and only a few activation rows, so many more stages fit (docs/kernels.md section 7).
  static constexpr bool kSwapAB = kSwapAB_;
  // 128 rows: each consumer warpgroup owns one 64-row half. 256 rows ("tall" tiles): each owns
  // two 64-row sub-tiles, rows 64 * (2 s + cw) for sub-tile s of consumer cw (interleaved, so a
  // last m block that ends early leaves both consumers the same work), and issues two
  // m64 wgmma per k step: the smem traffic per flop of a 128 x 256 tile at widths 128 to 192.
  // 64 rows (swapped operands only, small m): both consumers share the tile's 64 weight rows and
  // each takes half of its width (kConsumerN columns), so a weight of n rows fills n / 64 tiles
  // and a stage holds 8 KB of it (up to 16 stages).
  // 192 rows (plain GEMMs): three consumer warpgroups of one 64-row slice each (512 threads), so
  // a k block pulls (192 + BLOCK_N) x 128 bytes into the SM for 192 x BLOCK_N x 64 MACs: at 192
  // columns 1.5x the flops per byte of a 128 x 128 tile and 1.15x those of a 128 x 256 one, with
  // every wgmma an m64nBLOCK_N (the smem traffic per flop of the 128-row tile of that width).
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kMSub = kBlockM_ == 256 ? 2 : 1;  // 64-row sub-tiles per consumer
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kConsumerN = kBlockM_ == 64 ? kBlockN_ / 2 : kBlockN_;  // one consumer's columns
  // Rows of the output box a transposed store writes (the D map's box): within one consumer's
  // columns.
  static constexpr int kStoreRows = kBlockM_ == 64 ? 8 : 16;
  static constexpr int kBlockK = 64;  // 64 bf16 = 128 bytes: one 128-byte swizzle row
  static constexpr int kStages = kStages_;
  static constexpr int kClusterM = kClusterM_;
  // Split-K inside a cluster (swapped operands, widths up to 128): the kClusterK CTAs of a cluster
  // work on the same tile, each on its own contiguous share of the k blocks, and sum their fp32
  // partials through distributed shared memory (detail::cluster_k_reduce): no round trip through
  // global memory, no workspace, and a fixed order of summation (bitwise reproducible).
  static constexpr int kClusterK = kClusterK_;
  // Pairs along n (plain GEMMs): the two CTAs of a cluster take n blocks 2j and 2j + 1 of the same
  // m block and each loads half of the A tile (kBlockM / 2 rows) for both.
  static constexpr int kClusterN = kClusterN_;
  // CTAs that share operands through multicast (the ones whose consumers release each stage).
  static constexpr int kPairSize = kClusterM_ * kClusterN_;
  static constexpr int kClusterSize = kClusterM_ * kClusterN_ * kClusterK_;  // CTAs a cluster launch groups
  static constexpr uint32_t kEpilogue = kEpilogue_;
  static constexpr int kNumConsumers = kBlockM_ == 192 ? 3 : 2;
  static constexpr int kThreads = 128 * (1 + kNumConsumers);
  static constexpr int kConsumerThreads = 128 * kNumConsumers;
  // A 256-row tile's consumer holds two accumulators: above 160 columns (2 x 88 or 2 x 96 fp32
  // registers) it takes the most setmaxnreg gives (240) and the producer warpgroup the least
  // (24); otherwise 232 and 40 leave the producer's loop without spills.
  static constexpr bool kWideTall = kBlockM_ == 256 && kBlockN_ > 160;
  // 192-row tiles: 512 threads share the 64K registers, 32 for the producer warpgroup and 160 for
  // each consumer (at most 128 accumulator registers, at 256 columns).
  static constexpr int kProducerRegs = kBlockM_ == 192 ? 32 : kWideTall ? 24 : 40;
  static constexpr int kConsumerRegs = kBlockM_ == 192 ? 160 : kWideTall ? 240 : 232;
  static constexpr uint32_t kABytes = kBlockM * kBlockK * 2;
  static constexpr uint32_t kBBytes = kBlockN * kBlockK * 2;
  static constexpr uint32_t kStageBytes = kABytes + kBBytes;
  // Epilogue staging: per consumer, two 64 x 64 bf16 buffers (128-byte swizzled rows) that
  // alternate as TMA stores drain them. In-cluster split-K receives the partials of a whole
  // 128 x BLOCK_N fp32 tile there instead (detail::ClusterKLayout): above 64 columns that takes
  // more room (64 KB at 128), and the pipeline has fewer stages.
  // 192-row tiles have one buffer per consumer (each chunk waits for the previous chunk's store to
  // have read it), which leaves room for a fourth stage at 192 columns.
  static constexpr uint32_t kEpiChunkBytes = 64 * 64 * 2;
  static constexpr int kEpiBufs = kBlockM_ == 192 ? 1 : 2;
  static constexpr uint32_t kEpiBytes =
      kClusterK_ > 1 && 128u * kBlockN_ * 4 > kNumConsumers * 2 * kEpiChunkBytes
          ? 128u * kBlockN_ * 4
          : kNumConsumers * kEpiBufs * kEpiChunkBytes;
  // Full and empty barriers, one abort word per stage, the split-last word (16-byte rounded).
  // With kClusterK > 1 four more mbarriers (receive buffers full / free, two of each) after them.
  static constexpr uint32_t kBarrierBytes =
      2 * kStages * 8 + ((kStages + 1) * 4 + 15) / 16 * 16 + (kClusterK_ > 1 ? 32 : 0);
  // Grouped GEMM: the groups' table (sm90_bf16_grouped_gemm_map.h) after the barriers.
  static constexpr bool kGrouped = kGrouped_;
  static constexpr uint32_t kGroupedBytes = kGrouped ? (sizeof(GroupedTable) + 15) / 16 * 16 : 0;
  static constexpr uint32_t kSmemBytes = 1024 + kStages * kStageBytes + kEpiBytes + kBarrierBytes + kGroupedBytes;
  // wgmma takes any N that is a multiple of 8; 16 keeps each CTA's multicast half of the weight
  // tile whole 8-row swizzle atoms (1024-byte aligned).
  static_assert(kBlockN % 16 == 0 && kBlockN >= (kSwapAB_ ? 16 : 64) && kBlockN <= 256,
                "BLOCK_N: a multiple of 16 in [64, 256] ([16, 256] with swapped operands)");
  static_assert(!kSwapAB_ || (!kGrouped_ && kEpilogue_ == kEpilogueStore && kBlockM_ <= 128),
                "swapped operands: plain GEMM, store epilogue, 64- or 128-row tiles");
  static_assert(!kGrouped_ || kBlockN % 64 == 0, "grouped GEMM: BLOCK_N a multiple of 64 (64-column chunks)");
  static_assert(kClusterM == 1 || kClusterM == 2, "clusters of 1 or 2 CTAs along M");
  static_assert(kClusterN == 1 || (kClusterN == 2 && kClusterK == 1 && !kGrouped_ && kEpilogue_ == kEpilogueStore &&
                                   kBlockM_ != 256 && (kClusterM == 1 || kBlockM_ != 64)),
                "pairs along N: plain GEMMs (store epilogue), 64-, 128- or 192-row tiles (2 x 2 clusters: 128 or "
                "192), no split-K inside the cluster");
  static_assert(kClusterK == 1 || kClusterK == 2 || kClusterK == 4 || kClusterK == 8, "clusters of 1, 2, 4 or 8 CTAs along K");
  // The partial tile (128 x BLOCK_N fp32) lives in the epilogue's staging buffers, which the
  // in-cluster reduction never uses for TMA stores.
  static_assert(kClusterK == 1 || (kSwapAB_ && kClusterM_ == 1 && kBlockM_ == 128 && kBlockN_ <= 128 && !kGrouped_ &&
                                   kEpilogue_ == kEpilogueStore),
                "split-K inside a cluster: swapped operands, 128-row tiles, widths up to 128, clusters of 1 along M");
  static_assert(kBlockM == 128 || kBlockM == 192 || kBlockM == 256 || (kBlockM == 64 && kSwapAB_ && kBlockN_ <= 64),
                "BLOCK_M: 128, 192 or 256 (64 with swapped operands, widths up to 64)");
  static_assert(kBlockM != 192 || (!kGrouped && !kSwapAB_ && kClusterK_ == 1 && kEpilogue == kEpilogueStore),
                "192-row tiles: plain GEMM, store epilogue, operands as given, no in-cluster split-K");
  static_assert(kBlockM != 256 || (!kGrouped && kEpilogue == kEpilogueStore && kBlockN <= 192),
                "256-row tiles: plain GEMM, store epilogue, at most 192 columns (accumulator registers)");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory over the 227 KB a block may use");
  static_assert(!kGrouped || kEpilogue == kEpilogueStore, "grouped GEMM: store epilogue only");
  static_assert(kProducerRegs * 128 + kConsumerRegs * 128 * kNumConsumers <= 65536,
                "register budget over the 64K registers of an SM");
};

// How long an aborting producer waits for each load it issued to land (its drain): loads take
// microseconds, so this bounds only a stage whose cluster peer never sent its half.
inline constexpr uint64_t kDrainBoundNs = 1'000'000;

namespace detail {

// Whether Role lets the launch's split be adaptive (GemmParams::split): Role::kAdaptiveSplit.
template <class Role>
constexpr bool role_adaptive_split() {
  if constexpr (requires { Role::kAdaptiveSplit; }) {
    return Role::kAdaptiveSplit;
  } else {
    return false;
  }
}

// Whether Role's kernel may be launched with programmatic dependence on the kernel before it
// (Role::kProgrammaticLaunch): every block then waits for that kernel (griddep_wait) first thing.
template <class Role>
constexpr bool role_programmatic() {
  if constexpr (requires { Role::kProgrammaticLaunch; }) {
    return Role::kProgrammaticLaunch;
  } else {
    return false;
  }
}

// Whether Role owns the epilogue, and its per-thread state (an empty one when it does not).
struct NoEpilogueState {};
template <class Role>
constexpr bool role_epilogue() {
  if constexpr (requires { Role::kHasEpilogue; }) {
    return Role::kHasEpilogue;
  } else {
    return false;
  }
}
template <class Role, bool = role_epilogue<Role>()>
struct RoleEpilogueState {
  using type = NoEpilogueState;
};
template <class Role>
struct RoleEpilogueState<Role, true> {
  using type = typename Role::EpilogueState;
};

// Waits (bounded) until rows [row0, row_end) of A are flagged ready (GemmParams: readiness).
// The flags covering consecutive rows have consecutive indices, so the tile waits for one run
// of flags. Then makes what the peers (or the copy engine, or the host) stored visible to the
// TMA loads that follow.
__device__ __forceinline__ bool wait_rows_ready(const GemmParams& p, uint64_t value, uint32_t row0,
                                                uint32_t row_end, uint32_t m_block) {
  auto flag_of = [&](uint32_t g) {
    return (g / p.ready_shard_rows) * p.ready_chunks_per_shard + (g % p.ready_shard_rows) / p.ready_rows_per_flag;
  };
  const uint32_t last = flag_of(row_end - 1);
  for (uint32_t f = flag_of(row0); f <= last; ++f) {
    if (!wait_geq(p.ready_flags + f, value, p.wait, f, where_tag(kStepGemmReady, m_block))) return false;
  }
  sync::fence_proxy_async_global();
  return true;
}

// The value a finished tile's flag gets (GemmParams::tile_flag_value / tile_flag_value_ptr).
__device__ __forceinline__ uint64_t tile_flag_value(const GemmParams& p) {
  return p.tile_flag_value_ptr != nullptr ? sync::ld_acquire_gpu(p.tile_flag_value_ptr) : p.tile_flag_value;
}

// Grouped: one more stored tile of flat m block `mb` (GemmParams::mblock_flags). Called by the
// thread that raised the tile's flag, after it (so after its fence). The count word carries
// the launch's value in its high half (grouped_mblock_count_next). The tile that completes the
// count publishes the m block's flag: its fence orders the other tiles' stores (each fenced
// before its own count) before the flag.
__device__ __forceinline__ void count_mblock_tile(const GemmParams& p, uint32_t mb, uint64_t value) {
  unsigned long long* word = p.mblock_counts + mb;
  unsigned long long cur = *reinterpret_cast<volatile unsigned long long*>(word);
  unsigned long long next = 0;
  while (true) {
    next = grouped_mblock_count_next(cur, value, p.num_n_blocks);
    const unsigned long long seen = atomicCAS(word, cur, next);
    if (seen == cur) break;
    cur = seen;
  }
  if ((next & 0xffffffffull) == 0) {
    sync::fence_acq_rel_sys();
    sync::st_release_sys(p.mblock_flags + mb, value);
  }
}

// CTAs whose consumers hand back each stage of a CTA: those that write into it, i.e. the CTAs of
// its n block (their weight halves) and of its m block (their A halves), itself included. In a
// 2 x 2 cluster the diagonal CTA shares no operand and is left out (3 of the 4).
template <class T>
inline constexpr int kStageReleasers = T::kClusterM + T::kClusterN - 1;

template <class T>
__device__ __forceinline__ void release_stage(uint64_t* empty_bar, [[maybe_unused]] uint32_t cta_rank) {
  if constexpr (T::kPairSize == 1) {
    ptx::mbar_arrive(empty_bar);
  } else if constexpr (T::kClusterM == 1 || T::kClusterN == 1) {
    // Both CTAs of a pair write into each other's stage (the multicast halves).
#pragma unroll
    for (uint32_t r = 0; r < T::kPairSize; ++r) ptx::mbar_arrive_cluster(empty_bar, r);
  } else {
    const uint32_t mi = cta_rank % T::kClusterM, ni = cta_rank / T::kClusterM;
#pragma unroll
    for (uint32_t r = 0; r < T::kPairSize; ++r) {
      if (r % T::kClusterM == mi || r / T::kClusterM == ni) ptx::mbar_arrive_cluster(empty_bar, r);
    }
  }
}

// Stores one consumer's 64 x BLOCK_N accumulator slice through shared memory and TMA, in 64 x 64
// chunks alternating between two buffers (the whole chunks only: a BLOCK_N that is not a
// multiple of 64 leaves its last BLOCK_N % 64 columns to store_chunk_masked). The stores drain asynchronously while the consumer
// starts its next tile; TMA clips rows past m and columns past n. Conflict-free staging: the
// 16-byte column group j of row r sits at group j ^ (r % 8) (TMA's 128-byte swizzle).
template <class T>
__device__ __forceinline__ void store_tile_tma(const CUtensorMap* tma_d, const float (&acc)[T::kConsumerN / 2],
                                               uint8_t* bufs, int32_t row0, int32_t col0, uint32_t warp_in_wg,
                                               uint32_t lane, bool leader, uint32_t bar_id) {
  const uint32_t base = ptx::smem_addr(bufs);
  const uint32_t row = warp_in_wg * 16 + lane / 4;  // + 8h; row % 8 == lane / 4 for both
  const uint32_t swz = lane / 4;
#pragma unroll
  for (int c = 0; c < T::kBlockN / 64; ++c) {
    const uint32_t buf = base + (c % T::kEpiBufs) * T::kEpiChunkBytes;
    // The store that last used this buffer is done reading it: the one before the latest, except
    // for a tile's first chunk when a tile has an odd number of chunks (192 columns: buffers 0,
    // 1, 0), where the latest store, the previous tile's last chunk, used this buffer too (and
    // always the latest with one buffer).
    if (leader) {
      if (T::kEpiBufs == 1 || (c == 0 && (T::kBlockN / 64) % 2 == 1)) {
        ptx::bulk_wait_group_read<0>();
      } else {
        ptx::bulk_wait_group_read<1>();
      }
    }
    ptx::named_barrier_sync(bar_id, 128);
#pragma unroll
    for (int jj = 0; jj < 8; ++jj) {
      const int j = c * 8 + jj;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t addr = buf + (row + 8 * h) * 128 + ((jj ^ swz) * 16) + 4 * (lane % 4);
        ptx::st_shared_b32(addr, ptx::pack_bf16x2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]));
      }
    }
    ptx::fence_proxy_async_shared();
    ptx::named_barrier_sync(bar_id, 128);
    if (leader) {
      ptx::tma_store_2d(tma_d, bufs + (c % T::kEpiBufs) * T::kEpiChunkBytes, col0 + c * 64, row0);
      ptx::bulk_commit_group();
    }
  }
}

// Swapped operands: stores one consumer's 64 x BLOCK_N slice of D^T (64 weight rows = 64 output
// columns starting at col0, BLOCK_N activation rows = output rows starting at row0) into D,
// transposed. In chunks of 64 output rows through the two staging buffers: stmatrix .trans
// writes each 8 x 8 block of the fragment as 8 output rows of 16 bytes (128-byte swizzle: the
// 16-byte group g of row r at g ^ (r % 8), conflict-free), then the leader stores the chunk as
// boxes of 16 rows x 64 columns (the output map's box; TMA clips rows past m and columns past
// n). The buffer reuse follows store_tile_tma.
template <class T>
__device__ __forceinline__ void store_tile_transposed(const CUtensorMap* tma_d, const float (&acc)[T::kConsumerN / 2],
                                                      uint8_t* bufs, int32_t row0, int32_t col0, uint32_t warp_in_wg,
                                                      uint32_t lane, bool leader, uint32_t bar_id) {
  constexpr int kChunks = (T::kConsumerN + 63) / 64;
  constexpr int kLast = T::kConsumerN - 64 * (kChunks - 1);  // output rows in the last chunk
  const uint32_t base = ptx::smem_addr(bufs);
  const uint32_t q = lane / 8;                // which of the four matrices this lane addresses
  const uint32_t r = lane % 8;                // which of its rows
  const uint32_t g = 2 * warp_in_wg + q % 2;  // 16-byte group: the matrix's 8 weight rows
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int rows = c + 1 < kChunks ? 64 : kLast;  // a multiple of 8
    const uint32_t buf = base + (c % 2) * T::kEpiChunkBytes;
    if (leader) {
      if (c == 0 && kChunks % 2 == 1) {
        ptx::bulk_wait_group_read<0>();
      } else {
        ptx::bulk_wait_group_read<1>();
      }
    }
    ptx::named_barrier_sync(bar_id, 128);
#pragma unroll
    for (int jj = 0; jj < 8; jj += 2) {
      if (jj * 8 >= rows) break;
      const int j = c * 8 + jj;                  // fragment column groups j and j + 1
      const uint32_t rr = (jj + q / 2) * 8 + r;  // output row of this lane's address, in the chunk
      if (jj * 8 + 8 < rows) {
        ptx::stmatrix_x4_trans(buf + rr * 128 + ((g ^ (rr % 8)) * 16), ptx::pack_bf16x2(acc[4 * j], acc[4 * j + 1]),
                               ptx::pack_bf16x2(acc[4 * j + 2], acc[4 * j + 3]),
                               ptx::pack_bf16x2(acc[4 * j + 4], acc[4 * j + 5]),
                               ptx::pack_bf16x2(acc[4 * j + 6], acc[4 * j + 7]));
      } else if constexpr (T::kConsumerN % 16 != 0) {
        // An odd last column group (8 or 24 columns): its two matrices alone.
        ptx::stmatrix_x2_trans(buf + rr * 128 + ((g ^ (rr % 8)) * 16), ptx::pack_bf16x2(acc[4 * j], acc[4 * j + 1]),
                               ptx::pack_bf16x2(acc[4 * j + 2], acc[4 * j + 3]));
      }
    }
    ptx::fence_proxy_async_shared();
    ptx::named_barrier_sync(bar_id, 128);
    if (leader) {
      for (int b = 0; b < rows / T::kStoreRows; ++b) {
        ptx::tma_store_2d(tma_d, bufs + (c % 2) * T::kEpiChunkBytes + b * T::kStoreRows * 128, col0,
                          row0 + c * 64 + b * T::kStoreRows);
      }
      ptx::bulk_commit_group();
    }
  }
}

// Adds (atomic-add epilogue) one consumer's 64 x BLOCK_N accumulator slice straight from
// registers. Rows past m and columns past n are skipped; n is a multiple of 8, so a column pair
// is in or out as a whole.
template <class T>
__device__ __forceinline__ void store_tile(const GemmParams& p, const float (&acc)[T::kConsumerN / 2],
                                           uint32_t row0, uint32_t col0) {
  auto* d = static_cast<uint16_t*>(p.d);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint32_t row = row0 + 8 * h;
    if (row >= p.m) continue;
    uint16_t* d_row = d + static_cast<uint64_t>(row) * p.ldd;
#pragma unroll
    for (int j = 0; j < T::kBlockN / 8; ++j) {
      const uint32_t col = col0 + 8 * j;
      if (col < p.n) {
        const uint32_t v = ptx::pack_bf16x2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
        if constexpr (T::kEpilogue == kEpilogueAtomicAdd) {
          ptx::red_add_bf16x2(d_row + col, v);
        } else {
          ptx::st_global_b32(d_row + col, v);
        }
      }
    }
  }
}

// Stores kCols columns (a multiple of 8, at most 64) of one consumer's 64 x BLOCK_N slice,
// starting at the slice's column c0 (a multiple of 8), of which only the first `rows` rows are
// written: staged in the swizzled 64 x 64 buffer at shared address `buf` as store_tile_tma does,
// then each row's kCols / 8 16-byte pieces are written by consecutive threads, masked by row and
// by column (n is a multiple of 8, so a piece is in or out as a whole). The leader first waits
// until every earlier TMA store has read its buffer (this path commits none of its own).
template <class T, int kCols>
__device__ __forceinline__ void store_chunk_masked(const GemmParams& p, const float (&acc)[T::kConsumerN / 2],
                                                   uint32_t buf, int c0, uint32_t row0, uint32_t rows, uint32_t col0,
                                                   uint32_t warp_in_wg, uint32_t lane, bool leader, uint32_t bar_id) {
  static_assert(kCols % 8 == 0 && kCols > 0 && kCols <= 64, "a chunk is 8 to 64 columns");
  constexpr int kGroups = kCols / 8;  // 16-byte pieces per row
  const uint32_t row = warp_in_wg * 16 + lane / 4;
  const uint32_t swz = lane / 4;
  const uint32_t t = warp_in_wg * 32 + lane;  // 0..127
  auto* d = static_cast<uint16_t*>(p.d);
  if (leader) ptx::bulk_wait_group_read<0>();
  ptx::named_barrier_sync(bar_id, 128);
#pragma unroll
  for (int jj = 0; jj < kGroups; ++jj) {
    const int j = c0 / 8 + jj;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t addr = buf + (row + 8 * h) * 128 + ((jj ^ swz) * 16) + 4 * (lane % 4);
      ptx::st_shared_b32(addr, ptx::pack_bf16x2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]));
    }
  }
  ptx::named_barrier_sync(bar_id, 128);
#pragma unroll
  for (int i = 0; i < (64 * kGroups + 127) / 128; ++i) {
    const uint32_t piece = t + 128 * i;  // 64 rows x kGroups pieces of 16 bytes
    const uint32_t r = piece / kGroups, j = piece % kGroups;
    const uint32_t col = col0 + j * 8;
    if (piece < 64 * kGroups && r < rows && col < p.n) {
      const uint4 v = ptx::ld_shared_v4_b32(buf + r * 128 + ((j ^ (r % 8)) * 16));
      ptx::st_global_v4_b32(d + static_cast<uint64_t>(row0 + r) * p.ldd + col, v);
    }
  }
}

// Stores one consumer's 64 x BLOCK_N slice of which only the first `rows` rows are written
// (grouped GEMM: the rows after them belong to the next group), in 64-column chunks through the
// two staging buffers (store_chunk_masked).
template <class T>
__device__ __forceinline__ void store_tile_masked(const GemmParams& p, const float (&acc)[T::kConsumerN / 2],
                                                  uint8_t* bufs, uint32_t row0, uint32_t rows, uint32_t col0,
                                                  uint32_t warp_in_wg, uint32_t lane, bool leader, uint32_t bar_id) {
  const uint32_t base = ptx::smem_addr(bufs);
#pragma unroll
  for (int c = 0; c < T::kBlockN / 64; ++c) {
    store_chunk_masked<T, 64>(p, acc, base + (c % 2) * T::kEpiChunkBytes, c * 64, row0, rows, col0 + c * 64,
                              warp_in_wg, lane, leader, bar_id);
  }
}

// Grouped GEMM: the groups' table in shared memory (sm90_bf16_grouped_gemm_map.h, note 3), built
// by all threads of a GEMM block: one thread per chunk sums its groups, then warp 0 turns the
// sums into prefix sums. t->bad_group must hold kGroupedNoBadGroup before the block's first
// barrier. Ends with a block barrier; block 0 reports invalid offsets.
template <int kClusterM>
__device__ __forceinline__ void build_grouped_table(const GroupedTileMap<kClusterM>& map, GroupedTable* t,
                                                    const GemmParams& p) {
  const uint32_t n = map.p.num_chunks;
  for (uint32_t c = threadIdx.x; c < n; c += blockDim.x) {
    const GroupedChunkTotals ct = map.chunk_totals(c);
    t->tiles_before[c + 1] = ct.tiles;
    t->m_blocks_before[c + 1] = ct.m_blocks;
    if (ct.bad_group != kGroupedNoBadGroup) atomicMin(&t->bad_group, ct.bad_group);
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    const uint32_t lane = threadIdx.x;
    const uint32_t per = (n + 31) / 32;
    const uint32_t b = 1 + lane * per;
    const uint32_t e = min(b + per, n + 1);
    uint32_t own_t = 0, own_m = 0;
    for (uint32_t i = b; i < e; ++i) {
      own_t += t->tiles_before[i];
      own_m += t->m_blocks_before[i];
    }
    uint32_t inc_t = own_t, inc_m = own_m;
#pragma unroll
    for (uint32_t off = 1; off < 32; off <<= 1) {
      const uint32_t x = __shfl_up_sync(0xFFFFFFFFu, inc_t, off);
      const uint32_t y = __shfl_up_sync(0xFFFFFFFFu, inc_m, off);
      if (lane >= off) {
        inc_t += x;
        inc_m += y;
      }
    }
    uint32_t run_t = inc_t - own_t, run_m = inc_m - own_m;
    for (uint32_t i = b; i < e; ++i) {
      run_t += t->tiles_before[i];
      run_m += t->m_blocks_before[i];
      t->tiles_before[i] = run_t;
      t->m_blocks_before[i] = run_m;
    }
    if (lane == 0) {
      t->tiles_before[0] = 0;
      t->m_blocks_before[0] = 0;
    }
    if (lane == 31) t->total_tiles = t->bad_group == kGroupedNoBadGroup ? inc_t : 0u;
  }
  __syncthreads();
  if (threadIdx.x == 0 && blockIdx.x == 0 && t->bad_group != kGroupedNoBadGroup) {
    report(p.wait, kDeviceBadArgument, kArgGroupOffsets, where_tag(kStepGroupOffsets, t->bad_group));
  }
}

// Split-K inside a cluster (Traits::kClusterK > 1): this CTA's share of the item's k blocks
// (common/tile_scheduler.cuh, cluster_k_share).
template <class T>
__device__ __forceinline__ void cluster_k_share(WorkItem& item, uint32_t krank) {
  if constexpr (T::kClusterK > 1) mkernel::kernels::cluster_k_share(item, krank, T::kClusterK);
}

// The in-cluster reduction of one tile (Traits::kClusterK > 1, swapped operands), a
// reduce-scatter through distributed shared memory, run by the 256 consumer threads of every
// CTA of the cluster after their main loop; `rt` counts the tiles this CTA reduced before. CTA r
// owns the tile's columns (activation rows) [r w, (r + 1) w), w = BLOCK_N / kClusterK (even), and
// receives every CTA's partial of them into a slot per sender, laid out as [column / 2][128 weight
// rows][2] floats (a fragment's column pair is one 8-byte store; 4 weight rows of a column pair
// are two 16-byte loads).
//  1. Wait until every owner has finished reading the receive buffer this tile uses (the
//     buffers alternate when two fit the epilogue's staging space: widths up to 32).
//  2. Thread 0 arms its own receive barrier for the bytes of kClusterK slots; every thread sends
//     each of its fragment's column pairs to the owner's slot with st.async, which completes the
//     bytes on the owner's barrier. No memory fence on either side: the barrier's phase
//     completes when the bytes have landed (a release / acquire handshake instead cost a
//     MEMBAR.GPU per tile, waiting for the previous tile's global stores).
//  3. Every thread waits for its barrier's phase, then the owner sums each 16-byte group over
//     the slots in rank order (the same order on every launch: bitwise reproducible), rounds to
//     bf16 once and stores 4 output columns per 8-byte store. Rows past the caller's m and
//     columns past its n are skipped (n is a multiple of 8: a group of 4 is in or out as a whole).
//  4. Barrier of the 256 threads; thread 0 tells every CTA that its slots in this buffer are free
//     (one arrival per owner on the sender's barrier).
// Returns false when a wait expired (reported as a pipeline timeout of "stage" kStages for the
// receive barrier, kStages + 1 for the buffer-free one; the caller stops). The final cluster
// barrier of the kernel keeps every CTA alive until the last data sent to it has landed.
template <class T>
struct ClusterKLayout {
  static constexpr uint32_t kS = T::kClusterK;
  static constexpr uint32_t kOwnedCols = T::kBlockN / kS;         // tile columns per owner (even)
  static constexpr uint32_t kSlotBytes = kOwnedCols * 128 * 4;    // one sender's partial of them
  static constexpr uint32_t kBufferBytes = kS * kSlotBytes;       // = 128 x BLOCK_N x 4
  static constexpr uint32_t kBuffers = 2 * kBufferBytes <= T::kEpiBytes ? 2 : 1;
  static_assert(kOwnedCols % 2 == 0 && kBufferBytes <= T::kEpiBytes, "the receive buffers fit the epilogue's");
};

template <class T>
__device__ __forceinline__ bool cluster_k_reduce(const GemmParams& p, const float (&acc)[T::kConsumerN / 2],
                                                 uint8_t* smem_epi, uint64_t* red_bars, uint32_t rt, uint32_t krank,
                                                 uint32_t m_block, uint32_t n_block, uint32_t cw, uint32_t ctid,
                                                 uint32_t warp_in_wg, uint32_t lane) {
  static_assert(T::kClusterK > 1 && T::kSwapAB && T::kBlockM == 128, "in-cluster split-K: swapped 128-row tiles");
  using L = ClusterKLayout<T>;
  constexpr uint32_t kS = L::kS;
  const uint32_t b = rt % L::kBuffers;
  const uint32_t use = rt / L::kBuffers;
  uint64_t* recv_full = &red_bars[b];
  uint64_t* buffer_free = &red_bars[L::kBuffers + b];
  const uint32_t buf = ptx::smem_addr(smem_epi) + b * L::kBufferBytes;
  // Bounds: after the consumers' own (twice the bound), since a peer may be in such a wait.
  if (use > 0 && !mbar_wait_bounded(buffer_free, (use - 1) & 1u, p.wait.timeout_ns, 2, p.wait.status)) {
    report(p.wait, kDevicePipelineTimeout, T::kStages + 1, where_tag(kStepGemmPipeline, blockIdx.x));
    return false;
  }
  if (ctid == 0) ptx::mbar_arrive_expect_tx(recv_full, L::kBufferBytes);
  {
    const uint32_t q = lane % 4;
    const uint32_t bar = ptx::smem_addr(recv_full);
#pragma unroll
    for (int j = 0; j < T::kConsumerN / 8; ++j) {
      const uint32_t col = 8 * j + 2 * q;  // even: the pair col, col + 1 has one owner
      const uint32_t owner = col / L::kOwnedCols;
      const uint32_t local = col % L::kOwnedCols;
      const uint32_t slot = ptx::mapa_shared(buf + krank * L::kSlotBytes, owner);
      const uint32_t owner_bar = ptx::mapa_shared(bar, owner);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t wrow = cw * 64 + warp_in_wg * 16 + lane / 4 + 8 * h;
        ptx::st_async_v2_f32(slot + ((local / 2) * 128 + wrow) * 8, acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1], owner_bar);
      }
    }
  }
  if (!mbar_wait_bounded(recv_full, use & 1u, p.wait.timeout_ns, 2, p.wait.status)) {
    report(p.wait, kDevicePipelineTimeout, T::kStages, where_tag(kStepGemmPipeline, blockIdx.x));
    return false;
  }
  // Owned items: a column pair and 4 weight rows each.
  constexpr uint32_t kItems = L::kOwnedCols / 2 * 32;
  auto* d = static_cast<uint16_t*>(p.d);
  for (uint32_t it = ctid; it < kItems; it += 256) {
    const uint32_t pair = it / 32, w4 = (it % 32) * 4;
    const uint32_t off = (pair * 128 + w4) * 8;  // [w4][c0], [w4][c1], [w4 + 1][c0], ... 32 bytes
    float4 lo = ptx::ld_shared_v4_f32(buf + off), hi = ptx::ld_shared_v4_f32(buf + off + 16);
#pragma unroll
    for (uint32_t r = 1; r < kS; ++r) {
      const float4 a = ptx::ld_shared_v4_f32(buf + r * L::kSlotBytes + off);
      const float4 c = ptx::ld_shared_v4_f32(buf + r * L::kSlotBytes + off + 16);
      lo.x += a.x;
      lo.y += a.y;
      lo.z += a.z;
      lo.w += a.w;
      hi.x += c.x;
      hi.y += c.y;
      hi.z += c.z;
      hi.w += c.w;
    }
    // Swapped: the kernel's n (activation rows) is the caller's m, its m (weight rows) the
    // caller's n. lo = (w4, c0) (w4, c1) (w4 + 1, c0) (w4 + 1, c1), hi the same for w4 + 2, + 3.
    const uint32_t row = n_block * T::kBlockN + krank * L::kOwnedCols + 2 * pair;
    const uint32_t col = m_block * 128 + w4;
    if (col < p.m) {
      if (row < p.n) {
        ptx::st_global_v2_b32(d + static_cast<uint64_t>(row) * p.ldd + col, ptx::pack_bf16x2(lo.x, lo.z),
                              ptx::pack_bf16x2(hi.x, hi.z));
      }
      if (row + 1 < p.n) {
        ptx::st_global_v2_b32(d + static_cast<uint64_t>(row + 1) * p.ldd + col, ptx::pack_bf16x2(lo.y, lo.w),
                              ptx::pack_bf16x2(hi.y, hi.w));
      }
    }
  }
  ptx::named_barrier_sync(2, 256);
  if (ctid == 0) {
#pragma unroll
    for (uint32_t r = 0; r < kS; ++r) ptx::mbar_arrive_cluster(buffer_free, r);
  }
  return true;
}

// The fix-up of split tiles (stream-K / split-K): gemm/sm90_bf16_gemm_fixup.cuh.

}  // namespace detail

template <class T, class Role>
__global__ void __launch_bounds__(T::kThreads, 1)
    sm90_bf16_gemm_kernel(const __grid_constant__ CUtensorMap tma_a,
                          const __grid_constant__ CUtensorMap tma_b,
                          const __grid_constant__ CUtensorMap tma_d,
                          const __grid_constant__ CUtensorMap tma_a_local,
                          const __grid_constant__ GemmParams p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  // A role launched with programmatic dependence (kProgrammaticLaunch) reads memory the kernel
  // before it wrote (the launch number) from its first instruction on: wait for it here (a no-op
  // when launched without the attribute).
  if constexpr (detail::role_programmatic<Role>()) ptx::griddep_wait();
  if (threadIdx.x == 0) MK_TRACE_MARK(0);
  // ---- role split ----------------------------------------------------------------------------
  // Static (the plan's) or adaptive (read from the plan's SplitControl; the same for every block).
  // Only roles that ask for it (Role::kAdaptiveSplit) read the split and measure: for the others
  // the code is as before (the measure costs the producer registers: ptxas counted 12 more bytes
  // of spill in AllGather+GEMM's instantiations with it).
  constexpr bool kMaySplit = detail::role_adaptive_split<Role>();
  uint32_t num_gemm_blocks = p.num_gemm_blocks;
  [[maybe_unused]] __shared__ unsigned long long split_wait_ns;  // the producer's waits for data
  if constexpr (kMaySplit) {
    if (p.split != nullptr) {
      num_gemm_blocks = gridDim.x - split_comm_blocks(p.split);
      if (threadIdx.x == 0) split_block_start(p.split);
    }
    if (threadIdx.x == 0) split_wait_ns = 0;
  }
  if (threadIdx.x == 0) MK_TRACE_SHAPE(num_gemm_blocks);
  if (blockIdx.x >= num_gemm_blocks) {
    Role::run(p, blockIdx.x - num_gemm_blocks, gridDim.x - num_gemm_blocks);
    __syncwarp();  // a role's thread 0 may have worked alone; its warp rejoins first
    if constexpr (kMaySplit) {
      if (p.split != nullptr) {
        __syncthreads();
        if (threadIdx.x == 0) split_block_done(p.split, false);
      }
    }
    if constexpr (Role::kHasBlockExit) {
      __syncthreads();
      if (threadIdx.x == 0) Role::block_exit(p);
    }
    return;
  }

  // ---- shared memory: [A stages][B stages][epilogue buffers][full bars][empty bars][abort]
  //      [split-last] ---------------------------------------------------------------------------
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~static_cast<uintptr_t>(1023));
  uint8_t* smem_a = smem;
  uint8_t* smem_b = smem + T::kStages * T::kABytes;
  uint8_t* smem_epi = smem_b + T::kStages * T::kBBytes;
  auto* full_bar = reinterpret_cast<uint64_t*>(smem_epi + T::kEpiBytes);
  uint64_t* empty_bar = full_bar + T::kStages;
  // stage_abort[s] = 1: the producer stopped and completed stage s's phase without data. Per
  // stage, not one word: a consumer reads the word of the stage it just saw complete, written (if
  // at all) before that completion, so all warps of a warpgroup read the same value and take the
  // same branch (wgmma needs all four; one shared word read at different times split them).
  auto* stage_abort = reinterpret_cast<volatile uint32_t*>(empty_bar + T::kStages);
  auto* split_last = const_cast<uint32_t*>(stage_abort + T::kStages);
  [[maybe_unused]] auto* grouped_table = reinterpret_cast<GroupedTable*>(smem_epi + T::kEpiBytes + T::kBarrierBytes);
  // In-cluster split-K: [receive buffer full x kBuffers][buffer free x kBuffers]
  // (detail::cluster_k_reduce).
  [[maybe_unused]] auto* red_bars = reinterpret_cast<uint64_t*>(smem_epi + T::kEpiBytes + T::kBarrierBytes - 32);

  const uint32_t warpgroup = threadIdx.x / 128;
  const uint32_t cta_rank = T::kPairSize == 1 ? 0 : ptx::cluster_cta_rank();
  // In-cluster split-K: which share of every tile's k blocks this CTA takes (all CTAs of the
  // cluster walk the same tiles).
  const uint32_t krank = T::kClusterK == 1 ? 0 : ptx::cluster_cta_rank();
  const uint32_t cluster_idx = blockIdx.x / T::kClusterSize;
  const uint32_t num_clusters = num_gemm_blocks / T::kClusterSize;

  if (threadIdx.x == 0) {
    for (int s = 0; s < T::kStages; ++s) {
      ptx::mbar_init(&full_bar[s], 1);
      ptx::mbar_init(&empty_bar[s], T::kNumConsumers * detail::kStageReleasers<T>);
    }
    for (int s = 0; s < T::kStages; ++s) stage_abort[s] = 0;
    if constexpr (T::kClusterK > 1) {
      for (uint32_t i = 0; i < detail::ClusterKLayout<T>::kBuffers; ++i) {
        ptx::mbar_init(&red_bars[i], 1);                                                 // receive buffer full
        ptx::mbar_init(&red_bars[detail::ClusterKLayout<T>::kBuffers + i], T::kClusterK);  // free at every owner
      }
    }
    if constexpr (T::kGrouped) grouped_table->bad_group = kGroupedNoBadGroup;
    ptx::fence_mbar_init();
  }
  if constexpr (T::kClusterSize > 1) {
    ptx::cluster_sync();
  } else {
    __syncthreads();
  }
  // Programmatic dependent launch (plain GEMMs, GemmConfig::programmatic_launch): nothing above
  // touches global memory, so this launch's start overlaps the previous kernel's end; from here
  // on that kernel's writes are visible and it has stopped reading (a no-op without the launch
  // attribute). The next launch may start its own prologue as soon as every block got here.
  ptx::griddep_wait();
  ptx::griddep_launch_dependents();

  TileScheduler<T::kClusterM, T::kClusterN> sched{p.num_m_blocks, p.num_n_blocks, p.num_splits,
                                                  p.raster,       p.group,        p.m_group_offset};
  sched.num_k_blocks = p.num_k_blocks;
  sched.dp_tiles = p.dp_tiles;
  sched.sk_units = p.sk_units;
  sched.sk_per_tile = p.sk_per_tile;
  // Grouped: the tiles of all groups are the data-parallel region; how many there are is known
  // only once the offsets have been read.
  [[maybe_unused]] const GroupedTileMap<T::kClusterM> gmap{p.grouped};
  if constexpr (T::kGrouped) {
    // Offsets written by other blocks of this launch: wait for them first (bounded); a block
    // whose wait failed runs no tile (the error is recorded).
    __shared__ uint32_t offsets_missing;
    if (p.grouped_offsets_ready != nullptr) {
      if (threadIdx.x == 0) {
        const uint64_t v = p.ready_value_ptr != nullptr ? sync::ld_acquire_gpu(p.ready_value_ptr) : p.ready_value;
        [[maybe_unused]] uint64_t t0 = 0;
        if constexpr (kMaySplit) {
          if (p.split != nullptr) t0 = sync::globaltimer_ns();
        }
        offsets_missing = wait_geq(p.grouped_offsets_ready, v, p.wait, 0, where_tag(kStepGroupOffsets, 0xFFFFFFFFu)) ? 0u : 1u;
        MK_TRACE_MARK(1);
        if constexpr (kMaySplit) {  // waiting for the layout is waiting for data too
          if (p.split != nullptr && blockIdx.x < num_gemm_blocks) split_wait_ns += sync::globaltimer_ns() - t0;
        }
      }
      __syncthreads();
    }
    detail::build_grouped_table(gmap, grouped_table, p);
    sched.dp_tiles = (p.grouped_offsets_ready != nullptr && offsets_missing) ? 0u : grouped_table->total_tiles;
    sched.sk_units = 0;
  }

  if (warpgroup == 0) {
    // ---- producer ------------------------------------------------------------------------------
    ptx::setmaxnreg_dec<T::kProducerRegs>();
    if (threadIdx.x == 0) {
      ptx::prefetch_tensor_map(&tma_a);
      ptx::prefetch_tensor_map(&tma_b);
      if (p.local_rows_end > p.local_rows_begin) ptx::prefetch_tensor_map(&tma_a_local);
      if constexpr (T::kEpilogue == kEpilogueStore && !detail::role_epilogue<Role>()) ptx::prefetch_tensor_map(&tma_d);
      uint32_t stage = 0, phase = 0;
      bool aborted = false;
      const uint64_t ready_value =
          p.ready_value_ptr != nullptr ? sync::ld_acquire_gpu(p.ready_value_ptr) : p.ready_value;
      WorkCursor cursor = sched.begin(cluster_idx);
      WorkItem item;
      [[maybe_unused]] GroupCursor gcursor;
#if defined(MKERNEL_PHASE_TRACE)
      unsigned long long trace_wait_ns = 0, trace_tiles = 0;
#endif
      while (!aborted && sched.next(cursor, num_clusters, item)) {
#if defined(MKERNEL_PHASE_TRACE)
        const unsigned long long trace_t0 = sync::globaltimer_ns();
        if (trace_tiles == 0) MK_TRACE_MARK(2);
        ++trace_tiles;
#endif
        detail::cluster_k_share<T>(item, krank);
        const CUtensorMap* map_a = &tma_a;
        int32_t a_row = 0, w_row = 0;
        uint32_t rot = 0;
        bool own_weight_tile = false;  // grouped split tile: no multicast (map note 1)
        const uint32_t len = item.k_end - item.k_begin;
        if constexpr (T::kGrouped) {
          // The group's packed rows (rows past its end are loaded but never stored) once the
          // group, and the rows' bands, are flagged ready; the group's slice of the weight.
          const GroupedTile gt = gmap.locate(*grouped_table, item.tile, cta_rank, gcursor);
          if (gt.row_end > gt.row_begin) {
            [[maybe_unused]] uint64_t t0 = 0;
            if constexpr (kMaySplit) {
              if (p.split != nullptr) t0 = sync::globaltimer_ns();
            }
            if (p.group_ready_flags != nullptr) {
              if (wait_geq(p.group_ready_flags + gt.group, ready_value, p.wait, gt.group,
                           where_tag(kStepGroupReady, gt.group))) {
                sync::fence_proxy_async_global();
              } else {
                aborted = true;
              }
            }
            if (!aborted && p.ready_flags != nullptr &&
                !detail::wait_rows_ready(p, ready_value, gt.row_begin, gt.row_end, gt.flat_m_block)) {
              aborted = true;
            }
            if constexpr (kMaySplit) {
              if (p.split != nullptr) split_wait_ns += sync::globaltimer_ns() - t0;
            }
          }
#if defined(MKERNEL_PHASE_TRACE)
          trace_wait_ns += sync::globaltimer_ns() - trace_t0;
#endif
          a_row = static_cast<int32_t>(gt.row_begin);
          w_row = static_cast<int32_t>(gt.group * p.n + gt.n_block * T::kBlockN);
          own_weight_tile = gt.split != 0;
        } else {
          const TileCoord tc = sched.tile_coord(item.tile, cta_rank);
          // Which copy of A this tile reads: the locally held rows (never waited for) when the
          // tile lies inside them, else the (gathered) A once its rows are flagged ready.
          const uint32_t row0 = tc.m_block * T::kBlockM;
          const uint32_t row_end = min(row0 + T::kBlockM, p.m);
          const bool local = row0 >= p.local_rows_begin && row_end <= p.local_rows_end;
          if (!local && p.ready_flags != nullptr && tc.m_block < p.num_m_blocks) {
            // The adaptive split's measure of waiting for data, kept in shared memory.
            uint64_t t0 = 0;
            if constexpr (kMaySplit) {
              if (p.split != nullptr) t0 = sync::globaltimer_ns();
            }
            if (!detail::wait_rows_ready(p, ready_value, row0, row_end, tc.m_block)) aborted = true;
            if constexpr (kMaySplit) {
              if (p.split != nullptr) split_wait_ns += sync::globaltimer_ns() - t0;
            }
          }
          map_a = local ? &tma_a_local : &tma_a;
          a_row = static_cast<int32_t>(local ? row0 - p.local_rows_begin : row0);
          w_row = static_cast<int32_t>(tc.n_block * T::kBlockN);
          // With a single m group (small m: the weight is streamed once) whole tiles start their
          // k loop at a different place per cluster, so the SMs do not all read the same columns
          // of the weight at the same time (they would crowd the same DRAM channels; 137 rows in
          // clusters of 2 ran at 0.51 of cuBLAS before this covered two m blocks). With more m
          // groups the tiles in flight share A's k slices in L2, so they keep the same order.
          // (Swapped operands: the weight is A; one block of activation rows streams it once.)
          // With an adaptive split the place follows the tile, not the cluster (tile t of the
          // plan's own split, t mod its clusters, is what cluster_idx was there), so a tile's k
          // order and hence its bits do not depend on the split.
          const bool single_pass = T::kSwapAB ? p.num_n_blocks == 1 : p.num_m_blocks <= T::kClusterM;
          const bool follow_tile = kMaySplit && p.split != nullptr;
          const uint32_t rot_clusters = follow_tile ? p.num_gemm_blocks / T::kClusterSize : num_clusters;
          const uint32_t rot_index = follow_tile ? item.tile % rot_clusters : cluster_idx;
          rot = (single_pass && item.unit == WorkItem::kWholeTile)
                    ? static_cast<uint32_t>((static_cast<uint64_t>(rot_index) * len) / rot_clusters)
                    : 0u;
        }
        for (uint32_t i = 0; i < len || aborted; ++i) {
          uint32_t kb = i + rot;
          kb = item.k_begin + (kb >= len ? kb - len : kb);
          if (!mbar_wait_bounded(&empty_bar[stage], phase ^ 1, p.wait.timeout_ns, 2, p.wait.status)) {
            // The consumers hold the stage: they are stuck on a stage that will not complete
            // and leave by their own bounded waits (twice the bound; this one is four times it,
            // so the cause is reported first, and ends early once any error is recorded:
            // wait.cuh note 5). report() keeps the first error.
            report(p.wait, kDevicePipelineTimeout, stage, where_tag(kStepGemmPipeline, blockIdx.x));
            aborted = true;
            break;
          }
          // A wait for rows failed: this stage is loaded as usual (any rows; with clusters the
          // peer's full barrier expects this CTA's multicast half, and this CTA's own expects
          // the peer's) but marked, so the consumers stop when it completes.
          if (aborted) stage_abort[stage] = 1;
          uint8_t* a_dst = smem_a + stage * T::kABytes;
          uint8_t* b_dst = smem_b + stage * T::kBBytes;
          const int32_t k0 = static_cast<int32_t>(kb * T::kBlockK);
          ptx::mbar_arrive_expect_tx(&full_bar[stage], T::kStageBytes);
          // This CTA's place in its cluster: mi along m (CTAs of one n block, sharing its weight
          // tile), ni along n (CTAs of one m block, sharing its A tile); rank = mi + kClusterM * ni
          // (TileScheduler::tile_coord).
          [[maybe_unused]] const uint32_t mi = cta_rank % T::kClusterM;
          [[maybe_unused]] const uint32_t ni = cta_rank / T::kClusterM;
          if constexpr (T::kClusterN == 2) {
            // Pairs along n: this CTA's half of the A tile (the map's box is kBlockM / 2 rows)
            // for both CTAs of its m block (ranks mi and mi + kClusterM).
            constexpr int kHalfM = T::kBlockM / 2;
            ptx::tma_load_2d_multicast(a_dst + ni * (T::kABytes / 2), map_a, &full_bar[stage], k0,
                                       a_row + static_cast<int32_t>(ni * kHalfM),
                                       static_cast<uint16_t>((1u | (1u << T::kClusterM)) << mi));
          } else {
            ptx::tma_load_2d(a_dst, map_a, &full_bar[stage], k0, a_row);
          }
          if constexpr (T::kClusterM == 1) {
            ptx::tma_load_2d(b_dst, &tma_b, &full_bar[stage], k0, w_row);
          } else if (own_weight_tile) {
            // The cluster's CTAs work on different n blocks: each loads both halves of its own
            // weight tile (same bytes for its full barrier as with the peer's multicast half).
            constexpr int kHalfN = T::kBlockN / 2;
            ptx::tma_load_2d(b_dst, &tma_b, &full_bar[stage], k0, w_row);
            ptx::tma_load_2d(b_dst + T::kBBytes / 2, &tma_b, &full_bar[stage], k0, w_row + kHalfN);
          } else {
            // This CTA's half of the weight tile for the CTAs of its n block (ranks
            // kClusterM * ni ... kClusterM * ni + kClusterM - 1).
            constexpr int kHalfN = T::kBlockN / 2;
            ptx::tma_load_2d_multicast(b_dst + mi * (T::kBBytes / 2), &tma_b,
                                       &full_bar[stage], k0,
                                       w_row + static_cast<int32_t>(mi * kHalfN),
                                       static_cast<uint16_t>(((1u << T::kClusterM) - 1) << (T::kClusterM * ni)));
          }
          if (++stage == T::kStages) {
            stage = 0;
            phase ^= 1;
          }
          if (aborted) break;
        }
      }
      if constexpr (kMaySplit) {
        if (p.split != nullptr) split_add_wait(p.split, split_wait_ns);
      }
#if defined(MKERNEL_PHASE_TRACE)
      MK_TRACE_MARK(3);
      MK_TRACE_SET(5, trace_wait_ns / 1000);
      MK_TRACE_SET(6, trace_tiles);
#endif
      // Drain: every load this producer issued lands before the block may exit. Normally the
      // consumers waited for all of them and this is one try_wait per stage; after an abort
      // they stop early and a load still in flight would write into shared memory of a block
      // that is gone (a launch failure). Bounded: a stage whose cluster peer never sent its
      // half does not complete. Its peer waits here too, so the cluster's last multicasts land
      // before both pass the final cluster barrier.
      if (aborted) {
        const uint64_t drain_ns = p.wait.timeout_ns < kDrainBoundNs ? p.wait.timeout_ns : kDrainBoundNs;
        // The last kStages stages armed, newest first. A stage never armed still has the phase of
        // parity 1 "before" its first as completed, so walking back past the first one is free.
        uint32_t s = stage, ph = phase;
        for (uint32_t j = 0; j < T::kStages; ++j) {
          if (s == 0) {
            s = T::kStages;
            ph ^= 1u;
          }
          --s;
          (void)mbar_wait_bounded(&full_bar[s], ph, drain_ns);
        }
      }
    }
  } else {
    // ---- consumers -------------------------------------------------------------------------------
    ptx::setmaxnreg_inc<T::kConsumerRegs>();
    const uint32_t cw = warpgroup - 1;            // which 64-row slice of the tile
    const uint32_t ctid = threadIdx.x - 128;      // 0..255 over both consumers (0..383 over three)
    const uint32_t lane = threadIdx.x % 32;
    const uint32_t warp_in_wg = (threadIdx.x / 32) % 4;
    const bool signals = (threadIdx.x % 128) == 0;
    float acc[T::kMSub][T::kConsumerN / 2];
    uint32_t stage = 0, phase = 0;
    bool aborted = false;
    [[maybe_unused]] typename detail::RoleEpilogueState<Role>::type epi_state{};

    WorkCursor cursor = sched.begin(cluster_idx);
    WorkItem item;
    [[maybe_unused]] GroupCursor gcursor;
    [[maybe_unused]] uint32_t reduced_tiles = 0;  // in-cluster split-K: tiles reduced so far
    while (!aborted && sched.next(cursor, num_clusters, item)) {
      detail::cluster_k_share<T>(item, krank);
      TileCoord tc;
      [[maybe_unused]] GroupedTile gt;
      bool rows_live;
      if constexpr (T::kGrouped) {
        gt = gmap.locate(*grouped_table, item.tile, cta_rank, gcursor);
        tc = TileCoord{gt.m_block, gt.n_block, 0};
        rows_live = gt.row_begin + cw * 64 < gt.row_end;
      } else {
        tc = sched.tile_coord(item.tile, cta_rank);
        rows_live = tc.m_block * T::kBlockM + (T::kBlockM == 64 ? 0 : cw * 64) < p.m;
      }
      const uint32_t kb_begin = item.k_begin;
      const uint32_t kb_end = item.k_end;

      // -- main loop: one k-block of wgmma in flight, the stage before it released. A consumer
      //    whose 64 rows all lie past m (small m, or the last m block; grouped: past the
      //    group's end) issues no MMA: it only follows the stages and hands them back, and its
      //    fragment is zero --
      uint32_t prev_stage = 0;
      for (uint32_t kb = kb_begin; kb < kb_end; ++kb) {
        // Twice the producers' bound: a producer whose wait expires still completes its stage
        // (marked), so a consumer gives up only once every producer has stopped and no stage
        // can complete any more. Its four warps then agree; with equal bounds a stage completing
        // right at the deadline could let some warps into the wgmma and not others.
        if (!mbar_wait_bounded(&full_bar[stage], phase, p.wait.timeout_ns, 1)) {
          report(p.wait, kDevicePipelineTimeout, stage, where_tag(kStepGemmPipeline, blockIdx.x));
          aborted = true;
          break;
        }
        // An explicit shared-memory load: through the volatile pointer the compiler emits a
        // generic system-scope load (LD.E.STRONG.SYS), which on this path between the stage's
        // completion and its wgmma cost the large shapes about 5%.
        if (ptx::ld_shared_volatile_u32(const_cast<const uint32_t*>(stage_abort + stage)) != 0) {
          aborted = true;
          break;
        }
        if (rows_live) {
          // 64-row tiles: this consumer's half of the width starts kConsumerN rows into the B tile
          // (whole 8-row swizzle atoms).
          const uint64_t desc_b = ptx::make_desc_k_major_sw128(smem_b + stage * T::kBBytes +
                                                               (T::kBlockM == 64 ? cw * T::kConsumerN * 128 : 0));
          ptx::wgmma_fence();
          // Sub-tile s of this consumer: rows 64 * (2 s + cw) of the stage's A tile (64 rows of
          // 128 bytes = 8 KB, whole swizzle atoms). With two sub-tiles the k slices alternate
          // between the accumulators, so consecutive wgmma do not depend on each other.
#pragma unroll
          for (int kk = 0; kk < T::kBlockK / 16; ++kk) {
#pragma unroll
            for (int s = 0; s < T::kMSub; ++s) {
              const uint64_t desc_a = ptx::make_desc_k_major_sw128(
                  smem_a + stage * T::kABytes + (T::kBlockM == 64 ? 0 : (2 * s + cw) * (64 * T::kBlockK * 2)));
              ptx::wgmma_m64k16<T::kConsumerN>(acc[s], ptx::advance_desc(desc_a, kk * 32),
                                            ptx::advance_desc(desc_b, kk * 32),
                                            (kb > kb_begin || kk > 0) ? 1u : 0u);
            }
          }
          ptx::wgmma_commit();
          ptx::wgmma_wait<1>();
          if (kb > kb_begin && signals) detail::release_stage<T>(&empty_bar[prev_stage], cta_rank);
        } else {
          // No MMA keeps this warpgroup's warps in step here: all four must have seen the stage
          // complete before its one signalling thread hands it back. Released early, the stage
          // could be refilled and complete its next phase (same parity) before a slow warp
          // looked, and that warp would then wait one phase behind the others (a later wgmma
          // without it hangs or faults, or its last wait expires).
          ptx::named_barrier_sync(3 + cw, 128);
          if (signals) detail::release_stage<T>(&empty_bar[stage], cta_rank);
        }
        prev_stage = stage;
        if (++stage == T::kStages) {
          stage = 0;
          phase ^= 1;
        }
      }
      ptx::wgmma_wait<0>();
      if (aborted) break;
      if (rows_live && kb_end > kb_begin && signals) detail::release_stage<T>(&empty_bar[prev_stage], cta_rank);
#pragma unroll
      for (int s = 0; s < T::kMSub; ++s) {
#pragma unroll
        for (int i = 0; i < T::kConsumerN / 2; ++i) ptx::reg_fence(acc[s][i]);
      }
      if (kb_end <= kb_begin || !rows_live) {
#pragma unroll
        for (int s = 0; s < T::kMSub; ++s) {
#pragma unroll
          for (int i = 0; i < T::kConsumerN / 2; ++i) acc[s][i] = 0.0f;
        }
      }

      // -- in-cluster split-K: the cluster's CTAs sum their partials and each stores its share
      //    of the tile (data-parallel schedules only: no fix-up, no hooks) --
      if constexpr (T::kClusterK > 1) {
        if (!detail::cluster_k_reduce<T>(p, acc[0], smem_epi, red_bars, reduced_tiles, krank, tc.m_block, tc.n_block,
                                         cw, ctid, warp_in_wg, lane)) {
          aborted = true;
          break;
        }
        ++reduced_tiles;
        continue;
      }

      // -- grouped epilogue: rows of the tile's group only; whole 64-row halves with TMA, a
      //    partial half with masked stores; the flag indexed by the flat m block --
      if constexpr (T::kGrouped) {
        if (gt.row_end <= gt.row_begin) continue;  // a cluster's padding CTA: no rows
        if constexpr (detail::role_epilogue<Role>()) {
          Role::template epilogue<T>(p, epi_state, acc[0], gt, ctid, &tma_d, smem_epi);
        } else {
          const uint32_t half_row0 = gt.row_begin + cw * 64;
          const uint32_t half_rows = gt.row_end > half_row0 ? min(gt.row_end - half_row0, 64u) : 0u;
          uint8_t* bufs = smem_epi + cw * 2 * T::kEpiChunkBytes;
          if (half_rows == 64) {
            detail::store_tile_tma<T>(&tma_d, acc[0], bufs, static_cast<int32_t>(half_row0),
                                      static_cast<int32_t>(tc.n_block * T::kBlockN), warp_in_wg, lane, signals,
                                      3 + cw);
          } else if (half_rows > 0) {
            detail::store_tile_masked<T>(p, acc[0], bufs, half_row0, half_rows, tc.n_block * T::kBlockN, warp_in_wg,
                                         lane, signals, 3 + cw);
          }
          if (p.tile_flags != nullptr) {
            if (signals) ptx::bulk_wait_group_all();
            ptx::named_barrier_sync(2, 256);
            if (ctid == 0) {
              sync::fence_acq_rel_sys();
              const uint64_t value = detail::tile_flag_value(p);
              sync::st_release_sys(p.tile_flags + gt.flat_m_block * p.num_n_blocks + gt.n_block, value);
              if (p.mblock_flags != nullptr) detail::count_mblock_tile(p, gt.flat_m_block, value);
            }
          }
        }
        continue;
      }

      // -- (grouped tiles never get here) stream-K / split-K fix-up (tile_scheduler.cuh, notes 3
      //    and 4): the last participant to arrive takes the sum of all partials and runs the
      //    epilogue --
      const uint32_t tile_idx = tc.m_block * p.num_n_blocks + tc.n_block;
      // A cluster's padding tile (past the last m block, or with pairs along n the last n block)
      // has nothing to store.
      const bool padding = tc.m_block >= p.num_m_blocks || (T::kClusterN > 1 && tc.n_block >= p.num_n_blocks);
      const uint32_t parts = sched.participants(item.tile);
      if (parts > 1) {
        if (padding) continue;  // nothing to do
        if (detail::fixup<T>(p, sched, item, tc.m_block, cta_rank, acc, ctid, split_last) == detail::kFixupStored) {
          continue;  // the last participant finishes the tile
        }
      }

      // -- epilogue --
      if constexpr (detail::role_epilogue<Role>() && !T::kGrouped) {
        static_assert(T::kMSub == 1, "a role's epilogue takes 128-row tiles");
        if (tc.m_block < p.num_m_blocks)
          Role::template epilogue<T>(p, epi_state, acc[0], tc.m_block, tc.n_block, ctid, &tma_d, smem_epi);
        continue;  // the role raises whatever flags its tiles need
      } else if constexpr (T::kEpilogue == kEpilogueAtomicAdd) {
        const uint32_t col0 = tc.n_block * T::kBlockN + 2 * (lane % 4);
#pragma unroll
        for (int s = 0; s < T::kMSub; ++s) {
          const uint32_t row0 = tc.m_block * T::kBlockM + (2 * s + cw) * 64 + warp_in_wg * 16 + lane / 4;
          detail::store_tile<T>(p, acc[s], row0, col0);
        }
      } else if (!padding) {  // a cluster's padding tile stores nothing
        uint8_t* bufs = smem_epi + cw * T::kEpiBufs * T::kEpiChunkBytes;
        const uint32_t col0 = tc.n_block * T::kBlockN;
        if constexpr (T::kSwapAB) {
          // This consumer's 64 weight rows are output columns, the tile's width output rows.
          // (64-row tiles: both consumers' columns are the tile's 64; each owns half of its rows.)
          detail::store_tile_transposed<T>(
              &tma_d, acc[0], bufs, static_cast<int32_t>(col0 + (T::kBlockM == 64 ? cw * T::kConsumerN : 0)),
              static_cast<int32_t>(tc.m_block * T::kBlockM + (T::kBlockM == 64 ? 0 : cw * 64)), warp_in_wg, lane, signals,
              3 + cw);
        } else {
#pragma unroll
          for (int s = 0; s < T::kMSub; ++s) {
            const uint32_t row0 = tc.m_block * T::kBlockM + (2 * s + cw) * 64;
            // A sub-tile wholly past m (the last m block of a tall tile) stores nothing.
            if (s > 0 && row0 >= p.m) break;
            detail::store_tile_tma<T>(&tma_d, acc[s], bufs, static_cast<int32_t>(row0), static_cast<int32_t>(col0),
                                      warp_in_wg, lane, signals, 3 + cw);
            if constexpr (T::kBlockN % 64 != 0) {
              // The last BLOCK_N % 64 columns: a 64-column TMA box would overwrite the next tile's.
              constexpr int kFull = T::kBlockN / 64;
              const uint32_t rows = row0 < p.m ? min(p.m - row0, 64u) : 0u;
              detail::store_chunk_masked<T, T::kBlockN % 64>(p, acc[s],
                                                             ptx::smem_addr(bufs) + (kFull % T::kEpiBufs) * T::kEpiChunkBytes,
                                                             kFull * 64, row0, rows, col0 + kFull * 64, warp_in_wg,
                                                             lane, signals, 3 + cw);
            }
          }
        }
      }

      if (p.tile_flags != nullptr && !padding) {
        // Every consumer thread's stores (and each leader's TMA stores, once complete) happen
        // before the barrier; the system-scope fence by the signalling thread makes them visible
        // (cumulatively) before the flag.
        if (T::kEpilogue != kEpilogueAtomicAdd && signals) ptx::bulk_wait_group_all();
        ptx::named_barrier_sync(2, T::kConsumerThreads);
        if (ctid == 0) {
          sync::fence_acq_rel_sys();
          sync::st_release_sys(p.tile_flags + tile_idx, detail::tile_flag_value(p));
        }
      }
    }
    if constexpr (detail::role_epilogue<Role>()) Role::template epilogue_end<T>(p, epi_state, ctid);
    if (ctid == 0) MK_TRACE_MARK(4);
    // Outstanding TMA stores must finish reading shared memory before the block exits; their
    // writes to global memory complete with the grid. A role that acts on the block's end
    // (block_exit, its own epilogue) gets them complete.
    if constexpr (detail::role_epilogue<Role>() || Role::kHasBlockExit) {
      if (signals) ptx::bulk_wait_group_all();
    } else {
      if (signals) ptx::bulk_wait_group_read<0>();
    }
  }

  // A CTA must not exit while its cluster peer may still multicast into its shared memory, arrive
  // on its barriers or (in-cluster split-K) read its partial.
  if constexpr (T::kClusterSize > 1) {
    __syncwarp();
    ptx::cluster_sync();
  }
  if (Role::kHasBlockExit || (kMaySplit && p.split != nullptr)) {
    __syncwarp();  // the producer's thread 0 rejoins its warp before the (aligned) block barrier
    __syncthreads();
    if (kMaySplit && p.split != nullptr && threadIdx.x == 0) split_block_done(p.split, true);
  }
  if constexpr (Role::kHasBlockExit) {
    if (threadIdx.x == 0) Role::block_exit(p);
  }
#endif
}

}  // namespace mkernel::kernels
