// ops_fake_control.h: a DaemonControl with scripted state, for the operations tests. Two
// proxies (gpu0 on NIC "nic0", gpu1 on "nic1"), counters the test sets, drain and stall hooks.
#pragma once

#include <chrono>
#include <map>
#include <mutex>

#include "control.h"

namespace mkernel::daemon::testing {

class FakeControl final : public DaemonControl {
 public:
  using Clock = std::chrono::steady_clock;

  FakeControl() {
    for (uint32_t g = 0; g < 2; ++g) {
      ProxyStats p;
      p.gpu = g;
      p.name = "gpu" + std::to_string(g);
      p.transport = "loopback";
      p.nic = "nic" + std::to_string(g);
      p.by_outcome = {10u + g, 2, 1};
      p.in_flight = 3;
      p.consumed = p.by_outcome[0] + p.by_outcome[1] + p.by_outcome[2] + p.in_flight;
      p.bytes = 4096u * (g + 1);
      p.errors = 2;
      p.ring_occupancy = 5;
      p.ring_capacity = 1024;
      p.sessions = 1;
      p.rings = 2;
      p.latency_ns_log2[10] = 6;  // [512 ns, 1024 ns)
      p.latency_ns_log2[14] = 4;  // [8 us, 16 us)
      proxies_.push_back(p);
    }
  }

  DaemonStatus status() const override {
    std::lock_guard lock(mu_);
    DaemonStatus s;
    s.node_name = "node-a";
    s.version = "0.1.0";
    s.protocol_version = 1;
    s.epoch = 0xabcdef;
    s.pid = 4242;
    s.uptime_seconds = 12.5;
    s.draining = draining_;
    s.config_source = "built-in default";
    s.config_generation = generation_;
    s.runtime_dir = "/tmp/fake";
    s.client_socket = "/tmp/fake/mkerneld.sock";
    s.sessions = 2;
    for (const auto& p : proxies_) s.proxies.push_back(p.name);
    s.refusals = refusals_locked();
    s.usage = usage_;
    return s;
  }

  std::vector<RefusalCount> refusals() const override {
    std::lock_guard lock(mu_);
    return refusals_locked();
  }

  ResourceUsage usage() const override {
    std::lock_guard lock(mu_);
    return usage_;
  }

  // A refusal count the test sets (others are 0).
  void set_refusals(const std::string& reason, uint64_t count) {
    std::lock_guard lock(mu_);
    refusal_counts_[reason] = count;
  }

  std::vector<ProxyStats> stats() const override {
    std::lock_guard lock(mu_);
    auto out = proxies_;
    for (auto& p : out) {
      p.alive = alive_locked(p.gpu);
      p.seconds_since_heartbeat = p.alive ? 0.001 : 5.0;
    }
    return out;
  }

  std::vector<ClientInfo> clients() const override {
    ClientInfo c;
    c.session_id = 7;
    c.pid = 1234;
    c.uid = 1000;
    c.gid = 1000;
    c.name = "trainer";
    c.communicator = "comm-1";
    c.rank = 1;
    c.world_size = 4;
    c.gpu = 1;
    c.rings = 2;
    c.regions = 3;
    c.registered_bytes = 1 << 20;
    c.commands = 99;
    c.connected_seconds = 3.5;
    return {c};
  }

  std::vector<HealthEntry> health() const override {
    std::lock_guard lock(mu_);
    std::vector<HealthEntry> out;
    bool all = !draining_;
    std::string why = draining_ ? "draining" : "";
    for (const auto& p : proxies_) {
      if (!alive_locked(p.gpu)) {
        all = false;
        why += (why.empty() ? "" : "; ") + p.name + " not checking in";
      }
    }
    out.push_back({"", all, all ? "" : why});
    for (const auto& p : proxies_) {
      const bool ok = !draining_ && alive_locked(p.gpu);
      out.push_back({"mkerneld.gpu" + std::to_string(p.gpu), ok,
                     ok ? "" : (draining_ ? "draining" : "proxy not checking in")});
    }
    for (const auto& p : proxies_) {
      out.push_back({"mkerneld.nic." + p.nic, !draining_, draining_ ? "draining" : ""});
    }
    return out;
  }

  Status drain() override {
    std::lock_guard lock(mu_);
    draining_ = true;
    return Status::Ok();
  }
  Status undrain() override {
    std::lock_guard lock(mu_);
    draining_ = false;
    return Status::Ok();
  }

  ReloadResult reload(const std::string& path) override {
    std::lock_guard lock(mu_);
    ReloadResult r;
    if (path.find("bad") != std::string::npos) {
      r.status = Status(StatusCode::kInvalidArgument, "rings.capacity_log2: 40; expected 1..20");
      return r;
    }
    ++generation_;
    r.applied = true;
    r.applied_changes = {"logging.level"};
    r.needs_restart = {"rings.capacity_log2"};
    return r;
  }

