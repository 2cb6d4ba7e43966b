// attention_test_util.cuh: shared by the attention test and benchmark. Random bf16 fills (a
// counter-based hash, so each run draws fresh values from a new seed), NaN poison fills, an fp32
// reference attention on the GPU (one block per query row, every score kept in shared memory),
// and error norms computed on the host in double.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace attn_test {

#define AT_CUDA(call)                                                                                    \
  do {                                                                                                   \
    cudaError_t e_ = (call);                                                                             \
    if (e_ != cudaSuccess) {                                                                             \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                                                      \
    }                                                                                                    \
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
  AT_CUDA(cudaGetDeviceProperties(&prop, 0));
  if (prop.major != 9) {
    std::printf("SKIPPED %s: device 0 is %s (sm_%d%d), the kernels need Hopper (sm_90a)\n", prog, prop.name, prop.major,
                prop.minor);
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

// Uniform in [-scale, scale).
__global__ void fill_random_kernel(__nv_bfloat16* p, size_t n, uint64_t seed, float scale) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const uint64_t h = mix64(seed * 0x9e3779b97f4a7c15ull + i);
    const float u = static_cast<float>(h >> 40) * (1.0f / 16777216.0f);
    p[i] = __float2bfloat16((2.0f * u - 1.0f) * scale);
  }
}

template <class T>
__global__ void fill_bits_kernel(T* p, size_t n, T v) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    p[i] = v;
  }
}

inline void fill_random(__nv_bfloat16* p, size_t n, uint64_t seed, float scale = 1.0f, cudaStream_t s = 0) {
  fill_random_kernel<<<1024, 256, 0, s>>>(p, n, seed, scale);
  AT_CUDA(cudaGetLastError());
}

// NaN everywhere (bf16 0xFFFF, fp32 0xFFFFFFFF): whatever the kernel fails to write stays NaN.
inline void poison(__nv_bfloat16* p, size_t n, cudaStream_t s = 0) {
  fill_bits_kernel<<<1024, 256, 0, s>>>(reinterpret_cast<uint16_t*>(p), n, uint16_t{0xFFFF});
  AT_CUDA(cudaGetLastError());
}
inline void poison(float* p, size_t n, cudaStream_t s = 0) {
  fill_bits_kernel<<<1024, 256, 0, s>>>(reinterpret_cast<uint32_t*>(p), n, 0xFFFFFFFFu);
  AT_CUDA(cudaGetLastError());
}

struct Strides {
  int64_t b, h, s;  // elements; head_dim contiguous
};

// ref_o: fp32 [B, Hq, Sq, D] packed; ref_lse: [B, Hq, Sq]. Query row i sees key j iff !causal or
// j <= i + causal_offset. Rows that see no key: O = 0, lse = -inf.
__global__ void reference_attention_kernel(const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v,
                                           float* ref_o, float* ref_lse, int hq, int hkv, int sq, int skv, int d,
                                           Strides qs, Strides ks, Strides vs, bool causal, int64_t causal_offset,
                                           float scale) {
  extern __shared__ float sh[];
  float* qrow = sh;          // d
  float* scores = sh + 128;  // skv
  __shared__ float red[32];
  const int i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int hk = h / (hq / hkv);
  const __nv_bfloat16* qp = q + b * qs.b + h * qs.h + static_cast<int64_t>(i) * qs.s;
  for (int t = threadIdx.x; t < d; t += blockDim.x) qrow[t] = __bfloat162float(qp[t]);
  __syncthreads();
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < skv; j += blockDim.x) {
    float s = -INFINITY;
    if (!causal || j <= i + causal_offset) {
      const __nv_bfloat16* kp = k + b * ks.b + hk * ks.h + static_cast<int64_t>(j) * ks.s;
      float acc = 0.0f;
      for (int t = 0; t < d; ++t) acc = fmaf(qrow[t], __bfloat162float(kp[t]), acc);
      s = acc * scale;
    }
    scores[j] = s;
    mx = fmaxf(mx, s);
  }
  for (int o = 16; o > 0; o /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = mx;
  __syncthreads();
  mx = -INFINITY;
  for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) mx = fmaxf(mx, red[w]);
  __syncthreads();
  float sum = 0.0f;
  for (int j = threadIdx.x; j < skv; j += blockDim.x) {
    const float p = mx == -INFINITY ? 0.0f : expf(scores[j] - mx);
    scores[j] = p;
    sum += p;
  }
  for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = sum;
  __syncthreads();
  sum = 0.0f;
  for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) sum += red[w];
  const int64_t row = (static_cast<int64_t>(b) * hq + h) * sq + i;
  for (int t = threadIdx.x; t < d; t += blockDim.x) {
    float acc = 0.0f;
    // Not unrolled. Unrolled (CUDA 13.0, -O3), this loop faulted with "misaligned address" at
    // skv = 6, and compute-sanitizer named a 12-byte shared read on the line below: the source
    // reads 4-byte floats, so the wide access is the compiler's merge of the unrolled loads.
#pragma unroll 1
    for (int j = 0; j < skv; ++j) {
      if (scores[j] == 0.0f) continue;
      acc = fmaf(scores[j], __bfloat162float(v[b * vs.b + hk * vs.h + static_cast<int64_t>(j) * vs.s + t]), acc);
    }
    ref_o[row * d + t] = sum > 0.0f ? acc / sum : 0.0f;
  }
  if (threadIdx.x == 0) ref_lse[row] = sum > 0.0f ? mx + logf(sum) : -INFINITY;
}

