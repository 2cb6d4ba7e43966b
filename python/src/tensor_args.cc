// tensor_args.cc: the layout checks of tensor_args.h.
#include "tensor_args.h"

#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

namespace mkernel::python {

namespace nb = nanobind;

namespace {

std::string shape_text(const nb::ndarray<>& t) {
  std::string s = "(";
  for (size_t i = 0; i < t.ndim(); ++i) s += (i ? ", " : "") + std::to_string(t.shape(i));
  return s + (t.ndim() == 1 ? ",)" : ")");
}

std::string strides_text(const nb::ndarray<>& t) {
  std::string s = "(";
  for (size_t i = 0; i < t.ndim(); ++i) s += (i ? ", " : "") + std::to_string(t.stride(i));
  return s + (t.ndim() == 1 ? ",)" : ")");
}

std::string dtype_text(const nb::dlpack::dtype& d) {
  const char* code = nullptr;
  switch (static_cast<nb::dlpack::dtype_code>(d.code)) {
    case nb::dlpack::dtype_code::Int: code = "int"; break;
    case nb::dlpack::dtype_code::UInt: code = "uint"; break;
    case nb::dlpack::dtype_code::Float: code = "float"; break;
    case nb::dlpack::dtype_code::Bfloat: code = "bfloat"; break;
    case nb::dlpack::dtype_code::Complex: code = "complex"; break;
    case nb::dlpack::dtype_code::Bool: code = "bool"; break;
    default: return "DLPack type code " + std::to_string(d.code) + " of " + std::to_string(d.bits) + " bits";
  }
  std::string s = std::string(code) + std::to_string(d.bits);
  if (d.lanes != 1) s += "x" + std::to_string(d.lanes);
  return s;
}

const char* device_text(int type) {
  switch (type) {
    case nb::device::cpu::value: return "cpu";
    case nb::device::cuda::value: return "cuda";
    case nb::device::cuda_host::value: return "cuda_host (pinned host memory)";
    case nb::device::cuda_managed::value: return "cuda_managed";
    case nb::device::rocm::value: return "rocm";
    default: return "another DLPack device";
  }
}

std::string hex(uintptr_t v) {
  char b[24];
  std::snprintf(b, sizeof b, "0x%llx", static_cast<unsigned long long>(v));
  return b;
}

[[noreturn]] void refuse(const std::string& message) { throw ArgumentError{message}; }

// A packed row-major bf16 matrix on a CUDA device, or a refusal naming `name`.
Matrix matrix(const nb::ndarray<>& t, const char* name) {
  const std::string n = name;
  const nb::dlpack::dtype bf16{static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat), 16, 1};
  if (t.dtype() != bf16)
    refuse(n + ": dtype " + dtype_text(t.dtype()) + "; expected bfloat16 (bf16 in, fp32 accumulate)");
  if (t.device_type() != nb::device::cuda::value)
    refuse(n + ": device " + device_text(t.device_type()) + "; expected a CUDA device");
  if (t.ndim() != 2) refuse(n + ": shape " + shape_text(t) + "; expected a matrix (2 dimensions)");
  // Packed row-major: rows follow each other with no gap. A dimension of size 1 may carry any
  // stride (DLPack producers differ there), so it is not held against the array.
  const bool rows_ok = t.shape(0) <= 1 || t.stride(0) == static_cast<int64_t>(t.shape(1));
  const bool cols_ok = t.shape(1) <= 1 || t.stride(1) == 1;
  if (!rows_ok || !cols_ok)
    refuse(n + ": strides " + strides_text(t) + " for shape " + shape_text(t) + "; expected packed row-major (" +
           std::to_string(t.shape(1)) + ", 1)");
  if (t.shape(0) == 0 || t.shape(1) == 0) refuse(n + ": shape " + shape_text(t) + "; expected no empty dimension");
  const auto address = reinterpret_cast<uintptr_t>(t.data());
  if (address % 16 != 0)
    refuse(n + ": data at " + hex(address) + " is not 16-byte aligned; expected 16-byte aligned rows (TMA)");
  return Matrix{t.data(), t.shape(0), t.shape(1), t.device_id()};
}

enum class Elem { kBf16, kInt32, kInt32OrUint32, kFp32 };

bool elem_matches(const nb::dlpack::dtype& d, Elem e) {
  const auto code = static_cast<nb::dlpack::dtype_code>(d.code);
  if (d.lanes != 1) return false;
  switch (e) {
    case Elem::kBf16: return code == nb::dlpack::dtype_code::Bfloat && d.bits == 16;
    case Elem::kInt32: return code == nb::dlpack::dtype_code::Int && d.bits == 32;
    case Elem::kInt32OrUint32:
      return (code == nb::dlpack::dtype_code::Int || code == nb::dlpack::dtype_code::UInt) && d.bits == 32;
    case Elem::kFp32: return code == nb::dlpack::dtype_code::Float && d.bits == 32;
  }
  return false;
}

const char* elem_text(Elem e) {
  switch (e) {
    case Elem::kBf16: return "bfloat16";
    case Elem::kInt32: return "int32";
    case Elem::kInt32OrUint32: return "int32 or uint32";
    case Elem::kFp32: return "float32";
  }
  return "?";
}

// A packed array of `ndim` dimensions of `elem` on a CUDA device, 16-byte aligned, none empty
// (note 3), or a refusal naming `name`.
Array array(const nb::ndarray<>& t, const char* name, Elem elem, size_t ndim) {
  const std::string n = name;
  if (!elem_matches(t.dtype(), elem))
    refuse(n + ": dtype " + dtype_text(t.dtype()) + "; expected " + elem_text(elem));
  if (t.device_type() != nb::device::cuda::value)
    refuse(n + ": device " + device_text(t.device_type()) + "; expected a CUDA device");
  if (t.ndim() != ndim)
    refuse(n + ": shape " + shape_text(t) + "; expected " + std::to_string(ndim) + " dimension" + (ndim == 1 ? "" : "s"));
  // Packed: C-contiguous, a dimension of size 1 with any stride (as for matrices).
  int64_t step = 1;
  for (size_t i = ndim; i-- > 0;) {
    if (t.shape(i) > 1 && t.stride(i) != step) {
      std::string want = "(";
      int64_t w = 1;
      std::vector<int64_t> expected(ndim);
      for (size_t j = ndim; j-- > 0;) {
        expected[j] = w;
        w *= static_cast<int64_t>(t.shape(j));
      }
      for (size_t j = 0; j < ndim; ++j) want += (j ? ", " : "") + std::to_string(expected[j]);
      refuse(n + ": strides " + strides_text(t) + " for shape " + shape_text(t) + "; expected packed " + want +
             (ndim == 1 ? ",)" : ")"));
    }
    step *= static_cast<int64_t>(t.shape(i));
  }
  Array a;
  for (size_t i = 0; i < ndim; ++i) {
    if (t.shape(i) == 0) refuse(n + ": shape " + shape_text(t) + "; expected no empty dimension");
    a.shape.push_back(t.shape(i));
  }
  const auto address = reinterpret_cast<uintptr_t>(t.data());
  if (address % 16 != 0)
    refuse(n + ": data at " + hex(address) + " is not 16-byte aligned; expected 16-byte aligned memory");
  a.data = t.data();
  a.device = t.device_id();
  return a;
}

std::string dims_text(const std::vector<uint64_t>& d) {
  std::string s = "(";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + (d.size() == 1 ? ",)" : ")");
}

void expect_dims(const Array& a, const char* name, const std::vector<uint64_t>& want, const std::string& why) {
  if (a.shape != want)
    refuse(std::string(name) + ": shape " + dims_text(a.shape) + "; expected " + dims_text(want) + " " + why);
}

void expect_same_device(const Array& first, const char* first_name,
                        std::initializer_list<std::pair<const char*, const Array*>> others) {
  for (const auto& [name, a] : others)
    if (a != nullptr && a->device != first.device)
      refuse(std::string(name) + ": on CUDA device " + std::to_string(a->device) + "; expected " + first_name +
             "'s device " + std::to_string(first.device));
}

void expect_shape(const Matrix& m, const char* name, uint64_t rows, uint64_t cols, const std::string& why) {
  if (m.rows != rows || m.cols != cols)
    refuse(std::string(name) + ": shape (" + std::to_string(m.rows) + ", " + std::to_string(m.cols) + "); expected (" +
           std::to_string(rows) + ", " + std::to_string(cols) + ") " + why);
}

// Every other matrix of a launch on a's device.
void expect_on_device_of_a(const Matrix& a, std::initializer_list<std::pair<const char*, int>> others) {
  for (const auto& [name, device] : others)
    if (device != a.device)
      refuse(std::string(name) + ": on CUDA device " + std::to_string(device) + "; expected a's device " +
             std::to_string(a.device));
}

// The operands of a GEMM whose products are summed over ranks (GEMM+ReduceScatter and
// GEMM+AllReduce, note 2): a [M, k], w [n, k] and out [out_rows(M), n], packed bf16 matrices on
// a's device. out_rows gives the result's rows for M, or refuses M; `form` names them in out's
// refusal.
template <class Args, class OutRows>
Args gemm_sum_args(const nb::ndarray<>& a, const nb::ndarray<>& w, const nb::ndarray<>& c, OutRows out_rows,
                   const char* form) {
  Args r;
  r.a = matrix(a, "a");
  r.w = matrix(w, "w");
  r.c = matrix(c, "out");
  const uint64_t rows = out_rows(r.a.rows), k = r.a.cols;
  if (r.w.cols != k)
    refuse("w: shape (" + std::to_string(r.w.rows) + ", " + std::to_string(r.w.cols) + "); expected (n, " +
           std::to_string(k) + "): its rows are k = " + std::to_string(k) + " long like a's");
  expect_shape(r.c, "out", rows, r.w.rows, form);
  expect_on_device_of_a(r.a, {{"w", r.w.device}, {"out", r.c.device}});
  return r;
}

// topk_ids [tokens, top_k] and topk_weights of the same shape.
void expect_routing(const Array& choices, const Array& scores, uint64_t tokens) {
  if (choices.shape[0] != tokens)
    refuse("topk_ids: shape " + dims_text(choices.shape) + "; expected (" + std::to_string(tokens) +
           ", top_k): a row of choices per token of x");
  expect_dims(scores, "topk_weights", choices.shape, "= topk_ids' shape (a score per choice)");
}

}  // namespace

