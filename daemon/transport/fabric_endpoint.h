// fabric_endpoint.h: the libfabric transport's endpoint class and the helpers its two source
// files share: fabric_open.cc (opening, addresses, registrations) and fabric_transport.cc (the
// data path: posting, completions, arrivals). Private to daemon/transport/: everyone else uses
// fabric_transport.h.
#pragma once

#include "fabric_transport.h"

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <deque>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace mkernel::daemon::net::fabric {

// ---- small helpers ------------------------------------------------------------------------------

inline std::string fi_error_text(int ret) {
  const int err = ret < 0 ? -ret : ret;
  return std::string(fi_strerror(err)) + " (" + std::to_string(ret) + ")";
}

inline Status fi_status(StatusCode code, std::string_view call, int ret) {
  return Status(code, std::string(call) + ": " + fi_error_text(ret));
}

inline std::string version_string(uint32_t version) {
  return std::to_string(FI_MAJOR(version)) + "." + std::to_string(FI_MINOR(version));
}

// Owns one libfabric object and closes it with fi_close.
template <class T>
class FidHandle {
 public:
  FidHandle() = default;
  explicit FidHandle(T* object) : object_(object) {}
  FidHandle(const FidHandle&) = delete;
  FidHandle& operator=(const FidHandle&) = delete;
  FidHandle(FidHandle&& other) noexcept : object_(std::exchange(other.object_, nullptr)) {}
  FidHandle& operator=(FidHandle&& other) noexcept {
    if (this != &other) {
      reset();
      object_ = std::exchange(other.object_, nullptr);
    }
    return *this;
  }
  ~FidHandle() { reset(); }

  void reset() {
    if (object_ != nullptr) (void)fi_close(&object_->fid);
    object_ = nullptr;
  }
  T* get() const { return object_; }
  T* operator->() const { return object_; }
  T** out() {
    reset();
    return &object_;
  }

 private:
  T* object_ = nullptr;
};

struct InfoDeleter {
  void operator()(fi_info* info) const { fi_freeinfo(info); }
};
using InfoPtr = std::unique_ptr<fi_info, InfoDeleter>;

inline char* dup_string(const std::string& text) {
  // libfabric frees hint strings with free() in fi_freeinfo.
  char* copy = static_cast<char*>(malloc(text.size() + 1));
  if (copy != nullptr) std::memcpy(copy, text.c_str(), text.size() + 1);
  return copy;
}

// Little-endian byte writer and reader for the blobs we hand to peers.
inline void put_u16(Blob* out, uint16_t v) {
  for (int i = 0; i < 2; ++i) out->push_back(static_cast<uint8_t>(v >> (8 * i)));
}
inline void put_u32(Blob* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<uint8_t>(v >> (8 * i)));
}
inline void put_u64(Blob* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<uint8_t>(v >> (8 * i)));
}

class Reader {
 public:
  explicit Reader(std::span<const uint8_t> bytes) : bytes_(bytes) {}
  bool u16(uint16_t* v) { return read(v, 2); }
  bool u32(uint32_t* v) { return read(v, 4); }
  bool u64(uint64_t* v) { return read(v, 8); }
  bool bytes(size_t n, std::span<const uint8_t>* out) {
    if (bytes_.size() - pos_ < n) return false;
    *out = bytes_.subspan(pos_, n);
    pos_ += n;
    return true;
  }
  bool done() const { return pos_ == bytes_.size(); }

 private:
  template <class T>
  bool read(T* v, size_t n) {
    if (bytes_.size() - pos_ < n) return false;
    uint64_t acc = 0;
    for (size_t i = 0; i < n; ++i) acc |= static_cast<uint64_t>(bytes_[pos_ + i]) << (8 * i);
    *v = static_cast<T>(acc);
    pos_ += n;
    return true;
  }
  std::span<const uint8_t> bytes_;
  size_t pos_ = 0;
};

#if defined(FI_MR_DMABUF)
constexpr bool kHaveMrDmabuf = true;
#else
constexpr bool kHaveMrDmabuf = false;
#endif

