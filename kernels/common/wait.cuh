// wait.cuh: the one bounded wait of device code, and how a failure is reported.
//
// Design notes
//  1. Every wait ends. wait_geq returns true when the flag reached the value, false when
//       - the bound (WaitContext::timeout_ns of %globaltimer) expired: kDeviceWaitTimeout,
//       - the command ring's error word is set (the daemon stopped the session, or the runtime
//         found the daemon gone): kDeviceRingError,
//       - a peer rank said its kernel failed (the peer-abort word): kDevicePeerFailed,
//       - this communicator's status word already holds an error (another thread failed first):
//         nothing new is reported.
//     The caller leaves its loops on false; nothing traps.
//  2. The fast path is one acquire load. The slow path backs off with __nanosleep up to
//     kMaxBackoffNs and looks at the ring's error word, the peer-abort word, the status word
//     (the first and last are host memory: each look is a read across PCIe) and the bound once
//     every kFailureCheckNs of waiting, by the timer rather than by a count of polls (every 16
//     polls is about every 5 us). Even so these reads cost the GPU's other blocks their fences
//     (note 7). A failure is seen at most kFailureCheckNs late; bounds are milliseconds to
//     seconds.
//  3. Flags carry launch numbers and only grow, so "reached" is `>=` and nothing is reset.
//  4. mbar_wait_bounded is the same rule for a shared-memory mbarrier phase (a block's own
//     pipeline): bounded, reported by the caller as kDevicePipelineTimeout.
//  5. Bounds grow along the chain of consequences, so the first report names the cause: a wait
//     on a flag (another rank, a readiness hook) has the bound; a consumer waiting for a stage
//     to fill twice it (the stage's producer, or its cluster peer's, may be in such a wait);
//     a producer waiting for a stage to be handed back four times (its consumers may be in the
//     previous wait). With equal bounds for the last two, a producer whose consumers waited on
//     a cluster peer stuck on a readiness flag could time out first and name the pipeline. The
//     producer (one thread) also stops as soon as the status word holds an error, so the
//     longer bound does not lengthen the kernel's end after a failure.
//  6. Growing sleeps. WaitContext::long_wait_shift = k lets the sleep keep growing with the wait:
//     up to (time waited) >> k, at most kMaxLongBackoffNs. A wait that ends within 256 << k ns
//     polls as before; a longer one sees its flag at most 1/2^k of its length (and 8 us) late.
//     Off (0) unless a kernel asks: the fused MoE sets 3 for its GEMM and role blocks.
//  7. What waiting costs the others (bench/fused/poll_bench.cu, one H100): polls of device
//     memory, at any scope and rate, cost the working blocks nothing measurable. The look at the
//     host words (note 2) does: with 131 waiting threads each reading two host words every 50 us,
//     a fence anywhere else on the GPU took 100-270x longer (about 70 us for fence.acq_rel.sys),
//     and a fused kernel raises its flags behind fences (kernels.md section 14).
//  8. The host gate (optional: WaitContext::host_gate and ::failed, device words shared by every
//     waiter of a launch; off where null). Then a waiter's failure check reads the device words
//     first: `failed` holds the launch number + 1 of a failure some waiter saw (this launch's
//     mark ends the wait at once), and `host_gate` the time from which the next look at the
//     host words is due; the waiter that finds it due and wins the compare-and-swap that moves it
//     kHostLookNs on looks, the others do not. So the host words are read about once per
//     kHostLookNs for the whole launch instead of once per kFailureCheckNs per waiter, and a
//     failure the host records reaches every waiter within about kHostLookNs + kFailureCheckNs.
//     report() marks `failed` too. Every wait context a communicator gives (wait_context in
//     comm.cuh and Communicator::wait_context) sets both, to words 2 and 3 of its fused_state, so
//     every fused op's waits and a readiness hook's are gated; the agreement's waits are not
//     (they report nothing).
#pragma once

#include <cstdint>

#include "common/status.h"
#include "mkernel/protocol/sync.cuh"
#if defined(__CUDACC__)
#include "common/ptx.cuh"
#endif

