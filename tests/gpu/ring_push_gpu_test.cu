// GPU producers, host consumer: more than a million records pushed by many blocks into a ring
// in mapped pinned memory, every one checked field by field and exactly once; and the bounded
// waits (timeout, consumer error, daemon epoch change) ending with their codes, not a hang.
#include <cstdio>
#include <vector>

#include "gpu_ring_util.h"

namespace mp = mkernel::protocol;
using namespace std::chrono_literals;

namespace {

enum Variant : int { kSingle = 0, kWarp = 1, kBatch = 2 };
const char* variant_name(int v) { return v == kSingle ? "single" : v == kWarp ? "warp" : "batch4"; }

__host__ __device__ mp::Command expected_command(uint32_t gtid, uint32_t i) {
  return mp::make_write_signal(gtid % 8, 1, uint64_t{i} * 64, 2, uint64_t{gtid} * 64, 64 + i % 64,
                               gtid % 1024, uint64_t{i} + 1, (uint64_t{gtid} << 24) | i);
}

__global__ void push_kernel(mp::RingProducerView ring, int variant, uint32_t per_thread,
                            uint32_t* status) {
  const uint32_t gtid = blockIdx.x * blockDim.x + threadIdx.x;
  uint32_t st = mp::kRingOk;
  if (variant == kBatch) {
    mp::Command cmds[4];
    for (uint32_t i = 0; i < per_thread && st == mp::kRingOk; i += 4) {
      const uint32_t n = per_thread - i < 4 ? per_thread - i : 4;
      for (uint32_t k = 0; k < n; ++k) cmds[k] = expected_command(gtid, i + k);
      st = mp::ring_push_batch(ring, cmds, n);
    }
  } else {
    for (uint32_t i = 0; i < per_thread && st == mp::kRingOk; ++i) {
      const mp::Command c = expected_command(gtid, i);
      st = variant == kWarp ? mp::ring_push_warp(ring, c, true) : mp::ring_push(ring, c);
    }
  }
  status[gtid] = st;
}

__global__ void push_n_kernel(mp::RingProducerView ring, uint32_t n, uint32_t* status) {
  for (uint32_t i = 0; i < n; ++i) status[i] = mp::ring_push(ring, expected_command(0, i));
}

int failures = 0;
#define EXPECT(cond, ...)                                     \
  do {                                                        \
    if (!(cond)) {                                            \
      ++failures;                                             \
      std::printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      std::printf(__VA_ARGS__);                               \
      std::printf("\n");                                      \
    }                                                         \
  } while (0)

void exactly_once(int variant) {
  constexpr uint32_t kBlocks = 132, kThreads = 256, kPerThread = 32;
  constexpr uint64_t kTotal = uint64_t{kBlocks} * kThreads * kPerThread;  // 1,081,344
  mkt::PinnedRing ring(12);  // 4096 slots: the ring wraps ~264 times and fills up
  uint32_t* status = nullptr;
  MKT_CHECK_CUDA(cudaMalloc(&status, kBlocks * kThreads * sizeof(uint32_t)));
  MKT_CHECK_CUDA(cudaMemset(status, 0xFF, kBlocks * kThreads * sizeof(uint32_t)));
  cudaStream_t s;
  MKT_CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  std::vector<uint8_t> seen(kTotal, 0);
  uint64_t duplicates = 0, wrong = 0, rejected = 0;
  mp::RingConsumer consumer(ring.host(), {.limits = {}, .tail_batch = 64});
  const auto t0 = std::chrono::steady_clock::now();
  push_kernel<<<kBlocks, kThreads, 0, s>>>(ring.device(), variant, kPerThread, status);
  MKT_CHECK_CUDA(cudaGetLastError());
  const auto deadline = t0 + 60s;
  while (consumer.stats().consumed < kTotal && std::chrono::steady_clock::now() < deadline) {
    consumer.poll(
        4096,
        [&](const mp::Command& c, uint64_t) {
          const uint32_t gtid = static_cast<uint32_t>(c.tag >> 24);
          const uint32_t i = static_cast<uint32_t>(c.tag & 0xFFFFFF);
          if (gtid >= kBlocks * kThreads || i >= kPerThread) {
            ++wrong;
            return;
          }
          if (!(c == expected_command(gtid, i))) ++wrong;
          if (seen[uint64_t{gtid} * kPerThread + i]++ != 0) ++duplicates;
        },
        [&](const mp::CommandRecord&, mp::RejectReason, uint64_t) { ++rejected; });
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const bool finished = mkt::wait_stream(s, 10s, "push_kernel");
  EXPECT(finished, "%s: kernel did not finish", variant_name(variant));
  std::vector<uint32_t> st(kBlocks * kThreads);
  MKT_CHECK_CUDA(cudaMemcpy(st.data(), status, st.size() * sizeof(uint32_t), cudaMemcpyDeviceToHost));
  uint64_t bad_status = 0;
  for (uint32_t v : st) bad_status += v != mp::kRingOk;
  uint64_t missing = 0;
  for (uint8_t v : seen) missing += v == 0;
  std::printf("%-7s %llu records in %.3f s (%.1f M/s): missing %llu, duplicated %llu, wrong %llu, "
              "rejected %llu, producer errors %llu\n",
              variant_name(variant), static_cast<unsigned long long>(consumer.stats().consumed),
              secs, static_cast<double>(consumer.stats().consumed) / secs / 1e6,
              static_cast<unsigned long long>(missing), static_cast<unsigned long long>(duplicates),
              static_cast<unsigned long long>(wrong), static_cast<unsigned long long>(rejected),
              static_cast<unsigned long long>(bad_status));
  EXPECT(consumer.stats().consumed == kTotal, "%s: consumed %llu of %llu", variant_name(variant),
         static_cast<unsigned long long>(consumer.stats().consumed),
         static_cast<unsigned long long>(kTotal));
  EXPECT(missing == 0 && duplicates == 0 && wrong == 0 && rejected == 0, "%s: not exactly once",
         variant_name(variant));
  EXPECT(bad_status == 0, "%s: %llu producers reported errors", variant_name(variant),
         static_cast<unsigned long long>(bad_status));
  EXPECT(ring.host().header->tail == kTotal, "%s: tail %llu", variant_name(variant),
         static_cast<unsigned long long>(ring.host().header->tail));
  cudaStreamDestroy(s);
  cudaFree(status);
}

// A full ring with nobody consuming: push n = capacity + 1 with the given header tweak applied,
// and check the last push's code and the kernel's bounded finish.
void bounded_wait(const char* name, uint64_t timeout_ns, void (*tweak)(mp::RingHeader*),
                  uint32_t want, std::chrono::milliseconds max_wall) {
  mkt::PinnedRing ring(4);  // 16 slots
  ring.device().timeout_ns = timeout_ns;
  if (tweak) tweak(ring.host().header);
  constexpr uint32_t kN = 17;
  uint32_t* status = nullptr;
  MKT_CHECK_CUDA(cudaMalloc(&status, kN * sizeof(uint32_t)));
  MKT_CHECK_CUDA(cudaMemset(status, 0xFF, kN * sizeof(uint32_t)));
  cudaStream_t s;
  MKT_CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const auto t0 = std::chrono::steady_clock::now();
  push_n_kernel<<<1, 1, 0, s>>>(ring.device(), kN, status);
  MKT_CHECK_CUDA(cudaGetLastError());
  const bool finished = mkt::wait_stream(s, 30s, name);
  const auto wall = std::chrono::steady_clock::now() - t0;
  uint32_t st[kN];
  MKT_CHECK_CUDA(cudaMemcpy(st, status, sizeof(st), cudaMemcpyDeviceToHost));
  const long long ms = std::chrono::duration_cast<std::chrono::milliseconds>(wall).count();
  std::printf("%-14s last push: %s after %lld ms\n", name, mp::ring_status_name(st[kN - 1]), ms);
  EXPECT(finished, "%s: kernel hung", name);
  EXPECT(wall < max_wall, "%s: took %lld ms", name, ms);
  for (uint32_t i = 0; i + 1 < kN; ++i) EXPECT(st[i] == mp::kRingOk, "%s: push %u: %u", name, i, st[i]);
  EXPECT(st[kN - 1] == want, "%s: got %s", name, mp::ring_status_name(st[kN - 1]));
  const mp::RingHeader* h = ring.host().header;
  EXPECT(h->client_error == want && h->client_pos == kN - 1,
         "%s: client error line %u at %llu", name, h->client_error,
         static_cast<unsigned long long>(h->client_pos));
  cudaStreamDestroy(s);
  cudaFree(status);
}

}  // namespace

int main() {
  mkt::require_hopper_or_skip("ring_push_gpu_test");
  for (int v : {kSingle, kWarp, kBatch}) exactly_once(v);
  bounded_wait("timeout", 20'000'000ull, nullptr, mp::kRingTimeout, 5000ms);
  bounded_wait("consumer-error", 10'000'000'000ull,
               [](mp::RingHeader* h) { h->error = 9; }, mp::kRingConsumerError, 5000ms);
  bounded_wait("epoch-changed", 10'000'000'000ull,
               [](mp::RingHeader* h) { h->epoch = 2; }, mp::kRingEpochChanged, 5000ms);
  std::printf("%s: %d failure(s)\n", failures == 0 ? "PASS" : "FAIL", failures);
  return failures == 0 ? 0 : 1;
}
