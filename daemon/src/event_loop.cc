#include "event_loop.h"

#include <grp.h>
#include <poll.h>
#include <pthread.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "log_text.h"
#include "mkernel/proto/session.pb.h"
#include "mkernel/protocol/session_wire.h"

namespace mkernel::daemon {

namespace pb = mkernel::session::v1;
namespace mp = mkernel::protocol;
using namespace std::chrono_literals;

namespace {

std::string join_path(const std::string& dir, const std::string& path) {
  if (!path.empty() && path[0] == '/') return path;
  return dir + "/" + path;
}

}  // namespace

EventLoop::EventLoop(DaemonState& state, ConnectJobs& connects)
    : state_(state), connects_(connects), requests_(state, connects, clients_) {}

EventLoop::~EventLoop() { stop(); }

Status EventLoop::open() {
  const config::ClientSocketConfig sc = state_.config().client_socket;
  const std::string path = join_path(state_.runtime_dir, sc.path);
  state_.socket_path = path;
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path))
    return Status(StatusCode::kInvalidArgument, "client_socket.path: \"" + path + "\" is " +
                                                    std::to_string(path.size()) + " bytes; expected fewer than " +
                                                    std::to_string(sizeof(addr.sun_path)));
  // A socket file left by a daemon that died is removed; one a live daemon answers on is not.
  if (::access(path.c_str(), F_OK) == 0) {
    auto probe = mp::connect_unix(path, 200ms);
    if (probe.ok())
      return Status(StatusCode::kAlreadyExists,
                    "another mkerneld is serving " + path + "; give this one another --runtime-dir");
    ::unlink(path.c_str());
  }
  mp::UniqueFd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return errno_status("socket", errno);
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size());
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0)
    return errno_status("bind " + path, errno);
  if (::chmod(path.c_str(), sc.mode) != 0) return errno_status("chmod " + path, errno);
  if (!sc.group.empty()) {
    gid_t gid = 0;
    if (std::all_of(sc.group.begin(), sc.group.end(), ::isdigit)) {
      gid = static_cast<gid_t>(std::stoul(sc.group));
    } else {
      const group* g = ::getgrnam(sc.group.c_str());
      if (g == nullptr)
        return Status(StatusCode::kNotFound, "client_socket.group: \"" + sc.group + "\" is not a group on this machine");
      gid = g->gr_gid;
    }
    if (::chown(path.c_str(), static_cast<uid_t>(-1), gid) != 0)
      return errno_status("chown " + path + " to group " + sc.group, errno);
  }
  if (::listen(fd.get(), 128) != 0) return errno_status("listen " + path, errno);
  listen_fd_ = std::move(fd);
  wake_fd_ = mp::UniqueFd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!wake_fd_.valid()) return errno_status("eventfd", errno);
  return Status::Ok();
}

void EventLoop::start() {
  thread_ = std::thread([this] { run(); });
  pthread_setname_np(thread_.native_handle(), "mkd-sessions");
}

void EventLoop::stop() {
  stop_.store(true, std::memory_order_release);
  wake();
  if (thread_.joinable()) thread_.join();
  if (listen_fd_.valid()) {
    listen_fd_.reset();
    ::unlink(state_.socket_path.c_str());
  }
}

void EventLoop::wake() {
  if (!wake_fd_.valid()) return;
  const uint64_t one = 1;
  [[maybe_unused]] const ssize_t n = ::write(wake_fd_.get(), &one, sizeof(one));
}

void EventLoop::session_ended_by_proxy(uint64_t id) {
  {
    std::lock_guard<std::mutex> lock(ended_mu_);
    ended_by_proxy_.push_back(id);
  }
  wake();
}

ClientState* EventLoop::client(uint64_t id) {
  auto it = clients_.find(id);
  return it != clients_.end() ? &it->second : nullptr;
}

