#include "daemon.h"

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <set>

#include <grpcpp/grpcpp.h>

#include "mkernel/proto/session.pb.h"
#include "dmabuf.h"
#include "mkernel/protocol/version.h"
#include "rendezvous.h"
#include "topology.h"

namespace mkernel::daemon {

namespace pb = mkernel::session::v1;
namespace mp = mkernel::protocol;
using namespace std::chrono_literals;

namespace {

constexpr uint32_t kMaxRegionsPerSession = 4096;
constexpr uint32_t kMaxFlagsPerSession = 1u << 20;
constexpr auto kProxyAliveBound = 500ms;  // health answers within a second of a stall
constexpr size_t kMaxNameBytes = 256;
constexpr size_t kMaxConnectsAtOnce = 256;
constexpr size_t kMaxHandlesPerSession = 64;
constexpr size_t kMinTokenBytes = 16, kMaxTokenBytes = 256;
constexpr uint32_t kMaxConnectTimeoutMs = 3600000;

uint64_t make_epoch() {
  // Nanoseconds of wall-clock time: distinct for every start, growing across restarts.
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count();
  return static_cast<uint64_t>(ns) | 1;
}

std::string join_path(const std::string& dir, const std::string& path) {
  if (!path.empty() && path[0] == '/') return path;
  return dir + "/" + path;
}

Status make_dirs(const std::string& dir, mode_t mode) {
  std::string cur;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = dir.find('/', pos + 1);
    cur = dir.substr(0, pos);
    if (cur.empty()) continue;
    if (::mkdir(cur.c_str(), mode) != 0 && errno != EEXIST)
      return errno_status("creating runtime directory " + cur, errno);
  }
  return Status::Ok();
}

void fill_error(pb::Reply* reply, const Status& s) {
  reply->mutable_error()->set_code(static_cast<uint32_t>(s.code()));
  reply->mutable_error()->set_message(s.message());
}

}  // namespace

std::vector<std::string> list_nvidia_gpus() {
  std::vector<std::string> out;
  DIR* d = ::opendir("/proc/driver/nvidia/gpus");
  if (d == nullptr) return out;
  while (dirent* e = ::readdir(d))
    if (e->d_name[0] != '.') out.emplace_back(e->d_name);
  ::closedir(d);
  std::sort(out.begin(), out.end());  // PCI bus order, as nvidia-smi numbers them
  return out;
}

uint32_t count_nvidia_gpus() { return static_cast<uint32_t>(list_nvidia_gpus().size()); }

std::vector<uint32_t> parse_cpu_list(const std::string& text) {
  std::vector<uint32_t> cpus;
  size_t i = 0;
  while (i < text.size()) {
    size_t j = text.find(',', i);
    if (j == std::string::npos) j = text.size();
    const std::string part = text.substr(i, j - i);
    const size_t dash = part.find('-');
    try {
      const unsigned long lo = std::stoul(part.substr(0, dash));
      const unsigned long hi = dash == std::string::npos ? lo : std::stoul(part.substr(dash + 1));
      for (unsigned long c = lo; c <= hi && c < 65536; ++c) cpus.push_back(static_cast<uint32_t>(c));
    } catch (const std::exception&) {
      return {};
    }
    i = j + 1;
  }
  return cpus;
}

std::vector<uint32_t> cpus_near_pci_device(const std::string& pci_address) {
  std::string text;
  if (FILE* f = std::fopen(("/sys/bus/pci/devices/" + pci_address + "/local_cpulist").c_str(), "r")) {
    char buf[1024] = {};
    if (std::fgets(buf, sizeof(buf), f)) text = buf;
    std::fclose(f);
  }
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return parse_cpu_list(text);
}

Daemon::Daemon(DaemonOptions options) : options_(std::move(options)), epoch_(make_epoch()) {}

Daemon::~Daemon() { stop(); }

const config::DaemonConfig& Daemon::config() const { return options_.config; }

SessionQuota Daemon::quota_from_config() const {
  std::lock_guard<std::mutex> lock(config_mu_);
  const config::ClientQuota& q = options_.config.clients.quota;
  SessionQuota out;
  out.max_rings = q.rings;
  out.max_regions = kMaxRegionsPerSession;
  out.max_registered_bytes = q.registered_bytes;
  out.max_inflight = q.inflight_commands;
  out.max_ring_capacity_log2 = mp::kMaxCapacityLog2;
  out.max_flags = kMaxFlagsPerSession;
  return out;
}

Status Daemon::open_client_socket() {
  const config::ClientSocketConfig& sc = options_.config.client_socket;
  socket_path_ = join_path(runtime_dir_, sc.path);
  sockaddr_un addr{};
  if (socket_path_.size() >= sizeof(addr.sun_path))
    return Status(StatusCode::kInvalidArgument,
                  "client_socket.path: \"" + socket_path_ + "\" is " +
                      std::to_string(socket_path_.size()) + " bytes; expected fewer than " +
                      std::to_string(sizeof(addr.sun_path)));
  // A socket file left by a daemon that died is removed; one a live daemon answers on is not.
  if (::access(socket_path_.c_str(), F_OK) == 0) {
    auto probe = mp::connect_unix(socket_path_, 200ms);
    if (probe.ok())
      return Status(StatusCode::kAlreadyExists,
                    "another mkerneld is serving " + socket_path_ +
                        "; give this one another --runtime-dir");
    ::unlink(socket_path_.c_str());
  }
  mp::UniqueFd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return errno_status("socket", errno);
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, socket_path_.c_str(), socket_path_.size());
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0)
    return errno_status("bind " + socket_path_, errno);
  if (::chmod(socket_path_.c_str(), sc.mode) != 0)
    return errno_status("chmod " + socket_path_, errno);
  if (!sc.group.empty()) {
    gid_t gid = 0;
    if (std::all_of(sc.group.begin(), sc.group.end(), ::isdigit)) {
      gid = static_cast<gid_t>(std::stoul(sc.group));
    } else {
      const group* g = ::getgrnam(sc.group.c_str());
      if (g == nullptr)
        return Status(StatusCode::kNotFound,
                      "client_socket.group: \"" + sc.group + "\" is not a group on this machine");
      gid = g->gr_gid;
    }
    if (::chown(socket_path_.c_str(), static_cast<uid_t>(-1), gid) != 0)
      return errno_status("chown " + socket_path_ + " to group " + sc.group, errno);
  }
  if (::listen(fd.get(), 128) != 0) return errno_status("listen " + socket_path_, errno);
  listen_fd_ = std::move(fd);
  return Status::Ok();
}

