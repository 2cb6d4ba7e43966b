// mkernel-hostile-client: what a careless or hostile local client can do to mkerneld, one attack
// per subcommand, and a healthy client that measures what the others see meanwhile. The
// integration tests (hostile_test.cc) and bench/daemon_bench.py drive it as a separate process,
// so the daemon sees another pid (and, started under another uid, another user).
//
// Design notes
//  1. Every attack sets itself up, prints one JSON line {"ready": ...} with what it got (how
//     many sessions, regions, refusals and the first refusal's text), holds what it has for
//     --hold seconds (or until SIGTERM) and exits 0. A refusal is not a failure of the tool:
//     how far the attack got is the measurement.
//  2. `probe` is the healthy client: for --seconds it repeatedly connects, says hello, pings and
//     says goodbye, and checks the admin socket's grpc.health.v1 service every 100 ms. It prints
//     one JSON line with latency percentiles and failures, and exits 0 (failures are reported,
//     not fatal). Every call is bounded by --timeout-ms.
//  3. The descriptor limit is raised to its hard limit first: the attacks hold many sockets.
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "mkernel/proto/health.grpc.pb.h"
#include "mkernel/proto/session.pb.h"
#include "mkernel/protocol/session_client.h"
#include "mkernel/protocol/session_wire.h"
#include "mkernel/protocol/version.h"

namespace mp = mkernel::protocol;
namespace pb = mkernel::session::v1;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

std::atomic<bool> g_stop{false};

struct Args {
  std::string socket;
  std::string admin;  // gRPC target of the admin socket ("unix:/run/mkerneld/admin.sock")
  int gpu = 0;
  int count = 1;
  int per = 1;       // regions, handles or rings per session
  uint32_t log2 = 0; // ring capacity
  uint32_t world = 1;
  uint64_t bytes = 4096;
  double hold = 10;
  double seconds = 3;
  int port = 0;
  int timeout_ms = 2000;
  std::string name = "hostile";
};

std::string json_escape(const std::string& s) {
  std::string out;
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20 || c >= 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out;
}

// What an attack got, printed as the "ready" line.
struct Tally {
  int ok = 0;
  int refused = 0;
  std::string first_refusal;
  void refuse(const mkernel::Status& s) {
    ++refused;
    if (first_refusal.empty()) first_refusal = s.message();
  }
  void print(const char* attack, const std::string& extra = "") const {
    std::printf("{\"ready\": \"%s\", \"ok\": %d, \"refused\": %d, \"first_refusal\": \"%s\"%s}\n", attack, ok,
                refused, json_escape(first_refusal).c_str(), extra.c_str());
    std::fflush(stdout);
  }
};

void raise_fd_limit() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &rl);
  }
}

void hold(const Args& a) {
  const auto end = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(a.hold));
  while (!g_stop.load() && Clock::now() < end) std::this_thread::sleep_for(20ms);
}

mkernel::StatusOr<std::unique_ptr<mp::SessionClient>> session(const Args& a, const std::string& comm, uint32_t rank,
                                                               uint32_t world, const std::string& name = "") {
  mp::SessionClient::Options o;
  o.socket_path = a.socket;
  o.client_name = name.empty() ? a.name : name;
  o.gpu = a.gpu;
  o.communicator = comm;
  o.rank = rank;
  o.world_size = world;
  o.timeout = std::chrono::milliseconds(a.timeout_ms);
  return mp::SessionClient::connect(o);
}

std::string comm_name(const Args& a, int i) { return a.name + "-" + std::to_string(::getpid()) + "-" + std::to_string(i); }

// ---- attacks ----------------------------------------------------------------------------------

// A blocking connect bounded by --timeout-ms (SO_SNDTIMEO), so a full listen backlog waits for
// the daemon to accept instead of counting as connected.
mkernel::StatusOr<mp::UniqueFd> blocking_connect(const Args& a) {
  mp::UniqueFd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return mkernel::errno_status("socket", errno);
  timeval tv{a.timeout_ms / 1000, (a.timeout_ms % 1000) * 1000};
  ::setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, a.socket.c_str(), sizeof(addr.sun_path) - 1);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0)
    return mkernel::errno_status("connect", errno);
  return fd;
}