void EventLoop::run() {
  std::vector<pollfd> fds;
  std::vector<uint64_t> polled;
  while (!stop_.load(std::memory_order_acquire)) {
    fds.clear();
    polled.clear();
    const auto now = std::chrono::steady_clock::now();
    // Note 5: a listener resting after running out of descriptors is left out of the poll.
    const bool accepting = now >= accept_resume_;
    fds.push_back({accepting ? listen_fd_.get() : -1, POLLIN, 0});
    fds.push_back({wake_fd_.get(), POLLIN, 0});
    for (auto& [id, c] : clients_) {
      fds.push_back({c.session->socket_fd(), static_cast<short>(POLLIN | (c.outbox.empty() ? 0 : POLLOUT)), 0});
      polled.push_back(id);
    }
    int wait_ms = 100;
    if (!accepting)
      wait_ms = static_cast<int>(std::clamp<int64_t>(
          std::chrono::duration_cast<std::chrono::milliseconds>(accept_resume_ - now).count() + 1, 1, 100));
    const int r = ::poll(fds.data(), fds.size(), wait_ms);
    if (r < 0 && errno != EINTR) {
      spdlog::error("event loop: {}", errno_status("poll", errno).message());
      std::this_thread::sleep_for(10ms);
      continue;
    }
    if (fds[1].revents & POLLIN) {
      uint64_t v;
      [[maybe_unused]] const ssize_t n = ::read(wake_fd_.get(), &v, sizeof(v));
    }
    finish_connects();
    // Sessions that proxies ended: tell the clients and let go.
    std::vector<uint64_t> ended;
    {
      std::lock_guard<std::mutex> lock(ended_mu_);
      ended.swap(ended_by_proxy_);
    }
    for (uint64_t id : ended)
      if (ClientState* c = client(id)) finish_session(*c, c->session->end_reason());
    for (size_t i = 0; i < polled.size(); ++i) {
      const short re = fds[i + 2].revents;
      if (re == 0) continue;
      ClientState* c = client(polled[i]);
      if (c == nullptr || c->farewell_sent) continue;  // ended above
      if ((re & POLLOUT) && !flush(*c)) continue;
      if (re & POLLIN) handle_readable(*c);
      else if (re & (POLLHUP | POLLERR | POLLNVAL))
        finish_session(*c, Status(StatusCode::kUnavailable, "client closed the connection"), /*client_left=*/true);
    }
    if (fds[0].revents & POLLIN) accept_clients();
    // A proxy that stopped checking in for longer than the command timeout is stuck (in a
    // provider call, typically): its sessions cannot make progress, so they end with that
    // reason instead of leaving their producers and peers waiting. Health already says so.
    end_sessions_of_stuck_proxies();
    end_late_handshakes();
    trim_heap_if_due();
  }
  // Stopping: every session ends and its client is told why.
  std::vector<uint64_t> all;
  for (auto& [id, c] : clients_) all.push_back(id);
  for (uint64_t id : all) {
    ClientState* c = client(id);
    if (c == nullptr) continue;
    c->session->end(Status(StatusCode::kUnavailable, "mkerneld is stopping"), kRingErrDaemonStopping, 0, 0);
    finish_session(*c, c->session->end_reason());
  }
}

void EventLoop::accept_clients() {
  for (int i = 0; i < kAcceptBatch; ++i) {
    mp::UniqueFd fd(::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!fd.valid()) {
      const int e = errno;
      if (e == EAGAIN || e == EWOULDBLOCK) return;
      if (e == EINTR || e == ECONNABORTED) continue;
      if (is_descriptor_exhaustion(e)) {
        // Note 5: answer one waiting client with the spare descriptor, count, rest.
        const Status why(StatusCode::kResourceExhausted,
                         "mkerneld has no descriptor left to accept a connection (" + std::string(std::strerror(e)) +
                             "); try again later");
        pb::Reply refusal;
        fill_error(&refusal, why);
        std::string packet;
        (void)mp::frame_message(refusal, &packet);
        state_.refusals.record_anonymous(Refusal::kOutOfDescriptors, why);  // before the answer goes out
        spare_.shed_one(listen_fd_.get(), packet);
        accept_resume_ = std::chrono::steady_clock::now() + kAcceptPause;
        return;
      }
      state_.refusals.record_anonymous(Refusal::kOutOfDescriptors, errno_status("accept4", e));
      accept_resume_ = std::chrono::steady_clock::now() + kAcceptPause;
      return;
    }
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (::getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
      state_.refusals.record_anonymous(Refusal::kCredentials, errno_status("SO_PEERCRED", errno));
      continue;
    }
    // Note 4: who may have a session at all, then whether there is room for one more.
    const config::DaemonConfig cfg = state_.config();
    const config::ClientSocketConfig& sc = cfg.client_socket;
    const bool any_list = !sc.allowed_uids.empty() || !sc.allowed_gids.empty();
    const bool allowed =
        !any_list || cred.uid == ::geteuid() ||
        std::find(sc.allowed_uids.begin(), sc.allowed_uids.end(), cred.uid) != sc.allowed_uids.end() ||
        std::find(sc.allowed_gids.begin(), sc.allowed_gids.end(), cred.gid) != sc.allowed_gids.end();
    if (!allowed) {
      refuse_connection(std::move(fd), cred, Refusal::kCredentials,
                        Status(StatusCode::kPermissionDenied,
                               "uid " + std::to_string(cred.uid) + " gid " + std::to_string(cred.gid) +
                                   " is not in client_socket.allowed_uids / allowed_gids"));
      continue;
    }
    if (state_.draining.load(std::memory_order_acquire)) {
      refuse_connection(std::move(fd), cred, Refusal::kDraining,
                        Status(StatusCode::kUnavailable, "mkerneld is draining and accepts no new sessions"));
      continue;
    }
    const Owner owner{cred.uid, cred.pid};
    const Holding connection{.sessions = 1, .descriptors = 1};
    if (auto denied = state_.ledger.take(owner, connection, state_.limits())) {
      refuse_connection(std::move(fd), cred, denied->reason, denied->status);
      continue;
    }
    ClientState c;
    c.owner = owner;
    c.held = connection;
    c.session = std::make_shared<Session>(next_session_id_++, std::move(fd), cred, state_.quota());
    c.hello_deadline = std::chrono::steady_clock::now() + cfg.timeouts.handshake;
    const uint64_t id = c.session->id();
    state_.sessions.insert(c.session);
    clients_.emplace(id, std::move(c));
  }
}

