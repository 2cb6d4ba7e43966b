#include "ledger.h"

#include <array>

namespace mkernel::daemon {

Holding& Holding::operator+=(const Holding& o) {
  sessions += o.sessions;
  rings += o.rings;
  regions += o.regions;
  shared_memory += o.shared_memory;
  descriptors += o.descriptors;
  connects += o.connects;
  networks += o.networks;
  return *this;
}

Holding& Holding::operator-=(const Holding& o) {
  // Never below zero: a give-back larger than what was taken is a bug, not a wrap-around.
  auto sub = [](auto& a, auto b) { a = a >= b ? a - b : 0; };
  sub(sessions, o.sessions);
  sub(rings, o.rings);
  sub(regions, o.regions);
  sub(shared_memory, o.shared_memory);
  sub(descriptors, o.descriptors);
  sub(connects, o.connects);
  sub(networks, o.networks);
  return *this;
}

bool Holding::empty() const {
  return sessions == 0 && rings == 0 && regions == 0 && shared_memory == 0 && descriptors == 0 && connects == 0 &&
         networks == 0;
}

namespace {

// One resource of one level: what is held, what is asked, the limit and its key.
struct Check {
  const char* what;  // "sessions", "shared memory bytes", ...
  uint64_t held;
  uint64_t ask;
  uint64_t limit;
  Refusal reason;
};

std::optional<Denial> first_over(const std::string& who, const Check* checks, size_t n, const std::string& note = "") {
  for (size_t i = 0; i < n; ++i) {
    const Check& c = checks[i];
    if (c.ask == 0 || c.held + c.ask <= c.limit) continue;
    const bool fds = c.reason == Refusal::kUidDescriptors || c.reason == Refusal::kProcessDescriptors ||
                     c.reason == Refusal::kMaxDescriptors;
    std::string text = std::string(c.what) + ": " + who + " already holds " + std::to_string(c.held);
    if (c.ask > 1) text += " and asks for " + std::to_string(c.ask) + " more";
    text += "; at most " + std::to_string(c.limit) + " (" + std::string(refusal_name(c.reason)) + (fds ? note : "") + ")";
    return Denial{c.reason, Status(StatusCode::kResourceExhausted, std::move(text))};
  }
  return std::nullopt;
}

std::optional<Denial> check_share(const std::string& who, const Holding& held, const Holding& ask,
                                  const config::ShareQuota& q, bool uid, const std::string& fd_note) {
  const std::array<Check, 6> checks{{
      {"sessions", held.sessions, ask.sessions, q.sessions, uid ? Refusal::kUidSessions : Refusal::kProcessSessions},
      {"rings", held.rings, ask.rings, q.rings, uid ? Refusal::kUidRings : Refusal::kProcessRings},
      {"regions", held.regions, ask.regions, q.regions, uid ? Refusal::kUidRegions : Refusal::kProcessRegions},
      {"shared memory bytes", held.shared_memory, ask.shared_memory, q.shared_memory,
       uid ? Refusal::kUidSharedMemory : Refusal::kProcessSharedMemory},
      {"descriptors", held.descriptors, ask.descriptors, q.descriptors,
       uid ? Refusal::kUidDescriptors : Refusal::kProcessDescriptors},
      {"sessions with a network endpoint", held.networks, ask.networks, q.networks,
       uid ? Refusal::kUidNetworks : Refusal::kProcessNetworks},
  }};
  return first_over(who, checks.data(), checks.size(), fd_note);
}

}  // namespace

std::optional<Denial> Ledger::take(const Owner& owner, const Holding& ask, const LedgerLimits& limits) {
  std::lock_guard<std::mutex> lock(mu_);
  const config::ClientsConfig& c = limits.clients;
  const std::string pid_name = "pid " + std::to_string(owner.pid);
  const std::string uid_name = "uid " + std::to_string(owner.uid);
  auto pit = processes_.find(owner.pid);
  const Holding pheld = pit != processes_.end() ? pit->second.held : Holding{};
  if (auto d = check_share(pid_name, pheld, ask, c.per_process, false, limits.descriptor_share_why)) return d;
  auto uit = uids_.find(owner.uid);
  const Holding uheld = uit != uids_.end() ? uit->second.held : Holding{};
  if (auto d = check_share(uid_name, uheld, ask, c.per_uid, true, limits.descriptor_share_why)) return d;
  const Check connects{"connects in progress", uheld.connects, ask.connects, limits.max_connects_per_uid,
                       Refusal::kUidConnects};
  if (auto d = first_over(uid_name, &connects, 1)) return d;
  const std::array<Check, 3> node{{
      {"sessions", node_.held.sessions, ask.sessions, c.max_sessions, Refusal::kMaxSessions},
      {"shared memory bytes", node_.held.shared_memory, ask.shared_memory, c.max_shared_memory,
       Refusal::kMaxSharedMemory},
      {"sessions with a network endpoint", node_.held.networks, ask.networks, c.max_networks,
       Refusal::kMaxNetworks},
  }};
  if (auto d = first_over("the node", node.data(), node.size())) return d;
  const Check fds{"descriptors", node_.held.descriptors, ask.descriptors, limits.descriptor_budget,
                  Refusal::kMaxDescriptors};
  if (auto d = first_over("the node's clients", &fds, 1, limits.descriptor_budget_why)) return d;
  processes_[owner.pid].held += ask;
  uids_[owner.uid].held += ask;
  node_.held += ask;
  return std::nullopt;
}

void Ledger::give_back(const Owner& owner, const Holding& what) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = processes_.find(owner.pid); it != processes_.end()) {
    it->second.held -= what;
    if (it->second.empty()) processes_.erase(it);
  }
  if (auto it = uids_.find(owner.uid); it != uids_.end()) {
    it->second.held -= what;
    if (it->second.empty()) uids_.erase(it);
  }
  node_.held -= what;
}

