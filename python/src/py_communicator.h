// py_communicator.h: the compiled module's communicator: one libmkernel Communicator and the
// AllGather+GEMM, GEMM+ReduceScatter, GEMM+AllReduce, MoE and ring attention plans made on it,
// behind the calls Python makes.
//
// Design notes
//  1. Ownership. A PyCommunicator owns its rt::Communicator and every plan made on it; the plans
//     are declared after the communicator, so they are destroyed first (a plan uses the
//     communicator's workspace). close() drops both early; a closed communicator refuses calls.
//  2. The plan caches live here, one per op, keyed by shape ((m_local, n_local, k) for
//     AllGatherGemm, (m_local, n, k) for GemmReduceScatter, (m, n, k) for GemmAllReduce), for the
//     communicator's lifetime. The ops share the communicator's workspace and fused-op flags, in
//     stream order. GemmAllReduce derives from GemmReduceScatter (the same kernel and launch),
//     whose destructor is not virtual, so its plans are owned as GemmAllReduce, in a map of their
//     own, and never through the base. Planning is
//     collective (every rank plans the same shape, the ranks agree through their daemons) and
//     synchronises the stream it is made on, so it cannot happen while that stream is captured
//     into a CUDA graph: a new shape met during capture is refused with the fix (run the shape
//     once before capture, or plan it).
//  3. Streams are integers (cudaStream_t values, as torch.cuda.Stream.cuda_stream gives them).
//     CUDA streams are driver objects, so a stream made by another CUDA runtime in the process
//     (torch's) is the same stream here; 0 is the legacy default stream.
//  4. Devices. Calls run with this communicator's CUDA device current and restore the caller's.
//  5. Errors. Every failure is a Status carried out as StatusError (module.cc turns it into
//     mkernel.MkernelError with the runtime's code, message and origin). Before each launch the
//     communicator's status word is read (no synchronisation): a failure on the GPU in an earlier
//     launch (a peer that died, a wait past its bound) is raised then, naming rank, launch, step
//     and cause.
//  6. MoE pairs. A combine reads the routing and records of the dispatch before it, so the
//     communicator remembers which MoE plan dispatched last; combine runs on that plan, its
//     y_expert and out checked against that dispatch's shape, and is refused (with what to do)
//     when there is none. libmkernel itself refuses a combine with another launch of the
//     communicator since its dispatch. A combine consumes its dispatch.
//  7. The GIL is released around everything that may block: creation (all ranks joining),
//     planning (the agreement), close (the daemon's goodbye, device synchronisation).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "mkernel/common/status.h"
#include "mkernel/runtime/ops.h"
#include "mkernel/runtime/runtime.h"
#include "tensor_args.h"

