// moe.cu: the MoE dispatch and combine kernels and their host plan (moe.h).
#include "fused/moe/moe.h"

#include <cuda_bf16.h>

#include <algorithm>

#include "fused/moe/moe_combine.cuh"

namespace mkernel::kernels {

GemmResult moe_fused_launch(const GemmPlan& engine, cudaStream_t stream);  // moe_fused.cu

namespace {

constexpr int kThreads = 512;
constexpr uint32_t kRouteSmemBudget = 160 * 1024;

std::string str(uint64_t v) { return std::to_string(v); }

__global__ void __launch_bounds__(kThreads, 1) moe_dispatch_kernel(const MoeKernelArgs* args, MoeDispatchPtrs p) {
  using namespace moe_detail;
  const MoeKernelArgs& a = *args;
  extern __shared__ uint32_t route_smem[];
  const Ctx x{a, a.comm, launch_number(a.comm), previous_fused_launch(a.comm), wait_context(a.comm)};
  (void)dispatch_stages(x, p, route_smem, blockIdx.x, gridDim.x);
  if (threadIdx.x == 0) end_launch(a);
}

__global__ void __launch_bounds__(kThreads, 1) moe_combine_kernel(const MoeKernelArgs* args, MoeCombinePtrs p) {
  using namespace moe_detail;
  const MoeKernelArgs& a = *args;
  const Ctx x{a, a.comm, launch_number(a.comm), previous_fused_launch(a.comm), wait_context(a.comm)};
  (void)combine_stages(x, p, blockIdx.x, gridDim.x);
  if (threadIdx.x == 0) end_launch(a);
}

uint64_t align16(uint64_t v) { return (v + 15) / 16 * 16; }

}  // namespace

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
    if (c.num_fused_flags < agree_area_flags(c) + g.net_flags_needed())
      return "fused-op flags: " + str(c.num_fused_flags) + "; expected at least " +
             str(agree_area_flags(c) + g.net_flags_needed());
  }
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
    return "device: cannot read the current device's SM count";
  std::unique_ptr<MoePlan> plan(new MoePlan());
  plan->geo_ = g;
  plan->blocks_ = setup.blocks > 0  ? std::min(setup.blocks, sms)
                  : setup.fused     ? moe_default_blocks(g.layout, sms)
                                    : moe_standalone_blocks(g, sms);

  const MoeShape shape = g.shape();
  const uint32_t world = g.layout.world(), nodes = g.layout.nodes, epr = g.experts_per_rank();
  const uint32_t threads = setup.fused ? kMoeFusedThreads : static_cast<uint32_t>(kThreads);
  const uint32_t route_warps = std::min<uint32_t>(threads / 32, moe_route_warps(shape, kRouteSmemBudget));
  if (route_warps == 0)
    return "experts + ranks + nodes + 32 x top_k: " + str(moe_route_words_per_warp(shape)) + "; expected at most " +
           str(kRouteSmemBudget / 4);
  plan->smem_ = moe_route_smem_bytes(shape, route_warps);

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
  if (cudaMalloc(&plan->args_, sizeof(MoeKernelArgs)) != cudaSuccess) {
    (void)cudaGetLastError();
    return "workspace: cannot place the kernel arguments in device memory";
  }
  if (setup.fused) {
    // The plan's expert rows and outputs, offsets, band flags and counters, flat m blocks, tile
    // flags: one allocation, zeroed once.
    const uint64_t rows = g.rows_capacity();
    GroupedGemmArgs ga;
    ga.capacity = static_cast<int64_t>(rows);
    ga.num_groups = epr;
    ga.n = g.out_hidden;
    ga.k = g.hidden;
    ga.config = setup.gemm;
    ga.config.num_role_blocks = plan->blocks_;
    const uint64_t tile_flags = grouped_gemm_num_tile_flags(ga);
    if (tile_flags == 0)
      return "grouped GEMM: rows " + str(rows) + ", experts per rank " + str(epr) + ", out_hidden " +
             str(g.out_hidden) + ", hidden " + str(g.hidden) + " are outside its bounds";
    uint64_t f = 0;
    auto place = [&](uint64_t bytes) {
      const uint64_t at = f;
      f = align16(f + bytes);
      return at;
    };
    const uint64_t bands = (rows + 127) / 128;
    const uint64_t o_x = place(rows * g.hidden * 2), o_y = place(rows * g.out_hidden * 2);
    const uint64_t o_off = place((epr + 1) * 4ull), o_bf = place(bands * 8), o_bc = place(bands * 4);
    const uint64_t mblocks = grouped_gemm_num_mblock_flags(ga);
    const uint64_t o_mb = place((epr + 1) * 4ull), o_tf = place(tile_flags * 8);
    const uint64_t o_mf = place(mblocks * 8), o_mc = place(mblocks * 8);
    if (cudaMalloc(&plan->fused_buffers_, f) != cudaSuccess || cudaMemset(plan->fused_buffers_, 0, f) != cudaSuccess) {
      (void)cudaGetLastError();
      return "fused workspace: cannot allocate " + str(f) + " bytes of device memory (expert rows, outputs, flags)";
    }
    auto* fb = static_cast<uint8_t*>(plan->fused_buffers_);
    a.x_expert = fb + o_x;
    a.y_expert = fb + o_y;
    a.expert_offsets = reinterpret_cast<uint32_t*>(fb + o_off);
    a.band_flags = reinterpret_cast<uint64_t*>(fb + o_bf);
    a.band_count = reinterpret_cast<uint32_t*>(fb + o_bc);
    a.mblk_base = reinterpret_cast<uint32_t*>(fb + o_mb);
    a.mblock_flags = reinterpret_cast<uint64_t*>(fb + o_mf);
    ga.a = a.x_expert;
    ga.w = a.x_expert;  // placeholder until forward() binds the weights
    ga.d = a.y_expert;
    ga.offsets = a.expert_offsets;
    ga.hooks.ready_flags = a.band_flags;
    ga.hooks.ready_rows_per_flag = 128;
    ga.hooks.ready_value_ptr = c.launch_counter;
    ga.hooks.tile_flags = reinterpret_cast<uint64_t*>(fb + o_tf);
    ga.hooks.mblock_flags = const_cast<uint64_t*>(a.mblock_flags);
    ga.hooks.mblock_counts = reinterpret_cast<unsigned long long*>(fb + o_mc);
    ga.hooks.role_args = plan->args_;
    ga.wait = setup.wait;
    ga.wait.long_wait_shift = kMoeLongWaitShift;  // wait.cuh note 6
    const GemmResult r = grouped_gemm_plan(ga, &plan->gemm_);
    if (!r.ok()) return "grouped GEMM: " + r.message;
    if (plan->gemm_.config.num_role_blocks != plan->blocks_ && plan->gemm_.config.num_role_blocks > 0)
      plan->blocks_ = plan->gemm_.config.num_role_blocks;
    GemmParams& gp = plan->gemm_.engine.params;
    gp.grouped_offsets_ready = a.flags + kMoeFlagLayout;
    gp.grouped.coherent = 1;
    gp.tile_flag_value_ptr = c.launch_counter;
    plan->fused_ = true;
    if (setup.adaptive_split) {
      // The grouped GEMM's tiles are known only on the GPU (they follow the routing): the
      // candidates' waves are those of a balanced load, every expert's rows in full 128-row bands.
      SplitSetup ss;
      ss.adaptive = true;
      ss.unit = static_cast<uint32_t>(plan->gemm_.engine.config.cluster_m);
      ss.grid = static_cast<uint32_t>(plan->gemm_.engine.config.num_gemm_blocks + plan->gemm_.engine.config.num_role_blocks);
      ss.units = static_cast<uint32_t>(bands * gp.num_n_blocks / ss.unit);
      ss.start_comm = static_cast<uint32_t>(plan->gemm_.engine.config.num_role_blocks);
      ss.min_comm = 1;
      ss.max_comm = std::min(ss.grid / 3, std::max(32u, 2 * ss.start_comm));
      if (std::string e = split_control_create(ss, &plan->split_); !e.empty()) return "adaptive_split: " + e;
      gp.split = plan->split_;
    }
  } else if (setup.adaptive_split) {
    return "adaptive_split: only the fused kernel (MoeSetup::fused) has a split to move";
  }
  if (cudaMemcpy(plan->args_, &a, sizeof(a), cudaMemcpyHostToDevice) != cudaSuccess) {
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
  cudaFree(fused_buffers_);
  if (split_ != nullptr) cudaFree(split_);
}

