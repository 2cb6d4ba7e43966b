// gemm_rs.cu: host side of the fused GEMM+ReduceScatter (gemm_rs.h): checks, the order of tiles,
// the GEMM configuration, and the launch of the engine with the reduce-scatter epilogue.
#include "fused/gemm_rs/gemm_rs.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "fused/gemm_rs/gemm_rs.cuh"
#include "gemm/sm90_bf16_gemm_dispatch.h"
#include "gemm/sm90_bf16_gemm_launch.cuh"

namespace mkernel::kernels {

namespace {

GemmResult fail(GemmError code, std::string message) { return GemmResult{code, std::move(message)}; }

GemmResult cuda_fail(const char* what, cudaError_t e) {
  return fail(GemmError::kCudaError, std::string(what) + ": " + cudaGetErrorString(e));
}

template <int kBlockN, int kClusterM>
using RsTraits = Sm90GemmTraits<kBlockN, detail::gemm_stages_for_block_n(kBlockN), kClusterM, kEpilogueStore>;

GemmResult launch_with_role(const GemmPlan& plan, cudaStream_t stream) {
  const GemmConfig& c = plan.config;
  if (c.block_n == 256) {
    return c.cluster_m == 2 ? launch_sm90_bf16_gemm<RsTraits<256, 2>, GemmRsRole>(plan, stream)
                            : launch_sm90_bf16_gemm<RsTraits<256, 1>, GemmRsRole>(plan, stream);
  }
  return c.cluster_m == 2 ? launch_sm90_bf16_gemm<RsTraits<128, 2>, GemmRsRole>(plan, stream)
                          : launch_sm90_bf16_gemm<RsTraits<128, 1>, GemmRsRole>(plan, stream);
}

}  // namespace

GemmResult GemmRsPlan::create(const GemmRsSetup& s, std::unique_ptr<GemmRsPlan>* out) {
  const DeviceComm& c = s.comm;
  if (s.layout.world() != c.world_size)
    return fail(GemmError::kInvalidConfig, "layout: " + std::to_string(s.layout.nodes) + " x " +
                                               std::to_string(s.layout.gpus) + " ranks, but the communicator has " +
                                               std::to_string(c.world_size));
  if (s.k == 0 || s.k % 8 != 0)
    return fail(GemmError::kInvalidK, "k = " + std::to_string(s.k) +
                                          " is not supported: it must be a positive multiple of 8 (TMA rows)");
  if (s.config.gemm_blocks < 0) return fail(GemmError::kInvalidConfig, "gemm_blocks must not be negative");
  if (s.config.block_n != 0 && s.config.block_n != 128 && s.config.block_n != 256)
    return fail(GemmError::kInvalidConfig, "block_n = " + std::to_string(s.config.block_n) + "; expected 0, 128 or 256");
  RsGeometry probe{s.layout, c.rank, s.m_local, s.n, 256, s.all_reduce, s.m_rows};
  if (std::string e = rs_check_geometry(probe); !e.empty()) return fail(GemmError::kInvalidConfig, e);

  std::unique_ptr<GemmRsPlan> p(new GemmRsPlan());
  p->setup_ = s;
  uint8_t* own = nullptr;
  if (c.nvl != nullptr) {
    if (cudaError_t e = cudaMemcpy(&own, c.nvl + c.rank, sizeof(own), cudaMemcpyDeviceToHost); e != cudaSuccess)
      return cuda_fail("reading the NVLink peer table", e);
  }
  if (s.layout.gpus > 1 && own == nullptr)
    return fail(GemmError::kInvalidConfig, "this rank's NVLink buffer is not mapped (the node has " +
                                               std::to_string(s.layout.gpus) + " ranks; Options::nvlink_bytes)");

  // The GEMM over the whole of M. The operands' pointers come with each launch (gemm_rebind);
  // the plan is made with an aligned stand-in. First the engine's choices, then the order.
  static const uint64_t stand_in_storage[2] = {};
  const void* stand_in = own != nullptr ? static_cast<const void*>(own) : static_cast<const void*>(stand_in_storage);
  GemmArgs g;
  g.a = stand_in;
  g.w = stand_in;
  g.d = const_cast<void*>(stand_in);
  g.m = static_cast<int64_t>(probe.m_total());
  g.n = s.n;
  g.k = s.k;
  g.config.block_n = s.config.block_n;
  g.config.cluster_m = s.config.cluster_m;
  g.config.num_gemm_blocks = s.config.gemm_blocks;
  // Whole tiles (or uniform split-K), no stream-K: the order of tiles and the argument that no
  // wait goes in a circle (gemm_rs_plan.h note 4) are those the CPU replay checks.
  g.config.stream_k = 0;
  g.config.widths_128_256 = true;  // the widths this op instantiates (RsTraits)
  g.wait = s.wait;
  // Split-K where the engine picks it (few tiles: small M), with the plan's own scratch; the
  // order changes only the raster group and rotation, never the split.
  if (const size_t ws = gemm_workspace_bytes(g); ws > 0) {
    if (cudaError_t e = cudaMalloc(&p->split_workspace_, ws); e != cudaSuccess)
      return cuda_fail("cudaMalloc (split-K workspace)", e);
    if (cudaError_t e = cudaMemset(p->split_workspace_, 0, ws); e != cudaSuccess) return cuda_fail("cudaMemset", e);
    g.workspace = p->split_workspace_;
    g.workspace_bytes = ws;
  }
  GemmPlan first;
  if (GemmResult r = gemm_plan(g, &first); !r.ok()) return r;
  RsGeometry geo{s.layout, c.rank, s.m_local, s.n, static_cast<uint32_t>(first.config.block_n), s.all_reduce,
                 s.m_rows};
  const RsOrder order = rs_order(geo, static_cast<uint32_t>(first.config.cluster_m), static_cast<uint32_t>(first.config.group));
  g.config = first.config;
  // Determinism (plan note 3): split tiles are summed in the order their parts arrive
  // (tile_scheduler.cuh note 3); with two parts the fp32 sum does not depend on that order, with
  // three or more it may. So at most two splits.
  g.config.num_splits = std::min(g.config.num_splits, 2);
  g.config.programmatic_launch = s.config.programmatic_launch;
  g.config.group = static_cast<int>(order.group);
  g.hooks.first_m_block = order.first_m_block;
  p->geo_ = geo;
  p->order_ = order;

  // The workspace.
  if (s.layout.gpus > 1) {
    if (c.nvl_bytes < geo.nvl_bytes_needed())
      return fail(GemmError::kWorkspaceTooSmall,
                  "the communicator's NVLink buffer holds " + std::to_string(c.nvl_bytes) +
                      " bytes; the node peers' partial tiles" + (s.all_reduce ? " and the results" : "") + " need " +
                      std::to_string(geo.nvl_bytes_needed()) + " (Options::nvlink_bytes; " +
                      (s.all_reduce ? "gemm_all_reduce_nvlink_bytes)" : "gemm_reduce_scatter_nvlink_bytes)"));
    if (c.nvl_fused_flags < geo.nvl_flags_needed())
      return fail(GemmError::kWorkspaceTooSmall, "the NVLink buffer has " + std::to_string(c.nvl_fused_flags) +
                                                     " fused-op flags; this plan needs " +
                                                     std::to_string(geo.nvl_flags_needed()) + " (Options::fused_flags)");
  }
  if (uint64_t{c.num_fused_flags} < uint64_t{agree_area_flags(c)} + geo.net_flags_needed())
    return fail(GemmError::kWorkspaceTooSmall,
                "the flag array has " + std::to_string(c.num_fused_flags) + " fused-op flags; this plan needs " +
                    std::to_string(geo.net_flags_needed()) + " plus " + std::to_string(kAgreeWords * kAgreeBanks) +
                    " per rank for the agreement (Options::fused_flags)");
  if (s.layout.nodes > 1) {
    if (c.network_workspace == kNoBuffer || c.buffer_bytes[c.network_workspace] < geo.net_bytes_needed())
      return fail(GemmError::kWorkspaceTooSmall,
                  "ranks span " + std::to_string(s.layout.nodes) + " nodes: the network workspace must hold " +
                      std::to_string(geo.net_bytes_needed()) + " bytes (a receive and a send slot per node" +
                      (s.all_reduce ? ", a result slot per node and one to send" : "") + "); it holds " +
                      std::to_string(c.network_workspace == kNoBuffer ? 0 : c.buffer_bytes[c.network_workspace]) +
                      " (Options::network_workspace_bytes)");
  }

  if (GemmResult r = gemm_plan(g, &p->gemm_); !r.ok()) return r;
  if (p->gemm_.config.block_n != first.config.block_n || p->gemm_.config.cluster_m != first.config.cluster_m)
    return fail(GemmError::kInvalidConfig, "the GEMM configuration changed between planning passes");

  GemmRsRoleArgs ra;
  ra.comm = c;
  ra.geo = geo;
  ra.ldc = s.n;
  ra.staging = own;
  ra.nvl_flags = own != nullptr ? reinterpret_cast<uint64_t*>(
                                      own + NvlLayout{c.nvl_bytes, c.nvl_num_flags, c.nvl_fused_flags}.fused_flags_offset())
                                : nullptr;
  ra.net = s.layout.nodes > 1 ? c.buffers[c.network_workspace] : nullptr;
  // The per-m-block tables (rs_tables) follow the arguments in one allocation:
  // [GemmRsRoleArgs][RsMBlock x m blocks][rail_stage words].
  const RsTables tables = rs_tables(geo);
  const size_t args_bytes = (sizeof(GemmRsRoleArgs) + alignof(RsMBlock) - 1) / alignof(RsMBlock) * alignof(RsMBlock);
  const size_t mblock_bytes = tables.mblocks.size() * sizeof(RsMBlock);
  const size_t rail_bytes = tables.rail_stage.size() * sizeof(uint32_t);
  std::vector<uint8_t> host(args_bytes + mblock_bytes + rail_bytes);
  if (cudaError_t e = cudaMalloc(&p->role_args_, host.size()); e != cudaSuccess)
    return cuda_fail("cudaMalloc (role arguments)", e);
  auto* base = reinterpret_cast<uint8_t*>(p->role_args_);
  ra.mblocks = reinterpret_cast<const RsMBlock*>(base + args_bytes);
  ra.rail_stage = rail_bytes > 0 ? reinterpret_cast<const uint32_t*>(base + args_bytes + mblock_bytes) : nullptr;
  ra.num_n_blocks = geo.num_n_blocks();
  ra.stage_tiles = tables.stage_tiles;
  ra.slot_tiles = tables.slot_tiles;
  ra.node = s.layout.node_of(c.rank);
  ra.local = s.layout.local_of(c.rank);
  ra.band_lo = tables.band_lo;
  ra.band_hi = tables.band_hi;
  std::memcpy(host.data(), &ra, sizeof(ra));
  std::memcpy(host.data() + args_bytes, tables.mblocks.data(), mblock_bytes);
  if (rail_bytes > 0) std::memcpy(host.data() + args_bytes + mblock_bytes, tables.rail_stage.data(), rail_bytes);
  if (cudaError_t e = cudaMemcpy(p->role_args_, host.data(), host.size(), cudaMemcpyHostToDevice); e != cudaSuccess)
    return cuda_fail("cudaMemcpy (role arguments)", e);
  p->gemm_.params.role_args = p->role_args_;
  *out = std::move(p);
  return {};
}

GemmRsPlan::~GemmRsPlan() {
  if (role_args_ != nullptr) (void)cudaFree(role_args_);
  if (split_workspace_ != nullptr) (void)cudaFree(split_workspace_);
}

GemmResult GemmRsPlan::launch(const void* a, const void* w, void* c, cudaStream_t stream) {
  if (c == nullptr || reinterpret_cast<uintptr_t>(c) % 16 != 0)
    return fail(GemmError::kInvalidPointer, std::string("pointer c (") +
                                                (setup_.all_reduce ? "the result" : "this rank's rows of the result") +
                                                ") is null or not 16-byte aligned");
  // The engine's output map is encoded over c (dims M x n): the role stores through it only tiles
  // that lie inside this rank's band, at their rows of c (gemm_rs.cuh), so never past c's end.
  GemmResult r = gemm_rebind(&gemm_, a, w, c, nullptr);
  if (!r.ok()) return r;
  gemm_.params.role_ptrs[0] = c;
  return launch_with_role(gemm_, stream);
}

std::string GemmRsPlan::describe() const {
  const FusedLayout& l = setup_.layout;
  return std::string(setup_.all_reduce ? "all-reduce " : "reduce-scatter ") + "R=" + std::to_string(l.world()) +
         " (" + std::to_string(l.nodes) + "x" + std::to_string(l.gpus) + ") M=" + std::to_string(geo_.m_total()) +
         " n=" + std::to_string(geo_.n) + " k=" + std::to_string(setup_.k) +
         (order_.rotated ? " rotated" : " identical") + " gemm " + gemm_config_string(gemm_);
}

}  // namespace mkernel::kernels
