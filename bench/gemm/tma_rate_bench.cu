// tma_rate_bench.cu: how many bytes per cycle an SM pulls into shared memory when it loads a
// GEMM's operand tiles and does nothing else (no MMA), as a function of how many SMs do it at
// once, the tile, the cluster multicast, the stage count and the load path (TMA boxes or
// 16-byte cp.async by 128 threads).
//
//   tma_rate_bench [--iters N] [--shape MxNxK] [--only NAME]
//
// Each CTA takes one output tile (m block, n block) of an M x N x K problem and walks its k
// blocks of 64 through a ring of stages exactly as the GEMM's producer does: wait for the stage
// to be free, arm its full barrier, issue the loads. One consumer thread waits for each stage
// to complete and hands it straight back (to both CTAs of a pair with multicast). So the time
// per k block is the load path's alone. "req" counts the bytes each SM asks L2 for (a
// multicast half once), "got" the bytes that land in its shared memory. Operands are re-read
// launch after launch (they fit in L2 on the default shapes): the rate is L2 -> SM.
//
// The question it answers (docs/kernels.md section 7, "The load path"): is the
// ~30 B/clk per SM the GEMM's mid-size tiles reach a per-SM limit of the load path (then more
// SMs do not lower it, and a second path may add to it) or a shared one (then fewer SMs each get
// more)?
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/l2_promotion.h"
#include "common/ptx.cuh"

namespace {

#define CHECK_CUDA(x)                                                                                  \
  do {                                                                                                 \
    const cudaError_t e_ = (x);                                                                        \
    if (e_ != cudaSuccess) {                                                                           \
      std::fprintf(stderr, "tma_rate_bench: %s failed: %s (%s:%d)\n", #x, cudaGetErrorString(e_),     \
                   __FILE__, __LINE__);                                                                \
      std::exit(1);                                                                                    \
    }                                                                                                  \
  } while (0)

namespace ptx = mkernel::ptx;

constexpr int kBlockK = 64;                 // bf16 columns per k block: one 128-byte swizzle row
constexpr int kRowBytes = kBlockK * 2;
constexpr int kMaxSmem = 227 * 1024;
constexpr uint64_t kSpinLimit = 1ull << 26;  // try_waits before a wait counts as hung

struct Params {
  int m, n, k;
  int m_blocks, n_blocks, k_blocks;
  int bm, bn;        // tile rows of A and of W
  int stages;
  int cluster;       // 1, or 2: CTAs of an m pair share the W tile (each loads half, multicast)
  int a_lsu, w_lsu;  // load that operand with cp.async instead of TMA
  int a_boxes;       // TMA boxes per A tile (1: bm rows; 2: two of bm / 2)
  int a_hint, w_hint;  // L2 eviction policy of the operand's TMA loads: 0 none, 1 first, 2 last
  int kbox;            // k blocks per TMA load and stage (1, or 2 through a 3-D view of the operand)
  int hold;            // cycles the consumer holds each k block (its MMAs' time), 0: none; then each
                       // stage is handed back one step late, as the GEMM's consumers do
  const __nv_bfloat16* a;
  const __nv_bfloat16* w;
  long long* cycles;  // per CTA: first full stage -> last full stage
  unsigned* error;    // nonzero: a wait ran past kSpinLimit
};

__device__ __forceinline__ bool wait_parity(uint64_t* bar, uint32_t parity, unsigned* error) {
  for (uint64_t i = 0; i < kSpinLimit; ++i)
    if (ptx::mbar_try_wait(bar, parity)) return true;
  atomicExch(error, 1u);
  return false;
}

// TMA load with an L2 eviction policy (createpolicy: 1 evict_first, 2 evict_last).
__device__ __forceinline__ uint64_t l2_policy(int hint) {
  uint64_t pol = 0;
  if (hint == 1) {
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  } else {
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
  }
  return pol;
}

__device__ __forceinline__ void tma_load_hint(void* dst, const void* map, uint64_t* bar, int32_t c0, int32_t c1,
                                              uint64_t pol) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%3, %4}], [%2], %5;" ::"r"(ptx::smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(ptx::smem_addr(bar)), "r"(c0), "r"(c1), "l"(pol)
      : "memory");
}

