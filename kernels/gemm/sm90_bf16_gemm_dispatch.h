// sm90_bf16_gemm_dispatch.h: the launchers of the library's own instantiations, one translation
// unit per BLOCK_N of kGemmBlockWidths (sm90_bf16_gemm_n128.cu, ...) so they compile in parallel.
#pragma once

#include <cuda_runtime_api.h>

#include "gemm/sm90_bf16_gemm.h"

namespace mkernel::kernels::detail {

// Pipeline depth per BLOCK_N: as many 64-deep k stages (A's 128 x 64 tile and W's BLOCK_N x 64)
// as fit in the 227 KB a block may use beside the alignment slack (1 KB), the epilogue's staging
// buffers (32 KB) and the barriers; 6 for 128 columns, 5 for 144-176, 4 for 192-256.
// 256-row tiles (block_m = 256): 4 stages for 128 columns, 3 for 144-192. Swapped operands,
// narrow widths: 10 stages at 16 columns, 8 at 48-64, 6 at 96-112; with 64-row tiles 16 at 16
// columns, 12 at 64.
// The epilogue's shared memory (Sm90GemmTraits::kEpiBytes): two 8 KB staging buffers per consumer
// (32 KB); one per consumer with 192-row tiles (three consumers, 24 KB); split-K inside clusters
// (cluster_k > 1) receives a whole 128 x BLOCK_N fp32 tile there, more than 32 KB above 64
// columns.
constexpr int gemm_epi_bytes(int block_n, int block_m = 128, int cluster_k = 1) {
  if (block_m == 192) return 3 * 8 * 1024;
  return cluster_k > 1 && 128 * block_n * 4 > 32 * 1024 ? 128 * block_n * 4 : 32 * 1024;
}
constexpr int gemm_stages_for_block_n(int block_n, int block_m = 128, int epi_bytes = 32 * 1024) {
  const int budget = 227 * 1024 - 1024 - epi_bytes - 256;
  const int stages = budget / (block_m * 64 * 2 + block_n * 64 * 2);
  return stages > 16 ? 16 : stages;
}
static_assert(gemm_stages_for_block_n(128) == 6 && gemm_stages_for_block_n(256) == 4,
              "the depths the 128- and 256-wide tiles were tuned with");
static_assert(gemm_stages_for_block_n(128, 256) == 4 && gemm_stages_for_block_n(192, 256) == 3,
              "256-row tiles: at least 3 stages");
// Every instantiation's depth: what fits beside its epilogue space (the plan reports it).
constexpr int gemm_stages(int block_n, int block_m, int cluster_k) {
  return gemm_stages_for_block_n(block_n, block_m, gemm_epi_bytes(block_n, block_m, cluster_k));
}
static_assert(gemm_stages(128, 192, 1) == 5 && gemm_stages(192, 192, 1) == 4,
              "192-row tiles: 5 stages at 128 columns, 4 at 144-192");
static_assert(gemm_stages(128, 128, 2) == 5 && gemm_stages(80, 128, 2) == 7 && gemm_epi_bytes(64, 128, 2) == 32 * 1024,
              "in-cluster split-K: 7 stages at 80 columns, 6 at 96-112, 5 at 128; 64 and narrower unchanged");

template <int kBlockN>
GemmResult launch_block_n(const GemmPlan& plan, cudaStream_t stream);

template <int kBlockN>
int max_resident_block_n(int cluster_m, int num_sms);

// The same for 2 x 2 clusters (0 for a width of which they are not built).
template <int kBlockN>
int max_resident_quad_block_n(int num_sms);

// The 256-row instantiations (sm90_bf16_gemm_m256_n*.cu, store epilogue only; kGemmTallWidths).
template <int kBlockN>
GemmResult launch_tall_block_n(const GemmPlan& plan, cudaStream_t stream);

// The swapped-operand instantiations (sm90_bf16_gemm_swap_n*.cu, store epilogue only;
// kGemmSwapWidths).
template <int kBlockN>
GemmResult launch_swap_block_n(const GemmPlan& plan, cudaStream_t stream);

// The same with 64-row tiles (block_m = 64; kGemmSwap64Widths).
template <int kBlockN>
GemmResult launch_swap64_block_n(const GemmPlan& plan, cudaStream_t stream);

// The swapped-operand instantiations with split-K inside clusters of 2, 4 and 8 CTAs
// (sm90_bf16_gemm_swapk_n*.cu; kGemmSwapClusterKWidths), and how many of their blocks can be
// resident at once (whole clusters; 0 for a cluster size not built).
template <int kBlockN>
GemmResult launch_swapk_block_n(const GemmPlan& plan, cudaStream_t stream);

template <int kBlockN>
int max_resident_swapk_block_n(int cluster_k, int num_sms);

// The 192-row instantiations (sm90_bf16_gemm_m192_n*.cu, store epilogue only; kGemmM192Widths).
template <int kBlockN>
GemmResult launch_m192_block_n(const GemmPlan& plan, cudaStream_t stream);

// The grouped instantiations (sm90_bf16_grouped_gemm_n*.cu, generated like the above).
template <int kBlockN>
GemmResult launch_grouped_block_n(const GemmPlan& plan, cudaStream_t stream);

template <int kBlockN>
int max_resident_grouped_block_n(int cluster_m, int num_sms);

// Shared with the grouped GEMM's host code (sm90_bf16_gemm.cu): the device's SM count and
// compute capability (cached per device), and a 2-D bf16 tensor map with 128-byte swizzle
// (out-of-bounds elements read as zero, stores clipped) whose loads fill `l2_promotion` bytes
// of L2 on a miss (GemmConfig::l2_promotion).
GemmResult gemm_device_query(int* num_sms, int* major, int* minor);
GemmResult gemm_encode_tensor_map(CUtensorMap* map, const void* ptr, int64_t rows, int64_t k, int64_t ld,
                                  uint32_t box_rows, uint32_t box_cols, const char* name,
                                  int l2_promotion = kGemmDefaultL2Promotion);

}  // namespace mkernel::kernels::detail
