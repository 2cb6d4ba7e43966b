// Two mkerneld processes on this machine joined through their network transports (libfabric
// `tcp;ofi_rxm` on lo, and `shm`): rendezvous through the root daemon's peer service, bytes and
// flags across daemons, destination checks before posting, connect refusals, a rank sending to
// itself through the network, and a peer daemon killed mid-transfer.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <random>
#include <thread>

#include "daemon_harness.h"
#include "mkernel/protocol/session_client.h"

namespace mp = mkernel::protocol;
namespace pb = mkernel::admin::v1;
using namespace std::chrono_literals;
using mkt::DaemonProcess;

namespace {

constexpr uint64_t kRegionBytes = 8u << 20;
const std::string kToken = "0123456789abcdef-network-test";

// signal_value: transport.signal_value ("" leaves it out: auto, the CQ data path on tcp and shm).
std::string config_for(const std::string& provider, uint32_t command_timeout_ms, const std::string& signal_value = "") {
  std::string yaml = mkt::fabric_daemon_yaml(provider, 1, command_timeout_ms, 20000);
  if (!signal_value.empty()) {
    const std::string key = "provider: \"" + provider + "\"";
    yaml.replace(yaml.find(key), key.size(), key + ", signal_value: " + signal_value);
  }
  return yaml;
}

struct Rank {
  std::unique_ptr<mp::SessionClient> client;
  mp::ClientRing* ring = nullptr;
  mp::ClientRegion* src = nullptr;
  mp::ClientRegion* dst = nullptr;
  mp::ClientFlags* flags = nullptr;
  std::unique_ptr<mp::HostRingProducer> producer;
  uint64_t pushed = 0;
};

Rank open_rank(const DaemonProcess& d, const std::string& comm, uint32_t rank, uint32_t world) {
  Rank r;
  mp::SessionClient::Options o;
  o.socket_path = d.client_socket();
  o.client_name = comm + "-r" + std::to_string(rank);
  o.communicator = comm;
  o.rank = rank;
  o.world_size = world;
  auto c = mp::SessionClient::connect(o);
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  if (!c.ok()) return r;
  r.client = std::move(c.value());
  auto ring = r.client->create_ring(10);
  auto src = r.client->create_region(kRegionBytes, false);
  auto dst = r.client->create_region(kRegionBytes, true);
  auto flags = r.client->create_flags(8);
  EXPECT_TRUE(ring.ok() && src.ok() && dst.ok() && flags.ok());
  if (!(ring.ok() && src.ok() && dst.ok() && flags.ok())) return r;
  r.ring = ring.value();
  r.src = src.value();
  r.dst = dst.value();
  r.flags = flags.value();
  r.producer = std::make_unique<mp::HostRingProducer>(r.ring->view, r.client->epoch());
  return r;
}

uint64_t load_acquire(const uint64_t& v) { return __atomic_load_n(&v, __ATOMIC_ACQUIRE); }

// Waits until `pred` holds, the ring's error word is set, or `bound` passes.
template <class Pred>
bool wait_for(Pred pred, const Rank& r, std::chrono::milliseconds bound) {
  const auto deadline = std::chrono::steady_clock::now() + bound;
  while (!pred()) {
    if (__atomic_load_n(&r.ring->view.header->error, __ATOMIC_ACQUIRE) != 0) return false;
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(50us);
  }
  return true;
}

uint8_t pattern(uint32_t from, uint64_t iter, uint64_t i) {
  return static_cast<uint8_t>((i * 131u) ^ (iter * 7u) ^ (from * 29u) ^ (i >> 9));
}

void fill(Rank& r, uint32_t me, uint64_t iter, uint64_t bytes) {
  auto* p = static_cast<uint8_t*>(r.src->data());
  for (uint64_t i = 0; i < bytes; ++i) p[i] = pattern(me, iter, i);
}

uint64_t wrong_bytes(const Rank& r, uint32_t from, uint64_t iter, uint64_t bytes) {
  const auto* p = static_cast<const uint8_t*>(r.dst->data());
  uint64_t wrong = 0;
  for (uint64_t i = 0; i < bytes; ++i) wrong += p[i] != pattern(from, iter, i);
  return wrong;
}

struct Pair {
  DaemonProcess a{mkt::temp_dir("net-a")};
  DaemonProcess b{mkt::temp_dir("net-b")};
  bool start(const std::string& provider, uint32_t command_timeout_ms = 5000, const std::string& signal_value = "") {
    for (DaemonProcess* d : {&a, &b}) {
      std::filesystem::create_directories(d->dir());
      std::ofstream(d->dir() + "/mkerneld.yaml") << config_for(provider, command_timeout_ms, signal_value);
      if (!d->start({"--config", d->dir() + "/mkerneld.yaml"})) return false;
    }
    return true;
  }
};

mkernel::StatusOr<mp::ConnectInfo> connect(Rank& r, const std::string& root, bool network_for_local = false) {
  mp::ConnectOptions c;
  c.root = root;
  c.token = kToken;
  c.timeout = 20s;
  c.network_for_local = network_for_local;
  return r.client->connect_communicator(c);
}

// Connects two ranks (one per daemon) at once; returns false with the reasons on failure.
bool connect_pair(Rank& r0, Rank& r1) {
  mkernel::StatusOr<mp::ConnectInfo> c1 = mkernel::Status(mkernel::StatusCode::kInternal, "not run");
  std::thread t([&] { c1 = connect(r1, r0.client->peer_address()); });
  auto c0 = connect(r0, "");
  t.join();
  EXPECT_TRUE(c0.ok()) << c0.status().to_string();
  EXPECT_TRUE(c1.ok()) << c1.status().to_string();
  if (!c0.ok() || !c1.ok()) return false;
  EXPECT_EQ(c0->ranks.size(), 2u);
  EXPECT_FALSE(c0->ranks[0].network);
  EXPECT_TRUE(c0->ranks[1].network);
  EXPECT_EQ(c0->ranks[1].flags, 8u);
  EXPECT_EQ(c0->ranks[1].regions, 2u);
  return true;
}

pb::ProxyStats proxy_stats_of(const DaemonProcess& d) {
  const pb::Stats rep = mkt::stats_of(d);
  return rep.proxies_size() > 0 ? rep.proxies(0) : pb::ProxyStats{};
}

uint64_t outcome(const pb::ProxyStats& s, const std::string& name) {
  return name == "ok" ? s.commands().ok() : name == "error" ? s.commands().error() : s.commands().rejected();
}

class NetworkTest : public ::testing::TestWithParam<std::string> {};

// Ping-pong of random sizes from 4 B to 4 MiB: rank 0 writes to rank 1 through the network and
// raises its flag; rank 1 checks every byte and the flag value and writes back.
TEST_P(NetworkTest, BytesAndFlagsCrossDaemonsExactly) {
  Pair p;
  ASSERT_TRUE(p.start(GetParam())) << "daemons did not start; logs in " << p.a.dir() << ", " << p.b.dir();
  Rank r0 = open_rank(p.a, "pingpong", 0, 2), r1 = open_rank(p.b, "pingpong", 1, 2);
  ASSERT_TRUE(r0.producer && r1.producer);
  ASSERT_TRUE(connect_pair(r0, r1));
  std::mt19937_64 rng(42);
  Rank* ranks[2] = {&r0, &r1};
  uint64_t total_wrong = 0, total_bytes = 0;
  for (uint64_t iter = 1; iter <= 24; ++iter) {
    const uint64_t bytes = std::max<uint64_t>(4, uint64_t{1} << (rng() % 23)) + rng() % 7;
    for (uint32_t from = 0; from < 2; ++from) {
      Rank& s = *ranks[from];
      Rank& d = *ranks[1 - from];
      fill(s, from, iter, bytes);
      ASSERT_EQ(s.producer->push(mp::make_write_signal(1 - from, 0, 0, 1, 0, bytes, from, iter), 1s),
                mp::kRingOk);
      ++s.pushed;
      ASSERT_TRUE(wait_for([&] { return load_acquire(d.flags->flags()[from]) >= iter; }, d, 10s))
          << "flag " << from << " never reached " << iter << " (" << bytes << " bytes)";
      EXPECT_EQ(load_acquire(d.flags->flags()[from]), iter);
      total_wrong += wrong_bytes(d, from, iter, bytes);
      total_bytes += bytes;
      ASSERT_TRUE(wait_for([&] { return load_acquire(s.ring->view.header->completed) >= s.pushed; }, s, 10s));
    }
  }
  EXPECT_EQ(total_wrong, 0u) << "of " << total_bytes << " bytes";
  // A signal-only command and a fence ride the same path.
  ASSERT_EQ(r0.producer->push(mp::make_signal(1, 5, 77), 1s), mp::kRingOk);
  ASSERT_EQ(r0.producer->push(mp::make_fence(), 1s), mp::kRingOk);
  r0.pushed += 2;
  EXPECT_TRUE(wait_for([&] { return load_acquire(r1.flags->flags()[5]) == 77; }, r1, 10s));
  EXPECT_TRUE(wait_for([&] { return load_acquire(r0.ring->view.header->completed) >= r0.pushed; }, r0, 10s));
  const pb::ProxyStats sa = proxy_stats_of(p.a);
  EXPECT_EQ(sa.consumed(), outcome(sa, "ok") + outcome(sa, "error") + outcome(sa, "rejected"));
  EXPECT_EQ(outcome(sa, "error") + outcome(sa, "rejected"), 0u);
  EXPECT_EQ(sa.consumed(), r0.pushed);
  EXPECT_NE(sa.transport().find("fabric:"), std::string::npos) << sa.transport();
}

// transport.signal_value: message (what auto picks on EFA's 4-byte CQ data; forced here): flag
// values no CQ data encoding carries, agreement words ((seq + 1) << 32 | word) with first values
// past 2^40 and steps of 2^32 and more, cross the daemons whole, after their data.
TEST_P(NetworkTest, WholeSignalValuesCrossDaemonsByMessage) {
  Pair p;
  ASSERT_TRUE(p.start(GetParam(), 5000, "message")) << "daemons did not start; logs in " << p.a.dir() << ", " << p.b.dir();
  Rank r0 = open_rank(p.a, "wholevalue", 0, 2), r1 = open_rank(p.b, "wholevalue", 1, 2);
  ASSERT_TRUE(r0.producer && r1.producer);
  ASSERT_TRUE(connect_pair(r0, r1));
  std::mt19937_64 rng(43);
  Rank* ranks[2] = {&r0, &r1};
  uint64_t total_wrong = 0;
  for (uint64_t iter = 1; iter <= 12; ++iter) {
    const uint64_t bytes = std::max<uint64_t>(4, uint64_t{1} << (rng() % 23)) + rng() % 7;
    const uint64_t value = ((iter + (uint64_t{1} << 32)) << 32) | static_cast<uint32_t>(rng());
    for (uint32_t from = 0; from < 2; ++from) {
      Rank& s = *ranks[from];
      Rank& d = *ranks[1 - from];
      fill(s, from, iter, bytes);
      ASSERT_EQ(s.producer->push(mp::make_write_signal(1 - from, 0, 0, 1, 0, bytes, from, value), 1s), mp::kRingOk);
      ++s.pushed;
      ASSERT_TRUE(wait_for([&] { return load_acquire(d.flags->flags()[from]) >= value; }, d, 10s))
          << "flag " << from << " never reached " << value << " (" << bytes << " bytes); it holds "
          << load_acquire(d.flags->flags()[from]);
      EXPECT_EQ(load_acquire(d.flags->flags()[from]), value);
      total_wrong += wrong_bytes(d, from, iter, bytes);
      ASSERT_TRUE(wait_for([&] { return load_acquire(s.ring->view.header->completed) >= s.pushed; }, s, 10s));
    }
  }
  EXPECT_EQ(total_wrong, 0u);
  const uint64_t big = ((((uint64_t{1} << 32) + 1) << 32) | 0xdeadbeefULL);
  ASSERT_EQ(r0.producer->push(mp::make_signal(1, 5, big), 1s), mp::kRingOk);
  ++r0.pushed;
  EXPECT_TRUE(wait_for([&] { return load_acquire(r1.flags->flags()[5]) == big; }, r1, 10s))
      << "flag 5 holds " << load_acquire(r1.flags->flags()[5]);
  EXPECT_TRUE(wait_for([&] { return load_acquire(r0.ring->view.header->completed) >= r0.pushed; }, r0, 10s));
  const pb::ProxyStats sa = proxy_stats_of(p.a);
  EXPECT_EQ(outcome(sa, "error") + outcome(sa, "rejected"), 0u);
  EXPECT_EQ(sa.consumed(), r0.pushed);
  // The start-up log's transport line says which path the endpoints use.
  for (const DaemonProcess* d : {&p.a, &p.b})
    EXPECT_GE(mkt::count_matching_lines(d->log_path(), "signal values by message after the data (64 bits)"), 1u)
        << d->log_path();
}

// A destination out of the rendezvous table's range is refused before anything is posted; the
// session ends alone and another communicator on the same daemons carries on.
TEST_P(NetworkTest, ForeignOrOutOfRangeDestinationsAreRejectedBeforePosting) {
  Pair p;
  ASSERT_TRUE(p.start(GetParam()));
  struct Bad {
    const char* what;
    mp::Command cmd;
  };
  const Bad bad[] = {
      {"a region rank 1 never registered", mp::make_write(1, 0, 0, 7, 0, 64)},
      {"a region rank 1 did not make remote-writable", mp::make_write(1, 0, 0, 0, 0, 64)},
      {"a range past the end of the region", mp::make_write(1, 0, 0, 1, kRegionBytes - 8, 64)},
      {"a flag rank 1 does not have", mp::make_signal(1, 8, 1)},
  };
  int n = 0;
  for (const Bad& b : bad) {
    const std::string comm = "hostile" + std::to_string(n++);
    Rank r0 = open_rank(p.a, comm, 0, 2), r1 = open_rank(p.b, comm, 1, 2);
    Rank g0 = open_rank(p.a, comm + "-good", 0, 2), g1 = open_rank(p.b, comm + "-good", 1, 2);
    ASSERT_TRUE(r0.producer && r1.producer && g0.producer && g1.producer);
    ASSERT_TRUE(connect_pair(r0, r1));
    ASSERT_TRUE(connect_pair(g0, g1));
    ASSERT_EQ(r0.producer->push(b.cmd, 1s), mp::kRingOk);
    EXPECT_TRUE(wait_for([] { return false; }, r0, 5s) == false);
    EXPECT_EQ(__atomic_load_n(&r0.ring->view.header->error, __ATOMIC_ACQUIRE), 1u) << b.what;  // rejected
    const mkernel::Status alive = r0.client->check_alive(2s);
    EXPECT_NE(alive.message().find("rejected"), std::string::npos) << b.what << ": " << alive.to_string();
    // Nothing reached rank 1 and the other communicator carries on.
    EXPECT_EQ(load_acquire(r1.flags->flags()[7]), 0u);
    fill(g0, 0, 1, 4096);
    ASSERT_EQ(g0.producer->push(mp::make_write_signal(1, 0, 0, 1, 0, 4096, 0, 1), 1s), mp::kRingOk);
    ASSERT_TRUE(wait_for([&] { return load_acquire(g1.flags->flags()[0]) == 1; }, g1, 10s)) << b.what;
    EXPECT_EQ(wrong_bytes(g1, 0, 1, 4096), 0u);
    // The writer learns of delivery after the target saw it; a session that left before that
    // would have its write counted as an error.
    EXPECT_TRUE(wait_for([&] { return load_acquire(g0.ring->view.header->completed) >= 1; }, g0, 10s));
    EXPECT_TRUE(g0.client->ping().ok());
  }
  const pb::ProxyStats sa = proxy_stats_of(p.a);
  EXPECT_EQ(outcome(sa, "rejected"), 4u);
  EXPECT_EQ(outcome(sa, "error"), 0u);
}

TEST_P(NetworkTest, ConnectRefusalsNameTheProblem) {
  Pair p;
  ASSERT_TRUE(p.start(GetParam()));
  {  // a token too short
    Rank r = open_rank(p.a, "short-token", 0, 2);
    mp::ConnectOptions c;
    c.token = "short";
    auto got = r.client->connect_communicator(c);
    ASSERT_FALSE(got.ok());
    EXPECT_NE(got.status().message().find("token: 5 bytes; expected 16..256"), std::string::npos)
        << got.status().to_string();
  }
  {  // a rank that never comes: the bound expires naming it
    Rank r = open_rank(p.a, "lonely", 0, 3);
    mp::ConnectOptions c;
    c.token = kToken;
    c.timeout = 1500ms;
    const auto t0 = std::chrono::steady_clock::now();
    auto got = r.client->connect_communicator(c);
    const auto took = std::chrono::steady_clock::now() - t0;
    ASSERT_FALSE(got.ok());
    EXPECT_NE(got.status().message().find("ranks 1, 2 of 3 did not join"), std::string::npos)
        << got.status().to_string();
    EXPECT_LT(took, 4s);
    // Regions may still be added after a failed connect; after a good one they may not.
    EXPECT_TRUE(r.client->ping().ok());
  }
  {  // a stranger with the wrong token
    Rank r0 = open_rank(p.a, "guarded", 0, 2), r1 = open_rank(p.b, "guarded", 1, 2);
    mkernel::StatusOr<mp::ConnectInfo> c0 = mkernel::Status(mkernel::StatusCode::kInternal, "");
    std::thread t([&] {
      mp::ConnectOptions c;
      c.token = kToken;
      c.timeout = 3s;
      c0 = r0.client->connect_communicator(c);
    });
    std::this_thread::sleep_for(300ms);
    mp::ConnectOptions c;
    c.root = r0.client->peer_address();
    c.token = "not-the-right-token-at-all";
    c.timeout = 3s;
    auto c1 = r1.client->connect_communicator(c);
    t.join();
    ASSERT_FALSE(c1.ok());
    EXPECT_EQ(c1.status().code(), mkernel::StatusCode::kPermissionDenied) << c1.status().to_string();
    EXPECT_EQ(c1.status().message().find(kToken), std::string::npos);
    EXPECT_FALSE(c0.ok());
  }
  {  // no regions after a connect
    Rank r0 = open_rank(p.a, "frozen", 0, 2), r1 = open_rank(p.b, "frozen", 1, 2);
    ASSERT_TRUE(connect_pair(r0, r1));
    auto more = r0.client->create_region(4096, true);
    ASSERT_FALSE(more.ok());
    EXPECT_NE(more.status().message().find("before connect"), std::string::npos) << more.status().to_string();
  }
}

// A rank may reach itself (and ranks on its own daemon) through the network: what a single-GPU
// machine uses to exercise the network path end to end.
TEST_P(NetworkTest, ARankReachesItselfThroughTheNetwork) {
  Pair p;
  ASSERT_TRUE(p.start(GetParam()));
  Rank r = open_rank(p.a, "self", 0, 1);
  ASSERT_TRUE(r.producer);
  auto info = connect(r, "", /*network_for_local=*/true);
  ASSERT_TRUE(info.ok()) << info.status().to_string();
  ASSERT_EQ(info->ranks.size(), 1u);
  EXPECT_TRUE(info->ranks[0].network);
  for (uint64_t iter = 1; iter <= 8; ++iter) {
    const uint64_t bytes = (uint64_t{1} << (iter * 2)) + 3;
    fill(r, 0, iter, bytes);
    ASSERT_EQ(r.producer->push(mp::make_write_signal(0, 0, 0, 1, 0, bytes, 2, iter), 1s), mp::kRingOk);
    ASSERT_TRUE(wait_for([&] { return load_acquire(r.flags->flags()[2]) == iter; }, r, 10s));
    EXPECT_EQ(wrong_bytes(r, 0, iter, bytes), 0u);
  }
}

// The peer daemon dies mid-transfer: the writer's session reports an error within the command
// timeout (plus a margin), and every command taken is accounted for.
TEST_P(NetworkTest, APeerKilledMidTransferEndsTheWriterWithinTheBound) {
  Pair p;
  ASSERT_TRUE(p.start(GetParam(), /*command_timeout_ms=*/2000));
  Rank r0 = open_rank(p.a, "doomed", 0, 2), r1 = open_rank(p.b, "doomed", 1, 2);
  ASSERT_TRUE(connect_pair(r0, r1));
  fill(r0, 0, 1, 1 << 20);
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    for (uint64_t i = 1; !stop.load(); ++i) {
      if (r0.producer->push(mp::make_write_signal(1, 0, 0, 1, 0, 1 << 20, 0, i), 200ms) != mp::kRingOk) break;
      ++r0.pushed;
    }
  });
  if (!wait_for([&] { return load_acquire(r1.flags->flags()[0]) >= 3; }, r1, 10s)) {
    stop = true;
    writer.join();  // never leave the thread running past a failed assertion
    FAIL() << "three 1 MiB writes did not arrive within 10 s (flag at " << load_acquire(r1.flags->flags()[0])
           << ")";
  }
  p.b.kill9();
  const auto t0 = std::chrono::steady_clock::now();
  const bool ended = wait_for([] { return false; }, r0, 10s) == false &&
                     __atomic_load_n(&r0.ring->view.header->error, __ATOMIC_ACQUIRE) != 0;
  const auto took = std::chrono::steady_clock::now() - t0;
  stop = true;
  writer.join();
  ASSERT_TRUE(ended) << "the writer's session never saw the dead peer";
  EXPECT_LT(took, 2000ms + 3s) << "command timeout 2 s plus margin";
  const mkernel::Status why = r0.client->check_alive(2s);
  EXPECT_FALSE(why.ok());
  // Accounting: everything taken is finished once the proxy flushed the ended session.
  pb::ProxyStats sa;
  const auto settle = std::chrono::steady_clock::now() + 3s;
  do {
    std::this_thread::sleep_for(100ms);
    sa = proxy_stats_of(p.a);
  } while (sa.consumed() != outcome(sa, "ok") + outcome(sa, "error") + outcome(sa, "rejected") &&
           std::chrono::steady_clock::now() < settle);
  if (GetParam() == "shm" && sa.in_flight() > 0 &&
      mkt::health_of(*p.a.health(), "mkerneld.gpu0") == 2) {
    // libfabric 1.17's shm can hold the proxy thread inside the provider once the peer died
    // (docs/transports.md, known limit): the daemon ended the session (checked above, within the
    // bound) and health reports the proxy, but its counters cannot move any more.
    GTEST_SKIP() << "shm held the proxy thread inside libfabric after the peer died (known limit); the "
                    "writer's error came within the bound, accounting cannot settle: consumed "
                 << sa.consumed() << ", in flight " << sa.in_flight();
  }
  EXPECT_EQ(sa.consumed(), outcome(sa, "ok") + outcome(sa, "error") + outcome(sa, "rejected"))
      << "in flight " << sa.in_flight();
  EXPECT_GE(outcome(sa, "error"), 1u);
  EXPECT_EQ(sa.in_flight(), 0u);
}

