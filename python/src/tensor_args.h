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
//     rank's) the runtime refuses itself, with its own message.
#pragma once

#include <nanobind/ndarray.h>

#include <cstdint>
#include <optional>
#include <string>

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

// Throws ArgumentError (module.cc translates it) naming the first argument that does not fit.
AllGatherGemmArgs check_all_gather_gemm(const nanobind::ndarray<>& a, const nanobind::ndarray<>& w,
                                        const nanobind::ndarray<>& c,
                                        const std::optional<nanobind::ndarray<>>& gathered, uint32_t world);

// A refused argument: the message names it (module.cc raises mkernel.ArgumentError).
struct ArgumentError {
  std::string message;
};

}  // namespace mkernel::python
