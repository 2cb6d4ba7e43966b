// verbs_transport.cc: the data path of the libibverbs RC transport (design in
// verbs_transport.h): work requests for writes, signals and flushes, selective signalling,
// completions and queue-pair failures. Opening and registrations are in verbs_open.cc; the class
// is in verbs_endpoint.h; the contract in net_transport.h.
#include "verbs_endpoint.h"

namespace mkernel::daemon::net::verbs {

void VerbsTransportImpl::record_wr(QueuePair& q, uint64_t seq, bool signalled, int slot,
                                   uint64_t raddr, uint32_t rkey) {
  q.wrs.push_back({seq, signalled, slot});
  ++outstanding_;
  if (signalled) {
    ++q.signalled_inflight;
    q.since_signal = 0;
  } else {
    ++q.since_signal;
  }
  q.tail_unsignalled = !signalled;
  q.last_remote_addr = raddr;
  q.last_rkey = rkey;
}

Status VerbsTransportImpl::post_write(const WriteOp& op) {
  if (!broken_.ok()) return broken_;
  if (op.peer >= qps_.size() || !qps_[op.peer].connected)
    return Status(StatusCode::kNotFound, "post_write: " + peer_name(op.peer) + " is not connected");
  QueuePair& q = qps_[op.peer];
  if (q.failed)
    return Status(StatusCode::kFailedPrecondition,
                  "post_write: " + peer_name(op.peer) +
                      "'s queue pair failed earlier: " + q.failure.message());
  if (op.length == 0 && !op.has_signal)
    return Status(StatusCode::kInvalidArgument,
                  "post_write: length 0 and no signal; nothing to write");

  LocalRegion* local = nullptr;
  const RemoteRegion* remote = nullptr;
  if (op.length > 0) {
    auto l = regions_.find(op.local_region);
    if (l == regions_.end())
      return Status(StatusCode::kNotFound, "post_write: local region " +
                                               std::to_string(op.local_region) +
                                               " is not registered");
    local = &l->second;
    auto r = remote_regions_.find(op.remote_region);
    if (r == remote_regions_.end())
      return Status(StatusCode::kNotFound, "post_write: remote region " +
                                               std::to_string(op.remote_region) +
                                               " was not imported");
    remote = &r->second;
    if (remote->peer != op.peer)
      return Status(StatusCode::kInvalidArgument,
                    "post_write: remote region " + std::to_string(op.remote_region) +
                        " belongs to " + peer_name(remote->peer) + ", not " + peer_name(op.peer));
    if (op.length > max_message_)
      return Status(StatusCode::kInvalidArgument,
                    "post_write: length " + std::to_string(op.length) +
                        " exceeds one RDMA write's limit of " + std::to_string(max_message_));
    if (op.local_offset > local->length || op.length > local->length - op.local_offset)
      return Status(StatusCode::kInvalidArgument,
                    "post_write: " + std::to_string(op.length) + " bytes at offset " +
                        std::to_string(op.local_offset) + " run past local region " +
                        std::to_string(op.local_region) + " (" + std::to_string(local->length) +
                        " bytes)");
    if (op.remote_offset > remote->length || op.length > remote->length - op.remote_offset)
      return Status(StatusCode::kInvalidArgument,
                    "post_write: " + std::to_string(op.length) + " bytes at offset " +
                        std::to_string(op.remote_offset) + " run past remote region " +
                        std::to_string(op.remote_region) + " (" +
                        std::to_string(remote->length) + " bytes)");
  }
  if (op.has_signal) {
    if (q.signal_slots == 0)
      return Status(StatusCode::kFailedPrecondition,
                    "post_write: " + peer_name(op.peer) + " published no signal region");
    if (op.signal_idx >= q.signal_slots)
      return Status(StatusCode::kInvalidArgument,
                    "post_write: signal_idx " + std::to_string(op.signal_idx) + "; " +
                        peer_name(op.peer) + " has " + std::to_string(q.signal_slots) +
                        " signal slots");
  }
  // A signal after data into GPU memory waits for a flush read of that data (note 3).
  const bool flush = op.has_signal && op.length > 0 && remote->gpu_memory;
  const uint32_t need = (op.length > 0 ? 1u : 0u) + (flush ? 1u : 0u) + (op.has_signal ? 1u : 0u);
  if (outstanding_ + need > options_.max_outstanding_wr)
    return Status(StatusCode::kUnavailable,
                  "post_write: " + std::to_string(outstanding_) + " of " +
                      std::to_string(options_.max_outstanding_wr) +
                      " work requests in flight; poll and retry");

  // Build the chain: [data write] -> [flush read] -> [signal write]. RC executes them in this
  // order; the fence keeps the signal behind the read's response (note 3).
  ibv_sge sge[3]{};
  ibv_send_wr wr[3]{};
  int n = 0;
  uint64_t seq = next_seq_;
  const uint64_t data_seq = seq;
  int slot = -1;
  if (op.length > 0) {
    sge[n].addr = local->addr + op.local_offset;
    sge[n].length = static_cast<uint32_t>(op.length);
    sge[n].lkey = local->mr->lkey;
    wr[n].wr_id = seq++;
    wr[n].sg_list = &sge[n];
    wr[n].num_sge = 1;
    wr[n].opcode = IBV_WR_RDMA_WRITE;
    // The signal write right behind it is signalled, which retires this one too.
    const bool signalled = !op.has_signal && q.since_signal + 1 >= options_.signal_every;
    wr[n].send_flags = signalled ? unsigned{IBV_SEND_SIGNALED} : 0u;
    wr[n].wr.rdma.remote_addr = remote->addr + op.remote_offset;
    wr[n].wr.rdma.rkey = remote->rkey;
    ++n;
  }
  if (flush) {
    const uint64_t k = std::min<uint64_t>(op.length, sizeof(uint64_t));
    sge[n].addr = reinterpret_cast<uintptr_t>(&staging_.back());
    sge[n].length = static_cast<uint32_t>(k);
    sge[n].lkey = staging_mr_->lkey;
    wr[n].wr_id = seq++;
    wr[n].sg_list = &sge[n];
    wr[n].num_sge = 1;
    wr[n].opcode = IBV_WR_RDMA_READ;
    wr[n].send_flags = 0;  // retired by the signalled flag write behind it
    wr[n].wr.rdma.remote_addr = remote->addr + op.remote_offset + op.length - k;
    wr[n].wr.rdma.rkey = remote->rkey;
    ++n;
  }
  if (op.has_signal) {
    slot = free_slots_.back();  // free_slots_ holds max_outstanding_wr >= outstanding_ + 1
    staging_[static_cast<size_t>(slot)] = op.signal_value;
    sge[n].addr = reinterpret_cast<uintptr_t>(&staging_[static_cast<size_t>(slot)]);
    sge[n].length = sizeof(uint64_t);
    sge[n].lkey = staging_mr_->lkey;
    wr[n].wr_id = seq++;
    wr[n].sg_list = &sge[n];
    wr[n].num_sge = 1;
    wr[n].opcode = IBV_WR_RDMA_WRITE;
    wr[n].send_flags = IBV_SEND_SIGNALED | (q.inline_signal ? unsigned{IBV_SEND_INLINE} : 0u) |
                       (flush ? unsigned{IBV_SEND_FENCE} : 0u);
    wr[n].wr.rdma.remote_addr = q.signal_addr + sizeof(uint64_t) * uint64_t{op.signal_idx};
    wr[n].wr.rdma.rkey = q.signal_rkey;
    ++n;
  }
  for (int i = 0; i + 1 < n; ++i) wr[i].next = &wr[i + 1];

  ibv_send_wr* bad = nullptr;
  const int rc = api_->post_send(q.qp.get(), &wr[0], &bad);
  int posted = n;
  if (rc != 0) posted = bad == nullptr ? 0 : static_cast<int>(bad - &wr[0]);
  if (posted <= 0 || posted > n) {
    if (rc == ENOMEM)
      return Status(StatusCode::kUnavailable, "post_write: send queue of " + peer_name(op.peer) +
                                                  " is full (ibv_post_send: " +
                                                  std::strerror(rc) + "); poll and retry");
    return device_error("post_write: ibv_post_send to " + peer_name(op.peer), rc);
  }
  PendingOp pending;
  pending.cookie = op.cookie;
  pending.first_seq = data_seq;
  pending.local_region = op.length > 0 ? op.local_region : 0;
  for (int i = 0; i < posted; ++i) {
    const bool is_signal = op.has_signal && i == n - 1;
    record_wr(q, wr[i].wr_id, (wr[i].send_flags & IBV_SEND_SIGNALED) != 0,
              is_signal ? slot : -1, wr[i].wr.rdma.remote_addr, wr[i].wr.rdma.rkey);
    if (is_signal) free_slots_.pop_back();
  }
  pending.last_seq = wr[posted - 1].wr_id;
  if (posted < n)  // the data write went out, its signal did not: report it in the Completion
    pending.status = device_error("signal write to " + peer_name(op.peer) +
                                      " could not be posted after its data write (ibv_post_send)",
                                  rc);
  next_seq_ = pending.last_seq + 1;
  if (local != nullptr) ++local->inflight;
  q.ops.push_back(std::move(pending));
  return Status::Ok();
}

void VerbsTransportImpl::complete(const PendingOp& op, std::vector<Completion>* completions) {
  if (op.local_region != 0) {
    auto it = regions_.find(op.local_region);
    if (it != regions_.end() && it->second.inflight > 0) --it->second.inflight;
  }
  completions->push_back(Completion{op.cookie, op.status});
}

void VerbsTransportImpl::retire_through(QueuePair& q, uint64_t seq) {
  while (!q.wrs.empty() && q.wrs.front().seq <= seq) {
    const PendingWr& w = q.wrs.front();
    if (w.signalled && q.signalled_inflight > 0) --q.signalled_inflight;
    if (w.staging_slot >= 0) free_slots_.push_back(w.staging_slot);
    if (outstanding_ > 0) --outstanding_;
    q.wrs.pop_front();
  }
  if (q.wrs.empty()) q.tail_unsignalled = false;
}

void VerbsTransportImpl::fail_queue_pair(uint32_t rank, const Status& why,
                                         std::vector<Completion>* completions) {
  QueuePair& q = qps_[rank];
  q.failed = true;
  q.failure = why;
  // Work requests behind the failure are flushed by the NIC; some providers report unsignalled
  // ones, some do not. Fail them now and ignore whatever this queue pair reports later.
  retire_through(q, std::numeric_limits<uint64_t>::max());
  while (!q.ops.empty()) {
    PendingOp& op = q.ops.front();
    if (op.status.ok())
      op.status = Status(why.code() == StatusCode::kOk ? StatusCode::kInternal : why.code(),
                         "not executed: an earlier write to " + peer_name(rank) +
                             " failed: " + why.message());
    complete(op, completions);
    q.ops.pop_front();
  }
}

void VerbsTransportImpl::handle_completion(const ibv_wc& wc,
                                           std::vector<Completion>* completions) {
  auto found = rank_by_qpn_.find(wc.qp_num);
  if (found == rank_by_qpn_.end()) return;
  const uint32_t rank = found->second;
  QueuePair& q = qps_[rank];
  if (q.failed) return;  // already failed whole; these are its flushes
  const uint64_t seq = wc.wr_id;
  Status status;
  if (wc.status != IBV_WC_SUCCESS) {
    const char* text = api_->wc_status_str(wc.status);
    char vendor[16];
    std::snprintf(vendor, sizeof(vendor), "0x%x", wc.vendor_err);
    status = Status(wc_status_code(wc.status),
                    "RDMA write to " + peer_name(rank) + " failed: " +
                        (text != nullptr ? text : "?") + " (" + wc_status_name(wc.status) +
                        ", vendor error " + vendor + ")");
  }
  // In-order execution: a completion for `seq` means every earlier work request of this queue
  // pair finished successfully (a failed one would have completed with its own error).
  retire_through(q, seq);
  while (!q.ops.empty()) {
    PendingOp& op = q.ops.front();
    if (op.first_seq > seq) break;
    if (!status.ok() && op.last_seq >= seq && op.status.ok()) op.status = status;
    if (op.last_seq > seq) break;
    complete(op, completions);
    q.ops.pop_front();
  }
  if (!status.ok()) fail_queue_pair(rank, status, completions);
}

void VerbsTransportImpl::post_flush(uint32_t rank, std::vector<Completion>* completions) {
  QueuePair& q = qps_[rank];
  // A signalled zero-length RDMA write at the last target: it moves no data and its completion
  // retires the unsignalled work requests ahead of it.
  ibv_send_wr wr{};
  wr.wr_id = next_seq_;
  wr.sg_list = nullptr;
  wr.num_sge = 0;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = q.last_remote_addr;
  wr.wr.rdma.rkey = q.last_rkey;
  ibv_send_wr* bad = nullptr;
  if (int rc = api_->post_send(q.qp.get(), &wr, &bad); rc != 0) {
    if (rc == ENOMEM) return;  // full: a completion will come and the next poll retries
    fail_queue_pair(rank,
                    device_error("ibv_post_send(completion request to " + peer_name(rank) + ")",
                                 rc),
                    completions);
    return;
  }
  record_wr(q, next_seq_, true, -1, q.last_remote_addr, q.last_rkey);
  ++next_seq_;
}

size_t VerbsTransportImpl::poll(std::vector<Completion>* out,
                                std::vector<Arrival>* /*arrivals: none, see note 2*/) {
  // Without a place to put them, completions wait here for a later call (net_transport.h).
  std::vector<Completion>* completions = out != nullptr ? out : &undelivered_;
  const size_t before = out != nullptr ? out->size() : 0;
  if (out != nullptr && !undelivered_.empty()) {
    for (Completion& c : undelivered_) out->push_back(std::move(c));
    undelivered_.clear();
  }
  if (!broken_.ok() || !cq_) return out != nullptr ? out->size() - before : 0;
  constexpr int kBatch = 16;
  constexpr int kMaxBatches = 8;  // bounds the time one poll() takes
  ibv_wc wc[kBatch];
  for (int b = 0; b < kMaxBatches; ++b) {
    const int got = api_->poll_cq(cq_.get(), kBatch, wc);
    if (got < 0) {
      // The completion queue itself failed (overrun or device error): nothing in flight will
      // ever be reported, so fail all of it, and every later post.
      broken_ = Status(StatusCode::kDeviceError,
                       "ibv_poll_cq failed (" + std::to_string(got) +
                           "); the completion queue is unusable");
      for (uint32_t r = 0; r < qps_.size(); ++r)
        if (qps_[r].connected && !qps_[r].failed) fail_queue_pair(r, broken_, completions);
      return out != nullptr ? out->size() - before : 0;
    }
    for (int i = 0; i < got; ++i) handle_completion(wc[i], completions);
    if (got < kBatch) break;
  }
  for (uint32_t r = 0; r < qps_.size(); ++r) {
    QueuePair& q = qps_[r];
    if (q.connected && !q.failed && q.tail_unsignalled && q.signalled_inflight == 0 &&
        outstanding_ < options_.max_outstanding_wr)
      post_flush(r, completions);
  }
  return out != nullptr ? out->size() - before : 0;
}

}  // namespace mkernel::daemon::net::verbs