AllGatherGemmArgs check_all_gather_gemm(const nb::ndarray<>& a, const nb::ndarray<>& w, const nb::ndarray<>& c,
                                        const std::optional<nb::ndarray<>>& gathered, uint32_t world) {
  AllGatherGemmArgs r;
  r.a = matrix(a, "a");
  r.w = matrix(w, "w");
  r.c = matrix(c, "out");
  if (gathered.has_value()) r.gathered = matrix(*gathered, "gathered_out");
  const uint64_t m_local = r.a.rows, k = r.a.cols, M = uint64_t{world} * m_local;
  if (r.w.cols != k)
    refuse("w: shape (" + std::to_string(r.w.rows) + ", " + std::to_string(r.w.cols) + "); expected (n_local, " +
           std::to_string(k) + "): its rows are k = " + std::to_string(k) + " long like a's");
  expect_shape(r.c, "out", M, r.w.rows, "= (world * m_local, n_local)");
  if (r.gathered) expect_shape(*r.gathered, "gathered_out", M, k, "= (world * m_local, k)");
  expect_on_device_of_a(
      r.a, {{"w", r.w.device}, {"out", r.c.device}, {"gathered_out", r.gathered ? r.gathered->device : r.a.device}});
  return r;
}

GemmReduceScatterArgs check_gemm_reduce_scatter(const nb::ndarray<>& a, const nb::ndarray<>& w, const nb::ndarray<>& c,
                                                uint32_t world) {
  // a holds every rank's rows: M = world * m_local, and out gets M / world of them.
  const auto band = [world](uint64_t M) {
    if (world == 0 || M % world != 0)
      refuse("a: " + std::to_string(M) + " rows; expected M = world * m_local, a multiple of world = " +
             std::to_string(world) + " (each rank gets M / world rows of the sum)");
    return M / world;
  };
  return gemm_sum_args<GemmReduceScatterArgs>(a, w, c, band, "= (M / world, n)");
}

