// ring_bench: records per second from GPU producers into one host consumer, and push-to-seen
// latency, for mkernel's ring beside a minimal ring (device-counter claims, the host tail read on
// every push, a system-scope release store of the last word), in one run.
//
//   ring_bench [--jsonl FILE] [--commit SHA] [--machine NAME] [--date YYYY-MM-DD]
//
// Throughput: `blocks` blocks, one producing thread (or one warp) each, push until the total is
// reached; time from launch to the consumer taking the last record, exactly-once checked.
// Latency: one GPU thread pushes one record and spins on an ack the consumer writes into mapped
// host memory when it sees the record; a flag-only round trip (GPU store -> host sees -> ack) is
// measured the same way. push-to-seen = push round trip - half the median flag round trip.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "gpu_ring_util.h"

namespace mp = mkernel::protocol;
using namespace std::chrono_literals;

namespace {

enum Impl : int { kMkThread = 0, kMkBatch8 = 1, kMkWarp = 2, kNaive = 3 };
const char* impl_variant(int v) {
  switch (v) {
    case kMkThread: return "thread";
    case kMkBatch8: return "thread_batch8";
    case kMkWarp: return "warp";
    default: return "thread";
  }
}

__device__ mp::Command bench_command(uint32_t producer, uint32_t i) {
  return mp::make_write(producer % 8, 0, uint64_t{i} * 64, 1, 0, 64,
                        (uint64_t{producer} << 32) | i);
}

// The minimal ring DESIGN.md section 6 describes, as a baseline: claims by atomics on a device
// counter, the host tail read on every push, the record's last word stored with system-scope
// release. No cached tail, no batching.
__device__ uint32_t minimal_push(const mp::RingProducerView& v, const mp::Command& c) {
  const uint64_t cap = uint64_t{1} << v.capacity_log2;
  const uint64_t pos = atomicAdd(&v.state->claim, 1ull);
  const uint64_t start = mkernel::sync::globaltimer_ns();
  while (pos - mkernel::sync::ld_acquire_sys(&v.header->tail) >= cap) {
    if (mkernel::sync::globaltimer_ns() - start > v.timeout_ns) return mp::kRingTimeout;
  }
  mp::CommandRecord* slot = &v.slots[pos & (cap - 1)];
  mp::ring_detail::store_payload(slot, c);
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(&slot->commit),
               "r"(mp::commit_word(pos, v.capacity_log2))
               : "memory");
  return mp::kRingOk;
}

__global__ void throughput_kernel(mp::RingProducerView ring, int impl, uint32_t per_producer,
                                  uint32_t* status) {
  const bool warp_impl = impl == kMkWarp;
  if (!warp_impl && threadIdx.x != 0) return;
  const uint32_t producer = warp_impl ? blockIdx.x * 32 + threadIdx.x : blockIdx.x;
  uint32_t st = mp::kRingOk;
  if (impl == kMkBatch8) {
    mp::Command cmds[8];
    for (uint32_t i = 0; i < per_producer && st == mp::kRingOk; i += 8) {
      for (uint32_t k = 0; k < 8; ++k) cmds[k] = bench_command(producer, i + k);
      st = mp::ring_push_batch(ring, cmds, 8);
    }
  } else {
    for (uint32_t i = 0; i < per_producer && st == mp::kRingOk; ++i) {
      const mp::Command c = bench_command(producer, i);
      st = impl == kNaive ? minimal_push(ring, c)
           : impl == kMkWarp ? mp::ring_push_warp(ring, c, true)
                             : mp::ring_push(ring, c);
    }
  }
  if (st != mp::kRingOk) atomicMax(status, st);
}

// Latency: per iteration, push (or flag) then wait for the host's ack of that iteration.
__global__ void latency_kernel(mp::RingProducerView ring, bool flag_only, uint32_t iters,
                               uint64_t* flag_out, const volatile uint64_t* ack,
                               uint64_t* rtt_ns, uint32_t* status) {
  for (uint32_t i = 0; i < iters; ++i) {
    const uint64_t t0 = mkernel::sync::globaltimer_ns();
    if (flag_only) {
      asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(flag_out), "l"(uint64_t{i} + 1)
                   : "memory");
    } else {
      const uint32_t st = mp::ring_push(ring, bench_command(0, i));
      if (st != mp::kRingOk) {
        *status = st;
        return;
      }
    }
    uint64_t spins = 0;
    while (*ack < uint64_t{i} + 1) {
      if (++spins > (1ull << 28)) {
        *status = mp::kRingTimeout;
        return;
      }
    }
    rtt_ns[i] = mkernel::sync::globaltimer_ns() - t0;
  }
}

struct Args {
  std::string jsonl, commit = "unknown", machine, date = "unknown";
};

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(p * static_cast<double>(v.size() - 1))];
}

FILE* g_jsonl = nullptr;
Args g_args;

