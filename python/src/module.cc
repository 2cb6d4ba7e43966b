// module.cc: mkernel._C, the compiled half of the Python package (docs/python.md).
//
// Design notes
//  1. No torch. Tensors come in through DLPack (tensor_args.h), streams as integers
//     (py_communicator.h note 3), so one build of this module serves every PyTorch version and
//     any other DLPack producer. torch.library registration is pure Python (mkernel/ops.py).
//  2. nanobind rather than pybind11: its ndarray type imports DLPack (versioned and unversioned
//     capsules, or any object with __dlpack__) and exposes dtype, device, shape and strides
//     without a framework dependency; pybind11 has no DLPack support of its own, so the capsule
//     handling would be ours to write and keep right. nanobind also builds for the stable ABI
//     from Python 3.12 (one module for 3.12, 3.13, ...) and adds less per call.
//  3. Errors become Python exceptions from mkernel._errors (their classes live in Python, so
//     the pure-Python package raises the same ones): a runtime Status as MkernelError (or
//     ArgumentError for an invalid argument) carrying code, message and origin; a refused array
//     as ArgumentError naming the argument.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "mkernel/runtime/ops.h"
#include "py_communicator.h"
#include "tensor_args.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace mkernel::python {
namespace {

// Raises the exception mkernel._errors.<factory>(*args) builds (note 3). Never throws: a
// failure to build it leaves a RuntimeError with the message instead.
template <class... Args>
void raise_from_python(const char* factory, const std::string& fallback, const Args&... args) {
  try {
    nb::object exc = nb::module_::import_("mkernel._errors").attr(factory)(args...);
    PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
  } catch (const std::exception&) {
    PyErr_Clear();
    PyErr_SetString(PyExc_RuntimeError, fallback.c_str());
  }
}

void translate(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (const StatusError& e) {
    raise_from_python("from_status", e.message, e.code, e.message, e.where);
  } catch (const ArgumentError& e) {
    raise_from_python("argument_error", e.message, e.message);
  }
  // Anything else propagates to nanobind's own translators (the catch clauses above are the
  // only ones here, so other exceptions leave this function unhandled, as nanobind expects).
}

CommOptions options_from(int device, uint64_t nvlink_bytes, uint64_t network_workspace_bytes,
                         std::vector<uint64_t> buffer_bytes, std::string socket_path, uint32_t rendezvous_timeout_ms,
                         uint64_t device_wait_timeout_ms, std::string gpu_memory, uint32_t fused_flags,
                         bool adaptive_split) {
  CommOptions o;
  o.device = device;
  o.nvlink_bytes = nvlink_bytes;
  o.network_workspace_bytes = network_workspace_bytes;
  o.buffer_bytes = std::move(buffer_bytes);
  o.socket_path = std::move(socket_path);
  o.rendezvous_timeout_ms = rendezvous_timeout_ms;
  o.device_wait_timeout_ms = device_wait_timeout_ms;
  o.gpu_memory = std::move(gpu_memory);
  o.fused_flags = fused_flags;
  o.adaptive_split = adaptive_split;
  return o;
}

MoeShape moe_shape(uint64_t tokens, uint64_t hidden, uint64_t out_hidden, uint32_t experts, uint32_t top_k,
                   uint32_t recv_tokens_per_source, uint64_t expert_rows_capacity, bool apply_scores, bool fused) {
  MoeShape m;
  m.tokens = tokens;
  m.hidden = hidden;
  m.out_hidden = out_hidden;
  m.experts = experts;
  m.top_k = top_k;
  m.recv_tokens_per_source = recv_tokens_per_source;
  m.expert_rows_capacity = expert_rows_capacity;
  m.apply_scores = apply_scores;
  m.fused = fused;
  return m;
}

// "swiglu", "geglu", "silu", "gelu" or "relu" (rt::MoeActivation).
rt::MoeActivation moe_activation(const std::string& name) {
  static const char* const names[] = {"swiglu", "geglu", "silu", "gelu", "relu"};
  for (int i = 0; i < 5; ++i)
    if (name == names[i]) return static_cast<rt::MoeActivation>(i);
  throw ArgumentError{"activation: '" + name + "'; expected 'swiglu', 'geglu', 'silu', 'gelu' or 'relu'"};
}

rt::MoeConfig moe_config(uint32_t recv_tokens_per_source, uint64_t expert_rows_capacity) {
  rt::MoeConfig c;
  c.recv_tokens_per_source = recv_tokens_per_source;
  c.expert_rows_capacity = expert_rows_capacity;
  return c;
}

// placement: "non_causal", "causal_zigzag" or "causal_contiguous" (rt::RingPlacement).
rt::RingAttentionShape ring_shape(uint64_t batch, uint64_t heads_q, uint64_t heads_kv, uint64_t s_local,
                                  uint64_t head_dim, const std::string& layout, const std::string& placement,
                                  float scale) {
  rt::RingAttentionShape s;
  s.batch = batch;
  s.heads_q = heads_q;
  s.heads_kv = heads_kv;
  s.s_local = s_local;
  s.head_dim = head_dim;
  if (layout == "bhsd") {
    s.layout = rt::AttentionLayout::kBHSD;
  } else if (layout == "bshd") {
    s.layout = rt::AttentionLayout::kBSHD;
  } else {
    throw ArgumentError{"layout: '" + layout + "'; expected 'bhsd' or 'bshd'"};
  }
  if (placement == "non_causal") {
    s.placement = rt::RingPlacement::kNonCausal;
  } else if (placement == "causal_zigzag") {
    s.placement = rt::RingPlacement::kCausalZigzag;
  } else if (placement == "causal_contiguous") {
    s.placement = rt::RingPlacement::kCausalContiguous;
  } else {
    throw ArgumentError{"placement: '" + placement + "'; expected 'non_causal', 'causal_zigzag' or 'causal_contiguous'"};
  }
  s.scale = scale;
  return s;
}

}  // namespace
}  // namespace mkernel::python

