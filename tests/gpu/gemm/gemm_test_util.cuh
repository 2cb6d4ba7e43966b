// gemm_test_util.cuh: shared by the GEMM test and benchmark. Random bf16 fills (a counter-based
// hash, so every run can draw fresh values from a new seed), a NaN poison fill, an fp32
// reference GEMM, cuBLAS in the same layout, and error norms computed on the host in double.
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace gemm_test {

#define GT_CUDA(call)                                                                           \
  do {                                                                                           \
    cudaError_t e_ = (call);                                                                     \
    if (e_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)

#define GT_CUBLAS(call)                                                                          \
  do {                                                                                           \
    cublasStatus_t s_ = (call);                                                                  \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                           \
      std::fprintf(stderr, "%s:%d: %s failed: status %d\n", __FILE__, __LINE__, #call, static_cast<int>(s_)); \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)

// Exit code 77 (ctest: skipped) with a reason when there is no usable GPU.
inline void require_hopper_or_skip(const char* prog) {
  // Line-buffered: a test ended by its time bound still shows the case it was in.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("SKIPPED %s: no CUDA device\n", prog);
    std::exit(77);
  }
  cudaDeviceProp prop{};
  GT_CUDA(cudaGetDeviceProperties(&prop, 0));
  if (prop.major != 9) {
    std::printf("SKIPPED %s: device 0 is %s (sm_%d%d), the kernels need Hopper (sm_90a)\n", prog, prop.name,
                prop.major, prop.minor);
    std::exit(77);
  }
}

__device__ __forceinline__ uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

// Uniform in [-scale, scale), never all zeros.
__global__ void fill_random_kernel(__nv_bfloat16* p, size_t n, uint64_t seed, float scale) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const uint64_t h = mix64(seed * 0x9e3779b97f4a7c15ull + i);
    const float u = static_cast<float>(h >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    p[i] = __float2bfloat16((2.0f * u - 1.0f) * scale);
  }
}

__global__ void fill_u16_kernel(uint16_t* p, size_t n, uint16_t v) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    p[i] = v;
  }
}

inline void fill_random(__nv_bfloat16* p, size_t n, uint64_t seed, float scale = 1.0f, cudaStream_t s = 0) {
  fill_random_kernel<<<1024, 256, 0, s>>>(p, n, seed, scale);
  GT_CUDA(cudaGetLastError());
}

// 0xFFFF is a bf16 NaN: any element the GEMM fails to write stays NaN and fails the check.
inline void poison(__nv_bfloat16* p, size_t n, cudaStream_t s = 0) {
  fill_u16_kernel<<<1024, 256, 0, s>>>(reinterpret_cast<uint16_t*>(p), n, 0xFFFF);
  GT_CUDA(cudaGetLastError());
}

// ref[m, n] = sum_k A[m, k] * W[n, k] in fp32 (64 x 64 tiles, 4 x 4 outputs per thread).
__global__ void reference_gemm_kernel(const __nv_bfloat16* a, const __nv_bfloat16* w, float* ref, int m, int n,
                                      int k) {
  __shared__ float as[16][64 + 1];
  __shared__ float ws[16][64 + 1];
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int row0 = blockIdx.y * 64, col0 = blockIdx.x * 64;
  float acc[4][4] = {};
  for (int k0 = 0; k0 < k; k0 += 16) {
    for (int i = threadIdx.x; i < 64 * 16; i += 256) {
      const int r = i / 16, kk = i % 16;
      const int gk = k0 + kk;
      as[kk][r] = (row0 + r < m && gk < k) ? __bfloat162float(a[static_cast<size_t>(row0 + r) * k + gk]) : 0.f;
      ws[kk][r] = (col0 + r < n && gk < k) ? __bfloat162float(w[static_cast<size_t>(col0 + r) * k + gk]) : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < 16; ++kk) {
      float av[4], wv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        av[i] = as[kk][ty * 4 + i];
        wv[i] = ws[kk][tx * 4 + i];
      }
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(av[i], wv[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int r = row0 + ty * 4 + i, c = col0 + tx * 4 + j;
      if (r < m && c < n) ref[static_cast<size_t>(r) * n + c] = acc[i][j];
    }
}

inline void reference_gemm(const __nv_bfloat16* a, const __nv_bfloat16* w, float* ref, int m, int n, int k,
                           cudaStream_t s = 0) {
  dim3 grid((n + 63) / 64, (m + 63) / 64);
  reference_gemm_kernel<<<grid, 256, 0, s>>>(a, w, ref, m, n, k);
  GT_CUDA(cudaGetLastError());
}

// D[m, n] = A[m, k] * W[n, k]^T through cuBLAS: in column-major terms D^T = W^T' * A^T, i.e.
// op(W) = T on the [k, n] column-major view of W.
inline void cublas_gemm(cublasHandle_t h, const __nv_bfloat16* a, const __nv_bfloat16* w, __nv_bfloat16* d, int m,
                        int n, int k) {
  const float alpha = 1.f, beta = 0.f;
  GT_CUBLAS(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, w, CUDA_R_16BF, k, a, CUDA_R_16BF, k, &beta,
                         d, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

struct ErrorStats {
  double rel_fro = 0;     // ||out - ref||_F / ||ref||_F
  double max_abs = 0;     // max |out - ref|
  size_t non_finite = 0;  // NaN/Inf in out (unwritten elements are NaN)
  size_t first_bad = SIZE_MAX;
};

inline std::vector<float> to_host_float(const __nv_bfloat16* d, size_t n) {
  std::vector<__nv_bfloat16> h(n);
  GT_CUDA(cudaMemcpy(h.data(), d, n * sizeof(__nv_bfloat16), cudaMemcpyDeviceToHost));
  std::vector<float> f(n);
  for (size_t i = 0; i < n; ++i) f[i] = __bfloat162float(h[i]);
  return f;
}

inline std::vector<float> to_host(const float* d, size_t n) {
  std::vector<float> f(n);
  GT_CUDA(cudaMemcpy(f.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
  return f;
}

inline ErrorStats compare(const std::vector<float>& out, const std::vector<float>& ref) {
  ErrorStats s;
  double num = 0, den = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const double o = out[i], r = ref[i];
    if (!std::isfinite(o)) {
      if (s.non_finite++ == 0) s.first_bad = i;
      continue;
    }
    const double e = o - r;
    num += e * e;
    den += r * r;
    if (std::fabs(e) > s.max_abs) s.max_abs = std::fabs(e);
  }
  s.rel_fro = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  return s;
}

// Captures `calls` calls of call() (each returning true when it enqueued its work) on `stream`
// into a CUDA graph and instantiates it in *out (the benchmarks' --graph timing). Returns an
// empty string, or what failed.
template <class F>
std::string capture_calls(cudaStream_t stream, int calls, F&& call, cudaGraphExec_t* out) {
  *out = nullptr;
  if (cudaError_t e = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal); e != cudaSuccess)
    return std::string("cudaStreamBeginCapture: ") + cudaGetErrorString(e);
  bool ok = true;
  for (int i = 0; i < calls && ok; ++i) ok = call();
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(stream, &graph);
  if (!ok || end != cudaSuccess) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    return !ok ? std::string("a call failed while captured") : std::string("cudaStreamEndCapture: ") + cudaGetErrorString(end);
  }
  const cudaError_t inst = cudaGraphInstantiate(out, graph, 0);
  cudaGraphDestroy(graph);
  if (inst != cudaSuccess) {
    *out = nullptr;
    return std::string("cudaGraphInstantiate: ") + cudaGetErrorString(inst);
  }
  return {};
}

}  // namespace gemm_test