GemmAllReduceArgs check_gemm_all_reduce(const nb::ndarray<>& a, const nb::ndarray<>& w, const nb::ndarray<>& c) {
  // Every rank gets the whole sum, so any M goes: the kernel's bands need not be equal.
  const auto all_rows = [](uint64_t M) { return M; };
  return gemm_sum_args<GemmAllReduceArgs>(a, w, c, all_rows, "= (M, n)");
}

MoeDispatchArgs check_moe_dispatch(const nb::ndarray<>& x, const nb::ndarray<>& choices, const nb::ndarray<>& scores,
                                   const nb::ndarray<>& x_expert, const nb::ndarray<>& expert_offsets,
                                   const std::optional<nb::ndarray<>>& row_source,
                                   const std::optional<nb::ndarray<>>& row_token,
                                   const std::optional<nb::ndarray<>>& row_score) {
  MoeDispatchArgs r;
  r.x = array(x, "x", Elem::kBf16, 2);
  r.choices = array(choices, "topk_ids", Elem::kInt32, 2);
  r.scores = array(scores, "topk_weights", Elem::kFp32, 2);
  r.x_expert = array(x_expert, "x_expert", Elem::kBf16, 2);
  r.expert_offsets = array(expert_offsets, "expert_offsets", Elem::kInt32OrUint32, 1);
  if (row_source) r.row_source = array(*row_source, "row_source", Elem::kInt32, 1);
  if (row_token) r.row_token = array(*row_token, "row_token", Elem::kInt32, 1);
  if (row_score) r.row_score = array(*row_score, "row_score", Elem::kFp32, 1);
  const uint64_t tokens = r.x.shape[0], hidden = r.x.shape[1], rows = r.x_expert.shape[0];
  expect_routing(r.choices, r.scores, tokens);
  expect_dims(r.x_expert, "x_expert", {rows, hidden}, "= (rows, hidden): rows of x's width");
  if (r.row_source) expect_dims(*r.row_source, "row_source", {rows}, "= (rows,) of x_expert");
  if (r.row_token) expect_dims(*r.row_token, "row_token", {rows}, "= (rows,) of x_expert");
  if (r.row_score) expect_dims(*r.row_score, "row_score", {rows}, "= (rows,) of x_expert");
  expect_same_device(r.x, "x",
                     {{"topk_ids", &r.choices}, {"topk_weights", &r.scores}, {"x_expert", &r.x_expert},
                      {"expert_offsets", &r.expert_offsets}, {"row_source", r.row_source ? &*r.row_source : nullptr},
                      {"row_token", r.row_token ? &*r.row_token : nullptr},
                      {"row_score", r.row_score ? &*r.row_score : nullptr}});
  return r;
}

