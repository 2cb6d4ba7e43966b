// launch.cu: the one kernel of the runtime itself: starting a launch (device.cuh note 2).
#include <cuda_runtime.h>

#include "mkernel/common/status.h"

namespace mkernel::rt {

namespace {
__global__ void begin_launch_kernel(unsigned long long* counter) {
  // Release at GPU scope: kernels of this launch that start after this one (stream order) read
  // the new number with acquire.
  asm volatile("red.release.gpu.global.add.u64 [%0], 1;" ::"l"(counter) : "memory");
}
}  // namespace

Status enqueue_begin_launch(unsigned long long* counter, cudaStream_t stream) {
  begin_launch_kernel<<<1, 1, 0, stream>>>(counter);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    return Status(StatusCode::kDeviceError, std::string("begin_launch: ") + cudaGetErrorString(e));
  return Status::Ok();
}

}  // namespace mkernel::rt