// Connections that never say hello; each one closed by the daemon is opened again.
int idle_connections(const Args& a) {
  std::vector<mp::UniqueFd> held;
  Tally t;
  for (int i = 0; i < a.count && !g_stop.load(); ++i) {
    auto fd = blocking_connect(a);
    if (!fd.ok()) {
      t.refuse(fd.status());
      if (t.refused > 50) break;
      continue;
    }
    held.push_back(std::move(fd.value()));
    ++t.ok;
  }
  t.print("idle-connections");
  const auto end = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(a.hold));
  while (!g_stop.load() && Clock::now() < end) {
    for (auto& fd : held) {
      pollfd p{fd.get(), POLLIN, 0};
      if (::poll(&p, 1, 0) == 1 && (p.revents & (POLLHUP | POLLERR | POLLIN))) {
        auto again = blocking_connect(a);
        fd = again.ok() ? std::move(again.value()) : mp::UniqueFd();
      }
      if (g_stop.load()) break;
    }
    std::this_thread::sleep_for(50ms);
  }
  return 0;
}

// Sessions that each create --per host regions of --bytes (or rings of 2^--log2 slots with
// --rings), keeping them.
int regions_or_rings(const Args& a, bool rings) {
  std::vector<std::unique_ptr<mp::SessionClient>> held;
  Tally t;
  int objects = 0;
  for (int i = 0; i < a.count && !g_stop.load(); ++i) {
    auto c = session(a, comm_name(a, i), 0, 1);
    if (!c.ok()) {
      t.refuse(c.status());
      continue;
    }
    ++t.ok;
    for (int j = 0; j < a.per && !g_stop.load(); ++j) {
      mkernel::Status s = rings ? c.value()->create_ring(a.log2).status()
                                : c.value()->create_region(a.bytes, true).status();
      if (!s.ok()) {
        t.refuse(s);
        break;
      }
      ++objects;
    }
    held.push_back(std::move(c.value()));
  }
  t.print(rings ? "big-rings" : "regions", ", \"objects\": " + std::to_string(objects));
  hold(a);
  return 0;
}

// Sessions that share --per descriptors each (any descriptor will do: a memfd).
int handles(const Args& a) {
  std::vector<std::unique_ptr<mp::SessionClient>> held;
  Tally t;
  int shared = 0;
  mp::UniqueFd memfd(::memfd_create("handle", MFD_CLOEXEC));
  for (int i = 0; i < a.count && !g_stop.load(); ++i) {
    auto c = session(a, comm_name(a, i), 0, 1);
    if (!c.ok()) {
      t.refuse(c.status());
      continue;
    }
    ++t.ok;
    for (int j = 0; j < a.per; ++j) {
      const mkernel::Status s = c.value()->share_handle("h" + std::to_string(j), memfd.get());
      if (!s.ok()) {
        t.refuse(s);
        break;
      }
      ++shared;
    }
    held.push_back(std::move(c.value()));
  }
  t.print("handles", ", \"objects\": " + std::to_string(shared));
  hold(a);
  return 0;
}

// As many sessions on one GPU as the daemon gives (one communicator each), or Hellos that claim
// a communicator of --world ranks (one each).
int sessions(const Args& a, const char* attack) {
  std::vector<std::unique_ptr<mp::SessionClient>> held;
  Tally t;
  for (int i = 0; i < a.count && !g_stop.load(); ++i) {
    auto c = session(a, comm_name(a, i), 0, a.world);
    if (!c.ok()) {
      t.refuse(c.status());
      continue;
    }
    ++t.ok;
    held.push_back(std::move(c.value()));
  }
  t.print(attack);
  hold(a);
  return 0;
}

