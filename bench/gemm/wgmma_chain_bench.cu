// wgmma_chain_bench.cu: how long a k block of wgmma takes a consumer warpgroup of the persistent
// GEMM when its only limit is the instruction chain (operands already in shared memory, no
// loads, no barriers), per width N and per number of independent accumulator chains.
//
//   wgmma_chain_bench [--iters N]
//
// One block of two warpgroups (the GEMM's two consumers; they share the SM's tensor cores as in
// the kernel) per SM, every SM busy. Each warpgroup repeats a k block of 64: four
// wgmma.m64nNk16 (k slices 0..3), commit, wait until at most one group is pending, as the
// GEMM's main loop does. "chains" says how many accumulators the four k slices alternate
// between: with 1 every instruction of a k block depends on the one before it (the GEMM's loop
// today); with 2 or 4 consecutive instructions are independent. The table gives cycles per k
// block and per warpgroup, and the tensor rate it implies for the SM; a k block whose cycles do
// not shrink with N is bound by the chain's latency, not by the MMAs.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/wgmma.cuh"

namespace {

#define CHECK_CUDA(x)                                                                                   \
  do {                                                                                                  \
    const cudaError_t e_ = (x);                                                                         \
    if (e_ != cudaSuccess) {                                                                            \
      std::fprintf(stderr, "wgmma_chain_bench: %s failed: %s (%s:%d)\n", #x, cudaGetErrorString(e_), \
                   __FILE__, __LINE__);                                                                 \
      std::exit(1);                                                                                     \
    }                                                                                                   \
  } while (0)

constexpr int kBlockK = 64;
constexpr int kABytes = 64 * kBlockK * 2;       // one consumer's 64 rows of a k block
constexpr int kBMaxBytes = 256 * kBlockK * 2;   // the widest B tile
constexpr int kSmemBytes = 2 * kABytes + kBMaxBytes + 1024;

template <int kN, int kChains, int kPending>
__global__ void __launch_bounds__(256, 1) chain_kernel(int iters, long long* cycles, float* sink) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  // Any bf16 bits that are finite numbers: small integers' patterns.
  for (int i = threadIdx.x; i < (2 * kABytes + kBMaxBytes) / 4; i += blockDim.x)
    reinterpret_cast<uint32_t*>(smem)[i] = 0x3c003c00u + (i % 7);
  __syncthreads();
  const int wg = threadIdx.x / 128;
  uint8_t* a = smem + wg * kABytes;
  uint8_t* b = smem + 2 * kABytes;
  float acc[kChains][kN / 2];
#pragma unroll
  for (int c = 0; c < kChains; ++c)
#pragma unroll
    for (int i = 0; i < kN / 2; ++i) acc[c][i] = 0.0f;
  const uint64_t da = mkernel::ptx::make_desc_k_major_sw128(a);
  const uint64_t db = mkernel::ptx::make_desc_k_major_sw128(b);
  long long t0 = 0;
  for (int it = -8; it < iters; ++it) {
    if (it == 0) {
      mkernel::ptx::wgmma_wait<0>();
      t0 = clock64();
    }
    mkernel::ptx::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBlockK / 16; ++kk) {
      mkernel::ptx::wgmma_m64k16<kN>(acc[kk % kChains], mkernel::ptx::advance_desc(da, kk * 32),
                                     mkernel::ptx::advance_desc(db, kk * 32), 1u);
    }
    mkernel::ptx::wgmma_commit();
    mkernel::ptx::wgmma_wait<kPending>();
  }
  mkernel::ptx::wgmma_wait<0>();
  const long long t1 = clock64();
  float s = 0.0f;
#pragma unroll
  for (int c = 0; c < kChains; ++c)
#pragma unroll
    for (int i = 0; i < kN / 2; ++i) {
      mkernel::ptx::reg_fence(acc[c][i]);
      s += acc[c][i];
    }
  if (threadIdx.x % 128 == 0) cycles[blockIdx.x * 2 + wg] = t1 - t0;
  if (s == 12345.0f) sink[threadIdx.x] = s;  // keeps the accumulators alive
}

struct Row {
  int n, chains, pending;
  double cycles_per_kblock;
  double tflops;
};

