#include "peering.h"

#include <pthread.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

#include <grpcpp/grpcpp.h>

#include "mkernel/protocol/shm.h"
#include "rendezvous.h"
#include "session.h"

namespace mkernel::daemon {

namespace {

// Whether a server answers on the stream socket at `path` (gRPC's Unix sockets are streams).
bool stream_socket_live(const std::string& path) {
  protocol::UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  if (!fd.valid() || path.size() >= sizeof(addr.sun_path)) return false;
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size());
  return ::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
}

}  // namespace

// ---- PeerService -----------------------------------------------------------------------------

PeerService::PeerService() = default;

PeerService::~PeerService() {
  shutdown(std::chrono::system_clock::now());
  stop();
}

Status PeerService::start(const config::DaemonConfig& cfg) {
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
  server_ = builder.BuildAndStart();
  std::string all;
  for (const auto& u : uris) all += (all.empty() ? "" : ", ") + u;
  if (!server_) return Status(StatusCode::kUnavailable, "peer.listen: cannot listen on " + all);
  for (size_t i = 0; i < uris.size(); ++i) {
    if (*ports[i] == 0) {
      server_->Shutdown();
      server_.reset();
      return Status(StatusCode::kUnavailable,
                    "peer.listen[" + std::to_string(i) + "]: cannot listen on " + uris[i] +
                        " (address in use, or not an address of this node)");
    }
    if (uris[i].rfind("unix:", 0) == 0) ::chmod(uris[i].substr(5).c_str(), 0660);
  }
  address_ = config::peer_advertise_target(cfg);
  spdlog::info("peer service (rendezvous) on {}; other daemons reach it at {}", all, address_);
  return Status::Ok();
}

void PeerService::set_max_pending(size_t max_pending) {
  if (rendezvous_) rendezvous_->set_max_pending(max_pending);
}

void PeerService::shutdown(std::chrono::system_clock::time_point deadline) {
  if (server_) server_->Shutdown(deadline);
}

void PeerService::stop() {
  if (!server_) return;
  server_->Wait();
  server_.reset();
  if (address_.rfind("unix:", 0) == 0) ::unlink(address_.substr(5).c_str());
}

// ---- ConnectJobs -----------------------------------------------------------------------------

ConnectJobs::ConnectJobs(std::function<void()> wake) : wake_(std::move(wake)) {}

ConnectJobs::~ConnectJobs() {
  cancel(0);
  join_all();
}

Status ConnectJobs::start(std::shared_ptr<Session> session, uint64_t request_id, ConnectRequest request) {
  std::lock_guard<std::mutex> lock(mu_);
  if (jobs_.size() >= kMaxConnectsAtOnce)
    return Status(StatusCode::kResourceExhausted, "connect: " + std::to_string(jobs_.size()) +
                                                      " sessions are connecting; at most " +
                                                      std::to_string(kMaxConnectsAtOnce) + " at once");
  auto job = std::make_unique<ConnectJob>();
  job->session = std::move(session);
  job->request_id = request_id;
  ConnectJob* j = job.get();
  j->worker = std::thread([this, j, cr = std::move(request)] {
    auto r = connect_session(*j->session, cr, *j->cancel);
    if (r.ok()) j->network = std::move(r).value();
    else j->status = r.status();
    j->finished.store(true, std::memory_order_release);
    if (wake_) wake_();
  });
  pthread_setname_np(j->worker.native_handle(), "mkd-connect");
  jobs_.push_back(std::move(job));
  return Status::Ok();
}

std::vector<std::unique_ptr<ConnectJob>> ConnectJobs::collect_finished() {
  std::vector<std::unique_ptr<ConnectJob>> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = jobs_.begin(); it != jobs_.end();) {
      if ((*it)->finished.load(std::memory_order_acquire)) {
        done.push_back(std::move(*it));
        it = jobs_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& j : done) j->worker.join();
  return done;
}

void ConnectJobs::cancel(uint64_t session_id) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& j : jobs_)
    if (session_id == 0 || j->session->id() == session_id) j->cancel->cancel();
}

void ConnectJobs::join_all() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& j : jobs_)
    if (j->worker.joinable()) j->worker.join();
  jobs_.clear();
}

}  // namespace mkernel::daemon
