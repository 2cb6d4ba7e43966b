// command.h: the command record a GPU thread writes into a ring and a proxy carries out.
//
// Design notes
//  1. One record is one 64-byte slot: one cache line on the host, one PCIe write burst from the
//     GPU. Fields are naturally aligned and the layout is pinned by static_asserts below, so g++,
//     clang and nvcc agree byte for byte.
//  2. A record names memory only by region id + offset. Region ids index tables the daemon owns
//     for the session; a record never carries a pointer or a memory key, so a client can only
//     reach memory the daemon registered for it.
//  3. `commit` is the last word of the slot and the last word written. It carries the slot's lap
//     (position / capacity) with the top bit set, so a slot that is zero, half written or left
//     over from an earlier lap never looks committed (see ring.h).
//  4. Everything in a record is untrusted input to the daemon: decode() checks every field and
//     names the first one that is wrong. Reserved fields must be zero so that a later protocol
//     version can use them and an old daemon rejects rather than misreads them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "mkernel/protocol/compat.h"

namespace mkernel::protocol {

enum Op : uint8_t {
  kOpInvalid = 0,
  // Copy num_bytes from (src_region, src_offset) on this rank to (dst_region, dst_offset) on
  // dst_rank.
  kOpWrite = 1,
  // kOpWrite, then raise flag signal_idx on dst_rank to signal_value once the data is there.
  kOpWriteSignal = 2,
  // Raise flag signal_idx on dst_rank to signal_value, ordered after every earlier write of
  // this ring to dst_rank.
  kOpSignal = 3,
  // Complete only after every earlier command of this ring has completed.
  kOpFence = 4,
  kNumOps = 5,
};

inline constexpr uint16_t kNoRegion = 0xFFFF;       // region field unused by this op
inline constexpr uint32_t kNoSignal = 0xFFFFFFFFu;  // signal field unused by this op
inline constexpr uint32_t kMaxRanks = 1u << 20;     // ranks are 0 .. kMaxRanks-1
inline constexpr uint64_t kMaxCommandBytes = 1ull << 32;  // 4 GiB in one command
inline constexpr uint64_t kMaxOffset = (1ull << 48) - 1;  // 256 TiB into a region

// The wire record. Plain data: written by GPU threads with ordinary stores, read by the proxy
// with a copy. Do not add constructors or virtual members.
struct alignas(64) CommandRecord {
  uint64_t src_offset;    // byte offset into src_region
  uint64_t dst_offset;    // byte offset into dst_region on dst_rank
  uint64_t num_bytes;     // bytes to write; 0 for kOpSignal and kOpFence
  uint64_t signal_value;  // value the flag is raised to (launch sequence number), never 0
  uint64_t tag;           // opaque to the daemon; echoed in error reports (launch, tile)
  uint32_t dst_rank;      // destination rank in the communicator
  uint32_t signal_idx;    // flag index on dst_rank, or kNoSignal
  uint16_t src_region;    // source region id, or kNoRegion
  uint16_t dst_region;    // destination region id, or kNoRegion
  uint8_t op;             // enum Op
  uint8_t flags;          // must be 0 in protocol version 1
  uint16_t reserved0;     // must be 0
  uint32_t reserved1;     // must be 0
  uint32_t commit;        // written last: kCommitValid | lap (see ring.h)
};

static_assert(sizeof(CommandRecord) == 64, "a command record is one 64-byte slot");
static_assert(alignof(CommandRecord) == 64, "slots are cache-line aligned");
static_assert(std::is_trivially_copyable_v<CommandRecord>, "records are copied as bytes");
static_assert(std::is_standard_layout_v<CommandRecord>, "records have a fixed C layout");
static_assert(offsetof(CommandRecord, src_offset) == 0);
static_assert(offsetof(CommandRecord, dst_offset) == 8);
static_assert(offsetof(CommandRecord, num_bytes) == 16);
static_assert(offsetof(CommandRecord, signal_value) == 24);
static_assert(offsetof(CommandRecord, tag) == 32);
static_assert(offsetof(CommandRecord, dst_rank) == 40);
static_assert(offsetof(CommandRecord, signal_idx) == 44);
static_assert(offsetof(CommandRecord, src_region) == 48);
static_assert(offsetof(CommandRecord, dst_region) == 50);
static_assert(offsetof(CommandRecord, op) == 52);
static_assert(offsetof(CommandRecord, flags) == 53);
static_assert(offsetof(CommandRecord, reserved0) == 54);
static_assert(offsetof(CommandRecord, reserved1) == 56);
static_assert(offsetof(CommandRecord, commit) == 60, "the commit word is the slot's last word");

// A decoded, checked command: what the proxy acts on.
struct Command {
  Op op = kOpInvalid;
  uint32_t dst_rank = 0;
  uint16_t src_region = kNoRegion;
  uint16_t dst_region = kNoRegion;
  uint64_t src_offset = 0;
  uint64_t dst_offset = 0;
  uint64_t num_bytes = 0;
  uint32_t signal_idx = kNoSignal;
  uint64_t signal_value = 0;
  uint64_t tag = 0;

