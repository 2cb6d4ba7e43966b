// ring_attn.h: host side of the fused ring-attention kernel (device code: ring_attn.cuh; the
// movement plan: ring_attn_plan.h). Applications use the runtime's entry points
// (mkernel/runtime/ops.h), which add the communicator's checks and the agreement between ranks;
// this is the layer below, usable by anything that has a DeviceComm.
//
//   rank r holds Q_r [B, Hq, s_local, D], K_r, V_r [B, Hkv, s_local, D] (or [B, s_local, H, D]),
//   bf16, packed: its s_local positions of the placed sequence (ring_attn_plan.h note 5). It gets
//   O_r (like Q_r, bf16) = attention of its queries over every rank's keys and values, and
//   lse_r [B, Hq, s_local] fp32 (natural log), what a backward pass needs.
//
// Layouts: [B, H, S, D] (kBHSD) and [B, S, H, D] (kBSHD) are both native: K and V move as the
// bytes they are (a slot holds a chunk in the caller's layout) and every tensor map carries the
// layout's strides, as in the attention core. Other strides (kStrided) are refused: a chunk must
// be one contiguous span to move as one copy.
//
// Workspace (on the communicator, the same on every rank): the NVLink buffer holds `slots` KV
// slots of 2 x B x Hkv x s_local x D x 2 bytes each, its fused-op flags 3 x world; between nodes the
// network workspace holds one chunk per node and the flag array's fused-op flags 2 x nodes. The
// plan allocates its own fp32 running state (B x Hq x s_local x (D + 1) x 4 bytes).
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "attention/sm90_attention.h"
#include "common/comm.cuh"
#include "fused/common/split_host.h"
#include "fused/ring_attn/ring_attn_plan.h"

namespace mkernel::kernels {

struct RingAttnArgs;    // ring_attn.cuh
struct RingAttnLaunch;  // ring_attn.cuh
struct RingAttnMaps;    // ring_attn.cuh

struct RingAttnConfig {
  int comm_blocks = 0;      // blocks moving K/V; 0: ring_default_comm_blocks
  int attn_blocks = 0;      // blocks running the attention core; 0: every SM the comm blocks leave
  uint32_t slots = 0;       // KV slots per rank; 0: ring_default_slots
  bool bulk_copies = true;  // GPU-memory copies through TMA bulk copies (else 16-byte loads/stores)
  // The split between attention and communication blocks moves from launch to launch, chosen on
  // the GPU from what the previous launches measured (common/split_policy.h; docs/kernels.md
  // section 16), starting from comm_blocks (or the default rule); the grid stays the plan's and
  // the results are bit-identical whatever the split. Off by default until measured better.
  // Needs at least two ranks (one rank has no communication blocks).
  bool adaptive_split = false;
};

// Blocks given to communication when the caller leaves it open: 2, plus 2 per node peer (up to
// 3 peers), plus 2 with several nodes; none on one rank. A starting rule from the per-SM rates of
// AllGather+GEMM (docs/kernels.md section 10), not yet measured for the ring.
int ring_default_comm_blocks(const FusedLayout& layout);

struct RingAttnSetup {
  DeviceComm comm;     // the communicator's device view (host copy)
  WaitContext wait;    // its wait context (status word, ring error, peer abort, bound)
  FusedLayout layout;  // layout.world() == comm.world_size; rank = comm.rank
  uint32_t batch = 0, heads_q = 0, heads_kv = 0, s_local = 0, head_dim = 0;
  AttnLayout tensor_layout = AttnLayout::kBHSD;  // kBHSD or kBSHD, packed
  uint32_t placement = kRingNonCausal;           // RingPlacement
  float scale = 0.0f;                            // 0: 1 / sqrt(head_dim)
  RingAttnConfig config;
};

// Bytes of the communicator's workspace a ring of this shape needs (the plan says the same).
uint64_t ring_kv_chunk_bytes(uint32_t batch, uint32_t heads_kv, uint32_t s_local, uint32_t head_dim);
uint64_t ring_nvl_bytes_needed(uint32_t slots, uint32_t batch, uint32_t heads_kv, uint32_t s_local, uint32_t head_dim);
uint64_t ring_net_bytes_needed(uint32_t nodes, uint32_t batch, uint32_t heads_kv, uint32_t s_local, uint32_t head_dim);

class RingAttnPlan {
 public:
  // Checks the setup against the communicator's workspace and builds the plan: movement steps,
  // chunk relations and kernel arguments in device memory, the running state. Nothing launched.
  static AttnResult create(const RingAttnSetup& setup, std::unique_ptr<RingAttnPlan>* out);
  ~RingAttnPlan();
  RingAttnPlan(const RingAttnPlan&) = delete;
  RingAttnPlan& operator=(const RingAttnPlan&) = delete;

  // Enqueues one launch on `stream` (the caller enqueued begin_launch first): q, o [B, Hq,
  // s_local, D], k, v [B, Hkv, s_local, D] (or the kBSHD order), bf16, packed, 16-byte aligned;
  // lse fp32 [B, Hq, s_local]. Asynchronous; device-side errors land in the communicator's status
  // word. Capturable in a CUDA graph (the tensor maps of these pointers travel as parameters).
  AttnResult launch(const void* q, const void* k, const void* v, void* o, float* lse, cudaStream_t stream);

  const RingGeometry& geometry() const { return geo_; }
  // The adaptive split (RingAttnConfig::adaptive_split): read back (once the launches of interest
  // finished), and pinned to `comm` communication blocks, 0 to let the policy choose again (with
  // no launch of this plan in flight). Both refuse a plan made without adaptive_split.
  AttnResult split_report(SplitReport* out) const;
  AttnResult pin_split(int comm);
  // Floating-point operations of this rank's two products (visible query-key pairs only).
  double flops() const;
  // e.g. "R=2 (1x2) zigzag B=1 Hq=32 Hkv=8 s_local=16384 D=128 slots=1 comm=4 attn=128 n160"
  std::string describe() const;

 private:
  RingAttnPlan() = default;
  AttnResult bind(const void* q, const void* k, const void* v, void* o, float* lse);
  RingAttnSetup setup_;
  RingGeometry geo_;
  int block_n_ = 128;
  uint32_t grid_ = 0, comm_blocks_ = 0;
  std::unique_ptr<RingAttnMaps> maps_;
  std::unique_ptr<RingAttnLaunch> params_;
  const void* bound_[5] = {};     // the pointers the maps were made for
  RingAttnArgs* args_ = nullptr;  // device memory
  RingStep* steps_ = nullptr;
  void* chunks_ = nullptr;        // AttnChunk[2 R]
  uint32_t* counters_ = nullptr;  // item_done[steps], freed_count[R]
  float* running_ = nullptr;      // o_run and lse_run of both groups
  SplitControl* split_ = nullptr; // device memory; null unless config.adaptive_split
};

// Reorders a sequence into zigzag placement (to_zigzag) or back: dst position p holds src position
// ring_zigzag_source(seq, world, p) (or the inverse). Tensors [batch, heads, seq, head_dim] or
// [batch, seq, heads, head_dim] of `elem_bytes`-byte elements (any type: rows are copied),
// packed; seq a multiple of 2 x world; src and dst distinct. One kernel on `stream`.
[[nodiscard]] AttnResult ring_zigzag_reorder(const void* src, void* dst, int64_t batch, int64_t heads, int64_t seq,
                                             int64_t head_dim, uint32_t elem_bytes, AttnLayout layout, uint32_t world,
                                             bool to_zigzag, cudaStream_t stream);

}  // namespace mkernel::kernels
