// moe_route.h: host launcher of the MoE routing phase on its own (moe_route.cuh): one block,
// on a stream, no host synchronisation. The fused MoE kernels run the same block function inside
// their persistent launch; this entry point serves the dispatch-only path and the tests.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "fused/moe/moe_route.cuh"

namespace mkernel::kernels {

// "" when the arguments are usable, else what is wrong (field, value, expectation).
std::string moe_route_check(const MoeRouteArgs& a);

// Launches the routing block (moe_route.cuh) on `stream`. The result word and the outputs are
// written by the kernel; read them after the stream reached it.
cudaError_t moe_route_launch(const MoeRouteArgs& a, cudaStream_t stream);

// The message for a result word (empty for kMoeRouteOk), naming the token, rank or node.
std::string describe_moe_route(const MoeRouteResult& r, const MoeRouteArgs& a);

}  // namespace mkernel::kernels
