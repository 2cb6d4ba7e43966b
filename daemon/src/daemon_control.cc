#include "daemon_control.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "mkernel/protocol/version.h"

namespace mkernel::daemon {

Control::Control(DaemonState& state, PeerService& peers) : state_(state), peers_(peers) {}

bool Control::all_proxies_alive() const {
  for (auto& p : state_.proxies)
    if (!proxy_alive(*p)) return false;
  return !state_.proxies.empty();
}

void Control::count_out_of_descriptors(const Status& why) {
  state_.refusals.record_anonymous(Refusal::kOutOfDescriptors, why);
}

DaemonStatus Control::status() const {
  DaemonStatus st;
  st.node_name = state_.node_name();
  st.config_source = state_.config_source();
  st.config_generation = state_.config_generation();
  st.version = MKERNEL_VERSION;
  st.protocol_version = protocol::kProtocolVersion;
  st.epoch = state_.epoch;
  st.pid = ::getpid();
  st.uptime_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - state_.started_at).count();
  st.draining = state_.draining.load();
  st.runtime_dir = state_.runtime_dir;
  st.client_socket = state_.socket_path;
  st.sessions = static_cast<uint32_t>(state_.sessions.size());
  for (auto& p : state_.proxies) st.proxies.push_back(p->options().name);
  st.refusals = refusals();
  st.usage = usage();
  return st;
}

std::vector<RefusalCount> Control::refusals() const {
  std::vector<RefusalCount> out;
  for (auto& [reason, count] : state_.refusals.all()) out.push_back({reason, count});
  return out;
}

namespace {

uint64_t count_open_descriptors() {
  uint64_t n = 0;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec))
    ++n;
  return n > 0 ? n - 1 : 0;  // the directory's own descriptor while it is read
}

uint64_t resident_bytes() {
  std::ifstream in("/proc/self/statm");
  uint64_t size = 0, resident = 0;
  in >> size >> resident;
  return resident * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
}

}  // namespace

ResourceUsage Control::usage() const {
  ResourceUsage u;
  const Holding held = state_.ledger.node();
  const LedgerLimits limits = state_.limits();
  u.sessions = held.sessions;
  u.max_sessions = limits.clients.max_sessions;
  u.client_descriptors = held.descriptors;
  u.descriptor_budget = limits.descriptor_budget;
  u.open_descriptors = count_open_descriptors();
  u.descriptor_limit = state_.descriptor_limit();
  u.shared_memory = held.shared_memory;
  u.max_shared_memory = limits.clients.max_shared_memory;
  u.rings = held.rings;
  u.regions = held.regions;
  u.resident_bytes = resident_bytes();
  return u;
}

std::vector<ProxyStats> Control::stats() const {
  std::vector<ProxyStats> out;
  for (auto& p : state_.proxies) {
    ProxyStats s = p->stats();
    s.alive = proxy_alive(*p);
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<ClientInfo> Control::clients() const {
  std::vector<ClientInfo> out;
  const auto now = std::chrono::steady_clock::now();
  state_.sessions.for_each([&](const std::shared_ptr<Session>& s) {
    if (!s->has_hello()) return;
    ClientInfo c;
    c.session_id = s->id();
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
  });
  return out;
}

std::vector<HealthEntry> Control::health() const {
  std::vector<HealthEntry> out;
  const bool draining = state_.draining.load();
  bool all = !state_.proxies.empty();
  std::string whole_reason = draining ? "draining" : state_.proxies.empty() ? "no proxies" : "";
  std::vector<HealthEntry> gpus;
  std::map<std::string, bool> nics;
  for (auto& p : state_.proxies) {
    const bool alive = proxy_alive(*p);
    HealthEntry e;
    e.service = "mkerneld.gpu" + std::to_string(p->options().index);
    e.serving = alive && !draining;
    e.reason = draining ? "draining"
               : alive  ? ""
                        : "proxy " + p->options().name + " has not checked in for " +
                             std::to_string(
                                 std::chrono::duration_cast<std::chrono::milliseconds>(p->since_heartbeat()).count()) +
                             " ms";
    if (!alive) {
      all = false;
      if (whole_reason.empty()) whole_reason = e.reason;
    }
    gpus.push_back(std::move(e));
    const std::string nic = Proxy::kLoopbackNic;
    nics[nic] = nics[nic] || alive;
  }
  out.push_back({"", all && !draining, whole_reason});
  for (auto& g : gpus) out.push_back(std::move(g));
  for (auto& [nic, alive] : nics)
    out.push_back({"mkerneld.nic." + nic, alive && !draining,
                   draining ? "draining" : alive ? "" : "no live proxy uses this NIC"});
  return out;
}

Status Control::drain() {
  if (!state_.draining.exchange(true)) spdlog::info("draining: new sessions are refused");
  return Status::Ok();
}

Status Control::undrain() {
  if (state_.draining.exchange(false)) spdlog::info("undrained: new sessions are accepted");
  return Status::Ok();
}

ReloadResult Control::reload(const std::string& path_in) {
  std::lock_guard<std::mutex> lock(reload_mu_);
  ReloadResult r;
  std::string path = path_in;
  if (path.empty()) {
    const std::string source = state_.config_source();
    if (source == "built-in default") {
      r.status = Status(StatusCode::kFailedPrecondition,
                        "reload: mkerneld was started with the built-in default config; give a "
                        "file to reload from");
      return r;
    }
    path = source;
  }
  config::LoadResult loaded = config::load_config_file(path);
  if (!loaded.ok()) {
    r.status = Status(StatusCode::kInvalidArgument, "reload refused, running config kept:\n" + loaded.error_text());
    spdlog::warn("{}", r.status.message());
    return r;
  }
  const config::DaemonConfig running = state_.config();
  // What the command line set still wins (daemon_state.h note 5): a file without
  // node.runtime_dir is no change for a daemon started with --runtime-dir.
  const config::DaemonConfig file = state_.with_overrides(std::move(*loaded.config));
  r.needs_restart = config::restart_required_changes(running, file);
  const config::DaemonConfig next = config::hot_reloaded(running, file);
  if (!(next.proxy == running.proxy) || !(next.overrides == running.overrides)) r.applied_changes.push_back("proxy");
  if (!(next.clients == running.clients)) r.applied_changes.push_back("clients");
  if (!(next.timeouts == running.timeouts)) r.applied_changes.push_back("timeouts");
  if (!(next.logging == running.logging)) r.applied_changes.push_back("logging");
  if (!(next.rings == running.rings)) r.applied_changes.push_back("rings");
  if (!(next.metrics == running.metrics)) r.applied_changes.push_back("metrics");
  if (!(next.peer == running.peer)) r.applied_changes.push_back("peer");
  state_.replace_config(next, path);
  peers_.set_max_pending(next.peer.max_forming);
  for (auto& p : state_.proxies) {
    const config::ProxySettings ps = config::proxy_settings(next, p->options().index);
    p->set_polling(ps.poll.mode == config::PollMode::kSpin, ps.poll.spin, ps.poll.sleep, ps.batch.max_commands);
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

Status Control::stall_proxy(uint32_t gpu, std::chrono::milliseconds duration) {
  if (!state_.test_hooks())
    return Status(StatusCode::kFailedPrecondition,
                  "stall_proxy is a test hook; start mkerneld with --enable-test-hooks");
  if (Proxy* p = state_.proxy_for(gpu)) {
    p->stall_for(duration);
    return Status::Ok();
  }
  return Status(StatusCode::kNotFound, "gpu: " + std::to_string(gpu) + " has no proxy");
}

}  // namespace mkernel::daemon
