// fabric_open.cc: opening a libfabric RDM endpoint (fi_getinfo hints, resources, capabilities),
// its address and peers, and memory registrations. The data path is fabric_transport.cc; the
// class is in fabric_endpoint.h.
#include "fabric_endpoint.h"

#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <string>

namespace mkernel::daemon::net {
namespace fabric {

namespace {

// libfabric's shm provider names an endpoint's shared-memory region after the process id unless
// told otherwise, and a process killed before closing it leaves the region in /dev/shm: a later
// process that happens to get the same id then fails in fi_enable with EBUSY. So shm endpoints
// get names of their own, "mkernel-<pid>-<random>", and regions of that form whose process is
// gone are removed once per process before the first one is opened.
constexpr char kShmPrefix[] = "mkernel-";

void remove_stale_shm_regions() {
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return;
  while (const dirent* e = ::readdir(dir)) {
    if (std::strncmp(e->d_name, kShmPrefix, sizeof(kShmPrefix) - 1) != 0) continue;
    const char* digits = e->d_name + sizeof(kShmPrefix) - 1;
    char* end = nullptr;
    const long pid = std::strtol(digits, &end, 10);
    if (end == digits || *end != '-' || pid <= 0) continue;
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;  // alive, or not ours to judge
    (void)::unlink((std::string("/dev/shm/") + e->d_name).c_str());
  }
  ::closedir(dir);
}

std::string shm_endpoint_name() {
  static std::once_flag cleaned;
  std::call_once(cleaned, remove_stale_shm_regions);
  static std::atomic<uint64_t> counter{0};
  std::random_device rd;
  const uint64_t token = (uint64_t{rd()} << 32) ^ rd() ^ (counter.fetch_add(1) << 48);
  char name[64];
  std::snprintf(name, sizeof name, "fi_shm://%s%d-%016llx", kShmPrefix, static_cast<int>(::getpid()),
                static_cast<unsigned long long>(token));
  return name;
}

}  // namespace

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
  if (options.provider == "shm") {
    const std::string name = shm_endpoint_name();
    hints->addr_format = FI_ADDR_STR;
    hints->src_addr = dup_string(name);
    hints->src_addrlen = name.size() + 1;
  }
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
  if (options.signal_value != SignalValuePath::kAuto && options.signal_value != SignalValuePath::kCqData &&
      options.signal_value != SignalValuePath::kMessage) {
    return Status(StatusCode::kInvalidArgument,
                  "signal_value: " + std::to_string(static_cast<unsigned>(options.signal_value)) +
                      "; expected auto, cq_data or message");
  }
  if (options.write_piece_bytes != kAutoWritePiece && options.write_piece_bytes != 0 &&
      options.write_piece_bytes < 4096) {
    return Status(StatusCode::kInvalidArgument,
                  "write_piece_bytes: " + std::to_string(options.write_piece_bytes) +
                      "; expected 0 (whole writes), auto, or at least 4096");
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
  // The message path sends the signal once the data's completion is in; only a delivery-complete
  // completion says the data is in the target's memory (a transmit completion may come while it
  // is still on its way, and the message could then overtake it on an unordered provider).
  switch (options.signal_value) {
    case SignalValuePath::kCqData:
      signal_path_ = SignalValuePath::kCqData;
      break;
    case SignalValuePath::kMessage:
      if (!delivery_complete_) {
        return Status(StatusCode::kFailedPrecondition,
                      "signal_value: message needs delivery-complete writes (so a signal cannot "
                      "overtake its data), and provider " +
                          std::string(info_->fabric_attr->prov_name != nullptr ? info_->fabric_attr->prov_name : "?") +
                          " completes writes at transmit; expected cq_data or auto here");
      }
      signal_path_ = SignalValuePath::kMessage;
      break;
    default:  // kAuto
      signal_path_ = encoding_.value_bits < 40 && delivery_complete_ ? SignalValuePath::kMessage
                                                                     : SignalValuePath::kCqData;
      break;
  }

  int ret = fi_fabric(info_->fabric_attr, fabric_.out(), nullptr);
  if (ret != 0) return fi_status(StatusCode::kDeviceError, "fi_fabric", ret);
  ret = fi_domain(fabric_.get(), info_.get(), domain_.out(), nullptr);
  if (ret != 0) return fi_status(StatusCode::kDeviceError, "fi_domain", ret);

  uint32_t max_inflight = options.max_inflight;
  if (info_->tx_attr->size > 0 && info_->tx_attr->size < max_inflight) {
    max_inflight = static_cast<uint32_t>(info_->tx_attr->size);
  }
  // Receives stay posted on every endpoint: peers' signal messages land in them (any peer may
  // send them, whatever path this endpoint sends its own signals by), and with FI_RX_CQ_DATA
  // remote CQ data consumes them too.
  uint32_t receives = std::max<uint32_t>(1, options.posted_receives);
  if (info_->rx_attr->size > 0 && info_->rx_attr->size < receives) {
    receives = static_cast<uint32_t>(info_->rx_attr->size);
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

  // Scratch region: the target of signal-only writes (kCqData path).
  scratch_.assign(kScratchBytes, 0);
  auto scratch = register_range(scratch_.data(), scratch_.size(), FI_WRITE | FI_REMOTE_WRITE,
                                &scratch_key_);
  if (!scratch.ok()) return scratch.status().with_context("scratch region");
  scratch_mr_ = std::move(scratch).value();
  // Signal message buffers, one per slot: receives land in them, signal messages leave from them.
  messages_.assign(num_slots_ * kSignalMessageBytes, 0);
  auto messages = register_range(messages_.data(), messages_.size(), FI_SEND | FI_RECV, &messages_key_);
  if (!messages.ok()) return messages.status().with_context("signal message buffers");
  messages_mr_ = std::move(messages).value();
  for (uint32_t i = 0; i < receives; ++i) {
    MK_RETURN_IF_ERROR(post_receive(take_slot(OpSlot::Kind::kReceive), /*progress_on_eagain=*/true));
  }

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
                  ", completion " + (delivery_complete_ ? "delivery" : "transmit") +
                  ", signal values " +
                  (signal_path_ == SignalValuePath::kMessage
                       ? std::string("by message after the data (64 bits)")
                       : "in CQ data (" + std::to_string(encoding_.value_bits) + " bits)");
  piece_bytes_ = options.write_piece_bytes == kAutoWritePiece ? auto_write_piece_bytes(caps_.provider)
                                                                  : options.write_piece_bytes;
  caps_.version += piece_bytes_ > 0 ? ", writes over " + std::to_string(piece_bytes_) + " bytes in pieces"
                                    : std::string(", whole writes");
  caps_.remote_write = true;
  caps_.addressing = Addressing::kEndpoints;
  caps_.signals = encoding_.cq_data_bytes > 0 || signal_path_ == SignalValuePath::kMessage
                     ? SignalDelivery::kArrivals
                     : SignalDelivery::kNone;
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
  put_u16(&out, kAddressVersion);
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
  if (in.u32(&magic) && magic == kAddressMagic && in.u16(&version) && version != kAddressVersion) {
    return Status(StatusCode::kProtocolError,
                  "peer address: version " + std::to_string(version) + "; expected " +
                      std::to_string(kAddressVersion) +
                      " (a peer mkerneld of another release: every endpoint of this one takes "
                      "signal messages, see transports.md)");
  }
  in = Reader(address);
  if (!in.u32(&magic) || magic != kAddressMagic || !in.u16(&version) ||
      version != kAddressVersion || !in.u16(&cq_bytes) || !in.u32(&name_len) ||
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

}  // namespace fabric

// ---- public functions ---------------------------------------------------------------------------

StatusOr<std::unique_ptr<Transport>> open_fabric(const FabricOptions& options) {
  auto transport = std::make_unique<fabric::FabricTransport>();
  Status status = transport->open(options);
  if (!status.ok()) return status.with_context("open_fabric");
  return std::unique_ptr<Transport>(std::move(transport));
}

std::string_view to_string(SignalValuePath path) {
  switch (path) {
    case SignalValuePath::kAuto:
      return "auto";
    case SignalValuePath::kCqData:
      return "cq_data";
    case SignalValuePath::kMessage:
      return "message";
  }
  return "?";
}

uint64_t auto_write_piece_bytes(std::string_view provider) { return provider == "shm" ? uint64_t{256} << 10 : 0; }

void pack_signal_message(uint32_t signal_idx, uint64_t value, uint8_t* out) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<uint8_t>(kSignalMessageMagic >> (8 * i));
  for (int i = 0; i < 4; ++i) out[4 + i] = static_cast<uint8_t>(signal_idx >> (8 * i));
  for (int i = 0; i < 8; ++i) out[8 + i] = static_cast<uint8_t>(value >> (8 * i));
}

bool unpack_signal_message(const uint8_t* bytes, size_t length, uint32_t* signal_idx,
                           uint64_t* value) {
  if (length != kSignalMessageBytes) return false;
  fabric::Reader in(std::span<const uint8_t>(bytes, length));
  uint32_t magic = 0, idx = 0;
  uint64_t v = 0;
  if (!in.u32(&magic) || magic != kSignalMessageMagic || !in.u32(&idx) || !in.u64(&v)) return false;
  *signal_idx = idx;
  *value = v;
  return true;
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
