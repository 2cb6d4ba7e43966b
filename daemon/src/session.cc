#include "session.h"

namespace mkernel::daemon {

Session::Session(uint64_t id, protocol::UniqueFd sock, const ucred& creds, const SessionQuota& quota)
    : id_(id), sock_(std::move(sock)), creds_(creds), quota_(quota) {
  rings_.resize(quota.max_rings);
  regions_.resize(quota.max_regions);
}

Session::~Session() = default;

StatusOr<const SessionRing*> Session::add_ring(uint32_t capacity_log2, uint64_t epoch) {
  const uint32_t n = num_rings_.load(std::memory_order_relaxed);
  if (n >= quota_.max_rings)
    return Status(StatusCode::kResourceExhausted,
                  "rings: " + std::to_string(n + 1) + " requested; this client's quota is " +
                      std::to_string(quota_.max_rings) + " (clients.quota.rings)");
  if (!protocol::valid_capacity_log2(capacity_log2) || capacity_log2 > quota_.max_ring_capacity_log2)
    return Status(StatusCode::kInvalidArgument,
                  "capacity_log2: " + std::to_string(capacity_log2) + "; expected " +
                      std::to_string(protocol::kMinCapacityLog2) + ".." +
                      std::to_string(quota_.max_ring_capacity_log2));
  const uint64_t bytes = protocol::ring_segment_bytes(capacity_log2);
  if (registered_bytes() + bytes > quota_.max_registered_bytes)
    return Status(StatusCode::kResourceExhausted,
                  "registered bytes: " + std::to_string(registered_bytes() + bytes) +
                      " with this ring; this client's quota is " +
                      std::to_string(quota_.max_registered_bytes) +
                      " (clients.quota.registered_bytes)");
  auto ring = std::make_unique<SessionRing>();
  ring->id = n;
  MK_ASSIGN_OR_RETURN(ring->mapping, protocol::create_sealed_segment(
                                         "mkernel-ring-" + std::to_string(id_) + "-" + std::to_string(n), bytes));
  // The segment is a fresh memfd, zero-filled by the kernel: only the header is written, so
  // creating a ring costs the same whatever its size and touches none of its slots' pages.
  if (std::string err = protocol::init_ring_on_zeroed(ring->mapping.data(), ring->mapping.size(), capacity_log2,
                                                      (id_ << 16) | n, epoch, &ring->view);
      !err.empty())
    return Status(StatusCode::kInternal, "init_ring: " + err);
  rings_[n] = std::move(ring);
  registered_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  num_rings_.store(n + 1, std::memory_order_release);
  return rings_[n].get();
}

StatusOr<const Region*> Session::add_region(uint64_t bytes, bool remote_writable) {
  MK_RETURN_IF_ERROR(check_region_quota(bytes, protocol::page_round_up(bytes)));
  const uint32_t n = num_regions_.load(std::memory_order_relaxed);
  const uint64_t rounded = protocol::page_round_up(bytes);
  auto region = std::make_unique<Region>();
  MK_ASSIGN_OR_RETURN(region->mapping,
                      protocol::create_sealed_segment(
                          "mkernel-region-" + std::to_string(id_) + "-" + std::to_string(n), rounded));
  region->bytes = region->mapping.size();
  region->remote_writable = remote_writable;
  regions_[n] = std::move(region);
  registered_bytes_.fetch_add(rounded, std::memory_order_relaxed);
  num_regions_.store(n + 1, std::memory_order_release);
  return regions_[n].get();
}

StatusOr<const Region*> Session::add_gpu_region(GpuRegionSpec spec) {
  MK_RETURN_IF_ERROR(check_region_quota(spec.bytes, spec.bytes));
  if (!spec.dmabuf.valid())
    return Status(StatusCode::kInvalidArgument, "GPU region: no dmabuf descriptor");
  const uint32_t n = num_regions_.load(std::memory_order_relaxed);
  auto region = std::make_unique<Region>();
  region->bytes = spec.bytes;
  region->remote_writable = spec.remote_writable;
  region->dmabuf = std::move(spec.dmabuf);
  region->dmabuf_offset = spec.dmabuf_offset;
  region->gpu_address = spec.gpu_address;
  region->cuda_device = spec.cuda_device;
  region->exporter = std::move(spec.exporter);
  regions_[n] = std::move(region);
  registered_bytes_.fetch_add(spec.bytes, std::memory_order_relaxed);
  num_gpu_regions_.fetch_add(1, std::memory_order_release);
  num_regions_.store(n + 1, std::memory_order_release);
  return regions_[n].get();
}

Status Session::check_region_quota(uint64_t bytes, uint64_t counted) const {
  const uint32_t n = num_regions_.load(std::memory_order_relaxed);
  if (n >= quota_.max_regions)
    return Status(StatusCode::kResourceExhausted,
                  "regions: " + std::to_string(n + 1) + " requested; at most " +
                      std::to_string(quota_.max_regions) + " per client");
  if (bytes == 0 || bytes > quota_.max_registered_bytes)
    return Status(StatusCode::kInvalidArgument,
                  "region bytes: " + std::to_string(bytes) + "; expected 1.." +
                      std::to_string(quota_.max_registered_bytes));
  if (registered_bytes() + counted > quota_.max_registered_bytes)
    return Status(StatusCode::kResourceExhausted,
                  "registered bytes: " + std::to_string(registered_bytes() + counted) +
                      " with this region; this client's quota is " +
                      std::to_string(quota_.max_registered_bytes) +
                      " (clients.quota.registered_bytes)");
  return Status::Ok();
}

Status Session::add_flags(uint32_t count) {
  if (flags() != nullptr)
    return Status(StatusCode::kAlreadyExists, "flags: this session already has its flag array");
  if (count == 0 || count > quota_.max_flags)
    return Status(StatusCode::kInvalidArgument, "flags count: " + std::to_string(count) +
                                                    "; expected 1.." + std::to_string(quota_.max_flags));
  const uint64_t bytes = uint64_t{count} * sizeof(uint64_t);
  MK_ASSIGN_OR_RETURN(flags_mapping_,
                      protocol::create_sealed_segment("mkernel-flags-" + std::to_string(id_), bytes));
  registered_bytes_.fetch_add(flags_mapping_.size(), std::memory_order_relaxed);
  num_flags_.store(count, std::memory_order_relaxed);
  flags_ptr_.store(static_cast<uint64_t*>(flags_mapping_.data()), std::memory_order_release);
  return Status::Ok();
}

bool Session::end(Status reason, uint32_t ring_code, uint32_t ring_detail, uint64_t ring_pos) {
  {
    std::lock_guard<std::mutex> lock(end_mu_);
    if (ended_.load(std::memory_order_relaxed)) return false;
    end_reason_ = std::move(reason);
    ended_.store(true, std::memory_order_release);
  }
  if (ring_code != 0) {
    const uint32_t n = num_rings();
    for (uint32_t i = 0; i < n; ++i) {
      protocol::RingHeader* h = rings_[i]->view.header;
      std::atomic_ref<uint32_t> err(h->error);
      if (err.load(std::memory_order_acquire) != 0) continue;
      h->error_detail = ring_detail;
      h->error_pos = ring_pos;
      err.store(ring_code, std::memory_order_release);
    }
  }
  return true;
}

Status Session::end_reason() const {
  std::lock_guard<std::mutex> lock(end_mu_);
  return end_reason_;
}

}  // namespace mkernel::daemon
