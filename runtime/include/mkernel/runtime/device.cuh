// device.cuh: what a CUDA kernel sees of a communicator. The contract itself (DeviceComm, the
// calls on it, the status word, the bounded wait) lives in the kernels' common headers, so the
// fused kernels and the GEMM engine use the very same code without the runtime's host side;
// this header gives application kernels the names under mkernel::rt.
//
//   launch_number(c)                          this launch's number (flags are raised to it)
//   put_signal(c, dst, src_buf, src_off, dst_buf, dst_off, bytes, flag, where)
//   signal(c, dst, flag, where)               one thread each; through the daemon's proxy
//   wait_flag(c, flag, value, where)          bounded; one thread
//   nvl_ptr(c, r), nvl_signal, nvl_wait, nvl_put_signal (a whole block)   NVLink peers
//   report(c, code, detail, where)            record an error in the status word
//
// See kernels/common/comm.cuh for the design notes (launch numbers, errors, NVLink layout) and
// kernels/common/status.h for the codes Communicator::check() turns into a Status.
#pragma once

#include "common/comm.cuh"

namespace mkernel::rt {

using kernels::DeviceComm;
using kernels::DeviceStatus;
using kernels::kMaxBuffers;
using kernels::NvlLayout;

using kernels::kDeviceBadArgument;
using kernels::kDeviceOk;
using kernels::kDevicePeerFailed;
using kernels::kDevicePushFailed;
using kernels::kDeviceRingError;
using kernels::kDeviceWaitTimeout;

#if defined(__CUDACC__)
using kernels::launch_number;
using kernels::nvl_flag;
using kernels::nvl_ptr;
using kernels::nvl_put_signal;
using kernels::nvl_signal;
using kernels::nvl_wait;
using kernels::push;
using kernels::put_signal;
using kernels::report;
using kernels::signal;
using kernels::wait_context;
using kernels::wait_flag;
#endif

}  // namespace mkernel::rt
