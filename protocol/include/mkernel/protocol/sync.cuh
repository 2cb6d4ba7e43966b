// sync.cuh: the memory-model operations GPU code uses to talk to other agents (the host, the
// daemon's proxy thread, peer GPUs): acquire loads, release stores, fences and the global timer.
//
// Design notes
//  1. One home. The ring's GPU producers (ring_device.cuh), the device contract of the kernels
//     (kernels/common/comm.cuh, wait.cuh) and the GEMM engine all use these wrappers; nothing
//     else writes its own inline asm for them.
//  2. Scopes: `.sys` wherever the other side may be the host or another GPU (flags in mapped
//     host memory, NVLink peers); `.gpu` only for state that stays on this GPU (the ring's claim
//     counter, the launch counter, counters of one launch).
//  3. Plain data: this header compiles under nvcc only for device code; under g++ it is empty,
//     so protocol headers that include it stay host-includable.
#pragma once

#include <cstdint>

namespace mkernel::sync {

#if defined(__CUDACC__)

__device__ __forceinline__ uint64_t globaltimer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// ---- loads ------------------------------------------------------------------------------------

__device__ __forceinline__ uint64_t ld_acquire_sys(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint32_t ld_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint64_t ld_relaxed_sys(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint64_t ld_acquire_gpu(const unsigned long long* p) {
  uint64_t v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint32_t ld_acquire_gpu(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// ---- stores and reductions -------------------------------------------------------------------

__device__ __forceinline__ void st_relaxed_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.relaxed.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void st_relaxed_sys(uint64_t* p, uint64_t v) {
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ void st_release_sys(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ void st_release_gpu(unsigned long long* p, uint64_t v) {
  asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ void red_max_release_gpu(unsigned long long* p, uint64_t v) {
  asm volatile("red.release.gpu.global.max.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
// Raises *p to at least v, visible system-wide (a flag that only grows, written by several).
__device__ __forceinline__ void red_max_release_sys(uint64_t* p, uint64_t v) {
  asm volatile("red.release.sys.global.max.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// Adds v to *p and returns the old value, releasing this thread's earlier writes (and, after a
// block barrier, its block's) and acquiring what the writers before it released, at GPU scope.
__device__ __forceinline__ uint64_t atom_add_acq_rel_gpu(unsigned long long* p, uint64_t v) {
  uint64_t old;
  asm volatile("atom.acq_rel.gpu.global.add.u64 %0, [%1], %2;" : "=l"(old) : "l"(p), "l"(v) : "memory");
  return old;
}

// ---- fences -------------------------------------------------------------------------------------

__device__ __forceinline__ void fence_acq_rel_sys() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }
__device__ __forceinline__ void fence_acq_rel_gpu() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }

// Orders global memory as this thread's generic proxy sees it (e.g. after an acquire of a flag
// that says a peer stored the data) before later async-proxy (TMA) reads of it.
__device__ __forceinline__ void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;" ::: "memory");
}

#endif  // __CUDACC__

}  // namespace mkernel::sync
