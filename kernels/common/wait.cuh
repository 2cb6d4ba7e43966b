// wait.cuh: bounded waits. Every wait in a kernel ends: on success it returns true, on expiry it
// returns false and the caller records a KernelStatus code (report_status) and leaves its loops,
// so the launch finishes with an error instead of hanging the GPU.
#pragma once

#include <cstdint>

#include "common/ptx.cuh"
#include "common/status.h"

namespace mkernel::kernels {

// Records `code` in the launch's status word unless an earlier error is already there.
__device__ __forceinline__ void report_status(uint32_t* status, uint32_t code) {
  if (status != nullptr) atomicCAS(status, 0u, code);
}

// Waits for the phase of parity `parity` of an mbarrier to complete. The timer is read only
// after the first failed try, so the fast path costs one try_wait.
__device__ __forceinline__ bool mbar_wait_bounded(uint64_t* bar, uint32_t parity,
                                                  uint64_t timeout_ns) {
  if (ptx::mbar_try_wait(bar, parity)) return true;
  const uint64_t start = ptx::globaltimer_ns();
  while (true) {
#pragma unroll 1
    for (int i = 0; i < 32; ++i) {
      if (ptx::mbar_try_wait(bar, parity)) return true;
    }
    if (ptx::globaltimer_ns() - start > timeout_ns) return false;
  }
}

// Waits until *flag >= value (flags carry launch sequence numbers, so they never need a reset).
// The load is an acquire at system scope: the flag may be raised by a peer GPU or the host.
__device__ __forceinline__ bool wait_flag_geq(const uint64_t* flag, uint64_t value,
                                              uint64_t timeout_ns) {
  if (ptx::ld_acquire_sys(flag) >= value) return true;
  const uint64_t start = ptx::globaltimer_ns();
  uint32_t backoff_ns = 32;
  while (true) {
    __nanosleep(backoff_ns);
    if (backoff_ns < 1024) backoff_ns *= 2;
    if (ptx::ld_acquire_sys(flag) >= value) return true;
    if (ptx::globaltimer_ns() - start > timeout_ns) return false;
  }
}

}  // namespace mkernel::kernels
