// ag_gemm.cu: host side of the fused AllGather+GEMM (ag_gemm.h): checks, the movement plan in
// device memory, the GEMM configuration, and the launch of the engine with the AllGather role.
#include "fused/ag_gemm/ag_gemm.h"

#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <vector>

#include "fused/ag_gemm/ag_gemm.cuh"
#include "fused/ag_gemm/ag_trace.h"
#include "gemm/sm90_bf16_gemm_dispatch.h"
#include "gemm/sm90_bf16_gemm_launch.cuh"

namespace mkernel::kernels {

namespace {

GemmResult fail(GemmError code, std::string message) { return GemmResult{code, std::move(message)}; }

template <int kBlockN, int kClusterM>
using AgTraits = Sm90GemmTraits<kBlockN, detail::gemm_stages_for_block_n(kBlockN), kClusterM, kEpilogueStore>;

static_assert(AgTraits<128, 1>::kSmemBytes >= BulkCopier::kSmemBytes + 1024 &&
                  AgTraits<256, 1>::kSmemBytes >= BulkCopier::kSmemBytes + 1024,
              "the communication blocks' bulk copier must fit in the GEMM's shared memory");

template <class Role>
GemmResult launch_role(const GemmPlan& plan, cudaStream_t stream) {
  const GemmConfig& c = plan.config;
  if (c.block_n == 256) {
    return c.cluster_m == 2 ? launch_sm90_bf16_gemm<AgTraits<256, 2>, Role>(plan, stream)
                            : launch_sm90_bf16_gemm<AgTraits<256, 1>, Role>(plan, stream);
  }
  return c.cluster_m == 2 ? launch_sm90_bf16_gemm<AgTraits<128, 2>, Role>(plan, stream)
                          : launch_sm90_bf16_gemm<AgTraits<128, 1>, Role>(plan, stream);
}

// The adaptive split has instantiations of its own (the measure costs the producer registers).
GemmResult launch_with_role(const GemmPlan& plan, cudaStream_t stream) {
  return plan.params.split != nullptr ? launch_role<AgGemmRoleAdaptive>(plan, stream)
                                      : launch_role<AgGemmRole>(plan, stream);
}

GemmResult cuda_fail(const char* what, cudaError_t e) {
  return fail(GemmError::kCudaError, std::string(what) + ": " + cudaGetErrorString(e));
}

// The driver's stream memory operations (the copy streams' gates), looked up once through the
// runtime so nothing links libcuda.
struct StreamMemOps {
  PFN_cuStreamWaitValue32_v11070 wait32 = nullptr;
  PFN_cuStreamWriteValue32_v11070 write32 = nullptr;
  std::string error;
};

const StreamMemOps& stream_mem_ops() {
  static const StreamMemOps ops = [] {
    StreamMemOps o;
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &p, 11070, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess || p == nullptr)
      return o.error = "the driver has no cuStreamWaitValue32 (CUDA 11.7 or later)", o;
    o.wait32 = reinterpret_cast<PFN_cuStreamWaitValue32_v11070>(p);
    if (cudaGetDriverEntryPointByVersion("cuStreamWriteValue32", &p, 11070, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess || p == nullptr)
      return o.error = "the driver has no cuStreamWriteValue32 (CUDA 11.7 or later)", o;
    o.write32 = reinterpret_cast<PFN_cuStreamWriteValue32_v11070>(p);
    return o;
  }();
  return ops;
}

}  // namespace

int ag_default_comm_blocks(const FusedLayout& layout, bool copy_engine_pushes) {
  if (copy_engine_pushes && layout.nodes == 1) return 1;
  const int blocks = 2 + 8 * static_cast<int>(layout.gpus - 1) + (layout.nodes > 1 ? 4 : 0);
  return std::min(16, blocks);
}

GemmResult AgGemmPlan::create(const AgGemmSetup& s, std::unique_ptr<AgGemmPlan>* out) {
  const DeviceComm& c = s.comm;
  AgGeometry geo{s.layout, c.rank, s.m_local, s.k,
                 s.config.chunk_rows != 0 ? s.config.chunk_rows : ag_default_chunk_rows(s.m_local)};
  if (std::string e = ag_check_geometry(geo); !e.empty()) return fail(GemmError::kInvalidConfig, e);
  if (s.layout.world() != c.world_size)
    return fail(GemmError::kInvalidConfig, "layout: " + std::to_string(s.layout.nodes) + " x " +
                                               std::to_string(s.layout.gpus) + " ranks, but the communicator has " +
                                               std::to_string(c.world_size));
  if (s.n_local == 0 || s.n_local % 8 != 0)
    return fail(GemmError::kInvalidN, "n_local = " + std::to_string(s.n_local) +
                                          " is not supported: it must be a positive multiple of 8 (TMA rows)");
  const uint64_t m_total = uint64_t{s.m_local} * s.layout.world();
  if (m_total > (uint64_t{1} << 31) - 1)
    return fail(GemmError::kInvalidM, "M = world x m_local = " + std::to_string(m_total) + " is too large (at most 2^31 - 1)");
  // The workspace.
  if (c.nvl == nullptr || c.nvl_bytes < geo.nvl_bytes_needed())
    return fail(GemmError::kWorkspaceTooSmall,
                "the communicator's NVLink buffer holds " + std::to_string(c.nvl == nullptr ? 0 : c.nvl_bytes) +
                    " bytes; the gathered activation needs world x m_local x k x 2 = " +
                    std::to_string(geo.nvl_bytes_needed()) + " (Options::nvlink_bytes)");
  if (c.nvl_fused_flags < geo.nvl_flags_needed())
    return fail(GemmError::kWorkspaceTooSmall, "the NVLink buffer has " + std::to_string(c.nvl_fused_flags) +
                                                   " fused-op flags; this plan needs " +
                                                   std::to_string(geo.nvl_flags_needed()) + " (Options::fused_flags)");
  if (uint64_t{c.num_fused_flags} < uint64_t{agree_area_flags(c)} + geo.net_flags_needed())
    return fail(GemmError::kWorkspaceTooSmall,
                "the flag array has " + std::to_string(c.num_fused_flags) + " fused-op flags; this plan needs " +
                    std::to_string(geo.net_flags_needed()) + " plus " + std::to_string(kAgreeWords * kAgreeBanks) +
                    " per rank for the agreement (Options::fused_flags)");
  if (s.layout.nodes > 1) {
    if (c.network_workspace == kNoBuffer || c.buffer_bytes[c.network_workspace] < geo.net_bytes_needed())
      return fail(GemmError::kWorkspaceTooSmall,
                  "ranks span " + std::to_string(s.layout.nodes) + " nodes: the network workspace must hold nodes x "
                  "m_local x k x 2 = " + std::to_string(geo.net_bytes_needed()) + " bytes; it holds " +
                      std::to_string(c.network_workspace == kNoBuffer ? 0 : c.buffer_bytes[c.network_workspace]) +
                      " (Options::network_workspace_bytes)");
  }
  if (s.config.comm_blocks < 0 || s.config.gemm_blocks < 0)
    return fail(GemmError::kInvalidConfig, "comm_blocks and gemm_blocks must not be negative");

  std::unique_ptr<AgGemmPlan> p(new AgGemmPlan());
  p->setup_ = s;
  p->geo_ = geo;

  // The GEMM over the gathered rows, own rows straight from A_r. The pointers of A_r, W and C
  // come with each launch (gemm_rebind); the plan is made with stand-ins of the right alignment.
  // DeviceComm::nvl is a device array: read the own entry once.
  uint8_t* own = nullptr;
  if (cudaError_t e = cudaMemcpy(&own, c.nvl + c.rank, sizeof(own), cudaMemcpyDeviceToHost); e != cudaSuccess)
    return cuda_fail("reading the NVLink peer table", e);
  if (own == nullptr) return fail(GemmError::kInvalidConfig, "this rank's NVLink buffer is not mapped");
  p->gathered_ = own;
  const NvlLayout nl{c.nvl_bytes, c.nvl_num_flags, c.nvl_fused_flags};
  auto* ready = reinterpret_cast<uint64_t*>(own + nl.fused_flags_offset());

  GemmArgs g;
  g.a = own;
  g.w = own;  // stand-in, rebound per launch
  g.d = own;  // stand-in, rebound per launch
  g.m = static_cast<int64_t>(m_total);
  g.n = s.n_local;
  g.k = s.k;
  g.config.block_n = s.config.block_n;
  g.config.cluster_m = s.config.cluster_m;
  g.config.num_gemm_blocks = s.config.gemm_blocks;
  g.config.num_role_blocks = s.config.comm_blocks != 0 ? s.config.comm_blocks
                                                      : ag_default_comm_blocks(s.layout, s.config.copy_engine_pushes);
  // Whole tiles (or uniform split-K), no stream-K: the decomposition this op's readiness waits were
  // tested with on the GPU; stream-K under the readiness hook is still to be measured.
  g.config.stream_k = 0;
  // The adaptive split moves which blocks take which split-K part; the parts are then summed in
  // their fixed order (deterministic fix-up) so the bits do not depend on it.
  g.config.deterministic = s.config.adaptive_split;
  g.config.widths_128_256 = true;  // the widths this op instantiates (AgTraits)
  g.config.programmatic_launch = s.config.programmatic_launch;
  g.hooks.ready_flags = ready + s.layout.nvl_op_flags();  // ready(0, 0) onwards
  g.hooks.ready_value_ptr = c.launch_counter;
  g.hooks.ready_rows_per_flag = geo.chunk_rows;
  g.hooks.ready_shard_rows = s.m_local;
  g.hooks.a_local = own;  // stand-in, rebound per launch
  g.hooks.local_rows_begin = int64_t{c.rank} * s.m_local;
  g.hooks.local_rows_end = g.hooks.local_rows_begin + s.m_local;
  // Own rows first: from the first tile that lies wholly inside them.
  const uint32_t m_blocks = static_cast<uint32_t>((m_total + 127) / 128);
  g.hooks.first_m_block = static_cast<uint32_t>((uint64_t{c.rank} * s.m_local + 127) / 128) % m_blocks;
  g.wait = s.wait;
  // Split-K where the engine picks it (few tiles: small M), with the plan's own scratch.
  if (const size_t ws = gemm_workspace_bytes(g); ws > 0) {
    if (cudaError_t e = cudaMalloc(&p->split_workspace_, ws); e != cudaSuccess)
      return cuda_fail("cudaMalloc (split-K workspace)", e);
    if (cudaError_t e = cudaMemset(p->split_workspace_, 0, ws); e != cudaSuccess) return cuda_fail("cudaMemset", e);
    g.workspace = p->split_workspace_;
    g.workspace_bytes = ws;
  }
  GemmResult r = gemm_plan(g, &p->gemm_);
  if (!r.ok()) return r;
  // The own rows of the gathered output go by the copy engine, beside the kernel.
  if (cudaError_t e = cudaStreamCreateWithFlags(&p->side_, cudaStreamNonBlocking); e != cudaSuccess)
    return cuda_fail("cudaStreamCreate", e);
  if (cudaError_t e = cudaEventCreateWithFlags(&p->fork_, cudaEventDisableTiming); e != cudaSuccess)
    return cuda_fail("cudaEventCreate", e);
  if (cudaError_t e = cudaEventCreateWithFlags(&p->join_, cudaEventDisableTiming); e != cudaSuccess)
    return cuda_fail("cudaEventCreate", e);

  // Copy-engine pushes (ag_gemm_plan.h note 5): per node peer, its stream, its join event and its
  // copies; the gates in device memory, closed.
  const bool ce = s.config.copy_engine_pushes && s.layout.gpus > 1;
  if (ce) {
    if (const StreamMemOps& ops = stream_mem_ops(); !ops.error.empty())
      return fail(GemmError::kCudaError, "copy_engine_pushes: " + ops.error);
    std::vector<uint8_t*> nvl(c.world_size, nullptr);
    if (cudaError_t e = cudaMemcpy(nvl.data(), c.nvl, nvl.size() * sizeof(uint8_t*), cudaMemcpyDeviceToHost);
        e != cudaSuccess)
      return cuda_fail("reading the NVLink peer table", e);
    if (cudaError_t e = cudaMalloc(&p->go_, sizeof(uint32_t) * s.layout.gpus); e != cudaSuccess)
      return cuda_fail("cudaMalloc (copy-engine gates)", e);
    if (cudaError_t e = cudaMemset(p->go_, 0, sizeof(uint32_t) * s.layout.gpus); e != cudaSuccess)
      return cuda_fail("cudaMemset (copy-engine gates)", e);
    const size_t pieces = size_t{s.layout.world()} * geo.chunks();
    if (cudaError_t e = cudaMalloc(&p->out_go_, sizeof(uint32_t) * pieces); e != cudaSuccess)
      return cuda_fail("cudaMalloc (gathered-output gates)", e);
    if (cudaError_t e = cudaMemset(p->out_go_, 0, sizeof(uint32_t) * pieces); e != cudaSuccess)
      return cuda_fail("cudaMemset (gathered-output gates)", e);
    std::vector<std::vector<AgCopy>> lists = ag_copy_engine_copies(geo, nl.fused_flags_offset());
    p->ce_.resize(s.layout.gpus);
    for (uint32_t i = 1; i < s.layout.gpus; ++i) {
      CePeer& peer = p->ce_[i];
      const uint32_t to = s.layout.node_peer(c.rank, i);
      peer.base = nvl[to];
      if (peer.base == nullptr)
        return fail(GemmError::kInvalidConfig,
                    "copy_engine_pushes: node peer rank " + std::to_string(to) + "'s NVLink buffer is not mapped here");
      if (cudaError_t e = cudaStreamCreateWithFlags(&peer.stream, cudaStreamNonBlocking); e != cudaSuccess)
        return cuda_fail("cudaStreamCreate (copy-engine pushes)", e);
      if (cudaError_t e = cudaEventCreateWithFlags(&peer.join, cudaEventDisableTiming); e != cudaSuccess)
        return cuda_fail("cudaEventCreate (copy-engine pushes)", e);
      peer.copies = std::move(lists[i]);
    }
    p->out_copies_ = ag_gathered_out_copies(geo);
  }

  // The movement plan and the role's arguments, in device memory.
  const std::vector<AgStep> steps = ag_block_steps(geo, ce);
  if (cudaError_t e = cudaMalloc(&p->steps_, std::max<size_t>(1, steps.size()) * sizeof(AgStep)); e != cudaSuccess)
    return cuda_fail("cudaMalloc (movement plan)", e);
  if (cudaError_t e = cudaMemcpy(p->steps_, steps.data(), steps.size() * sizeof(AgStep), cudaMemcpyHostToDevice);
      e != cudaSuccess)
    return cuda_fail("cudaMemcpy (movement plan)", e);
  AgGemmRoleArgs ra;
  ra.comm = c;
  ra.layout = s.layout;
  ra.rank = c.rank;
  ra.m_local = s.m_local;
  ra.k = s.k;
  ra.chunk_rows = geo.chunk_rows;
  ra.chunks = geo.chunks();
  ra.num_steps = static_cast<uint32_t>(steps.size());
  ra.steps = p->steps_;
  ra.gathered = own;
  ra.ready = ready;
  ra.workspace = s.layout.nodes > 1 ? c.buffers[c.network_workspace] : nullptr;
  ra.bulk = s.config.bulk_copies ? 1u : 0u;
  if (cudaError_t e = cudaMalloc(&p->step_done_, std::max<size_t>(1, steps.size()) * sizeof(uint32_t));
      e != cudaSuccess)
    return cuda_fail("cudaMalloc (step counters)", e);
  if (cudaError_t e = cudaMemset(p->step_done_, 0, std::max<size_t>(1, steps.size()) * sizeof(uint32_t));
      e != cudaSuccess)
    return cuda_fail("cudaMemset (step counters)", e);
  ra.step_done = p->step_done_;
  ra.go = p->go_;
  ra.out_go = p->out_go_;
  p->block_steps_ = steps;
  if (s.config.trace) {
    p->trace_words_ = ag_trace_words(ra.num_steps, s.layout.world() * geo.chunks());
    if (cudaError_t e = cudaMalloc(&p->trace_, p->trace_words_ * sizeof(uint64_t)); e != cudaSuccess)
      return cuda_fail("cudaMalloc (trace)", e);
    if (cudaError_t e = cudaMemset(p->trace_, 0, p->trace_words_ * sizeof(uint64_t)); e != cudaSuccess)
      return cuda_fail("cudaMemset (trace)", e);
    ra.trace = p->trace_;
  }
  if (cudaError_t e = cudaMalloc(&p->role_args_, sizeof(AgGemmRoleArgs)); e != cudaSuccess)
    return cuda_fail("cudaMalloc (role arguments)", e);
  if (cudaError_t e = cudaMemcpy(p->role_args_, &ra, sizeof(ra), cudaMemcpyHostToDevice); e != cudaSuccess)
    return cuda_fail("cudaMemcpy (role arguments)", e);
  p->gemm_.params.role_args = p->role_args_;
  if (s.config.adaptive_split) {
    // The policy's range: one block to a third of the grid (at least the default's double, 32).
    SplitSetup ss;
    ss.adaptive = true;
    ss.unit = static_cast<uint32_t>(p->gemm_.config.cluster_m);
    ss.grid = static_cast<uint32_t>(p->gemm_.config.num_gemm_blocks + p->gemm_.config.num_role_blocks);
    ss.units = p->gemm_.params.dp_tiles + p->gemm_.params.sk_units;
    ss.start_comm = static_cast<uint32_t>(p->gemm_.config.num_role_blocks);
    ss.min_comm = 1;
    ss.max_comm = std::min(ss.grid / 3, std::max(32u, 2 * ss.start_comm));
    if (std::string e = split_control_create(ss, &p->split_); !e.empty())
      return fail(GemmError::kInvalidConfig, "adaptive_split: " + e);
    p->gemm_.params.split = p->split_;
  }
  *out = std::move(p);
  return {};
}

GemmResult AgGemmPlan::split_report(SplitReport* out) const {
  if (split_ == nullptr) return fail(GemmError::kInvalidConfig, "split_report: the plan was made without adaptive_split");
  if (std::string e = split_control_read(split_, out); !e.empty()) return fail(GemmError::kCudaError, e);
  return {};
}

GemmResult AgGemmPlan::pin_split(int comm) {
  if (split_ == nullptr) return fail(GemmError::kInvalidConfig, "pin_split: the plan was made without adaptive_split");
  if (comm < 0) return fail(GemmError::kInvalidConfig, "pin_split: comm = " + std::to_string(comm) + " is negative");
  const auto grid = static_cast<uint32_t>(gemm_.config.num_gemm_blocks + gemm_.config.num_role_blocks);
  if (std::string e = split_control_pin(split_, static_cast<uint32_t>(comm), grid,
                                        static_cast<uint32_t>(gemm_.config.cluster_m));
      !e.empty())
    return fail(GemmError::kInvalidConfig, e);
  return {};
}

AgGemmPlan::~AgGemmPlan() {
  if (steps_ != nullptr) (void)cudaFree(steps_);
  if (role_args_ != nullptr) (void)cudaFree(role_args_);
  if (split_workspace_ != nullptr) (void)cudaFree(split_workspace_);
  if (step_done_ != nullptr) (void)cudaFree(step_done_);
  if (fork_ != nullptr) (void)cudaEventDestroy(fork_);
  if (join_ != nullptr) (void)cudaEventDestroy(join_);
  if (side_ != nullptr) (void)cudaStreamDestroy(side_);
  for (CePeer& peer : ce_) {
    if (peer.join != nullptr) (void)cudaEventDestroy(peer.join);
    if (peer.stream != nullptr) (void)cudaStreamDestroy(peer.stream);
  }
  if (go_ != nullptr) (void)cudaFree(go_);
  if (out_go_ != nullptr) (void)cudaFree(out_go_);
  if (trace_ != nullptr) (void)cudaFree(trace_);
  if (split_ != nullptr) (void)cudaFree(split_);
}

std::string AgGemmPlan::trace_report() const {
  if (trace_ == nullptr) return "trace: off (AgGemmConfig::trace)\n";
  std::vector<uint64_t> stamps(trace_words_);
  if (cudaError_t e = cudaMemcpy(stamps.data(), trace_, stamps.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost);
      e != cudaSuccess)
    return std::string("trace: reading the stamps failed: ") + cudaGetErrorString(e) + "\n";
  return ag_trace_report(geo_, block_steps_, stamps);
}

namespace {
// On `stream`: wait until the kernel opens the gate (*word == 1), then close it again for the next
// launch (constants both, so a captured graph replays them as they are).
GemmResult pass_gate(cudaStream_t stream, uint32_t* word) {
  const StreamMemOps& ops = stream_mem_ops();
  const auto s = reinterpret_cast<CUstream>(stream);
  const auto w = reinterpret_cast<CUdeviceptr>(word);
  const char* what = nullptr;
  CUresult r = ops.wait32(s, w, 1, CU_STREAM_WAIT_VALUE_EQ);
  if (r != CUDA_SUCCESS) what = "cuStreamWaitValue32";
  else if ((r = ops.write32(s, w, 0, CU_STREAM_WRITE_VALUE_DEFAULT)) != CUDA_SUCCESS) what = "cuStreamWriteValue32";
  if (what == nullptr) return {};
  return fail(GemmError::kCudaError, std::string("copy-engine pushes: ") + what + " failed (CUresult " +
                                         std::to_string(static_cast<int>(r)) + ")");
}
}  // namespace

// With copy-engine pushes, on the side stream after the copy of the own rows: every other rank's
// chunk, once its gate opened (AgGemmRole: walk_arrivals), from the gathered buffer into
// gathered_out, in the order the kernel opens the gates.
GemmResult AgGemmPlan::enqueue_ce_gathered_out(void* gathered_out) {
  auto* out = static_cast<uint8_t*>(gathered_out);
  const auto* in = static_cast<const uint8_t*>(gathered_);
  for (const AgCopy& c : out_copies_) {
    if (GemmResult g = pass_gate(side_, out_go_ + c.gate); !g.ok()) return g;
    if (cudaError_t e =
            cudaMemcpyAsync(out + c.dst_offset, in + c.src_offset, c.bytes, cudaMemcpyDeviceToDevice, side_);
        e != cudaSuccess)
      return cuda_fail("copy-engine pushes: the gathered output's cudaMemcpyAsync", e);
  }
  return {};
}

// After the kernel is enqueued (so it runs and opens the gates, whatever happens to it): per node
// peer, on its stream, after the fork: wait for the gate, close it again, then every chunk and
// its ready flag (copied from the launch counter: the value of this launch, also in a replayed
// graph); the caller's stream joins them all.
GemmResult AgGemmPlan::enqueue_ce_pushes(const void* a_local, cudaStream_t stream) {
  const auto* src = static_cast<const uint8_t*>(a_local);
  for (uint32_t i = 1; i < ce_.size(); ++i) {
    CePeer& peer = ce_[i];
    cudaError_t e = cudaStreamWaitEvent(peer.stream, fork_, 0);
    if (e != cudaSuccess) return cuda_fail("copy-engine pushes: waiting for the fork", e);
    if (GemmResult g = pass_gate(peer.stream, go_ + i); !g.ok()) return g;  // every copy to peer i waits at gate i
    for (const AgCopy& c : peer.copies) {
      e = cudaMemcpyAsync(peer.base + c.dst_offset, src + c.src_offset, c.bytes, cudaMemcpyDeviceToDevice, peer.stream);
      if (e == cudaSuccess)
        e = cudaMemcpyAsync(peer.base + c.flag_offset, setup_.comm.launch_counter, sizeof(uint64_t),
                            cudaMemcpyDeviceToDevice, peer.stream);
      if (e != cudaSuccess) return cuda_fail("copy-engine pushes: cudaMemcpyAsync", e);
    }
    e = cudaEventRecord(peer.join, peer.stream);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(stream, peer.join, 0);
    if (e != cudaSuccess) return cuda_fail("copy-engine pushes: joining", e);
  }
  return {};
}

GemmResult AgGemmPlan::launch(const void* a_local, const void* w, void* c, void* gathered_out, cudaStream_t stream) {
  if (a_local == nullptr || reinterpret_cast<uintptr_t>(a_local) % 16 != 0)
    return fail(GemmError::kInvalidPointer, "pointer a (this rank's rows) is null or not 16-byte aligned");
  if (gathered_out != nullptr && reinterpret_cast<uintptr_t>(gathered_out) % 16 != 0)
    return fail(GemmError::kInvalidPointer, "pointer gathered_out is not 16-byte aligned");
  GemmResult r = gemm_rebind(&gemm_, gathered_, w, c, a_local);
  if (!r.ok()) return r;
  gemm_.params.role_ptrs[0] = a_local;
  gemm_.params.role_ptrs[1] = gathered_out;
  if (!ce_broken_.empty())
    return fail(GemmError::kCudaError, "an earlier launch of this plan failed while enqueuing its copy-engine pushes (" +
                                           ce_broken_ + "); make a new plan");
  // A stamp this launch does not reach must not be the previous launch's.
  if (trace_ != nullptr)
    if (cudaError_t e = cudaMemsetAsync(trace_, 0, trace_words_ * sizeof(uint64_t), stream); e != cudaSuccess)
      return cuda_fail("clearing the trace", e);
  if (gathered_out == nullptr && ce_.empty()) return launch_with_role(gemm_, stream);
  // Fork: the copy engines write the gathered output (the own rows at once; with copy-engine
  // pushes also the other ranks' chunks as they arrive) and (copy-engine pushes) the own chunks
  // into the node peers while the kernel runs; join before anything later on `stream`.
  if (cudaError_t e = cudaEventRecord(fork_, stream); e != cudaSuccess) return cuda_fail("recording the fork", e);
  if (gathered_out != nullptr) {
    const uint64_t own_at = uint64_t{geo_.rank} * geo_.shard_bytes();
    cudaError_t e = cudaStreamWaitEvent(side_, fork_, 0);
    if (e == cudaSuccess)
      e = cudaMemcpyAsync(static_cast<uint8_t*>(gathered_out) + own_at, a_local, geo_.shard_bytes(),
                          cudaMemcpyDeviceToDevice, side_);
    if (e != cudaSuccess) return cuda_fail("the gathered output's copy of the own rows", e);
  }
  r = launch_with_role(gemm_, stream);
  // Gated copies only behind a kernel that was enqueued: their gates open from inside it. A
  // stream left half enqueued may hold a gate's reset back, so the plan is not launched again
  // (a later launch's copies could pass a gate early).
  GemmResult queued;
  if (r.ok() && gathered_out != nullptr && !ce_.empty()) queued = enqueue_ce_gathered_out(gathered_out);
  if (gathered_out != nullptr) {
    cudaError_t j = cudaEventRecord(join_, side_);
    if (j == cudaSuccess) j = cudaStreamWaitEvent(stream, join_, 0);
    if (j != cudaSuccess && r.ok() && queued.ok()) queued = cuda_fail("joining the gathered output's copies", j);
  }
  if (r.ok() && queued.ok() && !ce_.empty()) queued = enqueue_ce_pushes(a_local, stream);
  if (!queued.ok() && !ce_.empty()) ce_broken_ = queued.message;
  return r.ok() ? queued : r;
}

std::string AgGemmPlan::describe() const {
  const FusedLayout& l = setup_.layout;
  return "R=" + std::to_string(l.world()) + " (" + std::to_string(l.nodes) + "x" + std::to_string(l.gpus) +
         ") m_local=" + std::to_string(geo_.m_local) + " k=" + std::to_string(geo_.k) +
         " n_local=" + std::to_string(setup_.n_local) + " chunks=" + std::to_string(geo_.chunks()) + "x" +
         std::to_string(geo_.chunk_rows) + " comm=" + std::to_string(gemm_.config.num_role_blocks) +
         (setup_.config.bulk_copies ? " bulk" : " lsu") + (ce_.empty() ? "" : " ce") + (trace_ ? " trace" : "") +
         (split_ != nullptr ? " adaptive" : "") +
         " gemm " +
         gemm_config_string(gemm_);
}

}  // namespace mkernel::kernels
