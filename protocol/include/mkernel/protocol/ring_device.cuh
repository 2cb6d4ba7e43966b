// ring_device.cuh: the device half of the command ring: GPU threads as producers.
//
// Design notes
//  1. Claims are atomics on a counter in device memory (RingDeviceState::claim), not on the
//     ring header in host memory: an atomic that crosses PCIe costs a round trip per command.
//     The header's `head` receives a plain store now and then, as an occupancy hint only.
//  2. The consumer's tail lives in host memory. Producers keep the newest tail any of them has
//     seen in device memory (cached_tail, raised with release, read with acquire) and read the
//     host copy only when the cached one says the ring may be full. With a consumer that keeps
//     up, a push touches host memory only with posted writes.
//  3. Ordering: payload stores (weak), then fence.acq_rel.sys, then the commit word. The fence
//     is what costs; a batch (ring_push_batch) or a warp (ring_push_warp) pays it once for many
//     records. The consumer's acquire of the commit word pairs with that fence.
//  4. Every wait is bounded by view.timeout_ns of %globaltimer. On expiry, or when the consumer
//     has set the ring's error word, or when the daemon epoch changed, the push returns a
//     RingStatus code and, for a position it had claimed but cannot fill, records it in the
//     header's client error line so the consumer knows why the ring stopped. No trap, no hang.
//  5. The view is plain data (passable as a kernel parameter); the RingDeviceState must be
//     zeroed before the first push into a fresh ring (its claim equals the ring's head, 0).
#pragma once

#include <cstdint>

#include "mkernel/protocol/command.h"
#include "mkernel/protocol/ring.h"
#include "mkernel/protocol/status.h"
#include "mkernel/protocol/sync.cuh"

