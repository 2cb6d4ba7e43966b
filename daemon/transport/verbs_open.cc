// verbs_open.cc: opening a verbs device (device list, port, protection domain, staging region,
// completion queue), queue pairs and their transitions, addresses and peers, registrations and
// the signal region. The data path is verbs_transport.cc; the class is in verbs_endpoint.h.
#include "verbs_endpoint.h"

namespace mkernel::daemon::net {
namespace verbs {

Status VerbsTransportImpl::open() {
  VerbsApi& api = *api_;
  int num = 0;
  ibv_device** list = api.get_device_list(&num);
  DeviceList list_guard(&api, list);
  if (list == nullptr || num <= 0) return Status(StatusCode::kUnavailable, kNoRdmaDeviceMessage);

  const std::string port = std::to_string(options_.port);
  std::string present;
  std::string inactive;
  std::string chosen;
  bool named_seen = false;
  for (int i = 0; i < num && !context_; ++i) {
    const char* raw = api.get_device_name(list[i]);
    const std::string name = raw != nullptr ? raw : "?";
    present += (present.empty() ? "" : ", ") + name;
    if (!options_.device.empty() && name != options_.device) continue;
    named_seen = true;
    ContextPtr ctx(api.open_device(list[i]), {&api});
    if (!ctx) {
      const int err = errno;
      if (!options_.device.empty()) return device_error("ibv_open_device(" + name + ")", err);
      inactive += (inactive.empty() ? "" : ", ") + name + " (open failed)";
      continue;
    }
    ibv_port_attr attr{};
    if (int rc = api.query_port(ctx.get(), options_.port, &attr); rc != 0) {
      if (!options_.device.empty())
        return device_error("ibv_query_port(" + name + ", port " + port + ")", rc);
      inactive += (inactive.empty() ? "" : ", ") + name + " (port " + port + " query failed)";
      continue;
    }
    if (attr.state != IBV_PORT_ACTIVE) {
      inactive += (inactive.empty() ? "" : ", ") + name + " port " + port + " " +
                  port_state_name(attr.state);
      continue;
    }
    context_ = std::move(ctx);
    port_attr_ = attr;
    chosen = name;
  }
  if (!options_.device.empty() && !named_seen)
    return Status(StatusCode::kNotFound, "device: \"" + options_.device +
                                             "\" is not an RDMA device here; present: " + present);
  if (!context_)
    return Status(StatusCode::kUnavailable,
                  "no RDMA device with port " + port + " active (" + inactive + ")");

  ibv_device_attr dev{};
  if (int rc = api.query_device(context_.get(), &dev); rc != 0)
    return device_error("ibv_query_device(" + chosen + ")", rc);
  const uint64_t cq_depth = 2ull * options_.max_outstanding_wr;
  if (dev.max_qp_wr > 0 && options_.max_outstanding_wr > static_cast<uint32_t>(dev.max_qp_wr))
    return Status(StatusCode::kInvalidArgument,
                  "max_outstanding_wr: " + std::to_string(options_.max_outstanding_wr) +
                      "; device " + chosen + " allows at most " + std::to_string(dev.max_qp_wr));
  if (dev.max_cqe > 0 && cq_depth > static_cast<uint64_t>(dev.max_cqe))
    return Status(StatusCode::kInvalidArgument,
                  "max_outstanding_wr: " + std::to_string(options_.max_outstanding_wr) +
                      "; needs a completion queue of " + std::to_string(cq_depth) +
                      " entries and device " + chosen + " allows " + std::to_string(dev.max_cqe));
  if (int rc = api.query_gid(context_.get(), options_.port, options_.gid_index, &gid_); rc != 0)
    return device_error("ibv_query_gid(" + chosen + ", port " + port + ", gid_index " +
                            std::to_string(options_.gid_index) + ")",
                        rc < 0 ? errno : rc);
  max_message_ = std::min<uint64_t>(port_attr_.max_msg_sz > 0 ? port_attr_.max_msg_sz : 1u << 31,
                                    std::numeric_limits<uint32_t>::max());

  pd_ = PdPtr(api.alloc_pd(context_.get()), {&api});
  if (!pd_) return device_error("ibv_alloc_pd(" + chosen + ")", errno);

  // Flag values of signal writes that do not go inline must stay in registered memory until
  // their work request completes; the NIC only reads them (LOCAL_WRITE is what reg_mr needs).
  // One more entry than slots: the last is where flush reads land (note 3); its contents are
  // never looked at.
  staging_.assign(size_t{options_.max_outstanding_wr} + 1, 0);
  staging_mr_ = MrPtr(api.reg_mr(pd_.get(), staging_.data(), staging_.size() * sizeof(uint64_t),
                                 IBV_ACCESS_LOCAL_WRITE),
                      {&api});
  if (!staging_mr_) return device_error("ibv_reg_mr(signal staging)", errno);
  for (int s = static_cast<int>(options_.max_outstanding_wr) - 1; s >= 0; --s) free_slots_.push_back(s);

  cq_ = CqPtr(api.create_cq(context_.get(), static_cast<int>(cq_depth)), {&api});
  if (!cq_) return device_error("ibv_create_cq(" + chosen + ")", errno);

  caps_.provider = "verbs:" + chosen;
  caps_.version = std::string("firmware ") + dev.fw_ver;
  // RDMA reads in flight per queue pair (the flushes of verbs_transport.h note 3): what the
  // device allows, at most 16. The responder side is published in the address; the initiator
  // side takes the smaller of its own limit and the peer's.
  auto clamp_rd = [](int v) { return static_cast<uint16_t>(std::clamp(v, 1, 16)); };
  rd_responder_ = clamp_rd(dev.max_qp_rd_atom);
  rd_initiator_ = clamp_rd(dev.max_qp_init_rd_atom);
  caps_.remote_write = true;
  caps_.addressing = Addressing::kEndpoints;
  caps_.signals = SignalDelivery::kSignalRegion;
  caps_.ordered_writes = true;
  caps_.dmabuf = true;
  caps_.needs_host_staging = false;
  caps_.cq_data_bytes = 0;
  caps_.max_inflight = std::max<uint32_t>(1, options_.max_outstanding_wr / 2);
  return Status::Ok();
}

Status VerbsTransportImpl::create_queue_pairs() {
  std::vector<QueuePair> qps(options_.num_ranks);
  for (uint32_t r = 0; r < options_.num_ranks; ++r) {
    if (r == options_.rank) continue;
    QueuePair& q = qps[r];
    ibv_qp_init_attr init{};
    init.send_cq = cq_.get();
    init.recv_cq = cq_.get();
    init.qp_type = IBV_QPT_RC;
    init.sq_sig_all = 0;  // selective signalling (verbs_transport.h note 4)
    init.cap.max_send_wr = options_.max_outstanding_wr;
    init.cap.max_recv_wr = 1;  // nothing is ever received: peers only write
    init.cap.max_send_sge = 1;
    init.cap.max_recv_sge = 1;
    init.cap.max_inline_data = options_.max_inline;
    q.qp = QpPtr(api_->create_qp(pd_.get(), &init), {api_.get()});
    if (!q.qp) return device_error("ibv_create_qp(for " + peer_name(r) + ")", errno);
    q.inline_signal = init.cap.max_inline_data >= sizeof(uint64_t);
    q.psn = static_cast<uint32_t>(rng_()) & 0xffffffu;

    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_INIT;
    attr.pkey_index = 0;
    attr.port_num = options_.port;
    // Peers write into our registered regions, and read back from those in GPU memory (the
    // flush of note 3); each region's own access flags still decide which allow what.
    attr.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    const int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
    if (int rc = api_->modify_qp(q.qp.get(), &attr, mask); rc != 0)
      return device_error("ibv_modify_qp(RESET->INIT, for " + peer_name(r) + ")", rc);
  }
  qps_ = std::move(qps);
  for (uint32_t r = 0; r < qps_.size(); ++r)
    if (qps_[r].qp) rank_by_qpn_[qps_[r].qp->qp_num] = r;
  return Status::Ok();
}

StatusOr<Blob> VerbsTransportImpl::local_address() {
  if (qps_.empty()) MK_RETURN_IF_ERROR(create_queue_pairs());
  wire::Address a;
  a.link_layer = port_attr_.link_layer;
  a.mtu = static_cast<uint8_t>(port_attr_.active_mtu);
  a.lid = port_attr_.lid;
  a.rd_atomic = rd_responder_;
  a.rank = options_.rank;
  a.num_ranks = options_.num_ranks;
  std::memcpy(a.gid.data(), gid_.raw, a.gid.size());
  if (signal_region_ != 0) {
    const LocalRegion& s = regions_.at(signal_region_);
    a.signal_addr = s.addr;
    a.signal_rkey = s.mr->rkey;
    a.signal_slots = static_cast<uint32_t>(
        std::min<uint64_t>(s.length / sizeof(uint64_t), std::numeric_limits<uint32_t>::max()));
  }
  a.qps.resize(options_.num_ranks);
  for (uint32_t r = 0; r < qps_.size(); ++r)
    if (qps_[r].qp) a.qps[r] = {qps_[r].qp->qp_num, qps_[r].psn};
  address_published_ = true;
  return wire::encode_address(a);
}

Status VerbsTransportImpl::connect(uint32_t rank, const wire::Address& remote) {
  QueuePair& q = qps_[rank];
  // INIT -> RTR: where the peer is and what it expects.
  ibv_qp_attr rtr{};
  rtr.qp_state = IBV_QPS_RTR;
  rtr.path_mtu = static_cast<ibv_mtu>(std::min<int>(port_attr_.active_mtu, remote.mtu));
  rtr.dest_qp_num = remote.qps[options_.rank].qpn;
  rtr.rq_psn = remote.qps[options_.rank].psn;
  rtr.max_dest_rd_atomic = static_cast<uint8_t>(rd_responder_);
  rtr.min_rnr_timer = options_.min_rnr_timer;
  rtr.ah_attr.dlid = remote.lid;
  rtr.ah_attr.sl = options_.service_level;
  rtr.ah_attr.src_path_bits = 0;
  rtr.ah_attr.port_num = options_.port;
  // RoCE always routes by GID; InfiniBand needs the GRH only without a LID or across subnets.
  const bool other_subnet = std::memcmp(remote.gid.data(), gid_.raw, 8) != 0;
  if (port_attr_.link_layer == IBV_LINK_LAYER_ETHERNET || remote.lid == 0 || other_subnet) {
    rtr.ah_attr.is_global = 1;
    std::memcpy(rtr.ah_attr.grh.dgid.raw, remote.gid.data(), remote.gid.size());
    rtr.ah_attr.grh.sgid_index = static_cast<uint8_t>(options_.gid_index);
    rtr.ah_attr.grh.hop_limit = options_.hop_limit;
    rtr.ah_attr.grh.traffic_class = options_.traffic_class;
    rtr.ah_attr.grh.flow_label = 0;
  }
  const int rtr_mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                       IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  if (int rc = api_->modify_qp(q.qp.get(), &rtr, rtr_mask); rc != 0)
    return device_error("connecting to " + peer_name(rank) + ": ibv_modify_qp(INIT->RTR)", rc);

  // RTR -> RTS: how this side retries.
  ibv_qp_attr rts{};
  rts.qp_state = IBV_QPS_RTS;
  rts.timeout = options_.timeout;
  rts.retry_cnt = options_.retry_cnt;
  rts.rnr_retry = options_.rnr_retry;
  rts.sq_psn = q.psn;
  rts.max_rd_atomic = static_cast<uint8_t>(std::min<uint16_t>(rd_initiator_, std::max<uint16_t>(1, remote.rd_atomic)));
  const int rts_mask = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                       IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC;
  if (int rc = api_->modify_qp(q.qp.get(), &rts, rts_mask); rc != 0)
    return device_error("connecting to " + peer_name(rank) + ": ibv_modify_qp(RTR->RTS)", rc);
  return Status::Ok();
}

StatusOr<uint32_t> VerbsTransportImpl::add_peer(std::span<const uint8_t> address) {
  MK_ASSIGN_OR_RETURN(wire::Address remote, wire::decode_address(address));
  if (remote.num_ranks != options_.num_ranks)
    return Status(StatusCode::kInvalidArgument,
                  "peer address: communicator of " + std::to_string(remote.num_ranks) +
                      " ranks; this endpoint's has " + std::to_string(options_.num_ranks));
  if (remote.rank == options_.rank)
    return Status(StatusCode::kInvalidArgument,
                  "peer address: rank " + std::to_string(remote.rank) + " is this endpoint");
  if (remote.link_layer != port_attr_.link_layer)
    return Status(StatusCode::kInvalidArgument,
                  peer_name(remote.rank) +
                      ": link layer differs from this port's (InfiniBand and RoCE do not mix)");
  if (qps_.empty()) MK_RETURN_IF_ERROR(create_queue_pairs());
  QueuePair& q = qps_[remote.rank];
  if (q.connected)
    return Status(StatusCode::kAlreadyExists, peer_name(remote.rank) + " is already connected");
  if (q.failed)
    return Status(StatusCode::kFailedPrecondition,
                  peer_name(remote.rank) + ": an earlier connect failed: " + q.failure.message());
  if (remote.qps[options_.rank].qpn == 0)
    return Status(StatusCode::kProtocolError,
                  peer_name(remote.rank) + "'s address has no queue pair for rank " +
                      std::to_string(options_.rank));
  if (Status s = connect(remote.rank, remote); !s.ok()) {
    q.failed = true;  // the queue pair is in an unknown state: not used again
    q.failure = s;
    return s;
  }
  q.connected = true;
  q.signal_addr = remote.signal_addr;
  q.signal_rkey = remote.signal_rkey;
  q.signal_slots = remote.signal_slots;
  return remote.rank;
}

StatusOr<Registration> VerbsTransportImpl::register_memory(const RegisterRequest& request) {
  if (request.length == 0)
    return Status(StatusCode::kInvalidArgument, "register_memory: length 0; expected > 0");
  if (request.addr == nullptr)
    return Status(StatusCode::kInvalidArgument, "register_memory: no address given");
  if (request.kind == MemoryKind::kDmabuf && request.dmabuf_fd < 0)
    return Status(StatusCode::kInvalidArgument,
                  "register_memory: dmabuf_fd " + std::to_string(request.dmabuf_fd) +
                      "; expected a descriptor >= 0 for MemoryKind::kDmabuf");
  // Peers may write only where the caller said so (net_transport.h note 4). Never
  // IBV_ACCESS_RELAXED_ORDERING: these regions receive flags (verbs_transport.h note 3).
  int access = IBV_ACCESS_LOCAL_WRITE;
  if (request.remote_writable) access |= IBV_ACCESS_REMOTE_WRITE;
  // Writers into GPU memory read back before raising the flag (note 3).
  if (request.remote_writable && request.kind == MemoryKind::kDmabuf) access |= IBV_ACCESS_REMOTE_READ;
  const uint64_t va = reinterpret_cast<uintptr_t>(request.addr);
  ibv_mr* raw = nullptr;
  const char* what = nullptr;
  if (request.kind == MemoryKind::kHost) {
    raw = api_->reg_mr(pd_.get(), request.addr, request.length, access);
    what = "ibv_reg_mr(host memory, ";
  } else if (request.kind == MemoryKind::kDmabuf) {
    // The GPU virtual address is the region's iova, so work requests and peers use GPU VAs.
    raw = api_->reg_dmabuf_mr(pd_.get(), request.dmabuf_offset, request.length, va,
                              request.dmabuf_fd, access);
    what = "ibv_reg_dmabuf_mr(GPU memory, ";
  } else {
    return Status(StatusCode::kInvalidArgument,
                  "register_memory: kind " + std::to_string(static_cast<int>(request.kind)) +
                      "; expected kHost or kDmabuf");
  }
  if (raw == nullptr)
    return device_error(std::string(what) + std::to_string(request.length) + " bytes)", errno);
  LocalRegion region;
  region.mr = MrPtr(raw, {api_.get()});
  region.addr = va;
  region.length = request.length;
  region.remote_writable = request.remote_writable;
  Registration out;
  out.local_id = next_local_id_++;
  if (request.remote_writable)
    out.descriptor = wire::encode_region({va, request.length, raw->rkey, request.kind == MemoryKind::kDmabuf});
  regions_.emplace(out.local_id, std::move(region));
  return out;
}

Status VerbsTransportImpl::deregister_memory(uint64_t local_id) {
  auto it = regions_.find(local_id);
  if (it == regions_.end())
    return Status(StatusCode::kNotFound,
                  "deregister_memory: region " + std::to_string(local_id) + " is not registered");
  if (local_id == signal_region_)
    return Status(StatusCode::kFailedPrecondition,
                  "deregister_memory: region " + std::to_string(local_id) +
                      " is the signal region; it lives as long as the transport");
  if (it->second.inflight > 0)
    return Status(StatusCode::kFailedPrecondition,
                  "deregister_memory: region " + std::to_string(local_id) + " has " +
                      std::to_string(it->second.inflight) +
                      " writes in flight; poll until they complete");
  ibv_mr* mr = it->second.mr.release();
  if (int rc = api_->dereg_mr(mr); rc != 0) {
    it->second.mr.reset(mr);  // still registered: keep owning it
    return device_error("ibv_dereg_mr(region " + std::to_string(local_id) + ")", rc);
  }
  regions_.erase(it);
  return Status::Ok();
}

StatusOr<uint64_t> VerbsTransportImpl::import_region(uint32_t peer,
                                                     std::span<const uint8_t> descriptor) {
  if (peer >= qps_.size() || !qps_[peer].connected)
    return Status(StatusCode::kNotFound, "import_region: " + peer_name(peer) + " is not connected");
  MK_ASSIGN_OR_RETURN(wire::Region r, wire::decode_region(descriptor));
  const uint64_t id = next_remote_id_++;
  remote_regions_[id] = RemoteRegion{peer, r.addr, r.length, r.rkey, r.gpu_memory};
  return id;
}

Status VerbsTransportImpl::set_signal_region(uint64_t local_id) {
  if (address_published_)
    return Status(StatusCode::kFailedPrecondition,
                  "set_signal_region: the address was already taken; set the signal region "
                  "before local_address()");
  auto it = regions_.find(local_id);
  if (it == regions_.end())
    return Status(StatusCode::kNotFound,
                  "set_signal_region: region " + std::to_string(local_id) + " is not registered");
  const LocalRegion& r = it->second;
  if (!r.remote_writable)
    return Status(StatusCode::kInvalidArgument,
                  "set_signal_region: region " + std::to_string(local_id) +
                      " was registered without remote_writable; peers could not write flags");
  if (r.length < sizeof(uint64_t) || r.length % sizeof(uint64_t) != 0 ||
      r.addr % sizeof(uint64_t) != 0)
    return Status(StatusCode::kInvalidArgument,
                  "set_signal_region: region " + std::to_string(local_id) + " is " +
                      std::to_string(r.length) +
                      " bytes; expected 8-byte aligned, a non-zero multiple of 8 bytes");
  signal_region_ = local_id;
  return Status::Ok();
}

}  // namespace verbs

Status validate(const VerbsOptions& o) {
  auto bad = [](const std::string& field, uint64_t value, const std::string& expected) {
    return Status(StatusCode::kInvalidArgument,
                  field + ": " + std::to_string(value) + "; expected " + expected);
  };
  if (o.port == 0) return bad("port", o.port, "a port number >= 1");
  if (o.gid_index < 0 || o.gid_index > 255)
    return Status(StatusCode::kInvalidArgument,
                  "gid_index: " + std::to_string(o.gid_index) + "; expected 0..255");
  if (o.max_outstanding_wr < 2 || o.max_outstanding_wr > 32768)
    return bad("max_outstanding_wr", o.max_outstanding_wr,
               "2..32768 (a write with a signal takes two)");
  if (o.signal_every < 1 || o.signal_every > o.max_outstanding_wr)
    return bad("signal_every", o.signal_every, "1..max_outstanding_wr");
  if (o.num_ranks < 1 || o.num_ranks > verbs_wire::kMaxRanks)
    return bad("num_ranks", o.num_ranks, "1.." + std::to_string(verbs_wire::kMaxRanks));
  if (o.rank >= o.num_ranks) return bad("rank", o.rank, "< num_ranks");
  if (o.max_inline > 1024) return bad("max_inline", o.max_inline, "0..1024");
  if (o.timeout > 31) return bad("timeout", o.timeout, "0..31");
  if (o.retry_cnt > 7) return bad("retry_cnt", o.retry_cnt, "0..7");
  if (o.rnr_retry > 7) return bad("rnr_retry", o.rnr_retry, "0..7 (7: retry forever)");
  if (o.min_rnr_timer > 31) return bad("min_rnr_timer", o.min_rnr_timer, "0..31");
  if (o.service_level > 15) return bad("service_level", o.service_level, "0..15");
  return Status::Ok();
}

StatusOr<std::unique_ptr<Transport>> open_verbs(const VerbsOptions& options) {
  return open_verbs(options, real_verbs_api());
}

StatusOr<std::unique_ptr<Transport>> open_verbs(const VerbsOptions& options,
                                                std::shared_ptr<VerbsApi> api) {
  MK_RETURN_IF_ERROR(validate(options));
  if (!api) return Status(StatusCode::kInvalidArgument, "open_verbs: no VerbsApi given");
  auto t = std::make_unique<verbs::VerbsTransportImpl>(std::move(api), options);
  MK_RETURN_IF_ERROR(t->open());
  return std::unique_ptr<Transport>(std::move(t));
}

}  // namespace mkernel::daemon::net