Status Daemon::start() {
  const config::DaemonConfig& cfg = options_.config;
  runtime_dir_ = cfg.node.runtime_dir;
  MK_RETURN_IF_ERROR(make_dirs(runtime_dir_, 0750));
  MK_RETURN_IF_ERROR(open_client_socket());
  wake_fd_ = mp::UniqueFd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!wake_fd_.valid()) return errno_status("eventfd", errno);

  // Which proxies: GPUs found (or listed), else host-only slots.
  std::vector<std::pair<uint32_t, bool>> slots;  // (index, is_gpu)
  const std::vector<std::string> gpu_pci = list_nvidia_gpus();
  const uint32_t found = static_cast<uint32_t>(gpu_pci.size());
  switch (cfg.gpus.select) {
    case config::GpuSelect::kAll:
      if (found > 0) {
        for (uint32_t i = 0; i < found; ++i) slots.emplace_back(i, true);
      } else {
        spdlog::info("no NVIDIA GPU found (/proc/driver/nvidia/gpus); serving {} host-only slot(s)",
                     cfg.gpus.fallback_host_slots);
        for (uint32_t i = 0; i < cfg.gpus.fallback_host_slots; ++i) slots.emplace_back(i, false);
      }
      break;
    case config::GpuSelect::kList:
      for (uint32_t id : cfg.gpus.ids) {
        if (id >= found)
          spdlog::warn("gpus.ids lists GPU {} but the driver shows {} GPU(s); its proxy serves "
                       "host clients only", id, found);
        slots.emplace_back(id, id < found);
      }
      break;
    case config::GpuSelect::kHostSlots:
      for (uint32_t i = 0; i < cfg.gpus.host_slots; ++i) slots.emplace_back(i, false);
      break;
  }
  // The NIC each GPU would use (nearest in the PCI tree, or as configured).
  {
    const Topology topo;
    const auto nearest = topo.nearest_nics(gpu_pci);
    for (size_t i = 0; i < nearest.size(); ++i) {
      const config::ProxySettings ps = config::proxy_settings(cfg, static_cast<uint32_t>(i));
      if (ps.transport.nic != "auto")
        spdlog::info("gpu{}: NIC {} (configured)", i, ps.transport.nic);
      else
        spdlog::info("gpu{}: nearest NIC {} ({})", i, nearest[i].nic.empty() ? "none" : nearest[i].nic,
                     nearest[i].reason);
    }
  }
  MK_RETURN_IF_ERROR(start_peer_service());
  for (const auto& [index, is_gpu] : slots) {
    const config::ProxySettings ps = config::proxy_settings(cfg, index);
    // Ranks on this daemon are reached by a copy inside it; ranks on other daemons through the
    // network transport the probe finds (what it found is logged once per proxy).
    TransportProbe probe = probe_transport(ps.transport, target_host(peer_address_));
    spdlog::info("{}{}: communicators spanning daemons use {}", is_gpu ? "gpu" : "host", index, probe.summary());
    if (!probe.status.ok())
      spdlog::warn("{}{}: only communicators whose ranks all use this daemon can connect", is_gpu ? "gpu" : "host",
                   index);
    ProxyOptions po;
    po.index = index;
    po.name = (is_gpu ? "gpu" : "host") + std::to_string(index);
    if (ps.cpu_affinity.mode == config::CpuAffinityMode::kList) {
      po.cpus = ps.cpu_affinity.cpus;
    } else if (ps.cpu_affinity.mode == config::CpuAffinityMode::kAuto && is_gpu) {
      // The CPUs of the GPU's NUMA node, from the PCI topology.
      po.cpus = cpus_near_pci_device(gpu_pci[index]);
      spdlog::info("proxy gpu{}: GPU at {}; pinned to the {} CPU(s) of its NUMA node", index,
                   gpu_pci[index], po.cpus.size());
    }
    po.spin = ps.poll.mode == config::PollMode::kSpin;
    po.spin_for = ps.poll.spin;
    po.sleep_for = ps.poll.sleep;
    po.batch = ps.batch.max_commands;
    po.command_timeout = cfg.timeouts.command;
    if (probe.status.ok()) {
      po.network = (probe.choice.kind == config::TransportKind::kVerbs ? "verbs:" : "fabric:") +
                   probe.capabilities.provider;
      po.nic = probe.choice.domain;
    }
    probes_.push_back(std::move(probe));
    auto proxy = std::make_unique<Proxy>(std::move(po), [this](uint64_t id) {
                                           {
                                             std::lock_guard<std::mutex> lock(sessions_mu_);
                                             ended_by_proxy_.push_back(id);
                                           }
                                           wake();
                                         });
    MK_RETURN_IF_ERROR(proxy->start());
    proxies_.push_back(std::move(proxy));
  }
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  for (auto& p : proxies_) {
    while (!p->started()) {
      if (std::chrono::steady_clock::now() > deadline)
        return Status(StatusCode::kDeadlineExceeded,
                      "proxy " + p->options().name + " did not start within 5 s");
      std::this_thread::sleep_for(1ms);
    }
  }
  loop_thread_ = std::thread([this] { event_loop(); });
  pthread_setname_np(loop_thread_.native_handle(), "mkd-sessions");
  spdlog::info("mkerneld serving {} proxies on {} (epoch {}, protocol v{})", proxies_.size(),
               socket_path_, epoch_, mp::kProtocolVersion);
  return Status::Ok();
}

void Daemon::stop() {
  if (stopped_.exchange(true)) return;
  stop_.store(true, std::memory_order_release);
  // Rendezvous in progress ends first (joins waiting at this root are cancelled, ours too).
  if (peer_server_) peer_server_->Shutdown(std::chrono::system_clock::now() + 2s);
  cancel_connects(0);
  wake();
  if (loop_thread_.joinable()) loop_thread_.join();
  {
    std::lock_guard<std::mutex> lock(connects_mu_);
    for (auto& job : connects_)
      if (job->worker.joinable()) job->worker.join();
    connects_.clear();
  }
  if (peer_server_) {
    peer_server_->Wait();
    peer_server_.reset();
    if (peer_address_.rfind("unix:", 0) == 0) ::unlink(peer_address_.substr(5).c_str());
  }
  // The loop has ended every session; now the proxies.
  for (auto& p : proxies_) p->stop();
  proxies_.clear();
  if (listen_fd_.valid()) {
    listen_fd_.reset();
    ::unlink(socket_path_.c_str());
  }
}