namespace mkernel::protocol {

struct RingDeviceState {
  alignas(128) unsigned long long claim;        // next position to hand out
  alignas(128) unsigned long long cached_tail;  // newest consumer tail a producer has read
};
static_assert(sizeof(RingDeviceState) == 256);

struct RingProducerView {
  CommandRecord* slots = nullptr;     // device address of the slots (mapped pinned memory)
  RingHeader* header = nullptr;       // device address of the header (mapped pinned memory)
  RingDeviceState* state = nullptr;   // device memory
  uint32_t capacity_log2 = 0;
  uint64_t expected_epoch = 0;        // daemon epoch this producer was set up under
  uint64_t timeout_ns = 1000000000;   // bound on any wait for space
};

// Push hint cadence: the head hint is stored when a push fills a position p with p % 16 == 15.
inline constexpr uint32_t kHeadHintEvery = 16;

#if defined(__CUDACC__)

namespace ring_detail {

// Writes bytes 0..59 of the slot (everything but the commit word) with wide stores, building
// the words in registers (both sides are little-endian; command.h pins the offsets).
__device__ __forceinline__ void store_payload(CommandRecord* slot, const Command& c) {
  auto lo = [](uint64_t x) { return static_cast<uint32_t>(x); };
  auto hi = [](uint64_t x) { return static_cast<uint32_t>(x >> 32); };
  uint4* dst = reinterpret_cast<uint4*>(slot);
  dst[0] = make_uint4(lo(c.src_offset), hi(c.src_offset), lo(c.dst_offset), hi(c.dst_offset));
  dst[1] = make_uint4(lo(c.num_bytes), hi(c.num_bytes), lo(c.signal_value), hi(c.signal_value));
  dst[2] = make_uint4(lo(c.tag), hi(c.tag), c.dst_rank, c.signal_idx);
  // bytes 48..55: src_region, dst_region, op, flags = 0, reserved0 = 0
  *reinterpret_cast<uint2*>(&slot->src_region) =
      make_uint2(uint32_t{c.src_region} | (uint32_t{c.dst_region} << 16), uint32_t{c.op});
  slot->reserved1 = 0;  // bytes 56..59
}

__device__ __forceinline__ void abandon(const RingProducerView& v, uint64_t first, uint32_t count,
                                        uint32_t why) {
  sync::st_relaxed_sys(&v.header->client_detail, count);
  sync::st_relaxed_sys(&v.header->client_pos, first);
  sync::fence_acq_rel_sys();
  sync::st_relaxed_sys(&v.header->client_error, why);
}

// Waits until position `last` fits (last - tail < capacity). Bounded; see note 4.
// Only the waiters nearest the front of the ring (within kHostPollWindow slots of fitting) poll
// the host tail continuously; the others poll it at most every kHostPollIntervalNs and otherwise
// watch the device copy that the front waiters raise. Thousands of waiting threads thus do not
// flood PCIe with reads of one host word.
inline constexpr uint64_t kHostPollWindow = 256;
inline constexpr uint64_t kHostPollIntervalNs = 4000;

__device__ __forceinline__ uint32_t wait_for_space(const RingProducerView& v, uint64_t last) {
  const uint64_t cap = uint64_t{1} << v.capacity_log2;
  uint64_t cached = sync::ld_acquire_gpu(&v.state->cached_tail);
  if (last - cached < cap) return kRingOk;
  const uint64_t start = sync::globaltimer_ns();
  uint64_t host_polled_at = 0;
  uint32_t sleep_ns = 32;
  for (;;) {
    const uint64_t now = sync::globaltimer_ns();
    if (last - cached < cap + kHostPollWindow || now - host_polled_at >= kHostPollIntervalNs) {
      host_polled_at = now;
      const uint64_t tail = sync::ld_acquire_sys(&v.header->tail);
      if (tail - cached < (uint64_t{1} << 63)) sync::red_max_release_gpu(&v.state->cached_tail, tail);
      if (last - tail < cap) return kRingOk;
      if (sync::ld_acquire_sys(&v.header->error) != 0) return kRingConsumerError;
      if (sync::ld_relaxed_sys(&v.header->epoch) != v.expected_epoch) return kRingEpochChanged;
    }
    if (now - start > v.timeout_ns) return kRingTimeout;
    __nanosleep(sleep_ns);
    if (sleep_ns < 512) sleep_ns *= 2;
    cached = sync::ld_acquire_gpu(&v.state->cached_tail);
    if (last - cached < cap) return kRingOk;
  }
}

__device__ __forceinline__ void publish_head_hint(const RingProducerView& v, uint64_t first,
                                                  uint64_t last) {
  // Only when [first, last] holds a position p with p % kHeadHintEvery == kHeadHintEvery - 1.
  const uint64_t boundary = (last + 1) / kHeadHintEvery * kHeadHintEvery;
  if (boundary > first) sync::st_relaxed_sys(&v.header->head, last + 1);
}

}  // namespace ring_detail

// One thread pushes one command. Returns kRingOk or a RingStatus error; `pos_out` (optional)
// receives the claimed position.
__device__ __forceinline__ uint32_t ring_push(const RingProducerView& v, const Command& c,
                                              uint64_t* pos_out = nullptr) {
  const uint64_t pos = atomicAdd(&v.state->claim, 1ull);
  if (pos_out) *pos_out = pos;
  const uint32_t s = ring_detail::wait_for_space(v, pos);
  if (s != kRingOk) {
    ring_detail::abandon(v, pos, 1, s);
    return s;
  }
  CommandRecord* slot = &v.slots[pos & ((uint64_t{1} << v.capacity_log2) - 1)];
  ring_detail::store_payload(slot, c);
  sync::fence_acq_rel_sys();
  sync::st_relaxed_sys(&slot->commit, commit_word(pos, v.capacity_log2));
  ring_detail::publish_head_hint(v, pos, pos);
  return kRingOk;
}

// One thread pushes `n` commands into consecutive positions: one claim, one wait, one fence.
__device__ __forceinline__ uint32_t ring_push_batch(const RingProducerView& v, const Command* cmds,
                                                    uint32_t n, uint64_t* first_out = nullptr) {
  const uint64_t cap = uint64_t{1} << v.capacity_log2;
  if (n == 0 || n > cap) return kRingInvalidArgument;
  const uint64_t first = atomicAdd(&v.state->claim, static_cast<unsigned long long>(n));
  if (first_out) *first_out = first;
  const uint32_t s = ring_detail::wait_for_space(v, first + n - 1);
  if (s != kRingOk) {
    ring_detail::abandon(v, first, n, s);
    return s;
  }
  for (uint32_t i = 0; i < n; ++i)
    ring_detail::store_payload(&v.slots[(first + i) & (cap - 1)], cmds[i]);
  sync::fence_acq_rel_sys();
  for (uint32_t i = 0; i < n; ++i)
    sync::st_relaxed_sys(&v.slots[(first + i) & (cap - 1)].commit,
                                commit_word(first + i, v.capacity_log2));
  ring_detail::publish_head_hint(v, first, first + n - 1);
  return kRingOk;
}

// Every converged lane of a warp calls this together; lanes with has_command push `c`. One
// lane claims for all and waits for space; each lane writes and commits its own slot. Returns
// the same status on every calling lane.
__device__ __forceinline__ uint32_t ring_push_warp(const RingProducerView& v, const Command& c,
                                                   bool has_command, uint64_t* pos_out = nullptr) {
  const unsigned mask = __activemask();
  const unsigned vote = __ballot_sync(mask, has_command);
  if (vote == 0) return kRingOk;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int leader = __ffs(static_cast<int>(vote)) - 1;
  const uint32_t n = static_cast<uint32_t>(__popc(vote));
  const uint32_t rank = static_cast<uint32_t>(__popc(vote & ((1u << lane) - 1u)));
  unsigned long long first = 0;
  uint32_t s = kRingOk;
  if (lane == leader) {
    first = atomicAdd(&v.state->claim, static_cast<unsigned long long>(n));
    s = ring_detail::wait_for_space(v, first + n - 1);
    if (s != kRingOk) ring_detail::abandon(v, first, n, s);
  }
  first = __shfl_sync(mask, first, leader);
  s = __shfl_sync(mask, s, leader);
  if (s != kRingOk || !has_command) return s;
  const uint64_t pos = first + rank;
  if (pos_out) *pos_out = pos;
  CommandRecord* slot = &v.slots[pos & ((uint64_t{1} << v.capacity_log2) - 1)];
  ring_detail::store_payload(slot, c);
  sync::fence_acq_rel_sys();
  sync::st_relaxed_sys(&slot->commit, commit_word(pos, v.capacity_log2));
  if (rank == n - 1) ring_detail::publish_head_hint(v, first, first + n - 1);
  return kRingOk;
}

#endif  // __CUDACC__

}  // namespace mkernel::protocol