namespace mkernel::python {

// A Status that left libmkernel (note 5).
struct StatusError {
  std::string code;     // status_code_name(), e.g. "invalid argument"
  std::string message;  // the runtime's message: field, value, expectation; rank, step, cause
  std::string where;    // "ag_gemm.cu:120 via py_communicator.cc:88"
};
[[noreturn]] void throw_status(const Status& s);
inline void throw_if_error(const Status& s) {
  if (!s.ok()) throw_status(s);
}

// What identifies an MoE plan: the shape and the MoeConfig fields Python may set.
struct MoeShape {
  uint64_t tokens = 0, hidden = 0, out_hidden = 0;
  uint32_t experts = 0, top_k = 0;
  uint32_t recv_tokens_per_source = 0;  // 0: tokens (the worst case)
  uint64_t expert_rows_capacity = 0;    // 0: the worst case
  bool apply_scores = true;
  bool fused = false;
  auto key() const {
    return std::make_tuple(tokens, hidden, out_hidden, experts, top_k, recv_tokens_per_source, expert_rows_capacity,
                           apply_scores, fused);
  }
  rt::MoeConfig config() const;
  std::string text() const;
};

// What Python may set of rt::Options (the rest keeps libmkernel's defaults).
struct CommOptions {
  int device = -1;                         // CUDA device; -1: LOCAL_RANK (env) or the current one
  uint64_t nvlink_bytes = 0;               // the fused ops' workspace (all_gather_gemm_nvlink_bytes)
  uint64_t network_workspace_bytes = 0;    // between nodes (all_gather_gemm_network_bytes)
  std::vector<uint64_t> buffer_bytes{4096};
  std::string socket_path;                 // "": MKERNEL_SOCKET or /run/mkerneld/mkerneld.sock
  uint32_t rendezvous_timeout_ms = 60000;
  uint64_t device_wait_timeout_ms = 2000;
  std::string gpu_memory = "auto";
  uint32_t fused_flags = 0;                // Options::fused_flags; 0: libmkernel's default
  std::string client_name = "mkernel (python)";
  // The fused ops' adaptive split (AllGatherGemmConfig::adaptive_split and the others') for every
  // plan made on this communicator: AllGather+GEMM, ring attention (two ranks or more), fused MoE.
  bool adaptive_split = false;
  StatusOr<rt::Options> to_options() const;
};

class PyCommunicator {
 public:
  // Joins `size` ranks with rank 0's unique id (get_unique_id's text).
  static std::unique_ptr<PyCommunicator> create(uint32_t rank, uint32_t size, const std::string& unique_id,
                                                const CommOptions& options);
  // The launcher's variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT,
  // MKERNEL_TOKEN, MKERNEL_PEER_PORT), as rt::Communicator::create_from_env reads them.
  static std::unique_ptr<PyCommunicator> create_from_env(const CommOptions& options);
  ~PyCommunicator();

  // Plans (m_local, n_local, k) on `stream` if it has no plan yet (collective, note 2).
  void plan(uint64_t m_local, uint64_t n_local, uint64_t k, uintptr_t stream);
  bool has_plan(uint64_t m_local, uint64_t n_local, uint64_t k);
  std::string describe(uint64_t m_local, uint64_t n_local, uint64_t k);
  // One launch on `stream` of the checked arguments (tensor_args.h); plans on first use.
  void all_gather_gemm(const AllGatherGemmArgs& args, uintptr_t stream);
  // The same for GEMM+ReduceScatter, shapes (m_local, n, k).
  void plan_reduce_scatter(uint64_t m_local, uint64_t n, uint64_t k, uintptr_t stream);
  bool has_reduce_scatter_plan(uint64_t m_local, uint64_t n, uint64_t k);
  std::string describe_reduce_scatter(uint64_t m_local, uint64_t n, uint64_t k);
  void gemm_reduce_scatter(const GemmReduceScatterArgs& args, uintptr_t stream);
  // The same for GEMM+AllReduce, shapes (m, n, k): m all the rows, every rank gets the whole sum.
  void plan_all_reduce(uint64_t m, uint64_t n, uint64_t k, uintptr_t stream);
  bool has_all_reduce_plan(uint64_t m, uint64_t n, uint64_t k);
  std::string describe_all_reduce(uint64_t m, uint64_t n, uint64_t k);
  void gemm_all_reduce(const GemmAllReduceArgs& args, uintptr_t stream);
  // MoE (note 6): plans on first use, as the others. rows_capacity / experts_per_rank of a plan
  // (planning it if needed) are what dispatch's outputs must hold.
  void plan_moe(const MoeShape& shape, uintptr_t stream);
  bool has_moe_plan(const MoeShape& shape);
  std::string describe_moe(const MoeShape& shape);
  void moe_dispatch(const MoeDispatchArgs& args, const MoeShape& shape, uintptr_t stream);
  void moe_combine(const MoeCombineArgs& args, uintptr_t stream);
  void moe_forward(const MoeForwardArgs& args, const MoeShape& shape, uintptr_t stream);
  // The two-matrix MLP (rt::MoeMlp), planned per shape, intermediate size and activation.
  void moe_mlp(const MoeMlpArgs& args, const MoeShape& shape, rt::MoeActivation activation, uintptr_t stream);
  // Ring attention, one plan per shape (rt::RingAttentionShape, every field).
  void plan_ring_attention(const rt::RingAttentionShape& shape, uintptr_t stream);
  bool has_ring_attention_plan(const rt::RingAttentionShape& shape);
  std::string describe_ring_attention(const rt::RingAttentionShape& shape);
  void ring_attention(const RingAttentionArgs& args, const rt::RingAttentionShape& shape, uintptr_t stream);
  // Every plan with an adaptive split and where it stands, a line each ("" when none): the op,
  // its shape, then rt::SplitState::text. Reads device memory: call after the launches finished.
  std::string split_report();
  // Raises the communicator's first recorded failure, if any (does not block).
  void check();
  void close();

