// ops.h: the fused operators of libmkernel, on a Communicator.
//
//   AllGather+GEMM (tensor-parallel column-linear layer over R ranks):
//     rank r holds A_r [m_local, k] (its rows of the activation) and W_r [n_local, k] (its weight
//     shard, nn.Linear layout); it gets C_r = AllGather(A) @ W_r^T, [M, n_local], M = R * m_local,
//     and, when asked, the gathered A [M, k] (for the backward pass).
//   GEMM+ReduceScatter (tensor-parallel row-linear layer over R ranks):
//     rank r holds A_r [M, k_local] and W_r [n, k_local] (its share of the reduction dimension);
//     it gets rows r * m_local ... (r + 1) * m_local - 1 of sum over q of A_q @ W_q^T, [m_local, n],
//     M = R * m_local (M must be a multiple of R, as for a reduce-scatter of equal parts). Partial
//     sums meet in fp32 in a fixed order and are rounded to bf16 once: deterministic, bit for bit
//     from run to run (docs/kernels.md, GEMM+ReduceScatter).
//   GEMM+AllReduce: the same operands; every rank gets the whole sum [M, n], the same bits on every
//     rank; M any positive number (the reduction is scattered over the ranks by bands of
//     floor(b M / R) ... rows, then gathered).
//   MoE dispatch and combine (expert parallelism over R ranks, E experts, E / R per rank):
//     every rank holds T tokens [T, hidden] with top_k choices (expert or -1) and router scores;
//     dispatch gives rank d the rows of its experts (x_expert, expert by expert, offsets on the
//     device), each token sent once per rank and once per node; combine takes the experts'
//     outputs in the same rows and gives every token's home rank the score-weighted sum over its
//     choices [T, out_hidden], in a fixed order (docs/kernels.md, MoE).
//   MoE MLP (MoeMlp): dispatch, every local expert's two matrices with the activation between
//     (SwiGLU by default), combine: the expert layer of a model, five launches, no host sync.
//   Ring attention (sequence parallelism over R ranks): rank r holds Q_r, K_r, V_r, its s_local
//     positions of the sequence in the chosen placement; it gets O_r = attention of its queries
//     over every rank's keys and values, and the log-sum-exp, in one persistent kernel that passes
//     K/V around while it computes (docs/kernels.md, ring attention).
//
// Design notes
//  1. Plans. An op object is made once per shape, collectively: every rank of the communicator
//     calls create() with its shape; the ranks agree (shape, layout, flag counts) through their
//     daemons before anything is launched, and disagreement is an error on every rank naming
//     both values, never a hang or wrong numbers. launch() then runs on the caller's stream with
//     no host synchronisation, any number of times, and can be captured in a CUDA graph (each
//     replay is a new launch). all_gather_gemm() does both, keeping plans per shape.
//  2. Where ranks are. Ranks on one daemon share a node and reach each other over NVLink; ranks
//     on other daemons are other nodes, reached through the proxies by rail peers only. Ranks
//     must be numbered node-major with the same number of GPUs on every node.
//  3. Workspace. The gathered activation lives in the communicator's NVLink buffer
//     (Options::nvlink_bytes >= all_gather_gemm_nvlink_bytes), with fused-op flags
//     (Options::fused_flags); between nodes one shard per node also lives in the network workspace
//     (Options::network_workspace_bytes >= all_gather_gemm_network_bytes). One fused op at a time
//     per communicator, in stream order.
//  4. Errors. Bad arguments are refused before anything is launched, with the field, the value
//     and what was expected. Failures on the GPU (a peer that died, the daemon gone, a wait past
//     Options::device_wait_timeout_ns) end the kernel on every rank; Communicator::check() then
//     names the rank, the launch, the step and the cause.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mkernel/common/status.h"
#include "mkernel/runtime/runtime.h"

namespace mkernel::kernels {
class AgGemmPlan;
class GemmRsPlan;
class MoePlan;
class RingAttnPlan;
}

