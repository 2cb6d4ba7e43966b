#include "loopback_transport.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "session.h"

namespace mkernel::daemon {

namespace {
Status no_setup(const char* member) {
  return Status(StatusCode::kFailedPrecondition,
                std::string(member) +
                    ": the loopback addresses peers by rank and regions by id; there is nothing to "
                    "exchange or register (net_transport.h note 5)");
}
}  // namespace

LoopbackTransport::LoopbackTransport(const Session& self) : self_(self) {
  caps_.provider = "loopback";
  caps_.version = "in-daemon memmove";
  caps_.addressing = net::Addressing::kRanks;
  caps_.signals = net::SignalDelivery::kArrivals;
  caps_.remote_write = true;
  caps_.ordered_writes = true;  // carried out at post, in post order
  caps_.self_peer = true;
  caps_.dmabuf = false;
  caps_.dmabuf_reason = "the daemon never maps GPU memory; only a NIC reaches it";
  caps_.max_inflight = kMaxInflight;
}

PeerList::PeerList(std::vector<std::pair<uint32_t, std::shared_ptr<Session>>> ranks) : ranks_(std::move(ranks)) {
  std::sort(ranks_.begin(), ranks_.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
}

Session* PeerList::find(uint32_t rank) const {
  auto it = std::lower_bound(ranks_.begin(), ranks_.end(), rank,
                             [](const auto& entry, uint32_t r) { return entry.first < r; });
  return it != ranks_.end() && it->first == rank ? it->second.get() : nullptr;
}

void LoopbackTransport::set_peers(std::shared_ptr<const PeerList> peers) { peers_ = std::move(peers); }

void LoopbackTransport::deliver(const net::Arrival& arrival) {
  std::lock_guard<std::mutex> lock(inbox_mu_);
  inbox_.push_back(arrival);
  inbox_filled_.store(true, std::memory_order_release);
}

StatusOr<net::Blob> LoopbackTransport::local_address() { return no_setup("local_address"); }
StatusOr<uint32_t> LoopbackTransport::add_peer(std::span<const uint8_t>) { return no_setup("add_peer"); }
StatusOr<net::Registration> LoopbackTransport::register_memory(const net::RegisterRequest&) {
  return no_setup("register_memory");
}
Status LoopbackTransport::deregister_memory(uint64_t) { return no_setup("deregister_memory"); }
StatusOr<uint64_t> LoopbackTransport::import_region(uint32_t, std::span<const uint8_t>) {
  return no_setup("import_region");
}
Status LoopbackTransport::set_signal_region(uint64_t) { return no_setup("set_signal_region"); }

Status LoopbackTransport::post_write(const net::WriteOp& op) {
  if (done_.size() >= kMaxInflight)
    return Status(StatusCode::kUnavailable, std::to_string(done_.size()) +
                                                " completions not polled yet; poll and retry");
  Session* dst = peers_ ? peers_->find(static_cast<uint32_t>(op.peer)) : nullptr;
  if (dst == nullptr || dst->ended())  // final (kUnavailable would mean "queue full")
    return Status(StatusCode::kNotFound,
                  "rank " + std::to_string(op.peer) + " of communicator \"" + self_.identity().communicator +
                      "\" is not connected to this daemon");
  // Everything at the destination is checked before anything is touched (note 3).
  if (op.length > 0) {
    const Region* s = self_.region(static_cast<uint32_t>(op.local_region));
    const Region* d = op.remote_region <= UINT32_MAX ? dst->region(static_cast<uint32_t>(op.remote_region)) : nullptr;
    if (s == nullptr || op.local_offset > s->bytes || op.length > s->bytes - op.local_offset)
      return Status(StatusCode::kInvalidArgument,
                    "write " + std::to_string(op.cookie) + ": source region " + std::to_string(op.local_region) +
                        " does not hold " + std::to_string(op.length) + " bytes at offset " +
                        std::to_string(op.local_offset));
    if (d == nullptr || !d->remote_writable)
      return Status(StatusCode::kPermissionDenied, "write " + std::to_string(op.cookie) + ": region " +
                                                       std::to_string(op.remote_region) + " of rank " +
                                                       std::to_string(op.peer) + " is not remote-writable");
    if (op.remote_offset > d->bytes || op.length > d->bytes - op.remote_offset)
      return Status(StatusCode::kInvalidArgument,
                    "write " + std::to_string(op.cookie) + ": " + std::to_string(op.length) + " bytes at offset " +
                        std::to_string(op.remote_offset) + " overrun region " + std::to_string(op.remote_region) +
                        " of rank " + std::to_string(op.peer) + " (" + std::to_string(d->bytes) + " bytes)");
    if (s->gpu() || d->gpu())  // note 5
      return Status(StatusCode::kFailedPrecondition,
                    std::string(s->gpu() ? "source" : "destination") +
                        " region is GPU memory, which this daemon never maps; a rank copies within its "
                        "own GPU memory with its kernels, other ranks reach it through the network "
                        "transport");
  }
  if (op.has_signal && (dst->flags() == nullptr || op.signal_idx >= dst->num_flags()))
    return Status(StatusCode::kInvalidArgument, "write " + std::to_string(op.cookie) + ": flag " +
                                                    std::to_string(op.signal_idx) + " of rank " +
                                                    std::to_string(op.peer) + ", which has " +
                                                    std::to_string(dst->num_flags()));
  if (op.length > 0) {
    const Region* s = self_.region(static_cast<uint32_t>(op.local_region));
    const Region* d = dst->region(static_cast<uint32_t>(op.remote_region));
    std::memmove(d->data() + op.remote_offset, s->data() + op.local_offset, op.length);
  }
  if (op.has_signal) dst->loopback().deliver(net::Arrival{self_.identity().rank, op.signal_idx, op.signal_value});
  done_.push_back(net::Completion{op.cookie, Status::Ok()});
  return Status::Ok();
}

size_t LoopbackTransport::poll(std::vector<net::Completion>* completions, std::vector<net::Arrival>* arrivals) {
  size_t n = 0;
  if (completions != nullptr && !done_.empty()) {
    n += done_.size();
    for (net::Completion& c : done_) completions->push_back(std::move(c));
    done_.clear();
  }
  if (arrivals != nullptr && inbox_filled_.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(inbox_mu_);
    n += inbox_.size();
    arrivals->insert(arrivals->end(), inbox_.begin(), inbox_.end());
    inbox_.clear();
    inbox_filled_.store(false, std::memory_order_relaxed);
  }
  return n;
}

}  // namespace mkernel::daemon
