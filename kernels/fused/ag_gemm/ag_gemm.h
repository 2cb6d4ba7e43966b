// ag_gemm.h: host side of the fused AllGather+GEMM kernel (device code: ag_gemm.cuh; the
// movement plan: ag_gemm_plan.h). Applications use the runtime's entry points
// (mkernel/runtime/ops.h), which add the communicator's checks and the agreement between ranks;
// this is the layer below, usable by anything that has a DeviceComm.
//
//   rank r:  C_r [M, n_local] = A [M, k] * W_r [n_local, k]^T,   A = rows of every rank's A_q
//            stacked in rank order (A_q [m_local, k]), M = world * m_local
//
// Workspace (on the communicator, the same on every rank): the NVLink buffer holds the gathered
// A (nvl_bytes >= world * m_local * k * 2) and its fused-op flags (world * chunks + world);
// between nodes the network workspace holds one shard per node and the flag array's fused-op
// flags the arrivals (nodes * chunks + nodes).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/comm.cuh"
#include "fused/ag_gemm/ag_gemm_plan.h"
#include "fused/common/split_host.h"
#include "gemm/sm90_bf16_gemm.h"

namespace mkernel::kernels {

struct AgGemmRoleArgs;  // ag_gemm.cuh

struct AgGemmConfig {
  int comm_blocks = 0;      // blocks running the movement plan; 0: ag_default_comm_blocks
  int gemm_blocks = 0;      // blocks running GEMM tiles; 0: every SM the comm blocks leave
  int block_n = 0;          // GEMM tile width (128, 256); 0: the engine's choice for the shape
  int cluster_m = 0;        // 1 or 2; 0: the engine's choice
  uint32_t chunk_rows = 0;  // rows per moved and flagged chunk; 0: ag_default_chunk_rows
  bool bulk_copies = true;  // GPU-memory copies through TMA bulk copies (else 16-byte loads/stores)
  // The pushes of this rank's own chunks to its node peers by the copy engines (one stream per
  // peer beside the kernel: each chunk, then its ready flag, copied from the launch counter) in
  // place of the communication blocks, and the gathered output's copies too (each chunk once it
  // arrived). Forwarding between nodes stays with the blocks.
  bool copy_engine_pushes = false;
  // Record where each launch's time goes (ag_trace.h; read with AgGemmPlan::trace_report): a few
  // stamps per step, a memset per launch. A diagnostic, off by default.
  bool trace = false;
  // The split between GEMM and communication blocks moves from launch to launch, chosen on the
  // GPU from what the previous launches measured (common/split_policy.h; docs/kernels.md section
  // 16), starting from comm_blocks (or the default rule). The grid stays the plan's; results are
  // bit-identical whatever the split (the GEMM's decomposition is the plan's, its split-K partials
  // summed in a fixed order). Off by default until measured better on the GPUs it runs on.
  bool adaptive_split = false;
  // The kernel's launch overlaps the end of the launch's begin_launch kernel (programmatic
  // dependent launch; every block waits for it before touching memory). Off by default: built
  // and compiled, not yet run on a GPU (docs/kernels.md section 11, "Launch overhead").
  bool programmatic_launch = false;
};

// The split of blocks between roles when the caller leaves it open. One SM moved about 40 GB/s of
// device-local copy and about 20 GB/s of NVLink pushes in the measurements so far
// (docs/kernels.md section 10), and a peer should get a whole shard within the GEMM's own-rows
// time, so: eight per node peer, four for the network path (staging and forwarding), two for the
// copies into the workspace and the gathered output; at most 16, so the GEMM keeps at least 116
// of 132 SMs. A starting rule, to be replaced by measured splits (and later the adaptive one).
// With copy-engine pushes on one node the copy engines also fill the gathered output, and the
// blocks only copy the own rows that straddling tiles read from the workspace: one.
int ag_default_comm_blocks(const FusedLayout& layout, bool copy_engine_pushes = false);

struct AgGemmSetup {
  DeviceComm comm;          // the communicator's device view (host copy)
  WaitContext wait;         // its wait context (status word, ring error, peer abort, bound)
  FusedLayout layout;       // layout.world() == comm.world_size; rank = comm.rank
  uint32_t m_local = 0;     // rows of A per rank (any positive value)
  uint32_t n_local = 0;     // rows of W_r (columns of C_r); multiple of 8
  uint32_t k = 0;           // multiple of 8
  AgGemmConfig config;
};

class AgGemmPlan {
 public:
  // Checks the setup against the communicator's workspace and builds the plan: the movement
  // steps and role arguments in device memory, the GEMM configuration. Nothing is launched.
  static GemmResult create(const AgGemmSetup& setup, std::unique_ptr<AgGemmPlan>* out);
  ~AgGemmPlan();
  AgGemmPlan(const AgGemmPlan&) = delete;
  AgGemmPlan& operator=(const AgGemmPlan&) = delete;

