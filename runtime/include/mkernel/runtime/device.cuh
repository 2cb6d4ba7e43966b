// device.cuh: what a CUDA kernel sees of a communicator: the command ring it pushes into, its
// flags, its buffers, the launch number, and the status word it reports errors in.
//
// Design notes
//  1. DeviceComm is plain data, passed by value as a kernel parameter. Everything it points to
//     stays valid while the Communicator lives.
//  2. Launch numbers: Communicator::begin_launch enqueues a one-thread kernel that raises the
//     launch counter in device memory; every kernel of that launch reads it with
//     launch_number(). Flags are raised to the launch number of the launch that signalled, so
//     they only grow: no reset between launches, no host synchronisation, and a CUDA graph
//     that captured begin_launch and the kernels gets a new number on every replay.
//  3. Every wait is bounded by wait_timeout_ns of %globaltimer. A wait that expires, a push
//     the ring refuses, or a ring the daemon (or the runtime, when the daemon died) marked with
//     an error, ends the wait with false and records the first such error in the status word
//     (code, detail, launch, where). The kernel then returns; it never traps. The host turns the
//     status word into a Status (Communicator::check).
#pragma once

#include <cstdint>

#include "mkernel/protocol/command.h"
#include "mkernel/protocol/ring.h"
#include "mkernel/protocol/ring_device.cuh"
#include "mkernel/protocol/status.h"

