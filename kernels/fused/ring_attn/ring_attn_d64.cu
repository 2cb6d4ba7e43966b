// ring_attn_d64.cu: the head-dim-64 instantiation of the ring-attention kernel.
#include "fused/ring_attn/ring_attn_launch.cuh"

namespace mkernel::kernels {

AttnResult launch_ring_attention_d64(const RingAttnMaps& maps, const RingAttnLaunch& params, uint32_t grid,
                                     bool adaptive, cudaStream_t stream) {
  return adaptive ? launch_ring_attention_kernel<RingTraitsD64, true>(maps, params, grid, stream)
                  : launch_ring_attention_kernel<RingTraitsD64, false>(maps, params, grid, stream);
}

}  // namespace mkernel::kernels
