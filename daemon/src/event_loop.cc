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

#include <algorithm>
#include <cerrno>
#include <cstring>

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
    fds.push_back({listen_fd_.get(), POLLIN, 0});
    fds.push_back({wake_fd_.get(), POLLIN, 0});
    for (auto& [id, c] : clients_) {
      fds.push_back({c.session->socket_fd(), POLLIN, 0});
      polled.push_back(id);
    }
    const int r = ::poll(fds.data(), fds.size(), 100);
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
      if (re & POLLIN) handle_readable(*c);
      else if (re & (POLLHUP | POLLERR | POLLNVAL))
        finish_session(*c, Status(StatusCode::kUnavailable, "client closed the connection"), /*client_left=*/true);
    }
    if (fds[0].revents & POLLIN) accept_clients();
    // A proxy that stopped checking in for longer than the command timeout is stuck (in a
    // provider call, typically): its sessions cannot make progress, so they end with that
    // reason instead of leaving their producers and peers waiting. Health already says so.
    end_sessions_of_stuck_proxies();
    // Clients that connected but never said hello in time.
    const auto now = std::chrono::steady_clock::now();
    std::vector<uint64_t> late;
    for (auto& [id, c] : clients_)
      if (!c.session->has_hello() && !c.session->ended() && now > c.hello_deadline) late.push_back(id);
    for (uint64_t id : late)
      if (ClientState* c = client(id))
        finish_session(*c, Status(StatusCode::kDeadlineExceeded, "no hello within the handshake timeout"));
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
  for (;;) {
    mp::UniqueFd fd(::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!fd.valid()) {
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
        spdlog::warn("accept: {}", errno_status("accept4", errno).message());
      return;
    }
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (::getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
      spdlog::warn("refused a client: {}", errno_status("SO_PEERCRED", errno).message());
      continue;
    }
    // Note 4: a refused client is told why in the answer to its hello.
    Status refusal;
    const config::DaemonConfig cfg = state_.config();
    const config::ClientSocketConfig& sc = cfg.client_socket;
    const bool any_list = !sc.allowed_uids.empty() || !sc.allowed_gids.empty();
    const bool allowed =
        !any_list || cred.uid == ::geteuid() ||
        std::find(sc.allowed_uids.begin(), sc.allowed_uids.end(), cred.uid) != sc.allowed_uids.end() ||
        std::find(sc.allowed_gids.begin(), sc.allowed_gids.end(), cred.gid) != sc.allowed_gids.end();
    if (!allowed)
      refusal = Status(StatusCode::kPermissionDenied, "uid " + std::to_string(cred.uid) + " gid " +
                                                          std::to_string(cred.gid) +
                                                          " is not in client_socket.allowed_uids / allowed_gids");
    else if (state_.draining.load(std::memory_order_acquire))
      refusal = Status(StatusCode::kUnavailable, "mkerneld is draining and accepts no new sessions");
    if (!refusal.ok()) spdlog::warn("refusing client pid {} uid {}: {}", cred.pid, cred.uid, refusal.message());
    ClientState c;
    c.session = std::make_shared<Session>(next_session_id_++, std::move(fd), cred, state_.quota());
    c.hello_deadline = std::chrono::steady_clock::now() + cfg.timeouts.handshake;
    c.refusal = refusal;
    const uint64_t id = c.session->id();
    state_.sessions.insert(c.session);
    clients_.emplace(id, std::move(c));
  }
}

void EventLoop::answer(ClientState& c, const pb::Reply& reply, const std::vector<int>& fds) {
  const Status ss = mp::send_message(c.session->socket_fd(), reply, fds, 1000ms);
  if (!ss.ok()) finish_session(c, ss.with_context("reply to client"));
}

