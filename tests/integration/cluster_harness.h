// cluster_harness.h: mkerneld daemons, one per node of a NetnsCluster, and groups of
// mkernel-cluster-client ranks across them, for the multi-node integration tests. Every wait is
// bounded; a process that outlives its bound is killed and reported as hung.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "daemon_harness.h"
#include "mkernel/protocol/session_client.h"
#include "netns_cluster.h"

namespace mkt {

using Clock = std::chrono::steady_clock;

struct ClusterTimeouts {
  uint32_t command_ms = 5000;
  uint32_t rendezvous_ms = 20000;
};

inline std::string read_text(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline std::string tail_lines(const std::string& text, size_t lines) {
  size_t pos = text.size();
  for (size_t n = 0; pos > 0 && n <= lines; --pos)
    if (text[pos - 1] == '\n') ++n;
  return text.substr(pos);
}

// A free TCP port on 127.0.0.1 (for the loopback fallback, where the nodes share one stack).
inline int free_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  int port = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

// One node's mkerneld, run inside the node's namespace with a config written to its directory.
class ClusterDaemon {
 public:
  ClusterDaemon(NetnsCluster& net, int node, std::string dir, std::string provider, ClusterTimeouts t)
      : net_(net), node_(node), dir_(std::move(dir)), provider_(std::move(provider)), timeouts_(t) {
    port_ = net_.isolated() ? 7100 : free_loopback_port();
  }
  ~ClusterDaemon() { stop(); }

  int node() const { return node_; }
  const std::string& dir() const { return dir_; }
  std::string client_socket() const { return dir_ + "/mkerneld.sock"; }
  std::string admin_address() const { return "unix:" + dir_ + "/admin.sock"; }
  std::string log_path() const { return dir_ + "/mkerneld.log"; }
  std::string config_path() const { return dir_ + "/mkerneld.yaml"; }
  pid_t pid() const { return pid_; }
  // HelloReply.peer_address of this daemon (what rank 0's clients hand the others as the root).
  const std::string& peer_address() const { return peer_address_; }

  std::string config_text() const {
    const std::string addr = "tcp:" + net_.address(node_) + ":" + std::to_string(port_);
    const std::string nic = provider_ == "shm" ? "auto" : net_.iface(node_);
    std::ostringstream y;
    y << "node: {name: node" << node_ << ", runtime_dir: \"" << dir_ << "\"}\n"
      << "gpus: {select: host_slots, host_slots: 1}\n"
      << "transport: {kind: fabric, provider: \"" << provider_ << "\", nic: \"" << nic << "\"}\n"
      << "peer: {listen: [\"" << addr << "\"], advertise: \"" << addr << "\"}\n"
      << "grpc: {listen: [\"unix:admin.sock\"]}\n"
      << "timeouts: {command_ms: " << timeouts_.command_ms << ", rendezvous_ms: " << timeouts_.rendezvous_ms
      << "}\n";
    return y.str();
  }

  // Starts the daemon in its namespace and waits (bounded) until its client and admin sockets
  // answer and a probe session learnt its peer address. "" on success, else why not (with the
  // end of its log).
  std::string start() {
    fs::create_directories(dir_);
    std::ofstream(config_path()) << config_text();
    pid_ = net_.spawn_in(node_, {MKERNELD_PATH, "--foreground", "--config", config_path()}, log_path());
    if (pid_ < 0) return "fork failed";
    const auto deadline = Clock::now() + 20s;
    while (Clock::now() < deadline) {
      if (const int st = wait_pid(pid_, 0ms); st >= 0) {
        net_.forget(pid_);
        pid_ = -1;
        return "mkerneld exited at start (status " + std::to_string(st) + "): " +
               tail_lines(read_text(log_path()), 15);
      }
      if (fs::exists(dir_ + "/admin.sock") && fs::exists(client_socket())) {
        mkernel::protocol::SessionClient::Options o;
        o.socket_path = client_socket();
        o.client_name = "cluster-test-probe";
        o.communicator = "probe";
        o.world_size = 1;
        o.timeout = 2s;
        auto c = mkernel::protocol::SessionClient::connect(o);
        if (c.ok()) {
          peer_address_ = c.value()->peer_address();
          c.value()->close();
          if (peer_address_.empty()) return "the daemon's HelloReply carries no peer_address";
          return "";
        }
      }
      std::this_thread::sleep_for(20ms);
    }
    return "mkerneld did not answer within 20 s: " + tail_lines(read_text(log_path()), 15);
  }

  void signal(int sig) {
    if (pid_ > 0) ::kill(pid_, sig);
  }
  void kill9() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      wait_pid(pid_, 10s);
      net_.forget(pid_);
      pid_ = -1;
    }
  }
  void stop() {
    if (pid_ > 0) {
      ::kill(pid_, SIGCONT);  // a test may have left it stopped
      ::kill(pid_, SIGTERM);
      if (wait_pid(pid_, 10s) < 0) std::fprintf(stderr, "node%d: mkerneld ignored SIGTERM for 10 s\n", node_);
      kill9();
    }
  }