void Daemon::wake() {
  if (!wake_fd_.valid()) return;
  const uint64_t one = 1;
  [[maybe_unused]] const ssize_t n = ::write(wake_fd_.get(), &one, sizeof(one));
}

// ---- event loop -------------------------------------------------------------------------------

void Daemon::event_loop() {
  std::vector<pollfd> fds;
  std::vector<std::shared_ptr<Session>> polled;
  while (!stop_.load(std::memory_order_acquire)) {
    fds.clear();
    polled.clear();
    fds.push_back({listen_fd_.get(), POLLIN, 0});
    fds.push_back({wake_fd_.get(), POLLIN, 0});
    {
      std::lock_guard<std::mutex> lock(sessions_mu_);
      for (auto& [id, s] : sessions_) {
        fds.push_back({s->socket_fd(), POLLIN, 0});
        polled.push_back(s);
      }
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
      std::lock_guard<std::mutex> lock(sessions_mu_);
      ended.swap(ended_by_proxy_);
    }
    for (uint64_t id : ended) {
      std::shared_ptr<Session> s;
      {
        std::lock_guard<std::mutex> lock(sessions_mu_);
        auto it = sessions_.find(id);
        if (it != sessions_.end()) s = it->second;
      }
      if (s) finish_session(s, s->end_reason());
    }
    for (size_t i = 0; i < polled.size(); ++i) {
      const short re = fds[i + 2].revents;
      if (re == 0) continue;
      if (polled[i]->ended() && polled[i]->farewell_sent) continue;
      if (re & POLLIN) handle_readable(polled[i]);
      else if (re & (POLLHUP | POLLERR | POLLNVAL))
        finish_session(polled[i], Status(StatusCode::kUnavailable, "client closed the connection"),
                       /*client_left=*/true);
    }
    if (fds[0].revents & POLLIN) accept_clients();
    // A proxy that stopped checking in for longer than the command timeout is stuck (in a
    // provider call, typically): its sessions cannot make progress, so they end with that
    // reason instead of leaving their producers and peers waiting. Health already says so.
    end_sessions_of_stuck_proxies();
    // Clients that connected but never said hello in time.
    const auto now = std::chrono::steady_clock::now();
    for (auto& s : polled)
      if (!s->has_hello() && !s->ended() && now > s->hello_deadline)
        finish_session(s, Status(StatusCode::kDeadlineExceeded, "no hello within the handshake timeout"));
  }
  // Stopping: every session ends and its client is told why.
  std::vector<std::shared_ptr<Session>> all;
  {
    std::lock_guard<std::mutex> lock(sessions_mu_);
    for (auto& [id, s] : sessions_) all.push_back(s);
  }
  for (auto& s : all) {
    s->end(Status(StatusCode::kUnavailable, "mkerneld is stopping"), kRingErrDaemonStopping, 0, 0);
    finish_session(s, s->end_reason());
  }
}

void Daemon::accept_clients() {
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
    // A refused client is told why in the answer to its hello (an answer sent before its hello
    // was read could be lost when the socket closes with the hello unread).
    Status refusal;
    config::ClientSocketConfig sc;
    {
      std::lock_guard<std::mutex> lock(config_mu_);
      sc = options_.config.client_socket;
    }
    const bool any_list = !sc.allowed_uids.empty() || !sc.allowed_gids.empty();
    const bool allowed =
        !any_list || cred.uid == ::geteuid() ||
        std::find(sc.allowed_uids.begin(), sc.allowed_uids.end(), cred.uid) != sc.allowed_uids.end() ||
        std::find(sc.allowed_gids.begin(), sc.allowed_gids.end(), cred.gid) != sc.allowed_gids.end();
    if (!allowed)
      refusal = Status(StatusCode::kPermissionDenied,
                       "uid " + std::to_string(cred.uid) + " gid " + std::to_string(cred.gid) +
                           " is not in client_socket.allowed_uids / allowed_gids");
    else if (draining_.load(std::memory_order_acquire))
      refusal = Status(StatusCode::kUnavailable, "mkerneld is draining and accepts no new sessions");
    if (!refusal.ok()) spdlog::warn("refusing client pid {} uid {}: {}", cred.pid, cred.uid, refusal.message());
    std::shared_ptr<Session> s;
    {
      std::lock_guard<std::mutex> lock(sessions_mu_);
      s = std::make_shared<Session>(next_session_id_++, std::move(fd), cred, quota_from_config());
      s->hello_deadline = std::chrono::steady_clock::now() + options_.config.timeouts.handshake;
      s->refusal = refusal;
      sessions_.emplace(s->id(), s);
    }
  }
}

