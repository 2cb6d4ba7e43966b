// fabric_transport.cc: net::Transport over libfabric RDM endpoints. See fabric_transport.h.
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
#include <deque>
#include <random>
#include <cstring>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace mkernel::daemon::net {
namespace {

// ---- small helpers ------------------------------------------------------------------------------

std::string fi_error_text(int ret) {
  const int err = ret < 0 ? -ret : ret;
  return std::string(fi_strerror(err)) + " (" + std::to_string(ret) + ")";
}

Status fi_status(StatusCode code, std::string_view call, int ret) {
  return Status(code, std::string(call) + ": " + fi_error_text(ret));
}

std::string version_string(uint32_t version) {
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

char* dup_string(const std::string& text) {
  // libfabric frees hint strings with free() in fi_freeinfo.
  char* copy = static_cast<char*>(malloc(text.size() + 1));
  if (copy != nullptr) std::memcpy(copy, text.c_str(), text.size() + 1);
  return copy;
}

// Little-endian byte writer and reader for the blobs we hand to peers.
void put_u16(Blob* out, uint16_t v) {
  for (int i = 0; i < 2; ++i) out->push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void put_u32(Blob* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void put_u64(Blob* out, uint64_t v) {
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
bool dmabuf_native(const std::string& provider) {
  return provider.rfind("efa", 0) == 0 || provider.rfind("verbs", 0) == 0;
}

constexpr uint32_t kAddressMagic = 0x4d4b4641;  // "MKFA"
constexpr uint32_t kRegionMagic = 0x4d4b4652;   // "MKFR"
constexpr uint16_t kBlobVersion = 1;
constexpr uint16_t kRegionWritable = 1;
constexpr size_t kMaxAddressBytes = 4096;
constexpr int kEagainRetries = 4;
constexpr size_t kCqBatch = 16;
constexpr size_t kMaxCqEntriesPerPoll = 1024;
constexpr size_t kScratchBytes = 64;

// Maps a completion error to the Status code the proxy acts on.
StatusCode completion_code(int err) {
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
struct OpSlot {
  fi_context2 context;
  // kTimedOut: a write already reported as kDeadlineExceeded whose context the provider still
  // holds; the slot is reused only once the provider hands it back.
  enum class Kind : uint8_t { kFree, kWrite, kReceive, kTimedOut } kind;
  uint64_t cookie;
  uint32_t peer;
  uint64_t generation;
  uint64_t local_region;  // a write's source registration (0: the scratch region)
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
  Status post_receive(OpSlot* slot);
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

  // Declaration order is creation order; members are destroyed in reverse.
  InfoPtr info_;
  Capabilities caps_;
  SignalEncoding encoding_;
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
  // Errors with no write to report them on (a receive that could not be re-posted, an error
  // entry for a receive or with no context). Those that lose peers' signals break the endpoint.
  uint64_t receive_errors_ = 0;
  std::string receive_error_;
  Status broken_;
  std::vector<uint8_t> scratch_;

  FidHandle<fid_fabric> fabric_;
  FidHandle<fid_domain> domain_;
  FidHandle<fid_cq> cq_;
  FidHandle<fid_av> av_;
  FidHandle<fid_ep> ep_;
  FidHandle<fid_mr> scratch_mr_;
  uint64_t scratch_key_ = 0;
  std::unordered_map<uint64_t, LocalRegion> regions_;
  Blob name_;
};

fi_info* FabricTransport::make_hints(const FabricOptions& options, uint64_t extra_caps,
                                     size_t cq_data) const {
  fi_info* hints = fi_allocinfo();
  if (hints == nullptr) return nullptr;
  hints->ep_attr->type = FI_EP_RDM;
  // FI_MSG for the receives FI_RX_CQ_DATA providers consume; FI_REMOTE_CQ_DATA is no
  // capability bit: the CQ data size is asked for below.
  hints->caps = FI_RMA | FI_WRITE | FI_REMOTE_WRITE | FI_MSG | FI_SEND | FI_RECV | extra_caps;
  hints->mode = FI_CONTEXT | FI_CONTEXT2 | FI_RX_CQ_DATA;
  hints->domain_attr->mr_mode =
      FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
  if ((extra_caps & FI_HMEM) != 0) hints->domain_attr->mr_mode |= FI_MR_HMEM;
  hints->domain_attr->cq_data_size = cq_data;
  hints->domain_attr->threading = FI_THREAD_DOMAIN;
  hints->domain_attr->data_progress = FI_PROGRESS_MANUAL;
  hints->domain_attr->av_type = FI_AV_TABLE;
  if (!options.provider.empty()) hints->fabric_attr->prov_name = dup_string(options.provider);
  if (!options.domain.empty()) hints->domain_attr->name = dup_string(options.domain);
  return hints;
}

Status FabricTransport::find_info(const FabricOptions& options) {
  // Most wanted first, then settle for less: delivery-complete writes (an ok Completion means
  // the data is in the target's memory, the contract's promise, not only that it left this
  // host), FI_SOURCE (an arrival names its peer), 8-byte CQ data.
  struct Attempt {
    uint64_t caps;
    size_t cq_data;
    uint64_t op_flags;
  };
  constexpr uint64_t kDc = FI_DELIVERY_COMPLETE;
  constexpr std::array<Attempt, 8> kAttempts{{{FI_SOURCE, 8, kDc},
                                              {FI_SOURCE, 4, kDc},
                                              {0, 8, kDc},
                                              {0, 4, kDc},
                                              {FI_SOURCE, 8, 0},
                                              {FI_SOURCE, 4, 0},
                                              {0, 8, 0},
                                              {0, 4, 0}}};
  int last = -FI_ENODATA;
  // Providers that register GPU memory through dmabuf (see dmabuf_native) are asked for
  // FI_HMEM first; without it they are taken as they come, with host staging.
  const bool want_hmem = kHaveMrDmabuf && dmabuf_native(options.provider);
  for (int pass = want_hmem ? 0 : 1; pass < 2; ++pass)
  for (const Attempt& attempt : kAttempts) {
    InfoPtr hints(make_hints(options, attempt.caps | (pass == 0 ? FI_HMEM : 0), attempt.cq_data));
    if (!hints) return Status(StatusCode::kResourceExhausted, "fi_allocinfo failed");
    hints->tx_attr->op_flags = attempt.op_flags;
    fi_info* found = nullptr;
    last = fi_getinfo(FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION), nullptr, nullptr, 0,
                      hints.get(), &found);
    if (last == 0 && found != nullptr) {
      // Layered providers (tcp;ofi_rxm) do not filter on the domain name: pick it here.
      fi_info* pick = found;
      if (!options.domain.empty()) {
        pick = nullptr;
        for (fi_info* it = found; it != nullptr && pick == nullptr; it = it->next) {
          if (it->domain_attr->name != nullptr && options.domain == it->domain_attr->name) {
            pick = it;
          }
        }
      }
      if (pick == nullptr) {
        std::string names;
        for (fi_info* it = found; it != nullptr; it = it->next) {
          const std::string name = it->domain_attr->name != nullptr ? it->domain_attr->name : "?";
          if (names.find(name) == std::string::npos) names += (names.empty() ? "" : ", ") + name;
        }
        fi_freeinfo(found);
        return Status(StatusCode::kNotFound, "fi_getinfo: provider '" + options.provider +
                                                 "' has no domain '" + options.domain +
                                                 "' (it offers: " + names + ")");
      }
      fi_info* chosen = fi_dupinfo(pick);
      fi_freeinfo(found);
      if (chosen == nullptr) return Status(StatusCode::kResourceExhausted, "fi_dupinfo failed");
      info_.reset(chosen);
      have_source_ = (info_->caps & FI_SOURCE) != 0;
      hmem_ = (info_->caps & FI_HMEM) != 0;
      delivery_complete_ = (info_->tx_attr->op_flags & FI_DELIVERY_COMPLETE) != 0;
      return Status::Ok();
    }
  }
  return Status(StatusCode::kNotFound,
                "fi_getinfo: no RDM endpoint with RMA writes for provider '" +
                    (options.provider.empty() ? std::string("any") : options.provider) +
                    "'" + (options.domain.empty() ? "" : " domain '" + options.domain + "'") +
                    ": " + fi_error_text(last));
}

bool FabricTransport::probe_hmem(const FabricOptions& options) const {
  FabricOptions same = options;
  same.provider = info_->fabric_attr->prov_name != nullptr ? info_->fabric_attr->prov_name : "";
  same.domain = info_->domain_attr->name != nullptr ? info_->domain_attr->name : "";
  InfoPtr hints(make_hints(same, FI_HMEM, info_->domain_attr->cq_data_size));
  if (!hints) return false;
  fi_info* found = nullptr;
  const int ret = fi_getinfo(FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION), nullptr, nullptr, 0,
                             hints.get(), &found);
  if (found != nullptr) fi_freeinfo(found);
  return ret == 0;
}

Status FabricTransport::open(const FabricOptions& options) {
  if (options.max_inflight == 0) {
    return Status(StatusCode::kInvalidArgument, "max_inflight: 0; expected at least 1");
  }
  if (options.completion_timeout_ms == 0) {
    return Status(StatusCode::kInvalidArgument,
                  "completion_timeout_ms: 0; expected at least 1 (every wait is bounded)");
  }
  completion_timeout_ = std::chrono::milliseconds(options.completion_timeout_ms);
  MK_RETURN_IF_ERROR(find_info(options));
  mr_mode_ = info_->domain_attr->mr_mode;
  if ((mr_mode_ & FI_MR_RAW) != 0) {
    return Status(StatusCode::kFailedPrecondition,
                  "provider requires FI_MR_RAW keys, which this transport does not carry");
  }
  rx_cq_data_ = (info_->mode & FI_RX_CQ_DATA) != 0;
  encoding_ = signal_encoding_for(info_->domain_attr->cq_data_size);

  int ret = fi_fabric(info_->fabric_attr, fabric_.out(), nullptr);
  if (ret != 0) return fi_status(StatusCode::kDeviceError, "fi_fabric", ret);
  ret = fi_domain(fabric_.get(), info_.get(), domain_.out(), nullptr);
  if (ret != 0) return fi_status(StatusCode::kDeviceError, "fi_domain", ret);

  uint32_t max_inflight = options.max_inflight;
  if (info_->tx_attr->size > 0 && info_->tx_attr->size < max_inflight) {
    max_inflight = static_cast<uint32_t>(info_->tx_attr->size);
  }
  uint32_t receives = 0;
  if (rx_cq_data_) {
    receives = std::max<uint32_t>(1, options.posted_receives);
    if (info_->rx_attr->size > 0 && info_->rx_attr->size < receives) {
      receives = static_cast<uint32_t>(info_->rx_attr->size);
    }
  }

  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_DATA;
  cq_attr.wait_obj = FI_WAIT_NONE;
  cq_attr.size = static_cast<size_t>(max_inflight) + receives + 1024;
  ret = fi_cq_open(domain_.get(), &cq_attr, cq_.out(), nullptr);
  if (ret != 0) return fi_status(StatusCode::kDeviceError, "fi_cq_open", ret);

  fi_av_attr av_attr{};
  av_attr.type = FI_AV_TABLE;
  av_attr.count = std::max<uint32_t>(1, options.av_size);
  ret = fi_av_open(domain_.get(), &av_attr, av_.out(), nullptr);
  if (ret != 0) return fi_status(StatusCode::kDeviceError, "fi_av_open", ret);

  ret = fi_endpoint(domain_.get(), info_.get(), ep_.out(), nullptr);
  if (ret != 0) return fi_status(StatusCode::kDeviceError, "fi_endpoint", ret);
  ret = fi_ep_bind(ep_.get(), &av_->fid, 0);
  if (ret != 0) return fi_status(StatusCode::kDeviceError, "fi_ep_bind(av)", ret);
  ret = fi_ep_bind(ep_.get(), &cq_->fid, FI_TRANSMIT | FI_RECV);
  if (ret != 0) return fi_status(StatusCode::kDeviceError, "fi_ep_bind(cq)", ret);
  ret = fi_enable(ep_.get());
  if (ret != 0) return fi_status(StatusCode::kDeviceError, "fi_enable", ret);

  num_slots_ = static_cast<size_t>(max_inflight) + receives;
  slots_ = std::make_unique<OpSlot[]>(num_slots_);
  free_slots_.reserve(num_slots_);
  for (size_t i = num_slots_; i > 0; --i) {
    slots_[i - 1].kind = OpSlot::Kind::kFree;
    slots_[i - 1].generation = 0;
    free_slots_.push_back(&slots_[i - 1]);
  }
  for (uint32_t i = 0; i < receives; ++i) {
    MK_RETURN_IF_ERROR(post_receive(take_slot(OpSlot::Kind::kReceive)));
  }

  // Scratch region: the target of signal-only writes.
  scratch_.assign(kScratchBytes, 0);
  auto scratch = register_range(scratch_.data(), scratch_.size(), FI_WRITE | FI_REMOTE_WRITE,
                                &scratch_key_);
  if (!scratch.ok()) return scratch.status().with_context("scratch region");
  scratch_mr_ = std::move(scratch).value();

  std::array<uint8_t, kMaxAddressBytes> name{};
  size_t name_len = name.size();
  ret = fi_getname(&ep_->fid, name.data(), &name_len);
  if (ret != 0) return fi_status(StatusCode::kDeviceError, "fi_getname", ret);
  name_.assign(name.begin(), name.begin() + static_cast<std::ptrdiff_t>(name_len));

  const bool hmem = probe_hmem(options);
  caps_.provider = info_->fabric_attr->prov_name != nullptr ? info_->fabric_attr->prov_name : "";
  caps_.version = "libfabric " + version_string(fi_version()) + ", provider " +
                  version_string(info_->fabric_attr->prov_version) + ", domain " +
                  (info_->domain_attr->name != nullptr ? info_->domain_attr->name : "?") +
                  ", mr_mode " + mr_mode_string(mr_mode_) + ", FI_HMEM " +
                  (hmem ? "offered" : "absent") + ", FI_SOURCE " + (have_source_ ? "yes" : "no") +
                  ", completion " + (delivery_complete_ ? "delivery" : "transmit");
  caps_.remote_write = true;
  caps_.addressing = Addressing::kEndpoints;
  caps_.signals = encoding_.cq_data_bytes > 0 ? SignalDelivery::kArrivals : SignalDelivery::kNone;
  caps_.ordered_writes = false;
  caps_.self_peer = true;  // an RDM endpoint can address itself
  // GPU memory through dmabuf: fi_mr_regattr with FI_MR_DMABUF (libfabric 1.20 and newer), on a
  // provider that hands the descriptor to the NIC (efa, verbs) and was opened with FI_HMEM.
  caps_.dmabuf = false;
  if (!kHaveMrDmabuf)
    caps_.dmabuf_reason = "this mkerneld was built against libfabric " + std::to_string(FI_MAJOR_VERSION) + "." +
                          std::to_string(FI_MINOR_VERSION) +
                          " headers, which have no FI_MR_DMABUF (libfabric 1.20 and newer have it)";
  else if (fi_version() < FI_VERSION(1, 20))
    caps_.dmabuf_reason = "libfabric " + version_string(fi_version()) +
                          " at run time is older than 1.20 and has no FI_MR_DMABUF";
  else if (!dmabuf_native(caps_.provider))
    caps_.dmabuf_reason = "provider " + caps_.provider +
                          " does not give dmabuf descriptors to a NIC (efa and verbs do)";
  else if (!hmem_)
    caps_.dmabuf_reason = "provider " + caps_.provider +
                          " offers no FI_HMEM here (a libfabric built without CUDA support)";
  else
    caps_.dmabuf = true;
  caps_.needs_host_staging = !caps_.dmabuf;
  caps_.cq_data_bytes = encoding_.cq_data_bytes;
  caps_.max_inflight = max_inflight;
  return Status::Ok();
}

OpSlot* FabricTransport::take_slot(OpSlot::Kind kind) {
  if (free_slots_.empty()) return nullptr;
  OpSlot* slot = free_slots_.back();
  free_slots_.pop_back();
  std::memset(&slot->context, 0, sizeof(slot->context));
  slot->kind = kind;
  slot->cookie = 0;
  slot->peer = 0;
  slot->local_region = 0;
  ++slot->generation;
  return slot;
}

void FabricTransport::free_slot(OpSlot* slot) {
  slot->kind = OpSlot::Kind::kFree;
  free_slots_.push_back(slot);
}

void FabricTransport::release_source(OpSlot* slot) {
  if (slot->local_region == 0) return;
  if (auto it = regions_.find(slot->local_region); it != regions_.end() && it->second.inflight > 0)
    --it->second.inflight;
  slot->local_region = 0;
}

void FabricTransport::break_endpoint(const std::string& why) {
  if (!broken_.ok()) return;
  broken_ = Status(StatusCode::kDeviceError, "the endpoint can no longer receive peers' signals: " + why);
}

Status FabricTransport::post_receive(OpSlot* slot) {
  if (slot == nullptr) return Status(StatusCode::kInternal, "no operation slot for a receive");
  int ret = 0;
  for (int attempt = 0; attempt <= kEagainRetries; ++attempt) {
    ret = static_cast<int>(fi_recv(ep_.get(), nullptr, 0, nullptr, FI_ADDR_UNSPEC, &slot->context));
    if (ret != -FI_EAGAIN) break;
    progress();
  }
  if (ret != 0) {
    free_slot(slot);
    return fi_status(StatusCode::kDeviceError, "fi_recv", ret);
  }
  return Status::Ok();
}

StatusOr<FidHandle<fid_mr>> FabricTransport::register_range(void* addr, size_t length,
                                                            uint64_t access, uint64_t* key,
                                                            const RegisterRequest* dmabuf) {
  // Without FI_MR_PROV_KEY we choose the key: a random one, so that a key seen (or guessed)
  // for one registration says nothing about another; a collision is retried.
  const size_t key_bytes = std::min<size_t>(8, std::max<size_t>(1, info_->domain_attr->mr_key_size));
  const uint64_t key_mask = key_bytes >= 8 ? ~uint64_t{0} : (uint64_t{1} << (8 * key_bytes)) - 1;
  FidHandle<fid_mr> mr;
  int ret = -FI_ENOKEY;
  for (int attempt = 0; attempt < 8 && ret == -FI_ENOKEY; ++attempt) {
    uint64_t requested_key = 0;
    if ((mr_mode_ & FI_MR_PROV_KEY) == 0) {
      requested_key = key_rng_() & key_mask;
      if (requested_key == 0) requested_key = 1;
    }
    if (dmabuf == nullptr) {
      ret = fi_mr_reg(domain_.get(), addr, length, access, 0, requested_key, 0, mr.out(), nullptr);
      continue;
    }
#if defined(FI_MR_DMABUF)
    // The region's virtual address is base_addr + offset (fi_mr(3)): the GPU address.
    fi_mr_dmabuf buf{};
    buf.fd = dmabuf->dmabuf_fd;
    buf.offset = dmabuf->dmabuf_offset;
    buf.len = length;
    buf.base_addr = reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(addr) - dmabuf->dmabuf_offset);
    fi_mr_attr attr{};
    attr.dmabuf = &buf;
    attr.iov_count = 1;
    attr.access = access;
    attr.requested_key = requested_key;
    attr.iface = FI_HMEM_CUDA;
    attr.device.cuda = dmabuf->cuda_device;
    ret = fi_mr_regattr(domain_.get(), &attr, FI_MR_DMABUF, mr.out());
#else
    ret = -FI_ENOSYS;
#endif
  }
  if (ret != 0)
    return fi_status(StatusCode::kDeviceError, dmabuf != nullptr ? "fi_mr_regattr(FI_MR_DMABUF)" : "fi_mr_reg", ret);
  if ((mr_mode_ & FI_MR_ENDPOINT) != 0) {
    ret = fi_mr_bind(mr.get(), &ep_->fid, 0);
    if (ret != 0) return fi_status(StatusCode::kDeviceError, "fi_mr_bind", ret);
    ret = fi_mr_enable(mr.get());
    if (ret != 0) return fi_status(StatusCode::kDeviceError, "fi_mr_enable", ret);
  }
  *key = fi_mr_key(mr.get());
  if (*key == FI_KEY_NOTAVAIL) {
    return Status(StatusCode::kFailedPrecondition,
                  "fi_mr_key: the provider gives no 64-bit key for this registration");
  }
  return mr;
}

StatusOr<Blob> FabricTransport::local_address() {
  Blob out;
  put_u32(&out, kAddressMagic);
  put_u16(&out, kBlobVersion);
  put_u16(&out, static_cast<uint16_t>(encoding_.cq_data_bytes));
  put_u32(&out, static_cast<uint32_t>(name_.size()));
  out.insert(out.end(), name_.begin(), name_.end());
  put_u64(&out, scratch_key_);
  put_u64(&out, (mr_mode_ & FI_MR_VIRT_ADDR) != 0 ? reinterpret_cast<uintptr_t>(scratch_.data())
                                                   : 0);
  return out;
}

StatusOr<uint32_t> FabricTransport::add_peer(std::span<const uint8_t> address) {
  Reader in(address);
  uint32_t magic = 0;
  uint16_t version = 0;
  uint16_t cq_bytes = 0;
  uint32_t name_len = 0;
  std::span<const uint8_t> name;
  Peer peer;
  if (!in.u32(&magic) || magic != kAddressMagic || !in.u16(&version) ||
      version != kBlobVersion || !in.u16(&cq_bytes) || !in.u32(&name_len) ||
      name_len > kMaxAddressBytes || !in.bytes(name_len, &name) ||
      !in.u64(&peer.scratch_key) || !in.u64(&peer.scratch_base) || !in.done()) {
    return Status(StatusCode::kProtocolError,
                  "peer address: malformed (" + std::to_string(address.size()) +
                      " bytes); expected a fabric endpoint address blob");
  }
  if (cq_bytes != encoding_.cq_data_bytes) {
    return Status(StatusCode::kProtocolError,
                  "peer address: remote CQ data of " + std::to_string(cq_bytes) +
                      " bytes; this endpoint uses " + std::to_string(encoding_.cq_data_bytes));
  }
  fi_addr_t addr = FI_ADDR_NOTAVAIL;
  const int ret = fi_av_insert(av_.get(), name.data(), 1, &addr, 0, nullptr);
  if (ret != 1) {
    return Status(StatusCode::kUnavailable,
                  "fi_av_insert: peer address not accepted: " + fi_error_text(ret < 0 ? ret : -FI_EINVAL));
  }
  peer.addr = addr;
  const auto index = static_cast<uint32_t>(peers_.size());
  peers_.push_back(peer);
  peer_by_addr_.emplace(addr, index);
  return index;
}

StatusOr<Registration> FabricTransport::register_memory(const RegisterRequest& request) {
  const bool gpu = request.kind == MemoryKind::kDmabuf;
  if (gpu && !caps_.dmabuf)
    return Status(StatusCode::kFailedPrecondition,
                  "register_memory: GPU memory (dmabuf) cannot be registered here: " + caps_.dmabuf_reason);
  if (gpu && (request.dmabuf_fd < 0 || request.cuda_device < 0))
    return Status(StatusCode::kInvalidArgument,
                  "register_memory: dmabuf_fd " + std::to_string(request.dmabuf_fd) + ", cuda_device " +
                      std::to_string(request.cuda_device) + "; expected both >= 0 for GPU memory");
  if (gpu && reinterpret_cast<uintptr_t>(request.addr) < request.dmabuf_offset)
    return Status(StatusCode::kInvalidArgument,
                  "register_memory: dmabuf_offset " + std::to_string(request.dmabuf_offset) +
                      " is larger than the region's GPU address");
  if (request.addr == nullptr || request.length == 0) {
    return Status(StatusCode::kInvalidArgument,
                  "register_memory: length " + std::to_string(request.length) +
                      (request.addr == nullptr ? " with no address" : "") +
                      "; expected mapped memory of at least 1 byte");
  }
  uint64_t access = FI_WRITE | FI_SEND | FI_RECV;
  if (request.remote_writable) access |= FI_REMOTE_WRITE;
  uint64_t key = 0;
  MK_ASSIGN_OR_RETURN(FidHandle<fid_mr> mr,
                      register_range(request.addr, request.length, access, &key, gpu ? &request : nullptr));
  const uint64_t id = next_local_id_++;
  Registration reg;
  reg.local_id = id;
  put_u32(&reg.descriptor, kRegionMagic);
  put_u16(&reg.descriptor, kBlobVersion);
  put_u16(&reg.descriptor, request.remote_writable ? kRegionWritable : 0);
  put_u64(&reg.descriptor, key);
  put_u64(&reg.descriptor,
          (mr_mode_ & FI_MR_VIRT_ADDR) != 0 ? reinterpret_cast<uintptr_t>(request.addr) : 0);
  put_u64(&reg.descriptor, request.length);
  LocalRegion region;
  region.mr = std::move(mr);
  region.addr = request.addr;
  region.length = request.length;
  region.remote_writable = request.remote_writable;
  regions_.emplace(id, std::move(region));
  return reg;
}

Status FabricTransport::deregister_memory(uint64_t local_id) {
  auto it = regions_.find(local_id);
  if (it == regions_.end()) {
    return Status(StatusCode::kNotFound,
                  "deregister_memory: local region " + std::to_string(local_id) + " not found");
  }
  // The provider may still read from it (net_transport.h, deregister_memory): a write reported
  // timed out counts until the provider hands its context back.
  if (it->second.inflight > 0) {
    return Status(StatusCode::kFailedPrecondition,
                  "deregister_memory: local region " + std::to_string(local_id) + " has " +
                      std::to_string(it->second.inflight) +
                      " writes in flight; poll until they complete");
  }
  regions_.erase(it);
  return Status::Ok();
}

StatusOr<uint64_t> FabricTransport::import_region(uint32_t peer,
                                                  std::span<const uint8_t> descriptor) {
  if (peer >= peers_.size()) {
    return Status(StatusCode::kNotFound, "import_region: peer " + std::to_string(peer) +
                                             " not added (" + std::to_string(peers_.size()) +
                                             " peers)");
  }
  Reader in(descriptor);
  uint32_t magic = 0;
  uint16_t version = 0;
  uint16_t flags = 0;
  RemoteRegion region;
  region.peer = peer;
  if (!in.u32(&magic) || magic != kRegionMagic || !in.u16(&version) || version != kBlobVersion ||
      !in.u16(&flags) || !in.u64(&region.key) || !in.u64(&region.base) ||
      !in.u64(&region.length) || !in.done()) {
    return Status(StatusCode::kProtocolError,
                  "import_region: malformed descriptor from peer " + std::to_string(peer) + " (" +
                      std::to_string(descriptor.size()) + " bytes)");
  }
  region.writable = (flags & kRegionWritable) != 0;
  const uint64_t id = next_remote_id_++;
  remote_regions_.emplace(id, region);
  return id;
}

Status FabricTransport::set_signal_region(uint64_t /*local_id*/) {
  return Status(StatusCode::kFailedPrecondition,
                "set_signal_region: fabric reports signals as arrivals (remote CQ data); the "
                "receiving proxy raises the flag, so there is no signal region");
}

Status FabricTransport::post_write(const WriteOp& op) {
  if (!broken_.ok()) return broken_;
  if (op.peer >= peers_.size()) {
    return Status(StatusCode::kNotFound, "write " + std::to_string(op.cookie) + ": peer " +
                                             std::to_string(op.peer) + " not added");
  }
  if (op.length == 0 && !op.has_signal) {
    return Status(StatusCode::kInvalidArgument,
                  "write " + std::to_string(op.cookie) + ": length 0 and no signal; nothing to do");
  }
  const Peer& peer = peers_[op.peer];
  void* local_buf = nullptr;
  void* local_desc = nullptr;
  if (op.length > 0) {
    auto it = regions_.find(op.local_region);
    if (it == regions_.end()) {
      return Status(StatusCode::kNotFound, "write " + std::to_string(op.cookie) +
                                               ": local region " +
                                               std::to_string(op.local_region) + " not found");
    }
    const LocalRegion& local = it->second;
    if (op.local_offset > local.length || op.length > local.length - op.local_offset) {
      return Status(StatusCode::kInvalidArgument,
                    "write " + std::to_string(op.cookie) + ": " + std::to_string(op.length) +
                        " bytes at offset " + std::to_string(op.local_offset) +
                        " overrun local region " + std::to_string(op.local_region) + " (" +
                        std::to_string(local.length) + " bytes)");
    }
    local_buf = static_cast<uint8_t*>(local.addr) + op.local_offset;
    local_desc = fi_mr_desc(local.mr.get());
  }

  uint64_t remote_addr = 0;
  uint64_t remote_key = 0;
  uint64_t length = op.length;
  if (op.length == 0) {
    // Signal only: one byte from our scratch region to the peer's (a 0-byte write with data is
    // not completed by every provider, e.g. shm with delivery-complete writes in 1.17).
    local_buf = scratch_.data();
    local_desc = fi_mr_desc(scratch_mr_.get());
    length = 1;
    remote_addr = peer.scratch_base;
    remote_key = peer.scratch_key;
  } else {
    auto it = remote_regions_.find(op.remote_region);
    if (it == remote_regions_.end()) {
      return Status(StatusCode::kNotFound, "write " + std::to_string(op.cookie) +
                                               ": remote region " +
                                               std::to_string(op.remote_region) + " not imported");
    }
    const RemoteRegion& remote = it->second;
    if (remote.peer != op.peer) {
      return Status(StatusCode::kPermissionDenied,
                    "write " + std::to_string(op.cookie) + ": remote region " +
                        std::to_string(op.remote_region) + " belongs to peer " +
                        std::to_string(remote.peer) + ", not peer " + std::to_string(op.peer));
    }
    if (!remote.writable) {
      return Status(StatusCode::kPermissionDenied,
                    "write " + std::to_string(op.cookie) + ": remote region " +
                        std::to_string(op.remote_region) + " was not registered remote_writable");
    }
    if (op.remote_offset > remote.length || op.length > remote.length - op.remote_offset) {
      return Status(StatusCode::kInvalidArgument,
                    "write " + std::to_string(op.cookie) + ": " + std::to_string(op.length) +
                        " bytes at offset " + std::to_string(op.remote_offset) +
                        " overrun remote region " + std::to_string(op.remote_region) + " (" +
                        std::to_string(remote.length) + " bytes)");
    }
    remote_addr = remote.base + op.remote_offset;
    remote_key = remote.key;
  }

  uint64_t data = 0;
  const uint64_t signal_key = (static_cast<uint64_t>(op.peer) << 32) | op.signal_idx;
  if (op.has_signal) {
    if (encoding_.cq_data_bytes == 0) {
      return Status(StatusCode::kFailedPrecondition,
                    "write " + std::to_string(op.cookie) +
                        ": signal requested but the provider offers no remote CQ data");
    }
    MK_ASSIGN_OR_RETURN(data, encode_signal(encoding_, op.signal_idx, op.signal_value));
    if (encoding_.value_bits < 64) {
      auto last = last_sent_.find(signal_key);
      if (last != last_sent_.end()) {
        const uint64_t step = op.signal_value - last->second;
        if (op.signal_value <= last->second || (step >> encoding_.value_bits) != 0) {
          return Status(StatusCode::kInvalidArgument,
                        "write " + std::to_string(op.cookie) + ": signal " +
                            std::to_string(op.signal_idx) + " value " +
                            std::to_string(op.signal_value) + " after " +
                            std::to_string(last->second) + "; expected an increase below 2^" +
                            std::to_string(encoding_.value_bits) + " (the " +
                            std::to_string(encoding_.cq_data_bytes) + "-byte CQ data encoding)");
        }
      }
    }
  }

  if (inflight_ >= caps_.max_inflight) {
    return Status(StatusCode::kUnavailable, "write " + std::to_string(op.cookie) + ": " +
                                                std::to_string(inflight_) +
                                                " writes in flight (max_inflight); poll and retry");
  }
  OpSlot* slot = take_slot(OpSlot::Kind::kWrite);
  if (slot == nullptr) {
    return Status(StatusCode::kUnavailable,
                  "write " + std::to_string(op.cookie) + ": no free operation slot; poll and retry");
  }
  slot->cookie = op.cookie;
  slot->peer = op.peer;

  ssize_t ret = 0;
  for (int attempt = 0; attempt <= kEagainRetries; ++attempt) {
    if (op.has_signal) {
      ret = fi_writedata(ep_.get(), local_buf, length, local_desc, data, peer.addr,
                         remote_addr, remote_key, &slot->context);
    } else {
      ret = fi_write(ep_.get(), local_buf, length, local_desc, peer.addr, remote_addr,
                     remote_key, &slot->context);
    }
    if (ret != -FI_EAGAIN) break;
    progress();  // manual progress frees queue entries
  }
  if (ret != 0) {
    free_slot(slot);
    if (ret == -FI_EAGAIN) {
      return Status(StatusCode::kUnavailable,
                    "write " + std::to_string(op.cookie) +
                        ": provider queue full (-FI_EAGAIN); poll and retry");
    }
    return fi_status(StatusCode::kDeviceError,
                     op.has_signal ? "fi_writedata" : "fi_write", static_cast<int>(ret))
        .with_context("write " + std::to_string(op.cookie));
  }
  ++inflight_;
  if (op.length > 0) {
    slot->local_region = op.local_region;
    ++regions_.at(op.local_region).inflight;
  }
  deadlines_.push_back(
      Deadline{std::chrono::steady_clock::now() + completion_timeout_, slot, slot->generation});
  if (op.has_signal) last_sent_[signal_key] = op.signal_value;
  return Status::Ok();
}

uint32_t FabricTransport::peer_of(fi_addr_t source) const {
  if (source == FI_ADDR_NOTAVAIL) return kUnknownPeer;
  auto it = peer_by_addr_.find(source);
  return it == peer_by_addr_.end() ? kUnknownPeer : it->second;
}

void FabricTransport::handle_entry(const fi_cq_data_entry& entry, fi_addr_t source) {
  auto* slot = static_cast<OpSlot*>(entry.op_context);
  const bool is_write = slot != nullptr && slot->kind == OpSlot::Kind::kWrite;
  if ((entry.flags & FI_REMOTE_CQ_DATA) != 0 && !is_write) {
    uint32_t idx = 0;
    uint64_t low = 0;
    decode_signal(encoding_, entry.data, &idx, &low);
    Arrival arrival;
    arrival.peer = peer_of(source);
    arrival.signal_idx = idx;
    const uint64_t key = (static_cast<uint64_t>(arrival.peer) << 32) | idx;
    auto last = last_received_.find(key);
    const bool has_last = last != last_received_.end();
    arrival.signal_value =
        unwrap_signal_value(has_last, has_last ? last->second : 0, low, encoding_.value_bits);
    last_received_[key] = arrival.signal_value;
    pending_arrivals_.push_back(arrival);
  }
  if (slot == nullptr) return;
  if (slot->kind == OpSlot::Kind::kReceive) {
    // A receive consumed by remote CQ data (FI_RX_CQ_DATA) or by a stray message: post it again.
    std::memset(&slot->context, 0, sizeof(slot->context));
    int ret = static_cast<int>(
        fi_recv(ep_.get(), nullptr, 0, nullptr, FI_ADDR_UNSPEC, &slot->context));
    if (ret != 0) {
      ++receive_errors_;
      receive_error_ = "fi_recv: " + fi_error_text(ret);
      free_slot(slot);
      break_endpoint("a receive could not be posted again (" + receive_error_ + ")");
    }
    return;
  }
  if (slot->kind == OpSlot::Kind::kTimedOut) {
    ++late_completions_;
    release_source(slot);
    free_slot(slot);
    return;
  }
  if (slot->kind == OpSlot::Kind::kWrite) {
    pending_completions_.push_back(Completion{slot->cookie, Status::Ok()});
    --inflight_;
    release_source(slot);
    free_slot(slot);
  }
}

void FabricTransport::handle_error() {
  fi_cq_err_entry err{};
  const ssize_t got = fi_cq_readerr(cq_.get(), &err, 0);
  if (got != 1) return;
  char reason[256] = {};
  const char* text = fi_cq_strerror(cq_.get(), err.prov_errno, err.err_data, reason,
                                    sizeof(reason));
  std::string message = std::string(fi_strerror(err.err)) + " (provider: " +
                        (text != nullptr ? text : "no reason given") + ")";
  auto* slot = static_cast<OpSlot*>(err.op_context);
  if (slot == nullptr || slot->kind == OpSlot::Kind::kFree) {
    ++receive_errors_;
    receive_error_ = message;
    return;
  }
  if (slot->kind == OpSlot::Kind::kTimedOut) {
    ++late_completions_;
    release_source(slot);
    free_slot(slot);
    return;
  }
  if (slot->kind == OpSlot::Kind::kReceive) {
    ++receive_errors_;
    receive_error_ = message;
    if (err.err == FI_ECANCELED) {
      free_slot(slot);
      return;
    }
    // A receive that failed may have carried a peer's signal: it is gone, and a flag that
    // never rises would leave a kernel waiting until its own bound.
    break_endpoint("a receive failed: " + message);
    std::memset(&slot->context, 0, sizeof(slot->context));
    if (fi_recv(ep_.get(), nullptr, 0, nullptr, FI_ADDR_UNSPEC, &slot->context) != 0) {
      free_slot(slot);
    }
    return;
  }
  pending_completions_.push_back(Completion{
      slot->cookie, Status(completion_code(err.err),
                           "write " + std::to_string(slot->cookie) + " to peer " +
                               std::to_string(slot->peer) + " failed: " + message)});
  --inflight_;
  release_source(slot);
  free_slot(slot);
}

void FabricTransport::progress() {
  std::array<fi_cq_data_entry, kCqBatch> entries{};
  std::array<fi_addr_t, kCqBatch> sources{};
  size_t handled = 0;
  while (handled < kMaxCqEntriesPerPoll) {
    ssize_t got = 0;
    if (have_source_) {
      got = fi_cq_readfrom(cq_.get(), entries.data(), entries.size(), sources.data());
    } else {
      got = fi_cq_read(cq_.get(), entries.data(), entries.size());
    }
    if (got == -FI_EAVAIL) {
      handle_error();
      ++handled;
      continue;
    }
    if (got <= 0) break;  // -FI_EAGAIN: nothing now
    for (ssize_t i = 0; i < got; ++i) {
      handle_entry(entries[static_cast<size_t>(i)],
                   have_source_ ? sources[static_cast<size_t>(i)] : FI_ADDR_NOTAVAIL);
    }
    handled += static_cast<size_t>(got);
  }
}

void FabricTransport::expire() {
  const auto now = std::chrono::steady_clock::now();
  while (!deadlines_.empty()) {
    const Deadline& d = deadlines_.front();
    if (d.slot->generation != d.generation || d.slot->kind != OpSlot::Kind::kWrite) {
      deadlines_.pop_front();  // completed already
      continue;
    }
    if (d.at > now) break;
    // The provider lost this write (shm 1.17 does, for a write the target refuses): report it
    // once, keep the context quarantined until the provider returns it.
    pending_completions_.push_back(Completion{
        d.slot->cookie,
        Status(StatusCode::kDeadlineExceeded,
               "write " + std::to_string(d.slot->cookie) + " to peer " +
                   std::to_string(d.slot->peer) + ": no completion from the provider within " +
                   std::to_string(completion_timeout_.count()) + " ms")});
    d.slot->kind = OpSlot::Kind::kTimedOut;
    --inflight_;
    deadlines_.pop_front();
  }
}

size_t FabricTransport::poll(std::vector<Completion>* completions, std::vector<Arrival>* arrivals) {
  progress();
  expire();
  size_t appended = 0;
  if (completions != nullptr) {
    appended += pending_completions_.size();
    for (Completion& c : pending_completions_) completions->push_back(std::move(c));
    pending_completions_.clear();
  }
  if (arrivals != nullptr) {
    appended += pending_arrivals_.size();
    arrivals->insert(arrivals->end(), pending_arrivals_.begin(), pending_arrivals_.end());
    pending_arrivals_.clear();
  }
  return appended;
}

}  // namespace

// ---- public functions ---------------------------------------------------------------------------

StatusOr<std::unique_ptr<Transport>> open_fabric(const FabricOptions& options) {
  auto transport = std::make_unique<FabricTransport>();
  Status status = transport->open(options);
  if (!status.ok()) return status.with_context("open_fabric");
  return std::unique_ptr<Transport>(std::move(transport));
}

SignalEncoding signal_encoding_for(size_t cq_data_size) {
  if (cq_data_size >= 8) return SignalEncoding{8, 24, 40};
  if (cq_data_size >= 4) return SignalEncoding{4, 20, 12};
  return SignalEncoding{};
}

StatusOr<uint64_t> encode_signal(const SignalEncoding& encoding, uint32_t signal_idx,
                                 uint64_t value) {
  if (encoding.cq_data_bytes == 0) {
    return Status(StatusCode::kFailedPrecondition, "signal: the provider has no remote CQ data");
  }
  if ((static_cast<uint64_t>(signal_idx) >> encoding.index_bits) != 0) {
    return Status(StatusCode::kInvalidArgument,
                  "signal_idx: " + std::to_string(signal_idx) + "; expected below 2^" +
                      std::to_string(encoding.index_bits) + " with " +
                      std::to_string(encoding.cq_data_bytes) + "-byte CQ data");
  }
  const uint64_t mask = (uint64_t{1} << encoding.value_bits) - 1;
  return (static_cast<uint64_t>(signal_idx) << encoding.value_bits) | (value & mask);
}

void decode_signal(const SignalEncoding& encoding, uint64_t data, uint32_t* signal_idx,
                   uint64_t* low_value) {
  if (encoding.cq_data_bytes == 0) {
    *signal_idx = 0;
    *low_value = 0;
    return;
  }
  const uint64_t mask = (uint64_t{1} << encoding.value_bits) - 1;
  const uint64_t index_mask = (uint64_t{1} << encoding.index_bits) - 1;
  *signal_idx = static_cast<uint32_t>((data >> encoding.value_bits) & index_mask);
  *low_value = data & mask;
}

uint64_t unwrap_signal_value(bool has_last, uint64_t last, uint64_t low_value,
                             unsigned value_bits) {
  if (value_bits >= 64) return low_value;
  const uint64_t span = uint64_t{1} << value_bits;
  const uint64_t mask = span - 1;
  low_value &= mask;
  if (!has_last) return low_value;
  // Same high part as `last`, then one lap further if that is not above `last`.
  uint64_t candidate = (last & ~mask) | low_value;
  if (candidate <= last) candidate += span;
  return candidate;
}

std::string mr_mode_string(uint64_t mr_mode) {
  struct Bit {
    uint64_t bit;
    const char* name;
  };
  constexpr std::array<Bit, 11> kBits{{{FI_MR_LOCAL, "FI_MR_LOCAL"},
                                       {FI_MR_RAW, "FI_MR_RAW"},
                                       {FI_MR_VIRT_ADDR, "FI_MR_VIRT_ADDR"},
                                       {FI_MR_ALLOCATED, "FI_MR_ALLOCATED"},
                                       {FI_MR_PROV_KEY, "FI_MR_PROV_KEY"},
                                       {FI_MR_MMU_NOTIFY, "FI_MR_MMU_NOTIFY"},
                                       {FI_MR_RMA_EVENT, "FI_MR_RMA_EVENT"},
                                       {FI_MR_ENDPOINT, "FI_MR_ENDPOINT"},
                                       {FI_MR_HMEM, "FI_MR_HMEM"},
                                       {FI_MR_COLLECTIVE, "FI_MR_COLLECTIVE"},
                                       {FI_MR_SCALABLE, "FI_MR_SCALABLE"}}};
  std::string out = "[";
  for (const Bit& b : kBits) {
    if ((mr_mode & b.bit) == 0) continue;
    if (out.size() > 1) out += ", ";
    out += b.name;
  }
  return out + "]";
}

}  // namespace mkernel::daemon::net
