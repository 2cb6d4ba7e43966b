// mkerneld against hostile and careless local clients, as separate processes (and another uid):
// descriptor floods leave admin, health and healthy clients served; one user cannot take a
// GPU's slots; memory stays within docs/operations.md's bound and goes back; a healthy client
// stays fast beside slow readers, floods and amplifiers; refusals are counted, logged without a
// flood and exported; client text is escaped in both log formats; running out of descriptors is
// survived, and the admin and health service serves again afterwards; reloads under
// --runtime-dir and from a FIFO.
#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/stat.h>
#include <sys/time.h>

#include <fstream>

#include "exposition_check.h"
#include "hostile_harness.h"
#include "mkernel/proto/session.pb.h"
#include "mkernel/protocol/session_client.h"

namespace mp = mkernel::protocol;
namespace pb = mkernel::admin::v1;
using namespace std::chrono_literals;
using mkt::Attacker;
using mkt::DaemonProcess;
using mkt::SpawnAs;

namespace {

// The daemon's resident memory once it has let go of departed clients: polled every 100 ms until
// it is below `limit` KiB, for at most 30 s (teardown of many sessions and endpoints takes longer
// on a loaded machine than on an idle one; a fixed sleep made the check depend on the load).
// Returns the last reading, which the caller compares with the limit.
uint64_t rss_settles_below(pid_t pid, uint64_t limit) {
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  uint64_t rss = mkt::Sampler::status_kib(pid, "VmRSS");
  while (rss >= limit && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(100ms);
    rss = mkt::Sampler::status_kib(pid, "VmRSS");
  }
  return rss;
}

constexpr int kNobody = 65534;  // the attackers' uid (no passwd entry needed)

class HostileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = mkt::temp_dir(::testing::UnitTest::GetInstance()->current_test_info()->name());
    mkt::open_to_everyone(dir_);
    tool_ = mkt::tool_for_everyone(dir_);
    daemon_ = std::make_unique<DaemonProcess>(dir_);
  }
  void TearDown() override {
    attackers_.clear();
    daemon_.reset();
    if (!HasFailure()) std::filesystem::remove_all(dir_);
    else std::fprintf(stderr, "daemon log kept in %s/mkerneld.log\n", dir_.c_str());
  }
  // Starts the daemon with `yaml` (plus a client socket other uids may use) and `as`.
  void start(const std::string& yaml = "", const SpawnAs& as = {}, std::vector<std::string> extra = {}) {
    const std::string cfg = dir_ + "/mkerneld.yaml";
    std::ofstream(cfg) << "client_socket: {mode: \"0666\"}\n" << yaml;
    extra.insert(extra.begin(), {"--config", cfg});
    ASSERT_TRUE(daemon_->start(extra, {}, as));
  }
  Attacker& attack(std::vector<std::string> args, int uid = kNobody) {
    const std::string out = dir_ + "/attacker" + std::to_string(attackers_.size()) + ".out";
    attackers_.push_back(std::make_unique<Attacker>(tool_, daemon_->client_socket(), std::move(args), out,
                                                    SpawnAs{uid, uid, 0}));
    return *attackers_.back();
  }
  pb::Stats stats() {
    pb::Stats s;
    auto c = mkt::ctx();
    EXPECT_TRUE(daemon_->admin()->GetStats(c.get(), pb::GetStatsRequest(), &s).ok());
    return s;
  }
  uint64_t refusals(const std::string& reason) {
    const pb::Stats s = stats();
    for (const auto& r : s.refusals())
      if (r.reason() == reason) return r.count();
    return 0;
  }
  std::string dir_, tool_;
  std::unique_ptr<DaemonProcess> daemon_;
  std::vector<std::unique_ptr<Attacker>> attackers_;
};

// Two ranks of a healthy communicator that can still move data.
void expect_healthy_pair(const DaemonProcess& d, const std::string& comm) {
  std::vector<std::unique_ptr<mp::SessionClient>> ranks;
  for (uint32_t r = 0; r < 2; ++r) {
    mp::SessionClient::Options o;
    o.socket_path = d.client_socket();
    o.client_name = "healthy";
    o.communicator = comm;
    o.rank = r;
    o.world_size = 2;
    auto c = mp::SessionClient::connect(o);
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    ASSERT_TRUE(c.value()->create_ring(0).ok());
    ASSERT_TRUE(c.value()->create_region(1 << 20, true).ok());
    ASSERT_TRUE(c.value()->create_flags(1024 + 4096).ok()) << "libmkernel's default flags";
    ASSERT_TRUE(c.value()->ping().ok());
    ranks.push_back(std::move(c.value()));
  }
}