// Two k blocks of `rows` rows in one load: the operand seen as [k / 64][rows][64] (3-D map,
// box {64, rows, 2}), landing as two swizzled slabs one after the other.
__device__ __forceinline__ void tma_load_3d(void* dst, const void* map, uint64_t* bar, int32_t row, int32_t kb) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5}], [%2];" ::"r"(ptx::smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(ptx::smem_addr(bar)), "r"(0), "r"(row), "r"(kb)
      : "memory");
}

__device__ __forceinline__ void tma_load_3d_multicast(void* dst, const void* map, uint64_t* bar, int32_t row,
                                                      int32_t kb, uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%3, %4, %5}], [%2], %6;" ::"r"(ptx::smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(ptx::smem_addr(bar)), "r"(0), "r"(row), "r"(kb), "h"(mask)
      : "memory");
}

__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}

__device__ __forceinline__ void cp_async_arrive_noinc(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(ptx::smem_addr(bar)) : "memory");
}

// 16-byte pieces of `rows` rows (clamped to the operand's last row) of k block kb, spread over
// the 128 producer threads.
__device__ __forceinline__ void lsu_load(uint8_t* dst, const __nv_bfloat16* src, int row0, int rows, int limit,
                                         int k, int kb, int tid) {
  const int pieces = rows * (kRowBytes / 16);
  for (int p = tid; p < pieces; p += 128) {
    const int r = p / (kRowBytes / 16), c = p % (kRowBytes / 16);
    const int row = min(row0 + r, limit - 1);
    cp_async_16(ptx::smem_addr(dst + r * kRowBytes + c * 16), src + static_cast<size_t>(row) * k + kb * kBlockK + c * 8);
  }
}

