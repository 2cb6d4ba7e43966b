// A flood of tiny writes between two mkerneld processes, in both directions at once: what the
// fused MoE op does between two nodes (rows of 32 bytes, chunks of a few rows, hundreds of writes
// per launch, every write followed by a flag write). Two daemons ("nodes") with two proxies each
// (host slots 0 and 1, spinning, unpinned) serve two ranks each; every rank sends, each round,
// `chunks` writes of 32..512 bytes (round 1: to its rail peer on the other daemon and its
// neighbour, as the MoE op does; later rounds: to every other rank), half of them as
// write-with-signal and half as a write followed by a signal-only command on its own flag, with
// the round number as the flag value (a launch number). Receivers wait for every flag, check
// every byte and the exact flag value; rounds are separated by a barrier (the next launch).
// Nothing may be lost, no session may end, and both daemons must still be alive and their
// accounting exact. MKERNEL_FLOOD_CHUNKS / MKERNEL_FLOOD_ROUNDS make it bigger by hand.
//
// Guards: over shm (libfabric 1.17 here; 2.1 has the same code) a peer's write with remote CQ data
// came out of the target's completion queue with a stale op_context (0x1 once shm's command queue
// wrapped over an RMA descriptor, i.e. after a few hundred writes, when a second writer joined
// after the first); mkerneld read through it and died with SIGSEGV, its ranks saw "mkerneld
// closed the session socket" and the other daemon's ranks "no completion from the provider
// within 5000 ms" (fabric_endpoint.h, OpSlot).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <atomic>
#include <barrier>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "daemon_harness.h"
#include "mkernel/protocol/session_client.h"
#include "splitmix.h"

namespace mp = mkernel::protocol;
namespace pb = mkernel::admin::v1;
using namespace std::chrono_literals;
using mkt::DaemonProcess;

