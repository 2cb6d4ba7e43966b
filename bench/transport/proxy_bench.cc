// mkernel-proxy-bench: the proxy path between two mkerneld processes, measured like the raw
// baseline (raw_fabric_bench.cc): writes of 4 KiB, 64 KiB and 1 MiB, a window of W in flight.
//
// Design notes
//  1. Rank 0 is a session on daemon A, rank 1 a session on daemon B, both in this process (the
//     rendezvous needs both ranks joining at once, so rank 1 joins on a second thread). Rank 1's
//     region and flags are shared memory mapped here as well as in daemon B, so this process
//     checks what landed there directly.
//  2. Rank 0 pushes make_write_signal commands with a HostRingProducer. The window is the ring
//     header's `completed` counter (commands carried out, in order): command i is pushed only
//     once completed >= i - W + 1, so its slot (i mod W) of the source and destination regions,
//     and its flag (also i mod W), are free. Each flag carries at most one signal in flight and
//     its values rise by one, as the transport's CQ data encoding requires.
//  3. Timing: from the first push to `completed` reaching the run's total. Afterwards rank 1's
//     flags must reach their last values (bounded wait), outside the timed span. Before the
//     warm-up of each size one write of a pattern is checked byte for byte in rank 1's region.
//  4. Every wait has a deadline; a ring error or a stuck counter is an error exit with what was
//     reached. Output: one JSON line per size on stdout, progress on stderr.
#include <sys/prctl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <future>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "mkernel/protocol/ring_host.h"
#include "mkernel/protocol/session_client.h"

namespace mp = mkernel::protocol;
using Clock = std::chrono::steady_clock;
using mkernel::Status;
using mkernel::StatusCode;

namespace {

struct Options {
  std::string socket_a;
  std::string socket_b;
  std::string provider;  // a label for the output ("tcp;ofi_rxm", "shm")
  std::vector<uint64_t> sizes = {4096, 65536, 1048576};
  uint32_t window = 16;
  uint32_t runs = 5;
  uint32_t warmup = 1;
  uint64_t ops = 0;
  uint64_t run_bytes = 128ull << 20;       // bytes per run when ops is 0 ...
  uint64_t min_ops = 1000, max_ops = 20000;  // ... clamped to this range
  uint32_t ring_log2 = 12;
  uint32_t timeout_ms = 10000;
  uint32_t connect_timeout_ms = 30000;
  // How rank 0 waits for the window to open: "yield" (spin with sched_yield) or "sleep" (naps
  // of nap_us with a 1 us timer slack: off the CPU, closer to a GPU producer, which costs the
  // host nothing while it waits).
  std::string producer_wait = "yield";
  uint32_t nap_us = 50;
};

uint64_t ops_for(const Options& o, uint64_t bytes) {
  if (o.ops != 0) return o.ops;
  return std::clamp<uint64_t>(o.run_bytes / bytes, o.min_ops, o.max_ops);
}

struct Rank {
  std::unique_ptr<mp::SessionClient> client;
  mp::ClientRing* ring = nullptr;
  mp::ClientRegion* region = nullptr;
  mp::ClientFlags* flags = nullptr;
};

mkernel::StatusOr<Rank> open_rank(const Options& o, const std::string& socket, const std::string& comm,
                                  uint32_t rank, uint32_t ring_log2, bool writable) {
  Rank r;
  mp::SessionClient::Options so;
  so.socket_path = socket;
  so.client_name = "proxy-bench-rank" + std::to_string(rank);
  so.gpu = 0;
  so.communicator = comm;
  so.rank = rank;
  so.world_size = 2;
  so.timeout = std::chrono::milliseconds(o.timeout_ms);
  MK_ASSIGN_OR_RETURN(r.client, mp::SessionClient::connect(so));
  const uint64_t max_bytes = *std::max_element(o.sizes.begin(), o.sizes.end());
  MK_ASSIGN_OR_RETURN(r.ring, r.client->create_ring(ring_log2));
  MK_ASSIGN_OR_RETURN(r.region, r.client->create_region(max_bytes * o.window, writable));
  MK_ASSIGN_OR_RETURN(r.flags, r.client->create_flags(o.window));
  return r;
}

uint64_t load(const uint64_t& v) {
  return std::atomic_ref<const uint64_t>(v).load(std::memory_order_acquire);
}

Status ring_error(const mp::ClientRing& ring, const char* when) {
  const mp::RingHeader* h = ring.view.header;
  const uint32_t code = std::atomic_ref<const uint32_t>(h->error).load(std::memory_order_acquire);
  if (code == 0) return Status::Ok();
  return Status(StatusCode::kInternal, std::string(when) + ": the daemon stopped rank 0's ring: error " +
                                           std::to_string(code) + " detail " + std::to_string(h->error_detail) +
                                           " at position " + std::to_string(h->error_pos));
}

void fill_pattern(uint8_t* p, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t w = rng();
    std::memcpy(p + i, &w, std::min<size_t>(8, n - i));
  }
}