void EventLoop::refuse_connection(mp::UniqueFd fd, const ucred& cred, Refusal reason, const Status& why) {
  state_.refusals.record(reason, cred.pid, cred.uid, why);
  pb::Reply refusal;
  fill_error(&refusal, why);
  std::string packet;
  if (mp::frame_message(refusal, &packet).ok()) (void)mp::try_send_packet(fd.get(), packet, {});
  // Whatever the client already sent (its hello) is read and dropped first: closing with it
  // unread would make the client's kernel report a reset before the refusal (the client reads
  // again after a reset, session_wire.h, but this keeps the common case plain). Closed here.
  char sink[64];
  for (int i = 0; i < 4 && ::recv(fd.get(), sink, sizeof(sink), MSG_DONTWAIT) > 0; ++i) {
  }
}

bool EventLoop::answer(ClientState& c, const pb::Reply& reply, std::vector<mp::UniqueFd> fds) {
  Outgoing out;
  const Status framed = mp::frame_message(reply, &out.packet);
  if (!framed.ok()) {
    finish_session(c, framed.with_context("reply to client"));
    return false;
  }
  out.fds = std::move(fds);
  const uint32_t max_queued = state_.config().clients.max_queued_replies;
  if (c.outbox.size() >= max_queued) {
    const Status why(StatusCode::kResourceExhausted,
                     "the client does not read its replies: " + std::to_string(c.outbox.size()) +
                         " are waiting; at most " + std::to_string(max_queued) + " (clients.max_queued_replies)");
    state_.refusals.record(Refusal::kReplyQueueOverflow, c.owner.pid, c.owner.uid, why);
    finish_session(c, why);
    return false;
  }
  c.outbox.push_back(std::move(out));
  return flush(c);
}

bool EventLoop::flush(ClientState& c) {
  while (!c.outbox.empty()) {
    Outgoing& front = c.outbox.front();
    std::vector<int> raw;
    raw.reserve(front.fds.size());
    for (const auto& f : front.fds) raw.push_back(f.get());
    const StatusOr<bool> sent = mp::try_send_packet(c.session->socket_fd(), front.packet, raw);
    if (!sent.ok()) {
      finish_session(c, sent.status().code() == StatusCode::kUnavailable
                            ? Status(StatusCode::kUnavailable, "client closed the connection")
                            : sent.status().with_context("reply to client"),
                     /*client_left=*/sent.status().code() == StatusCode::kUnavailable);
      return false;
    }
    if (!sent.value()) return true;  // the socket is full: POLLOUT brings us back
    // Sent: the client has its copies; the daemon's close now (note 4 of requests.h).
    const auto n = static_cast<uint32_t>(front.fds.size());
    c.outbox.pop_front();
    if (n > 0) requests_.give_back(c, Holding{.descriptors = n});
  }
  return true;
}