  // Enqueues one launch on `stream` (the caller enqueued begin_launch first): a_local [m_local,
  // k], w [n_local, k], c [M, n_local], gathered_out [M, k] or null, all bf16, packed, 16-byte
  // aligned. Asynchronous; device-side errors land in the communicator's status word.
  GemmResult launch(const void* a_local, const void* w, void* c, void* gathered_out, cudaStream_t stream);

  // The last launch's trace as a table (AgGemmConfig::trace; ag_trace.h). Reads device memory:
  // call after the launch finished (e.g. after synchronising its stream).
  std::string trace_report() const;

  // The adaptive split (AgGemmConfig::adaptive_split): where it stands, read from device memory
  // (call once the launches of interest finished); and pinning it to `comm` communication
  // blocks, 0 to let the policy choose again (call with no launch of this plan in flight). Both
  // refuse a plan made without adaptive_split.
  GemmResult split_report(SplitReport* out) const;
  GemmResult pin_split(int comm);

  const AgGeometry& geometry() const { return geo_; }
  const GemmPlan& gemm() const { return gemm_; }
  // e.g. "R=2 (1x2) m_local=4096 k=8192 n=4096 chunks=8x512 comm=4 gemm=128 n256 c2 ..."
  std::string describe() const;

 private:
  AgGemmPlan() = default;
  AgGemmSetup setup_;
  AgGeometry geo_;
  GemmPlan gemm_;
  void* gathered_ = nullptr;
  AgStep* steps_ = nullptr;          // device memory
  AgGemmRoleArgs* role_args_ = nullptr;  // device memory
  void* split_workspace_ = nullptr;  // the GEMM's split-K scratch (small M), zero between launches
  uint32_t* step_done_ = nullptr;    // per step, blocks done with their slice (zero between launches)
  cudaStream_t side_ = nullptr;      // the copy engine's copy of the own rows into gathered_out
  cudaEvent_t fork_ = nullptr, join_ = nullptr;
  // Copy-engine pushes (AgGemmConfig::copy_engine_pushes): per node peer i (1 .. gpus - 1), its
  // stream, its join event and its pushes in plan order; the gates (AgGemmRoleArgs::go).
  struct CePeer {
    cudaStream_t stream = nullptr;
    cudaEvent_t join = nullptr;
    uint8_t* base = nullptr;      // the peer's NVLink buffer as mapped here
    std::vector<AgCopy> copies;   // ag_copy_engine_copies
  };
  std::vector<CePeer> ce_;     // empty: SM pushes
  uint32_t* go_ = nullptr;     // device memory, gpus words
  uint32_t* out_go_ = nullptr; // device memory, world * chunks words: the gathered output's gates
  std::vector<AgCopy> out_copies_;  // ag_gathered_out_copies
  std::vector<AgStep> block_steps_;  // what the communication blocks run (host copy, for the trace)
  uint64_t* trace_ = nullptr;        // device memory, ag_trace_words stamps; null unless config.trace
  size_t trace_words_ = 0;
  GemmResult enqueue_ce_gathered_out(void* gathered_out);
  std::string ce_broken_;      // why an earlier launch left the copy streams unusable ("": none)
  SplitControl* split_ = nullptr;  // device memory; null unless config.adaptive_split
  GemmResult enqueue_ce_pushes(const void* a_local, cudaStream_t stream);
};

}  // namespace mkernel::kernels
