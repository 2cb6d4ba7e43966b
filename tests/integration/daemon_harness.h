// daemon_harness.h: a real mkerneld process for integration tests, its admin and health stubs,
// and small process helpers. Every wait is bounded.
#pragma once

#include <fcntl.h>
#include <grp.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "mkernel/proto/admin.grpc.pb.h"
#include "mkernel/proto/health.grpc.pb.h"
#include "mkernel/protocol/session_wire.h"

namespace mkt {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

// How a child runs: as another user (uid/gid, when >= 0) and with a descriptor limit (soft and
// hard, when > 0), so tests can play an attacker of another uid or a daemon under the limit a
// unit gives it.
struct SpawnAs {
  int uid = -1;
  int gid = -1;
  uint64_t nofile = 0;
};

// Runs `argv` with stdout+stderr to `log` and `env` ("NAME=value") added to the environment;
// returns the pid.
inline pid_t spawn(const std::vector<std::string>& argv, const std::string& log,
                   const std::vector<std::string>& env = {}, const SpawnAs& as = {}) {
  std::vector<char*> envp;
  for (char** e = environ; *e != nullptr; ++e) envp.push_back(*e);
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    // A test binary killed from outside takes its daemon with it.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
    if (as.nofile > 0) {
      rlimit rl{as.nofile, as.nofile};
      if (::setrlimit(RLIMIT_NOFILE, &rl) != 0) ::_exit(126);
    }
    if (as.gid >= 0 && ::setgid(static_cast<gid_t>(as.gid)) != 0) ::_exit(126);
    if (as.uid >= 0 && (::setgroups(0, nullptr), ::setuid(static_cast<uid_t>(as.uid)) != 0)) ::_exit(126);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execve(args[0], args.data(), envp.data());
    ::_exit(127);
  }
  return pid;
}

// Waits for `pid` up to `bound`; returns its wait status or -1 on timeout.
inline int wait_pid(pid_t pid, std::chrono::milliseconds bound) {
  const auto deadline = std::chrono::steady_clock::now() + bound;
  for (;;) {
    int st = 0;
    const pid_t r = ::waitpid(pid, &st, WNOHANG);
    if (r == pid) return st;
    if (r < 0) return -2;
    if (std::chrono::steady_clock::now() > deadline) return -1;
    std::this_thread::sleep_for(2ms);
  }
}

// Runs a command to completion (bounded) and returns {exit code, output}.
inline std::pair<int, std::string> run_capture(const std::vector<std::string>& argv,
                                               std::chrono::milliseconds bound = 30s) {
  char tmpl[] = "/tmp/mkernel-run-XXXXXX";
  const int fd = ::mkstemp(tmpl);
  if (fd >= 0) ::close(fd);
  const pid_t pid = spawn(argv, tmpl);
  int st = wait_pid(pid, bound);
  if (st == -1) {
    ::kill(pid, SIGKILL);
    st = wait_pid(pid, 5s);
  }
  std::string out;
  if (FILE* f = std::fopen(tmpl, "r")) {
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
    std::fclose(f);
  }
  ::unlink(tmpl);
  return {st >= 0 && WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

class DaemonProcess {
 public:
  explicit DaemonProcess(std::string dir) : dir_(std::move(dir)) {}
  ~DaemonProcess() { stop(); }

  const std::string& dir() const { return dir_; }
  std::string client_socket() const { return dir_ + "/mkerneld.sock"; }
  std::string admin_address() const { return "unix:" + dir_ + "/admin.sock"; }
  std::string log_path() const { return dir_ + "/mkerneld.log"; }
  pid_t pid() const { return pid_; }

  // Starts mkerneld and waits (bounded) until both sockets answer.
  bool start(std::vector<std::string> extra = {}, std::vector<std::string> env = {}, const SpawnAs& as = {}) {
    fs::create_directories(dir_);
    std::vector<std::string> argv = {MKERNELD_PATH, "--foreground", "--runtime-dir", dir_};
    argv.insert(argv.end(), extra.begin(), extra.end());
    pid_ = spawn(argv, log_path(), env, as);
    const auto deadline = std::chrono::steady_clock::now() + 15s;
    while (std::chrono::steady_clock::now() < deadline) {
      if (wait_pid(pid_, 0ms) >= 0) {
        pid_ = -1;
        return false;
      }
      if (fs::exists(dir_ + "/admin.sock") &&
          mkernel::protocol::connect_unix(client_socket(), 100ms).ok())
        return true;
      std::this_thread::sleep_for(10ms);
    }
    return false;
  }

  void kill9() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      wait_pid(pid_, 10s);
      pid_ = -1;
    }
  }

  void stop() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      if (wait_pid(pid_, 10s) < 0) kill9();
      pid_ = -1;
    }
  }

  std::unique_ptr<mkernel::admin::v1::Admin::Stub> admin() const {
    return mkernel::admin::v1::Admin::NewStub(
        grpc::CreateChannel(admin_address(), grpc::InsecureChannelCredentials()));
  }
  std::unique_ptr<grpc::health::v1::Health::Stub> health() const {
    return grpc::health::v1::Health::NewStub(
        grpc::CreateChannel(admin_address(), grpc::InsecureChannelCredentials()));
  }

 private:
  std::string dir_;
  pid_t pid_ = -1;
};

