// gemm_rs.cu: GEMM+ReduceScatter on a Communicator (ops.h): the layout from the communicator, the
// checks, the agreement between ranks, then the kernel-level plan (kernels/fused/gemm_rs).
#include <cuda_runtime.h>

#include <algorithm>

#include "agree.h"
#include "fused/gemm_rs/gemm_rs.h"
#include "mkernel/runtime/ops.h"
#include "op_common.h"

namespace mkernel::rt {

namespace mk = mkernel::kernels;

using ops_detail::from_gemm;
using ops_detail::layout_of;

namespace {

// The geometry for either tile width: m_local rows per rank, or m rows in all (all_reduce).
mk::RsGeometry geometry(uint32_t nodes, uint32_t gpus, uint64_t rows, uint64_t n, bool all_reduce, uint32_t bn) {
  mk::RsGeometry g{mk::FusedLayout{nodes, gpus}, 0, 0, static_cast<uint32_t>(n), bn, all_reduce};
  if (all_reduce) {
    g.m_rows = static_cast<uint32_t>(rows);
  } else {
    g.m_local = static_cast<uint32_t>(rows);
  }
  return g;
}

// What either tile width needs (so it fits whichever the engine picks).
uint64_t nvl_bytes(uint32_t nodes, uint32_t gpus, uint64_t rows, uint64_t n, bool all_reduce) {
  uint64_t most = 0;
  for (uint32_t bn : {128u, 256u}) most = std::max(most, geometry(nodes, gpus, rows, n, all_reduce, bn).nvl_bytes_needed());
  return most;
}
uint64_t net_bytes(uint32_t nodes, uint64_t rows, uint64_t n, bool all_reduce) {
  uint64_t most = 0;
  for (uint32_t bn : {128u, 256u}) most = std::max(most, geometry(nodes, 1, rows, n, all_reduce, bn).net_bytes_needed());
  return most;
}
uint32_t flags(uint32_t nodes, uint32_t gpus, uint64_t rows, uint64_t n, bool all_reduce) {
  uint64_t most = 0;
  for (uint32_t bn : {128u, 256u}) {
    const mk::RsGeometry g = geometry(nodes, gpus, rows, n, all_reduce, bn);
    most = std::max<uint64_t>({most, g.nvl_flags_needed(),
                               uint64_t{g.net_flags_needed()} + uint64_t{nodes} * gpus * mk::kAgreeWords});
  }
  return static_cast<uint32_t>(std::min<uint64_t>(most, 0xFFFFFFFFu));
}

}  // namespace

uint64_t gemm_reduce_scatter_nvlink_bytes(uint32_t nodes, uint32_t gpus, uint64_t m_local, uint64_t n) {
  return nvl_bytes(nodes, gpus, m_local, n, false);
}
uint64_t gemm_reduce_scatter_network_bytes(uint32_t nodes, uint64_t m_local, uint64_t n) {
  return net_bytes(nodes, m_local, n, false);
}
uint64_t gemm_all_reduce_nvlink_bytes(uint32_t nodes, uint32_t gpus, uint64_t m, uint64_t n) {
  return nvl_bytes(nodes, gpus, m, n, true);
}
uint64_t gemm_all_reduce_network_bytes(uint32_t nodes, uint64_t m, uint64_t n) { return net_bytes(nodes, m, n, true); }
uint32_t gemm_reduce_scatter_fused_flags(uint32_t nodes, uint32_t gpus, uint64_t m_local, uint64_t n) {
  return flags(nodes, gpus, m_local, n, false);
}
uint32_t gemm_all_reduce_fused_flags(uint32_t nodes, uint32_t gpus, uint64_t m, uint64_t n) {
  return flags(nodes, gpus, m, n, true);
}

GemmReduceScatter::~GemmReduceScatter() = default;

StatusOr<std::unique_ptr<GemmReduceScatter>> GemmReduceScatter::create(Communicator& comm, uint64_t m_local,
                                                                       uint64_t n, uint64_t k,
                                                                       const GemmReduceScatterConfig& config,
                                                                       cudaStream_t stream) {
  std::unique_ptr<GemmReduceScatter> op(new GemmReduceScatter());
  MK_RETURN_IF_ERROR(make(comm, m_local, n, k, config, false, stream, op.get()));
  return StatusOr<std::unique_ptr<GemmReduceScatter>>(std::move(op));
}

StatusOr<std::unique_ptr<GemmAllReduce>> GemmAllReduce::create(Communicator& comm, uint64_t m, uint64_t n, uint64_t k,
                                                               const GemmReduceScatterConfig& config,
                                                               cudaStream_t stream) {
  std::unique_ptr<GemmAllReduce> op(new GemmAllReduce());
  MK_RETURN_IF_ERROR(make(comm, m, n, k, config, true, stream, op.get()));
  return StatusOr<std::unique_ptr<GemmAllReduce>>(std::move(op));
}

Status GemmReduceScatter::make(Communicator& comm, uint64_t rows, uint64_t n, uint64_t k,
                               const GemmReduceScatterConfig& config, bool all_reduce, cudaStream_t stream,
                               GemmReduceScatter* op) {
  const std::string what = all_reduce ? "gemm_all_reduce" : "gemm_reduce_scatter";
  if (all_reduce && (rows == 0 || rows > 0x7FFFFFFFu))
    return Status(StatusCode::kInvalidArgument,
                  what + ": m = " + std::to_string(rows) + "; expected 1 .. 2^31 - 1 rows");
  if (!all_reduce && (rows == 0 || rows * comm.size() > 0x7FFFFFFFu))
    return Status(StatusCode::kInvalidArgument, what + ": m_local = " + std::to_string(rows) +
                                                    "; expected at least 1 row per rank and M = world x m_local "
                                                    "below 2^31");
  if (k == 0 || k % 8 != 0 || k > 0x7FFFFFFFu)
    return Status(StatusCode::kInvalidArgument,
                  what + ": k = " + std::to_string(k) + "; expected a positive multiple of 8 (16-byte rows for TMA)");
  if (n == 0 || n % 8 != 0 || n > 0x7FFFFFFFu)
    return Status(StatusCode::kInvalidArgument,
                  what + ": n = " + std::to_string(n) + "; expected a positive multiple of 8 (16-byte rows for TMA)");
  if (config.block_n != 0 && config.block_n != 128 && config.block_n != 256)
    return Status(StatusCode::kInvalidArgument,
                  what + ": block_n = " + std::to_string(config.block_n) + "; expected 0, 128 or 256");
  if (config.cluster_m < 0 || config.cluster_m > 2)
    return Status(StatusCode::kInvalidArgument,
                  what + ": cluster_m = " + std::to_string(config.cluster_m) + "; expected 0, 1 or 2");
  MK_RETURN_IF_ERROR(ops_detail::check_device(comm, what));
  MK_ASSIGN_OR_RETURN(mk::FusedLayout layout, layout_of(comm));
  // Every rank must plan the same thing (the staged tiles' layout depends on all of it).
  const mk::DeviceComm& c = comm.device();
  MK_RETURN_IF_ERROR(agree(comm, what,
                           {all_reduce ? 3u : 2u, static_cast<uint32_t>(rows), static_cast<uint32_t>(n), static_cast<uint32_t>(k),
                            layout.nodes, static_cast<uint32_t>(config.block_n) | (static_cast<uint32_t>(config.cluster_m) << 16),
                            c.num_flags, c.num_fused_flags, c.nvl_num_flags, c.nvl_fused_flags,
                            static_cast<uint32_t>(c.nvl_bytes), static_cast<uint32_t>(c.nvl_bytes >> 32)},
                           {"the op", all_reduce ? "m (rows of A and of the result)" : "m_local (rows of the result per rank)",
                            "n", "k (each rank's share)",
                            "the number of nodes", "block_n and cluster_m", "Options::num_flags",
                            "Options::fused_flags", "Options::nvlink_flags", "the NVLink buffer's fused-op flags",
                            "Options::nvlink_bytes (low 32 bits)", "Options::nvlink_bytes (high 32 bits)"},
                           stream));
  mk::GemmRsSetup s;
  s.comm = c;
  s.wait = comm.wait_context();
  s.layout = layout;
  if (all_reduce) {
    s.m_rows = static_cast<uint32_t>(rows);
  } else {
    s.m_local = static_cast<uint32_t>(rows);
  }
  s.n = static_cast<uint32_t>(n);
  s.k = static_cast<uint32_t>(k);
  s.all_reduce = all_reduce;
  s.config = mk::GemmRsConfig{config.gemm_blocks, config.block_n, config.cluster_m, config.programmatic_launch};
  op->comm_ = &comm;
  op->all_reduce_ = all_reduce;
  return from_gemm(mk::GemmRsPlan::create(s, &op->plan_), what);
}

Status GemmReduceScatter::launch(const void* a, const void* w, void* c, cudaStream_t stream) {
  const std::string what = all_reduce_ ? "gemm_all_reduce" : "gemm_reduce_scatter";
  if (a != checked_[0] || w != checked_[1] || c != checked_[2])
    MK_RETURN_IF_ERROR(ops_detail::check_pointers(*comm_, what, {{"a", a, false}, {"w", w, false}, {"c", c, false}}));
  checked_[0] = a;
  checked_[1] = w;
  checked_[2] = c;
  MK_RETURN_IF_ERROR(comm_->begin_launch(stream));
  return from_gemm(plan_->launch(a, w, c, stream), what);
}

std::string GemmReduceScatter::describe() const { return plan_->describe(); }

Status gemm_reduce_scatter(Communicator& comm, const void* a, const void* w, void* c, uint64_t m_local, uint64_t n,
                           uint64_t k, cudaStream_t stream) {
  const std::string key =
      "gemm_reduce_scatter/" + std::to_string(m_local) + "/" + std::to_string(n) + "/" + std::to_string(k);
  std::shared_ptr<void>& slot = comm.op_slot(key);
  if (!slot) {
    MK_ASSIGN_OR_RETURN(std::unique_ptr<GemmReduceScatter> op,
                        GemmReduceScatter::create(comm, m_local, n, k, GemmReduceScatterConfig{}, stream));
    slot = std::shared_ptr<GemmReduceScatter>(std::move(op));
  }
  return static_cast<GemmReduceScatter*>(slot.get())->launch(a, w, c, stream);
}

}  // namespace mkernel::rt

namespace mkernel::rt {

Status gemm_all_reduce(Communicator& comm, const void* a, const void* w, void* c, uint64_t m, uint64_t n, uint64_t k,
                       cudaStream_t stream) {
  const std::string key = "gemm_all_reduce/" + std::to_string(m) + "/" + std::to_string(n) + "/" + std::to_string(k);
  std::shared_ptr<void>& slot = comm.op_slot(key);
  if (!slot) {
    MK_ASSIGN_OR_RETURN(std::unique_ptr<GemmAllReduce> op,
                        GemmAllReduce::create(comm, m, n, k, GemmReduceScatterConfig{}, stream));
    slot = std::shared_ptr<GemmAllReduce>(std::move(op));
  }
  return static_cast<GemmAllReduce*>(slot.get())->launch(a, w, c, stream);
}

}  // namespace mkernel::rt