// The body of GET path on 127.0.0.1:port, "" on failure (5 s bound).
std::string http_get(int port, const std::string& path) {
  mp::UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{5, 0};
  ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) return "";
  const std::string req = "GET " + path + " HTTP/1.0\r\n\r\n";
  if (::send(fd.get(), req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size())) return "";
  std::string out;
  char buf[8192];
  ssize_t n;
  while ((n = ::recv(fd.get(), buf, sizeof(buf), 0)) > 0) out.append(buf, static_cast<size_t>(n));
  const size_t body = out.find("\r\n\r\n");
  return body == std::string::npos ? "" : out.substr(body + 4);
}

// A free TCP port on 127.0.0.1.
int free_port() {
  mp::UniqueFd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) return 0;
  socklen_t len = sizeof(a);
  ::getsockname(s.get(), reinterpret_cast<sockaddr*>(&a), &len);
  return ntohs(a.sin_port);
}

}  // namespace

// Issue 1: a few sessions with thousands of regions and handles, and thousands of idle
// connections, under the descriptor limit systemd gives by default (1024). Admin, health and a
// healthy client stay served, the log stays small, and everything recovers.
TEST_F(HostileTest, DescriptorFloodsLeaveAdminHealthAndHealthyClientsServed) {
  start("", SpawnAs{-1, -1, 1024});
  const uint64_t log_before = std::filesystem::file_size(daemon_->log_path());
  ASSERT_NE(attack({"regions", "--count", "4", "--per", "1000"}).ready(), "");
  const std::string handles = attack({"handles", "--count", "16", "--per", "64"}).ready();
  ASSERT_NE(handles, "");
  for (int i = 0; i < 4; ++i) ASSERT_NE(attack({"idle-connections", "--count", "1000"}).ready(), "");
  // The limit 1024 keeps 256 for the daemon: clients get 768, one user half of that.
  EXPECT_LE(mkt::Sampler::fds(daemon_->pid()), 1024u - 256u + 48u) << "clients stay inside their budget";

  const mkt::Probe p = mkt::probe(tool_, *daemon_, 2);
  ASSERT_NE(p.line, "");
  EXPECT_EQ(p.failures("hello"), 0) << p.line;
  EXPECT_EQ(p.failures("health"), 0) << p.line;
  EXPECT_GT(p.count("health"), 5) << p.line;
  const auto [code, out] = mkt::run_capture({MKERNELDCTL_PATH, "--socket", dir_ + "/admin.sock", "status"});
  EXPECT_EQ(code, 0) << out;
  expect_healthy_pair(*daemon_, "healthy-during-flood");
  // Refused, counted, named: the process's and the user's shares.
  EXPECT_GT(refusals("clients.per_process.sessions") + refusals("clients.per_uid.sessions"), 0u);
  EXPECT_NE(mkt::json_string(handles, "first_refusal").find("descriptors"), std::string::npos) << handles;

  attackers_.clear();  // their processes exit: every socket closes
  std::this_thread::sleep_for(1500ms);
  const mkt::Probe after = mkt::probe(tool_, *daemon_, 1);
  EXPECT_EQ(after.failures("hello"), 0) << after.line;
  EXPECT_EQ(after.failures("health"), 0) << after.line;
  EXPECT_LE(mkt::Sampler::fds(daemon_->pid()), 40u) << "every client descriptor closed";
  const uint64_t logged = std::filesystem::file_size(daemon_->log_path()) - log_before;
  EXPECT_LT(logged, 2u << 20) << "no log storm: " << logged << " bytes";
}

// Issue 2: one user, in as many processes as it likes, cannot take a GPU's slots.
TEST_F(HostileTest, OneUserCannotTakeAGpusSlots) {
  start();
  const std::string first = attack({"slots", "--count", "64"}).ready();
  const std::string second = attack({"slots", "--count", "64"}).ready();
  const std::string third = attack({"slots", "--count", "64"}).ready();
  EXPECT_EQ(mkt::json_number(first, "ok"), 16) << first;
  EXPECT_NE(mkt::json_string(first, "first_refusal").find("at most 16 (clients.per_process.sessions_per_gpu)"),
            std::string::npos)
      << first;
  EXPECT_EQ(mkt::json_number(second, "ok"), 16) << second;
  EXPECT_EQ(mkt::json_number(third, "ok"), 0) << third;
  EXPECT_NE(mkt::json_string(third, "first_refusal").find("uid 65534 already holds 32; at most 32 "
                                                          "(clients.per_uid.sessions_per_gpu)"),
            std::string::npos)
      << third;
  expect_healthy_pair(*daemon_, "healthy-beside-slot-taker");
  EXPECT_GE(refusals("clients.per_uid.sessions_per_gpu"), 1u);
  EXPECT_GE(refusals("clients.per_process.sessions_per_gpu"), 1u);
}

