// sm90_bf16_gemm_n256.cu: the library's BLOCK_N = 256 instantiations (cluster 1 and 2, store and
// atomic-add epilogues) of the persistent GEMM, with no role function.
#include "gemm/sm90_bf16_gemm_dispatch.h"
#include "gemm/sm90_bf16_gemm_launch.cuh"

namespace mkernel::kernels::detail {

namespace {
constexpr int kBlockN = 256;
constexpr int kStages = gemm_stages_for_block_n(kBlockN);
template <int kClusterM, uint32_t kEpilogue>
using Traits = Sm90GemmTraits<kBlockN, kStages, kClusterM, kEpilogue>;
}  // namespace

template <>
GemmResult launch_block_n<kBlockN>(const GemmPlan& plan, cudaStream_t stream) {
  const bool add = plan.epilogue == kEpilogueAtomicAdd;
  if (plan.config.cluster_m == 2) {
    return add ? launch_sm90_bf16_gemm<Traits<2, kEpilogueAtomicAdd>, NoRole>(plan, stream)
               : launch_sm90_bf16_gemm<Traits<2, kEpilogueStore>, NoRole>(plan, stream);
  }
  return add ? launch_sm90_bf16_gemm<Traits<1, kEpilogueAtomicAdd>, NoRole>(plan, stream)
             : launch_sm90_bf16_gemm<Traits<1, kEpilogueStore>, NoRole>(plan, stream);
}

template <>
int max_resident_block_n<kBlockN>(int cluster_m, int num_sms) {
  return cluster_m == 2 ? max_resident_gemm_blocks<Traits<2, kEpilogueStore>, NoRole>(num_sms)
                        : max_resident_gemm_blocks<Traits<1, kEpilogueStore>, NoRole>(num_sms);
}

}  // namespace mkernel::kernels::detail
