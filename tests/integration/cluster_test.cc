// Multi-node integration tests: three mkerneld daemons, each in its own network namespace
// (netns_cluster.h: a bridge and one veth pair per node), with mkernel-cluster-client ranks
// exchanging checked data all-to-all through them, under loss, link flaps, stopped and killed
// daemons, cut links and hostile commands. Every case runs once per libfabric provider:
//
//  - `tcp;ofi_rxm`: data and signals cross the veths, so loss and link cuts hit them;
//  - `shm`: data moves through shared memory between the daemons (the namespaces share the
//    machine), so only the rendezvous (the peer gRPC service, TCP over the veths) crosses the
//    links. Loss and link flaps then leave the data path alone and the cases assert that
//    everything still arrives exact; the permanent failure case stops a daemon for longer than
//    the command timeout instead of cutting a link.
//
// Without namespaces (not root, no `ip`, MKERNEL_TEST_NO_NETNS=1) the daemons share 127.0.0.1
// with distinct ports; the cases that need loss or link control skip with the reason.
//
// Bounds: timeouts.command_ms is 5 s. A failure must reach every affected client within
// command_ms + kMarginS (4 s: the daemon notices an expired command on its next sweep, the
// client looks at its session every 5 ms, and two CPU cores are shared by three daemons and
// three clients). A client still running past its case's hard bound is killed and the case
// fails: no case can hang.
//
// MKERNEL_TEST_KEEP_LOGS=1 keeps every case's directory (daemon configs and logs, one log per
// client rank with its JSON report); a failed case always keeps it and prints where.
#include <gtest/gtest.h>
#include <signal.h>

#include "cluster_harness.h"
#include "mkernel/proto/admin.pb.h"

namespace pb = mkernel::admin::v1;
using namespace std::chrono_literals;
using mkt::ClientGroup;
using mkt::ClientResult;
using mkt::ClientSpec;
using mkt::ClusterDaemon;
using mkt::NetnsCluster;