namespace mkernel::rt {

// The block split and chunking of AllGather+GEMM; zeros mean "choose" (docs/kernels.md).
struct AllGatherGemmConfig {
  int comm_blocks = 0;      // blocks that move the activation
  int gemm_blocks = 0;      // blocks that compute tiles (0: the SMs the comm blocks leave)
  int block_n = 0;          // GEMM tile width 128 or 256 (the fused ops build those two)
  int cluster_m = 0;        // 1 or 2
  uint32_t chunk_rows = 0;  // rows moved and flagged together
  bool bulk_copies = true;  // GPU-memory copies by TMA bulk copies (false: 16-byte loads/stores)
  // The own rows to the node peers by the copy engines (one stream per peer beside the kernel)
  // instead of the communication blocks, which then only copy locally (docs/api.md). Off until
  // measured on two GPUs against the blocks.
  bool copy_engine_pushes = false;
  // Record where each launch's time goes (AllGatherGemm::trace_report). A diagnostic: a memset and
  // a few stores per step per launch.
  bool trace = false;
  // Let the kernel move the split between GEMM and communication blocks from launch to launch,
  // from what it measured (starting at comm_blocks or the default rule; docs/api.md "Adaptive
  // split"). Results are bit-identical whatever the split. Off until measured better.
  bool adaptive_split = false;
  // Launch the fused kernel with programmatic dependence on begin_launch's one-thread kernel, so
  // that its launch overlaps it (every block waits for it before touching memory). Off by default:
  // built, not yet run on a GPU (docs/kernels.md section 11, "Launch overhead").
  bool programmatic_launch = false;
};

// A fused op's split of blocks between compute and communication, read back (adaptive_split).
struct SplitState {
  bool adaptive = false;     // the op was made with adaptive_split
  bool settled = false;      // the policy stopped exploring (it reopens when the times drift)
  bool pinned = false;       // pin_split holds it
  int comm_blocks = 0;       // communication blocks of the next launch
  int last_comm_blocks = 0;  // of the last finished launch
  uint32_t launches = 0;     // finished launches of this op
  float last_us = 0;         // the last launch's time on the GPU (first block in to last block out)
  float last_wait_us = 0;    // its compute blocks' wait for data, averaged over them
  float last_compute_done_us = 0, last_comm_done_us = 0;  // when each role's last block finished
  int grid_blocks = 0;       // blocks of every launch (compute + communication)
  std::vector<int> candidates;  // the communication block counts the policy considers, ascending
  std::string text;          // all of it in one line, with every candidate's average time
};

// Options::nvlink_bytes and Options::network_workspace_bytes an AllGather+GEMM of this size needs.
uint64_t all_gather_gemm_nvlink_bytes(uint32_t world, uint64_t m_local, uint64_t k);
uint64_t all_gather_gemm_network_bytes(uint32_t nodes, uint64_t m_local, uint64_t k);

class AllGatherGemm {
 public:
  // Collective (note 1). The agreement is a launch on `stream`, stream-ordered after the
  // caller's earlier work there; create() waits for that stream (up to
  // Options::rendezvous_timeout), never for the whole device.
  static StatusOr<std::unique_ptr<AllGatherGemm>> create(Communicator& comm, uint64_t m_local, uint64_t n_local,
                                                         uint64_t k, const AllGatherGemmConfig& config = {},
                                                         cudaStream_t stream = nullptr);
  ~AllGatherGemm();

  // Enqueues begin_launch and the fused kernel on `stream`: a [m_local, k], w [n_local, k],
  // c [M, n_local], gathered_out [M, k] or null; bf16, row-major, packed, 16-byte aligned,
  // device memory of this rank's GPU. With gathered_out the kernel also writes the gathered
  // activation there (every rank's rows, for the backward pass), overlapped with the GEMM; the
  // workspace itself is the op's and holds no complete copy.
  Status launch(const void* a, const void* w, void* c, void* gathered_out, cudaStream_t stream);

  // The plan in words (layout, chunks, blocks, GEMM configuration).
  std::string describe() const;
  // With AllGatherGemmConfig::trace: the last launch's times as a table (each step's wait, copy
  // and publication, each chunk's arrival, in microseconds from the kernel's start). Reads device
  // memory: call once the launch finished (after synchronising its stream).
  std::string trace_report() const;
  // With AllGatherGemmConfig::adaptive_split: where the split stands (reads device memory: call
  // once the launches of interest finished), and pinning it to `comm_blocks` (0: the policy chooses
  // again; call with no launch of this op in flight). Errors without adaptive_split.
  StatusOr<SplitState> split_state() const;
  Status pin_split(int comm_blocks);
  uint32_t nodes() const { return nodes_; }
  uint32_t gpus_per_node() const { return gpus_; }

