// ring_attn_d128.cu: the head-dim-128 instantiation of the ring-attention kernel.
#include "fused/ring_attn/ring_attn_launch.cuh"

namespace mkernel::kernels {

AttnResult launch_ring_attention_d128(const RingAttnMaps& maps, const RingAttnLaunch& params, uint32_t grid,
                                      bool adaptive, cudaStream_t stream) {
  return adaptive ? launch_ring_attention_kernel<RingTraitsD128, true>(maps, params, grid, stream)
                  : launch_ring_attention_kernel<RingTraitsD128, false>(maps, params, grid, stream);
}

}  // namespace mkernel::kernels