inline std::unique_ptr<grpc::ClientContext> ctx(std::chrono::milliseconds bound = 5s) {
  auto c = std::make_unique<grpc::ClientContext>();
  c->set_deadline(std::chrono::system_clock::now() + bound);
  return c;
}

// SERVING = 1, NOT_SERVING = 2 (grpc.health.v1); -1 when the call failed.
inline int health_of(grpc::health::v1::Health::Stub& stub, const std::string& service) {
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(service);
  grpc::health::v1::HealthCheckResponse resp;
  auto c = ctx(2s);
  if (!stub.Check(c.get(), req, &resp).ok()) return -1;
  return static_cast<int>(resp.status());
}

// The daemon's counters over its admin service (empty when the call failed, which is a failure).
inline mkernel::admin::v1::Stats stats_of(const DaemonProcess& d) {
  auto stub = d.admin();
  mkernel::admin::v1::Stats rep;
  auto c = ctx();
  const grpc::Status st = stub->GetStats(c.get(), mkernel::admin::v1::GetStatsRequest(), &rep);
  if (!st.ok()) ADD_FAILURE() << "GetStats: " << st.error_message();
  return rep;
}

// A daemon config whose communicators spanning daemons go over libfabric `provider` (shm, or
// tcp;ofi_rxm on lo), with `host_slots` GPU slots and `extra` lines after.
inline std::string fabric_daemon_yaml(const std::string& provider, uint32_t host_slots, uint32_t command_ms,
                                      uint32_t rendezvous_ms, const std::string& extra = "") {
  return "gpus: {select: host_slots, host_slots: " + std::to_string(host_slots) + "}\n" +
         "transport: {kind: fabric, provider: \"" + provider + "\"" + (provider == "shm" ? "" : ", nic: lo") +
         "}\n" + "timeouts: {command_ms: " + std::to_string(command_ms) +
         ", rendezvous_ms: " + std::to_string(rendezvous_ms) + "}\n" + extra;
}

inline size_t count_dir_entries(const std::string& dir) {
  size_t n = 0;
  std::error_code ec;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) ++n;
  return n;
}

inline size_t count_lines(const std::string& path) {
  size_t n = 0;
  if (FILE* f = std::fopen(path.c_str(), "r")) {
    int ch;
    while ((ch = std::fgetc(f)) != EOF) n += ch == '\n';
    std::fclose(f);
  }
  return n;
}

inline size_t count_matching_lines(const std::string& path, const std::string& needle) {
  size_t n = 0;
  if (FILE* f = std::fopen(path.c_str(), "r")) {
    char line[4096];
    while (std::fgets(line, sizeof(line), f))
      if (std::strstr(line, needle.c_str())) ++n;
    std::fclose(f);
  }
  return n;
}

inline std::string temp_dir(const std::string& name) {
  std::string t = "/tmp/mkernel-it-" + name + "-XXXXXX";
  std::vector<char> buf(t.begin(), t.end());
  buf.push_back('\0');
  const char* d = ::mkdtemp(buf.data());
  return d ? d : "/tmp/mkernel-it-" + name;
}

}  // namespace mkt
