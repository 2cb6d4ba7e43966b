// fabric_transport.cc: the data path of the libfabric transport: posting writes (fi_write,
// fi_writedata with the signal in remote CQ data, or fi_write then a signal message by fi_send
// once the data's completion is in), reading the completion queue into
// Completions and Arrivals, errors and the completion timeout. Opening and registrations are in
// fabric_open.cc; the class is in fabric_endpoint.h; the contract in net_transport.h.
#include "fabric_endpoint.h"

namespace mkernel::daemon::net::fabric {

OpSlot* FabricTransport::take_slot(OpSlot::Kind kind) {
  if (free_slots_.empty()) return nullptr;
  OpSlot* slot = free_slots_.back();
  free_slots_.pop_back();
  std::memset(&slot->context, 0, sizeof(slot->context));
  slot->kind = kind;
  slot->phase = OpSlot::Phase::kOne;
  slot->signal_idx = 0;
  slot->signal_value = 0;
  slot->cookie = 0;
  slot->peer = 0;
  slot->local_region = 0;
  slot->piece_done = slot->piece_bytes = slot->total_bytes = 0;
  slot->local_buf = nullptr;
  slot->local_desc = nullptr;
  slot->remote_addr = slot->remote_key = slot->cq_data = 0;
  slot->piece_signal = OpSlot::PieceSignal::kNone;
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

Status FabricTransport::post_receive(OpSlot* slot, bool progress_on_eagain) {
  if (slot == nullptr) return Status(StatusCode::kInternal, "no operation slot for a receive");
  int ret = 0;
  for (int attempt = 0; attempt <= kEagainRetries; ++attempt) {
    std::memset(&slot->context, 0, sizeof(slot->context));
    ret = static_cast<int>(fi_recv(ep_.get(), message_buffer(slot), kSignalMessageBytes,
                                   fi_mr_desc(messages_mr_.get()), FI_ADDR_UNSPEC, &slot->context));
    if (ret != -FI_EAGAIN || !progress_on_eagain) break;
    progress();
  }
  if (ret != 0) {
    free_slot(slot);
    return fi_status(StatusCode::kDeviceError, "fi_recv", ret);
  }
  return Status::Ok();
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
  // The message path carries the whole value: nothing to check (design note 3).
  const bool by_message = op.has_signal && signal_path_ == SignalValuePath::kMessage;
  if (op.has_signal && !by_message) {
    if (encoding_.cq_data_bytes == 0) {
      return Status(StatusCode::kFailedPrecondition,
                    "write " + std::to_string(op.cookie) +
                        ": signal requested but the provider offers no remote CQ data");
    }
    MK_ASSIGN_OR_RETURN(data, encode_signal(encoding_, op.signal_idx, op.signal_value));
    if (encoding_.value_bits < 64) {
      auto last = last_sent_.find(signal_key);
      // The receiver takes a flag's first value as its low bits: a larger one would arrive short
      // and its waiter would never see it (a hang where an error belongs).
      if (last == last_sent_.end() && (op.signal_value >> encoding_.value_bits) != 0) {
        return Status(StatusCode::kInvalidArgument,
                      "write " + std::to_string(op.cookie) + ": signal " + std::to_string(op.signal_idx) +
                          " value " + std::to_string(op.signal_value) +
                          " is the first to this peer's flag; expected below 2^" +
                          std::to_string(encoding_.value_bits) + " (the " +
                          std::to_string(encoding_.cq_data_bytes) +
                          "-byte CQ data encoding carries the low bits, and the receiver starts from them)");
      }
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
  if (piece_bytes_ > 0 && op.length > piece_bytes_) {
    // In pieces, after the writes in pieces posted before it (design note 6).
    slot->phase = OpSlot::Phase::kPieceQueued;
    slot->total_bytes = op.length;
    slot->local_buf = static_cast<uint8_t*>(local_buf);
    slot->local_desc = local_desc;
    slot->remote_addr = remote_addr;
    slot->remote_key = remote_key;
    slot->cq_data = data;
    slot->piece_signal = !op.has_signal ? OpSlot::PieceSignal::kNone
                         : by_message   ? OpSlot::PieceSignal::kMessage
                                        : OpSlot::PieceSignal::kCqData;
    slot->signal_idx = op.signal_idx;
    slot->signal_value = op.signal_value;
    ++inflight_;
    slot->local_region = op.local_region;
    ++regions_.at(op.local_region).inflight;
    deadlines_.push_back(Deadline{std::chrono::steady_clock::now() + completion_timeout_, slot, slot->generation});
    if (op.has_signal && !by_message) last_sent_[signal_key] = op.signal_value;
    piece_queue_.push_back(QueuedSignal{slot, slot->generation});
    post_queued_pieces();
    return Status::Ok();
  }
  if (by_message) {
    // The data first (no CQ data), the message once its completion is in; a signal-only op is the
    // message alone.
    slot->phase = op.length > 0 ? OpSlot::Phase::kData : OpSlot::Phase::kSignal;
    slot->signal_idx = op.signal_idx;
    slot->signal_value = op.signal_value;
  }

  ssize_t ret = 0;
  for (int attempt = 0; attempt <= kEagainRetries; ++attempt) {
    if (by_message && op.length == 0) {
      ret = send_signal_message(slot);
    } else if (by_message) {
      ret = fi_write(ep_.get(), local_buf, length, local_desc, peer.addr, remote_addr,
                     remote_key, &slot->context);
    } else if (op.has_signal) {
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
    const char* call = by_message ? (op.length == 0 ? "fi_send (signal message)" : "fi_write")
                                  : op.has_signal ? "fi_writedata" : "fi_write";
    return fi_status(StatusCode::kDeviceError, call, static_cast<int>(ret))
        .with_context("write " + std::to_string(op.cookie));
  }
  ++inflight_;
  if (op.length > 0) {
    slot->local_region = op.local_region;
    ++regions_.at(op.local_region).inflight;
  }
  deadlines_.push_back(
      Deadline{std::chrono::steady_clock::now() + completion_timeout_, slot, slot->generation});
  if (op.has_signal && !by_message) last_sent_[signal_key] = op.signal_value;
  return Status::Ok();
}

ssize_t FabricTransport::send_signal_message(OpSlot* slot) {
  std::memset(&slot->context, 0, sizeof(slot->context));
  uint8_t* buf = message_buffer(slot);
  pack_signal_message(slot->signal_idx, slot->signal_value, buf);
  return fi_send(ep_.get(), buf, kSignalMessageBytes, fi_mr_desc(messages_mr_.get()),
                 peers_[slot->peer].addr, &slot->context);
}

void FabricTransport::post_queued_signals() {
  while (!signal_queue_.empty()) {
    const QueuedSignal q = signal_queue_.front();
    OpSlot* slot = q.slot;
    if (slot->generation != q.generation || slot->kind != OpSlot::Kind::kWrite ||
        slot->phase != OpSlot::Phase::kSignalQueued) {
      signal_queue_.pop_front();  // reported timed out meanwhile
      continue;
    }
    const ssize_t ret = send_signal_message(slot);
    if (ret == -FI_EAGAIN) return;  // still no room: the next progress() tries again
    signal_queue_.pop_front();
    if (ret == 0) {
      slot->phase = OpSlot::Phase::kSignal;
      continue;
    }
    finish_write(slot, fi_status(StatusCode::kDeviceError, "fi_send", static_cast<int>(ret))
                           .with_context("write " + std::to_string(slot->cookie) + " to peer " +
                                         std::to_string(slot->peer) +
                                         ": the data arrived but its signal message could not be sent"));
  }
}

void FabricTransport::post_queued_pieces() {
  while (!piece_queue_.empty()) {
    const QueuedSignal q = piece_queue_.front();
    OpSlot* slot = q.slot;
    if (slot->generation != q.generation || slot->kind != OpSlot::Kind::kWrite ||
        (slot->phase != OpSlot::Phase::kPieceQueued && slot->phase != OpSlot::Phase::kPiece)) {
      piece_queue_.pop_front();  // done, failed or timed out meanwhile
      continue;
    }
    if (slot->phase == OpSlot::Phase::kPiece) return;  // the provider holds its current piece
    const uint64_t at = slot->piece_done;
    const uint64_t bytes = std::min(piece_bytes_, slot->total_bytes - at);
    const bool last = at + bytes == slot->total_bytes;
    const Peer& peer = peers_[slot->peer];
    std::memset(&slot->context, 0, sizeof(slot->context));
    const ssize_t ret =
        last && slot->piece_signal == OpSlot::PieceSignal::kCqData
            ? fi_writedata(ep_.get(), slot->local_buf + at, bytes, slot->local_desc, slot->cq_data, peer.addr,
                           slot->remote_addr + at, slot->remote_key, &slot->context)
            : fi_write(ep_.get(), slot->local_buf + at, bytes, slot->local_desc, peer.addr, slot->remote_addr + at,
                       slot->remote_key, &slot->context);
    if (ret == -FI_EAGAIN) return;  // no room now: the next progress() tries again
    if (ret != 0) {
      piece_queue_.pop_front();
      finish_write(slot, fi_status(StatusCode::kDeviceError, last && slot->piece_signal == OpSlot::PieceSignal::kCqData
                                                                 ? "fi_writedata"
                                                                 : "fi_write",
                                   static_cast<int>(ret))
                             .with_context("write " + std::to_string(slot->cookie) + " to peer " +
                                           std::to_string(slot->peer) + ", the piece at byte " + std::to_string(at) +
                                           " of " + std::to_string(slot->total_bytes)));
      continue;
    }
    slot->piece_bytes = bytes;
    slot->phase = OpSlot::Phase::kPiece;
    return;
  }
}

void FabricTransport::finish_write(OpSlot* slot, Status status) {
  pending_completions_.push_back(Completion{slot->cookie, std::move(status)});
  --inflight_;
  release_source(slot);
  free_slot(slot);
}

void FabricTransport::receive_signal_message(OpSlot* slot, size_t length, fi_addr_t source) {
  uint32_t idx = 0;
  uint64_t value = 0;
  if (!unpack_signal_message(message_buffer(slot), length, &idx, &value)) {
    ++foreign_messages_;
    return;
  }
  Arrival arrival;
  arrival.peer = peer_of(source);
  arrival.signal_idx = idx;
  // Two signals of one flag in flight may land in either order: never report a value below one
  // reported before (flags are monotonic; waiters wait for >=).
  const uint64_t key = (static_cast<uint64_t>(arrival.peer) << 32) | idx;
  auto [it, first] = last_message_value_.try_emplace(key, value);
  if (!first) it->second = std::max(it->second, value);
  arrival.signal_value = it->second;
  pending_arrivals_.push_back(arrival);
}

uint32_t FabricTransport::peer_of(fi_addr_t source) const {
  if (source == FI_ADDR_NOTAVAIL) return kUnknownPeer;
  auto it = peer_by_addr_.find(source);
  return it == peer_by_addr_.end() ? kUnknownPeer : it->second;
}

OpSlot* FabricTransport::slot_of(const void* context) const {
  const auto p = reinterpret_cast<uintptr_t>(context);
  const auto base = reinterpret_cast<uintptr_t>(slots_.get());
  if (context == nullptr || slots_ == nullptr || p < base || p - base >= num_slots_ * sizeof(OpSlot) ||
      (p - base) % sizeof(OpSlot) != 0)
    return nullptr;
  return &slots_[(p - base) / sizeof(OpSlot)];
}

void FabricTransport::handle_entry(const fi_cq_data_entry& entry, fi_addr_t source) {
  // A peer's write landing here (target side) names an operation of ours only when it consumed a
  // posted receive (FI_RX_CQ_DATA); otherwise its op_context is not ours to read (OpSlot).
  const bool target_side =
      (entry.flags & (FI_REMOTE_WRITE | FI_REMOTE_CQ_DATA)) != 0 && (entry.flags & FI_WRITE) == 0;
  OpSlot* slot = target_side && !rx_cq_data_ ? nullptr : slot_of(entry.op_context);
  if (slot == nullptr && !target_side) {
    ++stray_entries_;
    return;
  }
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
  } else if (slot != nullptr && slot->kind == OpSlot::Kind::kReceive) {
    // A peer's signal message (SignalValuePath::kMessage): the whole value is in the buffer.
    receive_signal_message(slot, entry.len, source);
  }
  if (slot == nullptr) return;
  if (slot->kind == OpSlot::Kind::kReceive) {
    // A receive consumed by a signal message, by remote CQ data (FI_RX_CQ_DATA) or by a stray
    // message: post it again.
    const Status posted = post_receive(slot, /*progress_on_eagain=*/false);
    if (!posted.ok()) {
      ++receive_errors_;
      receive_error_ = posted.message();
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
    if (slot->phase == OpSlot::Phase::kPiece) {
      // A piece is at the target (delivery complete): the next one is posted at the end of this
      // progress() pass (post_queued_pieces); after the last, the write is done or its signal
      // message follows.
      slot->piece_done += slot->piece_bytes;
      slot->piece_bytes = 0;
      if (slot->piece_done < slot->total_bytes) {
        slot->phase = OpSlot::Phase::kPieceQueued;
        return;
      }
      if (slot->piece_signal != OpSlot::PieceSignal::kMessage) {
        finish_write(slot, Status::Ok());
        return;
      }
      slot->phase = OpSlot::Phase::kData;  // all of its data is in: its signal message, as below
    }
    if (slot->phase == OpSlot::Phase::kData) {
      // The data is in the peer's memory (delivery complete): now its signal. Posted at the end
      // of this progress() pass (post_queued_signals), in completion order.
      release_source(slot);
      slot->phase = OpSlot::Phase::kSignalQueued;
      signal_queue_.push_back(QueuedSignal{slot, slot->generation});
      return;
    }
    finish_write(slot, Status::Ok());
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
  OpSlot* slot = slot_of(err.op_context);  // nullptr for a context that is not ours (OpSlot)
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
    (void)post_receive(slot, /*progress_on_eagain=*/false);  // frees the slot when it fails
    return;
  }
  finish_write(slot, Status(completion_code(err.err),
                            "write " + std::to_string(slot->cookie) + " to peer " +
                                std::to_string(slot->peer) +
                                (slot->phase == OpSlot::Phase::kSignal
                                     ? " failed at its signal message (after any data had arrived): "
                                 : slot->phase == OpSlot::Phase::kPiece
                                     ? " failed at its piece of " + std::to_string(slot->piece_bytes) +
                                           " bytes at byte " + std::to_string(slot->piece_done) + " of " +
                                           std::to_string(slot->total_bytes) + ": "
                                     : std::string(" failed: ")) +
                                message));
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
  post_queued_pieces();
  post_queued_signals();
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
    if (d.slot->phase == OpSlot::Phase::kPieceQueued) {
      // Its next piece still waits for its turn (we hold the context): free at once; its queue
      // entry is skipped.
      OpSlot* slot = d.slot;
      deadlines_.pop_front();
      finish_write(slot, Status(StatusCode::kDeadlineExceeded,
                                "write " + std::to_string(slot->cookie) + " to peer " + std::to_string(slot->peer) +
                                    ": " + std::to_string(slot->piece_done) + " of its " +
                                    std::to_string(slot->total_bytes) + " bytes written within " +
                                    std::to_string(completion_timeout_.count()) +
                                    " ms of its post (writes in pieces go one after another)"));
      continue;
    }
    if (d.slot->phase == OpSlot::Phase::kSignalQueued) {
      // The data arrived but the provider never had room for its signal message: we hold the
      // context, so the slot is free at once (its queue entry is skipped).
      OpSlot* slot = d.slot;
      deadlines_.pop_front();
      finish_write(slot, Status(StatusCode::kDeadlineExceeded,
                                "write " + std::to_string(slot->cookie) + " to peer " +
                                    std::to_string(slot->peer) +
                                    ": the data arrived but the provider took no signal message within " +
                                    std::to_string(completion_timeout_.count()) + " ms"));
      continue;
    }
    // The provider lost this write (shm 1.17 does, for a write the target refuses): report it
    // once, keep the context quarantined until the provider returns it.
    pending_completions_.push_back(Completion{
        d.slot->cookie,
        Status(StatusCode::kDeadlineExceeded,
               "write " + std::to_string(d.slot->cookie) + " to peer " +
                   std::to_string(d.slot->peer) + ": no completion from the provider within " +
                   std::to_string(completion_timeout_.count()) + " ms" +
                   (d.slot->phase == OpSlot::Phase::kSignal  ? " (for its signal message)"
                    : d.slot->phase == OpSlot::Phase::kPiece ? " (for its piece at byte " +
                                                                   std::to_string(d.slot->piece_done) + " of " +
                                                                   std::to_string(d.slot->total_bytes) + ")"
                                                             : std::string()))});
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

}  // namespace mkernel::daemon::net::fabric
