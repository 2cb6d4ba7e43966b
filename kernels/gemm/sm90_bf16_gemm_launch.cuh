// sm90_bf16_gemm_launch.cuh: host-side launch of one instantiation of the GEMM kernel template.
// The library instantiates it for NoRole (sm90_bf16_gemm_n*.cu); a fused kernel includes this
// header and instantiates it with its own role.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <type_traits>

#include "gemm/sm90_bf16_gemm.cuh"
#include "gemm/sm90_bf16_gemm.h"

namespace mkernel::kernels {

namespace detail {

inline GemmResult cuda_failure(const char* what, cudaError_t e) {
  return GemmResult{GemmError::kCudaError,
                    std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")"};
}

}  // namespace detail

template <class T, class Role>
GemmResult launch_sm90_bf16_gemm(const GemmPlan& plan, cudaStream_t stream) {
  auto* kernel = &sm90_bf16_gemm_kernel<T, Role>;
  // The shared-memory opt-in is per function and per device: set once per device (a bit per
  // device in `attributes_set`), since small problems feel every microsecond of host time.
  static std::atomic<uint64_t> attributes_set{0};
  int device = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return detail::cuda_failure("cudaGetDevice", e);
  const uint64_t bit = device < 64 ? (uint64_t{1} << device) : 0;
  if (bit == 0 || (attributes_set.load(std::memory_order_acquire) & bit) == 0) {
    e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(T::kSmemBytes));
    if (e != cudaSuccess) return detail::cuda_failure("cudaFuncSetAttribute(smem)", e);
    if constexpr (T::kClusterSize > 1) {
      e = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 0);
      if (e != cudaSuccess) return detail::cuda_failure("cudaFuncSetAttribute(cluster)", e);
    }
    attributes_set.fetch_or(bit, std::memory_order_release);
  }
  const int num_blocks = plan.config.num_gemm_blocks + plan.config.num_role_blocks;
  if (num_blocks % T::kClusterSize != 0) {
    return GemmResult{GemmError::kInvalidConfig,
                      "block count " + std::to_string(num_blocks) +
                          " is not a multiple of the cluster size " + std::to_string(T::kClusterSize)};
  }
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(num_blocks), 1, 1);
  cfg.blockDim = dim3(T::kThreads, 1, 1);
  cfg.dynamicSmemBytes = T::kSmemBytes;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  unsigned num_attrs = 0;
  if constexpr (T::kClusterSize > 1) {  // no cluster launch for single-CTA "clusters"
    attr[num_attrs].id = cudaLaunchAttributeClusterDimension;
    attr[num_attrs].val.clusterDim.x = T::kClusterSize;
    attr[num_attrs].val.clusterDim.y = 1;
    attr[num_attrs].val.clusterDim.z = 1;
    ++num_attrs;
  }
  // Programmatic dependent launch for plain GEMMs: the kernel waits for the previous one
  // (griddep_wait) before its first global access, so its launch and prologue may overlap that
  // kernel's end. Fused roles that ask for it (Role::kProgrammaticLaunch) wait first thing, so
  // only their launch overlaps (the fused ops' begin_launch kernel). Not for grouped GEMMs.
  if constexpr ((std::is_same_v<Role, NoRole> || detail::role_programmatic<Role>()) && !T::kGrouped) {
    if (plan.config.programmatic_launch) {
      attr[num_attrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attr[num_attrs].val.programmaticStreamSerializationAllowed = 1;
      ++num_attrs;
    }
  }
  cfg.attrs = attr;
  cfg.numAttrs = num_attrs;
  e = cudaLaunchKernelEx(&cfg, kernel, plan.tma_a, plan.tma_b, plan.tma_d, plan.tma_a_local, plan.params);
  if (e != cudaSuccess) return detail::cuda_failure("cudaLaunchKernelEx(sm90_bf16_gemm)", e);
  return GemmResult{};
}

// Largest number of GEMM blocks that can be resident at once for this instantiation (a multiple
// of the cluster size; clusters must fit inside one GPC, which can leave SMs unused).
template <class T, class Role>
int max_resident_gemm_blocks(int num_sms) {
  if constexpr (T::kClusterSize == 1) {
    return num_sms;
  } else {
    auto* kernel = &sm90_bf16_gemm_kernel<T, Role>;
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(T::kSmemBytes)) != cudaSuccess) {
      return num_sms - num_sms % T::kClusterSize;
    }
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(static_cast<unsigned>(num_sms - num_sms % T::kClusterSize), 1, 1);
    cfg.blockDim = dim3(T::kThreads, 1, 1);
    cfg.dynamicSmemBytes = T::kSmemBytes;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = T::kClusterSize;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) != cudaSuccess || clusters <= 0) {
      return num_sms - num_sms % T::kClusterSize;
    }
    return clusters * T::kClusterSize;
  }
}

}  // namespace mkernel::kernels