__global__ void __launch_bounds__(256, 1) rate_kernel(const __grid_constant__ CUtensorMap map_a,
                                                      const __grid_constant__ CUtensorMap map_w,
                                                      const __grid_constant__ CUtensorMap map_w_half, Params p) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  const int a_bytes = p.bm * kRowBytes * p.kbox, w_bytes = p.bn * kRowBytes * p.kbox;
  const int k_steps = (p.k_blocks + p.kbox - 1) / p.kbox;  // stages filled, kbox k blocks each
  uint8_t* sa = smem;
  uint8_t* sw = smem + p.stages * a_bytes;
  uint64_t* full = reinterpret_cast<uint64_t*>(sw + p.stages * w_bytes);
  uint64_t* empty = full + p.stages;

  const uint32_t rank = p.cluster == 2 ? ptx::cluster_cta_rank() : 0;
  // Tile: clusters walk m pairs fastest.
  const int pair_rows = (p.m_blocks + p.cluster - 1) / p.cluster;
  const int c = blockIdx.x / p.cluster;
  const int mb = (c % pair_rows) * p.cluster + static_cast<int>(rank);
  const int nb = c / pair_rows;
  const bool lsu = p.a_lsu || p.w_lsu;
  const int tid = threadIdx.x;

  if (tid == 0) {
    for (int s = 0; s < p.stages; ++s) {
      ptx::mbar_init(&full[s], 1 + (lsu ? 128 : 0));
      ptx::mbar_init(&empty[s], p.cluster);
    }
    ptx::fence_mbar_init();
  }
  if (p.cluster == 2) {
    ptx::cluster_sync();
  } else {
    __syncthreads();
  }

  if (tid < 128) {
    // Producer.
    int tma_bytes = (p.a_lsu ? 0 : a_bytes) + (p.w_lsu ? 0 : w_bytes);
    for (int kb = 0; kb < k_steps; ++kb) {
      const int s = kb % p.stages;
      const uint32_t ph = (kb / p.stages) & 1;
      if ((tid == 0 || lsu) && !wait_parity(&empty[s], ph ^ 1, p.error)) break;
      uint8_t* da = sa + s * a_bytes;
      uint8_t* dw = sw + s * w_bytes;
      if (tid == 0) {
        ptx::mbar_arrive_expect_tx(&full[s], static_cast<uint32_t>(tma_bytes));
        if (p.kbox == 2) {
          tma_load_3d(da, &map_a, &full[s], mb * p.bm, 2 * kb);
          if (p.cluster == 1) {
            tma_load_3d(dw, &map_w, &full[s], nb * p.bn, 2 * kb);
          } else {
            // Each CTA loads half of the rows of both k blocks (as [2][bn / 2][64]: a rate
            // measurement, not the layout an MMA would read) into its half of the stage.
            tma_load_3d_multicast(dw + rank * (w_bytes / 2), &map_w_half, &full[s],
                                  nb * p.bn + static_cast<int>(rank) * (p.bn / 2), 2 * kb, 0b11);
          }
        } else if (!p.a_lsu) {
          if (p.a_hint != 0) {
            tma_load_hint(da, &map_a, &full[s], kb * kBlockK, mb * p.bm, l2_policy(p.a_hint));
          } else if (p.a_boxes == 1) {
            ptx::tma_load_2d(da, &map_a, &full[s], kb * kBlockK, mb * p.bm);
          } else {
            ptx::tma_load_2d(da, &map_a, &full[s], kb * kBlockK, mb * p.bm);
            ptx::tma_load_2d(da + a_bytes / 2, &map_a, &full[s], kb * kBlockK, mb * p.bm + p.bm / 2);
          }
        }
        if (!p.w_lsu && p.kbox == 1) {
          if (p.cluster == 1 && p.w_hint != 0) {
            tma_load_hint(dw, &map_w, &full[s], kb * kBlockK, nb * p.bn, l2_policy(p.w_hint));
          } else if (p.cluster == 1) {
            ptx::tma_load_2d(dw, &map_w, &full[s], kb * kBlockK, nb * p.bn);
          } else {
            ptx::tma_load_2d_multicast(dw + rank * (w_bytes / 2), &map_w_half, &full[s], kb * kBlockK,
                                       nb * p.bn + static_cast<int>(rank) * (p.bn / 2), 0b11);
          }
        }
      }
      if (lsu) {
        if (p.a_lsu) lsu_load(da, p.a, mb * p.bm, p.bm, p.m, p.k, kb, tid);
        if (p.w_lsu) lsu_load(dw, p.w, nb * p.bn, p.bn, p.n, p.k, kb, tid);
        cp_async_arrive_noinc(&full[s]);
      }
    }
  } else if (tid == 128) {
    // Consumer: each stage straight back; or (hold) kept for the k blocks' MMA time and handed
    // back once the next stage has arrived (the GEMM keeps one k block of wgmma in flight).
    long long t0 = 0;
    auto release = [&](int s) {
      if (p.cluster == 1) {
        ptx::mbar_arrive(&empty[s]);
      } else {
        ptx::mbar_arrive_cluster(&empty[s], 0);
        ptx::mbar_arrive_cluster(&empty[s], 1);
      }
    };
    int prev = -1;
    for (int kb = 0; kb < k_steps; ++kb) {
      const int s = kb % p.stages;
      const uint32_t ph = (kb / p.stages) & 1;
      if (!wait_parity(&full[s], ph, p.error)) break;
      if (kb == 0) t0 = clock64();
      if (p.hold == 0) {
        release(s);
        continue;
      }
      if (prev >= 0) release(prev);
      const long long h0 = clock64();
      while (clock64() - h0 < static_cast<long long>(p.hold) * p.kbox) {
      }
      prev = s;
    }
    if (prev >= 0) release(prev);
    p.cycles[blockIdx.x] = clock64() - t0;
  }
  if (p.cluster == 2) {
    ptx::cluster_sync();
  } else {
    __syncthreads();
  }
}

