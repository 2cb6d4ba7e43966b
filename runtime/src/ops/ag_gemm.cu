// ag_gemm.cu: AllGather+GEMM on a Communicator (ops.h): the layout from the communicator, the
// checks, the agreement between ranks, then the kernel-level plan (kernels/fused/ag_gemm).
#include <cuda_runtime.h>

#include "agree.h"
#include "op_common.h"
#include "fused/ag_gemm/ag_gemm.h"
#include "mkernel/runtime/ops.h"

namespace mkernel::rt {

namespace mk = mkernel::kernels;

using ops_detail::from_gemm;
using ops_detail::layout_of;

uint64_t all_gather_gemm_nvlink_bytes(uint32_t world, uint64_t m_local, uint64_t k) {
  return uint64_t{world} * m_local * k * 2;
}

uint64_t all_gather_gemm_network_bytes(uint32_t nodes, uint64_t m_local, uint64_t k) {
  return nodes > 1 ? uint64_t{nodes} * m_local * k * 2 : 0;
}

AllGatherGemm::~AllGatherGemm() = default;

StatusOr<std::unique_ptr<AllGatherGemm>> AllGatherGemm::create(Communicator& comm, uint64_t m_local, uint64_t n_local,
                                                               uint64_t k, const AllGatherGemmConfig& config,
                                                               cudaStream_t stream) {
  const std::string what = "all_gather_gemm";
  // Arguments every rank can check alone.
  if (m_local == 0 || m_local > 0x7FFFFFFFu)
    return Status(StatusCode::kInvalidArgument,
                  what + ": m_local = " + std::to_string(m_local) + "; expected 1 .. 2^31 - 1 rows per rank");
  if (k == 0 || k % 8 != 0 || k > 0x7FFFFFFFu)
    return Status(StatusCode::kInvalidArgument,
                  what + ": k = " + std::to_string(k) + "; expected a positive multiple of 8 (16-byte rows for TMA)");
  if (n_local == 0 || n_local % 8 != 0 || n_local > 0x7FFFFFFFu)
    return Status(StatusCode::kInvalidArgument, what + ": n_local = " + std::to_string(n_local) +
                                                    "; expected a positive multiple of 8 (16-byte rows for TMA)");
  MK_RETURN_IF_ERROR(ops_detail::check_device(comm, what));
  MK_ASSIGN_OR_RETURN(mk::FusedLayout layout, layout_of(comm));
  const uint32_t chunk_rows =
      config.chunk_rows != 0 ? config.chunk_rows : mk::ag_default_chunk_rows(static_cast<uint32_t>(m_local));
  // Every rank must plan the same thing: agree before anything depends on it.
  const mk::DeviceComm& c = comm.device();
  MK_RETURN_IF_ERROR(agree(comm, what,
                           {1u, static_cast<uint32_t>(m_local), static_cast<uint32_t>(n_local), static_cast<uint32_t>(k),
                            layout.nodes, chunk_rows, c.num_flags, c.num_fused_flags, c.nvl_num_flags,
                            c.nvl_fused_flags, static_cast<uint32_t>(c.nvl_bytes), static_cast<uint32_t>(c.nvl_bytes >> 32)},
                           {"the op", "m_local (rows of A per rank)", "n_local (rows of the weight shard)", "k",
                            "the number of nodes", "chunk_rows", "Options::num_flags", "Options::fused_flags",
                            "Options::nvlink_flags", "the NVLink buffer's fused-op flags",
                            "Options::nvlink_bytes (low 32 bits)", "Options::nvlink_bytes (high 32 bits)"},
                           stream));

  mk::AgGemmSetup s;
  s.comm = c;
  s.wait = comm.wait_context();
  s.layout = layout;
  s.m_local = static_cast<uint32_t>(m_local);
  s.n_local = static_cast<uint32_t>(n_local);
  s.k = static_cast<uint32_t>(k);
  s.config = mk::AgGemmConfig{config.comm_blocks, config.gemm_blocks, config.block_n, config.cluster_m, chunk_rows,
                              config.bulk_copies, config.copy_engine_pushes, config.trace, config.adaptive_split,
                              config.programmatic_launch};
  std::unique_ptr<AllGatherGemm> op(new AllGatherGemm());
  op->comm_ = &comm;
  op->nodes_ = layout.nodes;
  op->gpus_ = layout.gpus;
  MK_RETURN_IF_ERROR(from_gemm(mk::AgGemmPlan::create(s, &op->plan_), what));
  return StatusOr<std::unique_ptr<AllGatherGemm>>(std::move(op));
}

Status AllGatherGemm::launch(const void* a, const void* w, void* c, void* gathered_out, cudaStream_t stream) {
  const std::string what = "all_gather_gemm";
  // The same pointers as the last call were checked then (a training loop passes the same
  // buffers every step; the check costs a driver call per pointer).
  const bool same = a == checked_[0] && w == checked_[1] && c == checked_[2] && gathered_out == checked_[3];
  if (!same)
    MK_RETURN_IF_ERROR(ops_detail::check_pointers(
        *comm_, what, {{"a", a, false}, {"w", w, false}, {"c", c, false}, {"gathered_out", gathered_out, true}}));
  checked_[0] = a;
  checked_[1] = w;
  checked_[2] = c;
  checked_[3] = gathered_out;
  MK_RETURN_IF_ERROR(comm_->begin_launch(stream));
  return from_gemm(plan_->launch(a, w, c, gathered_out, stream), what);
}

std::string AllGatherGemm::describe() const { return plan_->describe(); }

std::string AllGatherGemm::trace_report() const { return plan_->trace_report(); }

StatusOr<SplitState> AllGatherGemm::split_state() const {
  mk::SplitReport r;
  MK_RETURN_IF_ERROR(from_gemm(plan_->split_report(&r), "all_gather_gemm"));
  return ops_detail::to_split_state(r);
}

Status AllGatherGemm::pin_split(int comm_blocks) { return from_gemm(plan_->pin_split(comm_blocks), "all_gather_gemm"); }

Status all_gather_gemm(Communicator& comm, const void* a, const void* w, void* c, void* gathered_out, uint64_t m_local,
                       uint64_t n_local, uint64_t k, cudaStream_t stream) {
  const std::string key =
      "all_gather_gemm/" + std::to_string(m_local) + "/" + std::to_string(n_local) + "/" + std::to_string(k);
  std::shared_ptr<void>& slot = comm.op_slot(key);
  if (!slot) {
    MK_ASSIGN_OR_RETURN(std::unique_ptr<AllGatherGemm> op,
                        AllGatherGemm::create(comm, m_local, n_local, k, AllGatherGemmConfig{}, stream));
    slot = std::shared_ptr<AllGatherGemm>(std::move(op));
  }
  return static_cast<AllGatherGemm*>(slot.get())->launch(a, w, c, gathered_out, stream);
}

}  // namespace mkernel::rt
