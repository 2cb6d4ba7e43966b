// mkernel-demo-client: data through mkerneld end to end, with host threads playing the GPU.
//
// Two sessions join one communicator as ranks 0 and 1. Rank 0 fills its region with a pattern
// and pushes write+signal commands into its ring; the daemon's proxy checks each one and carries
// it (loopback transport) into rank 1's region, raising rank 1's flags. Rank 1 waits on the
// flags and checks every byte. A second phase measures commands per second through validation
// into the transport. Exits non-zero on any lost byte, wrong flag or count that does not add up.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "mkernel/protocol/ring_host.h"
#include "mkernel/protocol/session_client.h"

namespace mp = mkernel::protocol;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

struct Peer {
  std::unique_ptr<mp::SessionClient> client;
  mp::ClientRing* ring = nullptr;
  mp::ClientRegion* region = nullptr;
  mp::ClientFlags* flags = nullptr;
};

mkernel::StatusOr<Peer> join(const std::string& socket, const std::string& comm, uint32_t rank,
                             uint64_t region_bytes, uint32_t num_flags, uint32_t ring_log2) {
  Peer p;
  mp::SessionClient::Options o;
  o.socket_path = socket;
  o.client_name = "demo-rank" + std::to_string(rank);
  o.communicator = comm;
  o.rank = rank;
  o.world_size = 2;
  MK_ASSIGN_OR_RETURN(p.client, mp::SessionClient::connect(o));
  MK_ASSIGN_OR_RETURN(p.ring, p.client->create_ring(ring_log2));
  MK_ASSIGN_OR_RETURN(p.region, p.client->create_region(region_bytes, true));
  MK_ASSIGN_OR_RETURN(p.flags, p.client->create_flags(num_flags));
  return p;
}

