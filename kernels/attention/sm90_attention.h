// sm90_attention.h: host API of the attention core (device code: sm90_attention.cuh).
//
//   O[b, h, i, :] = softmax(scale * Q[b, h, i, :] K[b, h / group, :, :]^T) V[b, h / group, :, :]
//   lse[b, h, i]  = log sum_j exp(scale * Q[b, h, i, :] . K[b, h / group, j, :])
//
// Types: Q, K, V and O bf16; lse fp32 (natural log, for a backward pass); fp32 softmax state and
// accumulation. head_dim 64 or 128. Grouped-query attention: heads_q a multiple of heads_kv.
//
// Layouts: each tensor is addressed through strides (in elements) of batch, head and sequence,
// with head_dim contiguous. [B, H, S, D] (kBHSD, PyTorch's SDPA layout) and [B, S, H, D] (kBSHD,
// the layout most models hold before the transpose) are both native: TMA tensor maps carry the
// strides, so neither is copied or transposed, and kStrided takes any strides that TMA can walk
// (every stride a multiple of 8 elements, i.e. 16-byte aligned rows). lse is always [B, H, S].
//
// Causal: query i sees key j iff j <= i (top-left aligned, as SDPA's is_causal), i.e. causal
// offset 0; rows past seq_kv see every key.
//
// Chunks (the ring's building block, also usable alone): with num_chunks > 0 the keys and values
// come as up to kAttnMaxChunks separate spans, each with its own relation to the queries (full,
// causal with an offset, skip). They are visited in order and merged with the online softmax in
// fp32 (sm90_attention_params.h notes 2-3), exactly as the fused ring kernel visits the chunks
// that travel around the ring. Needs attention_workspace_bytes() of scratch (args.workspace).
//
// Errors are returned (AttnResult, naming the field, its value and what is expected); nothing
// exits or aborts. Inside the kernel every pipeline wait is bounded; an expired wait is recorded
// in *wait.status (kDevicePipelineTimeout at kStepAttnPipeline) and the kernel finishes.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "attention/sm90_attention_params.h"
#include "common/status.h"

namespace mkernel::kernels {

enum class AttnError : int {
  kOk = 0,
  kInvalidShape,
  kInvalidHeads,
  kInvalidHeadDim,
  kInvalidDtype,
  kInvalidLayout,
  kInvalidPointer,
  kInvalidChunks,
  kInvalidConfig,
  kWorkspaceTooSmall,
  kUnsupportedDevice,
  kCudaError,
};

struct AttnResult {
  AttnError code = AttnError::kOk;
  std::string message;
  bool ok() const { return code == AttnError::kOk; }
};

// Element types a caller may hand over; the core takes kBF16 (and fp32 lse) only, and says so.
enum class AttnDtype : int { kBF16 = 0, kFP16 = 1, kFP32 = 2, kFP8E4M3 = 3 };
const char* attn_dtype_name(AttnDtype t);

enum class AttnLayout : int {
  kBHSD = 0,     // [batch, heads, seq, head_dim], packed
  kBSHD = 1,     // [batch, seq, heads, head_dim], packed
  kStrided = 2,  // the *_strides fields below
};

// Strides in elements; head_dim is contiguous.
struct AttnStrides {
  int64_t batch = 0, head = 0, seq = 0;
};

// Kernel configuration. Zero (or -1) means "choose".
struct AttnConfig {
  int block_n = 0;     // key block: 128, 160 (pingpong 1), or 192 (pingpong 1, head_dim 64)
  int pingpong = -1;   // 1: the two consumer warpgroups take turns on the tensor cores
  int num_blocks = 0;  // persistent blocks; 0 = one per SM (or fewer when there are fewer units)
  int unit_order = -1; // AttnUnitOrder; -1: kAttnDynamic for a causal launch given a workspace, else
                       // kAttnHeadMajor (sm90_attention_params.h note 1)
  int l2_promotion = -1;  // L2 fill size of the q, k and v loads: 0, 64, 128 or 256 bytes; -1:
                          // kAttnDefaultL2Promotion (the GEMM's GemmConfig::l2_promotion)
};

inline constexpr int kAttnDefaultL2Promotion = 256;

// One span of keys/values (num_chunks > 0). k and v point at the chunk's first position, with
// the strides of args.k_strides / v_strides (or of the layout over seq_kv = this chunk's length
// when the layout is packed: pass kStrided to address chunks inside a longer buffer).
struct AttnKVChunk {
  const void* k = nullptr;
  const void* v = nullptr;
  int64_t kv_len = 0;
  AttnRelation relation = kAttnFull;
  int64_t causal_offset = 0;  // kAttnCausal: row i sees key j iff j <= i + causal_offset
};

struct AttnArgs {
  const void* q = nullptr;  // [batch, heads_q, seq_q, head_dim] in `layout`
  const void* k = nullptr;  // [batch, heads_kv, seq_kv, head_dim]
  const void* v = nullptr;
  void* o = nullptr;        // like q
  float* lse = nullptr;     // fp32 [batch, heads_q, seq_q]
  AttnDtype q_dtype = AttnDtype::kBF16, k_dtype = AttnDtype::kBF16, v_dtype = AttnDtype::kBF16,
            o_dtype = AttnDtype::kBF16, lse_dtype = AttnDtype::kFP32;
  int64_t batch = 0, heads_q = 0, heads_kv = 0, seq_q = 0, seq_kv = 0, head_dim = 0;
  AttnLayout layout = AttnLayout::kBHSD;
  AttnStrides q_strides, k_strides, v_strides, o_strides;  // kStrided only
  bool causal = false;
  float scale = 0.0f;  // 0: 1 / sqrt(head_dim)

