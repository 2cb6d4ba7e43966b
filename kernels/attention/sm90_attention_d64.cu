// sm90_attention_d64.cu: the head-dim-64 instantiations of the attention kernel.
#include "attention/sm90_attention_launch.cuh"

namespace mkernel::kernels {

AttnResult launch_attention_d64(const AttnPlan& plan, cudaStream_t stream) {
  const AttnConfig& c = plan.config;
  if (c.block_n == 128 && c.pingpong == 1) return launch_sm90_attention<Sm90AttnTraits<64, 128, 2, true>>(plan, stream);
  if (c.block_n == 128 && c.pingpong == 0) return launch_sm90_attention<Sm90AttnTraits<64, 128, 2, false>>(plan, stream);
  if (c.block_n == 160 && c.pingpong == 1) return launch_sm90_attention<Sm90AttnTraits<64, 160, 2, true>>(plan, stream);
  if (c.block_n == 192 && c.pingpong == 1) return launch_sm90_attention<Sm90AttnTraits<64, 192, 2, true>>(plan, stream);
  return AttnResult{AttnError::kInvalidConfig, "head_dim 64: no kernel for block_n = " + std::to_string(c.block_n) +
                                                   ", pingpong = " + std::to_string(c.pingpong) +
                                                   " (built: block_n 128 with pingpong 0 or 1; 160 or 192 with pingpong 1)"};
}

}  // namespace mkernel::kernels
