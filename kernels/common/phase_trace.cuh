// phase_trace.cuh: an opt-in per-block timeline of a persistent kernel's phases, for finding
// where a fused kernel's time goes without hardware counters.
//
// Off unless the translation unit defines MKERNEL_PHASE_TRACE before its includes: then every
// MK_TRACE_* below is a no-op and costs nothing. On, each block's thread records %globaltimer
// (or a value) into slot s of its row of a __device__ table (kTraceSlots words per block), and
// phase_trace::print (host) summarises the last launch's rows. Diagnostic builds only: the
// table belongs to the one translation unit that turned it on, which exports a function that
// calls print.
#pragma once

#include <cstdint>

#if defined(MKERNEL_PHASE_TRACE) && defined(__CUDACC__)
#include <cstdio>
#include <cstring>

#include "mkernel/protocol/sync.cuh"

namespace mkernel::kernels::phase_trace {

inline constexpr uint32_t kTraceBlocks = 1024;
inline constexpr uint32_t kTraceSlots = 16;
__device__ unsigned long long g_rows[kTraceBlocks][kTraceSlots];
__device__ unsigned int g_shape[2];  // the split between the two kinds of block, the grid

__device__ __forceinline__ void shape(uint32_t split) {
  if (blockIdx.x == 0) {
    g_shape[0] = split;
    g_shape[1] = gridDim.x;
  }
}

__device__ __forceinline__ void mark(uint32_t slot) {
  if (blockIdx.x < kTraceBlocks) g_rows[blockIdx.x][slot] = sync::globaltimer_ns();
}
__device__ __forceinline__ void set(uint32_t slot, unsigned long long v) {
  if (blockIdx.x < kTraceBlocks) g_rows[blockIdx.x][slot] = v;
}

// Host: prints, per slot, the minimum, mean and maximum over blocks [0, split) and [split, n)
// of the last launch's rows: times relative to the earliest slot-0 mark in microseconds, values
// (slots in mask0 / mask1 of the two parts) as they are. No printf in device code: a call in the
// kernel makes ptxas serialize its wgmma pipeline (C7510).
inline void print(uint32_t mask0, uint32_t mask1, const char* name0, const char* name1) {
  static unsigned long long rows[kTraceBlocks][kTraceSlots];
  unsigned int sh[2] = {0, 0};
  if (cudaMemcpyFromSymbol(sh, g_shape, sizeof(sh)) != cudaSuccess ||
      cudaMemcpyFromSymbol(rows, g_rows, sizeof(rows)) != cudaSuccess) {
    std::printf("trace: cannot read the table\n");
    return;
  }
  const uint32_t split = sh[0], n = sh[1] < kTraceBlocks ? sh[1] : kTraceBlocks;
  std::printf("trace: %u blocks, %u of the first kind\n", n, split);
  unsigned long long t0 = ~0ull;
  for (uint32_t b = 0; b < n; ++b)
    if (rows[b][0] != 0 && rows[b][0] < t0) t0 = rows[b][0];
  for (int part = 0; part < 2; ++part) {
    const uint32_t lo = part == 0 ? 0 : split, hi = part == 0 ? (split < n ? split : n) : n;
    for (uint32_t s = 0; s < kTraceSlots && lo < hi; ++s) {
      const bool value = (((part == 0 ? mask0 : mask1) >> s) & 1u) != 0;
      double mn = 1e300, mx = -1e300, sum = 0;
      uint32_t cnt = 0;
      for (uint32_t b = lo; b < hi; ++b) {
        const unsigned long long r = rows[b][s];
        if (r == 0) continue;
        const double v = value ? static_cast<double>(r) : (r >= t0 ? static_cast<double>(r - t0) * 1e-3 : -1.0);
        mn = v < mn ? v : mn;
        mx = v > mx ? v : mx;
        sum += v;
        ++cnt;
      }
      if (cnt != 0)
        std::printf("trace %s slot %u: n %u min %.1f mean %.1f max %.1f%s\n", part == 0 ? name0 : name1, s, cnt, mn,
                    sum / cnt, mx, value ? "" : " us");
    }
  }
  std::memset(rows, 0, sizeof(rows));
  (void)cudaMemcpyToSymbol(g_rows, rows, sizeof(rows));
}

}  // namespace mkernel::kernels::phase_trace

#define MK_TRACE_MARK(slot) ::mkernel::kernels::phase_trace::mark(slot)
#define MK_TRACE_SET(slot, v) ::mkernel::kernels::phase_trace::set(slot, v)
#define MK_TRACE_SHAPE(split) ::mkernel::kernels::phase_trace::shape(split)
#else
#define MK_TRACE_MARK(slot) ((void)0)
#define MK_TRACE_SET(slot, v) ((void)0)
#define MK_TRACE_SHAPE(split) ((void)0)
#endif