// Issue 4: a healthy client's hello and ping within 50 ms p99 while 8 slow readers, a flood of
// idle connections and a memory amplifier run beside it; every slow reader is ended with the
// reason once its replies pile up.
TEST_F(HostileTest, HealthyClientStaysFastBesideSlowReadersFloodsAndAmplifiers) {
  start();
  ASSERT_NE(attack({"slow-readers", "--count", "8"}).ready(), "");
  ASSERT_NE(attack({"idle-connections", "--count", "1000"}).ready(), "");
  ASSERT_NE(attack({"world", "--count", "60", "--world", "1048576"}).ready(), "");
  const mkt::Probe p = mkt::probe(tool_, *daemon_, 3);
  ASSERT_NE(p.line, "");
  std::printf("[healthy client beside attacks] %s\n", p.line.c_str());
  EXPECT_EQ(p.failures("hello"), 0) << p.line;
  EXPECT_EQ(p.failures("ping"), 0) << p.line;
  EXPECT_EQ(p.failures("health"), 0) << p.line;
  EXPECT_LT(p.p99("hello"), 50.0) << p.line;
  EXPECT_LT(p.p99("ping"), 50.0) << p.line;
  EXPECT_GT(refusals("reply_queue_overflow"), 0u);
  EXPECT_GE(mkt::count_matching_lines(daemon_->log_path(), "(clients.max_queued_replies)"), 1u);
}

// Issue 3: what clients claim costs the daemon nothing until it exists; what exists is bounded
// by the limits and goes back when the sessions end (RSS measured).
TEST_F(HostileTest, MemoryStaysBoundedAndGoesBack) {
  start("clients: {max_shared_memory: 256MiB}\n");
  const pid_t pid = daemon_->pid();
  std::this_thread::sleep_for(300ms);
  const uint64_t idle = mkt::Sampler::status_kib(pid, "VmRSS");
  mkt::Sampler sampler(pid);
  // 60 hellos claiming communicators of 2^20 ranks.
  ASSERT_NE(attack({"world", "--count", "60", "--world", "1048576"}).ready(), "");
  const uint64_t after_world = mkt::Sampler::status_kib(pid, "VmRSS");
  EXPECT_LT(after_world, idle + 8 * 1024) << "60 huge hellos: " << idle << " -> " << after_world << " KiB";
  // Rings: 2^20 slots is over the limit; the largest allowed ones cost nothing until written.
  const std::string huge = attack({"big-rings", "--count", "1", "--per", "1", "--log2", "20"}).ready();
  EXPECT_NE(mkt::json_string(huge, "first_refusal").find("(65536 slots, rings.max_capacity)"), std::string::npos)
      << huge;
  const std::string big = attack({"big-rings", "--count", "8", "--per", "16", "--log2", "16"}).ready();
  EXPECT_NE(big, "");
  // 8 x 16 rings of 4 MiB would be 512 MiB: the node's 256 MiB stops it, naming the limit.
  EXPECT_NE(mkt::json_string(big, "first_refusal").find("(clients.max_shared_memory)"), std::string::npos) << big;
  const uint64_t after_rings = mkt::Sampler::status_kib(pid, "VmRSS");
  EXPECT_LT(after_rings, after_world + 16 * 1024) << "rings made but not written cost their headers only";
  // Memory returns once the attackers leave.
  attackers_.clear();
  std::this_thread::sleep_for(2500ms);
  sampler.stop();
  const uint64_t after = rss_settles_below(pid, idle + 4 * 1024);
  std::printf("[memory] idle %llu KiB, peak %llu KiB (anon %llu), after %llu KiB\n",
              static_cast<unsigned long long>(idle), static_cast<unsigned long long>(sampler.peak_rss_kib()),
              static_cast<unsigned long long>(sampler.peak_anon_kib()), static_cast<unsigned long long>(after));
  EXPECT_LT(sampler.peak_rss_kib(), idle + 64 * 1024);
  EXPECT_LT(after, idle + 4 * 1024) << "freed memory goes back to the system";
}

