// poll_bench.cu: do blocks that wait slow a block that works? One block of a full grid (one
// block per SM) works: it copies 64 MiB, does 32,768 fenced atomics on counters, walks a chain
// of 2,000 dependent loads and raises a flag 500 times behind a system-scope fence; every other
// block's thread 0 polls, in the way the variant names, until the working block is done. The
// table gives the median time of each part over 6 launches (after one warm-up) per variant.
// Written to test whether the fused MoE's waiting threads cost its working blocks their time
// (kernels.md section 14); on one H100 they did not.
//
//   poll_bench            (no arguments; exits non-zero with the cause on a CUDA error)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "mkernel/protocol/sync.cuh"

namespace {

namespace sync = mkernel::sync;

enum Variant : int {
  kNone,          // no pollers
  kAcqSys,        // ld.acquire.sys of one word, sleep doubling to 256 ns (wait.cuh's fast path)
  kAcqGpu,        // ld.acquire.gpu, likewise
  kRelaxedGpu,    // ld.relaxed.gpu, likewise
  kAcqSysGrowing, // ld.acquire.sys, the sleep growing to 1/8 of the wait, 8 us at most
  kAcqSysOwnLine, // ld.acquire.sys, each poller its own 128-byte line
  kAcqSysTimer,   // ld.acquire.sys and a %globaltimer read per poll
  kAcqSysCtr,     // ld.acquire.sys on the lines of the working block's counters
  kTimerWarps,    // only %globaltimer reads, lane 0 of every warp of the polling blocks
  kHost50us,      // ld.acquire.sys, and two host-memory words every 50 us (wait.cuh's failure check)
  kHostEvery,     // ld.acquire.sys, and two host-memory words every poll
  kHostGated,     // as kHost50us, but one look per 50 us for the whole grid (wait.cuh note 8's gate)
  kCount
};
const char* const kNames[kCount] = {"no pollers",        "acquire.sys",         "acquire.gpu",
                                    "relaxed.gpu",       "acquire.sys, growing", "acquire.sys, own line",
                                    "acquire.sys + timer", "acquire.sys on counters", "timer, every warp",
                                    "+ host words / 50 us", "+ host words / poll",
                                    "+ host words, gated"};

using sync::ld_acquire_gpu;
using sync::ld_acquire_sys;
__device__ __forceinline__ uint64_t timer() { return sync::globaltimer_ns(); }
// Not in sync.cuh (no kernel of ours polls relaxed): the weakest poll, for comparison.
__device__ __forceinline__ uint64_t ld_relaxed_gpu(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

struct Args {
  int variant;
  uint64_t* flags;       // flags[0]: done; flags[16 * b]: block b's own line
  const uint32_t* host;  // mapped host memory
  const uint4* src;
  uint4* dst;
  size_t n16;
  unsigned* counters;
  const uint32_t* chain;
  unsigned long long* out;  // the working block's four times, ns
  unsigned long long* gate; // kHostGated: the time from which the next look is due
};

__device__ void work(const Args& a) {
  __syncthreads();
  const uint64_t t0 = timer();
  for (size_t i = threadIdx.x; i < a.n16; i += blockDim.x) a.dst[i] = a.src[i];
  __syncthreads();
  const uint64_t t1 = timer();
  for (int r = threadIdx.x; r < 32768; r += blockDim.x) {
    __threadfence();
    atomicAdd(a.counters + r / 128, 1u);
  }
  __syncthreads();
  const uint64_t t2 = timer();
  uint32_t x = 0;
  if (threadIdx.x == 0)
    for (int i = 0; i < 2000; ++i) x = __ldcg(a.chain + x);
  __syncthreads();
  const uint64_t t3 = timer();
  if (threadIdx.x == 0)
    for (int i = 0; i < 500; ++i) {
      a.counters[4000] = i + x;
      asm volatile("fence.acq_rel.sys;" ::: "memory");
    }
  __syncthreads();
  const uint64_t t4 = timer();
  if (threadIdx.x == 0) {
    a.out[0] = t1 - t0;
    a.out[1] = t2 - t1;
    a.out[2] = t3 - t2;
    a.out[3] = t4 - t3;
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(a.flags), "l"(1ull) : "memory");
    for (uint32_t b = 1; b < gridDim.x; ++b)
      asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(a.flags + 16 * b), "l"(1ull) : "memory");
  }
}

