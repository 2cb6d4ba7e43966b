// sm90_bf16_gemm_instance.cuh: the library's instantiations of the persistent GEMM for one
// BLOCK_N (clusters of 1, pairs along m and, for the store epilogue, pairs along n and 2 x 2
// clusters; store and atomic-add epilogues; no role function). Every BLOCK_N is
// a translation unit of its own, generated from sm90_bf16_gemm_instance.cu.in by
// kernels/CMakeLists.txt, so the instantiations compile in parallel and cannot drift apart.
#pragma once

#include "gemm/sm90_bf16_gemm_dispatch.h"
#include "gemm/sm90_bf16_gemm_launch.cuh"

namespace mkernel::kernels::detail {

// 2 x 2 clusters (cluster_m = cluster_n = 2) are built for kGemmQuadWidths only.
inline GemmResult quad_not_built(int block_n) {
  return GemmResult{GemmError::kInvalidConfig, "cluster_m = cluster_n = 2 is not built for block_n = " +
                                                   std::to_string(block_n) + " (expected 128, 192 or 256)"};
}

template <int kBlockN, int kClusterM, uint32_t kEpilogue, int kClusterN = 1>
using LibraryTraits =
    Sm90GemmTraits<kBlockN, gemm_stages_for_block_n(kBlockN), kClusterM, kEpilogue, false, 128, false, 1, kClusterN>;

template <int kBlockN>
GemmResult launch_block_n(const GemmPlan& plan, cudaStream_t stream) {
  const bool add = plan.epilogue == kEpilogueAtomicAdd;
  if (plan.config.cluster_n == 2 && plan.config.cluster_m == 2 && !add) {
    if constexpr (gemm_quad_width_built(kBlockN)) {
      return launch_sm90_bf16_gemm<LibraryTraits<kBlockN, 2, kEpilogueStore, 2>, NoRole>(plan, stream);
    } else {
      return quad_not_built(kBlockN);
    }
  }
  if (plan.config.cluster_n == 2 && !add) {
    return launch_sm90_bf16_gemm<LibraryTraits<kBlockN, 1, kEpilogueStore, 2>, NoRole>(plan, stream);
  }
  if (plan.config.cluster_m == 2) {
    return add ? launch_sm90_bf16_gemm<LibraryTraits<kBlockN, 2, kEpilogueAtomicAdd>, NoRole>(plan, stream)
               : launch_sm90_bf16_gemm<LibraryTraits<kBlockN, 2, kEpilogueStore>, NoRole>(plan, stream);
  }
  return add ? launch_sm90_bf16_gemm<LibraryTraits<kBlockN, 1, kEpilogueAtomicAdd>, NoRole>(plan, stream)
             : launch_sm90_bf16_gemm<LibraryTraits<kBlockN, 1, kEpilogueStore>, NoRole>(plan, stream);
}

template <int kBlockN>
int max_resident_quad_block_n(int num_sms) {
  if constexpr (gemm_quad_width_built(kBlockN)) {
    return max_resident_gemm_blocks<LibraryTraits<kBlockN, 2, kEpilogueStore, 2>, NoRole>(num_sms);
  } else {
    return 0;
  }
}

template <int kBlockN, int kClusterM>
using TallTraits = Sm90GemmTraits<kBlockN, gemm_stages_for_block_n(kBlockN, 256), kClusterM, kEpilogueStore, false, 256>;

template <int kBlockN>
GemmResult launch_tall_block_n(const GemmPlan& plan, cudaStream_t stream) {
  return plan.config.cluster_m == 2 ? launch_sm90_bf16_gemm<TallTraits<kBlockN, 2>, NoRole>(plan, stream)
                                    : launch_sm90_bf16_gemm<TallTraits<kBlockN, 1>, NoRole>(plan, stream);
}

template <int kBlockN, int kClusterM, int kClusterN = 1>
using SwapTraits =
    Sm90GemmTraits<kBlockN, gemm_stages_for_block_n(kBlockN), kClusterM, kEpilogueStore, false, 128, true, 1, kClusterN>;

template <int kBlockN>
GemmResult launch_swap_block_n(const GemmPlan& plan, cudaStream_t stream) {
  if (plan.config.cluster_n == 2 && plan.config.cluster_m == 2) {
    if constexpr (gemm_quad_width_built(kBlockN)) {
      return launch_sm90_bf16_gemm<SwapTraits<kBlockN, 2, 2>, NoRole>(plan, stream);
    } else {
      return quad_not_built(kBlockN);
    }
  }
  if (plan.config.cluster_n == 2) return launch_sm90_bf16_gemm<SwapTraits<kBlockN, 1, 2>, NoRole>(plan, stream);
  return plan.config.cluster_m == 2 ? launch_sm90_bf16_gemm<SwapTraits<kBlockN, 2>, NoRole>(plan, stream)
                                    : launch_sm90_bf16_gemm<SwapTraits<kBlockN, 1>, NoRole>(plan, stream);
}

template <int kBlockN, int kClusterM>
using Swap64Traits =
    Sm90GemmTraits<kBlockN, gemm_stages_for_block_n(kBlockN, 64), kClusterM, kEpilogueStore, false, 64, true>;

template <int kBlockN>
GemmResult launch_swap64_block_n(const GemmPlan& plan, cudaStream_t stream) {
  return plan.config.cluster_m == 2 ? launch_sm90_bf16_gemm<Swap64Traits<kBlockN, 2>, NoRole>(plan, stream)
                                    : launch_sm90_bf16_gemm<Swap64Traits<kBlockN, 1>, NoRole>(plan, stream);
}

template <int kBlockN, int kClusterM, int kClusterN = 1>
using M192Traits =
    Sm90GemmTraits<kBlockN, gemm_stages(kBlockN, 192, 1), kClusterM, kEpilogueStore, false, 192, false, 1, kClusterN>;
static_assert(M192Traits<192, 1>::kEpiBytes == gemm_epi_bytes(192, 192, 1), "gemm_epi_bytes and the kernel's layout agree");

template <int kBlockN>
GemmResult launch_m192_block_n(const GemmPlan& plan, cudaStream_t stream) {
  if (plan.config.cluster_n == 2 && plan.config.cluster_m == 2) {
    if constexpr (gemm_quad_width_built(kBlockN)) {
      return launch_sm90_bf16_gemm<M192Traits<kBlockN, 2, 2>, NoRole>(plan, stream);
    } else {
      return quad_not_built(kBlockN);
    }
  }
  if (plan.config.cluster_n == 2) return launch_sm90_bf16_gemm<M192Traits<kBlockN, 1, 2>, NoRole>(plan, stream);
  return plan.config.cluster_m == 2 ? launch_sm90_bf16_gemm<M192Traits<kBlockN, 2>, NoRole>(plan, stream)
                                    : launch_sm90_bf16_gemm<M192Traits<kBlockN, 1>, NoRole>(plan, stream);
}

template <int kBlockN, int kClusterK>
using SwapKTraits =
    Sm90GemmTraits<kBlockN, gemm_stages(kBlockN, 128, kClusterK), 1, kEpilogueStore, false, 128, true, kClusterK>;
static_assert(SwapKTraits<128, 2>::kEpiBytes == gemm_epi_bytes(128, 128, 2) &&
                  SwapKTraits<64, 8>::kEpiBytes == gemm_epi_bytes(64, 128, 8),
              "gemm_epi_bytes and the kernel's layout agree");

template <int kBlockN>
GemmResult launch_swapk_block_n(const GemmPlan& plan, cudaStream_t stream) {
  switch (plan.config.cluster_k) {
    case 2: return launch_sm90_bf16_gemm<SwapKTraits<kBlockN, 2>, NoRole>(plan, stream);
    case 4: return launch_sm90_bf16_gemm<SwapKTraits<kBlockN, 4>, NoRole>(plan, stream);
    case 8: return launch_sm90_bf16_gemm<SwapKTraits<kBlockN, 8>, NoRole>(plan, stream);
    default:
      return GemmResult{GemmError::kInvalidConfig,
                        "plan.config.cluster_k = " + std::to_string(plan.config.cluster_k) + " is not built (expected 2, 4 or 8)"};
  }
}

template <int kBlockN>
int max_resident_swapk_block_n(int cluster_k, int num_sms) {
  switch (cluster_k) {
    case 2: return max_resident_gemm_blocks<SwapKTraits<kBlockN, 2>, NoRole>(num_sms);
    case 4: return max_resident_gemm_blocks<SwapKTraits<kBlockN, 4>, NoRole>(num_sms);
    case 8: return max_resident_gemm_blocks<SwapKTraits<kBlockN, 8>, NoRole>(num_sms);
    default: return 0;
  }
}

template <int kBlockN>
int max_resident_block_n(int cluster_m, int num_sms) {
  return cluster_m == 2 ? max_resident_gemm_blocks<LibraryTraits<kBlockN, 2, kEpilogueStore>, NoRole>(num_sms)
                        : max_resident_gemm_blocks<LibraryTraits<kBlockN, 1, kEpilogueStore>, NoRole>(num_sms);
}

}  // namespace mkernel::kernels::detail