class Bench {
 public:
  Bench(const Options& o, Rank& r0, Rank& r1)
      : o_(o), r0_(r0), r1_(r1), producer_(r0.ring->view, r0.client->epoch()),
        flag_value_(o.window, 0), sleep_wait_(o.producer_wait == "sleep") {}

  // Pushes `count` writes of `bytes` with `window` in flight and waits for all to complete.
  Status run(uint64_t bytes, uint64_t count, uint32_t window, double* seconds) {
    const mp::RingHeader* h = r0_.ring->view.header;
    const uint64_t base = load(h->completed);
    if (base != pushed_total_) {
      return Status(StatusCode::kInternal, "completed counter " + std::to_string(base) + " != commands pushed " +
                                               std::to_string(pushed_total_) + " before a run");
    }
    const auto src = static_cast<uint16_t>(r0_.region->id);
    const auto dst = static_cast<uint16_t>(r1_.region->id);
    const auto bound = std::chrono::milliseconds(o_.timeout_ms);
    std::vector<mp::Command> batch;
    batch.reserve(window);
    uint64_t pushed = 0, done = 0;
    const auto t0 = Clock::now();
    auto deadline = t0 + bound;
    while (done < count) {
      done = load(h->completed) - base;
      const uint64_t room = std::min<uint64_t>(count, done + window) - pushed;
      if (room > 0) {
        batch.clear();
        for (uint64_t k = 0; k < room; ++k) {
          const uint64_t i = pushed + k;
          const auto slot = static_cast<uint32_t>(i % window);
          batch.push_back(mp::make_write_signal(1, src, slot * bytes, dst, slot * bytes, bytes, slot,
                                                ++flag_value_[slot], i));
        }
        if (const mp::RingStatus s = producer_.push_batch(batch, bound); s != mp::kRingOk) {
          MK_RETURN_IF_ERROR(ring_error(*r0_.ring, "push"));
          return Status(StatusCode::kInternal, std::string("push: ") + mp::ring_status_name(s));
        }
        pushed += room;
        pushed_total_ += room;
        deadline = Clock::now() + bound;
        continue;
      }
      if (done >= count) break;
      if (Clock::now() > deadline) {
        MK_RETURN_IF_ERROR(ring_error(*r0_.ring, "run"));
        return Status(StatusCode::kDeadlineExceeded,
                      std::to_string(done) + " of " + std::to_string(count) + " commands of " +
                          std::to_string(bytes) + " bytes completed (" + std::to_string(pushed) +
                          " pushed); no progress for " + std::to_string(o_.timeout_ms) + " ms");
      }
      if (((done ^ pushed) & 0x3ff) == 0) MK_RETURN_IF_ERROR(ring_error(*r0_.ring, "run"));
      if (sleep_wait_) {
        std::this_thread::sleep_for(std::chrono::microseconds(o_.nap_us));
      } else {
        std::this_thread::yield();
      }
    }
    *seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    MK_RETURN_IF_ERROR(ring_error(*r0_.ring, "run"));
    return wait_flags(window);
  }

  // Every flag of rank 1 used so far must reach the last value sent to it.
  Status wait_flags(uint32_t window) {
    const auto deadline = Clock::now() + std::chrono::milliseconds(o_.timeout_ms);
    for (uint32_t f = 0; f < window; ++f) {
      while (load(r1_.flags->flags()[f]) != flag_value_[f]) {
        if (Clock::now() > deadline) {
          return Status(StatusCode::kDeadlineExceeded,
                        "rank 1 flag " + std::to_string(f) + " is " + std::to_string(load(r1_.flags->flags()[f])) +
                            ", expected " + std::to_string(flag_value_[f]) + " within " +
                            std::to_string(o_.timeout_ms) + " ms of the last completion");
        }
        std::this_thread::yield();
      }
    }
    return Status::Ok();
  }