namespace {

constexpr int kNodes = 3;
constexpr mkt::ClusterTimeouts kTimeouts{5000, 20000};
constexpr double kMarginS = 4.0;
constexpr double kCommandS = kTimeouts.command_ms / 1000.0;
// The clients' own bound on a wait in the failure cases: longer than the command timeout, so a
// rank with a command in flight to the failed node hears it from its daemon first; a rank that
// only waits for a peer (nothing in flight) ends on this bound, still inside command_ms + margin.
constexpr uint32_t kClientBackstopMs = kTimeouts.command_ms + 2000;

// Providers libfabric offers here, from `fi_info -l` ("name:" lines); empty when fi_info is
// missing (then every provider is tried and a missing one shows up as a daemon that does not
// start).
std::string providers_listing() {
  static const std::string listing = [] {
    const std::string fi_info = NetnsCluster::find_tool("fi_info");
    if (fi_info.empty()) return std::string();
    return mkt::run_capture({fi_info, "-l"}, 30s).second;
  }();
  return listing;
}

std::string provider_missing(const std::string& provider) {
  const std::string listing = providers_listing();
  if (listing.empty()) return "";
  std::string missing;
  size_t start = 0;
  while (start <= provider.size()) {
    const size_t end = std::min(provider.find(';', start), provider.size());
    const std::string p = provider.substr(start, end - start);
    if (listing.find("\n" + p + ":") == std::string::npos && listing.rfind(p + ":", 0) != 0)
      missing += (missing.empty() ? "" : ", ") + p;
    start = end + 1;
  }
  return missing.empty() ? "" : "libfabric offers no " + missing + " provider here (fi_info -l)";
}

std::string param_name(const ::testing::TestParamInfo<std::string>& info) {
  return info.param == "shm" ? "shm" : "tcp_rxm";
}

class ClusterTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    provider_ = GetParam();
    if (std::string why = provider_missing(provider_); !why.empty()) GTEST_SKIP() << why;
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = mkt::temp_dir(std::string("cluster-") + param_name({GetParam(), 0}));
    std::fprintf(stderr, "[%s] provider %s, logs in %s\n", info->name(), provider_.c_str(), dir_.c_str());
    net_ = std::make_unique<NetnsCluster>(kNodes);
    for (int i = 0; i < kNodes; ++i)
      daemons_.push_back(std::make_unique<ClusterDaemon>(*net_, i, dir_ + "/node" + std::to_string(i),
                                                         provider_, kTimeouts));
    for (auto& d : daemons_) {
      const std::string err = d->start();
      ASSERT_EQ(err, "") << "node" << d->node() << ": " << err;
    }
    // Every proxy must have the network transport asked for. A daemon without it still starts
    // (it then serves only communicators inside the node) and says why in its log: a missing
    // shm provider skips the case with that reason, anything else fails it.
    for (auto& d : daemons_) {
      pb::Stats st;
      auto c = mkt::ctx(5s);
      ASSERT_TRUE(d->admin()->GetStats(c.get(), pb::GetStatsRequest(), &st).ok()) << "node" << d->node();
      for (const auto& px : st.proxies()) {
        if (px.transport().find("fabric:" + provider_) != std::string::npos) continue;
        std::string why;
        std::istringstream log(mkt::read_text(d->log_path()));
        for (std::string line; std::getline(log, line);)
          if (line.find("no network transport") != std::string::npos) why = line;
        if (provider_ == "shm") GTEST_SKIP() << "node" << d->node() << " has no shm transport: " << why;
        FAIL() << "node" << d->node() << " proxy " << px.name() << " has transport \"" << px.transport()
               << "\", not fabric:" << provider_ << ": " << why;
      }
    }
  }

  void TearDown() override {
    daemons_.clear();
    net_.reset();
    if (dir_.empty()) return;
    const char* keep = std::getenv("MKERNEL_TEST_KEEP_LOGS");
    if (HasFailure()) {
      for (int i = 0; i < kNodes; ++i) {
        const std::string log = dir_ + "/node" + std::to_string(i) + "/mkerneld.log";
        std::fprintf(stderr, "---- node%d mkerneld.log (end) ----\n%s", i,
                     mkt::tail_lines(mkt::read_text(log), 25).c_str());
      }
      std::fprintf(stderr, "logs kept in %s\n", dir_.c_str());
    } else if (keep == nullptr || std::strcmp(keep, "1") != 0) {
      std::filesystem::remove_all(dir_);
    }
  }

  // A communicator id unique to this case, provider and process.
  std::string comm(const std::string& name) const {
    return name + "-" + param_name({GetParam(), 0}) + "-" + std::to_string(::getpid());
  }

  std::unique_ptr<ClientGroup> start(const ClientSpec& spec) {
    return std::make_unique<ClientGroup>(*net_, daemons_, spec, dir_, provider_);
  }

  // Every rank exited 0 with every byte and flag exact and all its messages received.
  void expect_exact(const std::vector<ClientResult>& results, const ClientSpec& spec) {
    const uint64_t world = spec.nodes.size();
    for (const ClientResult& r : results) {
      EXPECT_EQ(r.exit_code, 0) << r.describe();
      EXPECT_FALSE(r.hung) << r.describe();
      EXPECT_EQ(mkt::json_u64(r.json, "wrong_bytes"), 0u) << r.describe();
      EXPECT_EQ(mkt::json_u64(r.json, "wrong_flags"), 0u) << r.describe();
      EXPECT_EQ(mkt::json_u64(r.json, "received"), (world - 1) * spec.iterations) << r.describe();
      EXPECT_EQ(mkt::json_u64(r.json, "sent"), (world - 1) * spec.iterations) << r.describe();
      EXPECT_GT(mkt::json_u64(r.json, "bytes_checked"), 0u) << r.describe();
      EXPECT_EQ(r.error(), "") << r.describe();
    }
  }

  // Every listed rank exited 2 (an error, never wrong data, never a hang) within `within_s` of
  // `since_s` (both on the group's clock).
  void expect_error_within(const std::vector<ClientResult>& results, const std::vector<int>& nodes,
                           double since_s, double within_s) {
    for (const ClientResult& r : results) {
      if (std::find(nodes.begin(), nodes.end(), r.node) == nodes.end()) continue;
      EXPECT_FALSE(r.hung) << r.describe();
      EXPECT_EQ(r.exit_code, 2) << r.describe();
      EXPECT_NE(r.error(), "") << r.describe();
      EXPECT_LE(r.exit_s - since_s, within_s) << r.describe();
      std::fprintf(stderr, "  rank %u@node%d: error %.2f s after the failure: %s\n", r.rank, r.node,
                   r.exit_s - since_s, r.error().c_str());
    }
  }

  // The daemon itself bounds commands in flight to a failed node by timeouts.command, the clients'
  // own bound is only the backstop: at least one listed rank's session was ended by its daemon
  // for a failed command (ring error word kRingErrTransport = 2), unless every listed rank ended
  // on its own bound with nothing in flight to the node it waited for (each was waiting for that
  // node's data or ack, so its daemon had nothing to fail).
  void expect_daemon_reported(const std::vector<ClientResult>& results, const std::vector<int>& nodes) {
    int reported = 0, idle_backstop = 0, listed = 0;
    std::string all;
    for (const ClientResult& r : results) {
      if (std::find(nodes.begin(), nodes.end(), r.node) == nodes.end()) continue;
      ++listed;
      const bool by_daemon = mkt::json_u64(r.json, "ring_error") == 2;
      const uint64_t in_flight = mkt::json_u64(r.json, "in_flight");
      reported += by_daemon;
      idle_backstop += !by_daemon && mkt::json_u64(r.json, "ring_error") == 0 && in_flight == 0;
      all += "\n" + r.describe();
    }
    if (idle_backstop == listed) {
      std::fprintf(stderr, "  no listed rank had a command in flight to the failed node: each ended on its own bound\n");
      return;
    }
    EXPECT_GE(reported, 1) << "no daemon ended a session for a failed command:" << all;
  }

  // consumed == ok + error + rejected on every proxy of node i, waited for (bounded: commands in
  // flight at a session's end settle within the command timeout). With `clean`, also no error
  // and no rejection. Returns the summed counts {consumed, ok, error, rejected}.
  std::array<uint64_t, 4> expect_accounting(int i, bool clean) {
    std::array<uint64_t, 4> sum{};
    pb::Stats s;
    bool balanced = false;
    const auto deadline = mkt::Clock::now() + std::chrono::milliseconds(kTimeouts.command_ms) + 5s;
    while (!balanced && mkt::Clock::now() < deadline) {
      s.Clear();
      auto c = mkt::ctx(2s);
      const grpc::Status st = daemons_[i]->admin()->GetStats(c.get(), pb::GetStatsRequest(), &s);
      balanced = st.ok() && s.proxies_size() > 0;
      for (const auto& px : s.proxies())
        balanced = balanced && px.consumed() == px.commands().ok() + px.commands().error() + px.commands().rejected();
      if (!balanced) std::this_thread::sleep_for(50ms);
    }
    EXPECT_TRUE(balanced) << "node" << i << ": consumed != ok + error + rejected: " << s.ShortDebugString();
    for (const auto& px : s.proxies()) {
      sum[0] += px.consumed();
      sum[1] += px.commands().ok();
      sum[2] += px.commands().error();
      sum[3] += px.commands().rejected();
      if (clean) {
        EXPECT_EQ(px.commands().error(), 0u) << "node" << i << ": " << px.ShortDebugString();
        EXPECT_EQ(px.commands().rejected(), 0u) << "node" << i << ": " << px.ShortDebugString();
      }
    }
    std::fprintf(stderr, "  node%d: consumed %llu = ok %llu + error %llu + rejected %llu\n", i,
                 static_cast<unsigned long long>(sum[0]), static_cast<unsigned long long>(sum[1]),
                 static_cast<unsigned long long>(sum[2]), static_cast<unsigned long long>(sum[3]));
    return sum;
  }

  std::string provider_;
  std::string dir_;
  std::unique_ptr<NetnsCluster> net_;
  std::vector<std::unique_ptr<ClusterDaemon>> daemons_;
};