 private:
  AllGatherGemm() = default;
  Communicator* comm_ = nullptr;
  std::unique_ptr<kernels::AgGemmPlan> plan_;
  uint32_t nodes_ = 1, gpus_ = 1;
  const void* checked_[4] = {};  // the pointers the last launch checked
};

// One call: plans the shape on its first use (collectively, note 1, on `stream`) and launches.
Status all_gather_gemm(Communicator& comm, const void* a, const void* w, void* c, void* gathered_out,
                       uint64_t m_local, uint64_t n_local, uint64_t k, cudaStream_t stream);

// The tile width and cluster size of GEMM+ReduceScatter; zeros mean "the engine's choice".
struct GemmReduceScatterConfig {
  int gemm_blocks = 0;  // blocks that compute tiles (0: every SM); every block also moves its tiles
  int block_n = 0;      // GEMM tile width 128 or 256
  int cluster_m = 0;    // 1 or 2
  // Launch the fused kernel with programmatic dependence on begin_launch's one-thread kernel, so
  // that its launch overlaps it (every block waits for it before touching memory). Off by default:
  // built, not yet run on a GPU (docs/kernels.md section 11, "Launch overhead").
  bool programmatic_launch = false;
};

// Options::nvlink_bytes and Options::network_workspace_bytes a GEMM+ReduceScatter of this size
// needs (for the default tile width; the plan says what it needs when it differs).
uint64_t gemm_reduce_scatter_nvlink_bytes(uint32_t nodes, uint32_t gpus, uint64_t m_local, uint64_t n);
uint64_t gemm_reduce_scatter_network_bytes(uint32_t nodes, uint64_t m_local, uint64_t n);

class GemmReduceScatter {
 public:
  // Collective (note 1): every rank with the same m_local, n and k (its k_local).
  static StatusOr<std::unique_ptr<GemmReduceScatter>> create(Communicator& comm, uint64_t m_local, uint64_t n,
                                                             uint64_t k, const GemmReduceScatterConfig& config = {},
                                                             cudaStream_t stream = nullptr);
  ~GemmReduceScatter();

  // Enqueues begin_launch and the fused kernel on `stream`: a [M, k], w [n, k], c [m_local, n]
  // ([M, n] for GemmAllReduce); bf16, row-major, packed, 16-byte aligned, device memory of this
  // rank's GPU.
  Status launch(const void* a, const void* w, void* c, cudaStream_t stream);

  std::string describe() const;

 protected:
  GemmReduceScatter() = default;
  // m_local rows per rank (reduce-scatter), or m rows in all (all-reduce).
  static Status make(Communicator& comm, uint64_t rows, uint64_t n, uint64_t k, const GemmReduceScatterConfig& config,
                     bool all_reduce, cudaStream_t stream, GemmReduceScatter* op);
  Communicator* comm_ = nullptr;
  std::unique_ptr<kernels::GemmRsPlan> plan_;
  const void* checked_[3] = {};
  bool all_reduce_ = false;
};

// GEMM+AllReduce: the same kernel and plan as GEMM+ReduceScatter, every band then spread to every
// rank; launch(a, w, c, stream) with a [m, k], w [n, k], c [m, n]; m (= M) any positive number.
class GemmAllReduce : public GemmReduceScatter {
 public:
  static StatusOr<std::unique_ptr<GemmAllReduce>> create(Communicator& comm, uint64_t m, uint64_t n, uint64_t k,
                                                         const GemmReduceScatterConfig& config = {},
                                                         cudaStream_t stream = nullptr);