void Daemon::handle_readable(const std::shared_ptr<Session>& s) {
  pb::Request req;
  // Clients hand the daemon a descriptor only with ShareHandle (exactly one); any other request
  // carrying one is malformed.
  std::vector<mp::UniqueFd> in_fds;
  const Status rs = mp::recv_message_any_fds(s->socket_fd(), &req, &in_fds, 1000ms);
  if (!rs.ok()) {
    if (rs.code() == StatusCode::kUnavailable)
      finish_session(s, Status(StatusCode::kUnavailable, "client closed the connection"),
                     /*client_left=*/true);
    else
      finish_session(s, rs.with_context("malformed request"));
    return;
  }
  if (s->ended()) return;
  const bool carries_fd = req.has_share_handle() || req.has_import_region();
  if (in_fds.size() != (carries_fd ? 1u : 0u)) {
    finish_session(s, Status(StatusCode::kProtocolError,
                             "malformed request: " + std::to_string(in_fds.size()) + " descriptor(s) attached; " +
                                 (req.has_share_handle()    ? "ShareHandle carries exactly one"
                                  : req.has_import_region() ? "ImportRegion carries exactly one (the dmabuf)"
                                                            : "only ShareHandle and ImportRegion may carry one")));
    return;
  }
  pb::Reply reply;
  reply.set_request_id(req.request_id());
  if (req.has_import_region() && s->has_hello()) {
    const Status is = import_region(*s, req.import_region(), std::move(in_fds[0]), &reply);
    if (!is.ok()) {
      fill_error(&reply, is);
      spdlog::info("session {}: GPU-memory region refused: {}", s->id(), is.message());
    }
    const Status ss = mp::send_message(s->socket_fd(), reply, {}, 1000ms);
    if (!ss.ok()) finish_session(s, ss.with_context("reply to client"));
    return;
  }
  if (req.has_share_handle() && s->has_hello()) {
    const std::string& key = req.share_handle().key();
    Status hs;
    if (key.empty() || key.size() > 128)
      hs = Status(StatusCode::kInvalidArgument, "key: " + std::to_string(key.size()) + " bytes; expected 1..128");
    else if (s->shared_handles.size() >= kMaxHandlesPerSession && !s->shared_handles.count(key))
      hs = Status(StatusCode::kResourceExhausted, "share_handle: this session already shares " +
                                                      std::to_string(kMaxHandlesPerSession) + " handles");
    if (hs.ok()) {
      s->shared_handles[key] = std::move(in_fds[0]);
      reply.mutable_handle_shared();
    } else {
      fill_error(&reply, hs);
    }
    const Status ss = mp::send_message(s->socket_fd(), reply, {}, 1000ms);
    if (!ss.ok()) finish_session(s, ss.with_context("reply to client"));
    return;
  }
  std::vector<int> fds;
  if (req.has_goodbye()) {
    finish_session(s, Status(StatusCode::kOk, "client said goodbye"), /*client_left=*/true);
    return;
  }
  if (req.has_connect() && s->has_hello()) {
    // Answered by finish_connects once the rendezvous ended; an immediate refusal now.
    const Status cs = start_connect(s, req);
    if (cs.ok()) return;
    fill_error(&reply, cs);
    const Status ss = mp::send_message(s->socket_fd(), reply, {}, 1000ms);
    if (!ss.ok()) finish_session(s, ss.with_context("reply to client"));
    return;
  }
  Status hs;
  if (req.has_hello()) {
    hs = handle_hello(s, req, &reply);
  } else if (!s->has_hello()) {
    finish_session(s, Status(StatusCode::kProtocolError, "first request must be a hello"));
    return;
  } else {
    hs = handle_request(*s, req, &reply, &fds);
  }
  if (!hs.ok()) fill_error(&reply, hs);
  const Status ss = mp::send_message(s->socket_fd(), reply, fds, 1000ms);
  if (!ss.ok()) finish_session(s, ss.with_context("reply to client"));
  else if (!hs.ok() && !s->has_hello()) finish_session(s, hs.with_context("hello refused"));
}

const TransportProbe* Daemon::probe_for(uint32_t gpu) const {
  for (size_t i = 0; i < proxies_.size(); ++i)
    if (proxies_[i]->options().index == gpu) return &probes_[i];
  return nullptr;
}

Status Daemon::import_region(Session& s, const pb::ImportRegion& r, mp::UniqueFd dmabuf, pb::Reply* reply) {
  if (s.connect_started)
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
  const TransportProbe* probe = probe_for(s.identity().gpu);
  if (probe == nullptr) return Status(StatusCode::kInternal, "import_region: the session's proxy is gone");
  if (!probe->gpu_memory())
    return Status(StatusCode::kFailedPrecondition,
                  "import_region: GPU memory (dmabuf from \"" + info.exporter + "\", " + std::to_string(info.size) +
                      " bytes) cannot be registered by this proxy's transport: " + probe->gpu_memory_reason() +
                      "; use host regions (host staging) instead");
  GpuRegionSpec spec;
  spec.bytes = r.bytes();
  spec.remote_writable = r.remote_writable();
  spec.dmabuf = std::move(dmabuf);
  spec.dmabuf_offset = r.dmabuf_offset();
  spec.gpu_address = r.gpu_address();
  spec.cuda_device = r.cuda_device();
  spec.exporter = info.exporter;
  MK_ASSIGN_OR_RETURN(const Region* region, s.add_gpu_region(std::move(spec)));
  reply->mutable_region()->set_region_id(s.num_regions() - 1);
  reply->mutable_region()->set_bytes(region->bytes);
  spdlog::info("session {}: region {} is GPU memory on CUDA device {}: {} bytes (dmabuf from \"{}\")", s.id(),
               s.num_regions() - 1, r.cuda_device(), r.bytes(), info.exporter);
  return Status::Ok();
}