// 1. All-to-all, random sizes 4 B..4 MiB (odd ones and unaligned offsets included), every byte
//    and flag checked; afterwards every daemon's counts reconcile with no error or rejection.
TEST_P(ClusterTest, AllToAllArrivesExact) {
  ClientSpec spec;
  spec.communicator = comm("a2a");
  spec.iterations = 10;
  spec.max_bytes = 4 << 20;
  spec.seed = 11;
  spec.timeout_ms = 20000;
  auto group = start(spec);
  const auto results = group->wait_all(90s);
  expect_exact(results, spec);
  for (const ClientResult& r : results)
    EXPECT_NE(mkt::json_field(r.json, "transport").find(provider_), std::string::npos)
        << "the communicator should run over " << provider_ << ": " << r.describe();
  for (int i = 0; i < kNodes; ++i) {
    const auto sum = expect_accounting(i, true);
    EXPECT_GT(sum[0], 0u) << "node" << i << " carried the exchange";
  }
}

// 1b. The check is not vacuous: ranks that disagree on the seed (so on sizes, offsets and data)
//     still complete the exchange, and every rank reports wrong bytes and exits 1.
TEST_P(ClusterTest, CheckerCatchesWrongData) {
  ClientSpec spec;
  spec.communicator = comm("checker");
  spec.iterations = 3;
  spec.max_bytes = 64 << 10;
  spec.seed = 19;
  spec.seed_per_rank = true;
  spec.timeout_ms = 20000;
  auto group = start(spec);
  for (const ClientResult& r : group->wait_all(60s)) {
    EXPECT_EQ(r.exit_code, 1) << r.describe();
    EXPECT_GT(mkt::json_u64(r.json, "wrong_bytes"), 0u) << r.describe();
    EXPECT_EQ(mkt::json_u64(r.json, "received"), 2u * spec.iterations) << r.describe();
  }
}