namespace mkernel::rt {

inline constexpr uint32_t kMaxBuffers = 16;
// NVLink: ranks 0..kMaxNvlRanks-1 on the same node can map each other's NVLink buffer; each
// buffer ends with kNvlFlags 64-bit flags.
inline constexpr uint32_t kMaxNvlRanks = 8;
inline constexpr uint32_t kNvlFlags = 512;

// Codes of DeviceStatus::code.
enum DeviceError : uint32_t {
  kDeviceOk = 0,
  kDevicePushFailed = 1,    // detail: protocol::RingStatus of the push
  kDeviceWaitTimeout = 2,   // detail: the flag index waited on
  kDeviceRingError = 3,     // detail: the ring's error word (daemon's code, or 5 = daemon gone)
  kDeviceBadArgument = 4,   // detail: which argument (1 rank, 2 buffer, 3 range, 4 flag)
};

// The ring error code the runtime writes when the daemon went away (the daemon's own codes are
// 1..4, daemon/src/session.h).
inline constexpr uint32_t kRingErrDaemonGone = 5;

// In mapped pinned host memory: the host reads it at any time.
struct alignas(32) DeviceStatus {
  uint32_t code;
  uint32_t detail;
  uint64_t launch;  // launch number of the kernel that reported
  uint64_t where;   // caller-chosen tag (tile, step)
  uint64_t pad;
};

struct DeviceComm {
  protocol::RingProducerView ring;
  uint64_t* flags = nullptr;            // device address of the flag array (mapped host memory)
  uint32_t num_flags = 0;
  uint32_t rank = 0;
  uint32_t world_size = 1;
  uint32_t num_buffers = 0;
  uint8_t* buffers[kMaxBuffers] = {};   // device addresses of this rank's buffers
  uint64_t buffer_bytes[kMaxBuffers] = {};
  const unsigned long long* launch_counter = nullptr;  // device memory (note 2)
  DeviceStatus* status = nullptr;       // device address (mapped host memory)
  uint64_t wait_timeout_ns = 2000000000ull;
  // NVLink buffers (Options::nvlink_bytes): by rank, that rank's buffer as mapped here (this
  // rank's own included), null for ranks not on this node or not NVLink-reachable.
  uint8_t* nvl[kMaxNvlRanks] = {};
  uint64_t nvl_bytes = 0;  // data bytes of each; kNvlFlags flags follow them
};

#if defined(__CUDACC__)

__device__ __forceinline__ uint64_t launch_number(const DeviceComm& c) {
  return protocol::ring_detail::ld_acquire_gpu(c.launch_counter);
}

// Records the first error of the communicator; later ones are dropped.
__device__ __forceinline__ void report(const DeviceComm& c, uint32_t code, uint32_t detail, uint64_t where) {
  if (atomicCAS_system(&c.status->code, 0u, code) == 0u) {
    c.status->detail = detail;
    c.status->launch = launch_number(c);
    c.status->where = where;
    __threadfence_system();
  }
}

// Pushes "write `bytes` from my buffer src_buf at src_off into rank dst's buffer dst_buf at
// dst_off, then raise its flag `flag` to this launch's number". One thread. False (and the
// status word set) when the arguments are out of range or the ring refuses.
__device__ __forceinline__ bool put_signal(const DeviceComm& c, uint32_t dst, uint32_t src_buf, uint64_t src_off,
                                           uint32_t dst_buf, uint64_t dst_off, uint64_t bytes, uint32_t flag,
                                           uint64_t where = 0) {
  if (dst >= c.world_size) return report(c, kDeviceBadArgument, 1, where), false;
  if (src_buf >= c.num_buffers || dst_buf >= c.num_buffers) return report(c, kDeviceBadArgument, 2, where), false;
  if (src_off > c.buffer_bytes[src_buf] || bytes > c.buffer_bytes[src_buf] - src_off ||
      dst_off > c.buffer_bytes[dst_buf] || bytes > c.buffer_bytes[dst_buf] - dst_off)
    return report(c, kDeviceBadArgument, 3, where), false;
  const protocol::Command cmd = protocol::make_write_signal(dst, static_cast<uint16_t>(src_buf), src_off,
                                                            static_cast<uint16_t>(dst_buf), dst_off, bytes, flag,
                                                            launch_number(c), where);
  const uint32_t s = protocol::ring_push(c.ring, cmd);
  if (s != protocol::kRingOk) return report(c, kDevicePushFailed, s, where), false;
  return true;
}

// Raises rank dst's flag to this launch's number after every earlier write of this ring to it.
__device__ __forceinline__ bool signal(const DeviceComm& c, uint32_t dst, uint32_t flag, uint64_t where = 0) {
  if (dst >= c.world_size) return report(c, kDeviceBadArgument, 1, where), false;
  const uint32_t s = protocol::ring_push(c.ring, protocol::make_signal(dst, flag, launch_number(c), where));
  if (s != protocol::kRingOk) return report(c, kDevicePushFailed, s, where), false;
  return true;
}

// Waits until my flag `flag` reached `value` (this launch's number unless given). Bounded
// (note 3). One thread; the caller spreads the result to its block (e.g. __syncthreads).
__device__ __forceinline__ bool wait_flag(const DeviceComm& c, uint32_t flag, uint64_t value, uint64_t where = 0) {
  namespace rd = protocol::ring_detail;
  if (flag >= c.num_flags) return report(c, kDeviceBadArgument, 4, where), false;
  const uint64_t start = rd::globaltimer_ns();
  uint32_t spins = 0;
  while (rd::ld_acquire_sys(&c.flags[flag]) < value) {
    if ((++spins & 63u) == 0) {
      const uint32_t err = rd::ld_acquire_sys(&c.ring.header->error);
      if (err != 0) return report(c, kDeviceRingError, err, where), false;
      if (rd::ld_acquire_sys(&c.status->code) != 0) return false;  // another thread already failed
      if (rd::globaltimer_ns() - start > c.wait_timeout_ns) return report(c, kDeviceWaitTimeout, flag, where), false;
    }
  }
  return true;
}

// ---- NVLink: plain stores into a peer's buffer, a release store of its flag ----

__device__ __forceinline__ uint64_t* nvl_flag(const DeviceComm& c, uint32_t rank, uint32_t idx) {
  return reinterpret_cast<uint64_t*>(c.nvl[rank] + c.nvl_bytes) + idx;
}

// After this thread's (and, with a __syncthreads before, its block's) stores into rank's
// buffer: raises rank's NVLink flag `idx` to this launch's number.
__device__ __forceinline__ bool nvl_signal(const DeviceComm& c, uint32_t rank, uint32_t idx, uint64_t where = 0) {
  if (rank >= kMaxNvlRanks || c.nvl[rank] == nullptr) return report(c, kDeviceBadArgument, 1, where), false;
  if (idx >= kNvlFlags) return report(c, kDeviceBadArgument, 4, where), false;
  protocol::ring_detail::fence_acq_rel_sys();
  protocol::ring_detail::st_relaxed_sys(nvl_flag(c, rank, idx), launch_number(c));
  return true;
}

// Waits until this rank's NVLink flag `idx` reached `value`. Bounded like wait_flag.
__device__ __forceinline__ bool nvl_wait(const DeviceComm& c, uint32_t idx, uint64_t value, uint64_t where = 0) {
  namespace rd = protocol::ring_detail;
  if (c.rank >= kMaxNvlRanks || c.nvl[c.rank] == nullptr || idx >= kNvlFlags)
    return report(c, kDeviceBadArgument, 4, where), false;
  const uint64_t* f = nvl_flag(c, c.rank, idx);
  const uint64_t start = rd::globaltimer_ns();
  uint32_t spins = 0;
  while (rd::ld_acquire_sys(f) < value) {
    if ((++spins & 63u) == 0) {
      if (rd::ld_acquire_sys(&c.status->code) != 0) return false;
      if (rd::globaltimer_ns() - start > c.wait_timeout_ns) return report(c, kDeviceWaitTimeout, idx, where), false;
    }
  }
  return true;
}

#endif  // __CUDACC__

}  // namespace mkernel::rt