// On stream s, which must be the stream that wrote q, k and v: a rank of a multi-rank test runs
// on its own non-blocking stream, which the legacy default stream does not wait for (a reference
// launched there once read V while the stream's fill was still writing it; docs/kernels.md,
// ring attention).
inline void reference_attention(const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v, float* ref_o,
                                float* ref_lse, int b, int hq, int hkv, int sq, int skv, int d, Strides qs, Strides ks,
                                Strides vs, bool causal, int64_t causal_offset, float scale, cudaStream_t s = 0) {
  const size_t smem = (128 + static_cast<size_t>(skv)) * sizeof(float);
  if (smem > 48 * 1024) {
    AT_CUDA(cudaFuncSetAttribute(reference_attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 static_cast<int>(smem)));
  }
  reference_attention_kernel<<<dim3(sq, hq, b), 128, smem, s>>>(q, k, v, ref_o, ref_lse, hq, hkv, sq, skv, d, qs, ks, vs,
                                                             causal, causal_offset, scale);
  AT_CUDA(cudaGetLastError());
}

struct ErrorStats {
  double rel_fro = 0;     // ||out - ref||_F / ||ref||_F
  double max_abs = 0;     // max |out - ref|
  size_t non_finite = 0;  // NaN/Inf in out where ref is finite (unwritten elements are NaN)
  size_t mismatched_inf = 0;
  size_t first_bad = SIZE_MAX;
};

inline ErrorStats compare(const std::vector<float>& out, const std::vector<float>& ref) {
  ErrorStats s;
  double num = 0, den = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const double o = out[i], r = ref[i];
    if (std::isinf(r) || std::isinf(o)) {  // lse of a row with no visible key: both -inf
      if (!(std::isinf(r) && std::isinf(o) && (r < 0) == (o < 0))) {
        if (s.mismatched_inf++ == 0 && s.first_bad == SIZE_MAX) s.first_bad = i;
      }
      continue;
    }
    if (!std::isfinite(o)) {
      if (s.non_finite++ == 0 && s.first_bad == SIZE_MAX) s.first_bad = i;
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

inline std::vector<float> to_host(const float* d, size_t n) {
  std::vector<float> f(n);
  AT_CUDA(cudaMemcpy(f.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
  return f;
}

// The O of a [B, H, S, D] tensor with the given strides, gathered into packed fp32 order.
inline std::vector<float> gather_bf16(const __nv_bfloat16* d, size_t alloc_elems, int b, int h, int s, int dim,
                                      Strides st) {
  std::vector<__nv_bfloat16> raw(alloc_elems);
  AT_CUDA(cudaMemcpy(raw.data(), d, alloc_elems * sizeof(__nv_bfloat16), cudaMemcpyDeviceToHost));
  std::vector<float> out(static_cast<size_t>(b) * h * s * dim);
  size_t idx = 0;
  for (int bi = 0; bi < b; ++bi)
    for (int hi = 0; hi < h; ++hi)
      for (int si = 0; si < s; ++si)
        for (int di = 0; di < dim; ++di)
          out[idx++] = __bfloat162float(raw[bi * st.b + hi * st.h + static_cast<int64_t>(si) * st.s + di]);
  return out;
}

}  // namespace attn_test