// No machine here has an RDMA device: a daemon told to use verbs starts anyway, says why it has
// no network transport, serves in-daemon communicators, and refuses a rank on another daemon
// with that reason.
TEST(NetworkWithoutRdma, VerbsWithoutADeviceStartsAndSaysSo) {
  DaemonProcess v(mkt::temp_dir("net-verbs"));
  DaemonProcess f(mkt::temp_dir("net-fabric"));
  std::filesystem::create_directories(v.dir());
  std::filesystem::create_directories(f.dir());
  std::ofstream(v.dir() + "/mkerneld.yaml") << "gpus: {select: host_slots, host_slots: 1}\n"
                                               "transport: {kind: verbs}\n";
  std::ofstream(f.dir() + "/mkerneld.yaml") << config_for("tcp;ofi_rxm", 5000);
  ASSERT_TRUE(v.start({"--config", v.dir() + "/mkerneld.yaml"}));
  ASSERT_TRUE(f.start({"--config", f.dir() + "/mkerneld.yaml"}));
  EXPECT_GE(mkt::count_matching_lines(v.log_path(), "no RDMA device"), 1u) << "log " << v.log_path();
  // In-daemon communicators still connect.
  Rank a = open_rank(v, "local", 0, 2), b = open_rank(v, "local", 1, 2);
  ASSERT_TRUE(a.producer && b.producer);
  mkernel::StatusOr<mp::ConnectInfo> cb = mkernel::Status(mkernel::StatusCode::kInternal, "");
  std::thread t([&] { cb = connect(b, a.client->peer_address()); });
  auto ca = connect(a, "");
  t.join();
  ASSERT_TRUE(ca.ok()) << ca.status().to_string();
  ASSERT_TRUE(cb.ok()) << cb.status().to_string();
  EXPECT_FALSE(ca->ranks[1].network);
  // A rank on another daemon cannot be reached: the reason is the missing device.
  Rank x = open_rank(v, "remote", 0, 2), y = open_rank(f, "remote", 1, 2);
  mkernel::StatusOr<mp::ConnectInfo> cy = mkernel::Status(mkernel::StatusCode::kInternal, "");
  std::thread t2([&] { cy = connect(y, x.client->peer_address()); });
  auto cx = connect(x, "");
  t2.join();
  ASSERT_FALSE(cx.ok());
  EXPECT_NE(cx.status().message().find("no RDMA device"), std::string::npos) << cx.status().to_string();
}

INSTANTIATE_TEST_SUITE_P(Providers, NetworkTest, ::testing::Values("tcp;ofi_rxm", "shm"),
                         [](const auto& p) { return p.param == "shm" ? "shm" : "tcp_rxm"; });

}  // namespace