Status Daemon::handle_hello(const std::shared_ptr<Session>& s, const pb::Request& req, pb::Reply* reply) {
  if (s->has_hello()) return Status(StatusCode::kFailedPrecondition, "hello: sent twice");
  if (!s->refusal.ok()) return s->refusal;
  if (draining_.load(std::memory_order_acquire))
    return Status(StatusCode::kUnavailable, "mkerneld is draining and accepts no new sessions");
  const pb::Hello& h = req.hello();
  if (h.protocol_version() != mp::kProtocolVersion)
    return Status(StatusCode::kFailedPrecondition,
                  "protocol_version: " + std::to_string(h.protocol_version()) + "; this mkerneld speaks " +
                      std::to_string(mp::kProtocolVersion));
  Proxy* proxy = nullptr;
  for (auto& p : proxies_)
    if (static_cast<int64_t>(p->options().index) == h.gpu()) proxy = p.get();
  if (proxy == nullptr) {
    std::string have;
    for (auto& p : proxies_) have += (have.empty() ? "" : ", ") + std::to_string(p->options().index);
    return Status(StatusCode::kNotFound,
                  "gpu: " + std::to_string(h.gpu()) + "; this mkerneld serves " + have);
  }
  if (h.world_size() == 0 || h.world_size() > mp::kMaxRanks)
    return Status(StatusCode::kInvalidArgument, "world_size: " + std::to_string(h.world_size()) +
                                                    "; expected 1.." + std::to_string(mp::kMaxRanks));
  if (h.rank() >= h.world_size())
    return Status(StatusCode::kInvalidArgument, "rank: " + std::to_string(h.rank()) + "; expected 0.." +
                                                    std::to_string(h.world_size() - 1));
  if (h.communicator().empty() || h.communicator().size() > kMaxNameBytes)
    return Status(StatusCode::kInvalidArgument,
                  "communicator: " + std::to_string(h.communicator().size()) +
                      " bytes; expected 1.." + std::to_string(kMaxNameBytes));
  if (h.client_name().size() > kMaxNameBytes)
    return Status(StatusCode::kInvalidArgument,
                  "client_name: " + std::to_string(h.client_name().size()) + " bytes; expected at most " +
                      std::to_string(kMaxNameBytes));
  uint32_t max_per_gpu = 0;
  {
    std::lock_guard<std::mutex> lock(config_mu_);
    max_per_gpu = options_.config.clients.max_per_gpu;
  }
  {
    std::lock_guard<std::mutex> lock(sessions_mu_);
    uint32_t on_gpu = 0;
    for (auto& [id, o] : sessions_) {
      if (o.get() == s.get() || !o->has_hello() || o->ended()) continue;
      if (static_cast<int64_t>(o->identity().gpu) == h.gpu()) ++on_gpu;
      if (o->identity().communicator != h.communicator()) continue;
      if (o->identity().world_size != h.world_size())
        return Status(StatusCode::kInvalidArgument,
                      "world_size: " + std::to_string(h.world_size()) + "; communicator \"" +
                          h.communicator() + "\" has " + std::to_string(o->identity().world_size));
      if (o->identity().rank == h.rank())
        return Status(StatusCode::kAlreadyExists,
                      "rank " + std::to_string(h.rank()) + " of communicator \"" + h.communicator() +
                          "\" is already held by session " + std::to_string(o->id()));
    }
    if (on_gpu >= max_per_gpu)
      return Status(StatusCode::kResourceExhausted,
                    "gpu " + std::to_string(h.gpu()) + " already has " + std::to_string(on_gpu) +
                        " clients (clients.max_per_gpu)");
  }
  s->set_identity({h.client_name(), h.communicator(), h.rank(), h.world_size(),
                   static_cast<uint32_t>(h.gpu())});
  s->mark_hello();
  proxy->add_session(s);
  republish_peers();
  pb::HelloReply* hr = reply->mutable_hello();
  hr->set_session_id(s->id());
  hr->set_daemon_epoch(epoch_);
  hr->set_proxy(proxy->options().index);
  hr->set_max_rings(s->quota().max_rings);
  hr->set_max_registered_bytes(s->quota().max_registered_bytes);
  hr->set_max_commands_in_flight(s->quota().max_inflight);
  hr->set_max_ring_capacity_log2(s->quota().max_ring_capacity_log2);
  hr->set_max_flags(s->quota().max_flags);
  hr->set_peer_address(peer_address_);
  hr->set_node(node_name());
  if (const TransportProbe* probe = probe_for(proxy->options().index)) {
    hr->set_gpu_memory(probe->gpu_memory());
    hr->set_gpu_memory_reason(probe->gpu_memory_reason());
  }
  spdlog::info("session {}: \"{}\" pid {} uid {}: communicator \"{}\" rank {}/{} on {}", s->id(),
               h.client_name(), s->creds().pid, s->creds().uid, h.communicator(), h.rank(),
               h.world_size(), proxy->options().name);
  return Status::Ok();
}

Status Daemon::handle_request(Session& s, const pb::Request& req, pb::Reply* reply,
                              std::vector<int>* fds) {
  if (req.has_create_ring()) {
    uint32_t log2 = req.create_ring().capacity_log2();
    if (log2 == 0) {
      std::lock_guard<std::mutex> lock(config_mu_);
      log2 = static_cast<uint32_t>(std::bit_width(options_.config.rings.capacity) - 1);
    }
    MK_ASSIGN_OR_RETURN(const SessionRing* ring, s.add_ring(log2, epoch_));
    reply->mutable_ring()->set_ring_id(ring->id);
    reply->mutable_ring()->set_capacity_log2(log2);
    fds->push_back(ring->mapping.fd());
    return Status::Ok();
  }
  if ((req.has_create_region() || req.has_create_flags()) && s.connect_started)
    return Status(StatusCode::kFailedPrecondition,
                  std::string(req.has_create_region() ? "create_region" : "create_flags") +
                      ": the session already connected its communicator; create every region and "
                      "the flags before connect");
  if (req.has_create_region()) {
    MK_ASSIGN_OR_RETURN(const Region* region,
                        s.add_region(req.create_region().bytes(), req.create_region().remote_writable()));
    reply->mutable_region()->set_region_id(s.num_regions() - 1);
    reply->mutable_region()->set_bytes(region->bytes);
    fds->push_back(region->mapping.fd());
    return Status::Ok();
  }
  if (req.has_create_flags()) {
    MK_RETURN_IF_ERROR(s.add_flags(req.create_flags().count()));
    reply->mutable_flags()->set_count(s.num_flags());
    fds->push_back(s.flags_fd());
    return Status::Ok();
  }
  if (req.has_fetch_handle()) {
    const pb::FetchHandle& f = req.fetch_handle();
    if (f.rank() >= s.identity().world_size)
      return Status(StatusCode::kInvalidArgument, "rank: " + std::to_string(f.rank()) + "; expected 0.." +
                                                      std::to_string(s.identity().world_size - 1));
    std::shared_ptr<Session> owner;
    {
      std::lock_guard<std::mutex> lock(sessions_mu_);
      for (auto& [id, o] : sessions_)
        if (o->has_hello() && !o->ended() && o->identity().communicator == s.identity().communicator &&
            o->identity().rank == f.rank())
          owner = o;
    }
    if (!owner)
      return Status(StatusCode::kNotFound, "rank " + std::to_string(f.rank()) + " of communicator \"" +
                                               s.identity().communicator + "\" has no session on this daemon");
    auto it = owner->shared_handles.find(f.key());
    if (it == owner->shared_handles.end())
      return Status(StatusCode::kNotFound, "rank " + std::to_string(f.rank()) + " has not shared a handle \"" +
                                               f.key() + "\" (yet)");
    reply->mutable_handle_fetched();
    fds->push_back(it->second.get());
    return Status::Ok();
  }
  if (req.has_ping()) {
    reply->mutable_pong()->set_daemon_epoch(epoch_);
    return Status::Ok();
  }
  return Status(StatusCode::kProtocolError, "request " + std::to_string(req.request_id()) +
                                                " carries no known body");
}