  MK_HOST_DEVICE constexpr bool operator==(const Command&) const = default;
};

// Builders for the four operations (host and device).
MK_HOST_DEVICE constexpr Command make_write(uint32_t dst_rank, uint16_t src_region,
                                            uint64_t src_offset, uint16_t dst_region,
                                            uint64_t dst_offset, uint64_t num_bytes,
                                            uint64_t tag = 0) {
  Command c;
  c.op = kOpWrite;
  c.dst_rank = dst_rank;
  c.src_region = src_region;
  c.src_offset = src_offset;
  c.dst_region = dst_region;
  c.dst_offset = dst_offset;
  c.num_bytes = num_bytes;
  c.tag = tag;
  return c;
}

MK_HOST_DEVICE constexpr Command make_write_signal(uint32_t dst_rank, uint16_t src_region,
                                                   uint64_t src_offset, uint16_t dst_region,
                                                   uint64_t dst_offset, uint64_t num_bytes,
                                                   uint32_t signal_idx, uint64_t signal_value,
                                                   uint64_t tag = 0) {
  Command c = make_write(dst_rank, src_region, src_offset, dst_region, dst_offset, num_bytes, tag);
  c.op = kOpWriteSignal;
  c.signal_idx = signal_idx;
  c.signal_value = signal_value;
  return c;
}

MK_HOST_DEVICE constexpr Command make_signal(uint32_t dst_rank, uint32_t signal_idx,
                                             uint64_t signal_value, uint64_t tag = 0) {
  Command c;
  c.op = kOpSignal;
  c.dst_rank = dst_rank;
  c.signal_idx = signal_idx;
  c.signal_value = signal_value;
  c.tag = tag;
  return c;
}

MK_HOST_DEVICE constexpr Command make_fence(uint64_t tag = 0) {
  Command c;
  c.op = kOpFence;
  c.tag = tag;
  return c;
}

// Fills every field of `r` except `commit`, which the producer writes last.
MK_HOST_DEVICE constexpr void encode_payload(const Command& c, CommandRecord& r) {
  r.src_offset = c.src_offset;
  r.dst_offset = c.dst_offset;
  r.num_bytes = c.num_bytes;
  r.signal_value = c.signal_value;
  r.tag = c.tag;
  r.dst_rank = c.dst_rank;
  r.signal_idx = c.signal_idx;
  r.src_region = c.src_region;
  r.dst_region = c.dst_region;
  r.op = c.op;
  r.flags = 0;
  r.reserved0 = 0;
  r.reserved1 = 0;
}

// ---- decoding untrusted records --------------------------------------------------------------

enum RejectReason : uint8_t {
  kRejectNone = 0,
  kRejectBadOp,            // op is not one of enum Op
  kRejectBadFlags,         // flags has bits this version does not define
  kRejectReservedNonzero,  // reserved0 / reserved1 not zero
  kRejectBadRank,          // dst_rank >= the communicator's size
  kRejectBadRegion,        // a region id out of range, or set where the op uses none
  kRejectZeroBytes,        // a write of 0 bytes
  kRejectTooLarge,         // num_bytes above the limit
  kRejectBadOffset,        // offset above kMaxOffset, or offset + num_bytes overflows
  kRejectBadSignal,        // signal index out of range, or set where the op raises none
  kRejectZeroSignalValue,  // a signal to value 0 would never be seen
  kRejectStrayField,       // a field the op does not use is not zero
  kNumRejectReasons,
};

MK_HOST_DEVICE constexpr const char* reject_reason_name(uint32_t r) {
  switch (r) {
    case kRejectNone: return "none";
    case kRejectBadOp: return "unknown op";
    case kRejectBadFlags: return "undefined flag bits";
    case kRejectReservedNonzero: return "reserved field not zero";
    case kRejectBadRank: return "dst_rank out of range";
    case kRejectBadRegion: return "region id out of range";
    case kRejectZeroBytes: return "zero-byte write";
    case kRejectTooLarge: return "num_bytes above limit";
    case kRejectBadOffset: return "offset out of range";
    case kRejectBadSignal: return "signal index out of range";
    case kRejectZeroSignalValue: return "signal value 0";
    case kRejectStrayField: return "field set that the op does not use";
    default: return "unknown reason";
  }
}

// What a consumer knows about the session that a record's fields are checked against. The
// defaults are the protocol's own limits; the daemon narrows them per session.
struct DecodeLimits {
  uint32_t num_ranks = kMaxRanks;
  uint32_t num_regions = kNoRegion;   // valid region ids: 0 .. num_regions-1
  uint32_t num_signals = kNoSignal;   // valid flag indices: 0 .. num_signals-1
  uint64_t max_bytes = kMaxCommandBytes;
};

struct DecodeResult {
  Command command;
  RejectReason reason = kRejectNone;
  MK_HOST_DEVICE constexpr bool ok() const { return reason == kRejectNone; }
};

namespace detail {
MK_HOST_DEVICE constexpr RejectReason check_write_fields(const CommandRecord& r,
                                                         const DecodeLimits& lim) {
  if (r.src_region >= lim.num_regions || r.dst_region >= lim.num_regions) return kRejectBadRegion;
  if (r.num_bytes == 0) return kRejectZeroBytes;
  if (r.num_bytes > lim.max_bytes || r.num_bytes > kMaxCommandBytes) return kRejectTooLarge;
  // Overflow-safe: both offsets are bounded first, so offset + num_bytes fits in 64 bits; the
  // region bounds themselves are the daemon's check (it owns the region table).
  if (r.src_offset > kMaxOffset || r.dst_offset > kMaxOffset) return kRejectBadOffset;
  if (r.src_offset + r.num_bytes > kMaxOffset + 1 || r.dst_offset + r.num_bytes > kMaxOffset + 1)
    return kRejectBadOffset;
  return kRejectNone;
}

MK_HOST_DEVICE constexpr RejectReason check_signal_fields(const CommandRecord& r,
                                                          const DecodeLimits& lim) {
  if (r.signal_idx == kNoSignal || r.signal_idx >= lim.num_signals) return kRejectBadSignal;
  if (r.signal_value == 0) return kRejectZeroSignalValue;
  return kRejectNone;
}
}  // namespace detail

// Checks a record that has already been copied out of shared memory. Never reads past `r`,
// never trusts a field before checking it. The commit word is not looked at: the ring checked it.
MK_HOST_DEVICE constexpr DecodeResult decode(const CommandRecord& r, const DecodeLimits& lim = {}) {
  DecodeResult out;
  if (r.op == kOpInvalid || r.op >= kNumOps) {
    out.reason = kRejectBadOp;
    return out;
  }
  if (r.flags != 0) {
    out.reason = kRejectBadFlags;
    return out;
  }
  if (r.reserved0 != 0 || r.reserved1 != 0) {
    out.reason = kRejectReservedNonzero;
    return out;
  }
  RejectReason why = kRejectNone;
  switch (r.op) {
    case kOpWrite:
      if (r.dst_rank >= lim.num_ranks) why = kRejectBadRank;
      else why = detail::check_write_fields(r, lim);
      if (why == kRejectNone && (r.signal_idx != kNoSignal || r.signal_value != 0))
        why = kRejectStrayField;
      break;
    case kOpWriteSignal:
      if (r.dst_rank >= lim.num_ranks) why = kRejectBadRank;
      else why = detail::check_write_fields(r, lim);
      if (why == kRejectNone) why = detail::check_signal_fields(r, lim);
      break;
    case kOpSignal:
      if (r.dst_rank >= lim.num_ranks) why = kRejectBadRank;
      else if (r.src_region != kNoRegion || r.dst_region != kNoRegion) why = kRejectBadRegion;
      else if (r.num_bytes != 0 || r.src_offset != 0 || r.dst_offset != 0)
        why = kRejectStrayField;
      else why = detail::check_signal_fields(r, lim);
      break;
    case kOpFence:
      if (r.src_region != kNoRegion || r.dst_region != kNoRegion) why = kRejectBadRegion;
      else if (r.dst_rank != 0 || r.num_bytes != 0 || r.src_offset != 0 || r.dst_offset != 0 ||
               r.signal_value != 0)
        why = kRejectStrayField;
      else if (r.signal_idx != kNoSignal) why = kRejectBadSignal;
      break;
    default: why = kRejectBadOp; break;
  }
  out.reason = why;
  if (why != kRejectNone) return out;
  out.command.op = static_cast<Op>(r.op);
  out.command.dst_rank = r.dst_rank;
  out.command.src_region = r.src_region;
  out.command.dst_region = r.dst_region;
  out.command.src_offset = r.src_offset;
  out.command.dst_offset = r.dst_offset;
  out.command.num_bytes = r.num_bytes;
  out.command.signal_idx = r.signal_idx;
  out.command.signal_value = r.signal_value;
  out.command.tag = r.tag;
  return out;
}

}  // namespace mkernel::protocol