// Providers whose registrations hand a dmabuf descriptor to the NIC (ibv_reg_dmabuf_mr
// underneath). Others (tcp, shm, udp) would treat the GPU address as host memory.
inline bool dmabuf_native(const std::string& provider) {
  return provider.rfind("efa", 0) == 0 || provider.rfind("verbs", 0) == 0;
}

constexpr uint32_t kAddressMagic = 0x4d4b4641;  // "MKFA"
constexpr uint32_t kRegionMagic = 0x4d4b4652;   // "MKFR"
// Address blobs are version 2 since every endpoint keeps receives posted for signal messages
// (SignalValuePath::kMessage): an older peer would leave them unexpected and its waiters would
// time out, so the two refuse each other at add_peer instead. Region descriptors are unchanged.
constexpr uint16_t kAddressVersion = 2;
constexpr uint16_t kBlobVersion = 1;  // region descriptors
constexpr uint16_t kRegionWritable = 1;
constexpr size_t kMaxAddressBytes = 4096;
constexpr int kEagainRetries = 4;
constexpr size_t kCqBatch = 16;
constexpr size_t kMaxCqEntriesPerPoll = 1024;
constexpr size_t kScratchBytes = 64;

// Maps a completion error to the Status code the proxy acts on.
inline StatusCode completion_code(int err) {
  switch (err) {
    case FI_ECONNREFUSED:
    case FI_ECONNRESET:
    case FI_ECONNABORTED:
    case FI_ENOTCONN:
    case FI_EHOSTUNREACH:
    case FI_ENETUNREACH:
    case FI_ENETDOWN:
    case FI_ETIMEDOUT:
    case FI_EADDRNOTAVAIL:
      return StatusCode::kUnavailable;
    case FI_EACCES:
    case FI_EPERM:
    case FI_EKEYREJECTED:
      return StatusCode::kPermissionDenied;
    case FI_EINVAL:
    case FI_EMSGSIZE:
    case FI_ETOOSMALL:
      return StatusCode::kInvalidArgument;
    default:
      return StatusCode::kDeviceError;
  }
}

// ---- the transport ------------------------------------------------------------------------------

// One operation context. FI_CONTEXT / FI_CONTEXT2 mode: the provider owns `context` while the
// operation is outstanding, so it comes first and the slot is found from the pointer it returns.
// That pointer is trusted only once it is known to be one of the endpoint's slots (slot_of): an
// entry that names no operation of ours (a peer's write with remote CQ data, unless FI_RX_CQ_DATA
// made it consume a posted receive) carries an op_context fi_cq(3) leaves undefined, and shm
// (1.17 to 2.1 at least) fills it with a stale word of its shared command queue (1, the count of
// an RMA descriptor that used the slot before, once the queue wrapped).
struct OpSlot {
  fi_context2 context;
  // kTimedOut: a write already reported as kDeadlineExceeded whose context the provider still
  // holds; the slot is reused only once the provider hands it back.
  enum class Kind : uint8_t { kFree, kWrite, kReceive, kTimedOut } kind;
  // Where a write stands (design note 3 of fabric_transport.h). kOne: one operation (a write,
  // or fi_writedata with the signal in CQ data). A signal by message (kMessage path): kData while
  // the provider holds the data write, kSignalQueued once that completed and the message waits
  // for room in the provider's queue (we hold the context: nothing to quarantine), kSignal while
  // the provider holds the message. The Completion is reported once, at the end.
  // A write in pieces (design note 6): kPieceQueued while its next piece waits for its turn (we
  // hold the context), kPiece while the provider holds one piece; after the last piece it is
  // done, or goes on to kSignalQueued with a signal by message.
  enum class Phase : uint8_t { kOne, kData, kSignalQueued, kSignal, kPieceQueued, kPiece } phase;
  uint32_t signal_idx;
  uint64_t signal_value;
  uint64_t cookie;
  uint32_t peer;
  uint64_t generation;
  uint64_t local_region;  // a write's source registration (0: the scratch region)
  // A write in pieces: bytes already at the target, the piece the provider holds, the whole
  // write, where it comes from and goes to, and what the last piece carries.
  uint64_t piece_done;
  uint64_t piece_bytes;
  uint64_t total_bytes;
  uint8_t* local_buf;
  void* local_desc;
  uint64_t remote_addr;
  uint64_t remote_key;
  uint64_t cq_data;
  enum class PieceSignal : uint8_t { kNone, kCqData, kMessage } piece_signal;
};
static_assert(std::is_standard_layout_v<OpSlot>);

