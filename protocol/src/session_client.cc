#include "mkernel/protocol/session_client.h"

#include "mkernel/proto/session.pb.h"
#include "mkernel/protocol/version.h"

namespace mkernel::protocol {

namespace pb = mkernel::session::v1;

namespace {
Status status_from_error(const pb::Error& e) {
  const int code = static_cast<int>(e.code());
  const StatusCode sc = code > 0 && code <= static_cast<int>(StatusCode::kInternal)
                            ? static_cast<StatusCode>(code)
                            : StatusCode::kInternal;
  return Status(sc, e.message());
}
}  // namespace

SessionClient::~SessionClient() = default;

StatusOr<std::unique_ptr<SessionClient>> SessionClient::connect(const Options& options) {
  std::unique_ptr<SessionClient> c(new SessionClient());
  c->options_ = options;
  MK_ASSIGN_OR_RETURN(c->sock_, connect_unix(options.socket_path, options.timeout));
  pb::Request req;
  pb::Hello* h = req.mutable_hello();
  h->set_protocol_version(kProtocolVersion);
  h->set_client_name(options.client_name);
  h->set_gpu(options.gpu);
  h->set_communicator(options.communicator);
  h->set_rank(options.rank);
  h->set_world_size(options.world_size);
  pb::Reply reply;
  MK_RETURN_IF_ERROR(c->call(req, 0, &reply, nullptr).with_context("hello to " + options.socket_path));
  if (!reply.has_hello())
    return Status(StatusCode::kProtocolError, "hello: daemon answered without a HelloReply");
  const pb::HelloReply& hr = reply.hello();
  c->session_id_ = hr.session_id();
  c->epoch_ = hr.daemon_epoch();
  c->proxy_ = hr.proxy();
  c->limits_ = {hr.max_rings(), hr.max_registered_bytes(), hr.max_commands_in_flight(),
                hr.max_ring_capacity_log2(), hr.max_flags()};
  c->peer_address_ = hr.peer_address();
  c->node_ = hr.node();
  c->gpu_memory_ = hr.gpu_memory();
  c->gpu_memory_reason_ = hr.gpu_memory_reason();
  return c;
}

Status SessionClient::call(const pb::Request& req, int expected_fds, pb::Reply* reply,
                           std::vector<UniqueFd>* fds) {
  return call_for(req, expected_fds, reply, fds, options_.timeout);
}

StatusOr<ConnectInfo> SessionClient::connect_communicator(const ConnectOptions& options) {
  pb::Request req;
  pb::Connect* c = req.mutable_connect();
  c->set_root(options.root);
  c->set_token(options.token);
  c->set_timeout_ms(static_cast<uint32_t>(options.timeout.count()));
  c->set_network_for_local(options.network_for_local);
  // The daemon answers once the rendezvous ended either way; it bounds that by the timeout (or
  // its default, at most an hour), so wait that long plus this client's own bound.
  const auto wait = (options.timeout.count() > 0 ? options.timeout : std::chrono::milliseconds(3600000)) +
                    options_.timeout;
  pb::Reply reply;
  MK_RETURN_IF_ERROR(call_for(req, 0, &reply, nullptr, wait).with_context("connect"));
  if (!reply.has_connected())
    return Status(StatusCode::kProtocolError, "connect: daemon answered without Connected");
  ConnectInfo info;
  info.transport = reply.connected().transport();
  info.gpu_memory = reply.connected().gpu_memory();
  info.gpu_memory_reason = reply.connected().gpu_memory_reason();
  for (const auto& r : reply.connected().ranks())
    info.ranks.push_back({r.rank(), r.node(), r.network(), r.regions(), r.flags(), r.gpu_regions()});
  return info;
}

Status SessionClient::share_handle(const std::string& key, int fd) {
  pb::Request req;
  req.mutable_share_handle()->set_key(key);
  pb::Reply reply;
  MK_RETURN_IF_ERROR(call_for(req, 0, &reply, nullptr, options_.timeout, {fd}).with_context("share_handle"));
  if (!reply.has_handle_shared())
    return Status(StatusCode::kProtocolError, "share_handle: daemon answered without HandleShared");
  return Status::Ok();
}

StatusOr<UniqueFd> SessionClient::fetch_handle(uint32_t rank, const std::string& key) {
  pb::Request req;
  req.mutable_fetch_handle()->set_rank(rank);
  req.mutable_fetch_handle()->set_key(key);
  pb::Reply reply;
  std::vector<UniqueFd> fds;
  MK_RETURN_IF_ERROR(call(req, 1, &reply, &fds));
  if (!reply.has_handle_fetched() || fds.size() != 1)
    return Status(StatusCode::kProtocolError, "fetch_handle: daemon answered without HandleFetched");
  return std::move(fds[0]);
}

Status SessionClient::call_for(const pb::Request& req_in, int expected_fds, pb::Reply* reply,
                               std::vector<UniqueFd>* fds, std::chrono::milliseconds timeout,
                               const std::vector<int>& send_fds) {
  if (!ended_.ok()) return ended_;
  if (!sock_.valid()) return Status(StatusCode::kFailedPrecondition, "session is closed");
  pb::Request req = req_in;
  req.set_request_id(next_request_++);
  if (Status sent = send_message(sock_.get(), req, send_fds, options_.timeout); !sent.ok()) {
    // A daemon that refuses a connection (a limit, draining, credentials) answers at once and
    // closes: the request may then find the socket closed, with the answer already waiting.
    pb::Reply early;
    if (sent.code() == StatusCode::kUnavailable &&
        recv_message_any_fds(sock_.get(), &early, nullptr, std::chrono::milliseconds(0)).ok()) {
      if (early.has_error()) return status_from_error(early.error());
      if (early.has_ended())
        return ended_ = Status(StatusCode::kFailedPrecondition, "mkerneld ended the session: " + early.ended().reason());
    }
    return sent;
  }
  std::vector<UniqueFd> got;
  MK_RETURN_IF_ERROR(recv_message_any_fds(sock_.get(), reply, &got, timeout));
  if (reply->has_ended()) {
    ended_ = Status(StatusCode::kFailedPrecondition,
                    "mkerneld ended the session: " + reply->ended().reason());
    return ended_;
  }
  // A refusal at connection time (draining, credentials) answers before any request was read.
  if (reply->has_error() && reply->request_id() == 0) return status_from_error(reply->error());
  if (reply->request_id() != req.request_id())
    return Status(StatusCode::kProtocolError,
                  "reply for request " + std::to_string(reply->request_id()) + "; expected " +
                      std::to_string(req.request_id()));
  if (reply->has_error()) return status_from_error(reply->error());
  if (static_cast<int>(got.size()) != expected_fds)
    return Status(StatusCode::kProtocolError,
                  "reply carried " + std::to_string(got.size()) + " file descriptor(s); expected " +
                      std::to_string(expected_fds));
  if (fds) *fds = std::move(got);
  return Status::Ok();
}

StatusOr<ClientRing*> SessionClient::create_ring(uint32_t capacity_log2) {
  pb::Request req;
  req.mutable_create_ring()->set_capacity_log2(capacity_log2);
  pb::Reply reply;
  std::vector<UniqueFd> fds;
  MK_RETURN_IF_ERROR(call(req, 1, &reply, &fds));
  if (!reply.has_ring()) return Status(StatusCode::kProtocolError, "create_ring: no RingCreated");
  auto ring = std::make_unique<ClientRing>();
  ring->id = reply.ring().ring_id();
  MK_ASSIGN_OR_RETURN(ring->mapping, map_segment(std::move(fds[0]), 0, true));
  if (std::string err = attach_ring(ring->mapping.data(), ring->mapping.size(), &ring->view); !err.empty())
    return Status(StatusCode::kProtocolError, "ring from mkerneld: " + err);
  rings_.push_back(std::move(ring));
  return rings_.back().get();
}

StatusOr<ClientRegion*> SessionClient::create_region(uint64_t bytes, bool remote_writable) {
  pb::Request req;
  req.mutable_create_region()->set_bytes(bytes);
  req.mutable_create_region()->set_remote_writable(remote_writable);
  pb::Reply reply;
  std::vector<UniqueFd> fds;
  MK_RETURN_IF_ERROR(call(req, 1, &reply, &fds));
  if (!reply.has_region()) return Status(StatusCode::kProtocolError, "create_region: no RegionCreated");
  auto region = std::make_unique<ClientRegion>();
  region->id = reply.region().region_id();
  MK_ASSIGN_OR_RETURN(region->mapping, map_segment(std::move(fds[0]), reply.region().bytes(), true));
  regions_.push_back(std::move(region));
  return regions_.back().get();
}

StatusOr<ClientRegion*> SessionClient::import_region(const GpuRegionSpec& spec) {
  if (spec.dmabuf_fd < 0)
    return Status(StatusCode::kInvalidArgument,
                  "import_region: dmabuf_fd " + std::to_string(spec.dmabuf_fd) + "; expected an open descriptor");
  if (spec.bytes == 0 || spec.gpu_address == 0)
    return Status(StatusCode::kInvalidArgument, "import_region: bytes " + std::to_string(spec.bytes) +
                                                    ", gpu_address " + std::to_string(spec.gpu_address) +
                                                    "; expected both non-zero");
  pb::Request req;
  pb::ImportRegion* r = req.mutable_import_region();
  r->set_bytes(spec.bytes);
  r->set_remote_writable(spec.remote_writable);
  r->set_gpu_address(spec.gpu_address);
  r->set_dmabuf_offset(spec.dmabuf_offset);
  r->set_cuda_device(spec.cuda_device);
  pb::Reply reply;
  MK_RETURN_IF_ERROR(
      call_for(req, 0, &reply, nullptr, options_.timeout, {spec.dmabuf_fd}));
  if (!reply.has_region()) return Status(StatusCode::kProtocolError, "import_region: no RegionCreated");
  auto region = std::make_unique<ClientRegion>();
  region->id = reply.region().region_id();
  region->gpu_address = spec.gpu_address;
  region->gpu_bytes = reply.region().bytes();
  regions_.push_back(std::move(region));
  return regions_.back().get();
}

StatusOr<ClientFlags*> SessionClient::create_flags(uint32_t count) {
  pb::Request req;
  req.mutable_create_flags()->set_count(count);
  pb::Reply reply;
  std::vector<UniqueFd> fds;
  MK_RETURN_IF_ERROR(call(req, 1, &reply, &fds));
  if (!reply.has_flags()) return Status(StatusCode::kProtocolError, "create_flags: no FlagsCreated");
  auto flags = std::make_unique<ClientFlags>();
  flags->count = reply.flags().count();
  MK_ASSIGN_OR_RETURN(flags->mapping, map_segment(std::move(fds[0]), 0, true));
  if (flags->mapping.size() < uint64_t{flags->count} * sizeof(uint64_t))
    return Status(StatusCode::kProtocolError, "flags segment smaller than its flag count");
  flags_.push_back(std::move(flags));
  return flags_.back().get();
}

Status SessionClient::ping() {
  pb::Request req;
  req.mutable_ping();
  pb::Reply reply;
  MK_RETURN_IF_ERROR(call(req, 0, &reply, nullptr));
  if (reply.pong().daemon_epoch() != epoch_)
    return Status(StatusCode::kFailedPrecondition,
                  "daemon epoch " + std::to_string(reply.pong().daemon_epoch()) +
                      "; this session was made under " + std::to_string(epoch_));
  return Status::Ok();
}

Status SessionClient::check_alive(std::chrono::milliseconds wait) {
  if (!ended_.ok()) return ended_;
  if (!sock_.valid()) return Status(StatusCode::kFailedPrecondition, "session is closed");
  pb::Reply reply;
  const Status s = recv_message_any_fds(sock_.get(), &reply, nullptr, wait);
  if (s.code() == StatusCode::kDeadlineExceeded) return Status::Ok();
  if (!s.ok()) {
    ended_ = s.code() == StatusCode::kUnavailable
                 ? Status(StatusCode::kUnavailable, "mkerneld closed the session socket")
                 : s;
    return ended_;
  }
  if (reply.has_ended())
    ended_ = Status(StatusCode::kFailedPrecondition, "mkerneld ended the session: " + reply.ended().reason());
  else
    ended_ = Status(StatusCode::kProtocolError, "unexpected unsolicited message from mkerneld");
  return ended_;
}

void SessionClient::close() {
  if (sock_.valid() && ended_.ok()) {
    pb::Request req;
    req.set_request_id(next_request_++);
    req.mutable_goodbye();
    (void)send_message(sock_.get(), req, {}, std::chrono::milliseconds(100));
  }
  sock_.reset();
}

}  // namespace mkernel::protocol