// docs/operations.md's worst case, held to at the node's session limit: 1024 sessions of four
// users (64 processes) with every ring their shares allow, eight network endpoints, and 60
// hellos claiming 2^20 ranks. The daemon's resident memory stays below the documented bound
// for that load (22 MiB + 192 KiB a session + 72 MiB an endpoint) and goes back afterwards.
TEST_F(HostileTest, AtTheSessionLimitMemoryStaysWithinTheDocumentedBound) {
  // 64 attacker processes starting at once on a 2-core machine: once (in CI, 2026-12-03) some
  // took longer than the default 5 s to send their hello, the daemon refused them
  // (handshake_timeout, in its log) and the node fell 22 sessions short of its limit. This case
  // is about memory at the limit, not about slow hellos (the flood cases are), so hellos get 30 s,
  // as the attackers' own calls do.
  start("gpus: {select: host_slots, host_slots: 16}\ntimeouts: {handshake_ms: 30000}\n");
  const pid_t pid = daemon_->pid();
  std::this_thread::sleep_for(300ms);
  const uint64_t idle = mkt::Sampler::status_kib(pid, "VmRSS");
  mkt::Sampler sampler(pid);
  const std::string nets = attack({"networks", "--count", "8"}, 0).ready();
  const int endpoints = std::max(0, static_cast<int>(mkt::json_number(nets, "ok")));
  int hellos = 0;  // claiming 2^20 ranks each, spread over GPUs (16 per process and GPU)
  for (int g = 1; g <= 4; ++g)
    hellos += static_cast<int>(mkt::json_number(
        attack({"world", "--count", "15", "--world", "1048576", "--gpu", std::to_string(g)}, 0).ready(), "ok"));
  EXPECT_EQ(hellos, 60);
  const size_t first = attackers_.size();
  // 64 processes making 1024 sessions and their rings load a 2-core machine; their calls get
  // 30 s, and a shortfall prints what they were refused.
  int n = 0;
  for (int uid = 60001; uid <= 60004; ++uid)
    for (int k = 0; k < 16; ++k, ++n)
      attack({"big-rings", "--gpu", std::to_string(n % 16), "--count", "16", "--per", "16", "--log2", "16",
              "--timeout-ms", "30000"},
             uid);
  int sessions = 0;
  std::string refusals;
  for (size_t i = first; i < attackers_.size(); ++i) {
    const std::string ready = attackers_[i]->ready();
    sessions += static_cast<int>(mkt::json_number(ready, "ok"));
    const std::string why = mkt::json_string(ready, "first_refusal");
    if (!why.empty() && refusals.find(why) == std::string::npos) refusals += "\n  " + why;
  }
  // The node ends full, or a few short: a connection counts against the node's sessions from
  // accept (ledger.h), and the attackers oversubscribe GPUs 0-4 (the networks and world sessions
  // sit there), so a connection whose hello is about to be refused (clients.max_per_gpu) can hold
  // the last slot for a moment while another hello is refused with clients.max_sessions. Seen
  // here: the daemon logged "the node already holds 1024" and the attackers counted 1023.
  const int total = sessions + 8 + hellos;
  EXPECT_LE(total, 1024) << "more sessions than clients.max_sessions";
  EXPECT_GE(total, 1024 - 8) << "the node's sessions are (nearly) full; the attackers' refusals:" << refusals;
  std::this_thread::sleep_for(500ms);
  sampler.stop();
  const uint64_t bound = 22 * 1024 + 1024 * 192 + static_cast<uint64_t>(endpoints) * 72 * 1024;
  std::printf("[memory at the session limit] idle %llu KiB, peak %llu KiB (anon %llu), %d endpoints, bound %llu KiB\n",
              static_cast<unsigned long long>(idle), static_cast<unsigned long long>(sampler.peak_rss_kib()),
              static_cast<unsigned long long>(sampler.peak_anon_kib()), endpoints,
              static_cast<unsigned long long>(bound));
  EXPECT_LT(sampler.peak_rss_kib(), bound);
  attackers_.clear();
  const uint64_t after = rss_settles_below(pid, idle + 8 * 1024);
  EXPECT_LT(after, idle + 8 * 1024) << "after: " << after << " KiB";
}