struct LocalRegion {
  FidHandle<fid_mr> mr;
  void* addr = nullptr;
  size_t length = 0;
  bool remote_writable = false;
  uint32_t inflight = 0;  // writes reading from it the provider has not handed back
};

struct RemoteRegion {
  uint32_t peer = 0;
  uint64_t key = 0;
  uint64_t base = 0;
  uint64_t length = 0;
  bool writable = false;
};

struct Peer {
  fi_addr_t addr = FI_ADDR_NOTAVAIL;
  uint64_t scratch_key = 0;
  uint64_t scratch_base = 0;
};

class FabricTransport final : public Transport {
 public:
  FabricTransport() = default;
  FabricTransport(const FabricTransport&) = delete;
  FabricTransport& operator=(const FabricTransport&) = delete;
  ~FabricTransport() override {
    // Registrations bound to the endpoint go first; then the members in reverse declaration
    // order: endpoint, address vector, completion queue, domain, fabric, info.
    regions_.clear();
    messages_mr_.reset();
    scratch_mr_.reset();
  }

  Status open(const FabricOptions& options);

  const Capabilities& capabilities() const override { return caps_; }
  StatusOr<Blob> local_address() override;
  StatusOr<uint32_t> add_peer(std::span<const uint8_t> address) override;
  StatusOr<Registration> register_memory(const RegisterRequest& request) override;
  Status deregister_memory(uint64_t local_id) override;
  StatusOr<uint64_t> import_region(uint32_t peer, std::span<const uint8_t> descriptor) override;
  Status post_write(const WriteOp& op) override;
  size_t poll(std::vector<Completion>* completions, std::vector<Arrival>* arrivals) override;
  Status set_signal_region(uint64_t local_id) override;
  const Status& async_error() const override { return broken_; }

 private:
  Status find_info(const FabricOptions& options);
  bool probe_hmem(const FabricOptions& options) const;
  fi_info* make_hints(const FabricOptions& options, uint64_t extra_caps, size_t cq_data) const;
  // Host memory at addr, or (dmabuf != nullptr) GPU memory given by a dmabuf descriptor.
  StatusOr<FidHandle<fid_mr>> register_range(void* addr, size_t length, uint64_t access,
                                              uint64_t* key, const RegisterRequest* dmabuf = nullptr);
  // Posts (or posts again) a receive into the slot's message buffer. kDeviceError with the
  // provider's reason; the slot is then free again.
  Status post_receive(OpSlot* slot, bool progress_on_eagain);
  uint8_t* message_buffer(const OpSlot* slot) {
    return messages_.data() + static_cast<size_t>(slot - slots_.get()) * kSignalMessageBytes;
  }
  // Sends a write's signal message (kMessage path); the provider's return value.
  ssize_t send_signal_message(OpSlot* slot);
  // Posts the signal messages waiting for room (signal_queue_) until the provider says it is
  // full; never calls progress().
  void post_queued_signals();
  // Posts the next piece of the oldest write in pieces (piece_queue_) when the provider holds
  // none of it; never calls progress().
  void post_queued_pieces();
  // Reports a write's Completion and gives its slot back.
  void finish_write(OpSlot* slot, Status status);
  // A receive completed with a signal message: an Arrival, never below the last one reported
  // for the same (peer, flag).
  void receive_signal_message(OpSlot* slot, size_t length, fi_addr_t source);
  OpSlot* take_slot(OpSlot::Kind kind);
  void free_slot(OpSlot* slot);
  // A write's slot comes back from the provider: its source registration is free again.
  void release_source(OpSlot* slot);
  // The endpoint can no longer receive peers' signals: keep the first reason (async_error).
  void break_endpoint(const std::string& why);
  // Reads the completion queue into pending_completions_ / pending_arrivals_.
  void progress();
  void handle_entry(const fi_cq_data_entry& entry, fi_addr_t source);
  void handle_error();
  // Reports writes the provider has not completed within completion_timeout_.
  void expire();
  uint32_t peer_of(fi_addr_t source) const;
  // The slot whose context is `context`, found by address alone (nothing is read through it);
  // nullptr when it is not one of this endpoint's slots (OpSlot).
  OpSlot* slot_of(const void* context) const;

