// ring_host.h: the host half of the command ring: segment setup, the single consumer a proxy
// runs, and a host-thread producer used by host clients and tests in place of GPU threads.
//
// Design notes
//  1. The consumer owns its position (`tail_`) and its copy of the capacity; nothing it reads from
//     shared memory steers its indexing. A record is copied out of the slot after the commit word
//     is acquired, the slot is zeroed, and only the private copy is decoded.
//  2. `tail` is published with release ordering every `tail_batch` records and at the end of every
//     poll that took something, so producers waiting for space always see progress.
//  3. The producer's every wait is bounded by a deadline; expiry returns kRingTimeout and records
//     the abandoned position in the header's client error line.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

#include "mkernel/protocol/command.h"
#include "mkernel/protocol/ring.h"
#include "mkernel/protocol/status.h"

namespace mkernel::protocol {

// Pointers into one mapped ring segment.
struct RingView {
  RingHeader* header = nullptr;
  CommandRecord* slots = nullptr;
  uint32_t capacity_log2 = 0;

  uint64_t capacity() const { return uint64_t{1} << capacity_log2; }
};

// Lays out a fresh ring in `segment` (at least ring_segment_bytes(capacity_log2) bytes, 64-byte
// aligned): writes the identity line, zeroes every counter and slot. Returns an empty string on
// success, otherwise what was wrong (field, value, expectation).
std::string init_ring(void* segment, size_t segment_bytes, uint32_t capacity_log2,
                      uint64_t ring_id, uint64_t epoch, RingView* out);

// As init_ring for a segment already known to be all zeros (a fresh memfd or anonymous
// mapping): writes the header only, so the cost does not grow with the capacity and the slots'
// pages are not touched (they are allocated when producers first write them).
std::string init_ring_on_zeroed(void* segment, size_t segment_bytes, uint32_t capacity_log2,
                                uint64_t ring_id, uint64_t epoch, RingView* out);

// Checks the identity line of a ring someone else created and returns a view of it. The
// capacity is checked against the segment's real size, which the caller takes from the
// descriptor, never from the header alone.
std::string attach_ring(void* segment, size_t segment_bytes, RingView* out);

struct ConsumerStats {
  uint64_t consumed = 0;  // records taken off the ring (= accepted + rejected)
  uint64_t accepted = 0;
  uint64_t rejected = 0;
  std::array<uint64_t, kNumRejectReasons> rejected_by_reason{};
};

struct ConsumerOptions {
  DecodeLimits limits;
  uint32_t tail_batch = 32;  // publish tail at least every this many records
};

class RingConsumer {
 public:
  RingConsumer(const RingView& view, const ConsumerOptions& options = {});

  // Takes up to `max_records` committed records in order. Calls on_command(const Command&,
  // uint64_t pos) for each record that decodes and on_reject(const CommandRecord& copy,
  // RejectReason, uint64_t pos) for each that does not. A callback that returns bool stops the
  // poll after its record by returning false. Returns the number taken. Never blocks.
  template <class OnCommand, class OnReject>
  size_t poll(size_t max_records, OnCommand&& on_command, OnReject&& on_reject);

  // Publishes the consumer position now (release).
  void publish_tail();
  // Adds to the completion counter (release): `n` more commands were carried out.
  void add_completed(uint64_t n);
  // Stops the producers: stores the error line (first error wins).
  void set_error(uint32_t code, uint32_t detail, uint64_t pos);
  void set_epoch(uint64_t epoch);

  // The producer side's report of an abandoned position, if any (code 0 = none).
  uint32_t client_error(uint32_t* detail = nullptr, uint64_t* pos = nullptr) const;
  // Committed-or-claimed records not yet taken, from the producers' head hint, clamped to
  // [0, capacity]: a hostile head never produces a nonsense figure.
  uint64_t occupancy() const;
  // True when the slot at the current position has a commit word that is neither zero nor the
  // expected one: a producer wrote a wrong lap (a bug or a hostile client).
  bool slot_has_foreign_commit() const;

  uint64_t tail() const { return tail_; }
  const ConsumerStats& stats() const { return stats_; }
  const RingView& view() const { return view_; }

 private:
  RingView view_;
  uint64_t mask_;
  ConsumerOptions options_;
  uint64_t tail_ = 0;
  uint64_t unpublished_ = 0;
  ConsumerStats stats_;
};

// A producer for host threads: claims on the header's head, so any number of threads (and
// processes) may share one ring.
class HostRingProducer {
 public:
  explicit HostRingProducer(const RingView& view, uint64_t expected_epoch = 0);

  // Pushes one command. Waits at most `timeout` for space; on expiry returns kRingTimeout and
  // marks the claimed position abandoned in the header. `pos_out` receives the position.
  RingStatus push(const Command& command, std::chrono::nanoseconds timeout,
                  uint64_t* pos_out = nullptr);
  // Pushes `commands` into consecutive positions with one claim and one wait.
  RingStatus push_batch(std::span<const Command> commands, std::chrono::nanoseconds timeout,
                        uint64_t* first_pos_out = nullptr);

 private:
  RingStatus wait_for_space(uint64_t last_pos, std::chrono::nanoseconds timeout);
  void abandon(uint64_t first_pos, uint64_t count, RingStatus why);

  RingView view_;
  uint64_t mask_;
  uint64_t expected_epoch_;
};

// ---- inline -----------------------------------------------------------------------------------

namespace detail {
// Calls f(args...); a void result means "go on".
template <class F, class... Args>
bool invoke_callback(F& f, Args&&... args) {
  if constexpr (std::is_same_v<decltype(f(std::forward<Args>(args)...)), void>) {
    f(std::forward<Args>(args)...);
    return true;
  } else {
    return static_cast<bool>(f(std::forward<Args>(args)...));
  }
}
}  // namespace detail
using detail::invoke_callback;

template <class OnCommand, class OnReject>
size_t RingConsumer::poll(size_t max_records, OnCommand&& on_command, OnReject&& on_reject) {
  size_t taken = 0;
  while (taken < max_records) {
    CommandRecord* slot = &view_.slots[tail_ & mask_];
    const uint32_t want = commit_word(tail_, view_.capacity_log2);
    if (std::atomic_ref<uint32_t>(slot->commit).load(std::memory_order_acquire) != want) break;
    // Copy out first, then look at the private copy only.
    CommandRecord copy;
    std::memcpy(&copy, slot, sizeof(copy));
    std::memset(slot, 0, offsetof(CommandRecord, commit));
    std::atomic_ref<uint32_t>(slot->commit).store(0, std::memory_order_relaxed);
    const uint64_t pos = tail_++;
    ++taken;
    ++stats_.consumed;
    const DecodeResult d = decode(copy, options_.limits);
    bool go_on = true;
    if (d.ok()) {
      ++stats_.accepted;
      go_on = invoke_callback(on_command, d.command, pos);
    } else {
      ++stats_.rejected;
      ++stats_.rejected_by_reason[d.reason];
      go_on = invoke_callback(on_reject, copy, d.reason, pos);
    }
    if (++unpublished_ >= options_.tail_batch) publish_tail();
    if (!go_on) break;
  }
  if (unpublished_ != 0) publish_tail();
  return taken;
}

}  // namespace mkernel::protocol