void Daemon::finish_session(const std::shared_ptr<Session>& s, Status why, bool client_left) {
  if (s->farewell_sent) return;
  s->end(why, client_left ? 0u : static_cast<uint32_t>(kRingErrSessionEnded), static_cast<uint32_t>(why.code()), 0);
  const Status reason = s->end_reason();
  if (!client_left) {
    pb::Reply bye;
    bye.mutable_ended()->set_code(static_cast<uint32_t>(reason.code()));
    bye.mutable_ended()->set_reason(reason.message());
    (void)mp::send_message(s->socket_fd(), bye, {}, 100ms);
  }
  ::shutdown(s->socket_fd(), SHUT_RDWR);
  s->farewell_sent = true;
  if (s->connect_started) cancel_connects(s->id());
  if (s->has_hello())
    for (auto& p : proxies_)
      if (p->options().index == s->identity().gpu) p->remove_session(s->id());
  {
    std::lock_guard<std::mutex> lock(sessions_mu_);
    sessions_.erase(s->id());
  }
  republish_peers();
  if (s->has_hello())
    spdlog::info("session {} (\"{}\") closed: {}", s->id(), s->identity().name,
                 client_left ? why.message() : reason.to_string());
}

void Daemon::republish_peers() {
  auto table = std::make_shared<PeerTable>();
  {
    std::lock_guard<std::mutex> lock(sessions_mu_);
    std::map<std::string, std::shared_ptr<PeerList>> building;
    for (auto& [id, s] : sessions_) {
      if (!s->has_hello() || s->ended()) continue;
      auto& list = building[s->identity().communicator];
      if (!list) list = std::make_shared<PeerList>(s->identity().world_size);
      if (s->identity().rank < list->size()) (*list)[s->identity().rank] = s;
    }
    for (auto& [comm, list] : building) table->emplace(comm, std::move(list));
  }
  std::shared_ptr<const PeerTable> frozen = std::move(table);
  for (auto& p : proxies_) p->set_peers(frozen);
}

void Daemon::end_sessions_of_stuck_proxies() {
  std::chrono::milliseconds bound;
  {
    std::lock_guard<std::mutex> lock(config_mu_);
    bound = std::max<std::chrono::milliseconds>(options_.config.timeouts.command, 1000ms);
  }
  for (auto& p : proxies_) {
    const auto silent = p->since_heartbeat();
    if (silent < bound) continue;
    std::vector<std::shared_ptr<Session>> victims;
    {
      std::lock_guard<std::mutex> lock(sessions_mu_);
      for (auto& [id, s] : sessions_)
        if (s->has_hello() && !s->ended() && s->identity().gpu == p->options().index) victims.push_back(s);
    }
    for (auto& s : victims) {
      const Status why(StatusCode::kDeadlineExceeded,
                       "proxy " + p->options().name + " has not checked in for " +
                           std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(silent).count()) +
                           " ms (more than the command timeout); its sessions cannot make progress");
      spdlog::error("session {}: {}", s->id(), why.message());
      s->end(why, kRingErrTransport, static_cast<uint32_t>(why.code()), 0);
      finish_session(s, s->end_reason());
    }
  }
}

// ---- communicators across daemons ---------------------------------------------------------------

std::string Daemon::node_name() const {
  {
    std::lock_guard<std::mutex> lock(config_mu_);
    if (!options_.config.node.name.empty()) return options_.config.node.name;
  }
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  return host;
}

namespace {
// Whether a server answers on the stream socket at `path` (gRPC's Unix sockets are streams).
bool stream_socket_live(const std::string& path) {
  mp::UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  if (!fd.valid() || path.size() >= sizeof(addr.sun_path)) return false;
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size());
  return ::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
}
}  // namespace

Status Daemon::start_peer_service() {
  const config::DaemonConfig& cfg = options_.config;
  RendezvousOptions ro;
  ro.timeout = cfg.timeouts.rendezvous;
  ro.max_pending = cfg.peer.max_forming;
  rendezvous_ = std::make_unique<RendezvousService>(ro);
  grpc::ServerBuilder builder;
  std::vector<std::string> uris;
  std::vector<std::unique_ptr<int>> ports;
  for (size_t i = 0; i < cfg.peer.listen.size(); ++i) {
    const config::ListenAddress& a = cfg.peer.listen[i];
    const std::string uri = config::grpc_uri(cfg, a);
    if (a.kind == config::ListenKind::kUnix) {
      const std::string path = uri.substr(5);
      if (::access(path.c_str(), F_OK) == 0) {
        if (stream_socket_live(path))
          return Status(StatusCode::kAlreadyExists, "peer.listen[" + std::to_string(i) + "]: another server answers on " +
                                                        path + "; give this mkerneld another --runtime-dir");
        ::unlink(path.c_str());
      }
    }
    ports.push_back(std::make_unique<int>(0));
    builder.AddListeningPort(uri, grpc::InsecureServerCredentials(), ports.back().get());
    uris.push_back(uri);
  }
  builder.RegisterService(rendezvous_.get());
  peer_server_ = builder.BuildAndStart();
  std::string all;
  for (const auto& u : uris) all += (all.empty() ? "" : ", ") + u;
  if (!peer_server_) return Status(StatusCode::kUnavailable, "peer.listen: cannot listen on " + all);
  for (size_t i = 0; i < uris.size(); ++i) {
    if (*ports[i] == 0) {
      peer_server_->Shutdown();
      peer_server_.reset();
      return Status(StatusCode::kUnavailable,
                    "peer.listen[" + std::to_string(i) + "]: cannot listen on " + uris[i] +
                        " (address in use, or not an address of this node)");
    }
    if (uris[i].rfind("unix:", 0) == 0) ::chmod(uris[i].substr(5).c_str(), 0660);
  }
  peer_address_ = config::peer_advertise_target(cfg);
  spdlog::info("peer service (rendezvous) on {}; other daemons reach it at {}", all, peer_address_);
  return Status::Ok();
}

