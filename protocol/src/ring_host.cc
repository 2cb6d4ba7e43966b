#include "mkernel/protocol/ring_host.h"

#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define MK_CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define MK_CPU_RELAX() asm volatile("yield" ::: "memory")
#else
#define MK_CPU_RELAX() ((void)0)
#endif

namespace mkernel::protocol {
namespace {

template <class T>
T load_acquire(T& field) {
  return std::atomic_ref<T>(field).load(std::memory_order_acquire);
}

template <class T>
void store_release(T& field, T value) {
  std::atomic_ref<T>(field).store(value, std::memory_order_release);
}

std::string check_geometry(const void* segment, size_t segment_bytes, uint32_t capacity_log2) {
  if (segment == nullptr) return "segment: null pointer; expected a mapped ring segment";
  if (reinterpret_cast<uintptr_t>(segment) % alignof(RingHeader) != 0)
    return "segment: address not 64-byte aligned; expected a page-aligned mapping";
  if (!valid_capacity_log2(capacity_log2))
    return "capacity_log2: " + std::to_string(capacity_log2) + "; expected " +
           std::to_string(kMinCapacityLog2) + ".." + std::to_string(kMaxCapacityLog2);
  if (segment_bytes < ring_segment_bytes(capacity_log2))
    return "segment size: " + std::to_string(segment_bytes) + " bytes; expected at least " +
           std::to_string(ring_segment_bytes(capacity_log2)) + " for 2^" +
           std::to_string(capacity_log2) + " slots";
  return {};
}

std::string write_ring_header(void* segment, uint32_t capacity_log2, uint64_t ring_id, uint64_t epoch,
                              RingView* out) {
  auto* header = static_cast<RingHeader*>(segment);
  header->magic = kRingMagic;
  header->version = kProtocolVersion;
  header->capacity_log2 = capacity_log2;
  header->record_size = sizeof(CommandRecord);
  header->ring_id = ring_id;
  header->epoch = epoch;
  std::atomic_thread_fence(std::memory_order_release);
  out->header = header;
  out->slots = reinterpret_cast<CommandRecord*>(static_cast<char*>(segment) + kRingSlotsOffset);
  out->capacity_log2 = capacity_log2;
  return {};
}

}  // namespace

std::string init_ring(void* segment, size_t segment_bytes, uint32_t capacity_log2,
                      uint64_t ring_id, uint64_t epoch, RingView* out) {
  if (std::string err = check_geometry(segment, segment_bytes, capacity_log2); !err.empty())
    return err;
  std::memset(segment, 0, ring_segment_bytes(capacity_log2));
  return write_ring_header(segment, capacity_log2, ring_id, epoch, out);
}

std::string init_ring_on_zeroed(void* segment, size_t segment_bytes, uint32_t capacity_log2,
                                uint64_t ring_id, uint64_t epoch, RingView* out) {
  if (std::string err = check_geometry(segment, segment_bytes, capacity_log2); !err.empty())
    return err;
  return write_ring_header(segment, capacity_log2, ring_id, epoch, out);
}

std::string attach_ring(void* segment, size_t segment_bytes, RingView* out) {
  if (segment == nullptr || segment_bytes < sizeof(RingHeader))
    return "segment size: " + std::to_string(segment_bytes) + " bytes; expected at least " +
           std::to_string(sizeof(RingHeader)) + " for a ring header";
  const auto* header = static_cast<const RingHeader*>(segment);
  if (header->magic != kRingMagic)
    return "ring magic: " + std::to_string(header->magic) + "; expected " +
           std::to_string(kRingMagic);
  if (header->version != kProtocolVersion)
    return "ring protocol version: " + std::to_string(header->version) + "; expected " +
           std::to_string(kProtocolVersion);
  if (header->record_size != sizeof(CommandRecord))
    return "ring record_size: " + std::to_string(header->record_size) + "; expected " +
           std::to_string(sizeof(CommandRecord));
  if (std::string err = check_geometry(segment, segment_bytes, header->capacity_log2);
      !err.empty())
    return err;
  out->header = static_cast<RingHeader*>(segment);
  out->slots = reinterpret_cast<CommandRecord*>(static_cast<char*>(segment) + kRingSlotsOffset);
  out->capacity_log2 = header->capacity_log2;
  return {};
}

// ---- consumer ---------------------------------------------------------------------------------

RingConsumer::RingConsumer(const RingView& view, const ConsumerOptions& options)
    : view_(view), mask_(view.capacity() - 1), options_(options) {
  if (options_.tail_batch == 0) options_.tail_batch = 1;
  tail_ = load_acquire(view_.header->tail);
}

void RingConsumer::publish_tail() {
  store_release(view_.header->tail, tail_);
  unpublished_ = 0;
}

void RingConsumer::add_completed(uint64_t n) {
  std::atomic_ref<uint64_t>(view_.header->completed).fetch_add(n, std::memory_order_release);
}

void RingConsumer::set_error(uint32_t code, uint32_t detail, uint64_t pos) {
  std::atomic_ref<uint32_t> err(view_.header->error);
  if (err.load(std::memory_order_acquire) != 0) return;
  view_.header->error_detail = detail;
  view_.header->error_pos = pos;
  err.store(code, std::memory_order_release);
}

void RingConsumer::set_epoch(uint64_t epoch) { store_release(view_.header->epoch, epoch); }

uint32_t RingConsumer::client_error(uint32_t* detail, uint64_t* pos) const {
  const uint32_t code = load_acquire(view_.header->client_error);
  if (code != 0) {
    if (detail) *detail = std::atomic_ref<uint32_t>(view_.header->client_detail).load(std::memory_order_relaxed);
    if (pos) *pos = std::atomic_ref<uint64_t>(view_.header->client_pos).load(std::memory_order_relaxed);
  }
  return code;
}

uint64_t RingConsumer::occupancy() const {
  const uint64_t head = std::atomic_ref<uint64_t>(view_.header->head).load(std::memory_order_relaxed);
  if (head <= tail_) return 0;
  const uint64_t ahead = head - tail_;
  return ahead > view_.capacity() ? view_.capacity() : ahead;
}

bool RingConsumer::slot_has_foreign_commit() const {
  const uint32_t c = std::atomic_ref<uint32_t>(view_.slots[tail_ & mask_].commit)
                         .load(std::memory_order_relaxed);
  return c != 0 && c != commit_word(tail_, view_.capacity_log2);
}

// ---- host producer ----------------------------------------------------------------------------

HostRingProducer::HostRingProducer(const RingView& view, uint64_t expected_epoch)
    : view_(view), mask_(view.capacity() - 1), expected_epoch_(expected_epoch) {}

RingStatus HostRingProducer::wait_for_space(uint64_t last_pos, std::chrono::nanoseconds timeout) {
  const uint64_t cap = view_.capacity();
  if (last_pos - load_acquire(view_.header->tail) < cap) return kRingOk;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (uint32_t spin = 0;; ++spin) {
    if (last_pos - load_acquire(view_.header->tail) < cap) return kRingOk;
    if ((spin & 63) == 0) {
      if (load_acquire(view_.header->error) != 0) return kRingConsumerError;
      if (load_acquire(view_.header->epoch) != expected_epoch_) return kRingEpochChanged;
      if (std::chrono::steady_clock::now() >= deadline) return kRingTimeout;
    }
    if (spin < 1024) MK_CPU_RELAX();
    else std::this_thread::yield();
  }
}

void HostRingProducer::abandon(uint64_t first_pos, uint64_t count, RingStatus why) {
  // First abandonment wins; later ones would only repeat that the ring is stuck.
  uint32_t expected = 0;
  std::atomic_ref<uint32_t> code(view_.header->client_error);
  if (code.load(std::memory_order_relaxed) != 0) return;
  view_.header->client_detail = static_cast<uint32_t>(count);
  view_.header->client_pos = first_pos;
  code.compare_exchange_strong(expected, why, std::memory_order_release, std::memory_order_relaxed);
}

RingStatus HostRingProducer::push(const Command& command, std::chrono::nanoseconds timeout,
                                  uint64_t* pos_out) {
  return push_batch(std::span<const Command>(&command, 1), timeout, pos_out);
}

RingStatus HostRingProducer::push_batch(std::span<const Command> commands,
                                        std::chrono::nanoseconds timeout,
                                        uint64_t* first_pos_out) {
  const uint64_t n = commands.size();
  if (n == 0 || n > view_.capacity()) return kRingInvalidArgument;
  const uint64_t first = std::atomic_ref<uint64_t>(view_.header->head)
                             .fetch_add(n, std::memory_order_relaxed);
  if (first_pos_out) *first_pos_out = first;
  if (const RingStatus s = wait_for_space(first + n - 1, timeout); s != kRingOk) {
    abandon(first, n, s);
    return s;
  }
  for (uint64_t i = 0; i < n; ++i) {
    CommandRecord* slot = &view_.slots[(first + i) & mask_];
    encode_payload(commands[i], *slot);
    store_release(slot->commit, commit_word(first + i, view_.capacity_log2));
  }
  return kRingOk;
}

}  // namespace mkernel::protocol