  std::unique_ptr<mkernel::admin::v1::Admin::Stub> admin() const {
    return mkernel::admin::v1::Admin::NewStub(
        grpc::CreateChannel(admin_address(), grpc::InsecureChannelCredentials()));
  }

 private:
  NetnsCluster& net_;
  int node_;
  std::string dir_;
  std::string provider_;
  ClusterTimeouts timeouts_;
  int port_ = 7100;
  pid_t pid_ = -1;
  std::string peer_address_;
};

// ---- clients ---------------------------------------------------------------------------------

// Value of "key": in a flat JSON object line: the raw text of a number/boolean, or the unescaped
// string; "" when missing.
inline std::string json_field(const std::string& json, const std::string& key) {
  const std::string k = "\"" + key + "\":";
  const size_t p = json.find(k);
  if (p == std::string::npos) return "";
  size_t i = p + k.size();
  if (i < json.size() && json[i] == '"') {
    std::string out;
    for (++i; i < json.size() && json[i] != '"'; ++i) {
      if (json[i] == '\\' && i + 1 < json.size()) ++i;
      out += json[i];
    }
    return out;
  }
  size_t e = i;
  while (e < json.size() && json[e] != ',' && json[e] != '}') ++e;
  return json.substr(i, e - i);
}
inline uint64_t json_u64(const std::string& json, const std::string& key) {
  const std::string v = json_field(json, key);
  return v.empty() ? 0 : std::stoull(v);
}

struct ClientSpec {
  std::string communicator;
  uint32_t iterations = 10;
  uint64_t max_bytes = 4 << 20;
  uint64_t seed = 1;
  uint32_t timeout_ms = 30000;
  uint32_t pace_ms = 0;
  std::string hostile;
  uint32_t linger_ms = 0;
  std::vector<int> nodes = {0, 1, 2};  // node of each rank
  bool seed_per_rank = false;  // rank r uses seed + r: every receiver must find wrong bytes
};

struct ClientResult {
  uint32_t rank = 0;
  int node = 0;
  int exit_code = -1;     // -1: did not exit by itself (hung, killed at the bound) or by a signal
  bool hung = false;
  double exit_s = 0;      // seconds from the group's start to its exit
  std::string json;       // its report line
  std::string log;
  std::string error() const { return json_field(json, "error"); }
  std::string describe() const {
    return "rank " + std::to_string(rank) + "@node" + std::to_string(node) + " exit " + std::to_string(exit_code) +
           (hung ? " (hung, killed)" : "") + " at " + std::to_string(exit_s) + " s: " +
           (json.empty() ? tail_lines(log, 8) : json);
  }
};