void emit(const std::string& shape, const std::string& impl, const std::string& metrics) {
  if (!g_jsonl) return;
  std::fprintf(g_jsonl,
               "{\"benchmark\": \"ring\", \"shape\": %s, \"world\": 1, \"nodes\": 1, \"impl\": "
               "\"%s\", %s, \"machine\": \"%s\", \"commit\": \"%s\", \"date\": \"%s\"}\n",
               shape.c_str(), impl.c_str(), metrics.c_str(), g_args.machine.c_str(),
               g_args.commit.c_str(), g_args.date.c_str());
  std::fflush(g_jsonl);
}

// 16 Ki slots (1 MiB of records): more than the 4224 producers of the largest case claim at once.
constexpr uint32_t kThroughputRingLog2 = 14;

// Returns records per second (median of `reps` runs), or -1 if a run failed its checks.
double run_throughput(int impl, uint32_t blocks, uint64_t total_target, int reps) {
  const uint32_t producers = impl == kMkWarp ? blocks * 32 : blocks;
  uint32_t per = static_cast<uint32_t>(std::max<uint64_t>(8, total_target / producers));
  per = (per + 7) / 8 * 8;
  const uint64_t total = uint64_t{per} * producers;
  std::vector<double> rates;
  for (int r = 0; r < reps; ++r) {
    mkt::PinnedRing ring(kThroughputRingLog2);
    uint32_t* status = nullptr;
    MKT_CHECK_CUDA(cudaMalloc(&status, sizeof(uint32_t)));
    MKT_CHECK_CUDA(cudaMemset(status, 0, sizeof(uint32_t)));
    cudaStream_t s;
    MKT_CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    std::vector<uint32_t> next(producers, 0);
    uint64_t out_of_order = 0;
    mp::RingConsumer consumer(ring.host(), {.limits = {}, .tail_batch = 64});
    const auto t0 = std::chrono::steady_clock::now();
    throughput_kernel<<<blocks, impl == kMkWarp ? 32 : 32, 0, s>>>(ring.device(), impl, per, status);
    MKT_CHECK_CUDA(cudaGetLastError());
    const auto deadline = t0 + 60s;
    while (consumer.stats().consumed < total && std::chrono::steady_clock::now() < deadline) {
      consumer.poll(
          8192,
          [&](const mp::Command& c, uint64_t) {
            const uint32_t p = static_cast<uint32_t>(c.tag >> 32), i = static_cast<uint32_t>(c.tag);
            if (p >= producers || i != next[p]) ++out_of_order;
            else ++next[p];
          },
          [&](const mp::CommandRecord&, mp::RejectReason, uint64_t) { ++out_of_order; });
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const bool done = mkt::wait_stream(s, 10s, "throughput_kernel");
    uint32_t st = 0;
    MKT_CHECK_CUDA(cudaMemcpy(&st, status, sizeof(st), cudaMemcpyDeviceToHost));
    cudaStreamDestroy(s);
    cudaFree(status);
    if (!done || st != 0 || out_of_order != 0 || consumer.stats().consumed != total) {
      std::printf("  %s blocks=%u: FAILED (consumed %llu/%llu, out of order %llu, status %u)\n",
                  impl_variant(impl), blocks,
                  static_cast<unsigned long long>(consumer.stats().consumed),
                  static_cast<unsigned long long>(total),
                  static_cast<unsigned long long>(out_of_order), st);
      return -1;
    }
    rates.push_back(static_cast<double>(total) / secs);
  }
  return percentile(rates, 0.5);
}

struct Latency {
  double p50 = 0, p99 = 0;
  bool ok = false;
};

// Returns the round-trip samples in microseconds.
std::vector<double> run_latency_rtt(bool flag_only, uint32_t iters) {
  mkt::PinnedRing ring(12);
  uint64_t* host_words = nullptr;  // [0] = flag_out (GPU -> host), [8] = ack (host -> GPU)
  MKT_CHECK_CUDA(cudaHostAlloc(&host_words, 4096, cudaHostAllocMapped));
  std::memset(host_words, 0, 4096);
  uint64_t* dev_words = nullptr;
  MKT_CHECK_CUDA(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dev_words), host_words, 0));
  uint64_t* rtt = nullptr;
  uint32_t* status = nullptr;
  MKT_CHECK_CUDA(cudaMalloc(&rtt, iters * sizeof(uint64_t)));
  MKT_CHECK_CUDA(cudaMalloc(&status, sizeof(uint32_t)));
  MKT_CHECK_CUDA(cudaMemset(status, 0, sizeof(uint32_t)));
  cudaStream_t s;
  MKT_CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::atomic_ref<uint64_t> flag(host_words[0]);
  std::atomic_ref<uint64_t> ack(host_words[8]);
  mp::RingConsumer consumer(ring.host(), {.limits = {}, .tail_batch = 1});
  latency_kernel<<<1, 1, 0, s>>>(ring.device(), flag_only, iters, dev_words, dev_words + 8, rtt,
                                 status);
  MKT_CHECK_CUDA(cudaGetLastError());
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  for (uint64_t i = 0; i < iters && std::chrono::steady_clock::now() < deadline;) {
    if (flag_only) {
      if (flag.load(std::memory_order_acquire) >= i + 1) ack.store(++i, std::memory_order_release);
    } else {
      consumer.poll(
          1, [&](const mp::Command&, uint64_t) { ack.store(++i, std::memory_order_release); },
          [&](const mp::CommandRecord&, mp::RejectReason, uint64_t) {});
    }
  }
  const bool done = mkt::wait_stream(s, 10s, "latency_kernel");
  std::vector<uint64_t> ns(iters);
  uint32_t st = 0;
  MKT_CHECK_CUDA(cudaMemcpy(ns.data(), rtt, iters * sizeof(uint64_t), cudaMemcpyDeviceToHost));
  MKT_CHECK_CUDA(cudaMemcpy(&st, status, sizeof(st), cudaMemcpyDeviceToHost));
  cudaStreamDestroy(s);
  cudaFree(rtt);
  cudaFree(status);
  cudaFreeHost(host_words);
  std::vector<double> us;
  if (!done || st != 0) return us;
  const uint32_t warmup = iters / 10;
  for (uint32_t i = warmup; i < iters; ++i) us.push_back(static_cast<double>(ns[i]) / 1000.0);
  return us;
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--jsonl") g_args.jsonl = argv[i + 1];
    else if (a == "--commit") g_args.commit = argv[i + 1];
    else if (a == "--machine") g_args.machine = argv[i + 1];
    else if (a == "--date") g_args.date = argv[i + 1];
    else {
      std::fprintf(stderr, "ring_bench: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  mkt::require_hopper_or_skip("ring_bench");
  if (g_args.machine.empty()) {  // the GPU that ran the records
    cudaDeviceProp prop{};
    g_args.machine = cudaGetDeviceProperties(&prop, 0) == cudaSuccess ? std::string("1x") + prop.name : "unknown";
  }
  if (!g_args.jsonl.empty()) g_jsonl = std::fopen(g_args.jsonl.c_str(), "a");

  struct Row {
    std::string what;
    double mk, naive;
  };
  std::vector<Row> rows;
  const uint32_t block_counts[] = {1, 8, 32, 132};
  for (uint32_t blocks : block_counts) {
    const uint64_t target = blocks == 1 ? 400000 : 4000000;
    const double naive = run_throughput(kNaive, blocks, blocks == 1 ? 200000 : target, 3);
    for (int impl : {kMkThread, kMkBatch8, kMkWarp}) {
      const double mk = run_throughput(impl, blocks, target, 3);
      const std::string shape = "{\"producing_blocks\": " + std::to_string(blocks) +
                                ", \"producer\": \"" + impl_variant(impl) + "\"}";
      if (mk > 0) emit(shape, "mkernel", "\"records_per_s\": " + std::to_string(mk));
      rows.push_back({std::string(impl_variant(impl)) + " x" + std::to_string(blocks), mk, naive});
    }
    const std::string shape =
        "{\"producing_blocks\": " + std::to_string(blocks) + ", \"producer\": \"thread\"}";
    if (naive > 0) emit(shape, "minimal_ring", "\"records_per_s\": " + std::to_string(naive));
  }

  const std::vector<double> flag_rtt = run_latency_rtt(true, 20000);
  const std::vector<double> push_rtt = run_latency_rtt(false, 20000);
  Latency lat;
  double flag_p50 = 0;
  if (!flag_rtt.empty() && !push_rtt.empty()) {
    flag_p50 = percentile(flag_rtt, 0.5);
    std::vector<double> one_way;
    for (double r : push_rtt) one_way.push_back(r - flag_p50 / 2);
    lat = {percentile(one_way, 0.5), percentile(one_way, 0.99), true};
    emit("{\"producing_blocks\": 1, \"producer\": \"thread\", \"measure\": \"push_to_seen\"}",
         "mkernel",
         "\"p50_us\": " + std::to_string(lat.p50) + ", \"p99_us\": " + std::to_string(lat.p99) +
             ", \"push_rtt_p50_us\": " + std::to_string(percentile(push_rtt, 0.5)) +
             ", \"flag_rtt_p50_us\": " + std::to_string(flag_p50) +
             ", \"iters\": " + std::to_string(push_rtt.size()));
  }
  if (g_jsonl) std::fclose(g_jsonl);

  std::printf("\nring throughput (M records/s, median of 3, ring of %u slots; minimal ring: see top of file)\n", 1u << kThroughputRingLog2);
  std::printf("%-22s %12s %14s %8s\n", "producer x blocks", "mkernel", "minimal ring", "ratio");
  for (const Row& r : rows)
    std::printf("%-22s %12.2f %14.2f %8.2f\n", r.what.c_str(), r.mk / 1e6, r.naive / 1e6,
                r.naive > 0 ? r.mk / r.naive : 0.0);
  if (lat.ok)
    std::printf("\npush-to-seen latency: p50 %.2f us, p99 %.2f us (push round trip p50 %.2f us, "
                "flag round trip p50 %.2f us)\n",
                lat.p50, lat.p99, percentile(push_rtt, 0.5), flag_p50);
  else
    std::printf("\npush-to-seen latency: FAILED\n");
  bool all_ok = lat.ok;
  for (const Row& r : rows) all_ok = all_ok && r.mk > 0;
  return all_ok ? 0 : 1;
}