  uint32_t rank() const;
  uint32_t size() const;
  int device() const;
  uint32_t nodes() const;
  bool closed() const { return comm_ == nullptr; }
  uint64_t nvlink_bytes() const { return nvlink_bytes_; }
  uint64_t network_workspace_bytes() const { return network_workspace_bytes_; }
  uint32_t fused_flags() const { return fused_flags_; }
  std::string staging() const;
  std::string staging_reason() const;
  std::string transport() const;

 private:
  PyCommunicator() = default;
  rt::Communicator& live(const char* what);
  rt::AllGatherGemm& plan_locked(uint64_t m_local, uint64_t n_local, uint64_t k, uintptr_t stream);
  rt::GemmReduceScatter& rs_plan_locked(uint64_t m_local, uint64_t n, uint64_t k, uintptr_t stream);
  rt::GemmAllReduce& ar_plan_locked(uint64_t m, uint64_t n, uint64_t k, uintptr_t stream);

  rt::MoeDispatchCombine& moe_plan_locked(const MoeShape& shape, uintptr_t stream);
  rt::RingAttention& ring_plan_locked(const rt::RingAttentionShape& shape, uintptr_t stream);

  using MoeKey = decltype(MoeShape{}.key());
  using RingKey = std::tuple<uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint32_t, uint32_t, uint32_t>;
  static RingKey ring_key(const rt::RingAttentionShape& s);

  std::mutex mu_;  // one call at a time per communicator (the ops share its workspace anyway)
  std::unique_ptr<rt::Communicator> comm_;  // before plans_: destroyed after them (note 1)
  std::map<std::tuple<uint64_t, uint64_t, uint64_t>, std::unique_ptr<rt::AllGatherGemm>> plans_;
  std::map<std::tuple<uint64_t, uint64_t, uint64_t>, std::unique_ptr<rt::GemmReduceScatter>> rs_plans_;
  std::map<std::tuple<uint64_t, uint64_t, uint64_t>, std::unique_ptr<rt::GemmAllReduce>> ar_plans_;
  std::map<MoeKey, std::unique_ptr<rt::MoeDispatchCombine>> moe_plans_;
  std::map<std::tuple<MoeKey, uint64_t, int>, std::unique_ptr<rt::MoeMlp>> mlp_plans_;
  std::map<RingKey, std::unique_ptr<rt::RingAttention>> ring_plans_;
  // The plan whose dispatch was the last MoE launch, and its shape (note 6); null: none pending.
  rt::MoeDispatchCombine* moe_dispatched_ = nullptr;
  MoeShape moe_dispatched_shape_;
  uint64_t nvlink_bytes_ = 0, network_workspace_bytes_ = 0;
  uint32_t fused_flags_ = 0;
  bool adaptive_split_ = false;
};

// Rank 0's bootstrap handle, printable (it carries the communicator's secret: share it only
// with the other ranks).
std::string get_unique_id(const CommOptions& options);

}  // namespace mkernel::python