void EventLoop::handle_readable(ClientState& c) {
  const std::shared_ptr<Session> s = c.session;
  pb::Request req;
  // Clients hand the daemon a descriptor only with ShareHandle and ImportRegion (exactly one);
  // any other request carrying one is malformed.
  std::vector<mp::UniqueFd> in_fds;
  const Status rs = mp::recv_message_any_fds(s->socket_fd(), &req, &in_fds, 1000ms);
  if (!rs.ok()) {
    if (rs.code() == StatusCode::kUnavailable)
      finish_session(c, Status(StatusCode::kUnavailable, "client closed the connection"), /*client_left=*/true);
    else
      finish_session(c, rs.with_context("malformed request"));
    return;
  }
  if (s->ended()) return;
  const bool carries_fd = req.has_share_handle() || req.has_import_region();
  if (in_fds.size() != (carries_fd ? 1u : 0u)) {
    finish_session(c, Status(StatusCode::kProtocolError,
                             "malformed request: " + std::to_string(in_fds.size()) + " descriptor(s) attached; " +
                                 (req.has_share_handle()    ? "ShareHandle carries exactly one"
                                  : req.has_import_region() ? "ImportRegion carries exactly one (the dmabuf)"
                                                            : "only ShareHandle and ImportRegion may carry one")));
    return;
  }
  pb::Reply reply;
  reply.set_request_id(req.request_id());
  if (req.has_import_region() && s->has_hello()) {
    const Status is = requests_.import_region(c, req.import_region(), std::move(in_fds[0]), &reply);
    if (!is.ok()) {
      fill_error(&reply, is);
      spdlog::info("session {}: GPU-memory region refused: {}", s->id(), is.message());
    }
    answer(c, reply);
    return;
  }
  if (req.has_share_handle() && s->has_hello()) {
    const Status hs = requests_.share_handle(c, req.share_handle(), std::move(in_fds[0]), &reply);
    if (!hs.ok()) fill_error(&reply, hs);
    answer(c, reply);
    return;
  }
  if (req.has_goodbye()) {
    finish_session(c, Status(StatusCode::kOk, "client said goodbye"), /*client_left=*/true);
    return;
  }
  if (req.has_connect() && s->has_hello()) {
    // Answered by finish_connects once the rendezvous ended; an immediate refusal now.
    const Status cs = requests_.connect(c, req);
    if (cs.ok()) return;
    fill_error(&reply, cs);
    answer(c, reply);
    return;
  }
  std::vector<int> fds;
  Status hs;
  if (req.has_hello()) {
    hs = requests_.hello(c, req, &reply);
  } else if (!s->has_hello()) {
    finish_session(c, Status(StatusCode::kProtocolError, "first request must be a hello"));
    return;
  } else {
    hs = requests_.setup(c, req, &reply, &fds);
  }
  if (!hs.ok()) fill_error(&reply, hs);
  const Status ss = mp::send_message(s->socket_fd(), reply, fds, 1000ms);
  if (!ss.ok()) finish_session(c, ss.with_context("reply to client"));
  else if (!hs.ok() && !s->has_hello()) finish_session(c, hs.with_context("hello refused"));
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
  if (!client_left) {
    pb::Reply bye;
    bye.mutable_ended()->set_code(static_cast<uint32_t>(reason.code()));
    bye.mutable_ended()->set_reason(reason.message());
    (void)mp::send_message(s->socket_fd(), bye, {}, 100ms);
  }
  ::shutdown(s->socket_fd(), SHUT_RDWR);
  c.farewell_sent = true;
  if (c.connect_started) connects_.cancel(s->id());
  if (s->has_hello())
    if (Proxy* p = state_.proxy_for(s->identity().gpu)) p->remove_session(s->id());
  state_.sessions.erase(s->id());
  clients_.erase(s->id());  // `c` is gone from here on
  state_.republish_peers();
  if (s->has_hello())
    spdlog::info("session {} (\"{}\") closed: {}", s->id(), s->identity().name,
                 client_left ? why.message() : reason.to_string());
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
