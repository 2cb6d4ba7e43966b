// slice.cuh: how the communication blocks of a fused op share one transfer: every block moves a
// slice of every step, so all of them drive their links at once (ag_gemm.cuh, ring_attn.cuh).
#pragma once

#include <cstdint>

namespace mkernel::kernels {

// Block `block` of `blocks`'s part [begin, begin + bytes) of a `bytes`-long transfer, in whole
// 16-byte units (the transfer is a multiple of 16 bytes).
struct Slice {
  uint64_t begin, bytes;
};

#if defined(__CUDACC__)
__device__ __forceinline__ Slice slice_of(uint64_t bytes, uint32_t block, uint32_t blocks) {
  const uint64_t units = bytes / 16, per = (units + blocks - 1) / blocks;
  const uint64_t b0 = min(units, uint64_t{block} * per), b1 = min(units, b0 + per);
  return Slice{b0 * 16, (b1 - b0) * 16};
}
#endif

}  // namespace mkernel::kernels
