// moe_act.h: the activation between an MoE MLP's two grouped GEMMs (moe_act.cu), and its host
// reference.
//
//   gated (kSwiGlu, kGeGlu):  h[r, j] = act(y[r, j]) * y[r, inter + j]   y [rows, 2 inter] -> h [rows, inter]
//                             (the first GEMM's weight holds the gate rows first, then the up rows)
//   plain (kSilu, kGelu, kRelu): h[r, j] = act(y[r, j])                  y [rows, inter] -> h (may be y)
//
// silu(v) = v / (1 + e^-v); gelu(v) = v / 2 (1 + erf(v / sqrt 2)) (the exact form, torch's
// default); relu(v) = max(v, 0). The inputs are bf16 (the GEMM's rounded outputs), the arithmetic
// fp32, each result rounded to bf16 once. Only the rows the offsets name are touched: rows
// [0, offsets[groups]) with offsets in device memory (written by the dispatch on the same
// stream; the host never reads them), clamped to the capacity.
#pragma once

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>

namespace mkernel::kernels {

enum class MoeAct : uint32_t { kSwiGlu = 0, kGeGlu = 1, kSilu = 2, kGelu = 3, kRelu = 4 };

constexpr bool moe_act_gated(MoeAct a) { return a == MoeAct::kSwiGlu || a == MoeAct::kGeGlu; }
const char* moe_act_name(MoeAct a);

// The activation of one value, as the kernel computes it (host reference for tests).
inline float moe_act_value(MoeAct a, float v) {
  switch (a) {
    case MoeAct::kSwiGlu:
    case MoeAct::kSilu: return v / (1.0f + std::exp(-v));
    case MoeAct::kGeGlu:
    case MoeAct::kGelu: return 0.5f * v * (1.0f + std::erf(v * 0.70710678118654752f));
    case MoeAct::kRelu: return v > 0.0f ? v : 0.0f;
  }
  return v;
}

// Enqueues the activation over rows [0, min(offsets[groups], capacity)). y and h 16-byte aligned,
// inter a positive multiple of 8. In place (h == y) only for plain activations. `sms`: the
// device's SM count (the grid is a few blocks per SM, striding over the rows).
cudaError_t moe_activation_launch(MoeAct act, const void* y, void* h, const uint32_t* offsets, uint32_t groups,
                                  uint64_t capacity, uint32_t inter, int sms, cudaStream_t stream);

}  // namespace mkernel::kernels
