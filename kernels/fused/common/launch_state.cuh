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
#include "fused/common/layout.h"

namespace mkernel::kernels {

inline constexpr uint32_t kLastFusedLaunch = 0;
inline constexpr uint32_t kExitCount = 1;
static_assert(kExitCount < kWaitHostDue && kWaitFailedMark < kFusedStateWords);

#if defined(__CUDACC__)

// The launch number of this rank's previous fused launch (0 before the first).
__device__ __forceinline__ uint64_t previous_fused_launch(const DeviceComm& c) {
  return sync::ld_acquire_gpu(&c.fused_state[kLastFusedLaunch]);
}

// Thread 0 of every block, once, after all the block's work: true for the last block of the
// launch, which then owns the end-of-launch actions (note 2).
// One acquire-release add (not a full fence before and after it: the block exit is on the
// launch's critical path, docs/kernels.md section 11): it releases the block's work (the engine
// waits for the block's TMA stores and synchronises the block before block_exit) and, in the
// last block, acquires every other block's.
__device__ __forceinline__ bool count_block_exit(const DeviceComm& c) {
  const uint64_t before = sync::atom_add_acq_rel_gpu(&c.fused_state[kExitCount], 1);
  if (before + 1 != gridDim.x) return false;
  c.fused_state[kExitCount] = 0;  // the next launch follows this kernel in stream order
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

// The last block's end of a launch (note 2) for an op whose peers wait on the shared done and
// slot_free flags (layout.h): records the launch, tells the node peers (done) and the rail peers
// on the other nodes (slot_free, through the proxy) that this rank's buffers may be written
// again, and, when this rank failed, ends its peers' waits now rather than at their bound. A
// failure of this launch is read from the device word every report marks (wait.cuh note 8), not
// from the status word in mapped host memory (a round trip over PCIe on the launch's critical
// path). With one rank nobody reads the flags: recording the launch is all.
__device__ __forceinline__ void end_fused_launch(const DeviceComm& c, const FusedLayout& L, uint32_t rank) {
  const uint64_t launch = launch_number(c);
  record_fused_launch(c, launch);
  if (L.world() == 1) return;
  sync::fence_acq_rel_sys();
  for (uint32_t i = 1; i < L.gpus; ++i)
    sync::st_relaxed_sys(nvl_fused_flag(c, L.node_peer(rank, i), L.done_flag(rank)), launch);
  const uint32_t node = L.node_of(rank);
  for (uint32_t i = 1; i < L.nodes; ++i) {
    const uint32_t to = L.rail_peer(rank, L.send_node(node, i));
    if (!signal(c, to, fused_flag_index(c, L.slot_free_flag(node)), where_tag(kStepPeerFree, to))) break;
  }
  if (c.fused_state != nullptr && sync::ld_acquire_gpu(&c.fused_state[kWaitFailedMark]) >= launch + 1) abort_peers(c);
}

#endif  // __CUDACC__

}  // namespace mkernel::kernels