// Issue 6: refusals are counted by reason in stats, status and /metrics, and logged with the
// client's pid and uid without flooding the log.
TEST_F(HostileTest, RefusalsAreCountedExportedAndLoggedWithoutAFlood) {
  const int port = free_port();
  ASSERT_GT(port, 0);
  start("metrics: {enabled: true, listen: \"127.0.0.1:" + std::to_string(port) + "\"}\n");
  ASSERT_NE(attack({"metrics-idle", "--count", "2", "--port", std::to_string(port)}).ready(), "");
  ASSERT_NE(attack({"malformed", "--count", "200"}).ready(), "");
  ASSERT_NE(attack({"big-rings", "--count", "1", "--per", "20", "--log2", "4"}).ready(), "");
  EXPECT_GE(refusals("malformed"), 800u);
  EXPECT_GE(refusals("hello_refused"), 200u);
  EXPECT_EQ(refusals("clients.quota.rings"), 1u);
  pb::DaemonStatus st;
  auto c = mkt::ctx();
  ASSERT_TRUE(daemon_->admin()->GetStatus(c.get(), pb::GetStatusRequest(), &st).ok());
  uint64_t in_status = 0;
  for (const auto& r : st.refusals())
    if (r.reason() == "malformed") in_status = r.count();
  EXPECT_GE(in_status, 800u);
  // Scraped beside two idle connections, at once, in a format promtool accepts.
  const auto t0 = std::chrono::steady_clock::now();
  const std::string scrape = http_get(port, "/metrics");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
  ASSERT_NE(scrape, "");
  EXPECT_NE(scrape.find("mkerneld_refusals_total{reason=\"malformed\"} "), std::string::npos);
  EXPECT_NE(scrape.find("mkerneld_refusals_total{reason=\"clients.quota.rings\"} 1\n"), std::string::npos);
  EXPECT_EQ(mkernel::daemon::testing::check_exposition(scrape), "") << scrape;
  const auto [ran, verdict] = mkernel::daemon::testing::promtool_check(scrape);
  if (ran) {
    EXPECT_NE(verdict.find("exit=0"), std::string::npos) << verdict;
  }
  // Logged with the client named, a few lines a second per reason.
  const size_t lines = mkt::count_matching_lines(daemon_->log_path(), "(malformed)");
  EXPECT_GE(lines, 1u);
  EXPECT_LE(lines, 60u) << "rate-limited";
  EXPECT_GE(mkt::count_matching_lines(daemon_->log_path(), "refused client pid "), 1u);
  EXPECT_GE(mkt::count_matching_lines(daemon_->log_path(), " uid 65534 (clients.quota.rings)"), 1u);
}

// Issue 7: client-supplied text cannot forge log lines, in the text and the JSON format.
TEST_F(HostileTest, ClientTextIsEscapedInBothLogFormats) {
  for (const char* format : {"text", "json"}) {
    SCOPED_TRACE(format);
    if (daemon_->pid() > 0) daemon_->stop();
    std::filesystem::remove(daemon_->log_path());
    start(std::string("logging: {format: ") + format + "}\n");
    ASSERT_NE(attack({"log-inject"}).ready(), "");
    std::this_thread::sleep_for(300ms);
    daemon_->stop();
    const std::string log = mkt::read_text(daemon_->log_path());
    EXPECT_EQ(log.find('\x1b'), std::string::npos) << "no terminal escape reaches the log";
    EXPECT_EQ(log.find('\0'), std::string::npos) << "no NUL reaches the log";
    EXPECT_EQ(log.find("\n[info] session 1: forged"), std::string::npos) << "no forged line";
    EXPECT_EQ(log.find("\n[error] forged"), std::string::npos) << "no forged line";
    EXPECT_NE(log.find("forged"), std::string::npos) << "the text is there, escaped";
    if (std::string(format) == "json") {
      const auto [code, out] = mkt::run_capture(
          {"/usr/bin/python3", "-c", "import json,sys\nfor l in open(sys.argv[1]): json.loads(l)\nprint('ok')",
           daemon_->log_path()});
      EXPECT_EQ(code, 0) << out;
    }
    attackers_.clear();
  }
}