NB_MODULE(_C, m) {
  using namespace mkernel::python;
  namespace rt = mkernel::rt;
  m.doc() = "mkernel's fused multi-GPU ops on DLPack arrays (no torch dependency; see mkernel.ops for torch)";
  // The package keeps communicators in a registry until exit (and closes them from atexit);
  // nanobind's report of instances alive at teardown would only be noise about those.
  nb::set_leak_warnings(false);
  nb::register_exception_translator(&translate);

  m.def("all_gather_gemm_nvlink_bytes", &rt::all_gather_gemm_nvlink_bytes, "world"_a, "m_local"_a, "k"_a,
        "NVLink workspace bytes (Communicator nvlink_bytes) an AllGather+GEMM of this size needs.");
  m.def("all_gather_gemm_network_bytes", &rt::all_gather_gemm_network_bytes, "nodes"_a, "m_local"_a, "k"_a,
        "Network workspace bytes an AllGather+GEMM of this size needs between nodes (0 on one node).");
  m.def("gemm_reduce_scatter_nvlink_bytes", &rt::gemm_reduce_scatter_nvlink_bytes, "nodes"_a, "gpus"_a, "m_local"_a,
        "n"_a,
        "NVLink workspace bytes a GEMM+ReduceScatter of this size needs (0 with one GPU per node; for either tile "
        "width).");
  m.def("gemm_reduce_scatter_network_bytes", &rt::gemm_reduce_scatter_network_bytes, "nodes"_a, "m_local"_a, "n"_a,
        "Network workspace bytes a GEMM+ReduceScatter of this size needs between nodes (0 on one node).");
  m.def("gemm_reduce_scatter_fused_flags", &rt::gemm_reduce_scatter_fused_flags, "nodes"_a, "gpus"_a, "m_local"_a,
        "n"_a, "Fused-op flags (Options::fused_flags) a GEMM+ReduceScatter of this size needs, for either tile width.");
  m.def("gemm_all_reduce_nvlink_bytes", &rt::gemm_all_reduce_nvlink_bytes, "nodes"_a, "gpus"_a, "m"_a, "n"_a,
        "NVLink workspace bytes a GEMM+AllReduce of m (all) rows x n needs (0 with one GPU per node; for either "
        "tile width).");
  m.def("gemm_all_reduce_network_bytes", &rt::gemm_all_reduce_network_bytes, "nodes"_a, "m"_a, "n"_a,
        "Network workspace bytes a GEMM+AllReduce of this size needs between nodes (0 on one node).");
  m.def("gemm_all_reduce_fused_flags", &rt::gemm_all_reduce_fused_flags, "nodes"_a, "gpus"_a, "m"_a, "n"_a,
        "Fused-op flags (Options::fused_flags) a GEMM+AllReduce of this size needs, for either tile width.");
  m.def(
      "moe_nvlink_bytes",
      [](uint32_t nodes, uint32_t gpus, uint64_t tokens, uint64_t hidden, uint64_t out_hidden, uint32_t experts,
         uint32_t top_k, uint32_t recv_tokens_per_source, uint64_t expert_rows_capacity) {
        return rt::moe_nvlink_bytes(nodes, gpus, tokens, hidden, out_hidden, experts, top_k,
                                    moe_config(recv_tokens_per_source, expert_rows_capacity));
      },
      "nodes"_a, "gpus"_a, "tokens"_a, "hidden"_a, "out_hidden"_a, "experts"_a, "top_k"_a,
      "recv_tokens_per_source"_a = 0, "expert_rows_capacity"_a = 0,
      "NVLink workspace bytes an MoE dispatch/combine (or fused forward) of this size needs.");
  m.def(
      "moe_network_bytes",
      [](uint32_t nodes, uint32_t gpus, uint64_t tokens, uint64_t hidden, uint64_t out_hidden, uint32_t experts,
         uint32_t top_k, uint32_t recv_tokens_per_source, uint64_t expert_rows_capacity) {
        return rt::moe_network_bytes(nodes, gpus, tokens, hidden, out_hidden, experts, top_k,
                                     moe_config(recv_tokens_per_source, expert_rows_capacity));
      },
      "nodes"_a, "gpus"_a, "tokens"_a, "hidden"_a, "out_hidden"_a, "experts"_a, "top_k"_a,
      "recv_tokens_per_source"_a = 0, "expert_rows_capacity"_a = 0,
      "Network workspace bytes the same MoE needs between nodes (0 on one node).");
  m.def(
      "moe_fused_flags",
      [](uint32_t nodes, uint32_t gpus, uint64_t tokens, uint32_t experts, uint32_t top_k,
         uint32_t recv_tokens_per_source, uint64_t expert_rows_capacity) {
        return rt::moe_fused_flags(nodes, gpus, tokens, experts, top_k,
                                   moe_config(recv_tokens_per_source, expert_rows_capacity));
      },
      "nodes"_a, "gpus"_a, "tokens"_a, "experts"_a, "top_k"_a, "recv_tokens_per_source"_a = 0,
      "expert_rows_capacity"_a = 0, "Fused-op flags (Options::fused_flags) the same MoE needs.");
  m.def(
      "ring_attention_nvlink_bytes",
      [](uint32_t nodes, uint32_t gpus, uint64_t batch, uint64_t heads_q, uint64_t heads_kv, uint64_t s_local,
         uint64_t head_dim, uint32_t slots) {
        return rt::ring_attention_nvlink_bytes(
            nodes, gpus, ring_shape(batch, heads_q, heads_kv, s_local, head_dim, "bhsd", "non_causal", 0.0f), slots);
      },
      "nodes"_a, "gpus"_a, "batch"_a, "heads_q"_a, "heads_kv"_a, "s_local"_a, "head_dim"_a, "slots"_a = 0,
      "NVLink workspace bytes a ring attention of this shape needs (its K/V slots; 0 on one rank).");
  m.def(
      "ring_attention_network_bytes",
      [](uint32_t nodes, uint64_t batch, uint64_t heads_kv, uint64_t s_local, uint64_t head_dim) {
        return rt::ring_attention_network_bytes(
            nodes, ring_shape(batch, heads_kv, heads_kv, s_local, head_dim, "bhsd", "non_causal", 0.0f));
      },
      "nodes"_a, "batch"_a, "heads_kv"_a, "s_local"_a, "head_dim"_a,
      "Network workspace bytes the same ring needs between nodes (0 on one node).");
  m.def("ring_attention_fused_flags", &rt::ring_attention_fused_flags, "nodes"_a, "gpus"_a,
        "Fused-op flags (Options::fused_flags) a ring attention on nodes x gpus ranks needs.");
  m.def(
      "zigzag_permutation",
      [](uint64_t seq, uint32_t world) {
        auto perm = rt::zigzag_permutation(seq, world);
        if (!perm.ok()) throw_status(perm.status());
        return perm.value();
      },
      "seq"_a, "world"_a, "Zigzag placement: perm[placed] = the original position (libmkernel's rule).");
  m.def("default_fused_flags", [] { return rt::Options{}.fused_flags; },
        "libmkernel's default Options::fused_flags.");

  m.def(
      "check_all_gather_gemm",
      [](const nb::ndarray<>& a, const nb::ndarray<>& w, const nb::ndarray<>& out,
         const std::optional<nb::ndarray<>>& gathered_out, uint32_t world) {
        (void)check_all_gather_gemm(a, w, out, gathered_out, world);
      },
      "a"_a, "w"_a, "out"_a, "gathered_out"_a.none(), "world"_a,
      "Refuses (ArgumentError) arrays an AllGather+GEMM launch would not take; needs no GPU.");
  m.def(
      "check_gemm_reduce_scatter",
      [](const nb::ndarray<>& a, const nb::ndarray<>& w, const nb::ndarray<>& out, uint32_t world) {
        (void)check_gemm_reduce_scatter(a, w, out, world);
      },
      "a"_a, "w"_a, "out"_a, "world"_a,
      "Refuses (ArgumentError) arrays a GEMM+ReduceScatter launch would not take; needs no GPU.");
  m.def(
      "check_gemm_all_reduce",
      [](const nb::ndarray<>& a, const nb::ndarray<>& w, const nb::ndarray<>& out) {
        (void)check_gemm_all_reduce(a, w, out);
      },
      "a"_a, "w"_a, "out"_a, "Refuses (ArgumentError) arrays a GEMM+AllReduce launch would not take; needs no GPU.");

  m.def(
      "check_moe_dispatch",
      [](const nb::ndarray<>& x, const nb::ndarray<>& topk_ids, const nb::ndarray<>& topk_weights,
         const nb::ndarray<>& x_expert, const nb::ndarray<>& expert_offsets,
         const std::optional<nb::ndarray<>>& row_source, const std::optional<nb::ndarray<>>& row_token,
         const std::optional<nb::ndarray<>>& row_score) {
        (void)check_moe_dispatch(x, topk_ids, topk_weights, x_expert, expert_offsets, row_source, row_token,
                                 row_score);
      },
      "x"_a, "topk_ids"_a, "topk_weights"_a, "x_expert"_a, "expert_offsets"_a, "row_source"_a.none(),
      "row_token"_a.none(), "row_score"_a.none(),
      "Refuses (ArgumentError) arrays an MoE dispatch would not take; needs no GPU.");
  m.def(
      "check_moe_combine",
      [](const nb::ndarray<>& y_expert, const nb::ndarray<>& out) { (void)check_moe_combine(y_expert, out); },
      "y_expert"_a, "out"_a, "Refuses (ArgumentError) arrays an MoE combine would not take; needs no GPU.");
  m.def(
      "check_moe_forward",
      [](const nb::ndarray<>& x, const nb::ndarray<>& topk_ids, const nb::ndarray<>& topk_weights,
         const nb::ndarray<>& w, const nb::ndarray<>& out) {
        (void)check_moe_forward(x, topk_ids, topk_weights, w, out);
      },
      "x"_a, "topk_ids"_a, "topk_weights"_a, "w"_a, "out"_a,
      "Refuses (ArgumentError) arrays a fused MoE forward would not take; needs no GPU.");
  m.def(
      "check_moe_mlp",
      [](const nb::ndarray<>& x, const nb::ndarray<>& topk_ids, const nb::ndarray<>& topk_weights,
         const nb::ndarray<>& w1, const nb::ndarray<>& w2, const nb::ndarray<>& out, const std::string& activation) {
        const rt::MoeActivation a = moe_activation(activation);
        (void)check_moe_mlp(x, topk_ids, topk_weights, w1, w2, out,
                            a == rt::MoeActivation::kSwiGlu || a == rt::MoeActivation::kGeGlu);
      },
      "x"_a, "topk_ids"_a, "topk_weights"_a, "w1"_a, "w2"_a, "out"_a, "activation"_a = "swiglu",
      "Refuses (ArgumentError) arrays or an activation an MoE MLP would not take; needs no GPU.");
  m.def(
      "check_ring_attention",
      [](const nb::ndarray<>& q, const nb::ndarray<>& k, const nb::ndarray<>& v, const nb::ndarray<>& out,
         const nb::ndarray<>& lse, const std::string& layout) { (void)check_ring_attention(q, k, v, out, lse, layout); },
      "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a, "layout"_a = "bhsd",
      "Refuses (ArgumentError) arrays a ring attention launch would not take; needs no GPU.");

  m.def(
      "get_unique_id",
      [](std::string socket_path, int device) {
        CommOptions o;
        o.socket_path = std::move(socket_path);
        o.device = device;
        nb::gil_scoped_release unlocked;
        return get_unique_id(o);
      },
      "socket_path"_a = "", "device"_a = -1,
      "Rank 0's bootstrap handle (text; it carries the communicator's secret).");

  nb::class_<PyCommunicator>(m, "Communicator", "One rank of a libmkernel communicator and its plans.")
      .def_static(
          "create",
          [](uint32_t rank, uint32_t size, const std::string& unique_id, int device, uint64_t nvlink_bytes,
             uint64_t network_workspace_bytes, std::vector<uint64_t> buffer_bytes, std::string socket_path,
             uint32_t rendezvous_timeout_ms, uint64_t device_wait_timeout_ms, std::string gpu_memory,
             uint32_t fused_flags, bool adaptive_split) {
            const CommOptions o = options_from(device, nvlink_bytes, network_workspace_bytes, std::move(buffer_bytes),
                                               std::move(socket_path), rendezvous_timeout_ms, device_wait_timeout_ms,
                                               std::move(gpu_memory), fused_flags, adaptive_split);
            nb::gil_scoped_release unlocked;
            return PyCommunicator::create(rank, size, unique_id, o);
          },
          "rank"_a, "size"_a, "unique_id"_a, nb::kw_only(), "device"_a = -1, "nvlink_bytes"_a = 0,
          "network_workspace_bytes"_a = 0, "buffer_bytes"_a = std::vector<uint64_t>{4096}, "socket_path"_a = "",
          "rendezvous_timeout_ms"_a = 60000, "device_wait_timeout_ms"_a = 2000, "gpu_memory"_a = "auto",
          "fused_flags"_a = 0, "adaptive_split"_a = false, "Joins `size` ranks with rank 0's unique id (collective; bounded by rendezvous_timeout_ms).")
      .def_static(
          "create_from_env",
          [](int device, uint64_t nvlink_bytes, uint64_t network_workspace_bytes, std::vector<uint64_t> buffer_bytes,
             std::string socket_path, uint32_t rendezvous_timeout_ms, uint64_t device_wait_timeout_ms,
             std::string gpu_memory, uint32_t fused_flags, bool adaptive_split) {
            const CommOptions o = options_from(device, nvlink_bytes, network_workspace_bytes, std::move(buffer_bytes),
                                               std::move(socket_path), rendezvous_timeout_ms, device_wait_timeout_ms,
                                               std::move(gpu_memory), fused_flags, adaptive_split);
            nb::gil_scoped_release unlocked;
            return PyCommunicator::create_from_env(o);
          },
          nb::kw_only(), "device"_a = -1, "nvlink_bytes"_a = 0, "network_workspace_bytes"_a = 0,
          "buffer_bytes"_a = std::vector<uint64_t>{4096}, "socket_path"_a = "", "rendezvous_timeout_ms"_a = 60000,
          "device_wait_timeout_ms"_a = 2000, "gpu_memory"_a = "auto", "fused_flags"_a = 0, "adaptive_split"_a = false,
          "Joins the ranks the launcher's environment names (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, "
          "MASTER_PORT, MKERNEL_TOKEN, MKERNEL_PEER_PORT).")
      .def(
          "plan",
          [](PyCommunicator& c, uint64_t m_local, uint64_t n_local, uint64_t k, uintptr_t stream) {
            nb::gil_scoped_release unlocked;
            c.plan(m_local, n_local, k, stream);
          },
          "m_local"_a, "n_local"_a, "k"_a, "stream"_a = 0,
          "Plans an AllGather+GEMM shape now (collective: every rank with the same shape).")
      .def("has_plan", &PyCommunicator::has_plan, "m_local"_a, "n_local"_a, "k"_a)
      .def("describe", &PyCommunicator::describe, "m_local"_a, "n_local"_a, "k"_a)
      .def(
          "all_gather_gemm",
          [](PyCommunicator& c, const nb::ndarray<>& a, const nb::ndarray<>& w, const nb::ndarray<>& out,
             const std::optional<nb::ndarray<>>& gathered_out, uintptr_t stream) {
            const AllGatherGemmArgs args = check_all_gather_gemm(a, w, out, gathered_out, c.size());
            // Launches do not block, except a shape's first call, which plans it (collectively).
            nb::gil_scoped_release unlocked;
            c.all_gather_gemm(args, stream);
          },
          "a"_a, "w"_a, "out"_a, "gathered_out"_a.none(), "stream"_a,
          "out = AllGather(a) @ w^T on `stream`; gathered_out (or None) gets AllGather(a).")
      .def(
          "plan_reduce_scatter",
          [](PyCommunicator& c, uint64_t m_local, uint64_t n, uint64_t k, uintptr_t stream) {
            nb::gil_scoped_release unlocked;
            c.plan_reduce_scatter(m_local, n, k, stream);
          },
          "m_local"_a, "n"_a, "k"_a, "stream"_a = 0,
          "Plans a GEMM+ReduceScatter shape now (collective: every rank with the same shape).")
      .def("has_reduce_scatter_plan", &PyCommunicator::has_reduce_scatter_plan, "m_local"_a, "n"_a, "k"_a)
      .def("describe_reduce_scatter", &PyCommunicator::describe_reduce_scatter, "m_local"_a, "n"_a, "k"_a)
      .def(
          "gemm_reduce_scatter",
          [](PyCommunicator& c, const nb::ndarray<>& a, const nb::ndarray<>& w, const nb::ndarray<>& out,
             uintptr_t stream) {
            const GemmReduceScatterArgs args = check_gemm_reduce_scatter(a, w, out, c.size());
            nb::gil_scoped_release unlocked;
            c.gemm_reduce_scatter(args, stream);
          },
          "a"_a, "w"_a, "out"_a, "stream"_a,
          "out = rows rank * M / world ... of sum over ranks of a @ w^T, on `stream`.")
      .def(
          "plan_all_reduce",
          [](PyCommunicator& c, uint64_t rows, uint64_t n, uint64_t k, uintptr_t stream) {
            nb::gil_scoped_release unlocked;
            c.plan_all_reduce(rows, n, k, stream);
          },
          "m"_a, "n"_a, "k"_a, "stream"_a = 0,
          "Plans a GEMM+AllReduce shape now (collective: every rank with the same shape).")
      .def("has_all_reduce_plan", &PyCommunicator::has_all_reduce_plan, "m"_a, "n"_a, "k"_a)
      .def("describe_all_reduce", &PyCommunicator::describe_all_reduce, "m"_a, "n"_a, "k"_a)
      .def(
          "gemm_all_reduce",
          [](PyCommunicator& c, const nb::ndarray<>& a, const nb::ndarray<>& w, const nb::ndarray<>& out,
             uintptr_t stream) {
            const GemmAllReduceArgs args = check_gemm_all_reduce(a, w, out);
            nb::gil_scoped_release unlocked;
            c.gemm_all_reduce(args, stream);
          },
          "a"_a, "w"_a, "out"_a, "stream"_a, "out = sum over ranks of a @ w^T (the same bits on every rank), on `stream`.")
      .def(
          "plan_moe",
          [](PyCommunicator& c, uint64_t tokens, uint64_t hidden, uint64_t out_hidden, uint32_t experts, uint32_t top_k,
             uint32_t recv_tokens_per_source, uint64_t expert_rows_capacity, bool apply_scores, bool fused,
             uintptr_t stream) {
            const MoeShape s = moe_shape(tokens, hidden, out_hidden, experts, top_k, recv_tokens_per_source,
                                         expert_rows_capacity, apply_scores, fused);
            nb::gil_scoped_release unlocked;
            c.plan_moe(s, stream);
          },
          "tokens"_a, "hidden"_a, "out_hidden"_a, "experts"_a, "top_k"_a, "recv_tokens_per_source"_a = 0,
          "expert_rows_capacity"_a = 0, "apply_scores"_a = true, "fused"_a = false, "stream"_a = 0,
          "Plans an MoE shape now (collective: every rank with the same shape).")
      .def(
          "has_moe_plan",
          [](PyCommunicator& c, uint64_t tokens, uint64_t hidden, uint64_t out_hidden, uint32_t experts, uint32_t top_k,
             uint32_t recv_tokens_per_source, uint64_t expert_rows_capacity, bool apply_scores, bool fused) {
            return c.has_moe_plan(moe_shape(tokens, hidden, out_hidden, experts, top_k, recv_tokens_per_source,
                                            expert_rows_capacity, apply_scores, fused));
          },
          "tokens"_a, "hidden"_a, "out_hidden"_a, "experts"_a, "top_k"_a, "recv_tokens_per_source"_a = 0,
          "expert_rows_capacity"_a = 0, "apply_scores"_a = true, "fused"_a = false)
      .def(
          "describe_moe",
          [](PyCommunicator& c, uint64_t tokens, uint64_t hidden, uint64_t out_hidden, uint32_t experts, uint32_t top_k,
             uint32_t recv_tokens_per_source, uint64_t expert_rows_capacity, bool apply_scores, bool fused) {
            return c.describe_moe(moe_shape(tokens, hidden, out_hidden, experts, top_k, recv_tokens_per_source,
                                            expert_rows_capacity, apply_scores, fused));
          },
          "tokens"_a, "hidden"_a, "out_hidden"_a, "experts"_a, "top_k"_a, "recv_tokens_per_source"_a = 0,
          "expert_rows_capacity"_a = 0, "apply_scores"_a = true, "fused"_a = false)
      .def(
          "moe_dispatch",
          [](PyCommunicator& c, const nb::ndarray<>& x, const nb::ndarray<>& topk_ids, const nb::ndarray<>& topk_weights,
             const nb::ndarray<>& x_expert, const nb::ndarray<>& expert_offsets,
             const std::optional<nb::ndarray<>>& row_source, const std::optional<nb::ndarray<>>& row_token,
             const std::optional<nb::ndarray<>>& row_score, uintptr_t stream, uint32_t experts, uint64_t out_hidden,
             uint32_t recv_tokens_per_source, uint64_t expert_rows_capacity, bool apply_scores) {
            const MoeDispatchArgs args = check_moe_dispatch(x, topk_ids, topk_weights, x_expert, expert_offsets,
                                                            row_source, row_token, row_score);
            const MoeShape s =
                moe_shape(args.x.shape[0], args.x.shape[1], out_hidden ? out_hidden : args.x.shape[1], experts,
                          static_cast<uint32_t>(args.choices.shape[1]), recv_tokens_per_source, expert_rows_capacity,
                          apply_scores, false);
            nb::gil_scoped_release unlocked;
            c.moe_dispatch(args, s, stream);
          },
          "x"_a, "topk_ids"_a, "topk_weights"_a, "x_expert"_a, "expert_offsets"_a, "row_source"_a.none(),
          "row_token"_a.none(), "row_score"_a.none(), "stream"_a, nb::kw_only(), "experts"_a, "out_hidden"_a = 0,
          "recv_tokens_per_source"_a = 0, "expert_rows_capacity"_a = 0, "apply_scores"_a = true,
          "Sends each token to the ranks of its experts; x_expert gets this rank's experts' rows, expert by expert.")
      .def(
          "moe_combine",
          [](PyCommunicator& c, const nb::ndarray<>& y_expert, const nb::ndarray<>& out, uintptr_t stream) {
            const MoeCombineArgs args = check_moe_combine(y_expert, out);
            nb::gil_scoped_release unlocked;
            c.moe_combine(args, stream);
          },
          "y_expert"_a, "out"_a, "stream"_a,
          "Returns the expert outputs of the last moe_dispatch's rows to their tokens, score-weighted and summed.")
      .def(
          "moe_forward",
          [](PyCommunicator& c, const nb::ndarray<>& x, const nb::ndarray<>& topk_ids, const nb::ndarray<>& topk_weights,
             const nb::ndarray<>& w, const nb::ndarray<>& out, uintptr_t stream, uint32_t recv_tokens_per_source,
             uint64_t expert_rows_capacity, bool apply_scores) {
            const MoeForwardArgs args = check_moe_forward(x, topk_ids, topk_weights, w, out);
            const uint64_t experts = args.w.shape[0] * uint64_t{c.size()};
            if (experts > 0xFFFFFFFFu)
              throw ArgumentError{"w: " + std::to_string(args.w.shape[0]) + " experts per rank; expected fewer"};
            const MoeShape s = moe_shape(args.x.shape[0], args.x.shape[1], args.w.shape[1],
                                         static_cast<uint32_t>(experts), static_cast<uint32_t>(args.choices.shape[1]),
                                         recv_tokens_per_source, expert_rows_capacity, apply_scores, true);
            nb::gil_scoped_release unlocked;
            c.moe_forward(args, s, stream);
          },
          "x"_a, "topk_ids"_a, "topk_weights"_a, "w"_a, "out"_a, "stream"_a, nb::kw_only(),
          "recv_tokens_per_source"_a = 0, "expert_rows_capacity"_a = 0, "apply_scores"_a = true,
          "Dispatch, one GEMM per local expert (w [experts_per_rank, out_hidden, hidden]) and combine in one launch.")
      .def(
          "moe_mlp",
          [](PyCommunicator& c, const nb::ndarray<>& x, const nb::ndarray<>& topk_ids, const nb::ndarray<>& topk_weights,
             const nb::ndarray<>& w1, const nb::ndarray<>& w2, const nb::ndarray<>& out, uintptr_t stream,
             const std::string& activation, uint32_t recv_tokens_per_source, uint64_t expert_rows_capacity,
             bool apply_scores) {
            const rt::MoeActivation act = moe_activation(activation);
            const MoeMlpArgs args = check_moe_mlp(x, topk_ids, topk_weights, w1, w2, out,
                                                  act == rt::MoeActivation::kSwiGlu || act == rt::MoeActivation::kGeGlu);
            const uint64_t experts = args.w2.shape[0] * uint64_t{c.size()};
            if (experts > 0xFFFFFFFFu)
              throw ArgumentError{"w2: " + std::to_string(args.w2.shape[0]) + " experts per rank; expected fewer"};
            const MoeShape s = moe_shape(args.x.shape[0], args.x.shape[1], args.x.shape[1],
                                         static_cast<uint32_t>(experts), static_cast<uint32_t>(args.choices.shape[1]),
                                         recv_tokens_per_source, expert_rows_capacity, apply_scores, false);
            nb::gil_scoped_release unlocked;
            c.moe_mlp(args, s, act, stream);
          },
          "x"_a, "topk_ids"_a, "topk_weights"_a, "w1"_a, "w2"_a, "out"_a, "stream"_a, nb::kw_only(),
          "activation"_a = "swiglu", "recv_tokens_per_source"_a = 0, "expert_rows_capacity"_a = 0,
          "apply_scores"_a = true,
          "The expert MLP layer: dispatch, w1 (gate and up), the activation, w2, combine (five launches).")
      .def(
          "plan_ring_attention",
          [](PyCommunicator& c, uint64_t batch, uint64_t heads_q, uint64_t heads_kv, uint64_t s_local,
             uint64_t head_dim, const std::string& layout, const std::string& placement, float scale,
             uintptr_t stream) {
            const rt::RingAttentionShape s =
                ring_shape(batch, heads_q, heads_kv, s_local, head_dim, layout, placement, scale);
            nb::gil_scoped_release unlocked;
            c.plan_ring_attention(s, stream);
          },
          "batch"_a, "heads_q"_a, "heads_kv"_a, "s_local"_a, "head_dim"_a, "layout"_a = "bhsd",
          "placement"_a = "non_causal", "scale"_a = 0.0f, "stream"_a = 0,
          "Plans a ring attention shape now (collective: every rank with the same shape).")
      .def(
          "has_ring_attention_plan",
          [](PyCommunicator& c, uint64_t batch, uint64_t heads_q, uint64_t heads_kv, uint64_t s_local,
             uint64_t head_dim, const std::string& layout, const std::string& placement, float scale) {
            return c.has_ring_attention_plan(
                ring_shape(batch, heads_q, heads_kv, s_local, head_dim, layout, placement, scale));
          },
          "batch"_a, "heads_q"_a, "heads_kv"_a, "s_local"_a, "head_dim"_a, "layout"_a = "bhsd",
          "placement"_a = "non_causal", "scale"_a = 0.0f)
      .def(
          "describe_ring_attention",
          [](PyCommunicator& c, uint64_t batch, uint64_t heads_q, uint64_t heads_kv, uint64_t s_local,
             uint64_t head_dim, const std::string& layout, const std::string& placement, float scale) {
            return c.describe_ring_attention(
                ring_shape(batch, heads_q, heads_kv, s_local, head_dim, layout, placement, scale));
          },
          "batch"_a, "heads_q"_a, "heads_kv"_a, "s_local"_a, "head_dim"_a, "layout"_a = "bhsd",
          "placement"_a = "non_causal", "scale"_a = 0.0f)
      .def(
          "ring_attention",
          [](PyCommunicator& c, const nb::ndarray<>& q, const nb::ndarray<>& k, const nb::ndarray<>& v,
             const nb::ndarray<>& out, const nb::ndarray<>& lse, uintptr_t stream, const std::string& layout,
             const std::string& placement, float scale) {
            const RingAttentionArgs args = check_ring_attention(q, k, v, out, lse, layout);
            const rt::RingAttentionShape s = ring_shape(args.batch, args.heads_q, args.heads_kv, args.s_local,
                                                        args.head_dim, layout, placement, scale);
            nb::gil_scoped_release unlocked;
            c.ring_attention(args, s, stream);
          },
          "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a, "stream"_a, nb::kw_only(), "layout"_a = "bhsd",
          "placement"_a = "non_causal", "scale"_a = 0.0f,
          "out, lse = attention of this rank's queries over every rank's keys and values, on `stream`.")
      .def("check", &PyCommunicator::check, "Raises the communicator's first failure on the GPU, if any.")
      .def(
          "split_report",
          [](PyCommunicator& c) {
            nb::gil_scoped_release unlocked;
            return c.split_report();
          },
          "Every plan's adaptive split, a line each (empty without adaptive_split); reads device memory.")
      .def(
          "close",
          [](PyCommunicator& c) {
            nb::gil_scoped_release unlocked;
            c.close();
          },
          "Frees the plans and the communicator (says goodbye to the daemon).")
      .def_prop_ro("closed", &PyCommunicator::closed)
      .def_prop_ro("rank", &PyCommunicator::rank)
      .def_prop_ro("size", &PyCommunicator::size)
      .def_prop_ro("device", &PyCommunicator::device)
      .def_prop_ro("nodes", &PyCommunicator::nodes)
      .def_prop_ro("nvlink_bytes", &PyCommunicator::nvlink_bytes)
      .def_prop_ro("network_workspace_bytes", &PyCommunicator::network_workspace_bytes)
      .def_prop_ro("fused_flags", &PyCommunicator::fused_flags)
      .def_prop_ro("staging", &PyCommunicator::staging)
      .def_prop_ro("staging_reason", &PyCommunicator::staging_reason)
      .def_prop_ro("transport", &PyCommunicator::transport);
}