 private:
  GemmAllReduce() = default;
};

// The same for GEMM+AllReduce of m (= M, all rows) x n.
uint64_t gemm_all_reduce_nvlink_bytes(uint32_t nodes, uint32_t gpus, uint64_t m, uint64_t n);
uint64_t gemm_all_reduce_network_bytes(uint32_t nodes, uint64_t m, uint64_t n);
// Options::fused_flags a GEMM+ReduceScatter (m_local rows per rank) or GEMM+AllReduce (m rows)
// of this size needs, for whichever tile width the engine picks.
uint32_t gemm_reduce_scatter_fused_flags(uint32_t nodes, uint32_t gpus, uint64_t m_local, uint64_t n);
uint32_t gemm_all_reduce_fused_flags(uint32_t nodes, uint32_t gpus, uint64_t m, uint64_t n);

// One call: plans the shape on its first use (collectively, on `stream`) and launches.
Status gemm_reduce_scatter(Communicator& comm, const void* a, const void* w, void* c, uint64_t m_local, uint64_t n,
                           uint64_t k, cudaStream_t stream);
Status gemm_all_reduce(Communicator& comm, const void* a, const void* w, void* c, uint64_t m, uint64_t n, uint64_t k,
                       cudaStream_t stream);

// Capacities and blocks of the MoE; zeros mean "the worst case" / "choose" (docs/kernels.md).
struct MoeConfig {
  uint32_t recv_tokens_per_source = 0;  // tokens one rank may send one rank or node (0: tokens)
  uint64_t expert_rows_capacity = 0;    // expert rows a rank may receive (0: the worst case)
  uint32_t chunk_tokens = 0;            // tokens moved and flagged together
  int blocks = 0;                       // blocks of each launch (fused: the communication blocks)
  bool apply_scores = true;             // combine weights the expert outputs by the router scores
  // The fused kernel: dispatch, one GEMM per expert (a weight [out_hidden, hidden] each) and
  // combine in one launch (forward()); dispatch() and combine() are then not available.
  // Correct (bit-identical to the three launches); on one GPU, where it has nothing to overlap,
  // about as fast as dispatch() + a grouped GEMM + combine() but not faster (docs/kernels.md
  // section 14): use the three launches until two GPUs have measured it.
  bool fused = false;
  int block_n = 0;                      // fused: the grouped GEMM's tile width 128 or 256 (0: choose)
  int cluster_m = 0;                    // fused: 1 or 2 (0: choose)
  int gemm_blocks = 0;                  // fused: blocks that compute tiles (0: every SM the others leave)
  // Fused: as AllGatherGemmConfig::adaptive_split, GEMM and communication (dispatch and combine)
  // blocks, starting from `blocks`. Off by default, not yet run on a GPU.
  bool adaptive_split = false;
};

// Options::nvlink_bytes, Options::network_workspace_bytes and Options::fused_flags an MoE of this
// size needs.
uint64_t moe_nvlink_bytes(uint32_t nodes, uint32_t gpus, uint64_t tokens, uint64_t hidden, uint64_t out_hidden,
                          uint32_t experts, uint32_t top_k, const MoeConfig& config = {});
uint64_t moe_network_bytes(uint32_t nodes, uint32_t gpus, uint64_t tokens, uint64_t hidden, uint64_t out_hidden,
                           uint32_t experts, uint32_t top_k, const MoeConfig& config = {});
uint32_t moe_fused_flags(uint32_t nodes, uint32_t gpus, uint64_t tokens, uint32_t experts, uint32_t top_k,
                         const MoeConfig& config = {});

class MoeDispatchCombine {
 public:
  // Collective (note 1): every rank with the same tokens, hidden, out_hidden, experts, top_k and
  // config.
  static StatusOr<std::unique_ptr<MoeDispatchCombine>> create(Communicator& comm, uint64_t tokens, uint64_t hidden,
                                                              uint64_t out_hidden, uint32_t experts, uint32_t top_k,
                                                              const MoeConfig& config = {},
                                                              cudaStream_t stream = nullptr);
  ~MoeDispatchCombine();

  // Rows of x_expert / y_expert to allocate, and this rank's experts.
  uint64_t rows_capacity() const;
  uint32_t experts_per_rank() const;

  // Enqueues begin_launch and the dispatch kernel: x [tokens, hidden] bf16, choices [tokens,
  // top_k] int32 (expert or -1), scores [tokens, top_k] fp32; out: x_expert [rows_capacity,
  // hidden] bf16, expert_offsets [experts_per_rank + 1] uint32 (rows of local expert e are
  // [offsets[e], offsets[e + 1])), and, when not null, per row its token's home rank and index
  // (int32) and the router score (fp32) [rows_capacity]. Routing that names a bad expert or
  // exceeds the capacities ends the launch on every rank; Communicator::check() names it.
  Status dispatch(const void* x, const int32_t* choices, const float* scores, void* x_expert, uint32_t* expert_offsets,
                  int32_t* row_source, int32_t* row_token, float* row_score, cudaStream_t stream);
  // Enqueues begin_launch and the combine kernel: y_expert [rows_capacity, out_hidden] bf16 in the
  // rows of the last dispatch -> out [tokens, out_hidden] bf16. Must follow that dispatch with no
  // other launch of the communicator in between (the dispatch's routing and records are read).
  Status combine(const void* y_expert, void* out, cudaStream_t stream);