std::string MoePlan::split_report(SplitReport* out) const {
  if (split_ == nullptr) return "split_report: the plan was made without adaptive_split";
  return split_control_read(split_, out);
}

std::string MoePlan::pin_split(int comm) {
  if (split_ == nullptr) return "pin_split: the plan was made without adaptive_split";
  if (comm < 0) return "pin_split: comm = " + str(comm) + " is negative";
  const auto& c = gemm_.engine.config;
  return split_control_pin(split_, static_cast<uint32_t>(comm), static_cast<uint32_t>(c.num_gemm_blocks + c.num_role_blocks),
                           static_cast<uint32_t>(c.cluster_m));
}

GemmResult MoePlan::forward(const void* x, const int32_t* choices, const float* scores, const void* w, void* out,
                            cudaStream_t stream) {
  if (!fused_) return GemmResult{GemmError::kInvalidConfig, "forward: the plan was made without MoeSetup::fused"};
  if (!x || !choices || !scores || !w || !out)
    return GemmResult{GemmError::kInvalidPointer, "forward: x, choices, scores, w and out must not be null"};
  if (w != gemm_.args.w) {
    const GemmResult r = grouped_gemm_rebind(&gemm_, gemm_.args.a, w, gemm_.args.d, gemm_.args.offsets);
    if (!r.ok()) return r;  // (rebinding re-encodes the tensor maps; the hooks stay)
  }
  GemmParams& gp = gemm_.engine.params;
  gp.role_ptrs[0] = x;
  gp.role_ptrs[1] = choices;
  gp.role_ptrs[2] = scores;
  gp.role_ptrs[3] = out;
  return moe_fused_launch(gemm_.engine, stream);
}