// 2. 7 % of every node's outgoing packets on the cluster link dropped during the exchange: TCP
//    retransmits, everything arrives exact within a generous bound. (shm: only the rendezvous
//    crosses the lossy links.)
TEST_P(ClusterTest, LossStillArrivesExact) {
  if (!net_->isolated()) GTEST_SKIP() << "needs network namespaces: " << net_->fallback_reason();
  for (int i = 0; i < kNodes; ++i) ASSERT_EQ(net_->add_loss(i, 7), "");
  ClientSpec spec;
  spec.communicator = comm("loss");
  spec.iterations = 10;
  spec.max_bytes = 2 << 20;
  spec.seed = 12;
  spec.timeout_ms = 30000;
  auto group = start(spec);
  const auto results = group->wait_all(150s);
  int64_t dropped = 0;
  for (int i = 0; i < kNodes; ++i) {
    const int64_t d = net_->loss_dropped(i);
    std::fprintf(stderr, "  node%d: the loss rule dropped %lld packets\n", i, static_cast<long long>(d));
    dropped += std::max<int64_t>(d, 0);
    EXPECT_EQ(net_->remove_loss(i), "");
  }
  // Over tcp the data itself crossed the lossy links; over shm only the rendezvous did.
  if (provider_ != "shm") {
    EXPECT_GT(dropped, 0) << "the loss rules never hit the data path";
  }
  expect_exact(results, spec);
  for (int i = 0; i < kNodes; ++i) expect_accounting(i, true);
}

// 3. Node 2's cable out for 2 s mid-exchange, then back. Either everything arrives exact, or
//    (if the provider gives up) every rank reports an error, never wrong data, within the bound:
//    the outage plus one command timeout for the failing write plus one client bound for a rank
//    whose peer gave up, plus the margin. (shm: the data path does not use the link.)
TEST_P(ClusterTest, LinkFlapArrivesOrFailsBounded) {
  if (!net_->isolated()) GTEST_SKIP() << "needs network namespaces: " << net_->fallback_reason();
  ClientSpec spec;
  spec.communicator = comm("flap");
  spec.iterations = 60;
  spec.max_bytes = 256 << 10;
  spec.seed = 13;
  spec.pace_ms = 50;  // about 3 s of sending, so the flap falls in the middle
  spec.timeout_ms = kTimeouts.command_ms + 2000;
  auto group = start(spec);
  ASSERT_TRUE(group->wait_connected(30s));
  std::this_thread::sleep_for(500ms);
  const double t_down = group->seconds();
  ASSERT_EQ(net_->set_link(2, false), "");
  std::this_thread::sleep_for(2s);
  ASSERT_EQ(net_->set_link(2, true), "");
  const double outage_s = group->seconds() - t_down;
  const auto results = group->wait_all(60s);
  bool all_exact = true;
  for (const ClientResult& r : results) all_exact = all_exact && r.exit_code == 0;
  if (all_exact) {
    std::fprintf(stderr, "  link flap of %.1f s: everything arrived exact\n", outage_s);
    expect_exact(results, spec);
    for (int i = 0; i < kNodes; ++i) expect_accounting(i, true);
  } else {
    std::fprintf(stderr, "  link flap of %.1f s: the transport gave up\n", outage_s);
    for (const ClientResult& r : results) {
      EXPECT_NE(r.exit_code, 1) << "wrong data: " << r.describe();
      if (r.exit_code != 0)
        expect_error_within({r}, {r.node}, t_down,
                            outage_s + kCommandS + spec.timeout_ms / 1000.0 + kMarginS);
    }
    for (int i = 0; i < kNodes; ++i) expect_accounting(i, false);
  }
}

