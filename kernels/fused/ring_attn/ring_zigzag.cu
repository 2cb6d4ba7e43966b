// ring_zigzag.cu: reordering a sequence into zigzag placement and back (ring_attn.h), one copy
// kernel: each output row (one position of one head, or of all heads in [B, S, H, D]) is read from
// the row the permutation names (ring_attn_plan.h: ring_zigzag_source / _target, the functions
// the CPU test checks).
#include <cuda_runtime.h>

#include <algorithm>

#include "fused/ring_attn/ring_attn.h"
#include "fused/ring_attn/ring_attn_plan.h"

namespace mkernel::kernels {

namespace {

// One warp per output row; rows of `row_bytes` (a multiple of 16 when `wide`).
__global__ void zigzag_kernel(const uint8_t* __restrict__ src, uint8_t* __restrict__ dst, uint64_t outer, uint64_t seq,
                              uint64_t row_bytes, uint64_t world, bool to_zigzag, bool wide) {
  const uint64_t warps = uint64_t{gridDim.x} * (blockDim.x / 32);
  const uint32_t lane = threadIdx.x % 32;
  for (uint64_t w = uint64_t{blockIdx.x} * (blockDim.x / 32) + threadIdx.x / 32; w < outer * seq; w += warps) {
    const uint64_t o = w / seq, p = w % seq;
    const uint64_t from = to_zigzag ? ring_zigzag_source(seq, static_cast<uint32_t>(world), p)
                                    : ring_zigzag_target(seq, static_cast<uint32_t>(world), p);
    const uint8_t* s = src + (o * seq + from) * row_bytes;
    uint8_t* d = dst + (o * seq + p) * row_bytes;
    if (wide) {
      for (uint64_t i = lane; i < row_bytes / 16; i += 32)
        reinterpret_cast<uint4*>(d)[i] = __ldg(reinterpret_cast<const uint4*>(s) + i);
    } else {
      for (uint64_t i = lane; i < row_bytes; i += 32) d[i] = s[i];
    }
  }
}

}  // namespace

AttnResult ring_zigzag_reorder(const void* src, void* dst, int64_t batch, int64_t heads, int64_t seq, int64_t head_dim,
                               uint32_t elem_bytes, AttnLayout layout, uint32_t world, bool to_zigzag,
                               cudaStream_t stream) {
  auto bad = [](AttnError code, std::string m) { return AttnResult{code, std::move(m)}; };
  if (batch < 1 || heads < 1 || head_dim < 1)
    return bad(AttnError::kInvalidShape, "batch = " + std::to_string(batch) + ", heads = " + std::to_string(heads) +
                                             ", head_dim = " + std::to_string(head_dim) + ": expected each at least 1");
  if (elem_bytes == 0 || elem_bytes > 16)
    return bad(AttnError::kInvalidDtype, "elem_bytes = " + std::to_string(elem_bytes) + ": expected 1 to 16");
  if (std::string e = ring_zigzag_check(seq < 0 ? 0 : static_cast<uint64_t>(seq), world); !e.empty())
    return bad(AttnError::kInvalidShape, e);
  if (layout != AttnLayout::kBHSD && layout != AttnLayout::kBSHD)
    return bad(AttnError::kInvalidLayout,
               "layout = " + std::to_string(static_cast<int>(layout)) + ": expected kBHSD or kBSHD (packed)");
  if (src == nullptr || dst == nullptr || src == dst)
    return bad(AttnError::kInvalidPointer, "src and dst must be distinct, non-null device pointers");
  // [B, H, S, D]: a row is one head's position; [B, S, H, D]: all heads of a position.
  const uint64_t outer = layout == AttnLayout::kBHSD ? uint64_t(batch) * heads : uint64_t(batch);
  const uint64_t row_bytes = uint64_t(head_dim) * elem_bytes * (layout == AttnLayout::kBHSD ? 1 : uint64_t(heads));
  const bool wide =
      row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0 && reinterpret_cast<uintptr_t>(dst) % 16 == 0;
  const uint64_t rows = outer * uint64_t(seq);
  const unsigned blocks = static_cast<unsigned>(std::min<uint64_t>((rows + 7) / 8, 65535));
  zigzag_kernel<<<blocks, 256, 0, stream>>>(static_cast<const uint8_t*>(src), static_cast<uint8_t*>(dst), outer,
                                            uint64_t(seq), row_bytes, world, to_zigzag, wide);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    return bad(AttnError::kCudaError, std::string("zigzag reorder launch: ") + cudaGetErrorString(e));
  return {};
}

}  // namespace mkernel::kernels