  // MoeConfig::fused: enqueues begin_launch and the fused kernel: x, choices, scores as for
  // dispatch; w [experts_per_rank, out_hidden, hidden] bf16 (local expert e's nn.Linear weight
  // w[e]); out [tokens, out_hidden] = for each token the sum over its choices of score x
  // (x_token @ w[e]^T), rounded to bf16 once per expert output and per partial as in combine.
  Status forward(const void* x, const int32_t* choices, const float* scores, const void* w, void* out,
                 cudaStream_t stream);

  std::string describe() const;
  // With MoeConfig::adaptive_split (fused): as AllGatherGemm::split_state and pin_split.
  StatusOr<SplitState> split_state() const;
  Status pin_split(int comm_blocks);

 private:
  MoeDispatchCombine() = default;
  Communicator* comm_ = nullptr;
  std::unique_ptr<kernels::MoePlan> plan_;
  uint64_t dispatch_launch_ = 0;  // comm.launches_begun() right after the last dispatch (0: none)
  const void* checked_[10] = {};  // the pointers the last launches checked (dispatch's 8, combine's 2)
  const void* checked_fused_[5] = {};
  bool fused_ = false;
};

// The activation between an MoE MLP's two matrices (docs/kernels.md, MoE, "The two-matrix MLP").
//   kSwiGlu  silu(gate) * up      kGeGlu  gelu(gate) * up      (gated: w1 holds 2 x inter rows,
//   kSilu    silu                 kGelu   gelu (erf form)       the gate rows first, then up)
//   kRelu    max(v, 0)
enum class MoeActivation { kSwiGlu, kGeGlu, kSilu, kGelu, kRelu };

// An expert-parallel MoE MLP layer: dispatch, the experts' first matrix (a grouped GEMM), the
// activation, the second matrix (a grouped GEMM), combine, enqueued as five launches on the
// caller's stream with no host synchronisation (the expert counts stay on the GPU; capturable in a
// CUDA graph, replays may route differently). For every token t on its home rank:
//   out[t] = sum over t's choices (e, s) of s x (act(x_t w1[e]^T) w2[e]^T)
// with each GEMM output and the activation rounded to bf16 once, the combine's sums in fp32 in a
// fixed order: bit-identical from run to run. The op owns its expert rows and intermediates
// (workspace_bytes()). MoeConfig applies as for MoeDispatchCombine, except `fused` (refused: the
// fused kernel takes one matrix) and block_n / cluster_m / gemm_blocks, which here set both grouped
// GEMMs' tile width, cluster size and blocks (0: choose).
class MoeMlp {
 public:
  // Collective (note 1), like MoeDispatchCombine::create with out_hidden = hidden; `inter` (a
  // positive multiple of 8) and `activation` are this rank's (ranks may differ).
  static StatusOr<std::unique_ptr<MoeMlp>> create(Communicator& comm, uint64_t tokens, uint64_t hidden, uint64_t inter,
                                                  uint32_t experts, uint32_t top_k,
                                                  MoeActivation activation = MoeActivation::kSwiGlu,
                                                  const MoeConfig& config = {}, cudaStream_t stream = nullptr);
  ~MoeMlp();

  // x [tokens, hidden] bf16, choices [tokens, top_k] int32 (expert or -1), scores [tokens, top_k]
  // fp32; w1 [experts_per_rank, w1_rows(), hidden] bf16 (gated: gate rows then up rows);
  // w2 [experts_per_rank, hidden, inter] bf16; out [tokens, hidden] bf16. Routing errors end the
  // launch on every rank as for dispatch (Communicator::check()).
  Status forward(const void* x, const int32_t* choices, const float* scores, const void* w1, const void* w2, void* out,
                 cudaStream_t stream);

  uint64_t rows_capacity() const;
  uint32_t experts_per_rank() const;
  uint64_t w1_rows() const;          // 2 x inter (gated) or inter
  uint64_t workspace_bytes() const;  // device memory the op holds besides the communicator's
  std::string describe() const;