namespace {

constexpr uint32_t kWorld = 4;       // ranks 0, 1 on daemon A; 2, 3 on daemon B
constexpr uint64_t kMaxBytes = 512;  // largest write
constexpr uint64_t kMinBytes = 32;   // one row
const std::string kToken = "0123456789abcdef-flood-test";

struct Shape {
  uint32_t chunks = 0;  // writes per (sender, receiver) pair and round
  uint32_t rounds = 0;
};

std::string config_for(const std::string& provider) {
  return mkt::fabric_daemon_yaml(provider, 2, 5000, 30000, "proxy: {poll: {mode: spin}, cpu_affinity: none}\n");
}

using mkernel_itest::mix;
uint64_t key_of(uint32_t from, uint32_t to, uint64_t round, uint32_t chunk) {
  return mix(mix(mix(uint64_t{from} << 40 | uint64_t{to} << 32 | chunk) ^ round));
}
uint64_t size_of(uint64_t key) { return kMinBytes + (key >> 7) % (kMaxBytes - kMinBytes + 1); }
uint8_t byte_of(uint64_t key, uint64_t i) { return static_cast<uint8_t>(mix(key + (i >> 3)) >> (8 * (i & 7))); }

struct Rank {
  uint32_t rank = 0;
  std::unique_ptr<mp::SessionClient> client;
  mp::ClientRing* ring = nullptr;
  mp::ClientRegion* src = nullptr;  // slice (to, chunk)
  mp::ClientRegion* dst = nullptr;  // slot (from, chunk)
  mp::ClientFlags* flags = nullptr; // flag (from, chunk)
  std::unique_ptr<mp::HostRingProducer> producer;
  uint64_t pushed = 0;
  std::string error;
};

// Round 1 is the MoE op's shape: each rank sends through the network only to its rail peer (the
// rank of the same slot on the other node) and to its neighbour inside the daemon; from round 2
// on every rank sends to every other rank, so each endpoint's second network sender joins while
// the first one's writes fill its queues.
bool sends(uint32_t from, uint32_t to, uint64_t round) {
  if (from == to) return false;
  return round > 1 || to == (from + 2) % kWorld || to / 2 == from / 2;
}

uint64_t slot_offset(uint32_t peer, uint32_t chunk, uint32_t chunks) {
  return (uint64_t{peer} * chunks + chunk) * kMaxBytes;
}
uint64_t load_acquire(const uint64_t* v) { return __atomic_load_n(v, __ATOMIC_ACQUIRE); }
uint32_t ring_error(const Rank& r) { return __atomic_load_n(&r.ring->view.header->error, __ATOMIC_ACQUIRE); }

bool open_rank(const DaemonProcess& d, uint32_t rank, uint32_t gpu, const Shape& shape, Rank* r) {
  r->rank = rank;
  mp::SessionClient::Options o;
  o.socket_path = d.client_socket();
  o.client_name = "flood-r" + std::to_string(rank);
  o.gpu = static_cast<int32_t>(gpu);
  o.communicator = "flood";
  o.rank = rank;
  o.world_size = kWorld;
  auto c = mp::SessionClient::connect(o);
  if (!c.ok()) return r->error = "hello: " + c.status().to_string(), false;
  r->client = std::move(c.value());
  const uint64_t bytes = slot_offset(kWorld, 0, shape.chunks);
  auto ring = r->client->create_ring(12);
  auto src = r->client->create_region(bytes, false);
  auto dst = r->client->create_region(bytes, true);
  auto flags = r->client->create_flags(kWorld * shape.chunks);
  for (const mkernel::Status& s : {ring.status(), src.status(), dst.status(), flags.status()})
    if (!s.ok()) return r->error = "setup: " + s.to_string(), false;
  r->ring = ring.value();
  r->src = src.value();
  r->dst = dst.value();
  r->flags = flags.value();
  r->producer = std::make_unique<mp::HostRingProducer>(r->ring->view, r->client->epoch());
  return true;
}

// The daemon process's fate without reaping it: "" while it runs.
std::string process_fate(pid_t pid) {
  siginfo_t info{};
  if (::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid == 0) return "";
  if (info.si_code == CLD_EXITED) return "exited with status " + std::to_string(info.si_status);
  return "killed by signal " + std::to_string(info.si_status) + (info.si_code == CLD_DUMPED ? " (core dumped)" : "");
}

std::string tail_of(const std::string& path, size_t lines) {
  std::ifstream in(path);
  std::vector<std::string> all;
  for (std::string l; std::getline(in, l);) all.push_back(l);
  std::ostringstream out;
  for (size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i) out << "  " << all[i] << "\n";
  return out.str();
}


// One rank's work for the whole run (a host thread playing its GPU). Returns "" or why not.
std::string run_rank(Rank& r, const Shape& shape, std::barrier<>& launch, std::atomic<bool>& failed,
                     uint64_t* writes) {
  const auto bound = 20s;  // no progress for this long is a failure (the command timeout is 5 s)
  auto give_up = [&](std::string why) {
    failed.store(true);
    return why;
  };
  auto* src = static_cast<uint8_t*>(r.src->data());
  const auto* dst = static_cast<const uint8_t*>(r.dst->data());
  for (uint64_t round = 1; round <= shape.rounds; ++round) {
    // Fill every slice, then push the round's commands: chunk-interleaved over the destinations
    // so both directions of every pair are busy at once.
    for (uint32_t to = 0; to < kWorld; ++to) {
      if (!sends(r.rank, to, round)) continue;
      for (uint32_t ch = 0; ch < shape.chunks; ++ch) {
        const uint64_t key = key_of(r.rank, to, round, ch), n = size_of(key);
        uint8_t* p = src + slot_offset(to, ch, shape.chunks);
        for (uint64_t i = 0; i < n; ++i) p[i] = byte_of(key, i);
      }
    }
    for (uint32_t ch = 0; ch < shape.chunks; ++ch) {
      for (uint32_t k = 1; k < kWorld; ++k) {
        const uint32_t to = (r.rank + k) % kWorld;
        if (!sends(r.rank, to, round)) continue;
        const uint64_t key = key_of(r.rank, to, round, ch), n = size_of(key);
        const uint64_t off_src = slot_offset(to, ch, shape.chunks), off_dst = slot_offset(r.rank, ch, shape.chunks);
        const uint32_t flag = r.rank * shape.chunks + ch;
        mp::Command cmds[2];
        size_t ncmd = 0;
        if (ch % 2 == 0) {
          cmds[ncmd++] = mp::make_write_signal(to, 0, off_src, 1, off_dst, n, flag, round);
        } else {
          cmds[ncmd++] = mp::make_write(to, 0, off_src, 1, off_dst, n);
          cmds[ncmd++] = mp::make_signal(to, flag, round);
        }
        for (size_t i = 0; i < ncmd; ++i) {
          const mp::RingStatus s = r.producer->push(cmds[i], bound);
          if (s != mp::kRingOk) {
            const mkernel::Status alive = r.client->check_alive(1s);
            return give_up("round " + std::to_string(round) + ": push to rank " + std::to_string(to) + " failed (" +
                           mp::ring_status_name(s) + "), ring error " + std::to_string(ring_error(r)) + ", session: " +
                           alive.to_string());
          }
          ++r.pushed;
          ++*writes;
        }
      }
    }
    // Receive: every flag of every sender at exactly this round, then every byte.
    const auto deadline = std::chrono::steady_clock::now() + bound;
    for (uint32_t from = 0; from < kWorld; ++from) {
      if (!sends(from, r.rank, round)) continue;
      for (uint32_t ch = 0; ch < shape.chunks; ++ch) {
        const uint64_t* f = r.flags->flags() + from * shape.chunks + ch;
        while (load_acquire(f) < round) {
          if (ring_error(r) != 0 || failed.load() || std::chrono::steady_clock::now() > deadline) {
            const mkernel::Status alive = r.client->check_alive(1s);
            return give_up("round " + std::to_string(round) + ": flag " + std::to_string(ch) + " from rank " +
                           std::to_string(from) + " at " + std::to_string(load_acquire(f)) + ", ring error " +
                           std::to_string(ring_error(r)) + ", session: " + alive.to_string());
          }
          std::this_thread::sleep_for(20us);
        }
        if (load_acquire(f) != round)
          return give_up("round " + std::to_string(round) + ": flag " + std::to_string(ch) + " from rank " +
                         std::to_string(from) + " is " + std::to_string(load_acquire(f)));
        const uint64_t key = key_of(from, r.rank, round, ch), n = size_of(key);
        const uint8_t* p = dst + slot_offset(from, ch, shape.chunks);
        for (uint64_t i = 0; i < n; ++i)
          if (p[i] != byte_of(key, i))
            return give_up("round " + std::to_string(round) + ": byte " + std::to_string(i) + " of chunk " +
                           std::to_string(ch) + " from rank " + std::to_string(from) + " is wrong");
      }
    }
    // The ring finished everything (the source slices are free again), then the next launch.
    while (load_acquire(&r.ring->view.header->completed) < r.pushed) {
      if (ring_error(r) != 0 || failed.load() || std::chrono::steady_clock::now() > deadline)
        return give_up("round " + std::to_string(round) + ": ring completed " +
                       std::to_string(load_acquire(&r.ring->view.header->completed)) + " of " +
                       std::to_string(r.pushed) + ", ring error " + std::to_string(ring_error(r)) +
                       ", session: " + r.client->check_alive(1s).to_string());
      std::this_thread::sleep_for(20us);
    }
    launch.arrive_and_wait();
    if (failed.load()) return "stopped: another rank failed";
  }
  return "";
}

class FloodTest : public ::testing::TestWithParam<std::string> {};

TEST_P(FloodTest, TinyWritesBothWaysBetweenTwoDaemonsOfTwoSessionsArriveExact) {
  Shape shape;
  shape.chunks = 256;
  shape.rounds = 8;
  if (const char* c = std::getenv("MKERNEL_FLOOD_CHUNKS")) shape.chunks = static_cast<uint32_t>(std::stoul(c));
  if (const char* c = std::getenv("MKERNEL_FLOOD_ROUNDS")) shape.rounds = static_cast<uint32_t>(std::stoul(c));
  DaemonProcess daemons[2] = {DaemonProcess(mkt::temp_dir("flood-a")), DaemonProcess(mkt::temp_dir("flood-b"))};
  for (DaemonProcess& d : daemons) {
    std::filesystem::create_directories(d.dir());
    std::ofstream(d.dir() + "/mkerneld.yaml") << config_for(GetParam());
    ASSERT_TRUE(d.start({"--config", d.dir() + "/mkerneld.yaml"})) << "log " << d.log_path();
  }
  Rank ranks[kWorld];
  for (uint32_t r = 0; r < kWorld; ++r)
    ASSERT_TRUE(open_rank(daemons[r / 2], r, r % 2, shape, &ranks[r])) << "rank " << r << ": " << ranks[r].error;
  {  // every rank joins at once, rank 0's daemon is the root
    const std::string root = ranks[0].client->peer_address();
    std::vector<mkernel::Status> joined(kWorld);
    std::vector<std::thread> ts;
    for (uint32_t r = 0; r < kWorld; ++r)
      ts.emplace_back([&, r] {
        mp::ConnectOptions c;
        c.root = r == 0 ? "" : root;
        c.token = kToken;
        c.timeout = 30s;
        auto info = ranks[r].client->connect_communicator(c);
        joined[r] = info.status();
      });
    for (auto& t : ts) t.join();
    for (uint32_t r = 0; r < kWorld; ++r) ASSERT_TRUE(joined[r].ok()) << "rank " << r << ": " << joined[r].to_string();
  }

  std::barrier<> launch(kWorld);
  std::atomic<bool> failed{false};
  std::vector<std::string> why(kWorld);
  std::vector<uint64_t> writes(kWorld, 0);
  const auto t0 = std::chrono::steady_clock::now();
  {
    std::vector<std::thread> ts;
    for (uint32_t r = 0; r < kWorld; ++r)
      ts.emplace_back([&, r] {
        why[r] = run_rank(ranks[r], shape, launch, failed, &writes[r]);
        if (!why[r].empty()) launch.arrive_and_drop();  // never leave the others at the barrier
      });
    for (auto& t : ts) t.join();
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  uint64_t total = 0;
  for (uint64_t w : writes) total += w;
  std::cout << "[ flood    ] " << GetParam() << ": " << shape.rounds << " rounds x " << shape.chunks
            << " chunks, " << total << " commands in " << secs << " s\n";

  std::string fates;
  for (int i = 0; i < 2; ++i)
    if (const std::string f = process_fate(daemons[i].pid()); !f.empty())
      fates += std::string(i == 0 ? "daemon A" : "daemon B") + " " + f + "\n";
  bool all_ok = fates.empty();
  for (uint32_t r = 0; r < kWorld; ++r) all_ok = all_ok && why[r].empty();
  if (!all_ok) {
    std::string report = fates;
    for (uint32_t r = 0; r < kWorld; ++r)
      if (!why[r].empty()) report += "rank " + std::to_string(r) + ": " + why[r] + "\n";
    for (int i = 0; i < 2; ++i) report += "log of daemon " + std::string(i ? "B" : "A") + " (" + daemons[i].log_path() +
                                          "):\n" + tail_of(daemons[i].log_path(), 30);
    FAIL() << report;
  }
  // Accounting: every command taken finished ok, nothing in flight, on both daemons.
  for (DaemonProcess& d : daemons) {
    const pb::Stats st = mkt::stats_of(d);
    for (const pb::ProxyStats& p : st.proxies()) {
      EXPECT_EQ(p.consumed(), p.commands().ok()) << d.log_path();
      EXPECT_EQ(p.commands().error() + p.commands().rejected(), 0u) << d.log_path();
      EXPECT_EQ(p.in_flight(), 0u) << d.log_path();
    }
  }
  for (Rank& r : ranks) EXPECT_TRUE(r.client->check_alive(10ms).ok());
}

INSTANTIATE_TEST_SUITE_P(Providers, FloodTest, ::testing::Values("shm", "tcp;ofi_rxm"),
                         [](const auto& p) { return p.param == "shm" ? "shm" : "tcp_rxm"; });

}  // namespace