void EventLoop::count_refusal(ClientState& c, Refusal otherwise, const Status& why) {
  const Refusal reason = c.limit_hit.value_or(otherwise);
  c.limit_hit.reset();
  state_.refusals.record(reason, c.owner.pid, c.owner.uid, why);
}

void EventLoop::handle_readable(ClientState& c) {
  const std::shared_ptr<Session> s = c.session;
  pb::Request req;
  // Clients hand the daemon a descriptor only with ShareHandle and ImportRegion (exactly one);
  // any other request carrying one is malformed.
  std::vector<mp::UniqueFd> in_fds;
  const Status rs = mp::recv_message_any_fds(s->socket_fd(), &req, &in_fds, 0ms);
  if (!rs.ok()) {
    if (rs.code() == StatusCode::kDeadlineExceeded) return;  // nothing there after all
    if (rs.code() == StatusCode::kUnavailable) {
      finish_session(c, Status(StatusCode::kUnavailable, "client closed the connection"), /*client_left=*/true);
    } else {
      // A descriptor the kernel could not give the daemon (truncated ancillary data) is the
      // daemon's shortage, not the client's fault, but the request is lost either way.
      state_.refusals.record(Refusal::kMalformed, c.owner.pid, c.owner.uid, rs);
      finish_session(c, rs.with_context("malformed request"));
    }
    return;
  }
  if (s->ended()) return;
  const bool carries_fd = req.has_share_handle() || req.has_import_region();
  if (in_fds.size() != (carries_fd ? 1u : 0u)) {
    const Status why(StatusCode::kProtocolError,
                     "malformed request: " + std::to_string(in_fds.size()) + " descriptor(s) attached; " +
                         (req.has_share_handle()    ? "ShareHandle carries exactly one"
                          : req.has_import_region() ? "ImportRegion carries exactly one (the dmabuf)"
                                                    : "only ShareHandle and ImportRegion may carry one"));
    state_.refusals.record(Refusal::kMalformed, c.owner.pid, c.owner.uid, why);
    finish_session(c, why);
    return;
  }
  pb::Reply reply;
  reply.set_request_id(req.request_id());
  if (req.has_goodbye()) {
    finish_session(c, Status(StatusCode::kOk, "client said goodbye"), /*client_left=*/true);
    return;
  }
  if (!req.has_hello() && !s->has_hello()) {
    const Status why(StatusCode::kProtocolError, "first request must be a hello");
    state_.refusals.record(Refusal::kMalformed, c.owner.pid, c.owner.uid, why);
    finish_session(c, why);
    return;
  }
  if (req.has_import_region() || req.has_share_handle()) {
    const Status is = req.has_import_region()
                          ? requests_.import_region(c, req.import_region(), std::move(in_fds[0]), &reply)
                          : requests_.share_handle(c, req.share_handle(), std::move(in_fds[0]), &reply);
    if (!is.ok()) {
      fill_error(&reply, is);
      count_refusal(c, Refusal::kInvalidRequest, is);
    }
    answer(c, reply);
    return;
  }
  if (req.has_connect()) {
    // Answered by finish_connects once the rendezvous ended; an immediate refusal now.
    const Status cs = requests_.connect(c, req);
    if (cs.ok()) return;
    fill_error(&reply, cs);
    count_refusal(c, Refusal::kInvalidRequest, cs);
    answer(c, reply);
    return;
  }
  std::vector<mp::UniqueFd> out_fds;
  const bool hello = req.has_hello();
  const Status hs = hello ? requests_.hello(c, req, &reply) : requests_.setup(c, req, &reply, &out_fds);
  if (!hs.ok()) {
    fill_error(&reply, hs);
    count_refusal(c, hello ? Refusal::kHelloRefused : Refusal::kInvalidRequest, hs);
  }
  if (!answer(c, reply, std::move(out_fds))) return;
  if (!hs.ok() && !s->has_hello()) finish_session(c, hs.with_context("hello refused"));
}

void EventLoop::finish_connects() {
  for (auto& j : connects_.collect_finished()) {
    ClientState* c = client(j->session->id());
    if (c == nullptr || c->session->ended() || c->farewell_sent) continue;  // its network (if any) goes with the job
    pb::Reply reply;
    requests_.connected(*c, *j, &reply);
    answer(*c, reply);
  }
}