Status Daemon::start_connect(const std::shared_ptr<Session>& s, const pb::Request& req) {
  const pb::Connect& c = req.connect();
  if (s->connect_started)
    return Status(StatusCode::kFailedPrecondition,
                  "connect: the session already connected its communicator (or is connecting it)");
  if (c.token().size() < kMinTokenBytes || c.token().size() > kMaxTokenBytes)
    return Status(StatusCode::kInvalidArgument, "token: " + std::to_string(c.token().size()) + " bytes; expected " +
                                                    std::to_string(kMinTokenBytes) + ".." +
                                                    std::to_string(kMaxTokenBytes));
  if (c.timeout_ms() > kMaxConnectTimeoutMs)
    return Status(StatusCode::kInvalidArgument, "timeout_ms: " + std::to_string(c.timeout_ms()) +
                                                    "; expected 0 (the daemon's default) .. " +
                                                    std::to_string(kMaxConnectTimeoutMs));
  if (c.root().size() > 1024)
    return Status(StatusCode::kInvalidArgument,
                  "root: " + std::to_string(c.root().size()) + " bytes; expected a peer address of at most 1024");
  const TransportProbe* probe = probe_for(s->identity().gpu);
  if (probe == nullptr) return Status(StatusCode::kInternal, "connect: the session's proxy is gone");
  ConnectRequest cr;
  cr.root = c.root().empty() ? peer_address_ : peer_target(c.root());
  cr.token = c.token();
  cr.network_for_local = c.network_for_local();
  cr.node = node_name();
  cr.instance = epoch_;
  cr.choice = probe->choice;
  cr.transport_status = probe->status;  // without one, only ranks on this daemon can be reached
  {
    std::lock_guard<std::mutex> lock(config_mu_);
    cr.timeout = c.timeout_ms() != 0 ? std::chrono::milliseconds(c.timeout_ms()) : options_.config.timeouts.rendezvous;
    cr.open.command_timeout = options_.config.timeouts.command;
  }
  std::lock_guard<std::mutex> lock(connects_mu_);
  if (connects_.size() >= kMaxConnectsAtOnce)
    return Status(StatusCode::kResourceExhausted, "connect: " + std::to_string(connects_.size()) +
                                                      " sessions are connecting; at most " +
                                                      std::to_string(kMaxConnectsAtOnce) + " at once");
  auto job = std::make_unique<ConnectJob>();
  job->session = s;
  job->request_id = req.request_id();
  ConnectJob* j = job.get();
  s->connect_started = true;
  spdlog::info("session {}: connecting communicator \"{}\" rank {}/{} through root {} ({} ms bound)", s->id(),
               s->identity().communicator, s->identity().rank, s->identity().world_size, cr.root, cr.timeout.count());
  j->worker = std::thread([this, j, cr] {
    auto r = connect_session(*j->session, cr, *j->cancel);
    if (r.ok()) j->network = std::move(r).value();
    else j->status = r.status();
    j->finished.store(true, std::memory_order_release);
    wake();
  });
  pthread_setname_np(j->worker.native_handle(), "mkd-connect");
  connects_.push_back(std::move(job));
  return Status::Ok();
}

