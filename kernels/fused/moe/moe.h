// moe.h: host side of the MoE dispatch and combine kernels (device code: moe_comm.cuh; the
// protocol and its CPU replay: moe_plan.h). Applications use the runtime's entry points
// (mkernel/runtime/ops.h), which add the communicator's checks and the agreement between ranks;
// this is the layer below, usable by anything that has a DeviceComm.
//
//   dispatch: x [tokens, hidden], choices [tokens, top_k] (int32, expert or -1), scores
//             [tokens, top_k] (fp32) on every rank  ->  on rank d, x_expert [rows, hidden]: the
//             rows of d's experts, expert by expert (expert_offsets), each row a token that chose
//             the expert; sources in arrival order, then token order (moe_plan.h note 5).
//   combine:  y_expert [rows, out_hidden] in the same order  ->  out [tokens, out_hidden] on the
//             tokens' home ranks: sum over the token's choices of score x y_expert row (or
//             without the scores), fp32 sums in a fixed order, bf16 out.
//
// Workspace (on the communicator, the same on every rank): MoeGeometry::nvl_bytes_needed bytes
// of NVLink buffer and nvl_flags_needed fused-op flags; between nodes net_bytes_needed bytes of
// network workspace and net_flags_needed fused-op flags of the flag array. The plan allocates
// its own device memory for the routing, which the combine reads: a combine follows its dispatch
// with no other fused launch on the communicator in between.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>

#include "common/comm.cuh"
#include "fused/common/split_host.h"
#include "fused/moe/moe_plan.h"
#include "gemm/sm90_bf16_grouped_gemm.h"

namespace mkernel::kernels {

struct MoeKernelArgs;  // moe_comm.cuh

struct MoeSetup {
  DeviceComm comm;       // the communicator's device view (host copy)
  WaitContext wait;      // its wait context (status word, ring error, peer abort, bound)
  MoeGeometry geometry;  // layout.world() == comm.world_size, rank == comm.rank
  int blocks = 0;        // blocks of each launch (fused: the communication blocks); 0: moe_default_blocks
                         // (fused) or moe_standalone_blocks (dispatch and combine on their own)
  bool apply_scores = true;
  // The fused kernel (dispatch + grouped GEMM with one weight per expert + combine in one launch):
  // the plan then owns the expert rows, their outputs and offsets, and forward() runs it.
  bool fused = false;
  GroupedGemmConfig gemm;  // the grouped GEMM's tile width, cluster size, raster (zeros: choose)
  // Fused only: the split between GEMM and communication blocks moves from launch to launch,
  // chosen on the GPU from what earlier launches measured (common/split_policy.h; docs/kernels.md
  // section 16), starting from `blocks`; the grid stays the plan's, results are bit-identical.
  bool adaptive_split = false;
};

class MoePlan {
 public:
  // "" on success, else what is wrong (field, value, expectation). Nothing is launched.
  static std::string create(const MoeSetup& setup, std::unique_ptr<MoePlan>* out);
  ~MoePlan();
  MoePlan(const MoePlan&) = delete;
  MoePlan& operator=(const MoePlan&) = delete;

  // Enqueue one launch each (the caller enqueued begin_launch first). Pointers: device memory,
  // 16-byte aligned; x [tokens, hidden], x_expert [rows_capacity, hidden], y_expert
  // [rows_capacity, out_hidden], out [tokens, out_hidden] bf16; choices and scores [tokens,
  // top_k]; expert_offsets [experts_per_rank + 1] uint32; row_source / row_token (int32) and
  // row_score (fp32) [rows_capacity] or null. Asynchronous: routing errors and overflows land in
  // the communicator's status word with their cause (kDeviceMoeRouting).
  cudaError_t dispatch(const void* x, const int32_t* choices, const float* scores, void* x_expert,
                       uint32_t* expert_offsets, int32_t* row_source, int32_t* row_token, float* row_score,
                       cudaStream_t stream);
  cudaError_t combine(const void* y_expert, void* out, cudaStream_t stream);

  // The fused kernel (MoeSetup::fused): dispatch, y_e = x_e w_e^T for every local expert e
  // (w [experts_per_rank, out_hidden, hidden] bf16, each expert's nn.Linear weight), combine;
  // out [tokens, out_hidden]. One launch: the GEMM starts a band of an expert's rows once they
  // are here, the combine a token once its rows' tiles are done.
  GemmResult forward(const void* x, const int32_t* choices, const float* scores, const void* w, void* out,
                     cudaStream_t stream);

  const MoeGeometry& geometry() const { return geo_; }
  // The adaptive split (MoeSetup::adaptive_split): read back (once the launches of interest
  // finished) and pinned (0: the policy chooses; with no launch in flight). "" or what is wrong.
  std::string split_report(SplitReport* out) const;
  std::string pin_split(int comm);
  int blocks() const { return blocks_; }
  std::string describe() const;

 private:
  MoePlan() = default;
  MoeGeometry geo_;
  int blocks_ = 0;
  size_t smem_ = 0;
  MoeKernelArgs* args_ = nullptr;  // device memory
  void* workspace_ = nullptr;      // device memory: routing, layout, flags, counters
  // Fused only: the plan's expert rows and outputs, and the grouped GEMM it launches.
  void* fused_buffers_ = nullptr;
  GroupedGemmPlan gemm_;
  bool fused_ = false;
  SplitControl* split_ = nullptr;  // device memory; null unless MoeSetup::adaptive_split
};

}  // namespace mkernel::kernels