__device__ void poll(const Args& a) {
  const int v = a.variant;
  if (v == kTimerWarps) {
    if (threadIdx.x % 32 != 0) return;
    uint32_t sleep = 16;
    for (uint32_t i = 0;; ++i) {
      volatile uint64_t t = timer();
      (void)t;
      if ((i & 63) == 0 && ld_relaxed_gpu(a.flags) >= 1) return;
      __nanosleep(sleep);
      sleep = sleep * 2 <= 256 ? sleep * 2 : 256;
    }
  }
  if (threadIdx.x != 0) return;
  const uint64_t* flag = v == kAcqSysOwnLine ? a.flags + 16 * blockIdx.x
                         : v == kAcqSysCtr   ? reinterpret_cast<const uint64_t*>(a.counters) + 16 * (blockIdx.x % 16)
                                             : a.flags;
  const uint64_t start = timer();
  uint64_t next_host = start + 50'000;
  uint32_t sleep = 16;
  for (uint32_t i = 0;; ++i) {
    const uint64_t f = v == kAcqGpu       ? ld_acquire_gpu(reinterpret_cast<const unsigned long long*>(flag))
                       : v == kRelaxedGpu ? ld_relaxed_gpu(flag)
                                          : ld_acquire_sys(flag);
    if (v == kAcqSysCtr ? ((i & 15) == 0 && ld_relaxed_gpu(a.flags) >= 1) : f >= 1) return;
    __nanosleep(sleep);
    uint32_t cap = 256;
    if (v == kAcqSysGrowing) {
      const uint64_t g = (timer() - start) >> 3;
      cap = g < 256 ? 256 : (g > 8192 ? 8192 : static_cast<uint32_t>(g));
    }
    if (v == kAcqSysTimer) {
      volatile uint64_t t = timer();
      (void)t;
    }
    if (v == kHostGated && timer() >= next_host) {
      next_host = timer() + 50'000;
      const unsigned long long now = timer(), due = *reinterpret_cast<volatile unsigned long long*>(a.gate);
      if (now >= due && atomicCAS(a.gate, due, now + 50'000) == due &&
          ld_acquire_sys(a.host) + ld_acquire_sys(a.host + 32) == 77u)
        return;
    }
    if (v == kHostEvery || (v == kHost50us && timer() >= next_host)) {
      next_host = timer() + 50'000;
      if (ld_acquire_sys(a.host) + ld_acquire_sys(a.host + 32) == 77u) return;  // never: the words are 0
    }
    sleep = sleep * 2 <= cap ? sleep * 2 : cap;
  }
}

__global__ void poll_bench_kernel(Args a) {
  if (blockIdx.x == 0) work(a);
  else if (a.variant != kNone) poll(a);
}

bool check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "poll_bench: %s failed: %s\n", what, cudaGetErrorString(e));
  return false;
}

}  // namespace

int main() {
  int sms = 0;
  if (!check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "reading the SM count")) return 1;
  constexpr size_t kBytes = size_t{64} << 20;
  constexpr uint32_t kChain = 1u << 22;
  constexpr int kSmem = 150 * 1024;  // one block per SM
  Args a{};
  uint32_t* host = nullptr;
  std::vector<uint32_t> chain(kChain);
  for (uint32_t i = 0; i < kChain; ++i) chain[i] = static_cast<uint32_t>((i * 2654435761ull + 12345) % kChain);
  if (!check(cudaMalloc(&a.src, kBytes), "cudaMalloc") || !check(cudaMalloc(&a.dst, kBytes), "cudaMalloc") ||
      !check(cudaMalloc(&a.flags, size_t{16} * 8 * 1024), "cudaMalloc") ||
      !check(cudaMalloc(&a.counters, 8 * 4096), "cudaMalloc") || !check(cudaMalloc(&a.out, 64), "cudaMalloc") ||
      !check(cudaMalloc(&a.gate, 8), "cudaMalloc") ||
      !check(cudaMalloc(const_cast<uint32_t**>(&a.chain), kChain * 4), "cudaMalloc") ||
      !check(cudaMemcpy(const_cast<uint32_t*>(a.chain), chain.data(), kChain * 4, cudaMemcpyHostToDevice), "cudaMemcpy") ||
      !check(cudaMemset(const_cast<uint4*>(a.src), 1, kBytes), "cudaMemset") ||
      !check(cudaHostAlloc(&host, 4096, cudaHostAllocMapped), "cudaHostAlloc") ||
      !check(cudaMemset(a.counters, 0, 8 * 4096), "cudaMemset"))
    return 1;
  std::fill(host, host + 1024, 0u);
  uint32_t* dev_host = nullptr;
  if (!check(cudaHostGetDevicePointer(&dev_host, host, 0), "cudaHostGetDevicePointer")) return 1;
  a.host = dev_host;
  a.n16 = kBytes / 16;
  if (!check(cudaFuncSetAttribute(poll_bench_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem),
             "cudaFuncSetAttribute"))
    return 1;
  std::printf("poll_bench: %d blocks, block 0 works, %d poll; medians of 6 launches, us\n", sms, sms - 1);
  std::printf("%-24s %10s %10s %10s %12s\n", "pollers", "copy", "atomics", "chain", "sys fences");
  for (int v = 0; v < kCount; ++v) {
    std::vector<double> t[4];
    for (int it = 0; it < 7; ++it) {
      a.variant = v;
      if (!check(cudaMemset(a.flags, 0, size_t{16} * 8 * 1024), "cudaMemset") ||
          !check(cudaMemset(a.gate, 0, 8), "cudaMemset"))
        return 1;
      poll_bench_kernel<<<sms, 256, kSmem>>>(a);
      if (!check(cudaGetLastError(), "the launch") || !check(cudaDeviceSynchronize(), "the kernel")) return 1;
      unsigned long long r[4];
      if (!check(cudaMemcpy(r, a.out, sizeof(r), cudaMemcpyDeviceToHost), "cudaMemcpy")) return 1;
      if (it > 0)
        for (int q = 0; q < 4; ++q) t[q].push_back(static_cast<double>(r[q]) * 1e-3);
    }
    std::printf("%-24s", kNames[v]);
    for (int q = 0; q < 4; ++q) {
      std::sort(t[q].begin(), t[q].end());
      std::printf(q == 3 ? " %12.1f" : " %10.1f", t[q][t[q].size() / 2]);
    }
    std::printf("\n");
  }
  return 0;
}