// Sessions that stop reading: each sends requests (rings, the largest replies, each with a
// descriptor; and pings) until its socket takes no more and reads nothing. One thread per
// reader; a session the daemon ends is opened again, so --count readers stay stuck all along.
int slow_readers(const Args& a) {
  std::atomic<int> sessions{0}, refused{0}, sent{0}, first_round{0};
  std::mutex mu;
  std::string first_refusal;
  std::vector<std::thread> readers;
  const auto end = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(a.hold));
  for (int i = 0; i < a.count; ++i) {
    readers.emplace_back([&, i] {
      bool first = true;
      for (uint64_t round = 0; !g_stop.load() && Clock::now() < end; ++round) {
        auto c = session(a, comm_name(a, i) + "-" + std::to_string(round), 0, 1);
        if (c.ok()) {
          ++sessions;
          // Requests until the daemon hangs up. A send that finds the daemon's queue full (it has
          // not read yet, a loaded machine) is tried again: giving up there would leave fewer
          // replies than it takes to fill the daemon's reply queue, a session stuck for good
          // that the daemon never needs to end.
          for (uint64_t id = 100; id < 100000 && !g_stop.load() && Clock::now() < end; ++id) {
            pb::Request req;
            req.set_request_id(id);
            if (id % 4 == 0) req.mutable_create_ring()->set_capacity_log2(4);
            else req.mutable_ping();
            const mkernel::Status st = mp::send_message(c.value()->socket_fd(), req, {}, 20ms);
            if (st.code() == mkernel::StatusCode::kDeadlineExceeded) continue;
            if (!st.ok()) break;
            ++sent;
          }
        } else {
          ++refused;
          std::lock_guard<std::mutex> lock(mu);
          if (first_refusal.empty()) first_refusal = c.status().message();
        }
        if (first) {
          first = false;
          ++first_round;
        }
        // Read nothing; wait until the daemon hangs up (POLLHUP), then try again.
        while (c.ok() && !g_stop.load() && Clock::now() < end) {
          pollfd p{c.value()->socket_fd(), 0, 0};
          if (::poll(&p, 1, 50) == 1 && (p.revents & (POLLHUP | POLLERR))) break;
        }
        if (!c.ok()) std::this_thread::sleep_for(50ms);
      }
    });
  }
  while (first_round.load() < a.count && !g_stop.load()) std::this_thread::sleep_for(5ms);
  Tally t;
  t.ok = sessions.load();
  t.refused = refused.load();
  {
    std::lock_guard<std::mutex> lock(mu);
    t.first_refusal = first_refusal;
  }
  t.print("slow-readers", ", \"requests\": " + std::to_string(sent.load()));
  for (auto& r : readers) r.join();
  std::printf("{\"slow-readers\": \"done\", \"sessions\": %d, \"requests\": %d}\n", sessions.load(), sent.load());
  return 0;
}

// Malformed frames, lying lengths, stray descriptors and refused hellos, each on a new
// connection; reports how many the daemon answered or closed.
int malformed(const Args& a) {
  Tally t;
  const auto raw = [&](const std::string& bytes, int fd_to_attach) {
    auto c = mp::connect_unix(a.socket, std::chrono::milliseconds(a.timeout_ms));
    if (!c.ok()) {
      t.refuse(c.status());
      return;
    }
    msghdr mh{};
    iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    if (fd_to_attach >= 0) {
      mh.msg_control = control;
      mh.msg_controllen = sizeof(control);
      cmsghdr* cm = CMSG_FIRSTHDR(&mh);
      cm->cmsg_level = SOL_SOCKET;
      cm->cmsg_type = SCM_RIGHTS;
      cm->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(cm), &fd_to_attach, sizeof(int));
    }
    (void)::sendmsg(c.value().get(), &mh, MSG_NOSIGNAL);
    pb::Reply reply;
    const mkernel::Status s = mp::recv_message_any_fds(c.value().get(), &reply, nullptr, 1000ms);
    if (s.ok()) ++t.ok;  // an answer (an error or SessionEnded)
  };
  mp::UniqueFd memfd(::memfd_create("stray", MFD_CLOEXEC));
  for (int i = 0; i < a.count && !g_stop.load(); ++i) {
    raw(std::string("\x10\0\0\0garbage", 11), -1);                 // lying length
    raw(std::string(3, '\x01'), -1);                                // shorter than a length
    raw(std::string("\x04\0\0\0\xff\xff\xff\xff", 8), -1);          // does not parse
    pb::Request req;
    req.set_request_id(1);
    req.mutable_ping();
    std::string body = req.SerializeAsString();
    const uint32_t n = static_cast<uint32_t>(body.size());
    std::string framed(reinterpret_cast<const char*>(&n), 4);
    framed += body;
    raw(framed, -1);            // first request not a hello
    raw(framed, memfd.get());   // a stray descriptor
    auto bad = session(a, "", 0, 1);  // a hello the daemon refuses (empty communicator)
    if (!bad.ok()) t.refuse(bad.status());
  }
  t.print("malformed");
  return 0;
}

