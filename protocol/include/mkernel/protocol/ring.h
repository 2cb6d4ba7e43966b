// ring.h: layout of a command ring in shared memory, common to host and device.
//
// Design notes
//  1. A ring is one shared segment: a RingHeader at offset 0, then 2^capacity_log2 slots of one
//     CommandRecord each starting at kRingSlotsOffset. The daemon creates it; producers (GPU
//     threads, or host threads standing in for them) write records; one consumer (the daemon's
//     proxy thread) takes them in order.
//  2. Every field that one side writes and the other polls sits on its own cache line, so a
//     producer polling `tail` never bounces the line the consumer writes `completed` on.
//  3. Producers claim a position with an atomic increment of a claim counter, wait until
//     position - tail < capacity, write the payload and then the commit word with release
//     ordering. Host producers claim on `head` itself; device producers claim on a counter in
//     device memory (an atomic on host memory costs a PCIe round trip) and only publish `head`
//     as a hint for occupancy reporting. The consumer never relies on `head`.
//  4. The commit word of position p is commit_word(p, log2) = kCommitValid | lap(p). The consumer
//     takes position `tail` only when its slot's commit word equals that value, so a zero slot, a
//     half-written slot (commit not yet stored) and a stale slot from an earlier lap are all
//     "not yet". After copying the record out the consumer zeroes the slot and, in batches,
//     publishes the new tail with release ordering.
//  5. Everything in shared memory is untrusted to the consumer: the capacity it uses is its own
//     copy, `head` is clamped before it is reported, and every record goes through decode().
//  6. Errors: the consumer writes `error` (code, detail, position) to stop producers; a producer
//     that gives up on a claimed slot writes `client_error` so the consumer learns why the ring
//     stopped at that position. `epoch` is the daemon's start counter: a producer that finds a
//     different epoch than it started with knows the daemon restarted.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "mkernel/protocol/command.h"
#include "mkernel/protocol/compat.h"
#include "mkernel/protocol/version.h"

namespace mkernel::protocol {

inline constexpr uint32_t kRingMagic = 0x474B524Du;  // "MRKG" little-endian
inline constexpr uint32_t kCommitValid = 0x80000000u;
inline constexpr uint32_t kLapMask = 0x7FFFFFFFu;
inline constexpr uint32_t kMinCapacityLog2 = 1;
inline constexpr uint32_t kMaxCapacityLog2 = 20;  // 1 Mi slots, 64 MiB of records
inline constexpr size_t kRingSlotsOffset = 4096;  // slots start on their own page

struct alignas(64) RingHeader {
  // Line 0: identity. Written once by the creator before the ring is shared; read-only after.
  uint32_t magic;
  uint32_t version;
  uint32_t capacity_log2;
  uint32_t record_size;
  uint64_t ring_id;
  uint8_t pad0[40];
  // Line 1: producers' head. Host producers claim here; device producers publish a hint.
  alignas(64) uint64_t head;
  // Line 2: consumer tail: every position below it has been taken and its slot cleared.
  alignas(64) uint64_t tail;
  // Line 3: commands carried out (ok, error or rejected), advanced by the proxy.
  alignas(64) uint64_t completed;
  // Line 4: consumer -> producers. Non-zero `error` ends the session.
  alignas(64) uint32_t error;
  uint32_t error_detail;
  uint64_t error_pos;
  // Line 5: the daemon's epoch (start counter).
  alignas(64) uint64_t epoch;
  // Line 6: producer -> consumer. A producer that abandoned a claimed position says so here.
  alignas(64) uint32_t client_error;
  uint32_t client_detail;
  uint64_t client_pos;
};

static_assert(sizeof(RingHeader) == 7 * 64);
static_assert(std::is_trivially_copyable_v<RingHeader>);
static_assert(std::is_standard_layout_v<RingHeader>);
static_assert(offsetof(RingHeader, head) == 64);
static_assert(offsetof(RingHeader, tail) == 128);
static_assert(offsetof(RingHeader, completed) == 192);
static_assert(offsetof(RingHeader, error) == 256);
static_assert(offsetof(RingHeader, error_pos) == 264);
static_assert(offsetof(RingHeader, epoch) == 320);
static_assert(offsetof(RingHeader, client_error) == 384);
static_assert(offsetof(RingHeader, client_pos) == 392);
static_assert(sizeof(RingHeader) <= kRingSlotsOffset);

MK_HOST_DEVICE constexpr uint32_t commit_word(uint64_t pos, uint32_t capacity_log2) {
  return kCommitValid | (static_cast<uint32_t>(pos >> capacity_log2) & kLapMask);
}

MK_HOST_DEVICE constexpr bool valid_capacity_log2(uint32_t capacity_log2) {
  return capacity_log2 >= kMinCapacityLog2 && capacity_log2 <= kMaxCapacityLog2;
}

// Bytes of the shared segment for a ring of 2^capacity_log2 slots.
MK_HOST_DEVICE constexpr size_t ring_segment_bytes(uint32_t capacity_log2) {
  return kRingSlotsOffset + (size_t{1} << capacity_log2) * sizeof(CommandRecord);
}

}  // namespace mkernel::protocol
