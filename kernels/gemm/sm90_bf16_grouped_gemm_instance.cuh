// sm90_bf16_grouped_gemm_instance.cuh: the library's instantiations of the grouped GEMM for one
// BLOCK_N (cluster 1 and 2, store epilogue, no role function): the persistent GEMM kernel with
// grouped traits. One translation unit per BLOCK_N, generated from
// sm90_bf16_grouped_gemm_instance.cu.in by kernels/CMakeLists.txt.
#pragma once

#include "gemm/sm90_bf16_gemm_dispatch.h"
#include "gemm/sm90_bf16_gemm_launch.cuh"

namespace mkernel::kernels {

// Grouped traits: the dense pipeline depth per tile width, the store epilogue.
template <int kBlockN, int kClusterM>
using GroupedGemmTraits =
    Sm90GemmTraits<kBlockN, detail::gemm_stages_for_block_n(kBlockN), kClusterM, kEpilogueStore, true>;

namespace detail {

template <int kBlockN>
GemmResult launch_grouped_block_n(const GemmPlan& plan, cudaStream_t stream) {
  if (plan.config.cluster_m == 2) return launch_sm90_bf16_gemm<GroupedGemmTraits<kBlockN, 2>, NoRole>(plan, stream);
  return launch_sm90_bf16_gemm<GroupedGemmTraits<kBlockN, 1>, NoRole>(plan, stream);
}

template <int kBlockN>
int max_resident_grouped_block_n(int cluster_m, int num_sms) {
  return cluster_m == 2 ? max_resident_gemm_blocks<GroupedGemmTraits<kBlockN, 2>, NoRole>(num_sms)
                        : max_resident_gemm_blocks<GroupedGemmTraits<kBlockN, 1>, NoRole>(num_sms);
}

}  // namespace detail
}  // namespace mkernel::kernels