// 4. Node 1's daemon stopped (SIGSTOP) for 2 s, less than the command timeout, mid-exchange,
//    then continued: everything arrives exact and nothing counts as an error.
TEST_P(ClusterTest, ShortDaemonStopArrivesExact) {
  ClientSpec spec;
  spec.communicator = comm("pause");
  spec.iterations = 40;
  spec.max_bytes = 256 << 10;
  spec.seed = 14;
  spec.pace_ms = 50;
  spec.timeout_ms = 15000;
  auto group = start(spec);
  ASSERT_TRUE(group->wait_connected(30s));
  std::this_thread::sleep_for(500ms);
  daemons_[1]->signal(SIGSTOP);
  std::this_thread::sleep_for(2s);
  daemons_[1]->signal(SIGCONT);
  const auto results = group->wait_all(60s);
  expect_exact(results, spec);
  for (int i = 0; i < kNodes; ++i) expect_accounting(i, true);
}

// 5. A permanent failure of node 2 mid-exchange: its cable cut for good (tcp), or its daemon
//    stopped for longer than the command timeout (shm, whose data path a cut cable does not
//    touch, and the fallback without namespaces). Every rank exits 2 with an error within
//    command_ms + margin; none hangs; every daemon reconciles its counts (node 2 after it is
//    continued).
TEST_P(ClusterTest, PermanentFailureReportedWithinCommandTimeout) {
  const bool cut = provider_ != "shm" && net_->isolated();
  ClientSpec spec;
  spec.communicator = comm("cut");
  spec.iterations = 200;  // 10 s at the pace below: far longer than the case
  spec.max_bytes = 256 << 10;
  spec.seed = 15;
  spec.pace_ms = 50;
  spec.timeout_ms = kClientBackstopMs;
  auto group = start(spec);
  ASSERT_TRUE(group->wait_connected(30s));
  std::this_thread::sleep_for(500ms);
  const double t_fail = group->seconds();
  if (cut) {
    ASSERT_EQ(net_->set_link(2, false), "");
  } else {
    daemons_[2]->signal(SIGSTOP);
  }
  std::fprintf(stderr, "  node2 %s at %.2f s\n", cut ? "cable cut for good" : "daemon stopped", t_fail);
  const auto results = group->wait_all(std::chrono::milliseconds(kTimeouts.command_ms) + 20s);
  if (!cut) daemons_[2]->signal(SIGCONT);
  expect_error_within(results, {0, 1, 2}, t_fail, kCommandS + kMarginS);
  expect_daemon_reported(results, {0, 1, 2});
  for (int i = 0; i < kNodes; ++i) expect_accounting(i, false);
}