CUtensorMap make_map(const void* ptr, int rows, int k, int box_rows, int promote, int kbox = 1) {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      std::fprintf(stderr, "tma_rate_bench: cuTensorMapEncodeTiled is not available from the driver\n");
      std::exit(1);
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  CUtensorMap map{};
  // kbox 2: [k / 64][rows][64] (k-block stride 128 bytes, row stride k * 2), boxes {64, rows, 2}.
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(kbox == 1 ? k : kBlockK), static_cast<cuuint64_t>(rows),
                              static_cast<cuuint64_t>((k + kBlockK - 1) / kBlockK)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(k) * 2, static_cast<cuuint64_t>(kRowBytes)};
  const cuuint32_t box[3] = {kBlockK, static_cast<cuuint32_t>(box_rows), 2};
  const cuuint32_t es[3] = {1, 1, 1};
  const CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, kbox == 1 ? 2 : 3, const_cast<void*>(ptr), dims,
                            strides, box, es,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            mkernel::kernels::tensor_map_l2_promotion(promote),
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    std::fprintf(stderr,
                 "tma_rate_bench: cuTensorMapEncodeTiled failed with CUresult %d (rows %d, k %d, box %d, k blocks per "
                 "box %d)\n",
                 static_cast<int>(r), rows, k, box_rows, kbox);
    std::exit(1);
  }
  return map;
}

struct Case {
  std::string name;
  int m, n, k;
  int bn = 128, stages = 6, cluster = 1, ctas = 0;  // ctas 0: every tile, at most one per SM
  int a_lsu = 0, w_lsu = 0, a_boxes = 1, promote = 256;
  int a_hint = 0, w_hint = 0;
  int kbox = 1;  // k blocks per load and stage
  int hold = 0;  // the consumer's cycles per k block (0: stages straight back)
};

struct Result {
  double req_per_clk, got_per_clk, agg_req_tbs, us, mhz;
  int ctas;
};

