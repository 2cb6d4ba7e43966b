#include "daemon_state.h"

#include <unistd.h>

#include <algorithm>

#include "mkernel/protocol/ring.h"

namespace mkernel::daemon {

namespace {

constexpr uint32_t kMaxFlagsPerSession = 1u << 20;

uint64_t make_epoch() {
  // Nanoseconds of wall-clock time: distinct for every start, growing across restarts.
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count();
  return static_cast<uint64_t>(ns) | 1;
}

}  // namespace

// ---- SessionTable ----------------------------------------------------------------------------

void SessionTable::insert(std::shared_ptr<Session> s) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t id = s->id();
  sessions_.emplace(id, std::move(s));
}

void SessionTable::erase(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  sessions_.erase(id);
}

std::shared_ptr<Session> SessionTable::find(uint64_t id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(id);
  return it != sessions_.end() ? it->second : nullptr;
}

std::vector<std::shared_ptr<Session>> SessionTable::all() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<Session>> out;
  out.reserve(sessions_.size());
  for (auto& [id, s] : sessions_) out.push_back(s);
  return out;
}

size_t SessionTable::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return sessions_.size();
}

void SessionTable::for_each(const std::function<void(const std::shared_ptr<Session>&)>& f) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, s] : sessions_) f(s);
}

// ---- DaemonState -----------------------------------------------------------------------------

DaemonState::DaemonState(DaemonOptions options)
    : epoch(make_epoch()),
      config_source_(std::move(options.config_source)),
      test_hooks_(options.test_hooks),
      runtime_dir_override_(std::move(options.runtime_dir_override)),
      log_level_override_(options.log_level_override) {
  config_ = with_overrides(std::move(options.config));
}

config::DaemonConfig DaemonState::with_overrides(config::DaemonConfig loaded) const {
  if (runtime_dir_override_) loaded.node.runtime_dir = *runtime_dir_override_;
  if (log_level_override_) loaded.logging.level = *log_level_override_;
  return loaded;
}

void DaemonState::set_descriptor_limit(uint64_t limit) { descriptor_limit_.store(limit, std::memory_order_relaxed); }

LedgerLimits DaemonState::limits() const {
  LedgerLimits l;
  {
    std::lock_guard<std::mutex> lock(config_mu_);
    l.clients = config_.clients;
  }
  l.descriptor_budget = l.clients.max_descriptors;
  const uint64_t limit = descriptor_limit();
  if (limit != 0) {
    // The reserve is never handed to clients (ledger.h note 3).
    const uint64_t reserve = config::reserved_descriptors(limit);
    const uint64_t left = limit - reserve;
    if (left < l.descriptor_budget) {
      // The per-uid and per-process shares shrink in proportion, so one user still gets at most
      // its configured fraction of what the node really has.
      const uint64_t configured = l.descriptor_budget;
      const auto scale = [&](uint32_t share) {
        return static_cast<uint32_t>(std::max<uint64_t>(1, uint64_t{share} * left / configured));
      };
      l.clients.per_uid.descriptors = scale(l.clients.per_uid.descriptors);
      l.clients.per_process.descriptors = scale(l.clients.per_process.descriptors);
      l.descriptor_budget = static_cast<uint32_t>(left);
      l.descriptor_budget_why = ", lowered to " + std::to_string(left) + " by the descriptor limit " +
                                std::to_string(limit) + " less " + std::to_string(reserve) +
                                " kept for admin, health, metrics and peers";
      l.descriptor_share_why = ", lowered in proportion: the descriptor limit " + std::to_string(limit) +
                               " leaves clients " + std::to_string(left) + " of clients.max_descriptors " +
                               std::to_string(configured);
    }
  }
  return l;
}

config::DaemonConfig DaemonState::config() const {
  std::lock_guard<std::mutex> lock(config_mu_);
  return config_;
}

std::string DaemonState::config_source() const {
  std::lock_guard<std::mutex> lock(config_mu_);
  return config_source_;
}

uint64_t DaemonState::config_generation() const {
  std::lock_guard<std::mutex> lock(config_mu_);
  return config_generation_;
}

void DaemonState::replace_config(config::DaemonConfig next, std::string source) {
  std::lock_guard<std::mutex> lock(config_mu_);
  config_ = std::move(next);
  config_source_ = std::move(source);
  ++config_generation_;
}

SessionQuota DaemonState::quota() const {
  std::lock_guard<std::mutex> lock(config_mu_);
  const config::ClientQuota& q = config_.clients.quota;
  SessionQuota out;
  out.max_rings = q.rings;
  out.max_regions = config_.clients.quota.regions;
  out.max_registered_bytes = q.registered_bytes;
  out.max_inflight = q.inflight_commands;
  out.max_ring_capacity_log2 = protocol::kMaxCapacityLog2;
  out.max_flags = kMaxFlagsPerSession;
  return out;
}

std::string DaemonState::node_name() const {
  {
    std::lock_guard<std::mutex> lock(config_mu_);
    if (!config_.node.name.empty()) return config_.node.name;
  }
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  return host;
}

Proxy* DaemonState::proxy_for(uint32_t gpu) const {
  for (auto& p : proxies)
    if (p->options().index == gpu) return p.get();
  return nullptr;
}

const TransportProbe* DaemonState::probe_for(uint32_t gpu) const {
  for (size_t i = 0; i < proxies.size() && i < probes.size(); ++i)
    if (proxies[i]->options().index == gpu) return &probes[i];
  return nullptr;
}

void DaemonState::republish_peers() {
  auto table = std::make_shared<PeerTable>();
  {
    // Only the sessions that exist, whatever world size their hellos claim (PeerList).
    std::map<std::string, std::vector<std::pair<uint32_t, std::shared_ptr<Session>>>> building;
    sessions.for_each([&](const std::shared_ptr<Session>& s) {
      if (!s->has_hello() || s->ended()) return;
      building[s->identity().communicator].emplace_back(s->identity().rank, s);
    });
    for (auto& [comm, ranks] : building) table->emplace(comm, std::make_shared<const PeerList>(std::move(ranks)));
  }
  std::shared_ptr<const PeerTable> frozen = std::move(table);
  for (auto& p : proxies) p->set_peers(frozen);
}

}  // namespace mkernel::daemon
