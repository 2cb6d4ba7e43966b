// split_control.cuh: the device side of the adaptive split (split_control.h has the state and
// its notes; split_policy.h the policy). Used by the GEMM engine (gemm/sm90_bf16_gemm.cuh) and
// the fused kernels that have roles of their own (ring attention).
#pragma once

#include <cstdint>

#include "common/split_control.h"
#include "mkernel/protocol/sync.cuh"

namespace mkernel::kernels {

#if defined(__CUDACC__)

// Communication blocks of this launch (note 1); every block reads the same words.
__device__ __forceinline__ uint32_t split_comm_blocks(const SplitControl* c) {
  const volatile SplitControl* v = c;
  const uint32_t pinned = v->pinned;
  return split_clamp_comm(pinned != 0 ? pinned : v->next_comm, v->grid, v->unit);
}

// Thread 0 of every block, at its start.
__device__ __forceinline__ void split_block_start(SplitControl* c) {
  atomicMin(&c->acc.start, static_cast<unsigned long long>(sync::globaltimer_ns()));
}

// A compute block's time spent waiting for data (one thread per block, once or as it goes).
__device__ __forceinline__ void split_add_wait(SplitControl* c, uint64_t ns) {
  if (ns != 0) atomicAdd(&c->acc.compute_wait, static_cast<unsigned long long>(ns));
}

// Thread 0 of every block, once its role's work is done (before it counts itself out).
__device__ __forceinline__ void split_block_done(SplitControl* c, bool compute) {
  const auto now = static_cast<unsigned long long>(sync::globaltimer_ns());
  atomicMax(compute ? &c->acc.compute_done : &c->acc.comm_done, now);
}

// Thread 0 of the launch's last block, after every block counted itself out (their sums are
// then complete: each block's atomics precede its count, and the count is acquired): measures the
// launch, runs the policy unless the split is pinned or fixed, writes the next split and empties
// the sums (notes 1-3). `failed`: the launch's status word holds an error.
__device__ __forceinline__ void split_launch_end(SplitControl* c, bool failed) {
  __threadfence();
  const uint64_t now = sync::globaltimer_ns();
  const volatile SplitAccum* v = &c->acc;
  SplitAccum a;
  a.start = v->start;
  a.compute_done = v->compute_done;
  a.comm_done = v->comm_done;
  a.compute_wait = v->compute_wait;
  split_control_end(*c, a, now, failed);
  __threadfence();
}

#endif  // __CUDACC__

}  // namespace mkernel::kernels