namespace mkernel::kernels {

// What a bounded wait needs to know besides its flag. Plain data; any pointer may be null
// (then that condition is not watched / not recorded).
struct WaitContext {
  DeviceStatus* status = nullptr;                     // first error wins (status.h note 1)
  const uint32_t* ring_error = nullptr;               // the command ring's error word
  const uint64_t* peer_abort = nullptr;               // non-zero: rank + 1 of a peer that failed
  const unsigned long long* launch_counter = nullptr; // for the report's launch number
  uint64_t timeout_ns = 2'000'000'000ull;
  uint32_t rank = 0;                                  // for the report
  // 0: the sleep between polls stops growing at kMaxBackoffNs. k > 0: it keeps growing with the
  // wait, up to (time waited) >> k and kMaxLongBackoffNs (note 6). For kernels whose waiters
  // are many and wait long.
  uint32_t long_wait_shift = 0;
  // The host gate (note 8): device words shared by the launch's waiters, both zero at first.
  unsigned long long* host_gate = nullptr;  // %globaltimer from which the next host look is due
  unsigned long long* failed = nullptr;     // launch number + 1 of a failure a waiter saw
};

inline constexpr uint64_t kFailureCheckNs = 50'000;
inline constexpr uint32_t kMaxBackoffNs = 256;
inline constexpr uint32_t kMaxLongBackoffNs = 8192;
inline constexpr uint64_t kHostLookNs = 50'000;  // note 8

#if defined(__CUDACC__)

// The launch's failure mark for WaitContext::failed (note 8): its launch number + 1.
__device__ __forceinline__ unsigned long long failure_mark(const WaitContext& w) {
  return (w.launch_counter != nullptr ? sync::ld_acquire_gpu(w.launch_counter) : 0) + 1;
}
__device__ __forceinline__ void mark_failed(const WaitContext& w) {
  if (w.failed != nullptr) atomicMax(w.failed, failure_mark(w));
}

// Records an error unless one is already there (status.h note 1). Returns whether this call's
// error was the one recorded.
__device__ __forceinline__ bool report(const WaitContext& w, uint32_t code, uint32_t detail, uint64_t where) {
  mark_failed(w);
  if (w.status == nullptr) return false;
  if (atomicCAS_system(&w.status->code, 0u, code) != 0u) return false;
  w.status->detail = detail;
  w.status->launch = w.launch_counter != nullptr ? sync::ld_acquire_gpu(w.launch_counter) : 0;
  w.status->where = where;
  w.status->rank = w.rank;
  sync::fence_acq_rel_sys();
  return true;
}

// Whether a failure elsewhere means this thread should stop now (and records why, for the ring
// and peer conditions). Reads host words (unless the host gate, note 8, says another waiter
// looks): call it every few polls, not every poll.
__device__ __forceinline__ bool failure_seen(const WaitContext& w, uint64_t where) {
  // Device words first: a failure another waiter of the launch saw (note 8), a peer's abort
  // (this rank's NVLink buffer).
  if (w.failed != nullptr && sync::ld_acquire_gpu(w.failed) >= failure_mark(w)) return true;
  if (w.peer_abort != nullptr) {
    const uint64_t a = sync::ld_acquire_sys(w.peer_abort);
    if (a != 0) return report(w, kDevicePeerFailed, static_cast<uint32_t>(a - 1), where), true;
  }
  // Then the host words; with a host gate (note 8) only by the waiter whose turn it is.
  if (w.host_gate != nullptr) {
    const unsigned long long now = sync::globaltimer_ns();
    const unsigned long long due = *reinterpret_cast<volatile unsigned long long*>(w.host_gate);
    if (now < due || atomicCAS(w.host_gate, due, now + kHostLookNs) != due) return false;
  }
  if (w.ring_error != nullptr) {
    const uint32_t err = sync::ld_acquire_sys(w.ring_error);
    if (err != 0) return report(w, kDeviceRingError, err, where), true;
  }
  if (w.status != nullptr && sync::ld_acquire_sys(&w.status->code) != 0) {
    mark_failed(w);
    return true;
  }
  return false;
}

// Waits until *flag >= value (note 1). `detail` goes into a timeout report (the flag's index).
__device__ __forceinline__ bool wait_geq(const uint64_t* flag, uint64_t value, const WaitContext& w,
                                         uint32_t detail, uint64_t where) {
  if (sync::ld_acquire_sys(flag) >= value) return true;
  const uint64_t start = sync::globaltimer_ns();
  uint64_t next_check = start + kFailureCheckNs;
  uint32_t backoff_ns = 16;
  while (true) {
    __nanosleep(backoff_ns);
    if (backoff_ns < kMaxBackoffNs) backoff_ns *= 2;
    if (sync::ld_acquire_sys(flag) >= value) return true;
    const uint64_t now = sync::globaltimer_ns();
    if (w.long_wait_shift != 0) {  // note 6
      const uint64_t grown = (now - start) >> w.long_wait_shift;
      const uint32_t cap = grown < kMaxBackoffNs ? kMaxBackoffNs
                                                 : (grown > kMaxLongBackoffNs ? kMaxLongBackoffNs : static_cast<uint32_t>(grown));
      backoff_ns = backoff_ns * 2 <= cap ? backoff_ns * 2 : cap;
    }
    if (now >= next_check) {
      next_check = now + kFailureCheckNs;
      if (failure_seen(w, where)) return false;
      if (now - start > w.timeout_ns) {
        report(w, kDeviceWaitTimeout, detail, where);
        return false;
      }
    }
  }
}

// Waits for the phase of parity `parity` of an mbarrier (note 4). The timer is read only after
// the first failed try, so the fast path costs one try_wait.
// `scale`: the bound is timeout_ns << scale (computed only once the first try failed, so a
// caller in a hot loop keeps no extra register for it).
// `stop_if_failed` (a single waiting thread only, never a warpgroup that must agree): also give
// up, without a report of its own, once that status word holds an error, looked at every
// kStatusCheckNs of waiting.
inline constexpr uint64_t kStatusCheckNs = 100'000;
__device__ __forceinline__ bool mbar_wait_bounded(uint64_t* bar, uint32_t parity, uint64_t timeout_ns,
                                                  uint32_t scale = 0, const DeviceStatus* stop_if_failed = nullptr) {
  if (ptx::mbar_try_wait(bar, parity)) return true;
  if (scale != 0) timeout_ns = timeout_ns > (~uint64_t{0} >> scale) ? ~uint64_t{0} : timeout_ns << scale;
  const uint64_t start = sync::globaltimer_ns();
  uint64_t checked = start;
  while (true) {
#pragma unroll 1
    for (int i = 0; i < 32; ++i) {
      if (ptx::mbar_try_wait(bar, parity)) return true;
    }
    const uint64_t now = sync::globaltimer_ns();
    if (now - start > timeout_ns) return false;
    if (stop_if_failed != nullptr && now - checked > kStatusCheckNs) {
      checked = now;
      if (sync::ld_acquire_sys(&stop_if_failed->code) != 0) return false;
    }
  }
}

#endif  // __CUDACC__

}  // namespace mkernel::kernels