bool wait_completed(const mp::ClientRing& ring, uint64_t n, std::chrono::seconds bound) {
  const auto deadline = Clock::now() + bound;
  while (std::atomic_ref<uint64_t>(ring.view.header->completed).load(std::memory_order_acquire) < n) {
    if (Clock::now() > deadline) return false;
    if (std::atomic_ref<uint32_t>(ring.view.header->error).load(std::memory_order_acquire) != 0) return false;
    std::this_thread::yield();
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"mkernel-demo-client: moves data through a running mkerneld and checks it"};
  std::string runtime_dir = "/run/mkerneld", socket;
  uint64_t commands = 20000, rate_commands = 2000000;
  uint32_t seed = 1;
  app.add_option("--runtime-dir", runtime_dir, "the daemon's runtime directory");
  app.add_option("--socket", socket, "the daemon's client socket (default: RUNTIME_DIR/mkerneld.sock)");
  app.add_option("--commands", commands, "write+signal commands in the checked phase")->check(CLI::Range(1, 10000000));
  app.add_option("--rate-commands", rate_commands, "commands in the rate phase (0 skips it)");
  app.add_option("--seed", seed, "random seed");
  CLI11_PARSE(app, argc, argv);
  if (socket.empty()) socket = runtime_dir + "/mkerneld.sock";

  const std::string comm = "demo-" + std::to_string(::getpid());
  constexpr uint64_t kRegionBytes = 8 << 20;
  constexpr uint32_t kFlags = 1024;
  const auto t_setup = Clock::now();
  auto r0 = join(socket, comm, 0, kRegionBytes, kFlags, 12);
  if (!r0.ok()) {
    std::fprintf(stderr, "mkernel-demo-client: rank 0: %s\n", r0.status().to_string().c_str());
    return 2;
  }
  auto r1 = join(socket, comm, 1, kRegionBytes, kFlags, 12);
  if (!r1.ok()) {
    std::fprintf(stderr, "mkernel-demo-client: rank 1: %s\n", r1.status().to_string().c_str());
    return 2;
  }
  const double setup_ms = std::chrono::duration<double, std::milli>(Clock::now() - t_setup).count();
  Peer& a = r0.value();
  Peer& b = r1.value();
  std::printf("connected to %s: sessions %llu and %llu (daemon epoch %llu), set up in %.2f ms\n",
              socket.c_str(), static_cast<unsigned long long>(a.client->session_id()),
              static_cast<unsigned long long>(b.client->session_id()),
              static_cast<unsigned long long>(a.client->epoch()), setup_ms);

  // Phase 1: random-size writes with signals, every byte and flag checked.
  std::mt19937_64 rng(seed);
  auto* src = static_cast<uint8_t*>(a.region->data());
  for (size_t i = 0; i < kRegionBytes; i += 8) {
    const uint64_t w = rng();
    std::memcpy(src + i, &w, 8);
  }
  std::memset(b.region->data(), 0, kRegionBytes);
  mp::HostRingProducer producer(a.ring->view, a.client->epoch());
  std::vector<uint64_t> expect_flag(kFlags, 0);
  uint64_t bytes = 0;
  const auto t1 = Clock::now();
  for (uint64_t i = 0; i < commands; ++i) {
    const uint64_t size = 4 + rng() % (64 << 10);
    const uint64_t off = rng() % (kRegionBytes - size);
    const uint32_t flag = static_cast<uint32_t>(i % kFlags);
    expect_flag[flag] = i + 1;
    // Same offset on both sides, so the destination must end up equal to the source wherever
    // anything was written.
    const mp::Command c = mp::make_write_signal(1, static_cast<uint16_t>(a.region->id), off,
                                                static_cast<uint16_t>(b.region->id), off, size, flag, i + 1, i);
    if (const mp::RingStatus s = producer.push(c, 5s); s != mp::kRingOk) {
      std::fprintf(stderr, "push %llu: %s\n", static_cast<unsigned long long>(i), mp::ring_status_name(s));
      return 1;
    }
    bytes += size;
  }
  if (!wait_completed(*a.ring, commands, 30s)) {
    std::fprintf(stderr, "mkernel-demo-client: only %llu of %llu commands completed (ring error %u)\n",
                 static_cast<unsigned long long>(a.ring->view.header->completed),
                 static_cast<unsigned long long>(commands), a.ring->view.header->error);
    return 1;
  }
  const double secs1 = std::chrono::duration<double>(Clock::now() - t1).count();
  uint64_t bad_flags = 0;
  for (uint32_t f = 0; f < kFlags; ++f)
    if (std::atomic_ref<uint64_t>(b.flags->flags()[f]).load(std::memory_order_acquire) != expect_flag[f]) ++bad_flags;
  // Every destination byte is either untouched (0) or equal to the source byte.
  uint64_t bad_bytes = 0, written = 0;
  const auto* dst = static_cast<const uint8_t*>(b.region->data());
  for (size_t i = 0; i < kRegionBytes; ++i) {
    if (dst[i] != 0) ++written;
    if (dst[i] != 0 && dst[i] != src[i]) ++bad_bytes;
  }
  std::printf("checked phase: %llu write+signal commands, %.1f MiB, %.3f s: %llu wrong bytes, %llu "
              "wrong flags\n",
              static_cast<unsigned long long>(commands), static_cast<double>(bytes) / (1 << 20), secs1,
              static_cast<unsigned long long>(bad_bytes), static_cast<unsigned long long>(bad_flags));
  if (bad_bytes || bad_flags || written == 0) return 1;

  // Phase 2: small commands as fast as one producer thread can push them.
  if (rate_commands > 0) {
    const uint64_t base = a.ring->view.header->completed;
    std::vector<mp::Command> batch(64);
    const auto t2 = Clock::now();
    for (uint64_t i = 0; i < rate_commands; i += batch.size()) {
      for (size_t k = 0; k < batch.size(); ++k)
        batch[k] = mp::make_write_signal(1, static_cast<uint16_t>(a.region->id), (k * 64) % 4096,
                                         static_cast<uint16_t>(b.region->id), (k * 64) % 4096, 8,
                                         static_cast<uint32_t>(k), commands + i + k + 1);
      if (const mp::RingStatus s = producer.push_batch(batch, 5s); s != mp::kRingOk) {
        std::fprintf(stderr, "rate phase push: %s\n", mp::ring_status_name(s));
        return 1;
      }
    }
    const uint64_t pushed = (rate_commands + batch.size() - 1) / batch.size() * batch.size();
    if (!wait_completed(*a.ring, base + pushed, 60s)) {
      std::fprintf(stderr, "rate phase: commands did not complete\n");
      return 1;
    }
    const double secs2 = std::chrono::duration<double>(Clock::now() - t2).count();
    std::printf("rate phase: %llu 8-byte write+signal commands in %.3f s: %.2f M commands/s through "
                "validation into the loopback transport\n",
                static_cast<unsigned long long>(pushed), secs2, static_cast<double>(pushed) / secs2 / 1e6);
  }
  if (const mkernel::Status s = a.client->ping(); !s.ok()) {
    std::fprintf(stderr, "ping: %s\n", s.to_string().c_str());
    return 1;
  }
  a.client->close();
  b.client->close();
  std::printf("demo: every byte and flag arrived as sent\n");
  return 0;
}