void Daemon::finish_connects() {
  std::vector<std::unique_ptr<ConnectJob>> done;
  {
    std::lock_guard<std::mutex> lock(connects_mu_);
    for (auto it = connects_.begin(); it != connects_.end();) {
      if ((*it)->finished.load(std::memory_order_acquire)) {
        done.push_back(std::move(*it));
        it = connects_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& j : done) {
    j->worker.join();
    const std::shared_ptr<Session>& s = j->session;
    if (s->ended() || s->farewell_sent) continue;  // its network (if any) goes with the job
    pb::Reply reply;
    reply.set_request_id(j->request_id);
    if (!j->status.ok()) {
      s->connect_started = false;  // it may try again
      fill_error(&reply, j->status);
      spdlog::warn("session {}: connecting communicator \"{}\" failed: {}", s->id(), s->identity().communicator,
                   j->status.to_string());
    } else {
      pb::Connected* c = reply.mutable_connected();
      c->set_transport(j->network->description);
      if (j->network->transport) {
        const net::Capabilities& caps = j->network->transport->capabilities();
        c->set_gpu_memory(caps.dmabuf);
        if (!caps.dmabuf)
          c->set_gpu_memory_reason(j->network->description + ": " +
                                   (caps.dmabuf_reason.empty() ? "cannot register GPU memory" : caps.dmabuf_reason));
      } else {
        c->set_gpu_memory_reason("no network transport");
      }
      uint32_t over_network = 0;
      for (const RankRoute& r : j->network->ranks) {
        pb::RankRoute* e = c->add_ranks();
        e->set_rank(r.rank);
        e->set_node(r.node);
        e->set_network(r.network);
        e->set_regions(static_cast<uint32_t>(r.region_bytes.size()));
        e->set_flags(r.flags);
        e->set_gpu_regions(r.gpu_regions);
        over_network += r.network ? 1 : 0;
      }
      spdlog::info("session {}: communicator \"{}\" connected: {} ranks, {} through {}", s->id(),
                   s->identity().communicator, j->network->ranks.size(), over_network, j->network->description);
      s->set_network(std::move(j->network));
    }
    const Status ss = mp::send_message(s->socket_fd(), reply, {}, 1000ms);
    if (!ss.ok()) finish_session(s, ss.with_context("reply to client"));
  }
}

void Daemon::cancel_connects(uint64_t session_id) {
  std::lock_guard<std::mutex> lock(connects_mu_);
  for (auto& j : connects_)
    if (session_id == 0 || j->session->id() == session_id) j->cancel->cancel();
}

// ---- control ----------------------------------------------------------------------------------

bool Daemon::proxy_alive(const Proxy& p) const { return p.since_heartbeat() < kProxyAliveBound; }

bool Daemon::all_proxies_alive() const {
  for (auto& p : proxies_)
    if (!proxy_alive(*p)) return false;
  return !proxies_.empty();
}

DaemonStatus Daemon::status() const {
  DaemonStatus st;
  {
    std::lock_guard<std::mutex> lock(config_mu_);
    st.node_name = options_.config.node.name;
    st.config_source = options_.config_source;
    st.config_generation = config_generation_;
  }
  if (st.node_name.empty()) {
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    st.node_name = host;
  }
  st.version = MKERNEL_VERSION;
  st.protocol_version = mp::kProtocolVersion;
  st.epoch = epoch_;
  st.pid = ::getpid();
  st.uptime_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_at_).count();
  st.draining = draining_.load();
  st.runtime_dir = runtime_dir_;
  st.client_socket = socket_path_;
  {
    std::lock_guard<std::mutex> lock(sessions_mu_);
    st.sessions = static_cast<uint32_t>(sessions_.size());
  }
  for (auto& p : proxies_) st.proxies.push_back(p->options().name);
  return st;
}

std::vector<ProxyStats> Daemon::stats() const {
  std::vector<ProxyStats> out;
  for (auto& p : proxies_) {
    ProxyStats s = p->stats();
    s.alive = proxy_alive(*p);
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<ClientInfo> Daemon::clients() const {
  std::vector<ClientInfo> out;
  std::lock_guard<std::mutex> lock(sessions_mu_);
  const auto now = std::chrono::steady_clock::now();
  for (auto& [id, s] : sessions_) {
    if (!s->has_hello()) continue;
    ClientInfo c;
    c.session_id = id;
    c.pid = s->creds().pid;
    c.uid = s->creds().uid;
    c.gid = s->creds().gid;
    c.name = s->identity().name;
    c.communicator = s->identity().communicator;
    c.rank = s->identity().rank;
    c.world_size = s->identity().world_size;
    c.gpu = s->identity().gpu;
    c.rings = s->num_rings();
    c.regions = s->num_regions();
    c.registered_bytes = s->registered_bytes();
    c.commands = s->commands.load(std::memory_order_relaxed);
    c.connected_seconds = std::chrono::duration<double>(now - s->connected_at).count();
    out.push_back(std::move(c));
  }
  return out;
}

std::vector<HealthEntry> Daemon::health() const {
  std::vector<HealthEntry> out;
  const bool draining = draining_.load();
  bool all = !proxies_.empty();
  std::string whole_reason = draining ? "draining" : proxies_.empty() ? "no proxies" : "";
  std::vector<HealthEntry> gpus;
  std::map<std::string, bool> nics;
  for (auto& p : proxies_) {
    const bool alive = proxy_alive(*p);
    HealthEntry e;
    e.service = "mkerneld.gpu" + std::to_string(p->options().index);
    e.serving = alive && !draining;
    e.reason = draining ? "draining"
               : alive  ? ""
                        : "proxy " + p->options().name + " has not checked in for " +
                             std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                                                p->since_heartbeat()).count()) + " ms";
    if (!alive) {
      all = false;
      if (whole_reason.empty()) whole_reason = e.reason;
    }
    gpus.push_back(std::move(e));
    const std::string nic = Proxy::kLoopbackNic;
    if (!nic.empty()) nics[nic] = nics[nic] || alive;
  }
  out.push_back({"", all && !draining, whole_reason});
  for (auto& g : gpus) out.push_back(std::move(g));
  for (auto& [nic, alive] : nics)
    out.push_back({"mkerneld.nic." + nic, alive && !draining,
                   draining ? "draining" : alive ? "" : "no live proxy uses this NIC"});
  return out;
}

Status Daemon::drain() {
  if (!draining_.exchange(true)) spdlog::info("draining: new sessions are refused");
  return Status::Ok();
}

Status Daemon::undrain() {
  if (draining_.exchange(false)) spdlog::info("undrained: new sessions are accepted");
  return Status::Ok();
}

ReloadResult Daemon::reload(const std::string& path_in) {
  ReloadResult r;
  std::string path = path_in;
  {
    std::lock_guard<std::mutex> lock(config_mu_);
    if (path.empty()) {
      if (options_.config_source == "built-in default") {
        r.status = Status(StatusCode::kFailedPrecondition,
                          "reload: mkerneld was started with the built-in default config; give a "
                          "file to reload from");
        return r;
      }
      path = options_.config_source;
    }
  }
  config::LoadResult loaded = config::load_config_file(path);
  if (!loaded.ok()) {
    r.status = Status(StatusCode::kInvalidArgument, "reload refused, running config kept:\n" + loaded.error_text());
    spdlog::warn("{}", r.status.message());
    return r;
  }
  config::DaemonConfig next;
  {
    std::lock_guard<std::mutex> lock(config_mu_);
    const config::DaemonConfig& running = options_.config;
    r.needs_restart = config::restart_required_changes(running, *loaded.config);
    next = config::hot_reloaded(running, *loaded.config);
    if (!(next.proxy == running.proxy) || !(next.overrides == running.overrides)) r.applied_changes.push_back("proxy");
    if (!(next.clients == running.clients)) r.applied_changes.push_back("clients");
    if (!(next.timeouts == running.timeouts)) r.applied_changes.push_back("timeouts");
    if (!(next.logging == running.logging)) r.applied_changes.push_back("logging");
    if (!(next.rings == running.rings)) r.applied_changes.push_back("rings");
    if (!(next.metrics == running.metrics)) r.applied_changes.push_back("metrics");
    if (!(next.peer == running.peer)) r.applied_changes.push_back("peer");
    options_.config = next;
    options_.config_source = path;
    ++config_generation_;
  }
  if (rendezvous_) rendezvous_->set_max_pending(next.peer.max_forming);
  for (auto& p : proxies_) {
    const config::ProxySettings ps = config::proxy_settings(next, p->options().index);
    p->set_polling(ps.poll.mode == config::PollMode::kSpin, ps.poll.spin, ps.poll.sleep,
                   ps.batch.max_commands);
  }
  static const spdlog::level::level_enum kLevels[] = {spdlog::level::trace, spdlog::level::debug,
                                                       spdlog::level::info, spdlog::level::warn,
                                                       spdlog::level::err};
  spdlog::set_level(kLevels[static_cast<int>(next.logging.level)]);
  r.applied = true;
  r.status = Status::Ok();
  std::string restart;
  for (auto& f : r.needs_restart) restart += (restart.empty() ? "" : ", ") + f;
  spdlog::info("reloaded {}{}", path, restart.empty() ? "" : "; needs a restart to take effect: " + restart);
  return r;
}

Status Daemon::stall_proxy(uint32_t gpu, std::chrono::milliseconds duration) {
  if (!options_.test_hooks)
    return Status(StatusCode::kFailedPrecondition,
                  "stall_proxy is a test hook; start mkerneld with --enable-test-hooks");
  for (auto& p : proxies_)
    if (p->options().index == gpu) {
      p->stall_for(duration);
      return Status::Ok();
    }
  return Status(StatusCode::kNotFound, "gpu: " + std::to_string(gpu) + " has no proxy");
}

}  // namespace mkernel::daemon