// 6. Node 2's daemon killed (SIGKILL) mid-exchange: the ranks on nodes 0 and 1 report errors
//    within command_ms + margin, node 2's rank at once (its daemon's socket closes); nodes 0 and
//    1 reconcile. Then node 2's daemon comes back and a new communicator of all three ranks forms
//    and exchanges exact.
TEST_P(ClusterTest, KilledNodeFailsBoundedAndANewCommunicatorForms) {
  ClientSpec spec;
  spec.communicator = comm("kill");
  spec.iterations = 200;
  spec.max_bytes = 256 << 10;
  spec.seed = 16;
  spec.pace_ms = 50;
  spec.timeout_ms = kClientBackstopMs;
  auto group = start(spec);
  ASSERT_TRUE(group->wait_connected(30s));
  std::this_thread::sleep_for(500ms);
  const double t_kill = group->seconds();
  daemons_[2]->kill9();
  const auto results = group->wait_all(std::chrono::milliseconds(kTimeouts.command_ms) + 20s);
  expect_error_within(results, {0, 1}, t_kill, kCommandS + kMarginS);
  expect_error_within(results, {2}, t_kill, 1.0 + kMarginS);
  expect_daemon_reported(results, {0, 1});
  expect_accounting(0, false);
  expect_accounting(1, false);

  const std::string err = daemons_[2]->start();
  ASSERT_EQ(err, "") << "restarting node2: " << err;
  ClientSpec again;
  again.communicator = comm("after-kill");
  again.iterations = 3;
  again.max_bytes = 1 << 20;
  again.seed = 17;
  again.timeout_ms = 20000;
  auto group2 = start(again);
  expect_exact(group2->wait_all(60s), again);
  for (int i = 0; i < kNodes; ++i) expect_accounting(i, false);
}

// 7. Hostile commands beside a healthy communicator on the same daemons: a write naming a
//    destination region id rank 1 never registered (from node 0 to node 1), and a write running
//    32 bytes past the end of rank 1's destination region (from node 1 to node 2), are each
//    rejected: ring error word kRingErrRejected and the session ended. Meanwhile the healthy
//    communicator's ranks finish exact, and nothing counts as a transport error anywhere.
TEST_P(ClusterTest, InvalidDestinationsRejectedWhileOthersFinishExact) {
  ClientSpec good;
  good.communicator = comm("good");
  good.iterations = 30;
  good.max_bytes = 256 << 10;
  good.seed = 18;
  good.pace_ms = 40;
  good.timeout_ms = 15000;
  auto good_group = start(good);
  ASSERT_TRUE(good_group->wait_connected(30s));

  std::vector<std::unique_ptr<ClientGroup>> bad;
  for (const auto& [mode, nodes] : std::vector<std::pair<std::string, std::vector<int>>>{
           {"bad-region", {0, 1}}, {"bad-range", {1, 2}}}) {
    ClientSpec b;
    b.communicator = comm(mode);
    b.hostile = mode;
    b.nodes = nodes;
    b.timeout_ms = 10000;
    b.linger_ms = 4000;
    bad.push_back(start(b));
  }
  for (auto& g : bad) {
    const auto results = g->wait_all(40s);
    for (const ClientResult& r : results) {
      EXPECT_FALSE(r.hung) << r.describe();
      if (r.rank == 0) {
        EXPECT_EQ(r.exit_code, 0) << "the invalid command must be rejected: " << r.describe();
        EXPECT_EQ(mkt::json_u64(r.json, "ring_error"), 1u) << "kRingErrRejected: " << r.describe();
        EXPECT_EQ(mkt::json_field(r.json, "session_ended"), "true") << r.describe();
        std::fprintf(stderr, "  hostile rank: %s\n", r.error().c_str());
      } else {
        // The bystander of the hostile rank: no wrong data and no hang; whether its session
        // outlives the hostile one is reported, not asserted.
        EXPECT_NE(r.exit_code, 1) << r.describe();
        std::fprintf(stderr, "  bystander rank %u@node%d: %s\n", r.rank, r.node,
                     r.exit_code == 0 ? "its session lived on" : r.error().c_str());
      }
    }
  }
  expect_exact(good_group->wait_all(60s), good);
  const auto n0 = expect_accounting(0, false);
  const auto n1 = expect_accounting(1, false);
  const auto n2 = expect_accounting(2, false);
  EXPECT_GE(n0[3], 1u) << "node0 rejected the write to an unregistered region";
  EXPECT_GE(n1[3], 1u) << "node1 rejected the write past the end of the region";
  EXPECT_EQ(n0[2] + n1[2] + n2[2], 0u) << "no transport error";
}

INSTANTIATE_TEST_SUITE_P(Providers, ClusterTest, ::testing::Values(std::string("tcp;ofi_rxm"), std::string("shm")),
                         param_name);

}  // namespace