std::optional<Denial> Ledger::bind_gpu(const Owner& owner, uint32_t gpu, const LedgerLimits& limits) {
  std::lock_guard<std::mutex> lock(mu_);
  const config::ClientsConfig& c = limits.clients;
  const auto on = [gpu](const Account* a) -> uint64_t {
    if (a == nullptr) return 0;
    auto it = a->per_gpu.find(gpu);
    return it != a->per_gpu.end() ? it->second : 0;
  };
  auto pit = processes_.find(owner.pid);
  auto uit = uids_.find(owner.uid);
  const std::string where = "sessions on gpu " + std::to_string(gpu);
  const std::array<Check, 3> checks{{
      {"", on(pit != processes_.end() ? &pit->second : nullptr), 1, c.per_process.sessions_per_gpu,
       Refusal::kProcessSessionsPerGpu},
      {"", on(uit != uids_.end() ? &uit->second : nullptr), 1, c.per_uid.sessions_per_gpu,
       Refusal::kUidSessionsPerGpu},
      {"", on(&node_), 1, c.max_per_gpu, Refusal::kMaxPerGpu},
  }};
  const std::array<std::string, 3> who{"pid " + std::to_string(owner.pid), "uid " + std::to_string(owner.uid),
                                       "the node"};
  for (size_t i = 0; i < checks.size(); ++i) {
    Check ch = checks[i];
    ch.what = where.c_str();
    if (auto d = first_over(who[i], &ch, 1)) return d;
  }
  ++processes_[owner.pid].per_gpu[gpu];
  ++uids_[owner.uid].per_gpu[gpu];
  ++node_.per_gpu[gpu];
  return std::nullopt;
}

void Ledger::unbind_gpu(const Owner& owner, uint32_t gpu) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto drop = [gpu](Account& a) {
    auto it = a.per_gpu.find(gpu);
    if (it == a.per_gpu.end()) return;
    if (--it->second == 0) a.per_gpu.erase(it);
  };
  if (auto it = processes_.find(owner.pid); it != processes_.end()) {
    drop(it->second);
    if (it->second.empty()) processes_.erase(it);
  }
  if (auto it = uids_.find(owner.uid); it != uids_.end()) {
    drop(it->second);
    if (it->second.empty()) uids_.erase(it);
  }
  drop(node_);
}

Holding Ledger::node() const {
  std::lock_guard<std::mutex> lock(mu_);
  return node_.held;
}

Holding Ledger::of_uid(uid_t uid) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = uids_.find(uid);
  return it != uids_.end() ? it->second.held : Holding{};
}

Holding Ledger::of_process(pid_t pid) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = processes_.find(pid);
  return it != processes_.end() ? it->second.held : Holding{};
}

uint32_t Ledger::sessions_on_gpu(uint32_t gpu) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = node_.per_gpu.find(gpu);
  return it != node_.per_gpu.end() ? it->second : 0;
}

}  // namespace mkernel::daemon