  // Declaration order is creation order; members are destroyed in reverse.
  InfoPtr info_;
  Capabilities caps_;
  SignalEncoding encoding_;
  SignalValuePath signal_path_ = SignalValuePath::kCqData;  // never kAuto once open
  uint64_t mr_mode_ = 0;
  bool have_source_ = false;
  bool hmem_ = false;  // the endpoint was opened with FI_HMEM
  bool delivery_complete_ = false;
  bool rx_cq_data_ = false;
  std::mt19937_64 key_rng_{std::random_device{}()};
  uint64_t next_local_id_ = 1;
  uint64_t next_remote_id_ = 1;
  uint32_t inflight_ = 0;
  std::chrono::milliseconds completion_timeout_{0};
  struct Deadline {
    std::chrono::steady_clock::time_point at;
    OpSlot* slot;
    uint64_t generation;
  };
  std::deque<Deadline> deadlines_;  // in post order; the timeout is fixed, so sorted
  uint64_t late_completions_ = 0;
  std::unique_ptr<OpSlot[]> slots_;
  size_t num_slots_ = 0;
  std::vector<OpSlot*> free_slots_;
  std::vector<Completion> pending_completions_;
  std::vector<Arrival> pending_arrivals_;
  std::vector<Peer> peers_;
  std::unordered_map<fi_addr_t, uint32_t> peer_by_addr_;
  std::unordered_map<uint64_t, RemoteRegion> remote_regions_;
  // (peer << 32 | signal_idx) -> last value: sent (checks the encoding's limit) and received.
  std::unordered_map<uint64_t, uint64_t> last_sent_;
  std::unordered_map<uint64_t, uint64_t> last_received_;
  // (peer << 32 | signal_idx) -> last value reported from a signal message.
  std::unordered_map<uint64_t, uint64_t> last_message_value_;
  // Writes whose data completed and whose signal message the provider had no room for yet.
  struct QueuedSignal {
    OpSlot* slot;
    uint64_t generation;
  };
  std::deque<QueuedSignal> signal_queue_;
  // Writes in pieces, in post order: the head's pieces go one at a time (design note 6).
  uint64_t piece_bytes_ = 0;  // 0: whole writes
  std::deque<QueuedSignal> piece_queue_;
  // Receives of something that is not a signal message (wrong length or magic); dropped.
  uint64_t foreign_messages_ = 0;
  // Errors with no write to report them on (a receive that could not be re-posted, an error
  // entry for a receive or with no context). Those that lose peers' signals break the endpoint.
  uint64_t receive_errors_ = 0;
  std::string receive_error_;
  // Our own side's entries whose op_context is none of our slots (never expected; the write they
  // would have finished is then reported by its completion timeout).
  uint64_t stray_entries_ = 0;
  Status broken_;
  std::vector<uint8_t> scratch_;
  // One kSignalMessageBytes buffer per operation slot (slot i uses bytes [16 i, 16 i + 16)): a
  // receive's landing place, or a write's outgoing signal message. Registered (messages_mr_).
  std::vector<uint8_t> messages_;

  FidHandle<fid_fabric> fabric_;
  FidHandle<fid_domain> domain_;
  FidHandle<fid_cq> cq_;
  FidHandle<fid_av> av_;
  FidHandle<fid_ep> ep_;
  FidHandle<fid_mr> scratch_mr_;
  uint64_t scratch_key_ = 0;
  FidHandle<fid_mr> messages_mr_;
  uint64_t messages_key_ = 0;
  std::unordered_map<uint64_t, LocalRegion> regions_;
  Blob name_;
};

}  // namespace mkernel::daemon::net::fabric