 private:
  MoeMlp();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};


// ---- ring attention ------------------------------------------------------------------------------

// How positions are placed on the ranks (docs/kernels.md, ring attention):
//   kNonCausal         no mask; rank r holds positions [r s_local, (r + 1) s_local)
//   kCausalZigzag      causal; the sequence is cut into 2R chunks and rank r holds chunks r and
//                      2R - 1 - r (every rank does the same work); reorder with zigzag_reorder
//   kCausalContiguous  causal, contiguous like kNonCausal (rank R - 1 does R times the work of
//                      rank 0: for comparison with rings that place this way)
enum class RingPlacement : uint32_t { kNonCausal = 0, kCausalContiguous = 1, kCausalZigzag = 2 };

// [B, H, S, D] (PyTorch's SDPA layout) or [B, S, H, D] (before the transpose); both native.
enum class AttentionLayout : uint32_t { kBHSD = 0, kBSHD = 1 };

struct RingAttentionShape {
  uint64_t batch = 1;
  uint64_t heads_q = 0;
  uint64_t heads_kv = 0;   // heads_q a multiple of it (grouped-query attention)
  uint64_t s_local = 0;    // positions per rank (even with kCausalZigzag); any value, not a tile multiple
  uint64_t head_dim = 0;   // 64 or 128
  AttentionLayout layout = AttentionLayout::kBHSD;
  RingPlacement placement = RingPlacement::kNonCausal;
  float scale = 0.0f;      // 0: 1 / sqrt(head_dim)
};

// The block split and slots; zeros mean "choose" (docs/kernels.md).
struct RingAttentionConfig {
  int comm_blocks = 0;      // blocks that pass K/V on (0: a rule from the layout)
  int attn_blocks = 0;      // blocks that run the attention core (0: the SMs the comm blocks leave)
  uint32_t slots = 0;       // K/V chunks a rank holds at once (0: 4, at least GPUs per node across nodes)
  bool bulk_copies = true;  // GPU-memory copies by TMA bulk copies (false: 16-byte loads/stores)
  // As AllGatherGemmConfig::adaptive_split: attention and communication blocks. Two ranks or more.
  bool adaptive_split = false;
};

// Options::nvlink_bytes, Options::network_workspace_bytes and Options::fused_flags a ring of this
// shape needs on `nodes` x `gpus` ranks (slots 0: the default).
uint64_t ring_attention_nvlink_bytes(uint32_t nodes, uint32_t gpus, const RingAttentionShape& shape, uint32_t slots = 0);
uint64_t ring_attention_network_bytes(uint32_t nodes, const RingAttentionShape& shape);
uint32_t ring_attention_fused_flags(uint32_t nodes, uint32_t gpus);

class RingAttention {
 public:
  // Collective (note 1): every rank with the same shape and configuration.
  static StatusOr<std::unique_ptr<RingAttention>> create(Communicator& comm, const RingAttentionShape& shape,
                                                         const RingAttentionConfig& config = {},
                                                         cudaStream_t stream = nullptr);
  ~RingAttention();

  // Enqueues begin_launch and the fused kernel on `stream`: q, o [B, Hq, s_local, D], k, v [B, Hkv,
  // s_local, D] (or [B, s_local, H, D]), bf16, packed, 16-byte aligned; lse fp32 [B, Hq, s_local];
  // device memory of this rank's GPU.
  Status launch(const void* q, const void* k, const void* v, void* o, float* lse, cudaStream_t stream);

  std::string describe() const;
  // Floating-point operations of this rank's share (visible query-key pairs only).
  double flops() const;
  // With RingAttentionConfig::adaptive_split: as AllGatherGemm::split_state and pin_split.
  StatusOr<SplitState> split_state() const;
  Status pin_split(int comm_blocks);

 private:
  RingAttention() = default;
  Communicator* comm_ = nullptr;
  std::unique_ptr<kernels::RingAttnPlan> plan_;
  const void* checked_[5] = {};
};

// One call: plans the shape on its first use (collectively, on `stream`) and launches.
Status ring_attention(Communicator& comm, const void* q, const void* k, const void* v, void* o, float* lse,
                      const RingAttentionShape& shape, cudaStream_t stream);

// Zigzag placement (kCausalZigzag): perm[p] = the original position of placed position p, for a
// sequence of `seq` positions (a multiple of 2 x world).
StatusOr<std::vector<uint64_t>> zigzag_permutation(uint64_t seq, uint32_t world);

// Reorders a whole sequence on one GPU into zigzag placement (to_zigzag) or back: src and dst
// [batch, heads, seq, head_dim] or [batch, seq, heads, head_dim] of elem_bytes-byte elements,
// packed, distinct device buffers. Rank r's part of the placed sequence is then positions
// [r seq / world, (r + 1) seq / world). One kernel on `stream`.
Status zigzag_reorder(const void* src, void* dst, uint64_t batch, uint64_t heads, uint64_t seq, uint64_t head_dim,
                      uint32_t elem_bytes, AttentionLayout layout, uint32_t world, bool to_zigzag,
                      cudaStream_t stream);

}  // namespace mkernel::rt
