// admin_server.cc: the Admin service, the health publisher and the listener set-up.
#include "admin_server.h"

#include <grp.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <condition_variable>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>
#include <utility>

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/server_credentials.h>
#include <spdlog/spdlog.h>

#include "admin_acceptor.h"
#include "grpc_status.h"
#include "mkernel/proto/admin.grpc.pb.h"

namespace mkernel::daemon {

namespace pb = ::mkernel::admin::v1;

std::string gpu_health_service(uint32_t gpu) { return "mkerneld.gpu" + std::to_string(gpu); }
std::string nic_health_service(const std::string& nic) { return "mkerneld.nic." + nic; }

namespace {

void fill(const HealthEntry& in, pb::HealthEntry* out) {
  out->set_service(in.service);
  out->set_serving(in.serving);
  out->set_reason(in.reason);
}

void fill(const ProxyStats& in, pb::ProxyStats* out) {
  out->set_gpu(in.gpu);
  out->set_name(in.name);
  out->set_transport(in.transport);
  out->set_nic(in.nic);
  out->set_consumed(in.consumed);
  auto* c = out->mutable_commands();
  c->set_ok(in.by_outcome[static_cast<size_t>(Outcome::kOk)]);
  c->set_error(in.by_outcome[static_cast<size_t>(Outcome::kError)]);
  c->set_rejected(in.by_outcome[static_cast<size_t>(Outcome::kRejected)]);
  out->set_in_flight(in.in_flight);
  out->set_bytes(in.bytes);
  out->set_errors(in.errors);
  out->set_ring_occupancy(in.ring_occupancy);
  out->set_ring_capacity(in.ring_capacity);
  out->set_sessions(in.sessions);
  out->set_rings(in.rings);
  for (uint64_t b : in.latency_ns_log2) out->add_latency_ns_log2(b);
  out->set_seconds_since_heartbeat(in.seconds_since_heartbeat);
  out->set_alive(in.alive);
}

void fill(const ResourceUsage& in, pb::ResourceUsage* out) {
  out->set_sessions(in.sessions);
  out->set_max_sessions(in.max_sessions);
  out->set_client_descriptors(in.client_descriptors);
  out->set_descriptor_budget(in.descriptor_budget);
  out->set_open_descriptors(in.open_descriptors);
  out->set_descriptor_limit(in.descriptor_limit);
  out->set_shared_memory(in.shared_memory);
  out->set_max_shared_memory(in.max_shared_memory);
  out->set_rings(in.rings);
  out->set_regions(in.regions);
  out->set_resident_bytes(in.resident_bytes);
}

void fill(const std::vector<RefusalCount>& in, google::protobuf::RepeatedPtrField<pb::RefusalCount>* out) {
  for (const auto& r : in) {
    pb::RefusalCount* e = out->Add();
    e->set_reason(r.reason);
    e->set_count(r.count);
  }
}

void fill(const ClientInfo& in, pb::ClientInfo* out) {
  out->set_session_id(in.session_id);
  out->set_pid(in.pid);
  out->set_uid(in.uid);
  out->set_gid(in.gid);
  out->set_name(in.name);
  out->set_communicator(in.communicator);
  out->set_rank(in.rank);
  out->set_world_size(in.world_size);
  out->set_gpu(in.gpu);
  out->set_rings(in.rings);
  out->set_regions(in.regions);
  out->set_registered_bytes(in.registered_bytes);
  out->set_commands(in.commands);
  out->set_connected_seconds(in.connected_seconds);
}

// "unix:/p", "unix:///p" -> "/p"; anything else -> "".
std::string unix_path(const std::string& uri) {
  constexpr std::string_view kPrefix = "unix:";
  if (uri.compare(0, kPrefix.size(), kPrefix) != 0) return {};
  std::string path = uri.substr(kPrefix.size());
  if (path.compare(0, 2, "//") == 0) path = path.substr(2);
  return path;
}

// A Unix socket path we may bind: absent, or a socket nobody answers on (a dead daemon's).
Status claim_unix_path(const std::string& path) {
  sockaddr_un addr{};
  if (path.empty() || path[0] != '/') {
    return {StatusCode::kInvalidArgument,
            "admin listen address unix:" + path + ": expected an absolute path"};
  }
  if (path.size() >= sizeof(addr.sun_path)) {
    return {StatusCode::kInvalidArgument,
            "admin socket path " + path + ": " + std::to_string(path.size()) +
                " bytes; expected fewer than " + std::to_string(sizeof(addr.sun_path))};
  }
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return Status::Ok();
    return errno_status("admin socket " + path, errno);
  }
  if (!S_ISSOCK(st.st_mode)) {
    return {StatusCode::kAlreadyExists,
            "admin socket path " + path + " exists and is not a socket; not replacing it"};
  }
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return errno_status("socket(AF_UNIX)", errno);
  addr.sun_family = AF_UNIX;
  path.copy(addr.sun_path, path.size());
  int rc = connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
  int err = errno;
  close(fd);
  if (rc == 0 || err == EAGAIN || err == EINPROGRESS) {
    return {StatusCode::kAlreadyExists,
            "admin socket " + path + " is in use by a running server (another mkerneld with "
            "the same runtime directory?)"};
  }
  if (unlink(path.c_str()) != 0 && errno != ENOENT) {
    return errno_status("removing stale admin socket " + path, errno);
  }
  spdlog::info("admin: removed stale socket {}", path);
  return Status::Ok();
}

StatusOr<gid_t> resolve_group(const std::string& group) {
  gid_t gid = 0;
  auto [end, ec] = std::from_chars(group.data(), group.data() + group.size(), gid);
  if (ec == std::errc() && end == group.data() + group.size()) return gid;
  std::vector<char> buf(16384);
  struct group gr {};
  struct group* found = nullptr;
  int rc = getgrnam_r(group.c_str(), &gr, buf.data(), buf.size(), &found);
  if (rc != 0) return errno_status("looking up group " + group, rc);
  if (found == nullptr) {
    return Status(StatusCode::kNotFound,
                  "admin socket_group: " + group + "; expected an existing group name or gid");
  }
  return found->gr_gid;
}

StatusOr<std::string> read_file(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return Status(StatusCode::kIoError, std::string(what) + ": cannot read " + path);
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

// ---- the Admin service --------------------------------------------------------------------

class AdminService final : public pb::Admin::Service {
 public:
  AdminService(DaemonControl& control, AdminServer::Impl& owner)
      : control_(control), owner_(owner) {}

  grpc::Status GetStatus(grpc::ServerContext*, const pb::GetStatusRequest*,
                         pb::DaemonStatus* out) override {
    DaemonStatus s = control_.status();
    out->set_node_name(s.node_name);
    out->set_version(s.version);
    out->set_protocol_version(s.protocol_version);
    out->set_epoch(s.epoch);
    out->set_pid(s.pid);
    out->set_uptime_seconds(s.uptime_seconds);
    out->set_draining(s.draining);
    out->set_config_source(s.config_source);
    out->set_config_generation(s.config_generation);
    out->set_runtime_dir(s.runtime_dir);
    out->set_client_socket(s.client_socket);
    out->set_sessions(s.sessions);
    for (const auto& p : s.proxies) out->add_proxies(p);
    for (const auto& h : control_.health()) fill(h, out->add_health());
    fill(s.refusals, out->mutable_refusals());
    fill(s.usage, out->mutable_usage());
    return grpc::Status::OK;
  }

  grpc::Status GetStats(grpc::ServerContext*, const pb::GetStatsRequest*,
                        pb::Stats* out) override {
    for (const auto& p : control_.stats()) fill(p, out->add_proxies());
    fill(control_.refusals(), out->mutable_refusals());
    fill(control_.usage(), out->mutable_usage());
    return grpc::Status::OK;
  }

  grpc::Status ListClients(grpc::ServerContext*, const pb::ListClientsRequest*,
                           pb::ClientList* out) override {
    for (const auto& c : control_.clients()) fill(c, out->add_clients());
    return grpc::Status::OK;
  }

  grpc::Status Drain(grpc::ServerContext* ctx, const pb::DrainRequest*,
                     pb::DrainReply* out) override;
  grpc::Status Undrain(grpc::ServerContext* ctx, const pb::UndrainRequest*,
                       pb::DrainReply* out) override;

  grpc::Status Reload(grpc::ServerContext* ctx, const pb::ReloadRequest* req,
                      pb::ReloadReply* out) override {
    spdlog::info("admin: reload requested by {} ({})", ctx->peer(),
                 req->path().empty() ? "the startup file" : req->path());
    ReloadResult r = control_.reload(req->path());
    out->set_applied(r.applied && r.status.ok());
    for (const auto& f : r.needs_restart) out->add_needs_restart(f);
    for (const auto& f : r.applied_changes) out->add_applied_changes(f);
    if (!r.status.ok()) out->set_error(r.status.to_string());
    out->set_config_generation(control_.status().config_generation);
    return grpc::Status::OK;
  }

  grpc::Status StallProxy(grpc::ServerContext*, const pb::StallProxyRequest* req,
                          pb::StallProxyReply*) override {
    spdlog::warn("admin: test hook: stalling proxy {} for {} ms", req->gpu(), req->duration_ms());
    return to_grpc(control_.stall_proxy(req->gpu(), std::chrono::milliseconds(req->duration_ms())));
  }

 private:
  DaemonControl& control_;
  AdminServer::Impl& owner_;
};

// ---- the health publisher -----------------------------------------------------------------

// Owns one thread that copies DaemonControl::health() into gRPC's health service.
class HealthPublisher {
 public:
  HealthPublisher(DaemonControl& control, grpc::HealthCheckServiceInterface* service,
                  std::chrono::milliseconds period)
      : control_(control), service_(service), period_(period) {
    publish();
    thread_ = std::thread([this] { run(); });
    pthread_setname_np(thread_.native_handle(), "mk-health");
  }
  ~HealthPublisher() { stop(); }
  HealthPublisher(const HealthPublisher&) = delete;
  HealthPublisher& operator=(const HealthPublisher&) = delete;

  void stop() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  // Publishes now, from the caller's thread.
  void publish() {
    std::vector<HealthEntry> entries = control_.health();
    std::lock_guard lock(publish_mu_);
    std::map<std::string, bool> now;
    for (const auto& e : entries) {
      now[e.service] = e.serving;
      auto it = last_.find(e.service);
      if (it == last_.end() || it->second != e.serving) {
        service_->SetServingStatus(e.service, e.serving);
        const char* name = e.service.empty() ? "(server)" : e.service.c_str();
        if (e.serving) {
          spdlog::info("health: {} SERVING", name);
        } else {
          spdlog::warn("health: {} NOT_SERVING: {}", name, e.reason);
        }
      }
    }
    // An entry the daemon no longer reports is not serving.
    for (const auto& [service, serving] : last_) {
      if (now.count(service) == 0 && serving) {
        service_->SetServingStatus(service, false);
        spdlog::warn("health: {} NOT_SERVING: no longer reported", service);
      }
    }
    for (auto& [service, serving] : last_) {
      if (now.count(service) == 0) serving = false;
    }
    for (const auto& [service, serving] : now) last_[service] = serving;
  }

 private:
  void run() {
    std::unique_lock lock(mu_);
    while (!stop_) {
      cv_.wait_for(lock, period_, [this] { return stop_; });
      if (stop_) break;
      lock.unlock();
      publish();
      lock.lock();
    }
  }

  DaemonControl& control_;
  grpc::HealthCheckServiceInterface* service_;
  const std::chrono::milliseconds period_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::mutex publish_mu_;
  std::map<std::string, bool> last_;
  std::thread thread_;
};

// ---- the server ---------------------------------------------------------------------------

class AdminServer::Impl {
 public:
  Impl(DaemonControl& control) : control_(control), service_(control, *this) {}

  Status start(const AdminOptions& options);
  void stop();
  void refresh_health() {
    if (health_) health_->publish();
  }

  DaemonControl& control_;
  AdminService service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<AdminAcceptor> acceptor_;  // the Unix sockets (admin_acceptor.h)
  std::unique_ptr<HealthPublisher> health_;
  std::vector<std::string> addresses_;
  std::vector<std::string> unix_paths_;
  std::mutex stop_mu_;
  bool stopped_ = false;
};

grpc::Status AdminService::Drain(grpc::ServerContext* ctx, const pb::DrainRequest*,
                                 pb::DrainReply* out) {
  spdlog::info("admin: drain requested by {}", ctx->peer());
  Status s = control_.drain();
  owner_.refresh_health();
  out->set_draining(control_.status().draining);
  return to_grpc(s);
}

grpc::Status AdminService::Undrain(grpc::ServerContext* ctx, const pb::UndrainRequest*,
                                   pb::DrainReply* out) {
  spdlog::info("admin: undrain requested by {}", ctx->peer());
  Status s = control_.undrain();
  owner_.refresh_health();
  out->set_draining(control_.status().draining);
  return to_grpc(s);
}

Status AdminServer::Impl::start(const AdminOptions& options) {
  std::vector<std::string> uris = options.listen;
  if (uris.empty()) {
    uris.push_back("unix:" + options.runtime_dir + "/" + kDefaultAdminSocketName);
  }
  if (options.health_poll <= std::chrono::milliseconds(0)) {
    return {StatusCode::kInvalidArgument,
            "admin health_poll: " + std::to_string(options.health_poll.count()) +
                " ms; expected > 0"};
  }

  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  std::vector<int> ports(uris.size(), 0);
  // Unix sockets are listened on here and accepted by AdminAcceptor (admin_acceptor.h: gRPC's
  // own listener stops for good after one EMFILE); TCP (TLS) stays with gRPC.
  std::vector<protocol::UniqueFd> unix_listeners;
  for (size_t i = 0; i < uris.size(); ++i) {
    const std::string& uri = uris[i];
    std::string path = unix_path(uri);
    if (!path.empty() || uri == "unix:") {
      MK_RETURN_IF_ERROR(claim_unix_path(path));
      MK_ASSIGN_OR_RETURN(protocol::UniqueFd fd, AdminAcceptor::listen_unix(path));
      unix_paths_.push_back(path);
      unix_listeners.push_back(std::move(fd));
      continue;
    }
    if (options.tls_cert_path.empty() || options.tls_key_path.empty()) {
      return {StatusCode::kInvalidArgument,
              "admin listen address " + uri +
                  ": TCP listeners need TLS; expected tls cert and key paths, or a unix: address"};
    }
    MK_ASSIGN_OR_RETURN(std::string cert, read_file(options.tls_cert_path, "admin tls cert"));
    MK_ASSIGN_OR_RETURN(std::string key, read_file(options.tls_key_path, "admin tls key"));
    grpc::SslServerCredentialsOptions ssl;
    ssl.pem_key_cert_pairs.push_back({key, cert});
    if (!options.tls_client_ca_path.empty()) {
      MK_ASSIGN_OR_RETURN(ssl.pem_root_certs,
                          read_file(options.tls_client_ca_path, "admin tls client CA"));
      ssl.client_certificate_request =
          GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
    }
    builder.AddListeningPort(uri, grpc::SslServerCredentials(ssl), &ports[i]);
  }
  builder.RegisterService(&service_);
  server_ = builder.BuildAndStart();
  if (!server_) {
    std::string all;
    for (const auto& u : uris) all += (all.empty() ? "" : ", ") + u;
    return {StatusCode::kUnavailable, "admin: could not listen on " + all +
                                          " (address in use, or directory missing?)"};
  }
  for (size_t i = 0; i < uris.size(); ++i) {
    std::string uri = uris[i];
    if (unix_path(uri).empty() && uri.size() >= 2 && uri.compare(uri.size() - 2, 2, ":0") == 0) {
      uri = uri.substr(0, uri.size() - 1) + std::to_string(ports[i]);
    }
    addresses_.push_back(uri);
  }

  // Permissions of the socket files: the mode first, then the group.
  auto fail = [this](Status s) {
    stop();
    return s;
  };
  std::optional<gid_t> gid;
  if (!options.socket_group.empty()) {
    auto g = resolve_group(options.socket_group);
    if (!g.ok()) return fail(g.status());
    gid = g.value();
  }
  for (const auto& path : unix_paths_) {
    if (chmod(path.c_str(), static_cast<mode_t>(options.socket_mode & 07777)) != 0) {
      return fail(errno_status("chmod of admin socket " + path, errno));
    }
    if (gid && chown(path.c_str(), static_cast<uid_t>(-1), *gid) != 0) {
      return fail(errno_status("chown of admin socket " + path, errno));
    }
  }

  auto acceptor = AdminAcceptor::start(server_.get(), std::move(unix_listeners),
                                       [this](const Status& why) { control_.count_out_of_descriptors(why); });
  if (!acceptor.ok()) return fail(acceptor.status());
  acceptor_ = std::move(acceptor).value();
  health_ = std::make_unique<HealthPublisher>(control_, server_->GetHealthCheckService(),
                                              options.health_poll);
  std::string all;
  for (const auto& a : addresses_) all += (all.empty() ? "" : ", ") + a;
  spdlog::info("admin: serving Admin and grpc.health.v1 on {}", all);
  return Status::Ok();
}

void AdminServer::Impl::stop() {
  std::lock_guard lock(stop_mu_);
  if (stopped_) return;
  stopped_ = true;
  if (health_) health_->stop();
  if (acceptor_) acceptor_->stop();
  if (server_) {
    if (auto* hs = server_->GetHealthCheckService()) hs->Shutdown();
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    server_->Wait();
  }
  health_.reset();
  for (const auto& path : unix_paths_) unlink(path.c_str());
}

AdminServer::AdminServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
AdminServer::~AdminServer() { stop(); }

StatusOr<std::unique_ptr<AdminServer>> AdminServer::start(DaemonControl& control,
                                                          const AdminOptions& options) {
  auto impl = std::make_unique<Impl>(control);
  Status s = impl->start(options);
  if (!s.ok()) {
    impl->stop();
    return s;
  }
  return std::unique_ptr<AdminServer>(new AdminServer(std::move(impl)));
}

void AdminServer::stop() {
  if (impl_) impl_->stop();
}

const std::vector<std::string>& AdminServer::addresses() const { return impl_->addresses_; }

void AdminServer::refresh_health() { impl_->refresh_health(); }

}  // namespace mkernel::daemon