// Sessions that each open a network endpoint: a communicator of one rank connected through the
// daemon's network transport (network_for_local), kept open.
int networks(const Args& a) {
  std::vector<std::unique_ptr<mp::SessionClient>> held;
  Tally t;
  for (int i = 0; i < a.count && !g_stop.load(); ++i) {
    auto c = session(a, comm_name(a, i), 0, 1);
    if (!c.ok()) {
      t.refuse(c.status());
      continue;
    }
    mp::ConnectOptions co;
    co.token = std::string(16, 'k');
    co.timeout = std::chrono::milliseconds(a.timeout_ms);
    co.network_for_local = true;
    mkernel::Status s = c.value()->create_region(a.bytes, true).status();
    if (s.ok()) s = c.value()->create_flags(16).status();
    if (s.ok()) s = c.value()->connect_communicator(co).status();
    if (!s.ok()) {
      t.refuse(s);
    } else {
      ++t.ok;
    }
    held.push_back(std::move(c.value()));
  }
  t.print("networks");
  hold(a);
  return 0;
}

// Client-supplied text with newlines, terminal escapes and NUL bytes.
int log_inject(const Args& a) {
  Tally t;
  const std::string nasty = std::string("evil\n[info] session 1: forged line\x1b[2J\x1b]0;pwned\x07", 50) +
                            std::string(1, '\0') + "tail";
  auto c = session(a, nasty, 0, 1, nasty);
  if (!c.ok()) {
    t.refuse(c.status());
  } else {
    ++t.ok;
    mp::ConnectOptions co;
    co.root = "unix:/nowhere\n[error] forged\x1b[31m";
    co.token = std::string(16, 'x');
    co.timeout = 200ms;
    auto r = c.value()->connect_communicator(co);
    if (!r.ok()) t.refuse(r.status());
  }
  t.print("log-inject");
  return 0;
}

// Idle TCP connections to the metrics endpoint.
int metrics_idle(const Args& a) {
  std::vector<mp::UniqueFd> held;
  Tally t;
  for (int i = 0; i < a.count; ++i) {
    mp::UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(a.port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      t.refuse(mkernel::errno_status("connect", errno));
      continue;
    }
    ++t.ok;
    held.push_back(std::move(fd));
  }
  t.print("metrics-idle");
  hold(a);
  return 0;
}

// ---- the healthy client -----------------------------------------------------------------------

struct Series {
  std::vector<double> ms;
  int failures = 0;
  std::string first_error;
  void fail(const std::string& e) {
    ++failures;
    if (first_error.empty()) first_error = e;
  }
  double pct(double q) const {
    if (ms.empty()) return -1;
    std::vector<double> v = ms;
    std::sort(v.begin(), v.end());
    const size_t i = std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())));
    return v[i];
  }
  std::string json(const char* name) const {
    char buf[512];
    std::snprintf(buf, sizeof(buf),
                  "\"%s\": {\"n\": %zu, \"p50_ms\": %.3f, \"p99_ms\": %.3f, \"max_ms\": %.3f, \"failures\": %d, "
                  "\"first_error\": \"%s\"}",
                  name, ms.size(), pct(0.5), pct(0.99), pct(1.0), failures,
                  json_escape(first_error.substr(0, 200)).c_str());
    return buf;
  }
};

