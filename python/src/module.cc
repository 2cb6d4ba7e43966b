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
                         uint64_t device_wait_timeout_ms, std::string gpu_memory) {
  CommOptions o;
  o.device = device;
  o.nvlink_bytes = nvlink_bytes;
  o.network_workspace_bytes = network_workspace_bytes;
  o.buffer_bytes = std::move(buffer_bytes);
  o.socket_path = std::move(socket_path);
  o.rendezvous_timeout_ms = rendezvous_timeout_ms;
  o.device_wait_timeout_ms = device_wait_timeout_ms;
  o.gpu_memory = std::move(gpu_memory);
  return o;
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

  m.def(
      "check_all_gather_gemm",
      [](const nb::ndarray<>& a, const nb::ndarray<>& w, const nb::ndarray<>& out,
         const std::optional<nb::ndarray<>>& gathered_out, uint32_t world) {
        (void)check_all_gather_gemm(a, w, out, gathered_out, world);
      },
      "a"_a, "w"_a, "out"_a, "gathered_out"_a.none(), "world"_a,
      "Refuses (ArgumentError) arrays an AllGather+GEMM launch would not take; needs no GPU.");

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
             uint32_t rendezvous_timeout_ms, uint64_t device_wait_timeout_ms, std::string gpu_memory) {
            const CommOptions o = options_from(device, nvlink_bytes, network_workspace_bytes, std::move(buffer_bytes),
                                               std::move(socket_path), rendezvous_timeout_ms, device_wait_timeout_ms,
                                               std::move(gpu_memory));
            nb::gil_scoped_release unlocked;
            return PyCommunicator::create(rank, size, unique_id, o);
          },
          "rank"_a, "size"_a, "unique_id"_a, nb::kw_only(), "device"_a = -1, "nvlink_bytes"_a = 0,
          "network_workspace_bytes"_a = 0, "buffer_bytes"_a = std::vector<uint64_t>{4096}, "socket_path"_a = "",
          "rendezvous_timeout_ms"_a = 60000, "device_wait_timeout_ms"_a = 2000, "gpu_memory"_a = "auto",
          "Joins `size` ranks with rank 0's unique id (collective; bounded by rendezvous_timeout_ms).")
      .def_static(
          "create_from_env",
          [](int device, uint64_t nvlink_bytes, uint64_t network_workspace_bytes, std::vector<uint64_t> buffer_bytes,
             std::string socket_path, uint32_t rendezvous_timeout_ms, uint64_t device_wait_timeout_ms,
             std::string gpu_memory) {
            const CommOptions o = options_from(device, nvlink_bytes, network_workspace_bytes, std::move(buffer_bytes),
                                               std::move(socket_path), rendezvous_timeout_ms, device_wait_timeout_ms,
                                               std::move(gpu_memory));
            nb::gil_scoped_release unlocked;
            return PyCommunicator::create_from_env(o);
          },
          nb::kw_only(), "device"_a = -1, "nvlink_bytes"_a = 0, "network_workspace_bytes"_a = 0,
          "buffer_bytes"_a = std::vector<uint64_t>{4096}, "socket_path"_a = "", "rendezvous_timeout_ms"_a = 60000,
          "device_wait_timeout_ms"_a = 2000, "gpu_memory"_a = "auto",
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
      .def("check", &PyCommunicator::check, "Raises the communicator's first failure on the GPU, if any.")
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
      .def_prop_ro("staging", &PyCommunicator::staging)
      .def_prop_ro("staging_reason", &PyCommunicator::staging_reason)
      .def_prop_ro("transport", &PyCommunicator::transport);
}
