// sm90_attention_launch.cuh: host-side launch of one instantiation of the attention kernel
// template, and the instantiations the library carries (sm90_attention_d64.cu, _d128.cu).
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "attention/sm90_attention.cuh"
#include "attention/sm90_attention.h"

namespace mkernel::kernels {

template <class T>
AttnResult launch_sm90_attention(const AttnPlan& plan, cudaStream_t stream) {
  auto* kernel = &sm90_attention_kernel<T>;
  // The shared-memory opt-in is per function and per device; setting it again is cheap.
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(T::kSmemBytes));
  if (e != cudaSuccess) {
    return AttnResult{AttnError::kCudaError,
                      std::string("cudaFuncSetAttribute(smem ") + std::to_string(T::kSmemBytes) + "): " + cudaGetErrorString(e)};
  }
  kernel<<<dim3(static_cast<unsigned>(plan.config.num_blocks)), dim3(T::kThreads), T::kSmemBytes, stream>>>(plan.maps,
                                                                                                           plan.params);
  e = cudaGetLastError();
  if (e != cudaSuccess) {
    return AttnResult{AttnError::kCudaError, std::string("sm90_attention_kernel launch: ") + cudaGetErrorString(e)};
  }
  return {};
}

// Dispatch on the resolved configuration (block_n, pingpong) for one head dim.
AttnResult launch_attention_d64(const AttnPlan& plan, cudaStream_t stream);
AttnResult launch_attention_d128(const AttnPlan& plan, cudaStream_t stream);

}  // namespace mkernel::kernels