  // One write of a pattern into slot 0, checked byte for byte.
  Status verify(uint64_t bytes) {
    auto* src = static_cast<uint8_t*>(r0_.region->data());
    auto* dst = static_cast<uint8_t*>(r1_.region->data());
    fill_pattern(src, bytes, bytes * 7919 + 1);
    std::memset(dst, 0, bytes);
    double secs = 0;
    MK_RETURN_IF_ERROR(run(bytes, 1, 1, &secs));
    if (std::memcmp(src, dst, bytes) != 0) {
      return Status(StatusCode::kInternal, "the " + std::to_string(bytes) + "-byte pattern arrived wrong at rank 1");
    }
    return Status::Ok();
  }

 private:
  const Options& o_;
  Rank& r0_;
  Rank& r1_;
  mp::HostRingProducer producer_;
  std::vector<uint64_t> flag_value_;
  uint64_t pushed_total_ = 0;
  bool sleep_wait_ = false;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string json_escape(const std::string& s) {
  std::string out;
  for (const char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) out += c;
  }
  return out;
}

int run_bench(const Options& o) {
  const std::string comm = "proxy-bench-" + std::to_string(::getpid());
  std::string token;
  {
    std::random_device rd;
    const char* hex = "0123456789abcdef";
    for (int i = 0; i < 32; ++i) token += hex[rd() % 16];
  }
  auto r0s = open_rank(o, o.socket_a, comm, 0, o.ring_log2, false);
  if (!r0s.ok()) {
    std::fprintf(stderr, "mkernel-proxy-bench: rank 0 on %s: %s\n", o.socket_a.c_str(), r0s.status().to_string().c_str());
    return 2;
  }
  auto r1s = open_rank(o, o.socket_b, comm, 1, 4, true);
  if (!r1s.ok()) {
    std::fprintf(stderr, "mkernel-proxy-bench: rank 1 on %s: %s\n", o.socket_b.c_str(), r1s.status().to_string().c_str());
    return 2;
  }
  Rank& r0 = r0s.value();
  Rank& r1 = r1s.value();
  if (o.window > r0.client->limits().max_commands_in_flight && r0.client->limits().max_commands_in_flight != 0) {
    std::fprintf(stderr, "mkernel-proxy-bench: window %u exceeds the daemon's in-flight quota %u\n", o.window,
                 r0.client->limits().max_commands_in_flight);
    return 2;
  }

  mp::ConnectOptions co;
  co.root = r0.client->peer_address();
  co.token = token;
  co.timeout = std::chrono::milliseconds(o.connect_timeout_ms);
  const auto t_connect = Clock::now();
  auto f1 = std::async(std::launch::async, [&] { return r1.client->connect_communicator(co); });
  auto c0 = r0.client->connect_communicator(co);
  auto c1 = f1.get();
  const double connect_ms = std::chrono::duration<double, std::milli>(Clock::now() - t_connect).count();
  if (!c0.ok() || !c1.ok()) {
    std::fprintf(stderr, "mkernel-proxy-bench: connect_communicator (root %s): rank 0: %s; rank 1: %s\n",
                 co.root.c_str(), c0.ok() ? "ok" : c0.status().to_string().c_str(),
                 c1.ok() ? "ok" : c1.status().to_string().c_str());
    return 2;
  }
  const mp::ConnectInfo& info = c0.value();
  if (info.ranks.size() != 2 || !info.ranks[1].network) {
    std::fprintf(stderr, "mkernel-proxy-bench: rank 1 is not reached through the network (%zu ranks); "
                         "the daemons must be separate nodes\n", info.ranks.size());
    return 2;
  }
  std::fprintf(stderr, "proxy: communicator %s connected in %.1f ms, transport \"%s\" (rank 1 on node %s)\n",
               comm.c_str(), connect_ms, info.transport.c_str(), info.ranks[1].node.c_str());

  Bench bench(o, r0, r1);
  for (const uint64_t bytes : o.sizes) {
    const uint64_t count = ops_for(o, bytes);
    if (Status s = bench.verify(bytes); !s.ok()) {
      std::fprintf(stderr, "mkernel-proxy-bench: check of %llu bytes: %s\n", static_cast<unsigned long long>(bytes),
                   s.to_string().c_str());
      return 1;
    }
    double secs = 0;
    std::vector<double> gbps, opsps;
    for (uint32_t r = 0; r < o.warmup + o.runs; ++r) {
      if (Status s = bench.run(bytes, count, o.window, &secs); !s.ok()) {
        std::fprintf(stderr, "mkernel-proxy-bench: %llu bytes, run %u: %s\n", static_cast<unsigned long long>(bytes), r,
                     s.to_string().c_str());
        return 1;
      }
      if (r < o.warmup) continue;
      gbps.push_back(static_cast<double>(bytes * count) / secs / 1e9);
      opsps.push_back(static_cast<double>(count) / secs);
    }
    const double med = median(gbps);
    const double lo = *std::min_element(gbps.begin(), gbps.end());
    const double hi = *std::max_element(gbps.begin(), gbps.end());
    std::fprintf(stderr, "proxy %s %8llu B x %llu, window %u: %.3f GB/s median (min %.3f, max %.3f), %.0f ops/s\n",
                 o.provider.c_str(), static_cast<unsigned long long>(bytes), static_cast<unsigned long long>(count),
                 o.window, med, lo, hi, median(opsps));
    std::printf("{\"bench\": \"proxy_write_signal\", \"provider\": \"%s\", \"transport\": \"%s\", \"bytes\": %llu, "
                "\"window\": %u, \"ops_per_run\": %llu, \"runs\": %u, \"ops_per_s\": %.1f, \"gbytes_per_s\": %.4f, "
                "\"gbytes_per_s_min\": %.4f, \"gbytes_per_s_max\": %.4f, \"median_s\": %.6f, \"connect_ms\": %.1f, \"producer_wait\": \"%s\", \"nap_us\": %u}\n",
                json_escape(o.provider).c_str(), json_escape(info.transport).c_str(),
                static_cast<unsigned long long>(bytes), o.window, static_cast<unsigned long long>(count), o.runs,
                median(opsps), med, lo, hi, static_cast<double>(bytes * count) / med / 1e9, connect_ms,
                o.producer_wait.c_str(), o.producer_wait == "sleep" ? o.nap_us : 0);
    std::fflush(stdout);
  }
  if (Status s = r0.client->ping(); !s.ok()) {
    std::fprintf(stderr, "mkernel-proxy-bench: ping after the runs: %s\n", s.to_string().c_str());
    return 1;
  }
  r0.client->close();
  r1.client->close();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"mkernel-proxy-bench: write+signal commands through two mkerneld processes (node A -> node B), "
               "one JSON line per size on stdout"};
  app.add_option("--socket-a", o.socket_a, "client socket of daemon A (rank 0, the writer)")->required();
  app.add_option("--socket-b", o.socket_b, "client socket of daemon B (rank 1, the target)")->required();
  app.add_option("--provider", o.provider, "label for the output: the provider the daemons use");
  app.add_option("--sizes", o.sizes, "write sizes in bytes")->delimiter(',')->check(CLI::Range(uint64_t{8}, uint64_t{1} << 30));
  app.add_option("--window", o.window, "commands in flight")->check(CLI::Range(1, 4096));
  app.add_option("--runs", o.runs, "timed runs per size (the median is reported)")->check(CLI::Range(1, 1000));
  app.add_option("--warmup", o.warmup, "untimed runs per size first");
  app.add_option("--ops", o.ops, "commands per run (default: --run-bytes / size within [1000, 20000])");
  app.add_option("--run-bytes", o.run_bytes, "bytes per run when --ops is not given");
  app.add_option("--ring-log2", o.ring_log2, "rank 0's ring capacity, log2")->check(CLI::Range(1, 20));
  app.add_option("--timeout-ms", o.timeout_ms, "longest wait for any progress")->check(CLI::Range(100, 600000));
  app.add_option("--producer-wait", o.producer_wait, "rank 0 waits for the window by: yield (spin) or sleep (naps)")
      ->check(CLI::IsMember({"yield", "sleep"}));
  app.add_option("--nap-us", o.nap_us, "length of one nap with --producer-wait sleep")->check(CLI::Range(1, 10000));
  app.add_option("--connect-timeout-ms", o.connect_timeout_ms, "bound on the rendezvous")->check(CLI::Range(100, 600000));
  CLI11_PARSE(app, argc, argv);
  if ((uint64_t{1} << o.ring_log2) < o.window) {
    std::fprintf(stderr, "mkernel-proxy-bench: --window %u is larger than the ring (2^%u slots)\n", o.window, o.ring_log2);
    return 2;
  }
  // Naps as asked for: the default 50 us timer slack would stretch every one of them.
  if (o.producer_wait == "sleep") prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
  return run_bench(o);
}