void EventLoop::finish_session(ClientState& c, Status why, bool client_left) {
  if (c.farewell_sent) return;
  const std::shared_ptr<Session> s = c.session;
  s->end(why, client_left ? 0u : static_cast<uint32_t>(kRingErrSessionEnded), static_cast<uint32_t>(why.code()), 0);
  const Status reason = s->end_reason();
  c.farewell_sent = true;
  if (!client_left) {
    // What the socket takes now, then the farewell, one attempt each (note 2): a client that
    // does not read loses them, and nothing here waits for it.
    for (auto& out : c.outbox) {
      std::vector<int> raw;
      for (const auto& f : out.fds) raw.push_back(f.get());
      const StatusOr<bool> sent = mp::try_send_packet(s->socket_fd(), out.packet, raw);
      if (!sent.ok() || !sent.value()) break;
    }
    pb::Reply bye;
    bye.mutable_ended()->set_code(static_cast<uint32_t>(reason.code()));
    bye.mutable_ended()->set_reason(reason.message());
    std::string packet;
    if (mp::frame_message(bye, &packet).ok()) (void)mp::try_send_packet(s->socket_fd(), packet, {});
  }
  c.outbox.clear();
  ::shutdown(s->socket_fd(), SHUT_RDWR);
  if (c.connect_started) connects_.cancel(s->id());
  const bool had_hello = s->has_hello();
  if (had_hello)
    if (Proxy* p = state_.proxy_for(s->identity().gpu)) p->remove_session(s->id());
  if (c.bound_gpu) state_.ledger.unbind_gpu(c.owner, *c.bound_gpu);
  state_.ledger.give_back(c.owner, c.held);
  state_.sessions.erase(s->id());
  clients_.erase(s->id());  // `c` is gone from here on
  if (had_hello) {
    state_.republish_peers();
    if (uint64_t left_out = 0; state_.session_log.allow(&left_out))
      spdlog::info("session {} ({}) closed: {}{}", s->id(), quoted_printable(s->identity().name),
                   printable(client_left ? why.message() : reason.to_string(), 1024),
                   suppressed_note(left_out, "session lines"));
  }
  if (!trim_pending_) {  // the first end of a batch sets the moment; churn cannot postpone it
    trim_pending_ = true;
    trim_due_ = std::chrono::steady_clock::now() + 200ms;
  }
}

void EventLoop::end_late_handshakes() {
  const auto now = std::chrono::steady_clock::now();
  std::vector<uint64_t> late;
  for (auto& [id, c] : clients_)
    if (!c.session->has_hello() && !c.session->ended() && now > c.hello_deadline) late.push_back(id);
  for (uint64_t id : late)
    if (ClientState* c = client(id)) {
      const Status why(StatusCode::kDeadlineExceeded, "no hello within the handshake timeout");
      state_.refusals.record(Refusal::kHandshakeTimeout, c->owner.pid, c->owner.uid, why);
      finish_session(*c, why);
    }
}

void EventLoop::trim_heap_if_due() {
  // Note 3: memory freed by sessions that ended goes back to the system, not only to the
  // allocator. At most once a second, and only after the ends have settled for a moment.
  if (!trim_pending_) return;
  const auto now = std::chrono::steady_clock::now();
  if (now < trim_due_ || now - last_trim_ < 1s) return;
  trim_pending_ = false;
  last_trim_ = now;
#ifdef __GLIBC__
  ::malloc_trim(0);
#endif
}

void EventLoop::end_sessions_of_stuck_proxies() {
  const std::chrono::milliseconds bound = std::max<std::chrono::milliseconds>(state_.config().timeouts.command, 1000ms);
  for (auto& p : state_.proxies) {
    const auto silent = p->since_heartbeat();
    if (silent < bound) continue;
    std::vector<uint64_t> victims;
    for (auto& [id, c] : clients_)
      if (c.session->has_hello() && !c.session->ended() && c.session->identity().gpu == p->options().index)
        victims.push_back(id);
    for (uint64_t id : victims) {
      ClientState* c = client(id);
      if (c == nullptr) continue;
      const Status why(StatusCode::kDeadlineExceeded,
                       "proxy " + p->options().name + " has not checked in for " +
                           std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(silent).count()) +
                           " ms (more than the command timeout); its sessions cannot make progress");
      spdlog::error("session {}: {}", id, why.message());
      c->session->end(why, kRingErrTransport, static_cast<uint32_t>(why.code()), 0);
      finish_session(*c, c->session->end_reason());
    }
  }
}

}  // namespace mkernel::daemon