  int num_chunks = 0;  // 0: one chunk from k, v, seq_kv, causal
  AttnKVChunk chunks[kAttnMaxChunks];
  // attention_workspace_bytes(), zeroed once after allocation (launches leave its counters zero
  // again; one launch at a time per workspace). Needed by num_chunks > 1 (the running state); a
  // causal launch without it takes its units in a static order, a few percent slower.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;

  AttnConfig config;
  WaitContext wait{nullptr, nullptr, nullptr, nullptr, 5'000'000'000ull, 0};
  uint32_t debug = 0;  // AttnParams::debug (tests)
};

struct AttnPlan {
  AttnArgs args;
  AttnConfig config;  // nothing left to choose
  AttnParams params{};
  AttnMaps maps{};
};

// Validates `args` and resolves the configuration for the current device.
[[nodiscard]] AttnResult attention_plan(const AttnArgs& args, AttnPlan* plan);

// Launches a plan (no re-validation); repeated launches of one shape skip the planning.
[[nodiscard]] AttnResult attention_launch(const AttnPlan& plan, cudaStream_t stream);

// Plans and launches. Asynchronous: kernel-side errors appear in *args.wait.status.
[[nodiscard]] AttnResult attention_fwd(const AttnArgs& args, cudaStream_t stream);

// Scratch: 256 bytes of schedule counters, and for num_chunks > 1 the fp32 running O and lse.
size_t attention_workspace_bytes(const AttnArgs& args);

// For fused kernels that drive the core (the ring): the tensor map of a [batch, heads, rows,
// head_dim] bf16 tensor with the given strides, as the core loads and stores it (boxes of 64
// columns x box_rows rows of one head, 128-byte swizzle; rows past `rows` read as zero and are not
// written), and the strides of a packed layout.
[[nodiscard]] AttnResult attention_tensor_map(CUtensorMap* map, const void* ptr, int64_t head_dim, int64_t rows,
                                              int64_t heads, int64_t batch, const AttnStrides& strides,
                                              uint32_t box_rows, const char* name,
                                              int l2_promotion = kAttnDefaultL2Promotion);
AttnStrides attention_packed_strides(AttnLayout layout, int64_t heads, int64_t seq, int64_t head_dim);

// "d128 n128 pp1 b132 snake c1", for logs and benchmarks.
std::string attention_config_string(const AttnPlan& plan);

// Floating-point operations of the two products, counting only visible (unmasked) pairs for
// causal: 4 * batch * heads_q * head_dim * (visible query-key pairs).
double attention_flops(const AttnArgs& args);

}  // namespace mkernel::kernels
