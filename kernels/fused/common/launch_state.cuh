// launch_state.cuh: the bookkeeping every fused op's kernel shares, in DeviceComm::fused_state
// (device memory of the communicator, zero at creation).
//
// Design notes
//  1. One fused op at a time per communicator, in stream order: the ops share the NVLink
//     workspace, so launch L may overwrite a peer's workspace only once that peer finished its
//     previous fused launch. Word kLastFusedLaunch holds the launch number of this rank's last
//     finished fused launch ("prev" in the plans); a peer's "done" flag says the same of the peer.
//  2. The end of a launch is when its last block leaves: every block, GEMM or communication, counts
//     itself out in kExitCount after all its work (Role::block_exit); the block that brings the
//     count to the grid size resets it, records the launch in kLastFusedLaunch and tells the peers
//     (the op's own code: done flags, slot-free signals).
#pragma once

#include <cstdint>

#include "common/comm.cuh"

namespace mkernel::kernels {

inline constexpr uint32_t kLastFusedLaunch = 0;
inline constexpr uint32_t kExitCount = 1;
static_assert(kExitCount < kFusedStateWords);

#if defined(__CUDACC__)

// The launch number of this rank's previous fused launch (0 before the first).
__device__ __forceinline__ uint64_t previous_fused_launch(const DeviceComm& c) {
  return sync::ld_acquire_gpu(&c.fused_state[kLastFusedLaunch]);
}

// Thread 0 of every block, once, after all the block's work: true for the last block of the
// launch, which then owns the end-of-launch actions (note 2).
__device__ __forceinline__ bool count_block_exit(const DeviceComm& c) {
  __threadfence();
  const unsigned long long before = atomicAdd(&c.fused_state[kExitCount], 1ull);
  if (before + 1 != gridDim.x) return false;
  __threadfence();
  c.fused_state[kExitCount] = 0;
  return true;
}

// The last block records the launch as this rank's last fused launch.
__device__ __forceinline__ void record_fused_launch(const DeviceComm& c, uint64_t launch) {
  sync::st_release_gpu(&c.fused_state[kLastFusedLaunch], launch);
}

// Raises a flag that only ever grows (launch numbers) after everything this thread's block did
// before a __syncthreads: the fence makes those writes visible system-wide first.
__device__ __forceinline__ void raise_flag(uint64_t* flag, uint64_t launch) {
  sync::fence_acq_rel_sys();
  sync::st_relaxed_sys(flag, launch);
}

#endif  // __CUDACC__

}  // namespace mkernel::kernels