double since_ms(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

int probe(const Args& a) {
  Series hello, ping, health;
  std::atomic<bool> done{false};
  std::thread health_thread;
  if (!a.admin.empty()) {
    health_thread = std::thread([&] {
      auto stub = grpc::health::v1::Health::NewStub(grpc::CreateChannel(a.admin, grpc::InsecureChannelCredentials()));
      while (!done.load()) {
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(a.timeout_ms));
        grpc::health::v1::HealthCheckRequest req;
        grpc::health::v1::HealthCheckResponse resp;
        const auto t0 = Clock::now();
        const grpc::Status s = stub->Check(&ctx, req, &resp);
        if (s.ok() && resp.status() == grpc::health::v1::HealthCheckResponse::SERVING) {
          health.ms.push_back(since_ms(t0));
        } else {
          health.fail(s.ok() ? "NOT_SERVING" : s.error_message());
        }
        std::this_thread::sleep_for(100ms);
      }
    });
  }
  const auto end = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(a.seconds));
  int i = 0;
  while (Clock::now() < end && !g_stop.load()) {
    const auto t0 = Clock::now();
    auto c = session(a, "probe-" + std::to_string(::getpid()) + "-" + std::to_string(i++), 0, 1, "healthy");
    if (!c.ok()) {
      hello.fail(c.status().message());
      std::this_thread::sleep_for(10ms);
      continue;
    }
    hello.ms.push_back(since_ms(t0));
    const auto t1 = Clock::now();
    const mkernel::Status s = c.value()->ping();
    if (s.ok()) ping.ms.push_back(since_ms(t1));
    else ping.fail(s.message());
    c.value()->close();
    std::this_thread::sleep_for(5ms);
  }
  done = true;
  if (health_thread.joinable()) health_thread.join();
  std::printf("{\"probe\": true, %s, %s, %s}\n", hello.json("hello").c_str(), ping.json("ping").c_str(),
              health.json("health").c_str());
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"mkernel-hostile-client: attacks on mkerneld, and a healthy client measuring them"};
  Args a;
  app.add_option("--socket", a.socket, "the daemon's client socket")->required();
  app.add_option("--admin", a.admin, "gRPC target of the admin socket (probe: health checks)");
  app.add_option("--gpu", a.gpu, "GPU (proxy) to bind sessions to");
  app.add_option("--count", a.count, "connections, sessions or rounds");
  app.add_option("--per", a.per, "regions, rings or handles per session");
  app.add_option("--log2", a.log2, "ring capacity (log2; 0 = the daemon's default)");
  app.add_option("--world", a.world, "world size claimed in hellos");
  app.add_option("--bytes", a.bytes, "region size");
  app.add_option("--hold", a.hold, "seconds to hold what the attack got");
  app.add_option("--seconds", a.seconds, "probe: seconds to measure");
  app.add_option("--port", a.port, "metrics-idle: the metrics TCP port");
  app.add_option("--timeout-ms", a.timeout_ms, "bound of every call");
  app.add_option("--name", a.name, "client name and communicator prefix");
  std::string attack;
  app.add_option("attack", attack,
                 "idle-connections, regions, big-rings, handles, slots, world, slow-readers, malformed, "
                 "log-inject, networks, metrics-idle or probe")
      ->required();
  CLI11_PARSE(app, argc, argv);
  raise_fd_limit();
  ::signal(SIGPIPE, SIG_IGN);
  ::signal(SIGTERM, [](int) { g_stop.store(true); });
  if (attack == "idle-connections") return idle_connections(a);
  if (attack == "regions") return regions_or_rings(a, false);
  if (attack == "big-rings") return regions_or_rings(a, true);
  if (attack == "handles") return handles(a);
  if (attack == "slots") return sessions(a, "slots");
  if (attack == "world") return sessions(a, "world");
  if (attack == "slow-readers") return slow_readers(a);
  if (attack == "malformed") return malformed(a);
  if (attack == "log-inject") return log_inject(a);
  if (attack == "networks") return networks(a);
  if (attack == "metrics-idle") return metrics_idle(a);
  if (attack == "probe") return probe(a);
  std::fprintf(stderr, "mkernel-hostile-client: unknown attack \"%s\"\n", attack.c_str());
  return 3;
}
