// moe.cu: the MoE dispatch and combine kernels and their host plan (moe.h).
#include "fused/moe/moe.h"

#include <cuda_bf16.h>

#include <algorithm>

#include "fused/moe/moe_comm.cuh"

namespace mkernel::kernels {

namespace {

constexpr int kThreads = 512;
constexpr uint32_t kRouteSmemBudget = 160 * 1024;

std::string str(uint64_t v) { return std::to_string(v); }

__global__ void __launch_bounds__(kThreads, 1) moe_dispatch_kernel(const MoeKernelArgs* args, MoeDispatchPtrs p) {
  using namespace moe_detail;
  const MoeKernelArgs& a = *args;
  extern __shared__ uint32_t route_smem[];
  const Ctx x{a, a.comm, launch_number(a.comm), previous_fused_launch(a.comm), wait_context(a.comm)};
  __shared__ bool ok;
  if (threadIdx.x == 0) ok = true;
  __syncthreads();
  if (blockIdx.x == 0) {
    const bool r = route_and_count(x, p, route_smem);
    if (threadIdx.x == 0) ok = r;
  } else if (threadIdx.x == 0) {
    ok = x.wait_local(kMoeFlagRouted, x.launch, where_tag(kStepMoeRoute, 0));
  }
  __syncthreads();
  const uint32_t gpus = a.layout.gpus, nodes = a.layout.nodes, world = a.layout.world();
  // Dispatch items, chunk-major so every destination's link is busy at once (note 1).
  const uint32_t dests = gpus + nodes - 1;
  for (uint32_t it = blockIdx.x; ok && it < dests * a.chunks; it += gridDim.x) {
    const uint32_t ch = it / dests, di = it % dests;
    const bool to_node = di >= gpus;
    const uint32_t dest = to_node ? a.layout.send_node(a.layout.node_of(a.rank), di - gpus + 1)
                                  : (di == 0 ? a.rank : a.layout.node_peer(a.rank, di));
    const bool r = dispatch_item(x, p, to_node, dest, ch);
    if (threadIdx.x == 0) ok = ok && r;
    __syncthreads();
  }
  // Forward items: per other node, its count records (ch == chunks) first, then its chunks.
  for (uint32_t it = blockIdx.x; ok && it < (nodes - 1) * (a.chunks + 1); it += gridDim.x) {
    const uint32_t ni = it % (nodes - 1), k = it / (nodes - 1);
    const uint32_t n = a.layout.recv_node(a.layout.node_of(a.rank), ni + 1);
    const bool r = forward_item(x, n, k == 0 ? a.chunks : k - 1);
    if (threadIdx.x == 0) ok = ok && r;
    __syncthreads();
  }
  if (blockIdx.x == 0 && ok) {
    MoeDispatchPtrs q = p;
    const bool r = lay_out_rows(x, q);
    if (threadIdx.x == 0) ok = r;
    __syncthreads();
  }
  // Expand items, chunk-major over the sources in arrival order.
  for (uint32_t it = blockIdx.x; ok && it < world * a.chunks; it += gridDim.x) {
    const bool r = expand_item(x, p, it % world, it / world);
    if (threadIdx.x == 0) ok = ok && r;
    __syncthreads();
  }
  __syncthreads();
  if (threadIdx.x == 0) end_launch(a);
}

__global__ void __launch_bounds__(kThreads, 1) moe_combine_kernel(const MoeKernelArgs* args, MoeCombinePtrs p) {
  using namespace moe_detail;
  const MoeKernelArgs& a = *args;
  const Ctx x{a, a.comm, launch_number(a.comm), previous_fused_launch(a.comm), wait_context(a.comm)};
  __shared__ bool ok;
  if (threadIdx.x == 0) ok = true;
  __syncthreads();
  const uint32_t nodes = a.layout.nodes, world = a.layout.world();
  for (uint32_t it = blockIdx.x; ok && it < world * a.chunks; it += gridDim.x) {
    const bool r = combine_item(x, p, it % world, it / world);
    if (threadIdx.x == 0) ok = ok && r;
    __syncthreads();
  }
  for (uint32_t it = blockIdx.x; ok && it < (nodes - 1) * a.chunks; it += gridDim.x) {
    const uint32_t n = a.layout.recv_node(a.layout.node_of(a.rank), it % (nodes - 1) + 1);
    const bool r = aggregate_item(x, n, it / (nodes - 1));
    if (threadIdx.x == 0) ok = ok && r;
    __syncthreads();
  }
  const uint32_t home_items = (a.tokens + a.chunk - 1) / a.chunk;
  for (uint32_t it = blockIdx.x; ok && it < home_items; it += gridDim.x) {
    const bool r = home_item(x, p, it);
    if (threadIdx.x == 0) ok = ok && r;
    __syncthreads();
  }
  __syncthreads();
  if (threadIdx.x == 0) end_launch(a);
}

uint64_t align16(uint64_t v) { return (v + 15) / 16 * 16; }

}  // namespace

int moe_default_blocks(const FusedLayout& layout, int sms) {
  const int want = 16 + 8 * static_cast<int>(layout.gpus - 1) + 4 * static_cast<int>(layout.nodes - 1);
  return std::max(2, std::min(std::min(want, 96), sms));
}

std::string MoePlan::create(const MoeSetup& setup, std::unique_ptr<MoePlan>* out) {
  const MoeGeometry& g = setup.geometry;
  const DeviceComm& c = setup.comm;
  if (std::string e = moe_check_geometry(g); !e.empty()) return e;
  if (g.layout.world() != c.world_size)
    return "layout: " + str(g.layout.nodes) + " x " + str(g.layout.gpus) + "; expected " + str(c.world_size) +
           " ranks (the communicator's size)";
  if (g.rank != c.rank) return "rank: " + str(g.rank) + "; expected the communicator's rank " + str(c.rank);
  if (c.nvl == nullptr) return "NVLink buffer: none; the MoE keeps its regions in it (Options::nvlink_bytes)";
  if (c.nvl_bytes < g.nvl_bytes_needed())
    return "NVLink buffer: " + str(c.nvl_bytes) + " bytes; expected at least " + str(g.nvl_bytes_needed()) +
           " (moe_nvlink_bytes)";
  if (c.nvl_fused_flags < g.nvl_flags_needed())
    return "NVLink fused-op flags: " + str(c.nvl_fused_flags) + "; expected at least " + str(g.nvl_flags_needed());
  if (g.layout.nodes > 1) {
    if (c.network_workspace == kNoBuffer || c.network_workspace >= c.num_buffers)
      return "network workspace: none; expected a registered buffer of at least " + str(g.net_bytes_needed()) +
             " bytes between nodes";
    if (c.buffer_bytes[c.network_workspace] < g.net_bytes_needed())
      return "network workspace: " + str(c.buffer_bytes[c.network_workspace]) + " bytes; expected at least " +
             str(g.net_bytes_needed());
    if (c.num_fused_flags < c.world_size * kAgreeWords + g.net_flags_needed())
      return "fused-op flags: " + str(c.num_fused_flags) + "; expected at least " +
             str(c.world_size * kAgreeWords + g.net_flags_needed());
  }
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
    return "device: cannot read the current device's SM count";
  std::unique_ptr<MoePlan> plan(new MoePlan());
  plan->geo_ = g;
  plan->blocks_ = setup.blocks > 0 ? std::min(setup.blocks, sms) : moe_default_blocks(g.layout, sms);

  const MoeShape shape = g.shape();
  const uint32_t world = g.layout.world(), nodes = g.layout.nodes, epr = g.experts_per_rank();
  const uint32_t route_warps = std::min<uint32_t>(kThreads / 32, moe_route_warps(shape, kRouteSmemBudget));
  if (route_warps == 0)
    return "experts + ranks + nodes: " + str(moe_route_columns(shape)) + "; expected at most " +
           str(kRouteSmemBudget / 4);
  plan->smem_ = size_t{route_warps} * moe_route_columns(shape) * 4;

  // Workspace: one allocation, zeroed once (flags and counters must start at zero).
  uint64_t off = 0;
  auto take = [&](uint64_t bytes) {
    const uint64_t at = off;
    off = align16(off + bytes);
    return at;
  };
  const uint64_t T = g.tokens, cap = g.capacity();
  const uint64_t o_pos = take(T * world * 4), o_npos = take(T * nodes * 4), o_slot = take(T * g.top_k * 4);
  const uint64_t o_send = take(world * 4), o_node = take(nodes * 4), o_rows = take(uint64_t{g.experts} * 4);
  const uint64_t o_result = take(sizeof(MoeRouteResult));
  const uint64_t o_order = take(world * cap * 4), o_norder = take(nodes * cap * 4);
  const uint64_t o_counts = take(uint64_t{world} * g.count_words() * 4);
  const uint64_t o_ebase = take((epr + 1) * 4ull), o_sbase = take(uint64_t{epr} * world * 4);
  const uint64_t o_flags = take((kMoeFlagExpanded + world) * 8ull);
  const uint64_t o_fwd = take(uint64_t{nodes} * g.layout.gpus * g.chunks() * 4);
  const uint64_t o_exp = take(world * 4ull);
  if (cudaMalloc(&plan->workspace_, off) != cudaSuccess || cudaMemset(plan->workspace_, 0, off) != cudaSuccess) {
    (void)cudaGetLastError();
    return "workspace: cannot allocate " + str(off) + " bytes of device memory";
  }
  auto* w = static_cast<uint8_t*>(plan->workspace_);

  MoeKernelArgs a;
  a.comm = c;
  a.layout = g.layout;
  a.rank = g.rank;
  a.tokens = g.tokens;
  a.hidden = g.hidden;
  a.out_hidden = g.out_hidden;
  a.experts = g.experts;
  a.top_k = g.top_k;
  a.capacity = g.capacity();
  a.chunk = g.chunk();
  a.chunks = g.chunks();
  a.meta_words = g.meta_words();
  a.count_words = g.count_words();
  a.net_count_words = g.net_count_words();
  a.rows_capacity = g.rows_capacity();
  a.off_counts = 0;
  a.count_stride = g.count_stride();
  a.off_tokens = g.off_tokens();
  a.off_meta = g.off_meta();
  a.off_partials = g.off_partials();
  if (nodes > 1) {
    a.net = c.buffers[c.network_workspace];
    a.net_in = 0;
    a.net_out = uint64_t{nodes} * g.net_slot();
    a.net_slot = g.net_slot();
    a.net_data = g.net_data();
    a.net_chunk_bytes = g.net_chunk_bytes();
    a.net_part = g.net_part();
  }
  a.route.shape = shape;
  a.route.rank = g.rank;
  a.route.tokens = g.tokens;
  a.route.capacity = g.capacity();
  a.route.pos = reinterpret_cast<uint32_t*>(w + o_pos);
  a.route.npos = reinterpret_cast<uint32_t*>(w + o_npos);
  a.route.slot = reinterpret_cast<uint32_t*>(w + o_slot);
  a.route.send_tokens = reinterpret_cast<uint32_t*>(w + o_send);
  a.route.node_tokens = reinterpret_cast<uint32_t*>(w + o_node);
  a.route.rows = reinterpret_cast<uint32_t*>(w + o_rows);
  a.route.result = reinterpret_cast<MoeRouteResult*>(w + o_result);
  a.route_warps = route_warps;
  a.order = reinterpret_cast<uint32_t*>(w + o_order);
  a.norder = reinterpret_cast<uint32_t*>(w + o_norder);
  a.recv_counts = reinterpret_cast<uint32_t*>(w + o_counts);
  a.expert_base = reinterpret_cast<uint32_t*>(w + o_ebase);
  a.source_base = reinterpret_cast<uint32_t*>(w + o_sbase);
  a.flags = reinterpret_cast<uint64_t*>(w + o_flags);
  a.fwd_count = reinterpret_cast<uint32_t*>(w + o_fwd);
  a.expand_count = reinterpret_cast<uint32_t*>(w + o_exp);
  a.apply_scores = setup.apply_scores ? 1 : 0;
  if (cudaMalloc(&plan->args_, sizeof(MoeKernelArgs)) != cudaSuccess ||
      cudaMemcpy(plan->args_, &a, sizeof(a), cudaMemcpyHostToDevice) != cudaSuccess) {
    (void)cudaGetLastError();
    return "workspace: cannot place the kernel arguments in device memory";
  }
  if (plan->smem_ > 48 * 1024 &&
      cudaFuncSetAttribute(moe_dispatch_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(plan->smem_)) != cudaSuccess) {
    (void)cudaGetLastError();
    return "dispatch kernel: cannot use " + str(plan->smem_) + " bytes of shared memory for the routing";
  }
  *out = std::move(plan);
  return "";
}

MoePlan::~MoePlan() {
  cudaFree(args_);
  cudaFree(workspace_);
}

cudaError_t MoePlan::dispatch(const void* x, const int32_t* choices, const float* scores, void* x_expert,
                              uint32_t* expert_offsets, int32_t* row_source, int32_t* row_token, float* row_score,
                              cudaStream_t stream) {
  if (!x || !choices || !scores || !x_expert || !expert_offsets) return cudaErrorInvalidValue;
  const MoeDispatchPtrs p{x, choices, scores, x_expert, expert_offsets, row_source, row_token, row_score};
  moe_dispatch_kernel<<<blocks_, kThreads, smem_, stream>>>(args_, p);
  return cudaGetLastError();
}

cudaError_t MoePlan::combine(const void* y_expert, void* out, cudaStream_t stream) {
  if (!y_expert || !out) return cudaErrorInvalidValue;
  const MoeCombinePtrs p{y_expert, out};
  moe_combine_kernel<<<blocks_, kThreads, 0, stream>>>(args_, p);
  return cudaGetLastError();
}

std::string MoePlan::describe() const {
  return "R=" + str(geo_.layout.world()) + " (" + str(geo_.layout.nodes) + "x" + str(geo_.layout.gpus) +
         ") T=" + str(geo_.tokens) + " H=" + str(geo_.hidden) + " N=" + str(geo_.out_hidden) + " E=" +
         str(geo_.experts) + " k=" + str(geo_.top_k) + " cap=" + str(geo_.capacity()) + " rows=" +
         str(geo_.rows_capacity()) + " chunk=" + str(geo_.chunk()) + " blocks=" + str(blocks_);
}

}  // namespace mkernel::kernels