// One rank per entry of spec.nodes, each started in its node's namespace against that node's
// daemon.
class ClientGroup {
 public:
  ClientGroup(NetnsCluster& net, const std::vector<std::unique_ptr<ClusterDaemon>>& daemons,
              const ClientSpec& spec, const std::string& dir, const std::string& provider)
      : net_(net), start_(Clock::now()) {
    const uint32_t world = static_cast<uint32_t>(spec.nodes.size());
    const std::string root = daemons[spec.nodes[0]]->peer_address();
    for (uint32_t r = 0; r < world; ++r) {
      const int node = spec.nodes[r];
      Member m;
      m.result.rank = r;
      m.result.node = node;
      m.log = dir + "/client-" + spec.communicator + "-r" + std::to_string(r) + ".log";
      std::vector<std::string> argv = {
          MKERNEL_CLUSTER_CLIENT_PATH, "--socket", daemons[node]->client_socket(), "--communicator",
          spec.communicator, "--rank", std::to_string(r), "--world", std::to_string(world),
          "--iterations", std::to_string(spec.iterations), "--max-bytes",
          std::to_string(spec.max_bytes), "--seed", std::to_string(spec.seed + (spec.seed_per_rank ? r : 0)), "--timeout-ms",
          std::to_string(spec.timeout_ms), "--pace-ms", std::to_string(spec.pace_ms), "--provider-note",
          provider, "--json"};
      if (r != 0) argv.insert(argv.end(), {"--root", root});  // rank 0 uses its own daemon
      if (!spec.hostile.empty()) {
        argv.insert(argv.end(), {"--hostile", spec.hostile, "--linger-ms", std::to_string(spec.linger_ms)});
      }
      m.pid = net_.spawn_in(node, argv, m.log);
      members_.push_back(std::move(m));
    }
  }
  ~ClientGroup() { kill_all(); }

  // True once every rank logged that its communicator is connected (bounded).
  bool wait_connected(std::chrono::milliseconds bound) {
    const auto deadline = Clock::now() + bound;
    while (Clock::now() < deadline) {
      bool all = true;
      for (auto& m : members_) all = all && read_text(m.log).find("connected communicator") != std::string::npos;
      if (all) return true;
      reap();
      std::this_thread::sleep_for(10ms);
    }
    return false;
  }

  // Waits until every rank exited or `bound` passed; ranks still running then are killed and
  // reported hung.
  std::vector<ClientResult> wait_all(std::chrono::milliseconds bound) {
    const auto deadline = Clock::now() + bound;
    while (Clock::now() < deadline && reap() > 0) std::this_thread::sleep_for(5ms);
    for (auto& m : members_) {
      if (m.pid > 0) {
        m.result.hung = true;
        ::kill(m.pid, SIGKILL);
        wait_pid(m.pid, 5s);
        net_.forget(m.pid);
        m.pid = -1;
        m.result.exit_s = seconds();
      }
    }
    std::vector<ClientResult> out;
    for (auto& m : members_) {
      m.result.log = read_text(m.log);
      std::istringstream lines(m.result.log);
      for (std::string line; std::getline(lines, line);)
        if (line.rfind("{\"rank\":", 0) == 0) m.result.json = line;
      out.push_back(m.result);
    }
    return out;
  }

  double seconds() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

 private:
  struct Member {
    pid_t pid = -1;
    std::string log;
    ClientResult result;
  };

  // Collects ranks that exited; returns how many still run.
  size_t reap() {
    size_t running = 0;
    for (auto& m : members_) {
      if (m.pid <= 0) continue;
      int st = 0;
      if (::waitpid(m.pid, &st, WNOHANG) == m.pid) {
        m.result.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        m.result.exit_s = seconds();
        net_.forget(m.pid);
        m.pid = -1;
      } else {
        ++running;
      }
    }
    return running;
  }
  void kill_all() {
    for (auto& m : members_) {
      if (m.pid > 0) {
        ::kill(m.pid, SIGKILL);
        wait_pid(m.pid, 5s);
        net_.forget(m.pid);
        m.pid = -1;
      }
    }
  }

  NetnsCluster& net_;
  Clock::time_point start_;
  std::vector<Member> members_;
};

}  // namespace mkt
