// sm90_bf16_gemm_dispatch.h: the launchers of the library's own instantiations, one translation
// unit per BLOCK_N (sm90_bf16_gemm_n128.cu, sm90_bf16_gemm_n256.cu) so they compile in parallel.
#pragma once

#include <cuda_runtime_api.h>

#include "gemm/sm90_bf16_gemm.h"

namespace mkernel::kernels::detail {

// Pipeline depth per BLOCK_N: as many 64-deep k stages as fit next to the barriers.
constexpr int gemm_stages_for_block_n(int block_n) { return block_n == 256 ? 4 : 6; }

template <int kBlockN>
GemmResult launch_block_n(const GemmPlan& plan, cudaStream_t stream);

template <int kBlockN>
int max_resident_block_n(int cluster_m, int num_sms);

}  // namespace mkernel::kernels::detail
