#include "requests.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <bit>

#include <fcntl.h>

#include "dmabuf.h"
#include "log_text.h"
#include "mkernel/proto/session.pb.h"
#include "mkernel/protocol/version.h"

namespace mkernel::daemon {

namespace pb = mkernel::session::v1;
namespace mp = mkernel::protocol;

namespace {

constexpr size_t kMaxNameBytes = 256;
constexpr size_t kMaxHandlesPerSession = 64;
constexpr size_t kMinTokenBytes = 16, kMaxTokenBytes = 256;
constexpr uint32_t kMaxConnectTimeoutMs = 3600000;

}  // namespace

void fill_error(pb::Reply* reply, const Status& s) {
  reply->mutable_error()->set_code(static_cast<uint32_t>(s.code()));
  reply->mutable_error()->set_message(s.message());
}

Requests::Requests(DaemonState& state, ConnectJobs& connects, const Clients& clients)
    : state_(state), connects_(connects), clients_(clients) {}

Status Requests::take(ClientState& c, const Holding& ask) {
  if (auto denied = state_.ledger.take(c.owner, ask, state_.limits())) {
    c.limit_hit = denied->reason;
    return denied->status;
  }
  c.held += ask;
  return Status::Ok();
}

void Requests::give_back(ClientState& c, const Holding& what) {
  state_.ledger.give_back(c.owner, what);
  c.held -= what;
}

Status Requests::made_nothing(ClientState& c, Status why) {
  // The ledger had room but the process had no descriptor (shm.h: kResourceExhausted).
  if (why.code() == StatusCode::kResourceExhausted) c.limit_hit = Refusal::kOutOfDescriptors;
  return why;
}

Status Requests::over_quota(ClientState& c, Refusal which, std::string text) {
  c.limit_hit = which;
  return Status(StatusCode::kResourceExhausted, std::move(text));
}

Status Requests::hello(ClientState& c, const pb::Request& req, pb::Reply* reply) {
  const std::shared_ptr<Session>& s = c.session;
  if (s->has_hello()) return Status(StatusCode::kFailedPrecondition, "hello: sent twice");
  if (state_.draining.load(std::memory_order_acquire))
    return Status(StatusCode::kUnavailable, "mkerneld is draining and accepts no new sessions");
  const pb::Hello& h = req.hello();
  if (h.protocol_version() != mp::kProtocolVersion)
    return Status(StatusCode::kFailedPrecondition,
                  "protocol_version: " + std::to_string(h.protocol_version()) + "; this mkerneld speaks " +
                      std::to_string(mp::kProtocolVersion));
  Proxy* proxy = nullptr;
  for (auto& p : state_.proxies)
    if (static_cast<int64_t>(p->options().index) == h.gpu()) proxy = p.get();
  if (proxy == nullptr) {
    std::string have;
    for (auto& p : state_.proxies) have += (have.empty() ? "" : ", ") + std::to_string(p->options().index);
    return Status(StatusCode::kNotFound, "gpu: " + std::to_string(h.gpu()) + "; this mkerneld serves " + have);
  }
  if (h.world_size() == 0 || h.world_size() > mp::kMaxRanks)
    return Status(StatusCode::kInvalidArgument, "world_size: " + std::to_string(h.world_size()) +
                                                    "; expected 1.." + std::to_string(mp::kMaxRanks));
  if (h.rank() >= h.world_size())
    return Status(StatusCode::kInvalidArgument, "rank: " + std::to_string(h.rank()) + "; expected 0.." +
                                                    std::to_string(h.world_size() - 1));
  if (h.communicator().empty() || h.communicator().size() > kMaxNameBytes)
    return Status(StatusCode::kInvalidArgument, "communicator: " + std::to_string(h.communicator().size()) +
                                                    " bytes; expected 1.." + std::to_string(kMaxNameBytes));
  if (h.client_name().size() > kMaxNameBytes)
    return Status(StatusCode::kInvalidArgument, "client_name: " + std::to_string(h.client_name().size()) +
                                                    " bytes; expected at most " + std::to_string(kMaxNameBytes));
  Status clash;
  state_.sessions.for_each([&](const std::shared_ptr<Session>& o) {
    if (!clash.ok() || o.get() == s.get() || !o->has_hello() || o->ended()) return;
    if (o->identity().communicator != h.communicator()) return;
    if (o->identity().world_size != h.world_size())
      clash = Status(StatusCode::kInvalidArgument, "world_size: " + std::to_string(h.world_size()) +
                                                       "; communicator \"" + h.communicator() + "\" has " +
                                                       std::to_string(o->identity().world_size));
    else if (o->identity().rank == h.rank())
      clash = Status(StatusCode::kAlreadyExists, "rank " + std::to_string(h.rank()) + " of communicator \"" +
                                                     h.communicator() + "\" is already held by session " +
                                                     std::to_string(o->id()));
  });
  MK_RETURN_IF_ERROR(clash);
  // The GPU's sessions: the process's, the uid's and the node's share (ledger.h).
  const auto gpu = static_cast<uint32_t>(h.gpu());
  if (auto denied = state_.ledger.bind_gpu(c.owner, gpu, state_.limits())) {
    c.limit_hit = denied->reason;
    return denied->status;
  }
  c.bound_gpu = gpu;
  s->set_identity({h.client_name(), h.communicator(), h.rank(), h.world_size(), gpu});
  s->mark_hello();
  proxy->add_session(s);
  state_.republish_peers();
  pb::HelloReply* hr = reply->mutable_hello();
  hr->set_session_id(s->id());
  hr->set_daemon_epoch(state_.epoch);
  hr->set_proxy(proxy->options().index);
  hr->set_max_rings(s->quota().max_rings);
  hr->set_max_registered_bytes(s->quota().max_registered_bytes);
  hr->set_max_commands_in_flight(s->quota().max_inflight);
  hr->set_max_ring_capacity_log2(s->quota().max_ring_capacity_log2);
  hr->set_max_flags(s->quota().max_flags);
  hr->set_peer_address(state_.peer_address);
  hr->set_node(state_.node_name());
  if (const TransportProbe* probe = state_.probe_for(proxy->options().index)) {
    hr->set_gpu_memory(probe->gpu_memory());
    hr->set_gpu_memory_reason(probe->gpu_memory_reason());
  }
  if (uint64_t left_out = 0; state_.session_log.allow(&left_out))
    spdlog::info("session {}: {} pid {} uid {}: communicator {} rank {}/{} on {}{}", s->id(),
                 quoted_printable(h.client_name()), s->creds().pid, s->creds().uid, quoted_printable(h.communicator()),
                 h.rank(), h.world_size(), proxy->options().name, suppressed_note(left_out, "session lines"));
  return Status::Ok();
}

Status Requests::setup(ClientState& c, const pb::Request& req, pb::Reply* reply, std::vector<mp::UniqueFd>* fds) {
  if (req.has_create_ring()) return create_ring(c, req.create_ring().capacity_log2(), reply, fds);
  if ((req.has_create_region() || req.has_create_flags()) && c.connect_started)
    return Status(StatusCode::kFailedPrecondition,
                  std::string(req.has_create_region() ? "create_region" : "create_flags") +
                      ": the session already connected its communicator; create every region and "
                      "the flags before connect");
  if (req.has_create_region())
    return create_region(c, req.create_region().bytes(), req.create_region().remote_writable(), reply, fds);
  if (req.has_create_flags()) return create_flags(c, req.create_flags().count(), reply, fds);
  if (req.has_fetch_handle()) return fetch_handle(c, req, reply, fds);
  if (req.has_ping()) {
    reply->mutable_pong()->set_daemon_epoch(state_.epoch);
    return Status::Ok();
  }
  return Status(StatusCode::kProtocolError, "request " + std::to_string(req.request_id()) + " carries no known body");
}

Status Requests::create_ring(ClientState& c, uint32_t log2, pb::Reply* reply, std::vector<mp::UniqueFd>* fds) {
  Session& s = *c.session;
  const config::DaemonConfig cfg = state_.config();
  if (log2 == 0) log2 = static_cast<uint32_t>(std::bit_width(cfg.rings.capacity) - 1);
  // rings.max_capacity bounds what a client may ask for (never below the default ring).
  const uint32_t max_slots = std::max(cfg.rings.max_capacity, cfg.rings.capacity);
  const auto max_log2 = static_cast<uint32_t>(std::bit_width(max_slots) - 1);
  if (mp::valid_capacity_log2(log2) && log2 > max_log2)
    return over_quota(c, Refusal::kRingCapacity,
                      "capacity_log2: " + std::to_string(log2) + " (" + std::to_string(uint64_t{1} << log2) +
                          " slots); at most " + std::to_string(max_log2) + " (" + std::to_string(max_slots) +
                          " slots, rings.max_capacity)");
  if (s.num_rings() >= s.quota().max_rings)
    return over_quota(c, Refusal::kQuotaRings,
                      "rings: this session already holds " + std::to_string(s.num_rings()) + "; at most " +
                          std::to_string(s.quota().max_rings) + " (clients.quota.rings)");
  if (!mp::valid_capacity_log2(log2))
    return Status(StatusCode::kInvalidArgument, "capacity_log2: " + std::to_string(log2) + "; expected " +
                                                    std::to_string(mp::kMinCapacityLog2) + ".." +
                                                    std::to_string(max_log2));
  const uint64_t bytes = mp::page_round_up(mp::ring_segment_bytes(log2));
  if (s.registered_bytes() + bytes > s.quota().max_registered_bytes)
    return over_quota(c, Refusal::kQuotaRegisteredBytes,
                      "registered bytes: this session holds " + std::to_string(s.registered_bytes()) +
                          " and the ring needs " + std::to_string(bytes) + "; at most " +
                          std::to_string(s.quota().max_registered_bytes) + " (clients.quota.registered_bytes)");
  const Holding ask{.rings = 1, .shared_memory = bytes, .descriptors = 1};
  MK_RETURN_IF_ERROR(take(c, ask));
  auto ring = s.add_ring(log2, state_.epoch);
  if (!ring.ok()) {
    give_back(c, ask);
    return made_nothing(c, ring.status());
  }
  reply->mutable_ring()->set_ring_id(ring.value()->id);
  reply->mutable_ring()->set_capacity_log2(log2);
  fds->push_back(s.release_ring_fd(ring.value()->id));
  return Status::Ok();
}

Status Requests::create_region(ClientState& c, uint64_t bytes, bool remote_writable, pb::Reply* reply,
                               std::vector<mp::UniqueFd>* fds) {
  Session& s = *c.session;
  if (s.num_regions() >= s.quota().max_regions)
    return over_quota(c, Refusal::kQuotaRegions,
                      "regions: this session already holds " + std::to_string(s.num_regions()) + "; at most " +
                          std::to_string(s.quota().max_regions) + " (clients.quota.regions)");
  if (bytes == 0 || bytes > s.quota().max_registered_bytes)
    return Status(StatusCode::kInvalidArgument, "region bytes: " + std::to_string(bytes) + "; expected 1.." +
                                                    std::to_string(s.quota().max_registered_bytes));
  const uint64_t rounded = mp::page_round_up(bytes);
  if (s.registered_bytes() + rounded > s.quota().max_registered_bytes)
    return over_quota(c, Refusal::kQuotaRegisteredBytes,
                      "registered bytes: this session holds " + std::to_string(s.registered_bytes()) +
                          " and the region needs " + std::to_string(rounded) + "; at most " +
                          std::to_string(s.quota().max_registered_bytes) + " (clients.quota.registered_bytes)");
  const Holding ask{.regions = 1, .shared_memory = rounded, .descriptors = 1};
  MK_RETURN_IF_ERROR(take(c, ask));
  auto region = s.add_region(bytes, remote_writable);
  if (!region.ok()) {
    give_back(c, ask);
    return made_nothing(c, region.status());
  }
  const uint32_t id = s.num_regions() - 1;
  reply->mutable_region()->set_region_id(id);
  reply->mutable_region()->set_bytes(region.value()->bytes);
  fds->push_back(s.release_region_fd(id));
  return Status::Ok();
}

Status Requests::create_flags(ClientState& c, uint32_t count, pb::Reply* reply, std::vector<mp::UniqueFd>* fds) {
  Session& s = *c.session;
  if (s.flags() != nullptr) return Status(StatusCode::kAlreadyExists, "flags: this session already has its flag array");
  if (count == 0 || count > s.quota().max_flags)
    return Status(StatusCode::kInvalidArgument,
                  "flags count: " + std::to_string(count) + "; expected 1.." + std::to_string(s.quota().max_flags));
  const Holding ask{.shared_memory = mp::page_round_up(uint64_t{count} * sizeof(uint64_t)), .descriptors = 1};
  MK_RETURN_IF_ERROR(take(c, ask));
  if (Status fs = s.add_flags(count); !fs.ok()) {
    give_back(c, ask);
    return made_nothing(c, fs);
  }
  reply->mutable_flags()->set_count(s.num_flags());
  fds->push_back(s.release_flags_fd());
  return Status::Ok();
}

Status Requests::fetch_handle(ClientState& c, const pb::Request& req, pb::Reply* reply,
                              std::vector<mp::UniqueFd>* fds) {
  Session& s = *c.session;
  const pb::FetchHandle& f = req.fetch_handle();
  if (f.rank() >= s.identity().world_size)
    return Status(StatusCode::kInvalidArgument, "rank: " + std::to_string(f.rank()) + "; expected 0.." +
                                                    std::to_string(s.identity().world_size - 1));
  const ClientState* owner = nullptr;
  for (const auto& [id, o] : clients_)
    if (o.session->has_hello() && !o.session->ended() &&
        o.session->identity().communicator == s.identity().communicator && o.session->identity().rank == f.rank())
      owner = &o;
  if (owner == nullptr)
    return Status(StatusCode::kNotFound, "rank " + std::to_string(f.rank()) + " of communicator \"" +
                                             s.identity().communicator + "\" has no session on this daemon");
  auto it = owner->shared_handles.find(f.key());
  if (it == owner->shared_handles.end())
    return Status(StatusCode::kNotFound,
                  "rank " + std::to_string(f.rank()) + " has not shared a handle \"" + f.key() + "\" (yet)");
  // A duplicate travels with the reply, so the reply stays valid if the owner leaves before the
  // client reads it; it is counted for the fetching client until then.
  const Holding ask{.descriptors = 1};
  MK_RETURN_IF_ERROR(take(c, ask));
  mp::UniqueFd dup(::fcntl(it->second.get(), F_DUPFD_CLOEXEC, 0));
  if (!dup.valid()) {
    const int e = errno;
    give_back(c, ask);
    return errno_status("duplicating the shared handle", e);
  }
  reply->mutable_handle_fetched();
  fds->push_back(std::move(dup));
  return Status::Ok();
}

Status Requests::import_region(ClientState& c, const pb::ImportRegion& r, mp::UniqueFd dmabuf, pb::Reply* reply) {
  Session& s = *c.session;
  if (c.connect_started)
    return Status(StatusCode::kFailedPrecondition,
                  "import_region: the session already connected its communicator; create every region and "
                  "the flags before connect");
  if (r.bytes() == 0)
    return Status(StatusCode::kInvalidArgument, "import_region bytes: 0; expected the region's length, > 0");
  if (r.gpu_address() == 0 || r.gpu_address() > UINT64_MAX - r.bytes())
    return Status(StatusCode::kInvalidArgument, "import_region gpu_address: " + std::to_string(r.gpu_address()) +
                                                    "; expected the region's device address (non-zero, with "
                                                    "bytes not wrapping around)");
  if (r.cuda_device() < 0)
    return Status(StatusCode::kInvalidArgument, "import_region cuda_device: " + std::to_string(r.cuda_device()) +
                                                    "; expected the owning CUDA device's ordinal, >= 0");
  // What the descriptor is first (so a wrong one is named whatever the transport), then whether
  // this proxy's transport can take GPU memory at all.
  MK_ASSIGN_OR_RETURN(DmabufInfo info, inspect_dmabuf(dmabuf.get()));
  if (r.dmabuf_offset() > info.size || r.bytes() > info.size - r.dmabuf_offset())
    return Status(StatusCode::kInvalidArgument,
                  "import_region: bytes " + std::to_string(r.bytes()) + " at dmabuf_offset " +
                      std::to_string(r.dmabuf_offset()) + " run past the dmabuf (exporter \"" + info.exporter +
                      "\", " + std::to_string(info.size) + " bytes)");
  const TransportProbe* probe = state_.probe_for(s.identity().gpu);
  if (probe == nullptr) return Status(StatusCode::kInternal, "import_region: the session's proxy is gone");
  if (!probe->gpu_memory())
    return Status(StatusCode::kFailedPrecondition,
                  "import_region: GPU memory (dmabuf from \"" + info.exporter + "\", " + std::to_string(info.size) +
                      " bytes) cannot be registered by this proxy's transport: " + probe->gpu_memory_reason() +
                      "; use host regions (host staging) instead");
  if (s.num_regions() >= s.quota().max_regions)
    return over_quota(c, Refusal::kQuotaRegions,
                      "regions: this session already holds " + std::to_string(s.num_regions()) + "; at most " +
                          std::to_string(s.quota().max_regions) + " (clients.quota.regions)");
  if (s.registered_bytes() + r.bytes() > s.quota().max_registered_bytes)
    return over_quota(c, Refusal::kQuotaRegisteredBytes,
                      "registered bytes: this session holds " + std::to_string(s.registered_bytes()) +
                          " and the region needs " + std::to_string(r.bytes()) + "; at most " +
                          std::to_string(s.quota().max_registered_bytes) + " (clients.quota.registered_bytes)");
  // The dmabuf descriptor stays with the daemon while the session lives (GPU memory is not
  // shared memory the daemon makes: it counts as a region and a descriptor only).
  const Holding ask{.regions = 1, .descriptors = 1};
  MK_RETURN_IF_ERROR(take(c, ask));
  GpuRegionSpec spec;
  spec.bytes = r.bytes();
  spec.remote_writable = r.remote_writable();
  spec.dmabuf = std::move(dmabuf);
  spec.dmabuf_offset = r.dmabuf_offset();
  spec.gpu_address = r.gpu_address();
  spec.cuda_device = r.cuda_device();
  spec.exporter = info.exporter;
  auto added = s.add_gpu_region(std::move(spec));
  if (!added.ok()) {
    give_back(c, ask);
    return added.status();
  }
  reply->mutable_region()->set_region_id(s.num_regions() - 1);
  reply->mutable_region()->set_bytes(added.value()->bytes);
  spdlog::info("session {}: region {} is GPU memory on CUDA device {}: {} bytes (dmabuf from {})", s.id(),
               s.num_regions() - 1, r.cuda_device(), r.bytes(), quoted_printable(info.exporter));
  return Status::Ok();
}

Status Requests::share_handle(ClientState& c, const pb::ShareHandle& h, mp::UniqueFd fd, pb::Reply* reply) {
  const std::string& key = h.key();
  if (key.empty() || key.size() > 128)
    return Status(StatusCode::kInvalidArgument, "key: " + std::to_string(key.size()) + " bytes; expected 1..128");
  auto it = c.shared_handles.find(key);
  if (it != c.shared_handles.end()) {
    it->second = std::move(fd);  // replaces the earlier handle of that key: no new descriptor
  } else {
    if (c.shared_handles.size() >= kMaxHandlesPerSession)
      return over_quota(c, Refusal::kQuotaHandles,
                        "share_handle: this session already shares " + std::to_string(c.shared_handles.size()) +
                            " handles; at most " + std::to_string(kMaxHandlesPerSession) + " per session");
    MK_RETURN_IF_ERROR(take(c, Holding{.descriptors = 1}));
    c.shared_handles.emplace(key, std::move(fd));
  }
  reply->mutable_handle_shared();
  return Status::Ok();
}

Status Requests::connect(ClientState& c, const pb::Request& req) {
  const std::shared_ptr<Session>& s = c.session;
  const pb::Connect& cn = req.connect();
  if (c.connect_started)
    return Status(StatusCode::kFailedPrecondition,
                  "connect: the session already connected its communicator (or is connecting it)");
  if (cn.token().size() < kMinTokenBytes || cn.token().size() > kMaxTokenBytes)
    return Status(StatusCode::kInvalidArgument, "token: " + std::to_string(cn.token().size()) + " bytes; expected " +
                                                    std::to_string(kMinTokenBytes) + ".." +
                                                    std::to_string(kMaxTokenBytes));
  if (cn.timeout_ms() > kMaxConnectTimeoutMs)
    return Status(StatusCode::kInvalidArgument, "timeout_ms: " + std::to_string(cn.timeout_ms()) +
                                                    "; expected 0 (the daemon's default) .. " +
                                                    std::to_string(kMaxConnectTimeoutMs));
  if (cn.root().size() > 1024)
    return Status(StatusCode::kInvalidArgument,
                  "root: " + std::to_string(cn.root().size()) + " bytes; expected a peer address of at most 1024");
  const TransportProbe* probe = state_.probe_for(s->identity().gpu);
  if (probe == nullptr) return Status(StatusCode::kInternal, "connect: the session's proxy is gone");
  ConnectRequest cr;
  cr.root = cn.root().empty() ? state_.peer_address : peer_target(cn.root());
  cr.token = cn.token();
  cr.network_for_local = cn.network_for_local();
  cr.node = state_.node_name();
  cr.instance = state_.epoch;
  cr.choice = probe->choice;
  cr.transport_status = probe->status;  // without one, only ranks on this daemon can be reached
  const config::DaemonConfig cfg = state_.config();
  cr.timeout = cn.timeout_ms() != 0 ? std::chrono::milliseconds(cn.timeout_ms()) : cfg.timeouts.rendezvous;
  cr.open.command_timeout = cfg.timeouts.command;
  const std::string root = cr.root;
  const auto bound = cr.timeout;
  // Connects in progress hold a worker thread each, and a connected session a network endpoint
  // (the provider's memory): both are counted, so one client cannot take them all.
  const Holding ask{.connects = 1, .networks = 1};
  MK_RETURN_IF_ERROR(take(c, ask));
  if (Status started = connects_.start(s, req.request_id(), std::move(cr)); !started.ok()) {
    give_back(c, ask);
    return started;
  }
  c.connect_started = true;
  spdlog::info("session {}: connecting communicator {} rank {}/{} through root {} ({} ms bound)", s->id(),
               quoted_printable(s->identity().communicator), s->identity().rank, s->identity().world_size,
               quoted_printable(root), bound.count());
  return Status::Ok();
}

void Requests::connected(ClientState& c, ConnectJob& j, pb::Reply* reply) {
  const std::shared_ptr<Session>& s = c.session;
  reply->set_request_id(j.request_id);
  // The connect is over; the endpoint stays counted while the session has it.
  if (c.held.connects > 0) give_back(c, Holding{.connects = 1});
  if (!j.status.ok()) {
    if (c.held.networks > 0) give_back(c, Holding{.networks = 1});
    c.connect_started = false;  // it may try again
    fill_error(reply, j.status);
    spdlog::warn("session {}: connecting communicator {} failed: {}", s->id(),
                 quoted_printable(s->identity().communicator), printable(j.status.to_string(), 1024));
    return;
  }
  pb::Connected* cn = reply->mutable_connected();
  cn->set_transport(j.network->description);
  if (j.network->transport) {
    const net::Capabilities& caps = j.network->transport->capabilities();
    cn->set_gpu_memory(caps.dmabuf);
    if (!caps.dmabuf)
      cn->set_gpu_memory_reason(j.network->description + ": " +
                                (caps.dmabuf_reason.empty() ? "cannot register GPU memory" : caps.dmabuf_reason));
  } else {
    cn->set_gpu_memory_reason("no network transport");
  }
  uint32_t over_network = 0;
  for (const RankRoute& r : j.network->ranks) {
    pb::RankRoute* e = cn->add_ranks();
    e->set_rank(r.rank);
    e->set_node(r.node);
    e->set_network(r.network);
    e->set_regions(static_cast<uint32_t>(r.region_bytes.size()));
    e->set_flags(r.flags);
    e->set_gpu_regions(r.gpu_regions);
    over_network += r.network ? 1 : 0;
  }
  spdlog::info("session {}: communicator {} connected: {} ranks, {} through {}", s->id(),
               quoted_printable(s->identity().communicator), j.network->ranks.size(), over_network,
               j.network->description);
  s->set_network(std::move(j.network));
}

}  // namespace mkernel::daemon
