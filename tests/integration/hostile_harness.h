// hostile_harness.h: attackers (mkernel-hostile-client processes, possibly of another uid), a
// healthy client's measurements beside them, and the daemon's memory and descriptors sampled
// from /proc while they run. Every wait is bounded.
#pragma once

#include <signal.h>
#include <sys/stat.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "daemon_harness.h"

namespace mkt {

// The attack tool, copied where a process of another uid can execute it (the build tree may
// sit under a private directory).
inline std::string tool_for_everyone(const std::string& dir) {
  const std::string path = dir + "/mkernel-hostile-client";
  if (!fs::exists(path)) {
    fs::copy_file(MKERNEL_HOSTILE_CLIENT_PATH, path);
    ::chmod(path.c_str(), 0755);
  }
  return path;
}

// A directory other uids may enter (the daemon's runtime directory in these tests).
inline void open_to_everyone(const std::string& dir) { ::chmod(dir.c_str(), 0755); }

inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// One mkernel-hostile-client process: started, waited for until it prints its "ready" line,
// stopped with SIGTERM.
class Attacker {
 public:
  Attacker(const std::string& tool, const std::string& socket, std::vector<std::string> args,
           const std::string& out, const SpawnAs& as = {})
      : out_(out) {
    std::vector<std::string> argv{tool, "--socket", socket, "--hold", "120"};
    argv.insert(argv.end(), args.begin(), args.end());
    pid_ = spawn(argv, out_, {}, as);
  }
  ~Attacker() { stop(); }
  Attacker(const Attacker&) = delete;
  Attacker& operator=(const Attacker&) = delete;

  // The "ready" line (what the attack got), or "" when it did not come within `bound`.
  std::string ready(std::chrono::milliseconds bound = 60s) {
    const auto deadline = std::chrono::steady_clock::now() + bound;
    while (std::chrono::steady_clock::now() < deadline) {
      std::istringstream in(read_text(out_));
      std::string line;
      while (std::getline(in, line))
        if (line.find("\"ready\"") != std::string::npos) return line;
      if (wait_pid(pid_, 0ms) >= 0) {
        pid_ = -1;
        return "";
      }
      std::this_thread::sleep_for(20ms);
    }
    return "";
  }
  void stop() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      if (wait_pid(pid_, 10s) < 0) {
        ::kill(pid_, SIGKILL);
        wait_pid(pid_, 5s);
      }
      pid_ = -1;
    }
  }

 private:
  std::string out_;
  pid_t pid_ = -1;
};

// A number field of a JSON line written by the tool: `"name": 12` (first occurrence after
// `after`, when given).
inline double json_number(const std::string& line, const std::string& name, const std::string& after = "") {
  size_t from = after.empty() ? 0 : line.find("\"" + after + "\"");
  if (from == std::string::npos) return -1;
  const size_t at = line.find("\"" + name + "\": ", from);
  if (at == std::string::npos) return -1;
  return std::strtod(line.c_str() + at + name.size() + 4, nullptr);
}

inline std::string json_string(const std::string& line, const std::string& name) {
  const size_t at = line.find("\"" + name + "\": \"");
  if (at == std::string::npos) return "";
  std::string out;
  for (size_t i = at + name.size() + 5; i < line.size() && line[i] != '"'; ++i) {
    if (line[i] == '\\' && i + 1 < line.size()) ++i;
    out += line[i];
  }
  return out;
}

// The healthy client's figures for `seconds`: hello, ping and admin health latency and failures.
struct Probe {
  std::string line;
  double p99(const char* what) const { return json_number(line, "p99_ms", what); }
  int failures(const char* what) const { return static_cast<int>(json_number(line, "failures", what)); }
  int count(const char* what) const { return static_cast<int>(json_number(line, "n", what)); }
};

inline Probe probe(const std::string& tool, const DaemonProcess& d, double seconds) {
  const auto [code, out] = run_capture({tool, "--socket", d.client_socket(), "--admin", d.admin_address(), "probe",
                                        "--seconds", std::to_string(seconds)},
                                       std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000) + 60000));
  Probe p;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line))
    if (line.find("\"probe\"") != std::string::npos) p.line = line;
  return p;
}

// The daemon's resident memory (VmRSS, RssAnon) and open descriptors, sampled every 20 ms; the
// peaks are kept.
class Sampler {
 public:
  explicit Sampler(pid_t pid) : pid_(pid), thread_([this] { run(); }) {}
  ~Sampler() { stop(); }
  void stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  uint64_t peak_rss_kib() const { return peak_rss_; }
  uint64_t peak_anon_kib() const { return peak_anon_; }
  uint64_t peak_fds() const { return peak_fds_; }

  static uint64_t status_kib(pid_t pid, const char* field) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/status");
    std::string line;
    const std::string key = std::string(field) + ":";
    while (std::getline(in, line))
      if (line.rfind(key, 0) == 0) return std::strtoull(line.c_str() + key.size(), nullptr, 10);
    return 0;
  }
  static uint64_t fds(pid_t pid) { return count_dir_entries("/proc/" + std::to_string(pid) + "/fd"); }

 private:
  void run() {
    while (!stop_) {
      peak_rss_ = std::max<uint64_t>(peak_rss_, status_kib(pid_, "VmRSS"));
      peak_anon_ = std::max<uint64_t>(peak_anon_, status_kib(pid_, "RssAnon"));
      peak_fds_ = std::max<uint64_t>(peak_fds_, fds(pid_));
      std::this_thread::sleep_for(20ms);
    }
  }
  pid_t pid_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> peak_rss_{0}, peak_anon_{0}, peak_fds_{0};
  std::thread thread_;
};

}  // namespace mkt
