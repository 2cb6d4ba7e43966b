// moe_act.cu: the activation between the MoE MLP's grouped GEMMs (moe_act.h).
#include "fused/moe/moe_act.h"

#include <cuda_bf16.h>

#include <algorithm>

namespace mkernel::kernels {

namespace {

constexpr int kThreads = 256;

template <MoeAct A>
__device__ __forceinline__ float act(float v) {
  if constexpr (A == MoeAct::kSwiGlu || A == MoeAct::kSilu) {
    return v / (1.0f + expf(-v));
  } else if constexpr (A == MoeAct::kGeGlu || A == MoeAct::kGelu) {
    return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
  } else {
    return fmaxf(v, 0.0f);
  }
}

// One thread: 8 columns (16 bytes) of one row; the grid strides over rows x inter / 8. The row
// count is read once per thread from the offsets the dispatch wrote.
template <MoeAct A>
__global__ void __launch_bounds__(kThreads) moe_act_kernel(const uint4* __restrict__ y, uint4* h,
                                                           const uint32_t* __restrict__ offsets, uint32_t groups,
                                                           uint64_t capacity, uint32_t inter) {
  constexpr bool kGated = moe_act_gated(A);
  const uint64_t rows = min(static_cast<uint64_t>(offsets[groups]), capacity);
  const uint32_t vecs = inter / 8;                         // 16-byte vectors of h per row
  const uint32_t in_vecs = kGated ? 2 * vecs : vecs;       // of y per row
  const uint64_t total = rows * vecs;
  for (uint64_t i = blockIdx.x * uint64_t{kThreads} + threadIdx.x; i < total; i += uint64_t{gridDim.x} * kThreads) {
    const uint64_t r = i / vecs;
    const uint32_t c = static_cast<uint32_t>(i - r * vecs);
    const uint4 g = y[r * in_vecs + c];
    const __nv_bfloat162* gp = reinterpret_cast<const __nv_bfloat162*>(&g);
    uint4 o;
    __nv_bfloat162* op = reinterpret_cast<__nv_bfloat162*>(&o);
    if constexpr (kGated) {
      const uint4 u = y[r * in_vecs + vecs + c];
      const __nv_bfloat162* up = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 gv = __bfloat1622float2(gp[j]), uv = __bfloat1622float2(up[j]);
        op[j] = __floats2bfloat162_rn(act<A>(gv.x) * uv.x, act<A>(gv.y) * uv.y);
      }
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 gv = __bfloat1622float2(gp[j]);
        op[j] = __floats2bfloat162_rn(act<A>(gv.x), act<A>(gv.y));
      }
    }
    h[r * vecs + c] = o;
  }
}

}  // namespace

const char* moe_act_name(MoeAct a) {
  switch (a) {
    case MoeAct::kSwiGlu: return "swiglu";
    case MoeAct::kGeGlu: return "geglu";
    case MoeAct::kSilu: return "silu";
    case MoeAct::kGelu: return "gelu";
    case MoeAct::kRelu: return "relu";
  }
  return "?";
}

cudaError_t moe_activation_launch(MoeAct act, const void* y, void* h, const uint32_t* offsets, uint32_t groups,
                                  uint64_t capacity, uint32_t inter, int sms, cudaStream_t stream) {
  if (y == nullptr || h == nullptr || offsets == nullptr || inter == 0 || inter % 8 != 0 || capacity == 0 ||
      (reinterpret_cast<uintptr_t>(y) | reinterpret_cast<uintptr_t>(h)) % 16 != 0 || (moe_act_gated(act) && y == h))
    return cudaErrorInvalidValue;
  // Enough blocks to cover the capacity's vectors, at most 8 per SM (the loop strides the rest).
  const uint64_t vecs = capacity * (inter / 8);
  const uint64_t want = (vecs + kThreads - 1) / kThreads;
  const unsigned blocks = static_cast<unsigned>(std::max<uint64_t>(1, std::min<uint64_t>(want, uint64_t(sms > 0 ? sms : 132) * 8)));
  const auto* yv = static_cast<const uint4*>(y);
  auto* hv = static_cast<uint4*>(h);
  switch (act) {
    case MoeAct::kSwiGlu: moe_act_kernel<MoeAct::kSwiGlu><<<blocks, kThreads, 0, stream>>>(yv, hv, offsets, groups, capacity, inter); break;
    case MoeAct::kGeGlu: moe_act_kernel<MoeAct::kGeGlu><<<blocks, kThreads, 0, stream>>>(yv, hv, offsets, groups, capacity, inter); break;
    case MoeAct::kSilu: moe_act_kernel<MoeAct::kSilu><<<blocks, kThreads, 0, stream>>>(yv, hv, offsets, groups, capacity, inter); break;
    case MoeAct::kGelu: moe_act_kernel<MoeAct::kGelu><<<blocks, kThreads, 0, stream>>>(yv, hv, offsets, groups, capacity, inter); break;
    case MoeAct::kRelu: moe_act_kernel<MoeAct::kRelu><<<blocks, kThreads, 0, stream>>>(yv, hv, offsets, groups, capacity, inter); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace mkernel::kernels
