// moe_route.cu: the routing block launched on its own (moe_route.h).
#include "fused/moe/moe_route.h"

namespace mkernel::kernels {

namespace {

constexpr uint32_t kRouteSmemBudget = 200 * 1024;

__global__ void __launch_bounds__(1024) moe_route_kernel(MoeRouteArgs a, uint32_t warps) {
  extern __shared__ uint32_t counts[];
  moe_route_block(a, counts, warps);
}

std::string str(uint64_t v) { return std::to_string(v); }

}  // namespace

std::string moe_route_check(const MoeRouteArgs& a) {
  const MoeShape& s = a.shape;
  const uint32_t world = s.layout.world();
  if (s.layout.nodes == 0 || s.layout.gpus == 0)
    return "layout: " + str(s.layout.nodes) + " x " + str(s.layout.gpus) + "; expected at least 1 x 1";
  if (a.rank >= world) return "rank: " + str(a.rank) + "; expected below the world size " + str(world);
  if (s.experts == 0 || s.experts % world != 0)
    return "experts: " + str(s.experts) + "; expected a positive multiple of the world size " + str(world);
  if (s.top_k == 0 || s.top_k > kMoeMaxTopK || s.top_k > s.experts)
    return "top_k: " + str(s.top_k) + "; expected 1 .. min(experts, " + str(kMoeMaxTopK) + ")";
  if (moe_route_warps(s, kRouteSmemBudget) == 0)
    return "experts + ranks + nodes + 32 x top_k: " + str(moe_route_words_per_warp(s)) + "; expected at most " +
           str(kRouteSmemBudget / 4);
  if (a.tokens > 0 && (!a.choices || !a.pos || !a.npos || !a.slot))
    return "choices/pos/npos/slot: a null pointer; expected device arrays";
  if (!a.send_tokens || !a.node_tokens || !a.rows || !a.result)
    return "send_tokens/node_tokens/rows/result: a null pointer; expected device arrays";
  return "";
}

cudaError_t moe_route_launch(const MoeRouteArgs& a, cudaStream_t stream) {
  if (!moe_route_check(a).empty()) return cudaErrorInvalidValue;
  const uint32_t warps = moe_route_warps(a.shape, kRouteSmemBudget);
  const size_t smem = moe_route_smem_bytes(a.shape, warps);
  if (smem > 48 * 1024) {
    const cudaError_t e =
        cudaFuncSetAttribute(moe_route_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (e != cudaSuccess) return e;
  }
  moe_route_kernel<<<1, warps * 32, smem, stream>>>(a, warps);
  return cudaGetLastError();
}

std::string describe_moe_route(const MoeRouteResult& r, const MoeRouteArgs& a) {
  switch (r.code) {
    case kMoeRouteOk: return "";
    case kMoeRouteBadChoice:
      return "rank " + str(a.rank) + " token " + str(r.index) + " choice " + str(r.value) +
             ": an expert outside -1 (no choice) .. " + str(a.shape.experts - 1) + ", or chosen twice by the token";
    case kMoeRouteRankOverflow:
      return "routing sends " + str(r.value) + " tokens from rank " + str(a.rank) + " to rank " + str(r.index) +
             "; recv_tokens_per_source is " + str(a.capacity);
    case kMoeRouteNodeOverflow:
      return "routing sends " + str(r.value) + " tokens from rank " + str(a.rank) + " to node " + str(r.index) +
             "; recv_tokens_per_source is " + str(a.capacity);
    default: return "unknown routing result " + str(r.code);
  }
}

}  // namespace mkernel::kernels