MoeCombineArgs check_moe_combine(const nb::ndarray<>& y_expert, const nb::ndarray<>& out) {
  MoeCombineArgs r;
  r.y_expert = array(y_expert, "y_expert", Elem::kBf16, 2);
  r.out = array(out, "out", Elem::kBf16, 2);
  if (r.out.shape[1] != r.y_expert.shape[1])
    refuse("out: shape " + dims_text(r.out.shape) + "; expected (tokens, " + std::to_string(r.y_expert.shape[1]) +
           "): rows of y_expert's width (out_hidden)");
  expect_same_device(r.y_expert, "y_expert", {{"out", &r.out}});
  return r;
}

MoeForwardArgs check_moe_forward(const nb::ndarray<>& x, const nb::ndarray<>& choices, const nb::ndarray<>& scores,
                                 const nb::ndarray<>& w, const nb::ndarray<>& out) {
  MoeForwardArgs r;
  r.x = array(x, "x", Elem::kBf16, 2);
  r.choices = array(choices, "topk_ids", Elem::kInt32, 2);
  r.scores = array(scores, "topk_weights", Elem::kFp32, 2);
  r.w = array(w, "w", Elem::kBf16, 3);
  r.out = array(out, "out", Elem::kBf16, 2);
  const uint64_t tokens = r.x.shape[0], hidden = r.x.shape[1];
  expect_routing(r.choices, r.scores, tokens);
  if (r.w.shape[2] != hidden)
    refuse("w: shape " + dims_text(r.w.shape) + "; expected (experts_per_rank, out_hidden, " + std::to_string(hidden) +
           "): each expert's nn.Linear weight [out_hidden, hidden], hidden from x");
  expect_dims(r.out, "out", {tokens, r.w.shape[1]}, "= (tokens, out_hidden)");
  expect_same_device(r.x, "x",
                     {{"topk_ids", &r.choices}, {"topk_weights", &r.scores}, {"w", &r.w}, {"out", &r.out}});
  return r;
}

