// moe.cu: MoE dispatch and combine on a Communicator (ops.h): the layout from the communicator,
// the checks, the agreement between ranks, then the kernel-level plan (kernels/fused/moe).
#include <cuda_runtime.h>

#include <algorithm>

#include "agree.h"
#include "fused/moe/moe.h"
#include "fused/moe/moe_act.h"
#include "gemm/sm90_bf16_grouped_gemm.h"
#include "mkernel/runtime/ops.h"
#include "op_common.h"

namespace mkernel::rt {

namespace mk = mkernel::kernels;

using ops_detail::layout_of;

namespace {

mk::MoeGeometry geometry(uint32_t nodes, uint32_t gpus, uint64_t tokens, uint64_t hidden, uint64_t out_hidden,
                         uint32_t experts, uint32_t top_k, const MoeConfig& c) {
  mk::MoeGeometry g = mk::moe_geometry(mk::FusedLayout{nodes, gpus}, 0, static_cast<uint32_t>(tokens),
                                        static_cast<uint32_t>(hidden), static_cast<uint32_t>(out_hidden), experts, top_k);
  g.recv_tokens_per_source = c.recv_tokens_per_source;
  g.expert_rows_capacity = c.expert_rows_capacity;
  g.chunk_tokens = c.chunk_tokens;
  return g;
}

Status from_cuda(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return Status::Ok();
  return Status(e == cudaErrorInvalidValue ? StatusCode::kInvalidArgument : StatusCode::kDeviceError,
                what + ": " + cudaGetErrorString(e));
}

}  // namespace

uint64_t moe_nvlink_bytes(uint32_t nodes, uint32_t gpus, uint64_t tokens, uint64_t hidden, uint64_t out_hidden,
                          uint32_t experts, uint32_t top_k, const MoeConfig& config) {
  return geometry(nodes, gpus, tokens, hidden, out_hidden, experts, top_k, config).nvl_bytes_needed();
}
uint64_t moe_network_bytes(uint32_t nodes, uint32_t gpus, uint64_t tokens, uint64_t hidden, uint64_t out_hidden,
                           uint32_t experts, uint32_t top_k, const MoeConfig& config) {
  return geometry(nodes, gpus, tokens, hidden, out_hidden, experts, top_k, config).net_bytes_needed();
}
uint32_t moe_fused_flags(uint32_t nodes, uint32_t gpus, uint64_t tokens, uint32_t experts, uint32_t top_k,
                         const MoeConfig& config) {
  const mk::MoeGeometry g = geometry(nodes, gpus, tokens, 8, 8, experts, top_k, config);
  const uint64_t most = std::max<uint64_t>(g.nvl_flags_needed(),
                                           uint64_t{g.net_flags_needed()} + uint64_t{nodes} * gpus * mk::kAgreeWords);
  return static_cast<uint32_t>(std::min<uint64_t>(most, 0xFFFFFFFFu));
}

MoeDispatchCombine::~MoeDispatchCombine() = default;

StatusOr<std::unique_ptr<MoeDispatchCombine>> MoeDispatchCombine::create(Communicator& comm, uint64_t tokens,
                                                                         uint64_t hidden, uint64_t out_hidden,
                                                                         uint32_t experts, uint32_t top_k,
                                                                         const MoeConfig& config, cudaStream_t stream) {
  const std::string what = "moe";
  auto bad = [&](const std::string& field, uint64_t v, const std::string& expected) {
    return Status(StatusCode::kInvalidArgument, what + ": " + field + " = " + std::to_string(v) + "; expected " + expected);
  };
  if (tokens == 0 || tokens > 0x7FFFFFFFu) return bad("tokens", tokens, "1 .. 2^31 - 1 tokens per rank");
  if (hidden == 0 || hidden % 8 != 0 || hidden > 0x7FFFFFFFu)
    return bad("hidden", hidden, "a positive multiple of 8 (16-byte rows)");
  if (out_hidden == 0 || out_hidden % 8 != 0 || out_hidden > 0x7FFFFFFFu)
    return bad("out_hidden", out_hidden, "a positive multiple of 8 (16-byte rows)");
  if (config.blocks < 0) return bad("config.blocks", static_cast<uint64_t>(config.blocks), "0 (choose) or more");
  if (config.block_n != 0 && config.block_n != 128 && config.block_n != 256)
    return bad("config.block_n", static_cast<uint64_t>(config.block_n), "0, 128 or 256");
  if (config.gemm_blocks < 0)
    return bad("config.gemm_blocks", static_cast<uint64_t>(config.gemm_blocks), "0 (choose) or more");
  if (config.cluster_m < 0 || config.cluster_m > 2)
    return bad("config.cluster_m", static_cast<uint64_t>(config.cluster_m), "0, 1 or 2");
  MK_RETURN_IF_ERROR(ops_detail::check_device(comm, what));
  MK_ASSIGN_OR_RETURN(mk::FusedLayout layout, layout_of(comm));
  mk::MoeGeometry g = geometry(layout.nodes, layout.gpus, tokens, hidden, out_hidden, experts, top_k, config);
  g.rank = comm.rank();
  if (std::string e = mk::moe_check_geometry(g); !e.empty()) return Status(StatusCode::kInvalidArgument, what + ": " + e);
  const mk::DeviceComm& c = comm.device();
  MK_RETURN_IF_ERROR(agree(comm, what,
                           {4u, static_cast<uint32_t>(tokens), static_cast<uint32_t>(hidden),
                            static_cast<uint32_t>(out_hidden), experts, top_k, layout.nodes,
                            config.recv_tokens_per_source, static_cast<uint32_t>(g.rows_capacity()),
                            config.chunk_tokens | (config.apply_scores ? 0x80000000u : 0u) |
                                (config.fused ? 0x40000000u : 0u),
                            c.nvl_fused_flags,
                            static_cast<uint32_t>(c.nvl_bytes)},
                           {"the op", "tokens", "hidden", "out_hidden", "experts", "top_k", "the number of nodes",
                            "recv_tokens_per_source", "expert_rows_capacity", "chunk_tokens, apply_scores and fused",
                            "the NVLink buffer's fused-op flags", "Options::nvlink_bytes (low 32 bits)"},
                           stream));
  mk::MoeSetup s;
  s.comm = c;
  s.geometry = g;
  s.wait = comm.wait_context();
  s.blocks = config.blocks;
  s.apply_scores = config.apply_scores;
  s.fused = config.fused;
  s.gemm.block_n = config.block_n;
  s.gemm.cluster_m = config.cluster_m;
  s.gemm.num_gemm_blocks = config.gemm_blocks;
  s.adaptive_split = config.adaptive_split;
  std::unique_ptr<MoeDispatchCombine> op(new MoeDispatchCombine());
  op->comm_ = &comm;
  op->fused_ = config.fused;
  if (std::string e = mk::MoePlan::create(s, &op->plan_); !e.empty()) {
    const bool space = e.rfind("NVLink", 0) == 0 || e.rfind("network", 0) == 0 || e.rfind("fused-op", 0) == 0 ||
                       e.rfind("workspace", 0) == 0;
    return Status(space ? StatusCode::kResourceExhausted : StatusCode::kInvalidArgument, what + ": " + e);
  }
  return StatusOr<std::unique_ptr<MoeDispatchCombine>>(std::move(op));
}

uint64_t MoeDispatchCombine::rows_capacity() const { return plan_->geometry().rows_capacity(); }
uint32_t MoeDispatchCombine::experts_per_rank() const { return plan_->geometry().experts_per_rank(); }

Status MoeDispatchCombine::forward(const void* x, const int32_t* choices, const float* scores, const void* w,
                                   void* out, cudaStream_t stream) {
  if (!fused_)
    return Status(StatusCode::kFailedPrecondition, "moe forward: the op was made without MoeConfig::fused");
  const void* now[5] = {x, choices, scores, w, out};
  if (!std::equal(now, now + 5, checked_fused_)) {
    MK_RETURN_IF_ERROR(ops_detail::check_pointers(
        *comm_, "moe forward",
        {{"x", x, false}, {"choices", choices, false}, {"scores", scores, false}, {"w", w, false}, {"out", out, false}}));
    std::copy(now, now + 5, checked_fused_);
  }
  MK_RETURN_IF_ERROR(comm_->begin_launch(stream));
  const mk::GemmResult r = plan_->forward(x, choices, scores, w, out, stream);
  if (r.ok()) return Status::Ok();
  return Status(r.code == mk::GemmError::kCudaError ? StatusCode::kDeviceError : StatusCode::kInvalidArgument,
                "moe forward: " + r.message);
}

Status MoeDispatchCombine::dispatch(const void* x, const int32_t* choices, const float* scores, void* x_expert,
                                    uint32_t* expert_offsets, int32_t* row_source, int32_t* row_token,
                                    float* row_score, cudaStream_t stream) {
  if (fused_)
    return Status(StatusCode::kFailedPrecondition, "moe dispatch: the op was made with MoeConfig::fused; use forward()");
  const void* now[8] = {x, choices, scores, x_expert, expert_offsets, row_source, row_token, row_score};
  if (!std::equal(now, now + 8, checked_)) {  // checked once per set of pointers (note 1: cheap launches)
    MK_RETURN_IF_ERROR(ops_detail::check_pointers(
        *comm_, "moe dispatch",
        {{"x", x, false}, {"choices", choices, false}, {"scores", scores, false}, {"x_expert", x_expert, false},
         {"expert_offsets", expert_offsets, false}, {"row_source", row_source, true}, {"row_token", row_token, true},
         {"row_score", row_score, true}}));
    std::copy(now, now + 8, checked_);
  }
  MK_RETURN_IF_ERROR(comm_->begin_launch(stream));
  MK_RETURN_IF_ERROR(from_cuda(
      plan_->dispatch(x, choices, scores, x_expert, expert_offsets, row_source, row_token, row_score, stream),
      "moe dispatch"));
  dispatch_launch_ = comm_->launches_begun();
  return Status::Ok();
}

Status MoeDispatchCombine::combine(const void* y_expert, void* out, cudaStream_t stream) {
  if (dispatch_launch_ == 0)
    return Status(StatusCode::kFailedPrecondition, "moe combine: no dispatch before it; expected dispatch, then combine");
  if (comm_->launches_begun() != dispatch_launch_)
    return Status(StatusCode::kFailedPrecondition,
                  "moe combine: " + std::to_string(comm_->launches_begun() - dispatch_launch_) +
                      " other launch(es) of the communicator since the dispatch (which may have overwritten its "
                      "records); expected the combine right after its dispatch");
  if (y_expert != checked_[8] || out != checked_[9]) {
    MK_RETURN_IF_ERROR(
        ops_detail::check_pointers(*comm_, "moe combine", {{"y_expert", y_expert, false}, {"out", out, false}}));
    checked_[8] = y_expert;
    checked_[9] = out;
  }
  MK_RETURN_IF_ERROR(comm_->begin_launch(stream));
  dispatch_launch_ = 0;
  return from_cuda(plan_->combine(y_expert, out, stream), "moe combine");
}

std::string MoeDispatchCombine::describe() const { return plan_->describe(); }

StatusOr<SplitState> MoeDispatchCombine::split_state() const {
  mk::SplitReport r;
  if (std::string e = plan_->split_report(&r); !e.empty())
    return Status(e.rfind("cudaMemcpy", 0) == 0 ? StatusCode::kDeviceError : StatusCode::kFailedPrecondition,
                  "moe: " + e);
  return ops_detail::to_split_state(r);
}

Status MoeDispatchCombine::pin_split(int comm_blocks) {
  if (std::string e = plan_->pin_split(comm_blocks); !e.empty())
    return Status(e.rfind("cudaMemcpy", 0) == 0 ? StatusCode::kDeviceError : StatusCode::kInvalidArgument, "moe: " + e);
  return Status::Ok();
}

// ---- the two-matrix MLP -------------------------------------------------------------------------

struct MoeMlp::Impl {
  Communicator* comm = nullptr;
  std::unique_ptr<MoeDispatchCombine> moe;  // dispatch and combine (out_hidden = hidden)
  mk::MoeAct act = mk::MoeAct::kSwiGlu;
  uint64_t hidden = 0, inter = 0, n1 = 0, cap = 0;
  uint32_t epr = 0;
  int sms = 0;
  void* buffers = nullptr;  // expert rows (also the second GEMM's output), first output, activation, offsets
  uint64_t bytes = 0;
  void* xe = nullptr;
  void* y1 = nullptr;
  void* h = nullptr;
  uint32_t* off = nullptr;
  mk::GroupedGemmPlan g1, g2;
  const void* checked[6] = {};
  ~Impl() { cudaFree(buffers); }
};

MoeMlp::MoeMlp() : impl_(new Impl()) {}
MoeMlp::~MoeMlp() = default;

StatusOr<std::unique_ptr<MoeMlp>> MoeMlp::create(Communicator& comm, uint64_t tokens, uint64_t hidden, uint64_t inter,
                                                 uint32_t experts, uint32_t top_k, MoeActivation activation,
                                                 const MoeConfig& config, cudaStream_t stream) {
  const std::string what = "moe mlp";
  auto bad = [&](const std::string& field, uint64_t v, const std::string& expected) {
    return Status(StatusCode::kInvalidArgument, what + ": " + field + " = " + std::to_string(v) + "; expected " + expected);
  };
  if (inter == 0 || inter % 8 != 0 || inter > 0x3FFFFFFFu)
    return bad("inter", inter, "a positive multiple of 8 (16-byte rows), at most 2^30 - 1");
  const int act = static_cast<int>(activation);
  if (act < 0 || act > static_cast<int>(MoeActivation::kRelu))
    return bad("activation", static_cast<uint64_t>(act), "kSwiGlu, kGeGlu, kSilu, kGelu or kRelu");
  if (config.fused)
    return Status(StatusCode::kInvalidArgument,
                  what + ": config.fused = true; expected false (the MLP runs dispatch, two grouped GEMMs and "
                         "combine as launches; the fused kernel takes one matrix: MoeDispatchCombine::forward)");
  if (config.adaptive_split)
    return Status(StatusCode::kInvalidArgument, what + ": config.adaptive_split = true; expected false (no fused kernel)");
  MK_ASSIGN_OR_RETURN(std::unique_ptr<MoeDispatchCombine> moe,
                      MoeDispatchCombine::create(comm, tokens, hidden, hidden, experts, top_k, config, stream));
  std::unique_ptr<MoeMlp> op(new MoeMlp());
  Impl& m = *op->impl_;
  m.comm = &comm;
  m.moe = std::move(moe);
  m.act = static_cast<mk::MoeAct>(act);
  m.hidden = hidden;
  m.inter = inter;
  m.n1 = mk::moe_act_gated(m.act) ? 2 * inter : inter;
  m.cap = m.moe->rows_capacity();
  m.epr = m.moe->experts_per_rank();
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&m.sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
    return Status(StatusCode::kDeviceError, what + ": cannot read the current device's SM count");
  auto align = [](uint64_t v) { return (v + 255) / 256 * 256; };
  const uint64_t o_xe = 0, o_y1 = o_xe + align(m.cap * hidden * 2), o_h = o_y1 + align(m.cap * m.n1 * 2);
  const uint64_t o_off = o_h + (mk::moe_act_gated(m.act) ? align(m.cap * inter * 2) : 0);
  m.bytes = o_off + align((m.epr + 1) * 4ull);
  if (cudaMalloc(&m.buffers, m.bytes) != cudaSuccess) {
    (void)cudaGetLastError();
    m.buffers = nullptr;
    return Status(StatusCode::kResourceExhausted, what + ": cannot allocate " + std::to_string(m.bytes) +
                                                      " bytes of device memory (expert rows and intermediates of " +
                                                      std::to_string(m.cap) + " rows)");
  }
  auto* b = static_cast<uint8_t*>(m.buffers);
  m.xe = b + o_xe;
  m.y1 = b + o_y1;
  m.h = mk::moe_act_gated(m.act) ? static_cast<void*>(b + o_h) : m.y1;  // plain activations work in place
  m.off = reinterpret_cast<uint32_t*>(b + o_off);
  if (cudaMemsetAsync(m.off, 0, (m.epr + 1) * 4ull, stream) != cudaSuccess) {
    (void)cudaGetLastError();
    return Status(StatusCode::kDeviceError, what + ": cannot clear the expert offsets");
  }
  mk::GroupedGemmConfig gc;
  gc.block_n = config.block_n;
  gc.cluster_m = config.cluster_m;
  gc.num_gemm_blocks = config.gemm_blocks;
  auto plan = [&](const void* a, void* d, uint64_t n, uint64_t k, mk::GroupedGemmPlan* out, const char* name) {
    mk::GroupedGemmArgs ga;
    ga.a = a;
    ga.w = a;  // bound to the caller's weights by forward()
    ga.d = d;
    ga.offsets = m.off;
    ga.capacity = static_cast<int64_t>(m.cap);
    ga.num_groups = m.epr;
    ga.n = static_cast<int64_t>(n);
    ga.k = static_cast<int64_t>(k);
    ga.config = gc;
    ga.wait = comm.wait_context();
    const mk::GemmResult r = mk::grouped_gemm_plan(ga, out);
    if (r.ok()) return Status::Ok();
    return Status(StatusCode::kInvalidArgument, what + ": " + name + ": " + r.message);
  };
  MK_RETURN_IF_ERROR(plan(m.xe, m.y1, m.n1, hidden, &m.g1, "first matrix (w1)"));
  MK_RETURN_IF_ERROR(plan(m.h, m.xe, hidden, inter, &m.g2, "second matrix (w2)"));
  return StatusOr<std::unique_ptr<MoeMlp>>(std::move(op));
}

Status MoeMlp::forward(const void* x, const int32_t* choices, const float* scores, const void* w1, const void* w2,
                       void* out, cudaStream_t stream) {
  Impl& m = *impl_;
  const void* now[6] = {x, choices, scores, w1, w2, out};
  if (!std::equal(now, now + 6, m.checked)) {
    MK_RETURN_IF_ERROR(ops_detail::check_pointers(*m.comm, "moe mlp forward",
                                                  {{"x", x, false},
                                                   {"choices", choices, false},
                                                   {"scores", scores, false},
                                                   {"w1", w1, false},
                                                   {"w2", w2, false},
                                                   {"out", out, false}}));
    std::copy(now, now + 6, m.checked);
  }
  auto gemm_status = [](const mk::GemmResult& r, const char* name) {
    if (r.ok()) return Status::Ok();
    return Status(r.code == mk::GemmError::kCudaError ? StatusCode::kDeviceError : StatusCode::kInvalidArgument,
                  std::string("moe mlp forward: ") + name + ": " + r.message);
  };
  if (m.g1.args.w != w1) MK_RETURN_IF_ERROR(gemm_status(mk::grouped_gemm_rebind(&m.g1, m.xe, w1, m.y1, m.off), "w1"));
  if (m.g2.args.w != w2) MK_RETURN_IF_ERROR(gemm_status(mk::grouped_gemm_rebind(&m.g2, m.h, w2, m.xe, m.off), "w2"));
  MK_RETURN_IF_ERROR(m.moe->dispatch(x, choices, scores, m.xe, m.off, nullptr, nullptr, nullptr, stream));
  MK_RETURN_IF_ERROR(gemm_status(mk::grouped_gemm_launch(m.g1, stream), "first grouped GEMM"));
  MK_RETURN_IF_ERROR(from_cuda(mk::moe_activation_launch(m.act, m.y1, m.h, m.off, m.epr, m.cap,
                                                         static_cast<uint32_t>(m.inter), m.sms, stream),
                               "moe mlp forward: activation"));
  MK_RETURN_IF_ERROR(gemm_status(mk::grouped_gemm_launch(m.g2, stream), "second grouped GEMM"));
  return m.moe->combine(m.xe, out, stream);
}

uint64_t MoeMlp::rows_capacity() const { return impl_->cap; }
uint32_t MoeMlp::experts_per_rank() const { return impl_->epr; }
uint64_t MoeMlp::w1_rows() const { return impl_->n1; }
uint64_t MoeMlp::workspace_bytes() const { return impl_->bytes; }
std::string MoeMlp::describe() const {
  const Impl& m = *impl_;
  return m.moe->describe() + " mlp " + mk::moe_act_name(m.act) + " inter=" + std::to_string(m.inter) + " w1: " +
         mk::grouped_gemm_config_string(m.g1) + " w2: " + mk::grouped_gemm_config_string(m.g2);
}

}  // namespace mkernel::rt