  Status stall_proxy(uint32_t gpu, std::chrono::milliseconds duration) override {
    std::lock_guard lock(mu_);
    if (gpu >= proxies_.size()) return {StatusCode::kNotFound, "no proxy " + std::to_string(gpu)};
    stalled_until_[gpu] = Clock::now() + duration;
    return Status::Ok();
  }

  bool all_proxies_alive() const override {
    std::lock_guard lock(mu_);
    for (const auto& p : proxies_) {
      if (!alive_locked(p.gpu)) return false;
    }
    return true;
  }

  void count_out_of_descriptors(const Status& why) override {
    std::lock_guard lock(mu_);
    ++out_of_descriptors_;
    last_shortage_ = why.message();
  }

  // Test controls.
  // Accepts reported to count_out_of_descriptors, and the last one's text.
  uint64_t out_of_descriptors() const {
    std::lock_guard lock(mu_);
    return out_of_descriptors_;
  }
  std::string last_shortage() const {
    std::lock_guard lock(mu_);
    return last_shortage_;
  }
  void set_ok_commands(uint32_t gpu, uint64_t n) {
    std::lock_guard lock(mu_);
    proxies_[gpu].by_outcome[0] = n;
  }
  bool draining() const {
    std::lock_guard lock(mu_);
    return draining_;
  }

 private:
  bool alive_locked(uint32_t gpu) const {
    auto it = stalled_until_.find(gpu);
    return it == stalled_until_.end() || Clock::now() >= it->second;
  }

  // The daemon's reasons, in its order (refusals.h), with the counts the test set.
  std::vector<RefusalCount> refusals_locked() const {
    std::vector<RefusalCount> out;
    for (const char* reason : {"malformed", "hello_refused", "out_of_descriptors", "clients.per_uid.sessions"}) {
      auto it = refusal_counts_.find(reason);
      out.push_back({reason, it != refusal_counts_.end() ? it->second : 0});
    }
    return out;
  }

  mutable std::mutex mu_;
  std::map<std::string, uint64_t> refusal_counts_;
  uint64_t out_of_descriptors_ = 0;
  std::string last_shortage_;
  ResourceUsage usage_{.sessions = 2, .max_sessions = 1024, .client_descriptors = 5, .descriptor_budget = 8192,
                       .open_descriptors = 40, .descriptor_limit = 9216, .shared_memory = 3 << 20,
                       .max_shared_memory = uint64_t{256} << 30, .rings = 2, .regions = 3,
                       .resident_bytes = 30 << 20};
  std::vector<ProxyStats> proxies_;
  bool draining_ = false;
  uint64_t generation_ = 0;
  std::map<uint32_t, Clock::time_point> stalled_until_;
};

}  // namespace mkernel::daemon::testing

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <vector>

namespace mkernel::daemon::testing {

// A private directory under /tmp (short, so socket paths fit sun_path), removed at the end.
struct TempDir {
  TempDir() {
    char tmpl[] = "/tmp/mkops.XXXXXX";
    const char* p = mkdtemp(tmpl);
    path = p ? p : "";
  }
  ~TempDir() {
    std::error_code ec;
    if (!path.empty()) std::filesystem::remove_all(path, ec);
  }
  std::string path;
};

struct RunResult {
  int exit_code = -1;
  std::string out;
};

// Runs a shell command line, capturing stdout; stderr goes to the test's log.
inline RunResult run_command(const std::string& command) {
  RunResult r;
  FILE* f = popen(command.c_str(), "r");
  if (f == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), f)) > 0) r.out.append(buf, n);
  const int status = pclose(f);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// The process's open descriptors.
inline size_t open_descriptors() {
  size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    (void)e;
    ++n;
  }
  return n;
}

// Runs the process out of descriptors, and restores the soft limit and closes the fillers
// whatever happens in the test.
struct Exhaustion {
  rlimit saved{};
  std::vector<int> fillers;
  Exhaustion() { ::getrlimit(RLIMIT_NOFILE, &saved); }
  // Lowers the soft limit just above what is open and fills it up, leaving `spare` free. False
  // when the limit could not be lowered.
  bool fill(size_t spare) {
    rlimit low = saved;
    low.rlim_cur = open_descriptors() + 16;
    if (::setrlimit(RLIMIT_NOFILE, &low) != 0) return false;
    for (;;) {
      const int fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
      if (fd < 0) break;
      fillers.push_back(fd);
    }
    for (size_t i = 0; i < spare && !fillers.empty(); ++i) {
      ::close(fillers.back());
      fillers.pop_back();
    }
    return true;
  }
  void release() {
    for (int fd : fillers) ::close(fd);
    fillers.clear();
    ::setrlimit(RLIMIT_NOFILE, &saved);
  }
  ~Exhaustion() { release(); }
};

}  // namespace mkernel::daemon::testing
