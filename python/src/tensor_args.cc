// tensor_args.cc: the layout checks of tensor_args.h.
#include "tensor_args.h"

#include <cstdint>
#include <cstdio>
#include <string>

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

void expect_shape(const Matrix& m, const char* name, uint64_t rows, uint64_t cols, const std::string& why) {
  if (m.rows != rows || m.cols != cols)
    refuse(std::string(name) + ": shape (" + std::to_string(m.rows) + ", " + std::to_string(m.cols) + "); expected (" +
           std::to_string(rows) + ", " + std::to_string(cols) + ") " + why);
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
  const struct {
    const char* name;
    int device;
  } devices[] = {{"w", r.w.device}, {"out", r.c.device}, {"gathered_out", r.gathered ? r.gathered->device : r.a.device}};
  for (const auto& d : devices)
    if (d.device != r.a.device)
      refuse(std::string(d.name) + ": on CUDA device " + std::to_string(d.device) + "; expected a's device " +
             std::to_string(r.a.device));
  return r;
}

}  // namespace mkernel::python