// Running out of descriptors (here: idle metrics connections eat a tiny limit's reserve) is
// answered, counted and logged a few times a second; sessions and health come back with the
// descriptors.
TEST_F(HostileTest, RunningOutOfDescriptorsIsSurvivedAndCounted) {
  const int port = free_port();
  ASSERT_GT(port, 0);
  start("metrics: {enabled: true, listen: \"127.0.0.1:" + std::to_string(port) + "\"}\n", SpawnAs{-1, -1, 128});
  const size_t log_before = mkt::count_lines(daemon_->log_path());
  // The metrics server takes up to 64 connections: more than a 128 limit leaves free.
  ASSERT_NE(attack({"metrics-idle", "--count", "64", "--port", std::to_string(port)}, 0).ready(), "");
  std::this_thread::sleep_for(300ms);
  // Connections from several processes of two users, each within its share, until the process
  // has no descriptor left: the next ones are answered from the spare descriptor and counted.
  for (int uid : {0, kNobody})
    for (int i = 0; i < 3; ++i) ASSERT_NE(attack({"idle-connections", "--count", "100"}, uid).ready(), "");
  std::this_thread::sleep_for(500ms);
  EXPECT_GT(refusals("out_of_descriptors"), 0u);
  const size_t logged = mkt::count_lines(daemon_->log_path()) - log_before;
  EXPECT_LT(logged, 400u) << "no log storm";
  EXPECT_LE(mkt::count_matching_lines(daemon_->log_path(), "(out_of_descriptors)"), 30u) << "rate-limited";
  attackers_.clear();  // the idle metrics connections close
  std::this_thread::sleep_for(500ms);
  const mkt::Probe after = mkt::probe(tool_, *daemon_, 1);
  EXPECT_EQ(after.failures("hello"), 0) << after.line;
  EXPECT_EQ(after.failures("health"), 0) << after.line;
}

// Issue 1's last part: the admin and health service runs out of descriptors with the rest of
// the daemon (idle metrics connections take all that a limit of 64 leaves), closes what it
// cannot serve, and serves again once descriptors are free (the metrics server closes the idle
// connections after 5 s). gRPC's own listener never accepted again after a single EMFILE.
TEST_F(HostileTest, AdminAndHealthServeAgainAfterRunningOutOfDescriptors) {
  const int port = free_port();
  ASSERT_GT(port, 0);
  start("metrics: {enabled: true, listen: \"127.0.0.1:" + std::to_string(port) + "\"}\n", SpawnAs{-1, -1, 64});
  const auto health = [&](const char* timeout) {
    return mkt::run_capture({MKERNELDCTL_PATH, "--socket", dir_ + "/admin.sock", "--timeout", timeout, "health"}).first;
  };
  ASSERT_EQ(health("2"), 0);
  const uint64_t before = refusals("out_of_descriptors");
  ASSERT_NE(attack({"metrics-idle", "--count", "64", "--port", std::to_string(port)}, 0).ready(), "");
  std::this_thread::sleep_for(300ms);
  const uint64_t fds = mkt::Sampler::fds(daemon_->pid());
  std::printf("[admin out of descriptors] %llu descriptors open of 64\n", static_cast<unsigned long long>(fds));
  EXPECT_GE(fds, 62u) << "the idle metrics connections take what is left";
  EXPECT_NE(health("1"), 0) << "no descriptor for the admin connection";
  // The idle connections time out; the admin and health service answers again.
  int code = -1;
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - t0 < 15s && (code = health("1")) != 0) std::this_thread::sleep_for(200ms);
  EXPECT_EQ(code, 0) << "admin and health serve again after the shortage";
  std::printf("[admin out of descriptors] serving again %lld ms after the check that failed\n",
              static_cast<long long>(
                  std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count()));
  EXPECT_GT(refusals("out_of_descriptors"), before) << "counted";
  const auto [st, out] = mkt::run_capture({MKERNELDCTL_PATH, "--socket", dir_ + "/admin.sock", "status"});
  EXPECT_EQ(st, 0) << out;
}

// Issue 9: a reload of the same file under --runtime-dir reports nothing; a FIFO is refused at
// once.
TEST_F(HostileTest, ReloadsUnderRuntimeDirAndFromAFifo) {
  start("logging: {level: info}\n");
  pb::ReloadRequest rq;
  pb::ReloadReply rr;
  auto c = mkt::ctx();
  ASSERT_TRUE(daemon_->admin()->Reload(c.get(), rq, &rr).ok());
  EXPECT_TRUE(rr.applied()) << rr.error();
  EXPECT_EQ(rr.needs_restart_size(), 0) << "the command line's --runtime-dir is no change";
  const std::string fifo = dir_ + "/cfg.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  rq.set_path(fifo);
  auto c2 = mkt::ctx(3s);
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(daemon_->admin()->Reload(c2.get(), rq, &rr).ok());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s);
  EXPECT_FALSE(rr.applied());
  EXPECT_NE(rr.error().find("not a regular file (a FIFO)"), std::string::npos) << rr.error();
}
