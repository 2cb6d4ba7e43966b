// tensor_args.h: what the compiled module checks of the DLPack arrays it is handed, before any
// of them reaches libmkernel.
//
// Design notes
//  1. Arrays arrive through DLPack (any producer with __dlpack__, or a "dltensor" capsule), as
//     nanobind ndarrays without constraints: a constrained parameter would make nanobind convert
//     (copy) an array that does not fit, or refuse it with a message that names no argument.
//     Every refusal here names the argument, the value and what was expected.
//  2. The checks are layout only: dtype bf16, a CUDA device, two dimensions, packed row-major
//     rows, 16-byte aligned data, and the shapes of the four arrays agreeing with each other.
//     They need no GPU and no communicator, so they are testable anywhere. What only the
//     runtime can judge (k and n_local multiples of 8, the workspace, the device being this
//     rank's) the runtime refuses itself, with its own message. GEMM+ReduceScatter's a holds
//     every rank's rows (M = world * m_local), so M must be a multiple of world: that is a
//     shape agreement between arrays, checked here. GEMM+AllReduce takes the same operands and
//     any M (every rank gets all of the sum), so it shares the checks, less that one.
//  3. MoE and ring attention take arrays of other types and ranks (int32 routing, fp32 scores
//     and log-sum-exp, 3-D and 4-D bf16): the same checks, through one Array check that takes the
//     dtype and the number of dimensions. Sizes that only a plan knows (the MoE's expert rows, its
//     experts per rank) are compared with the plan by the communicator (py_communicator.cc).
#pragma once

#include <nanobind/ndarray.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mkernel::python {

// A packed row-major bf16 matrix on a CUDA device, as the runtime takes it.
struct Matrix {
  void* data = nullptr;
  uint64_t rows = 0;
  uint64_t cols = 0;
  int device = -1;
};

// The arguments of one AllGather+GEMM launch, checked against each other (note 2).
struct AllGatherGemmArgs {
  Matrix a;                        // [m_local, k]
  Matrix w;                        // [n_local, k]
  Matrix c;                        // [world * m_local, n_local]
  std::optional<Matrix> gathered;  // [world * m_local, k]
};

// The arguments of one GEMM+ReduceScatter launch, checked against each other (note 2).
struct GemmReduceScatterArgs {
  Matrix a;  // [M, k], M = world * m_local
  Matrix w;  // [n, k]
  Matrix c;  // [m_local, n]
};

// The arguments of one GEMM+AllReduce launch, checked against each other (note 2).
struct GemmAllReduceArgs {
  Matrix a;  // [M, k], M any positive number
  Matrix w;  // [n, k]
  Matrix c;  // [M, n]
};

// A packed (C-contiguous) array of any rank and element type on a CUDA device, 16-byte aligned.
struct Array {
  void* data = nullptr;
  std::vector<uint64_t> shape;
  int device = -1;
};

// The arguments of one MoE dispatch (note 3): x [tokens, hidden] bf16, choices [tokens, top_k]
// int32, scores [tokens, top_k] fp32; out: x_expert [rows, hidden] bf16, expert_offsets
// [experts_per_rank + 1] int32 or uint32, and, when given, row_source, row_token [rows] int32,
// row_score [rows] fp32.
struct MoeDispatchArgs {
  Array x, choices, scores, x_expert, expert_offsets;
  std::optional<Array> row_source, row_token, row_score;
};

// The arguments of one MoE combine: y_expert [rows, out_hidden] bf16 -> out [tokens, out_hidden] bf16.
struct MoeCombineArgs {
  Array y_expert, out;
};

// The arguments of one fused MoE forward: x, choices, scores as for dispatch; w [experts_per_rank,
// out_hidden, hidden] bf16; out [tokens, out_hidden] bf16.
struct MoeForwardArgs {
  Array x, choices, scores, w, out;
};

// The arguments of one MoE MLP: x, choices, scores as for dispatch; w1 [experts_per_rank, w1_rows,
// hidden], w2 [experts_per_rank, hidden, inter] bf16; out [tokens, hidden] bf16.
struct MoeMlpArgs {
  Array x, choices, scores, w1, w2, out;
};

// The arguments of one ring attention launch: q, o [B, Hq, S, D] and k, v [B, Hkv, S, D] (layout
// "bhsd") or [B, S, H, D] ("bshd"), bf16; lse [B, Hq, S] fp32.
struct RingAttentionArgs {
  Array q, k, v, o, lse;
  bool bshd = false;
  uint64_t batch = 0, heads_q = 0, heads_kv = 0, s_local = 0, head_dim = 0;
};

// Throw ArgumentError (module.cc translates it) naming the first argument that does not fit.
AllGatherGemmArgs check_all_gather_gemm(const nanobind::ndarray<>& a, const nanobind::ndarray<>& w,
                                        const nanobind::ndarray<>& c,
                                        const std::optional<nanobind::ndarray<>>& gathered, uint32_t world);
GemmReduceScatterArgs check_gemm_reduce_scatter(const nanobind::ndarray<>& a, const nanobind::ndarray<>& w,
                                                const nanobind::ndarray<>& c, uint32_t world);
GemmAllReduceArgs check_gemm_all_reduce(const nanobind::ndarray<>& a, const nanobind::ndarray<>& w,
                                        const nanobind::ndarray<>& c);

MoeDispatchArgs check_moe_dispatch(const nanobind::ndarray<>& x, const nanobind::ndarray<>& choices,
                                   const nanobind::ndarray<>& scores, const nanobind::ndarray<>& x_expert,
                                   const nanobind::ndarray<>& expert_offsets,
                                   const std::optional<nanobind::ndarray<>>& row_source,
                                   const std::optional<nanobind::ndarray<>>& row_token,
                                   const std::optional<nanobind::ndarray<>>& row_score);
MoeCombineArgs check_moe_combine(const nanobind::ndarray<>& y_expert, const nanobind::ndarray<>& out);
MoeForwardArgs check_moe_forward(const nanobind::ndarray<>& x, const nanobind::ndarray<>& choices,
                                 const nanobind::ndarray<>& scores, const nanobind::ndarray<>& w,
                                 const nanobind::ndarray<>& out);
// gated: w1_rows = 2 x inter (the gate's rows, then the up projection's), else inter.
MoeMlpArgs check_moe_mlp(const nanobind::ndarray<>& x, const nanobind::ndarray<>& choices,
                         const nanobind::ndarray<>& scores, const nanobind::ndarray<>& w1,
                         const nanobind::ndarray<>& w2, const nanobind::ndarray<>& out, bool gated);
// layout: "bhsd" or "bshd".
RingAttentionArgs check_ring_attention(const nanobind::ndarray<>& q, const nanobind::ndarray<>& k,
                                       const nanobind::ndarray<>& v, const nanobind::ndarray<>& o,
                                       const nanobind::ndarray<>& lse, const std::string& layout);

// A refused argument: the message names it (module.cc raises mkernel.ArgumentError).
struct ArgumentError {
  std::string message;
};

}  // namespace mkernel::python