template <int kN, int kChains, int kPending>
Row run(int sms, int iters, long long* d_cycles, float* d_sink) {
  auto k = chain_kernel<kN, kChains, kPending>;
  CHECK_CUDA(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  cudaEvent_t e0, e1;
  CHECK_CUDA(cudaEventCreate(&e0));
  CHECK_CUDA(cudaEventCreate(&e1));
  k<<<sms, 256, kSmemBytes>>>(iters / 4, d_cycles, d_sink);  // warm-up
  CHECK_CUDA(cudaEventRecord(e0));
  k<<<sms, 256, kSmemBytes>>>(iters, d_cycles, d_sink);
  CHECK_CUDA(cudaEventRecord(e1));
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaDeviceSynchronize());
  float ms = 0;
  CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
  std::vector<long long> cyc(2 * sms);
  CHECK_CUDA(cudaMemcpy(cyc.data(), d_cycles, cyc.size() * sizeof(long long), cudaMemcpyDeviceToHost));
  std::sort(cyc.begin(), cyc.end());
  const double med = static_cast<double>(cyc[cyc.size() / 2]) / iters;
  const double flops = 2.0 * 2 * 64 * kN * kBlockK * static_cast<double>(iters) * sms;  // two warpgroups
  CHECK_CUDA(cudaEventDestroy(e0));
  CHECK_CUDA(cudaEventDestroy(e1));
  return Row{kN, kChains, kPending, med, flops / (ms * 1e-3) / 1e12};
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 20000;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--iters") == 0 && i + 1 < argc) {
      iters = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "wgmma_chain_bench: unknown argument '%s' (expected --iters N)\n", argv[i]);
      return 2;
    }
  }
  if (iters < 100) {
    std::fprintf(stderr, "wgmma_chain_bench: --iters %d is too few (at least 100)\n", iters);
    return 2;
  }
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  if (prop.major != 9) {
    std::fprintf(stderr, "wgmma_chain_bench: device 0 is sm_%d%d; wgmma needs sm_90a\n", prop.major, prop.minor);
    return 1;
  }
  long long* d_cycles = nullptr;
  float* d_sink = nullptr;
  CHECK_CUDA(cudaMalloc(&d_cycles, 2 * prop.multiProcessorCount * sizeof(long long)));
  CHECK_CUDA(cudaMalloc(&d_sink, 256 * sizeof(float)));
  const int sms = prop.multiProcessorCount;
  std::vector<Row> rows;
  rows.push_back(run<16, 1, 1>(sms, iters, d_cycles, d_sink));
  rows.push_back(run<16, 2, 1>(sms, iters, d_cycles, d_sink));
  rows.push_back(run<16, 4, 1>(sms, iters, d_cycles, d_sink));
  rows.push_back(run<16, 1, 0>(sms, iters, d_cycles, d_sink));
  rows.push_back(run<32, 1, 1>(sms, iters, d_cycles, d_sink));
  rows.push_back(run<32, 2, 1>(sms, iters, d_cycles, d_sink));
  rows.push_back(run<32, 4, 1>(sms, iters, d_cycles, d_sink));
  rows.push_back(run<64, 1, 1>(sms, iters, d_cycles, d_sink));
  rows.push_back(run<64, 2, 1>(sms, iters, d_cycles, d_sink));
  rows.push_back(run<64, 4, 1>(sms, iters, d_cycles, d_sink));
  rows.push_back(run<128, 1, 1>(sms, iters, d_cycles, d_sink));
  rows.push_back(run<128, 2, 1>(sms, iters, d_cycles, d_sink));
  rows.push_back(run<256, 1, 1>(sms, iters, d_cycles, d_sink));
  rows.push_back(run<256, 1, 0>(sms, iters, d_cycles, d_sink));
  std::printf("wgmma k blocks (4 x m64nNk16, two warpgroups per SM, %d SMs, %d k blocks each)\n", sms, iters);
  std::printf("%6s %7s %8s %18s %12s\n", "N", "chains", "pending", "cycles/k block/wg", "TFLOP/s");
  for (const Row& r : rows)
    std::printf("%6d %7d %8d %18.1f %12.1f\n", r.n, r.chains, r.pending, r.cycles_per_kblock, r.tflops);
  cudaFree(d_cycles);
  cudaFree(d_sink);
  return 0;
}
