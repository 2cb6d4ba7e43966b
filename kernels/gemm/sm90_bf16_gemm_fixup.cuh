// sm90_bf16_gemm_fixup.cuh: the fix-up of a GEMM tile split among several work units (stream-K
// or split-K; common/tile_scheduler.cuh, notes 3 and 4). Included by sm90_bf16_gemm.cuh; device
// code only.
#pragma once

#include <cstdint>

#include "common/ptx.cuh"
#include "common/tile_scheduler.cuh"
#include "gemm/sm90_bf16_gemm_params.h"

namespace mkernel::kernels::detail {

// Atomic add with acquire-release semantics at gpu scope: releases what this thread (and, through
// the barrier before it, its block) stored, and acquires what earlier adders released.
__device__ __forceinline__ uint32_t atom_add_acq_rel_gpu(uint32_t* p, uint32_t v) {
  uint32_t old;
  asm volatile("atom.add.acq_rel.gpu.global.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}

enum FixupResult : uint32_t {
  kFixupStored = 0,  // this participant left its partial; another one finishes the tile
  kFixupLast = 1,    // this participant holds the sum of all partials: run the epilogue
};

// Adds four floats into global memory (no return value; sm_90 vector reduction).
__device__ __forceinline__ void red_add_v4_f32(float* p, float a, float b, float c, float d) {
  asm volatile("red.relaxed.gpu.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(p), "f"(a), "f"(b), "f"(c), "f"(d)
               : "memory");
}

// Run by the 256 consumer threads (384 with 192-row tiles) of a CTA after the main loop of their part of a split tile, in
// three steps:
//   1. leave the fp32 partial in the workspace: added into the tile's one accumulator (atomic
//      fix-up), or stored into this work item's own slot (deterministic, GemmParams::split_slots;
//      slot = unit + tile index in the stream-K region, distinct along the line);
//   2. take a ticket: thread 0, after a barrier, adds to the tile's counter with acquire-release
//      semantics (covering the block's stores) and hands the result to the others in words[0],
//      read between two barriers that thread 0 passes before writing it again;
//   3. the participant with the last ticket collects the sum: it reads the accumulator and zeroes
//      it for the next launch, or reads the tile's slots back in unit order (its own too: each
//      thread reads only what it stored), so any arrival order gives the same bits.
// Nobody waits for anybody. The partials are kept in fragment order (each thread's float4s
// contiguous across the 256 threads); a thread whose rows all lie past m moves nothing. The loop
// over the slots runs outside the unrolled fragment loop so the accumulator stays in registers
// (indexed inside a runtime loop it was spilled to local memory in every instantiation).
template <class T>
__device__ __forceinline__ FixupResult fixup(const GemmParams& p, const TileScheduler<T::kClusterM, T::kClusterN>& sched,
                                             const WorkItem& item, uint32_t m_block, uint32_t cta_rank,
                                             float (&acc)[T::kMSub][T::kConsumerN / 2], uint32_t ctid,
                                             volatile uint32_t* words) {
  constexpr uint32_t kTileFloats = T::kBlockM * T::kBlockN;
  constexpr uint32_t kThreads = T::kConsumerThreads;  // 256, or 384 with 192-row tiles
  constexpr uint32_t kSubFloats = kThreads / 2 * T::kBlockN;  // every consumer's sub-tile s
  const bool slots = p.split_slots != 0;
  const uint32_t parts = sched.participants(item.tile);
  const uint32_t index = sched.counter(item.tile) * T::kPairSize + cta_rank;
  // Slot i of the workspace for this CTA of the cluster: the atomic fix-up's accumulator is slot
  // `counter(tile)`, the deterministic one's slots are `unit + counter(tile)`.
  auto tile_floats = [&](uint32_t i) {
    return p.split_workspace + (static_cast<uint64_t>(i) * T::kPairSize + cta_rank) * kTileFloats;
  };
  auto slot = [&](uint32_t unit) { return tile_floats(unit + sched.counter(item.tile)); };
  float* const accumulator = tile_floats(sched.counter(item.tile));
  // Sub-tile s of consumer cw (ctid / 128) holds rows 128 s + 64 cw + ...: ctid / 32 * 16 covers
  // the consumer's 64-row offset and its warp's 16 rows.
  // (64-row tiles: both consumers hold the same 64 rows, each half of the columns.)
  auto live = [&](int s) {
    const uint32_t row = T::kBlockM == 64 ? ((ctid % 128) / 32) * 16 : (ctid / 32) * 16;
    return m_block * T::kBlockM + 128 * s + row + (ctid % 32) / 4 < p.m;
  };

  // 1. leave the partial
  float* const mine = slots ? slot(item.unit) : accumulator;
#pragma unroll
  for (int s = 0; s < T::kMSub; ++s) {
    if (!live(s)) continue;
#pragma unroll
    for (int i = 0; i < T::kConsumerN / 8; ++i) {
      float* dst = mine + s * kSubFloats + (i * kThreads + ctid) * 4;
      const float* a = acc[s];
      if (slots) {
        ptx::st_global_v4_f32(dst, a[4 * i], a[4 * i + 1], a[4 * i + 2], a[4 * i + 3]);
      } else {
        red_add_v4_f32(dst, a[4 * i], a[4 * i + 1], a[4 * i + 2], a[4 * i + 3]);
      }
    }
  }
  // 2. the ticket
  ptx::named_barrier_sync(1, kThreads);
  if (ctid == 0) {
    uint32_t* counter = p.split_counters + index;
    const bool last = atom_add_acq_rel_gpu(counter, 1u) == parts - 1;
    if (last) *counter = 0;  // every participant has arrived: zero for the next launch
    words[0] = last ? 1u : 0u;
  }
  ptx::named_barrier_sync(1, kThreads);
  if (words[0] == 0) return kFixupStored;
  // 3. collect: the accumulator (then zeroed) or the first slot, then the other slots in order
  const uint32_t first = sched.first_unit(item.tile);
#pragma unroll
  for (int s = 0; s < T::kMSub; ++s) {
    if (!live(s)) continue;
    float* src = (slots ? slot(first) : accumulator) + s * kSubFloats + ctid * 4;
#pragma unroll
    for (int i = 0; i < T::kConsumerN / 8; ++i) {
      const float4 x = ptx::ld_global_cg_v4_f32(src + i * kThreads * 4);
      acc[s][4 * i] = x.x;
      acc[s][4 * i + 1] = x.y;
      acc[s][4 * i + 2] = x.z;
      acc[s][4 * i + 3] = x.w;
    }
    if (!slots) {
#pragma unroll
      for (int i = 0; i < T::kConsumerN / 8; ++i) ptx::st_global_v4_f32(src + i * kThreads * 4, 0.f, 0.f, 0.f, 0.f);
      continue;
    }
    for (uint32_t u = 1; u < parts; ++u) {
      const float* part = slot(first + u) + s * kSubFloats + ctid * 4;
#pragma unroll
      for (int i = 0; i < T::kConsumerN / 8; ++i) {
        const float4 x = ptx::ld_global_cg_v4_f32(part + i * kThreads * 4);
        acc[s][4 * i] += x.x;
        acc[s][4 * i + 1] += x.y;
        acc[s][4 * i + 2] += x.z;
        acc[s][4 * i + 3] += x.w;
      }
    }
  }
  return kFixupLast;
}

}  // namespace mkernel::kernels::detail