cudaError_t MoePlan::dispatch(const void* x, const int32_t* choices, const float* scores, void* x_expert,
                              uint32_t* expert_offsets, int32_t* row_source, int32_t* row_token, float* row_score,
                              cudaStream_t stream) {
  if (!x || !choices || !scores || !x_expert || !expert_offsets) return cudaErrorInvalidValue;
  const MoeDispatchPtrs p{x, choices, scores, x_expert, expert_offsets, row_source, row_token, row_score};
  if (fused_) return cudaErrorInvalidValue;  // a fused plan runs forward()
  moe_dispatch_kernel<<<blocks_, kThreads, smem_, stream>>>(args_, p);
  return cudaGetLastError();
}

cudaError_t MoePlan::combine(const void* y_expert, void* out, cudaStream_t stream) {
  if (!y_expert || !out) return cudaErrorInvalidValue;
  if (fused_) return cudaErrorInvalidValue;
  const MoeCombinePtrs p{y_expert, out};
  moe_combine_kernel<<<blocks_, kThreads, 0, stream>>>(args_, p);
  return cudaGetLastError();
}

std::string MoePlan::describe() const {
  return "R=" + str(geo_.layout.world()) + " (" + str(geo_.layout.nodes) + "x" + str(geo_.layout.gpus) +
         ") T=" + str(geo_.tokens) + " H=" + str(geo_.hidden) + " N=" + str(geo_.out_hidden) + " E=" +
         str(geo_.experts) + " k=" + str(geo_.top_k) + " cap=" + str(geo_.capacity()) + " rows=" +
         str(geo_.rows_capacity()) + " chunk=" + str(geo_.chunk()) + " blocks=" + str(blocks_) +
         (split_ != nullptr ? " adaptive" : "");
}

}  // namespace mkernel::kernels
