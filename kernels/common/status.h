// status.h: the device status word of a kernel launch, shared by host and device code.
//
// A kernel never traps. When a bounded wait expires it records one of these codes in the status
// word passed to the launch (the first code written wins) and returns; the host reads the word
// after the launch and turns it into an error. Values cross the host/device boundary: append,
// never renumber.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define MK_KERNEL_HD __host__ __device__
#else
#define MK_KERNEL_HD
#endif

namespace mkernel::kernels {

enum KernelStatus : uint32_t {
  kKernelOk = 0,
  // The producer waited for an input readiness flag past the launch's timeout.
  kKernelReadyFlagTimeout = 1,
  // A shared-memory pipeline barrier (TMA arrival or consumer release) did not complete in time;
  // it means a broken launch (bad tensor map, a peer block that exited) rather than slow data.
  kKernelPipelineTimeout = 2,
  kNumKernelStatus = 3,
};

MK_KERNEL_HD constexpr const char* kernel_status_name(uint32_t s) {
  switch (s) {
    case kKernelOk: return "ok";
    case kKernelReadyFlagTimeout: return "timeout waiting for an input readiness flag";
    case kKernelPipelineTimeout: return "timeout in the shared-memory pipeline";
    default: return "unknown kernel status";
  }
}

}  // namespace mkernel::kernels
