// ring_attn_launch.cuh: host-side launch of one instantiation of the ring-attention kernel, and
// the instantiations the library carries (ring_attn_d64.cu, ring_attn_d128.cu: the attention
// core's default configuration of each head dim).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "fused/ring_attn/ring_attn.cuh"
#include "fused/ring_attn/ring_attn.h"

namespace mkernel::kernels {

// Dynamic shared memory of a block: the attention core's, or the communication blocks' bulk
// copier (1024-aligned), whichever is larger.
template <class T>
constexpr uint32_t ring_smem_bytes() {
  return std::max<uint32_t>(T::kSmemBytes, BulkCopier::kSmemBytes + 1024);
}

// Kernel parameters stay within the classic 4 KB (tensor maps of the slots included).
static_assert(sizeof(RingAttnMaps) + sizeof(RingAttnLaunch) <= 4096, "ring kernel parameters over 4 KB");

template <class T, bool kAdaptive>
AttnResult launch_ring_attention_kernel(const RingAttnMaps& maps, const RingAttnLaunch& params, uint32_t grid,
                                        cudaStream_t stream) {
  static_assert(ring_smem_bytes<T>() <= 227 * 1024,
                "the ring kernel's shared memory is over the 227 KB a block may use");
  auto* kernel = &ring_attention_kernel<T, kAdaptive>;
  const int smem = static_cast<int>(ring_smem_bytes<T>());
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess)
    return AttnResult{AttnError::kCudaError,
                      "cudaFuncSetAttribute(smem " + std::to_string(smem) + "): " + cudaGetErrorString(e)};
  kernel<<<dim3(grid), dim3(T::kThreads), smem, stream>>>(maps, params);
  e = cudaGetLastError();
  if (e != cudaSuccess)
    return AttnResult{AttnError::kCudaError, std::string("ring_attention_kernel launch: ") + cudaGetErrorString(e)};
  return {};
}

// The built instantiations: 160-key blocks at head dims 64 and 128 (the core's defaults),
// ping-pong on.
using RingTraitsD64 = Sm90AttnTraits<64, 160, 2, true>;
using RingTraitsD128 = Sm90AttnTraits<128, 160, 2, true>;
// adaptive: the instantiation for plans with an adaptive split (RingAttnConfig::adaptive_split).
AttnResult launch_ring_attention_d64(const RingAttnMaps& maps, const RingAttnLaunch& params, uint32_t grid,
                                     bool adaptive, cudaStream_t stream);
AttnResult launch_ring_attention_d128(const RingAttnMaps& maps, const RingAttnLaunch& params, uint32_t grid,
                                      bool adaptive, cudaStream_t stream);

}  // namespace mkernel::kernels
