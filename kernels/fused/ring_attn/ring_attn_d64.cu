// ring_attn_d64.cu: the head-dim-64 instantiation of the ring-attention kernel.
#include "fused/ring_attn/ring_attn_launch.cuh"

namespace mkernel::kernels {

AttnResult launch_ring_attention_d64(const RingAttnMaps& maps, const RingAttnLaunch& params, uint32_t grid,
                                     cudaStream_t stream) {
  return launch_ring_attention_kernel<RingTraitsD64>(maps, params, grid, stream);
}

}  // namespace mkernel::kernels