Result run_case(const Case& cs, int sms, int iters, const __nv_bfloat16* a, const __nv_bfloat16* w,
                long long* d_cycles, unsigned* d_error) {
  Params p{};
  p.m = cs.m;
  p.n = cs.n;
  p.k = cs.k;
  p.bm = 128;
  p.bn = cs.bn;
  p.m_blocks = (cs.m + p.bm - 1) / p.bm;
  p.n_blocks = (cs.n + p.bn - 1) / p.bn;
  p.k_blocks = (cs.k + kBlockK - 1) / kBlockK;
  p.stages = cs.stages;
  p.cluster = cs.cluster;
  p.a_lsu = cs.a_lsu;
  p.w_lsu = cs.w_lsu;
  p.a_boxes = cs.a_boxes;
  p.a_hint = cs.a_hint;
  p.w_hint = cs.w_hint;
  p.kbox = cs.kbox;
  p.hold = cs.hold;
  p.a = a;
  p.w = w;
  p.cycles = d_cycles;
  p.error = d_error;
  const int pair_rows = (p.m_blocks + p.cluster - 1) / p.cluster;
  int ctas = pair_rows * p.cluster * p.n_blocks;
  int cap = cs.ctas > 0 ? cs.ctas : sms;
  cap -= cap % p.cluster;
  ctas = std::min(ctas, cap);
  const CUtensorMap ma = make_map(a, cs.m, cs.k, cs.a_boxes == 1 ? p.bm : p.bm / 2, cs.promote, cs.kbox);
  const CUtensorMap mw = make_map(w, cs.n, cs.k, p.bn, cs.promote, cs.kbox);
  const CUtensorMap mwh = make_map(w, cs.n, cs.k, p.bn / 2, cs.promote, cs.kbox);
  const int smem = p.stages * (p.bm + p.bn) * kRowBytes * cs.kbox + 2 * p.stages * 8 + 1024;
  if (smem > kMaxSmem) {
    std::fprintf(stderr, "tma_rate_bench: case %s needs %d bytes of shared memory (at most %d)\n", cs.name.c_str(),
                 smem, kMaxSmem);
    std::exit(1);
  }
  CHECK_CUDA(cudaFuncSetAttribute(rate_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  CHECK_CUDA(cudaFuncSetAttribute(rate_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(ctas);
  cfg.blockDim = dim3(256);
  cfg.dynamicSmemBytes = smem;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = p.cluster;
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  cudaEvent_t e0, e1;
  CHECK_CUDA(cudaEventCreate(&e0));
  CHECK_CUDA(cudaEventCreate(&e1));
  std::vector<float> times;
  for (int it = -3; it < iters; ++it) {
    CHECK_CUDA(cudaEventRecord(e0));
    CHECK_CUDA(cudaLaunchKernelEx(&cfg, rate_kernel, ma, mw, mwh, p));
    CHECK_CUDA(cudaEventRecord(e1));
    CHECK_CUDA(cudaEventSynchronize(e1));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
    if (it >= 0) times.push_back(ms);
  }
  unsigned err = 0;
  CHECK_CUDA(cudaMemcpy(&err, d_error, sizeof(err), cudaMemcpyDeviceToHost));
  if (err != 0) {
    std::fprintf(stderr, "tma_rate_bench: case %s: a barrier wait ran past its bound (a hang)\n", cs.name.c_str());
    std::exit(1);
  }
  std::vector<long long> cyc(ctas);
  CHECK_CUDA(cudaMemcpy(cyc.data(), d_cycles, ctas * sizeof(long long), cudaMemcpyDeviceToHost));
  std::sort(cyc.begin(), cyc.end());
  std::sort(times.begin(), times.end());
  const double med_cyc = static_cast<double>(cyc[ctas / 2]);
  const double us = times[times.size() / 2] * 1e3;
  const double a_b = 128.0 * kRowBytes, w_b = p.bn * kRowBytes;
  // The clock starts at the first full stage; a stage holds kbox k blocks (the last may be past k:
  // its bytes still arrive, zero-filled).
  const int timed = ((p.k_blocks + cs.kbox - 1) / cs.kbox - 1) * cs.kbox;
  const double req = (a_b + w_b / p.cluster) * timed;
  const double got = (a_b + w_b) * timed;
  const double all_req = (a_b + w_b / p.cluster) * (timed + cs.kbox) * ctas;
  CHECK_CUDA(cudaEventDestroy(e0));
  CHECK_CUDA(cudaEventDestroy(e1));
  return Result{req / med_cyc, got / med_cyc, all_req / (us * 1e-6) / 1e12, us, 0.0, ctas};
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 20;
  std::string only;
  int M = 764, N = 2296, K = 4120;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--iters") == 0 && i + 1 < argc) {
      iters = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--only") == 0 && i + 1 < argc) {
      only = argv[++i];
    } else if (std::strcmp(argv[i], "--shape") == 0 && i + 1 < argc) {
      if (std::sscanf(argv[++i], "%dx%dx%d", &M, &N, &K) != 3 || M < 1 || N < 256 || K < 128 || K % 8 != 0) {
        std::fprintf(stderr, "tma_rate_bench: --shape '%s': expected MxNxK with N >= 256, K >= 128, K %% 8 == 0\n",
                     argv[i]);
        return 2;
      }
    } else {
      std::fprintf(stderr, "tma_rate_bench: unknown argument '%s' (expected --iters N, --shape MxNxK, --only NAME)\n",
                   argv[i]);
      return 2;
    }
  }
  if (iters < 3) {
    std::fprintf(stderr, "tma_rate_bench: --iters %d is too few (at least 3)\n", iters);
    return 2;
  }
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  if (prop.major != 9) {
    std::fprintf(stderr, "tma_rate_bench: device 0 is sm_%d%d; this needs sm_90a\n", prop.major, prop.minor);
    return 1;
  }
  const int sms = prop.multiProcessorCount;
  int clock_khz = 0;
  CHECK_CUDA(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  // Operands sized for the largest case; random bits that are finite bf16 numbers.
  const int maxm = std::max(M, 1056), maxn = std::max(N, 2304);
  const size_t a_elems = static_cast<size_t>(maxm) * K, w_elems = static_cast<size_t>(maxn) * K;
  __nv_bfloat16 *a = nullptr, *w = nullptr;
  CHECK_CUDA(cudaMalloc(&a, a_elems * 2));
  CHECK_CUDA(cudaMalloc(&w, w_elems * 2));
  {
    std::vector<uint16_t> h(std::max(a_elems, w_elems));
    uint32_t x = 2463534242u;
    for (auto& v : h) {
      x ^= x << 13;
      x ^= x >> 17;
      x ^= x << 5;
      v = static_cast<uint16_t>(0x3c00u + (x & 0x3ffu));
    }
    CHECK_CUDA(cudaMemcpy(a, h.data(), a_elems * 2, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(w, h.data(), w_elems * 2, cudaMemcpyHostToDevice));
  }
  long long* d_cycles = nullptr;
  unsigned* d_error = nullptr;
  CHECK_CUDA(cudaMalloc(&d_cycles, 1024 * sizeof(long long)));
  CHECK_CUDA(cudaMalloc(&d_error, sizeof(unsigned)));
  CHECK_CUDA(cudaMemset(d_error, 0, sizeof(unsigned)));

  std::vector<Case> cases;
  auto add = [&](Case c) { cases.push_back(c); };
  // The shape's own tiles (128 x 128 in clusters of 1: the GEMM's choice on 764x2296x4120), every
  // tile at most one per SM; then every SM busy on a shape 8 m blocks tall.
  const int M8 = 1056, N8 = std::max(N, 2304);
  for (int pr : {256, 128, 0}) {
    const std::string t = "_p" + std::to_string(pr);
    Case c{"c1_n128" + t, M, N, K};
    c.promote = pr;
    add(c);
    c.ctas = 1;
    c.name = "c1_n128_1cta" + t;
    add(c);
    c.ctas = 32;
    c.name = "c1_n128_32cta" + t;
    add(c);
    Case d{"c2_n128" + t, M, N, K, 128, 6, 2};
    d.promote = pr;
    add(d);
    Case e{"c2_n256" + t, M, N, K, 256, 4, 2};
    e.promote = pr;
    add(e);
    Case f{"all_c1_n128" + t, M8, N8, K};
    f.promote = pr;
    add(f);
    Case g{"all_c2_n128" + t, M8, N8, K, 128, 6, 2};
    g.promote = pr;
    add(g);
    Case h{"all_c2_n256" + t, M8, N8, K, 256, 4, 2};
    h.promote = pr;
    add(h);
  }
  for (int ah : {0, 1, 2})
    for (int wh : {0, 1, 2}) {
      if (ah == 0 && wh == 0) continue;
      Case c{"c1_n128_hint" + std::to_string(ah) + std::to_string(wh), M, N, K};
      c.a_hint = ah;
      c.w_hint = wh;
      add(c);
      c.name = "all_c1_n128_hint" + std::to_string(ah) + std::to_string(wh);
      c.m = M8;
      c.n = N8;
      add(c);
    }
  add({"c1_n128_abox2", M, N, K, 128, 6, 1, 0, 0, 0, 2});
  {
    // Bytes in flight against loads issued: two A boxes on one SM; 3 stages of one k block (half
    // the bytes in flight); 3 stages of two k blocks each (the same bytes in flight as 6 stages,
    // half the loads), alone, on 108 SMs and on all, in clusters of 1 and 2 (128-byte promotion).
    Case c{"c1_n128_1cta_abox2", M, N, K, 128, 6, 1, 1, 0, 0, 2};
    c.promote = 128;
    add(c);
    for (int kbox : {1, 2}) {
      const std::string t = kbox == 1 ? "_s3" : "_kb2";
      Case d{"c1_n128_1cta" + t, M, N, K, 128, 3, 1, 1};
      d.promote = 128;
      d.kbox = kbox;
      add(d);
      d.ctas = 0;
      d.name = "c1_n128" + t;
      add(d);
      d.name = "all_c1_n128" + t;
      d.m = M8;
      d.n = N8;
      add(d);
      Case e{"c2_n128" + t, M, N, K, 128, 3, 2};
      e.promote = 128;
      e.kbox = kbox;
      add(e);
      Case f{std::string("c1_n256_1cta") + (kbox == 1 ? "_s4" : "_kb2"), M, N, K, 256, kbox == 1 ? 4 : 2, 1, 1};  // 192 KB in flight
      f.promote = 128;
      f.kbox = kbox;
      add(f);
    }
    // With the MMA's time held per k block (512 cycles for 128 x 128, 1024 for 128 x 256) and
    // stages handed back one step late: does a load of two k blocks still pay when the ring
    // turns over at the GEMM's pace? Ideal time: k blocks x hold.
    for (int kbox : {1, 2}) {
      const std::string t = kbox == 1 ? "_h" : "_kb2_h";
      for (int ctas : {1, 0}) {
        Case c{"c1_n128" + std::string(ctas == 1 ? "_1cta" : "") + t, M, N, K, 128, 6 / kbox, 1, ctas};
        c.promote = 128;
        c.kbox = kbox;
        c.hold = 512;
        add(c);
        Case d{"c2_n256" + std::string(ctas == 1 ? "_1cta" : "") + t, M, N, K, 256, 4 / kbox, 2, ctas == 1 ? 2 : 0};
        d.promote = 128;
        d.kbox = kbox;
        d.hold = 1024;
        add(d);
      }
      Case e{"all_c1_n128" + t, M8, N8, K, 128, 6 / kbox, 1};
      e.promote = 128;
      e.kbox = kbox;
      e.hold = 512;
      add(e);
      Case f{"all_c2_n128" + t, M8, N8, K, 128, 6 / kbox, 2};
      f.promote = 128;
      f.kbox = kbox;
      f.hold = 512;
      add(f);
      Case g{"all_c2_n256" + t, M8, N8, K, 256, 4 / kbox, 2};
      g.promote = 128;
      g.kbox = kbox;
      g.hold = 1024;
      add(g);
    }
  }
  add({"c1_n128_wlsu", M, N, K, 128, 6, 1, 0, 0, 1});
  add({"c1_n128_alsu", M, N, K, 128, 6, 1, 0, 1, 0});
  add({"all_c1_n128_wlsu", M8, N8, K, 128, 6, 1, 0, 0, 1});
  add({"all_c1_n128_alsu", M8, N8, K, 128, 6, 1, 0, 1, 0});

  std::printf("tma_rate_bench: %s, %d SMs, %d MHz max clock, shape %dx%dx%d, median of %d launches\n", prop.name,
              sms, clock_khz / 1000, M, N, K, iters);
  std::printf("%-22s %5s %8s %10s %10s %12s\n", "case", "ctas", "us", "req B/clk", "got B/clk", "req TB/s all");
  for (const Case& c : cases) {
    if (!only.empty() && c.name.find(only) == std::string::npos) continue;
    const Result r = run_case(c, sms, iters, a, w, d_cycles, d_error);
    std::printf("%-22s %5d %8.1f %10.1f %10.1f %12.2f\n", c.name.c_str(), r.ctas, r.us, r.req_per_clk, r.got_per_clk,
                r.agg_req_tbs);
  }
  CHECK_CUDA(cudaFree(a));
  CHECK_CUDA(cudaFree(w));
  CHECK_CUDA(cudaFree(d_cycles));
  CHECK_CUDA(cudaFree(d_error));
  return 0;
}
