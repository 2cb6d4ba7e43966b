// ring_attn.cu: host side of the fused ring attention (ring_attn.h): checks, the plan and the
// chunk relations in device memory, the running state, tensor maps, and the launch.
#include "fused/ring_attn/ring_attn.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "fused/ring_attn/ring_attn.cuh"
#include "fused/ring_attn/ring_attn_launch.cuh"

namespace mkernel::kernels {

namespace {

static_assert(sizeof(RingChunk) == sizeof(AttnChunk) && uint32_t{kRingFull} == uint32_t{kAttnFull} &&
                  uint32_t{kRingCausal} == uint32_t{kAttnCausal} && uint32_t{kRingSkip} == uint32_t{kAttnSkip} &&
                  uint32_t{kRingReadRunning} == uint32_t{kAttnReadRunning} &&
                  uint32_t{kRingWriteFinal} == uint32_t{kAttnWriteFinal},
              "the plan's chunk relations are the attention core's");

AttnResult fail(AttnError code, std::string message) { return AttnResult{code, std::move(message)}; }
AttnResult cuda_fail(const char* what, cudaError_t e) {
  return fail(AttnError::kCudaError, std::string(what) + ": " + cudaGetErrorString(e));
}
std::string str(uint64_t v) { return std::to_string(v); }

constexpr uint32_t kBlockM = 128;

}  // namespace

int ring_default_comm_blocks(const FusedLayout& layout) {
  if (layout.world() <= 1) return 0;
  return 2 + 2 * static_cast<int>(std::min<uint32_t>(layout.gpus - 1, 3)) + (layout.nodes > 1 ? 2 : 0);
}

uint64_t ring_kv_chunk_bytes(uint32_t batch, uint32_t heads_kv, uint32_t s_local, uint32_t head_dim) {
  return uint64_t{batch} * heads_kv * s_local * head_dim * 2;
}
uint64_t ring_nvl_bytes_needed(uint32_t slots, uint32_t batch, uint32_t heads_kv, uint32_t s_local, uint32_t head_dim) {
  return uint64_t{slots} * 2 * ring_kv_chunk_bytes(batch, heads_kv, s_local, head_dim);
}
uint64_t ring_net_bytes_needed(uint32_t nodes, uint32_t batch, uint32_t heads_kv, uint32_t s_local, uint32_t head_dim) {
  return nodes > 1 ? uint64_t{nodes} * 2 * ring_kv_chunk_bytes(batch, heads_kv, s_local, head_dim) : 0;
}

AttnResult RingAttnPlan::create(const RingAttnSetup& s, std::unique_ptr<RingAttnPlan>* out) {
  const DeviceComm& c = s.comm;
  // ---- shape ---------------------------------------------------------------------------------
  const struct {
    const char* name;
    uint32_t v;
  } dims[] = {{"batch", s.batch}, {"heads_q", s.heads_q}, {"heads_kv", s.heads_kv}, {"s_local", s.s_local}};
  for (const auto& d : dims)
    if (d.v == 0)
      return fail(AttnError::kInvalidShape, std::string(d.name) + " = 0 is not supported: it must be at least 1");
  if (s.heads_q % s.heads_kv != 0)
    return fail(AttnError::kInvalidHeads, "heads_q = " + str(s.heads_q) +
                                              " is not a multiple of heads_kv = " + str(s.heads_kv) +
                                              " (grouped-query attention shares each key/value head "
                                              "among the same number of query heads)");
  if (s.head_dim != 64 && s.head_dim != 128)
    return fail(AttnError::kInvalidHeadDim,
                "head_dim = " + str(s.head_dim) + " is not supported: it must be 64 or 128");
  if (s.tensor_layout != AttnLayout::kBHSD && s.tensor_layout != AttnLayout::kBSHD)
    return fail(AttnError::kInvalidLayout,
                "layout = " + std::to_string(static_cast<int>(s.tensor_layout)) +
                    " is not supported by the ring: expected kBHSD or kBSHD, packed (a chunk of keys and values moves "
                    "as one contiguous span)");
  if (!(s.scale >= 0.0f) || std::isinf(s.scale))
    return fail(AttnError::kInvalidConfig,
                "scale = " + std::to_string(s.scale) +
                    " is not supported: it must be a positive finite number (0: 1/sqrt(head_dim))");
  if (s.layout.world() != c.world_size)
    return fail(AttnError::kInvalidConfig, "layout: " + str(s.layout.nodes) + " x " + str(s.layout.gpus) +
                                               " ranks, but the communicator has " + str(c.world_size));
  RingGeometry geo{s.layout, c.rank, s.s_local, s.placement,
                   s.config.slots != 0 ? s.config.slots : ring_default_slots(s.layout)};
  if (std::string e = ring_check_geometry(geo); !e.empty()) return fail(AttnError::kInvalidShape, e);
  const uint64_t units = uint64_t{s.batch} * s.heads_q * ((geo.group_rows(0) + kBlockM - 1) / kBlockM);
  if (units * geo.groups() > 0x7FFFFFFFull)
    return fail(AttnError::kInvalidShape,
                "batch x heads_q x query tiles = " + str(units * geo.groups()) + " is too large (at most 2^31 - 1)");
  if (uint64_t{s.s_local} * s.heads_q * s.head_dim >= (uint64_t{1} << 39) / 2)
    return fail(AttnError::kInvalidShape, "s_local = " + str(s.s_local) + " is too large for TMA strides");

  // ---- workspace -----------------------------------------------------------------------------
  const uint32_t R = s.layout.world();
  const uint64_t kv_bytes = ring_kv_chunk_bytes(s.batch, s.heads_kv, s.s_local, s.head_dim);
  const uint64_t nvl_need = R > 1 ? ring_nvl_bytes_needed(geo.slots, s.batch, s.heads_kv, s.s_local, s.head_dim) : 0;
  if (c.nvl == nullptr || c.nvl_bytes < nvl_need)
    return fail(AttnError::kWorkspaceTooSmall,
                "the communicator's NVLink buffer holds " + str(c.nvl == nullptr ? 0 : c.nvl_bytes) + " bytes; " +
                    str(geo.slots) + " K/V slots need slots x 2 x batch x heads_kv x s_local x head_dim x 2 = " +
                    str(nvl_need) + " (Options::nvlink_bytes; ring_attention_nvlink_bytes)");
  if (c.nvl_fused_flags < geo.nvl_flags_needed())
    return fail(AttnError::kWorkspaceTooSmall, "the NVLink buffer has " + str(c.nvl_fused_flags) +
                                                   " fused-op flags; the ring needs " + str(geo.nvl_flags_needed()) +
                                                   " (Options::fused_flags)");
  if (uint64_t{c.num_fused_flags} < uint64_t{agree_area_flags(c)} + geo.net_flags_needed())
    return fail(AttnError::kWorkspaceTooSmall, "the flag array has " + str(c.num_fused_flags) +
                                                   " fused-op flags; the ring needs " + str(geo.net_flags_needed()) +
                                                   " plus " + str(kAgreeWords * kAgreeBanks) +
                                                   " per rank for the agreement "
                                                   "(Options::fused_flags)");
  const uint64_t net_need = ring_net_bytes_needed(s.layout.nodes, s.batch, s.heads_kv, s.s_local, s.head_dim);
  if (s.layout.nodes > 1 && (c.network_workspace == kNoBuffer || c.buffer_bytes[c.network_workspace] < net_need))
    return fail(AttnError::kWorkspaceTooSmall,
                "ranks span " + str(s.layout.nodes) +
                    " nodes: the network workspace must hold nodes x 2 x batch x "
                    "heads_kv x s_local x head_dim x 2 = " +
                    str(net_need) + " bytes; it holds " +
                    str(c.network_workspace == kNoBuffer ? 0 : c.buffer_bytes[c.network_workspace]) +
                    " (Options::network_workspace_bytes)");

  // One chunk goes to a rail peer as one put (its arrival flag must rise after all of it).
  if (s.layout.nodes > 1 && 2 * kv_bytes > protocol::kMaxCommandBytes)
    return fail(AttnError::kInvalidShape,
                "a chunk of keys and values is 2 x batch x heads_kv x s_local x head_dim x 2 = " + str(2 * kv_bytes) +
                    " bytes; across nodes it moves as one put of at most " + str(protocol::kMaxCommandBytes) +
                    " bytes (use more ranks or fewer "
                    "positions per rank)");

  // ---- device and blocks ---------------------------------------------------------------------
  int dev = 0, num_sms = 0, major = 0, minor = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  if (e != cudaSuccess) return cuda_fail("reading the device's attributes", e);
  if (major != 9 || minor != 0)
    return fail(AttnError::kUnsupportedDevice,
                "ring attention needs a Hopper GPU (compute capability 9.0); this device is " +
                    str(static_cast<uint64_t>(major)) + "." + str(static_cast<uint64_t>(minor)));
  if (s.config.comm_blocks < 0 || s.config.attn_blocks < 0)
    return fail(AttnError::kInvalidConfig, "config comm_blocks = " + std::to_string(s.config.comm_blocks) +
                                               ", attn_blocks = " + std::to_string(s.config.attn_blocks) +
                                               ": expected 0 (choose) or a positive count");
  const uint32_t comm_blocks =
      R <= 1 ? 0
             : static_cast<uint32_t>(s.config.comm_blocks != 0 ? s.config.comm_blocks
                                                               : ring_default_comm_blocks(s.layout));
  const uint32_t attn_blocks = s.config.attn_blocks != 0
                                   ? static_cast<uint32_t>(s.config.attn_blocks)
                                   : static_cast<uint32_t>(std::max(1, num_sms - static_cast<int>(comm_blocks)));
  // Every block must be resident at once (blocks wait for each other): one per SM.
  if (comm_blocks + attn_blocks > static_cast<uint32_t>(num_sms) || attn_blocks == 0)
    return fail(AttnError::kInvalidConfig, "config: " + str(comm_blocks) + " communication + " + str(attn_blocks) +
                                               " attention blocks; expected at least 1 attention block and at most " +
                                               std::to_string(num_sms) + " in all (one per SM, all resident at once)");

  std::unique_ptr<RingAttnPlan> p(new RingAttnPlan());
  p->setup_ = s;
  p->geo_ = geo;
  p->block_n_ = 160;  // RingTraitsD64 / RingTraitsD128
  p->comm_blocks_ = comm_blocks;
  p->grid_ = comm_blocks + attn_blocks;
  p->maps_ = std::make_unique<RingAttnMaps>();
  p->params_ = std::make_unique<RingAttnLaunch>();

  uint8_t* own = nullptr;
  if ((e = cudaMemcpy(&own, c.nvl + c.rank, sizeof(own), cudaMemcpyDeviceToHost)) != cudaSuccess)
    return cuda_fail("reading the NVLink peer table", e);
  if (own == nullptr) return fail(AttnError::kInvalidConfig, "this rank's NVLink buffer is not mapped");
  const NvlLayout nl{c.nvl_bytes, c.nvl_num_flags, c.nvl_fused_flags};

  // ---- the plan in device memory -------------------------------------------------------------
  const std::vector<RingStep> steps = ring_steps(geo);
  const std::vector<RingChunk> chunks = ring_chunks(geo);
  if ((e = cudaMalloc(&p->steps_, std::max<size_t>(1, steps.size()) * sizeof(RingStep))) != cudaSuccess)
    return cuda_fail("cudaMalloc (movement plan)", e);
  if (!steps.empty() &&
      (e = cudaMemcpy(p->steps_, steps.data(), steps.size() * sizeof(RingStep), cudaMemcpyHostToDevice)) != cudaSuccess)
    return cuda_fail("cudaMemcpy (movement plan)", e);
  if ((e = cudaMalloc(&p->chunks_, chunks.size() * sizeof(RingChunk))) != cudaSuccess)
    return cuda_fail("cudaMalloc (chunks)", e);
  if ((e = cudaMemcpy(p->chunks_, chunks.data(), chunks.size() * sizeof(RingChunk), cudaMemcpyHostToDevice)) !=
      cudaSuccess)
    return cuda_fail("cudaMemcpy (chunks)", e);
  const size_t num_counters = steps.size() + R;
  if ((e = cudaMalloc(&p->counters_, num_counters * sizeof(uint32_t))) != cudaSuccess)
    return cuda_fail("cudaMalloc (counters)", e);
  if ((e = cudaMemset(p->counters_, 0, num_counters * sizeof(uint32_t))) != cudaSuccess)
    return cuda_fail("cudaMemset", e);
  // The fp32 running state of each group: O [B, Hq, rows, D], then lse [B, Hq, rows], each group's
  // region rounded up to 16 bytes: the epilogue reads and writes O as float2 pairs, so the second
  // group's O must start 8-byte aligned even when B x Hq x rows (its lse) is odd (zigzag halves of
  // odd length; found by the ring test's random family, B 1, Hq 9, s_local 2).
  auto group_floats = [&](uint32_t g) {
    const size_t f = size_t{s.batch} * s.heads_q * geo.group_rows(g) * (s.head_dim + 1);
    return (f + 3) / 4 * 4;
  };
  size_t running = 0;
  for (uint32_t g = 0; g < geo.groups(); ++g) running += group_floats(g);
  if ((e = cudaMalloc(&p->running_, running * sizeof(float))) != cudaSuccess)
    return cuda_fail("cudaMalloc (running state)", e);

  RingAttnArgs a;
  a.comm = c;
  a.geo = geo;
  a.comm_blocks = comm_blocks;
  a.num_steps = static_cast<uint32_t>(steps.size());
  a.steps = p->steps_;
  a.chunks = static_cast<const AttnChunk*>(p->chunks_);
  a.kv_bytes = kv_bytes;
  a.slots = own;
  a.nvl_flags = reinterpret_cast<uint64_t*>(own + nl.fused_flags_offset());
  a.net = s.layout.nodes > 1 ? c.buffers[c.network_workspace] : nullptr;
  a.item_done = p->counters_;
  a.freed_count = p->counters_ + steps.size();
  a.units_per_group = static_cast<uint32_t>(units);
  a.bulk = s.config.bulk_copies ? 1u : 0u;
  if (s.config.adaptive_split) {
    if (R <= 1) return fail(AttnError::kInvalidConfig, "adaptive_split: one rank has no communication blocks to move");
    // Candidates over the attention units of a step (each attention block takes units block,
    // block + attention blocks, ...), from one block to a third of the grid (at least 32).
    SplitSetup ss;
    ss.adaptive = true;
    ss.grid = p->grid_;
    ss.unit = 1;
    ss.units = static_cast<uint32_t>(geo.groups() * units);
    ss.start_comm = comm_blocks;
    ss.min_comm = 1;
    ss.max_comm = std::min(p->grid_ / 3, std::max(32u, 2 * comm_blocks));
    if (std::string err = split_control_create(ss, &p->split_); !err.empty())
      return fail(AttnError::kInvalidConfig, "adaptive_split: " + err);
    a.split = p->split_;
  }
  if ((e = cudaMalloc(&p->args_, sizeof(RingAttnArgs))) != cudaSuccess) return cuda_fail("cudaMalloc (arguments)", e);
  if ((e = cudaMemcpy(p->args_, &a, sizeof(a), cudaMemcpyHostToDevice)) != cudaSuccess)
    return cuda_fail("cudaMemcpy (arguments)", e);

  // ---- kernel parameters that do not change between launches --------------------------------
  RingAttnLaunch& L = *p->params_;
  L.args = p->args_;
  float* run = p->running_;
  const float scale = s.scale > 0.0f ? s.scale : 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  for (uint32_t g = 0; g < 2; ++g) {
    AttnParams& ap = L.attn[g];
    ap = AttnParams{};
    const uint32_t rows = g < geo.groups() ? geo.group_rows(g) : geo.group_rows(0);
    ap.batch = s.batch;
    ap.heads_q = s.heads_q;
    ap.heads_kv = s.heads_kv;
    ap.group = s.heads_q / s.heads_kv;
    ap.q_len = rows;
    ap.num_m_blocks = (rows + kBlockM - 1) / kBlockM;
    ap.num_units = static_cast<uint32_t>(units);
    ap.unit_order = kAttnHeadMajor;  // static: a unit has the same block in every step
    ap.scale = scale;
    ap.scale_log2 = scale * 1.4426950408889634f;
    ap.lse_head_stride = s.s_local;
    ap.wait = s.wait;
    if (g < geo.groups()) {
      const size_t o_elems = size_t{s.batch} * s.heads_q * rows * s.head_dim;
      ap.o_run = run;
      ap.lse_run = run + o_elems;
      run += group_floats(g);
    }
  }
  // The slots' tensor maps: slot s holds K at s x 2 x kv_bytes, V kv_bytes later.
  const AttnStrides kv_strides = attention_packed_strides(s.tensor_layout, s.heads_kv, s.s_local, s.head_dim);
  for (uint32_t sl = 0; sl < geo.slots && R > 1; ++sl) {
    uint8_t* k = own + uint64_t{sl} * 2 * kv_bytes;
    AttnResult r = attention_tensor_map(&p->maps_->k[1 + sl], k, s.head_dim, s.s_local, s.heads_kv, s.batch, kv_strides,
                                        static_cast<uint32_t>(p->block_n_), "k slot");
    if (r.ok())
      r = attention_tensor_map(&p->maps_->v[1 + sl], k + kv_bytes, s.head_dim, s.s_local, s.heads_kv, s.batch,
                               kv_strides, static_cast<uint32_t>(p->block_n_), "v slot");
    if (!r.ok()) return r;
  }
  *out = std::move(p);
  return {};
}

RingAttnPlan::~RingAttnPlan() {
  if (args_ != nullptr) (void)cudaFree(args_);
  if (steps_ != nullptr) (void)cudaFree(steps_);
  if (chunks_ != nullptr) (void)cudaFree(chunks_);
  if (counters_ != nullptr) (void)cudaFree(counters_);
  if (running_ != nullptr) (void)cudaFree(running_);
  if (split_ != nullptr) (void)cudaFree(split_);
}

AttnResult RingAttnPlan::split_report(SplitReport* out) const {
  if (split_ == nullptr) return fail(AttnError::kInvalidConfig, "split_report: the plan was made without adaptive_split");
  if (std::string e = split_control_read(split_, out); !e.empty()) return fail(AttnError::kCudaError, e);
  return {};
}

AttnResult RingAttnPlan::pin_split(int comm) {
  if (split_ == nullptr) return fail(AttnError::kInvalidConfig, "pin_split: the plan was made without adaptive_split");
  if (comm < 0) return fail(AttnError::kInvalidConfig, "pin_split: comm = " + std::to_string(comm) + " is negative");
  if (std::string e = split_control_pin(split_, static_cast<uint32_t>(comm), grid_, 1); !e.empty())
    return fail(AttnError::kInvalidConfig, e);
  return {};
}

AttnResult RingAttnPlan::bind(const void* q, const void* k, const void* v, void* o, float* lse) {
  const RingAttnSetup& s = setup_;
  const AttnStrides qs = attention_packed_strides(s.tensor_layout, s.heads_q, s.s_local, s.head_dim);
  const AttnStrides ks = attention_packed_strides(s.tensor_layout, s.heads_kv, s.s_local, s.head_dim);
  RingAttnMaps& m = *maps_;
  for (uint32_t g = 0; g < geo_.groups(); ++g) {
    // A group is rows [row0, row0 + rows) of every head: the same strides, a later first row.
    const uint64_t at = uint64_t{geo_.group_row0(g)} * static_cast<uint64_t>(qs.seq) * 2;
    const uint32_t rows = geo_.group_rows(g);
    AttnResult r = attention_tensor_map(&m.q[g], static_cast<const uint8_t*>(q) + at, s.head_dim, rows, s.heads_q,
                                        s.batch, qs, kBlockM, "q");
    if (r.ok())
      r = attention_tensor_map(&m.o[g], static_cast<uint8_t*>(o) + at, s.head_dim, rows, s.heads_q, s.batch, qs, 64,
                               "o");
    if (!r.ok()) return r;
    params_->attn[g].lse = lse + geo_.group_row0(g);
  }
  AttnResult r = attention_tensor_map(&m.k[0], k, s.head_dim, s.s_local, s.heads_kv, s.batch, ks,
                                      static_cast<uint32_t>(block_n_), "k");
  if (r.ok())
    r = attention_tensor_map(&m.v[0], v, s.head_dim, s.s_local, s.heads_kv, s.batch, ks,
                             static_cast<uint32_t>(block_n_), "v");
  if (!r.ok()) return r;
  params_->k_local = static_cast<const uint8_t*>(k);
  params_->v_local = static_cast<const uint8_t*>(v);
  bound_[0] = q;
  bound_[1] = k;
  bound_[2] = v;
  bound_[3] = o;
  bound_[4] = lse;
  return {};
}

AttnResult RingAttnPlan::launch(const void* q, const void* k, const void* v, void* o, float* lse, cudaStream_t stream) {
  const struct {
    const char* name;
    const void* p;
    uintptr_t align;
  } ptrs[] = {{"q", q, 16}, {"k", k, 16}, {"v", v, 16}, {"o", o, 16}, {"lse", lse, 4}};
  for (const auto& x : ptrs)
    if (x.p == nullptr || reinterpret_cast<uintptr_t>(x.p) % x.align != 0)
      return fail(AttnError::kInvalidPointer,
                  std::string("pointer ") + x.name + " is null or not " + std::to_string(x.align) + "-byte aligned");
  if (q != bound_[0] || k != bound_[1] || v != bound_[2] || o != bound_[3] || lse != bound_[4]) {
    AttnResult r = bind(q, k, v, o, lse);
    if (!r.ok()) return r;
  }
  const bool adaptive = split_ != nullptr;
  if (setup_.head_dim == 64) return launch_ring_attention_d64(*maps_, *params_, grid_, adaptive, stream);
  return launch_ring_attention_d128(*maps_, *params_, grid_, adaptive, stream);
}

double RingAttnPlan::flops() const {
  return 4.0 * setup_.batch * setup_.heads_q * setup_.head_dim * static_cast<double>(ring_visible_pairs(geo_));
}

std::string RingAttnPlan::describe() const {
  static const char* kPlacement[] = {"non-causal", "causal contiguous", "causal zigzag"};
  const FusedLayout& l = setup_.layout;
  return "R=" + str(l.world()) + " (" + str(l.nodes) + "x" + str(l.gpus) + ") " +
         (geo_.placement < 3 ? kPlacement[geo_.placement] : "?") + " B=" + str(setup_.batch) +
         " Hq=" + str(setup_.heads_q) + " Hkv=" + str(setup_.heads_kv) + " s_local=" + str(setup_.s_local) +
         " D=" + str(setup_.head_dim) + (setup_.tensor_layout == AttnLayout::kBSHD ? " bshd" : " bhsd") +
         " slots=" + str(geo_.slots) + " comm=" + str(comm_blocks_) + " attn=" + str(grid_ - comm_blocks_) + " n" +
         std::to_string(block_n_) + (setup_.config.bulk_copies ? " bulk" : " lsu") + (split_ != nullptr ? " adaptive" : "");
}

}  // namespace mkernel::kernels