MoeMlpArgs check_moe_mlp(const nb::ndarray<>& x, const nb::ndarray<>& choices, const nb::ndarray<>& scores,
                         const nb::ndarray<>& w1, const nb::ndarray<>& w2, const nb::ndarray<>& out, bool gated) {
  MoeMlpArgs r;
  r.x = array(x, "x", Elem::kBf16, 2);
  r.choices = array(choices, "topk_ids", Elem::kInt32, 2);
  r.scores = array(scores, "topk_weights", Elem::kFp32, 2);
  r.w1 = array(w1, "w1", Elem::kBf16, 3);
  r.w2 = array(w2, "w2", Elem::kBf16, 3);
  r.out = array(out, "out", Elem::kBf16, 2);
  const uint64_t tokens = r.x.shape[0], hidden = r.x.shape[1];
  expect_routing(r.choices, r.scores, tokens);
  if (r.w2.shape[1] != hidden || r.w2.shape[2] % 8 != 0)
    refuse("w2: shape " + dims_text(r.w2.shape) + "; expected (experts_per_rank, " + std::to_string(hidden) +
           ", inter), inter a multiple of 8: each expert's second nn.Linear weight, hidden from x");
  const uint64_t inter = r.w2.shape[2];
  expect_dims(r.w1, "w1", {r.w2.shape[0], gated ? 2 * inter : inter, hidden},
              gated ? "= (experts_per_rank, 2 x inter, hidden): the gate's rows, then the up projection's"
                    : "= (experts_per_rank, inter, hidden)");
  expect_dims(r.out, "out", {tokens, hidden}, "= (tokens, hidden)");
  expect_same_device(r.x, "x",
                     {{"topk_ids", &r.choices}, {"topk_weights", &r.scores}, {"w1", &r.w1}, {"w2", &r.w2}, {"out", &r.out}});
  return r;
}

RingAttentionArgs check_ring_attention(const nb::ndarray<>& q, const nb::ndarray<>& k, const nb::ndarray<>& v,
                                       const nb::ndarray<>& o, const nb::ndarray<>& lse, const std::string& layout) {
  RingAttentionArgs r;
  if (layout != "bhsd" && layout != "bshd") refuse("layout: '" + layout + "'; expected 'bhsd' or 'bshd'");
  r.bshd = layout == "bshd";
  r.q = array(q, "q", Elem::kBf16, 4);
  r.k = array(k, "k", Elem::kBf16, 4);
  r.v = array(v, "v", Elem::kBf16, 4);
  r.o = array(o, "out", Elem::kBf16, 4);
  r.lse = array(lse, "lse", Elem::kFp32, 3);
  const size_t h = r.bshd ? 2 : 1, s = r.bshd ? 1 : 2;
  const std::string form = r.bshd ? "[B, S, H, D]" : "[B, H, S, D]";
  r.batch = r.q.shape[0];
  r.heads_q = r.q.shape[h];
  r.s_local = r.q.shape[s];
  r.head_dim = r.q.shape[3];
  r.heads_kv = r.k.shape[h];
  if (r.k.shape[0] != r.batch || r.k.shape[s] != r.s_local || r.k.shape[3] != r.head_dim)
    refuse("k: shape " + dims_text(r.k.shape) + "; expected " + form + " with B, S and D of q " + dims_text(r.q.shape) +
           " (layout '" + layout + "')");
  expect_dims(r.v, "v", r.k.shape, "= k's shape");
  expect_dims(r.o, "out", r.q.shape, "= q's shape");
  expect_dims(r.lse, "lse", {r.batch, r.heads_q, r.s_local}, "= (B, Hq, S) of q, float32");
  expect_same_device(r.q, "q", {{"k", &r.k}, {"v", &r.v}, {"out", &r.o}, {"lse", &r.lse}});
  return r;
}

}  // namespace mkernel::python
