// sm90_attention.cuh: the attention core for Hopper (sm_90a): forward attention, bf16 Q/K/V,
// fp32 softmax state, bf16 O and fp32 log-sum-exp.
//
//   O[b, h, i, :] = sum_j softmax_j(scale * Q[b, h, i, :] . K[b, h / group, j, :]) V[b, h / group, j, :]
//
// Block = 3 warpgroups (384 threads), one block per SM, grid = persistent: the producer decides
// which units (128-row query tiles) the block takes and announces them to the consumers
// (sm90_attention_params.h note 1: head-major, cost-sorted or dynamic).
//   warpgroup 0    producer: one thread issues the TMA loads of a unit's Q tile (128 rows) and of
//                  its K and V blocks (BLOCK_N rows each) into kStages-deep rings, K and V with
//                  their own full/empty mbarriers, in the order the consumers use them:
//                  Q, K[n-1], K[n-2], V[n-1], K[n-3], V[n-2], ..., V[0].
//   warpgroups 1,2 consumers: each owns 64 query rows of the tile. Per key block:
//                    S  = Q K^T       wgmma m64nBLOCK_Nk16, Q and K from shared memory;
//                    P  = exp(S - m)  online softmax in fp32 registers (exp2 of one FFMA);
//                    O += P V         wgmma m64nDk16, P from registers (the accumulator fragment
//                                     of S packed to bf16 *is* the A fragment), V from shared
//                                     memory N-major (imm-trans-b), as TMA loaded it.
//                  Two overlaps hide the softmax behind the tensor cores:
//                    within a warpgroup (FlashAttention-3's intra-warpgroup pipelining): the
//                    S product of block j+1 is issued before the P V product of block j, and the
//                    softmax of block j+1 runs while P V of block j is still in flight;
//                    between the two warpgroups (ping-pong, kPingPong): named barriers make them
//                    issue their products in turn, so one warpgroup's softmax runs while the
//                    other's products occupy the tensor cores.
//                  Masking is applied only to key blocks that cross the causal diagonal or the
//                  end of the keys; the other blocks run the unmasked path.
//   epilogue       O / l, and either the bf16 output (through shared memory and a TMA store, which
//                  drains while the next unit starts) with the lse, or the fp32 running state of a
//                  multi-chunk (ring) computation, merged in fp32 (params note 3).
//
// The role contract for a fused kernel (the ring) that runs the core inside its own persistent
// kernel: it lays out AttnSmem<T> in its blocks' shared memory, calls init() from one thread and
// synchronises the block, then
//   producer thread:  for every unit it takes, chunk by chunk: announce(p, smem, state, unit, chunk)
//                     then produce(p, chunk, q_map, k_map, v_map, unit, smem, state); at the end
//                     announce(..., kAttnNoUnit, 0). Which units, in which order, is its choice
//                     (the ring: a static order, the same units for the block in every chunk,
//                     params note 4; AttnScheduler is the standalone op's). Before the units of a
//                     chunk it may wait (bounded, wait_geq) for the chunk to arrive, and on failure
//                     call state.fail(): the pipeline then runs through with no data (every
//                     barrier still completes, nothing hangs) and the status word holds the cause;
//   consumer threads: consumer_begin(wg), then while receive(...) gives a unit:
//                     consume(p, chunk, o_map, unit, smem, state, wg, tid); then consumer_end(tid).
// The consumers follow the producer's announcements; nothing else is shared between them.
// Named barriers 1..4 are the core's (epilogue of each consumer, ping-pong of each consumer).
#pragma once

#include <cuda.h>

#include <cstdint>

#include "attention/sm90_attention_params.h"
#include "attention/sm90_attention_wgmma.cuh"
#include "common/ptx.cuh"
#include "common/status.h"
#include "common/wait.cuh"
#include "common/wgmma.cuh"

namespace mkernel::kernels {

template <int kHeadDim_, int kBlockN_, int kStages_, bool kPingPong_>
struct Sm90AttnTraits {
  static constexpr int kBlockM = 128;  // two consumers x 64 rows
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kStages = kStages_;
  static constexpr bool kPingPong = kPingPong_;
  static constexpr int kNumConsumers = 2;
  static constexpr int kThreads = 128 * (1 + kNumConsumers);
  static constexpr int kProducerRegs = 40;
  static constexpr int kConsumerRegs = 232;
  // Every tile is stored as 64-column slices (64 bf16 = one 128-byte swizzle row), 8-row atoms
  // of 1024 bytes stacked along the rows: what TMA's 128-byte swizzle writes and wgmma reads.
  static constexpr int kSlices = kHeadDim / 64;
  static constexpr uint32_t kQSliceBytes = kBlockM * 128;
  static constexpr uint32_t kQBytes = kSlices * kQSliceBytes;
  static constexpr uint32_t kKVSliceBytes = kBlockN * 128;
  static constexpr uint32_t kKVBytes = kSlices * kKVSliceBytes;  // one stage of K (or of V)
  static constexpr uint32_t kOChunkBytes = 64 * 128;               // 64 rows x 64 columns, bf16
  static constexpr uint32_t kOBytes = kNumConsumers * kSlices * kOChunkBytes;
  static constexpr uint32_t kQOffset = 0;
  static constexpr uint32_t kKOffset = kQOffset + kQBytes;
  static constexpr uint32_t kVOffset = kKOffset + kStages * kKVBytes;
  static constexpr uint32_t kOOffset = kVOffset + kStages * kKVBytes;
  static constexpr uint32_t kBarOffset = kOOffset + kOBytes;
  // q full/empty; k, v full/empty per stage; the schedule channel's two slots full/empty.
  static constexpr uint32_t kNumBars = 2 + 4 * kStages + 4;
  static constexpr uint32_t kSlotOffset = kBarOffset + kNumBars * 8;  // two slots {unit, chunk}
  static constexpr uint32_t kSmemBytes = 1024 + kSlotOffset + 2 * 8;
  // Named barriers (0 is __syncthreads).
  static constexpr uint32_t kBarEpilogue = 1;  // + consumer index, 128 threads
  static constexpr uint32_t kBarSched = 3;     // + consumer index, 256 threads (ping-pong)

  static_assert(kHeadDim == 64 || kHeadDim == 128, "head dim 64 or 128");
  static_assert(kBlockN % 16 == 0 && kBlockN >= 64 && kBlockN <= 192, "BLOCK_N: 64..192, a multiple of 16");
  static_assert(kKVSliceBytes % 1024 == 0, "stages must stay 1024-byte aligned (swizzle atoms)");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory over the 227 KB a block may use");
  static_assert(kProducerRegs * 128 + kConsumerRegs * 128 * kNumConsumers <= 65536, "register budget");
};

// The schedule (params note 1). Host and device.
struct AttnUnit {
  uint32_t b, h, m_block;
};
// Where unit u is.
inline constexpr uint32_t kAttnNoUnit = 0xFFFFFFFFu;
inline constexpr uint32_t kAttnDynamicBand = 2;  // heads per band of kAttnDynamic
MK_KERNEL_HD inline AttnUnit attn_unit(const AttnParams& p, uint32_t u) {
  uint32_t bh, i;
  if (p.unit_order == kAttnCostSnake) {
    const uint32_t num_bh = p.batch * p.heads_q;
    bh = u % num_bh;
    i = u / num_bh;
  } else if (p.unit_order == kAttnDynamic) {
    const uint32_t num_bh = p.batch * p.heads_q;
    const uint32_t band = u / (kAttnDynamicBand * p.num_m_blocks);
    const uint32_t first = band * kAttnDynamicBand;
    const uint32_t width = num_bh - first < kAttnDynamicBand ? num_bh - first : kAttnDynamicBand;
    const uint32_t r = u - band * kAttnDynamicBand * p.num_m_blocks;
    bh = first + r % width;
    i = r / width;
  } else {
    bh = u / p.num_m_blocks;
    i = u % p.num_m_blocks;
  }
  return AttnUnit{bh / p.heads_q, bh % p.heads_q, p.num_m_blocks - 1 - i};
}
// Rounds of the persistent loop: in round k, block `block` of `grid` takes unit
// attn_unit_index(p, k, block, grid) when that is below p.num_units.
MK_KERNEL_HD inline uint32_t attn_num_rounds(const AttnParams& p, uint32_t grid) {
  return (p.num_units + grid - 1) / grid;
}
MK_KERNEL_HD inline uint32_t attn_unit_index(const AttnParams& p, uint32_t k, uint32_t block, uint32_t grid) {
  const bool back = p.unit_order == kAttnCostSnake && (k & 1u) != 0;
  return k * grid + (back ? grid - 1 - block : block);
}

#if defined(__CUDACC__)

namespace attn {

__device__ __forceinline__ void named_barrier_arrive(uint32_t id, uint32_t num_threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(num_threads) : "memory");
}

__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ void reg_fence_u32(uint32_t& r) { asm volatile("" : "+r"(r)::"memory"); }

// Shared-memory descriptor of an N-major (here: V, head dim contiguous) operand with 128-byte
// swizzle: 64-column slices `slice_bytes` apart (leading byte offset), 8-row groups along K
// 1024 bytes apart (stride byte offset). PTX ISA, "Matrix Descriptor Format": for MN-major
// swizzled layouts the leading offset steps between swizzle-width groups along MN, the stride
// offset between 8-row groups along K.
__device__ __forceinline__ uint64_t make_desc_mn_major_sw128(const void* tile, uint32_t slice_bytes, bool swap) {
  const uint32_t addr = ptx::smem_addr(tile);
  const uint32_t lbo = swap ? 1024u : slice_bytes;
  const uint32_t sbo = swap ? slice_bytes : 1024u;
  uint64_t desc = 0;
  desc |= static_cast<uint64_t>((addr & 0x3FFFF) >> 4);
  desc |= static_cast<uint64_t>((lbo & 0x3FFFF) >> 4) << 16;
  desc |= static_cast<uint64_t>((sbo & 0x3FFFF) >> 4) << 32;
  desc |= static_cast<uint64_t>(1) << 62;  // 128-byte swizzle
  return desc;
}

__device__ __forceinline__ void tma_load_4d(void* dst, const CUtensorMap* map, uint64_t* bar, int32_t c0, int32_t c1,
                                            int32_t c2, int32_t c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6}], [%2];" ::"r"(ptx::smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(ptx::smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}

__device__ __forceinline__ void tma_store_4d(const CUtensorMap* map, const void* src, int32_t c0, int32_t c1,
                                             int32_t c2, int32_t c3) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(ptx::smem_addr(src)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
               : "memory");
}

}  // namespace attn

// The core's shared memory: [Q][K stages][V stages][O staging][barriers], 1024-aligned.
template <class T>
struct AttnSmem {
  uint8_t* base;

  __device__ static AttnSmem from(void* dynamic_smem) {
    return AttnSmem{reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(dynamic_smem) + 1023) &
                                               ~static_cast<uintptr_t>(1023))};
  }
  __device__ uint8_t* q() const { return base + T::kQOffset; }
  __device__ uint8_t* k(uint32_t s) const { return base + T::kKOffset + s * T::kKVBytes; }
  __device__ uint8_t* v(uint32_t s) const { return base + T::kVOffset + s * T::kKVBytes; }
  __device__ uint8_t* o(uint32_t wg) const { return base + T::kOOffset + wg * T::kSlices * T::kOChunkBytes; }
  __device__ uint64_t* bars() const { return reinterpret_cast<uint64_t*>(base + T::kBarOffset); }
  __device__ uint64_t* q_full() const { return bars(); }
  __device__ uint64_t* q_empty() const { return bars() + 1; }
  __device__ uint64_t* k_full(uint32_t s) const { return bars() + 2 + s; }
  __device__ uint64_t* k_empty(uint32_t s) const { return bars() + 2 + T::kStages + s; }
  __device__ uint64_t* v_full(uint32_t s) const { return bars() + 2 + 2 * T::kStages + s; }
  __device__ uint64_t* v_empty(uint32_t s) const { return bars() + 2 + 3 * T::kStages + s; }
  __device__ uint64_t* sched_full(uint32_t i) const { return bars() + 2 + 4 * T::kStages + i; }
  __device__ uint64_t* sched_empty(uint32_t i) const { return bars() + 4 + 4 * T::kStages + i; }
  // The announcement slot i (unit, chunk): read and written with explicit shared-memory
  // instructions (ptx::st_shared_b32, ptx::ld_shared_volatile_u32); through a volatile generic
  // pointer the compiler emits system-scope generic loads and stores (LD/ST.E.STRONG.SYS).
  __device__ uint8_t* slot(uint32_t i) const { return base + T::kSlotOffset + 8 * i; }

  // One thread; the caller synchronises the block afterwards.
  __device__ void init() const {
    ptx::mbar_init(q_full(), 1);
    ptx::mbar_init(q_empty(), T::kNumConsumers);
    for (uint32_t s = 0; s < T::kStages; ++s) {
      ptx::mbar_init(k_full(s), 1);
      ptx::mbar_init(k_empty(s), T::kNumConsumers);
      ptx::mbar_init(v_full(s), 1);
      ptx::mbar_init(v_empty(s), T::kNumConsumers);
    }
    for (uint32_t i = 0; i < 2; ++i) {
      ptx::mbar_init(sched_full(i), 1);
      ptx::mbar_init(sched_empty(i), 128 * T::kNumConsumers);  // every consumer thread read it
    }
    ptx::fence_mbar_init();
  }
};

// A ring position: stage index and the parity of its current phase.
struct AttnRingPos {
  uint32_t stage = 0, phase = 0;
  template <int kStages>
  __device__ void advance() {
    if (++stage == kStages) {
      stage = 0;
      phase ^= 1;
    }
  }
};

template <class T>
struct Sm90AttnCore {
  using Smem = AttnSmem<T>;
  static constexpr int kBM = T::kBlockM;
  static constexpr int kBN = T::kBlockN;
  static constexpr int kD = T::kHeadDim;

  // Key blocks a unit visits in a chunk: [0, n), walked from n - 1 down (masked blocks first).
  __device__ static uint32_t num_kv_blocks(const AttnParams& p, const AttnChunk& c, uint32_t m_block) {
    if (c.relation == kAttnSkip) return 0;
    int64_t end = c.kv_len;
    if (c.relation == kAttnCausal) {
      const int64_t tile_end = static_cast<int64_t>(m_block + 1) * kBM;
      const int64_t last_row = (tile_end < p.q_len ? tile_end : static_cast<int64_t>(p.q_len)) - 1;
      const int64_t lim = last_row + c.causal_offset + 1;
      if (lim < end) end = lim;
    }
    return end <= 0 ? 0u : static_cast<uint32_t>((end + kBN - 1) / kBN);
  }

  // Whether key block kb needs element masks for this tile: it crosses the end of the keys, or
  // (causal) some key in it lies right of the diagonal of the tile's first row.
  __device__ static bool needs_mask(const AttnChunk& c, uint32_t m_block, uint32_t kb) {
    const int64_t col_end = static_cast<int64_t>(kb + 1) * kBN;
    if (col_end > c.kv_len) return true;
    return c.relation == kAttnCausal && col_end - 1 > static_cast<int64_t>(m_block) * kBM + c.causal_offset;
  }

  // ---- producer --------------------------------------------------------------------------------

  struct ProducerState {
    AttnRingPos k, v, sched;
    uint32_t q_phase = 0;
    bool failed = false;  // a wait failed: keep completing barriers, load nothing
    __device__ void fail() { failed = true; }
  };

  // Waits (bounded) until the consumers released the slot; false once anything failed.
  __device__ static bool wait_empty(const AttnParams& p, uint64_t* bar, uint32_t parity, ProducerState& st,
                                    uint32_t detail) {
    if (st.failed) {
      ptx::mbar_try_wait(bar, parity);
      return false;
    }
    // Four times the bound, ending early once an error is recorded (wait.cuh note 5): the
    // consumers that hold the slot may be waiting for a stage, up to twice the bound.
    if (mbar_wait_bounded(bar, parity, p.wait.timeout_ns, 2, p.wait.status)) return true;
    report(p.wait, kDevicePipelineTimeout, detail, where_tag(kStepAttnPipeline, blockIdx.x));
    st.failed = true;
    return false;
  }

  // One thread: tells the consumers which (unit, chunk) comes next (kAttnNoUnit: no more).
  __device__ static void announce(const AttnParams& p, const Smem& sm, ProducerState& st, uint32_t unit,
                                  uint32_t chunk) {
    wait_empty(p, sm.sched_empty(st.sched.stage), st.sched.phase ^ 1, st, 2 * T::kStages + 1 + st.sched.stage);
    const uint32_t slot = ptx::smem_addr(sm.slot(st.sched.stage));
    ptx::st_shared_b32(slot, unit);
    ptx::st_shared_b32(slot + 4, chunk);
    ptx::mbar_arrive(sm.sched_full(st.sched.stage));  // release: the slot's stores come first
    st.sched.template advance<2>();
  }

  // One thread. Loads what `consume` of the same (chunk, unit) reads.
  __device__ static void produce(const AttnParams& p, const AttnChunk& c, const CUtensorMap* q_map,
                                 const CUtensorMap* k_map, const CUtensorMap* v_map, uint32_t unit, const Smem& sm,
                                 ProducerState& st) {
    const AttnUnit u = attn_unit(p, unit);
    const uint32_t n = num_kv_blocks(p, c, u.m_block);
    if (n == 0) return;
    const int32_t b = static_cast<int32_t>(u.b);
    const int32_t h = static_cast<int32_t>(u.h);
    const int32_t kv_h = static_cast<int32_t>(u.h / p.group);

    // Q: the consumers released the previous unit's Q once its last S product completed.
    if (wait_empty(p, sm.q_empty(), st.q_phase ^ 1, st, 0)) {
      ptx::mbar_arrive_expect_tx(sm.q_full(), T::kQBytes);
#pragma unroll
      for (int s = 0; s < T::kSlices; ++s) {
        attn::tma_load_4d(sm.q() + s * T::kQSliceBytes, q_map, sm.q_full(), s * 64,
                          static_cast<int32_t>(u.m_block * kBM), h, b);
      }
    } else {
      ptx::mbar_arrive(sm.q_full());
    }
    st.q_phase ^= 1;

    auto load = [&](const CUtensorMap* map, AttnRingPos& pos, bool is_v, uint32_t kb) {
      uint64_t* empty = is_v ? sm.v_empty(pos.stage) : sm.k_empty(pos.stage);
      uint64_t* full = is_v ? sm.v_full(pos.stage) : sm.k_full(pos.stage);
      uint8_t* dst = is_v ? sm.v(pos.stage) : sm.k(pos.stage);
      if (wait_empty(p, empty, pos.phase ^ 1, st, 1 + (is_v ? T::kStages : 0) + pos.stage)) {
        ptx::mbar_arrive_expect_tx(full, T::kKVBytes);
#pragma unroll
        for (int s = 0; s < T::kSlices; ++s) {
          attn::tma_load_4d(dst + s * T::kKVSliceBytes, map, full, s * 64, static_cast<int32_t>(kb * kBN), kv_h, b);
        }
      } else {
        ptx::mbar_arrive(full);
      }
      pos.template advance<T::kStages>();
    };
    load(k_map, st.k, false, n - 1);
    for (uint32_t i = 1; i < n; ++i) {
      load(k_map, st.k, false, n - 1 - i);
      load(v_map, st.v, true, n - i);
    }
    load(v_map, st.v, true, 0);
  }

  // ---- consumers -------------------------------------------------------------------------------

  struct ConsumerState {
    AttnRingPos k, v, sched;
    uint32_t q_phase = 0;
    bool failed = false;  // a wait expired: later waits try once (the error is already recorded)
  };

  __device__ static void wait_full(const AttnParams& p, uint64_t* bar, uint32_t parity, ConsumerState& st,
                                   uint32_t detail) {
    if (st.failed) {
      ptx::mbar_try_wait(bar, parity);
      return;
    }
    // Twice the bound (wait.cuh note 5): the producer may be in a bounded wait for a chunk (the
    // ring's flag wait), whose report names the cause and must come first.
    if (!mbar_wait_bounded(bar, parity, p.wait.timeout_ns, 1)) {
      report(p.wait, kDevicePipelineTimeout, detail, where_tag(kStepAttnPipeline, blockIdx.x));
      st.failed = true;
    }
  }

  // Every consumer thread: the next (unit, chunk) its producer announced; false at the end.
  __device__ static bool receive(const AttnParams& p, const Smem& sm, ConsumerState& st, uint32_t& unit,
                                 uint32_t& chunk) {
    wait_full(p, sm.sched_full(st.sched.stage), st.sched.phase, st, 2 * T::kStages + 1 + st.sched.stage);
    const uint8_t* slot = sm.slot(st.sched.stage);
    // Broadcast from lane 0: the compiler then knows the values are warp-uniform and keeps the
    // main loop's stage and descriptor arithmetic on the uniform datapath (read per lane, they
    // cost a 5% slower loop: a dozen instructions between consecutive wgmma in the SASS).
    unit = __shfl_sync(0xffffffffu, ptx::ld_shared_volatile_u32(slot), 0);
    chunk = __shfl_sync(0xffffffffu, ptx::ld_shared_volatile_u32(slot + 4), 0);
    ptx::mbar_arrive(sm.sched_empty(st.sched.stage));  // release: the loads above come first
    st.sched.template advance<2>();
    return unit != kAttnNoUnit;
  }

  // Consumer wg (0 or 1) lets the first consumer issue first (ping-pong).
  __device__ static void consumer_begin(uint32_t wg) {
    if constexpr (T::kPingPong) {
      if (wg == 1) attn::named_barrier_arrive(T::kBarSched + 0, 256);
    }
  }

  // Outstanding output stores must have read shared memory before the block exits.
  __device__ static void consumer_end(uint32_t tid) {
    if (tid == 0) ptx::bulk_wait_group_all();
  }

  __device__ static void issue_qk(float (&s)[kBN / 2], uint64_t desc_q, uint64_t desc_k) {
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      attn::wgmma_ss<kBN>(s, ptx::advance_desc(desc_q, (kk / 4) * T::kQSliceBytes + (kk % 4) * 32),
                          ptx::advance_desc(desc_k, (kk / 4) * T::kKVSliceBytes + (kk % 4) * 32), kk > 0 ? 1u : 0u);
    }
  }

  __device__ static void issue_pv(float (&o)[kD / 2], const uint32_t (&pp)[kBN / 4], uint64_t desc_v) {
#pragma unroll
    for (int t = 0; t < kBN / 16; ++t) {
      attn::wgmma_rs<kD>(o, pp[4 * t], pp[4 * t + 1], pp[4 * t + 2], pp[4 * t + 3],
                         ptx::advance_desc(desc_v, t * 16 * 128));
    }
  }

  // Masks S of key block kb for this thread's two rows (row0, row0 + 8).
  __device__ static void apply_mask(float (&s)[kBN / 2], const AttnChunk& c, uint32_t kb, int32_t row0,
                                    uint32_t lane) {
    const int32_t col0 = static_cast<int32_t>(kb * kBN + 2 * (lane % 4));
    const int32_t kv_len = static_cast<int32_t>(c.kv_len);
    const bool causal = c.relation == kAttnCausal;
#pragma unroll
    for (int j = 0; j < kBN / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int32_t col = col0 + 8 * j + e;
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int32_t row = row0 + 8 * hh;
          const bool visible = (col < kv_len) & (!causal | (col <= row + c.causal_offset));  // no branches
          s[4 * j + 2 * hh + e] = visible ? s[4 * j + 2 * hh + e] : -INFINITY;
        }
      }
    }
  }

  // Online softmax of one block of scores: new row maxima (quad-reduced), the factor that
  // rescales what came before, S -> exp(scale (S - m)) in place, thread-local row sums.
  __device__ static void online_softmax(float (&s)[kBN / 2], float (&m)[2], float (&l)[2], float (&corr)[2],
                                        float scale_log2) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      float mx = m[hh];
#pragma unroll
      for (int j = 0; j < kBN / 8; ++j) mx = fmaxf(mx, fmaxf(s[4 * j + 2 * hh], s[4 * j + 2 * hh + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      // A row that has seen no visible key yet keeps m = -inf; subtract 0 then (no NaN).
      const float m_scaled = mx == -INFINITY ? 0.0f : mx * scale_log2;
      corr[hh] = attn::ex2(m[hh] * scale_log2 - m_scaled);
      m[hh] = mx;
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < kBN / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float v = attn::ex2(fmaf(s[4 * j + 2 * hh + e], scale_log2, -m_scaled));
          s[4 * j + 2 * hh + e] = v;
          sum += v;
        }
      }
      l[hh] = l[hh] * corr[hh] + sum;
    }
  }

  __device__ static void rescale(float (&o)[kD / 2], const float (&corr)[2]) {
#pragma unroll
    for (int j = 0; j < kD / 8; ++j) {
      o[4 * j] *= corr[0];
      o[4 * j + 1] *= corr[0];
      o[4 * j + 2] *= corr[1];
      o[4 * j + 3] *= corr[1];
    }
  }

  __device__ static void to_p(const float (&s)[kBN / 2], uint32_t (&pp)[kBN / 4]) {
#pragma unroll
    for (int k = 0; k < kBN / 4; ++k) pp[k] = ptx::pack_bf16x2(s[2 * k], s[2 * k + 1]);
  }

  // 256 threads (both consumer warpgroups); wg = 0 or 1, tid = 0..127 within the warpgroup.
  __device__ static void consume(const AttnParams& p, const AttnChunk& c, const CUtensorMap* o_map, uint32_t unit,
                                 const Smem& sm, ConsumerState& st, uint32_t wg, uint32_t tid) {
    const AttnUnit u = attn_unit(p, unit);
    const uint32_t n = num_kv_blocks(p, c, u.m_block);
    const uint32_t warp = tid / 32, lane = tid % 32;
    const bool leader = tid == 0;
    const int32_t row0 = static_cast<int32_t>(u.m_block * kBM + wg * 64 + warp * 16 + lane / 4);

    float o[kD / 2];
#pragma unroll
    for (int i = 0; i < kD / 2; ++i) o[i] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, corr[2] = {1.0f, 1.0f};

    if (n > 0) {
      const uint64_t desc_q = ptx::make_desc_k_major_sw128(sm.q() + wg * 64 * 128);
      const bool swap_v = (p.debug & 1u) != 0;
      float s[kBN / 2];
      uint32_t pp[kBN / 4];

      wait_full(p, sm.q_full(), st.q_phase, st, 0);
      st.q_phase ^= 1;

      // -- first (last-indexed) key block: S, softmax, P --
      uint32_t kb = n - 1;
      wait_full(p, sm.k_full(st.k.stage), st.k.phase, st, 1 + st.k.stage);
      ptx::wgmma_fence();
      issue_qk(s, desc_q, ptx::make_desc_k_major_sw128(sm.k(st.k.stage)));
      ptx::wgmma_commit();
      ptx::wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < kBN / 2; ++i) ptx::reg_fence(s[i]);
      if (leader) ptx::mbar_arrive(sm.k_empty(st.k.stage));
      st.k.template advance<T::kStages>();
      if (needs_mask(c, u.m_block, kb)) apply_mask(s, c, kb, row0, lane);
      online_softmax(s, m, l, corr, p.scale_log2);
      to_p(s, pp);

      // -- steady state: S of block kb issued, then P V of block kb + 1; softmax of kb overlaps it --
      for (uint32_t i = 1; i < n; ++i) {
        kb = n - 1 - i;
        wait_full(p, sm.k_full(st.k.stage), st.k.phase, st, 1 + st.k.stage);
        if constexpr (T::kPingPong) ptx::named_barrier_sync(T::kBarSched + wg, 256);
        ptx::wgmma_fence();
        issue_qk(s, desc_q, ptx::make_desc_k_major_sw128(sm.k(st.k.stage)));
        ptx::wgmma_commit();
        rescale(o, corr);
        wait_full(p, sm.v_full(st.v.stage), st.v.phase, st, 1 + T::kStages + st.v.stage);
        ptx::wgmma_fence();
        issue_pv(o, pp, attn::make_desc_mn_major_sw128(sm.v(st.v.stage), T::kKVSliceBytes, swap_v));
        ptx::wgmma_commit();
        if constexpr (T::kPingPong) attn::named_barrier_arrive(T::kBarSched + (1 - wg), 256);
        ptx::wgmma_wait<1>();
#pragma unroll
        for (int j = 0; j < kBN / 2; ++j) ptx::reg_fence(s[j]);
        if (leader) ptx::mbar_arrive(sm.k_empty(st.k.stage));
        st.k.template advance<T::kStages>();
        if (needs_mask(c, u.m_block, kb)) apply_mask(s, c, kb, row0, lane);
        online_softmax(s, m, l, corr, p.scale_log2);
        ptx::wgmma_wait<0>();
#pragma unroll
        for (int j = 0; j < kD / 2; ++j) ptx::reg_fence(o[j]);
#pragma unroll
        for (int j = 0; j < kBN / 4; ++j) attn::reg_fence_u32(pp[j]);
        if (leader) ptx::mbar_arrive(sm.v_empty(st.v.stage));
        st.v.template advance<T::kStages>();
        to_p(s, pp);
      }

      // -- the last P V; Q is free for the next unit once every S product completed --
      if (leader) ptx::mbar_arrive(sm.q_empty());
      rescale(o, corr);
      wait_full(p, sm.v_full(st.v.stage), st.v.phase, st, 1 + T::kStages + st.v.stage);
      ptx::wgmma_fence();
      issue_pv(o, pp, attn::make_desc_mn_major_sw128(sm.v(st.v.stage), T::kKVSliceBytes, swap_v));
      ptx::wgmma_commit();
      ptx::wgmma_wait<0>();
#pragma unroll
      for (int j = 0; j < kD / 2; ++j) ptx::reg_fence(o[j]);
      if (leader) ptx::mbar_arrive(sm.v_empty(st.v.stage));
      st.v.template advance<T::kStages>();
    }

    epilogue(p, c, o_map, u, sm, o, m, l, wg, tid, row0);
  }

  // ---- epilogue --------------------------------------------------------------------------------

  __device__ static float log_add_exp(float a, float b) {
    const float mx = fmaxf(a, b);
    if (mx == -INFINITY) return -INFINITY;
    return mx + logf(expf(a - mx) + expf(b - mx));
  }

  __device__ static void epilogue(const AttnParams& p, const AttnChunk& c, const CUtensorMap* o_map,
                                  const AttnUnit& u, const Smem& sm, float (&o)[kD / 2], const float (&m)[2],
                                  float (&l)[2], uint32_t wg, uint32_t tid, int32_t row0) {
    const uint32_t lane = tid % 32, warp = tid / 32;
    const bool read_running = (c.flags & kAttnReadRunning) != 0;
    const bool write_final = (c.flags & kAttnWriteFinal) != 0;
    const uint64_t head_row0 = (static_cast<uint64_t>(u.b) * p.heads_q + u.h) * p.q_len;

    float w_o[2], w_run[2], lse[2];
    bool valid[2];
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      l[hh] += __shfl_xor_sync(0xffffffffu, l[hh], 1);
      l[hh] += __shfl_xor_sync(0xffffffffu, l[hh], 2);
      const int32_t row = row0 + 8 * hh;
      valid[hh] = row < static_cast<int32_t>(p.q_len);
      const float lse_part = l[hh] > 0.0f ? m[hh] * p.scale + logf(l[hh]) : -INFINITY;
      const float inv_l = l[hh] > 0.0f ? 1.0f / l[hh] : 0.0f;
      if (read_running) {
        const float lse_run = valid[hh] ? p.lse_run[head_row0 + row] : -INFINITY;
        const float lse_new = log_add_exp(lse_part, lse_run);
        w_o[hh] = lse_new == -INFINITY ? 0.0f : inv_l * expf(lse_part - lse_new);
        w_run[hh] = lse_new == -INFINITY ? 0.0f : expf(lse_run - lse_new);
        lse[hh] = lse_new;
      } else {
        w_o[hh] = inv_l;
        w_run[hh] = 0.0f;
        lse[hh] = lse_part;
      }
    }
#pragma unroll
    for (int j = 0; j < kD / 8; ++j) {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        float2 run = make_float2(0.0f, 0.0f);
        if (read_running && valid[hh]) {
          run = *reinterpret_cast<const float2*>(p.o_run + (head_row0 + row0 + 8 * hh) * kD + 8 * j + 2 * (lane % 4));
        }
        o[4 * j + 2 * hh] = o[4 * j + 2 * hh] * w_o[hh] + run.x * w_run[hh];
        o[4 * j + 2 * hh + 1] = o[4 * j + 2 * hh + 1] * w_o[hh] + run.y * w_run[hh];
      }
    }

    if (!write_final) {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        if (!valid[hh]) continue;
        float* dst = p.o_run + (head_row0 + row0 + 8 * hh) * kD + 2 * (lane % 4);
#pragma unroll
        for (int j = 0; j < kD / 8; ++j) {
          *reinterpret_cast<float2*>(dst + 8 * j) = make_float2(o[4 * j + 2 * hh], o[4 * j + 2 * hh + 1]);
        }
        if (lane % 4 == 0) p.lse_run[head_row0 + row0 + 8 * hh] = lse[hh];
      }
      return;
    }

    // bf16 O through shared memory (TMA's 128-byte swizzle: 16-byte group j of row r at j ^ (r % 8),
    // conflict-free) and one TMA store per 64-column slice; rows past q_len are clipped by TMA.
    uint8_t* buf = sm.o(wg);
    const uint32_t base = ptx::smem_addr(buf);
    const uint32_t r = warp * 16 + lane / 4;
    if (tid == 0) ptx::bulk_wait_group_read<0>();  // the previous unit's store has read the buffer
    ptx::named_barrier_sync(T::kBarEpilogue + wg, 128);
#pragma unroll
    for (int j = 0; j < kD / 8; ++j) {
      const uint32_t slice = j / 8, jj = j % 8;
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const uint32_t addr = base + slice * T::kOChunkBytes + (r + 8 * hh) * 128 + ((jj ^ (lane / 4)) * 16) +
                              4 * (lane % 4);
        ptx::st_shared_b32(addr, ptx::pack_bf16x2(o[4 * j + 2 * hh], o[4 * j + 2 * hh + 1]));
      }
    }
    ptx::fence_proxy_async_shared();
    ptx::named_barrier_sync(T::kBarEpilogue + wg, 128);
    if (tid == 0) {
#pragma unroll
      for (int s = 0; s < T::kSlices; ++s) {
        attn::tma_store_4d(o_map, buf + s * T::kOChunkBytes, s * 64, static_cast<int32_t>(u.m_block * kBM + wg * 64),
                           static_cast<int32_t>(u.h), static_cast<int32_t>(u.b));
      }
      ptx::bulk_commit_group();
    }
    if (lane % 4 == 0) {
      const uint64_t lse_row0 = (static_cast<uint64_t>(u.b) * p.heads_q + u.h) * p.lse_head_stride;
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        if (valid[hh]) p.lse[lse_row0 + row0 + 8 * hh] = lse[hh];
      }
    }
  }
};

// The producer's side of the schedule (params note 1): the units of this block, in order.
struct AttnScheduler {
  const AttnParams& p;
  uint32_t block, grid;
  uint32_t k = 0;

  // The next unit of the current chunk, or kAttnNoUnit.
  __device__ uint32_t next() {
    if (p.unit_order == kAttnDynamic) {
      const uint32_t u = k++ == 0 ? block : grid + atomicAdd(&p.sched_counters[0], 1u);
      if (u < p.num_units) return u;
      // This block takes no more. The last block to get here resets the counters for the next
      // launch: every block made its last fetch before it counted itself done.
      __threadfence();
      if (atomicAdd(&p.sched_counters[1], 1u) == grid - 1) {
        __threadfence();
        atomicExch(&p.sched_counters[0], 0u);
        atomicExch(&p.sched_counters[1], 0u);
      }
      return kAttnNoUnit;
    }
    const uint32_t rounds = attn_num_rounds(p, grid);
    while (k < rounds) {
      const uint32_t u = attn_unit_index(p, k++, block, grid);
      if (u < p.num_units) return u;
    }
    return kAttnNoUnit;
  }
};

// The standalone op: every chunk of p (one, unless the ring is emulated on one GPU), every unit.
template <class T>
__global__ void __launch_bounds__(T::kThreads, 1)
    sm90_attention_kernel(const __grid_constant__ AttnMaps maps, const __grid_constant__ AttnParams p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Core = Sm90AttnCore<T>;
  extern __shared__ uint8_t smem_raw[];
  const AttnSmem<T> sm = AttnSmem<T>::from(smem_raw);
  if (threadIdx.x == 0) sm.init();
  __syncthreads();

  // Broadcast: the compiler then treats the warpgroup index as warp-uniform (uniform registers
  // for everything derived from it, such as each consumer's Q descriptor).
  const uint32_t warpgroup = __shfl_sync(0xffffffffu, threadIdx.x / 128, 0);
  if (warpgroup == 0) {
    ptx::setmaxnreg_dec<T::kProducerRegs>();
    if (threadIdx.x == 0) {
      ptx::prefetch_tensor_map(&maps.q);
      typename Core::ProducerState st;
      for (uint32_t c = 0; c < p.num_chunks; ++c) {
        ptx::prefetch_tensor_map(&maps.k[c]);
        ptx::prefetch_tensor_map(&maps.v[c]);
        AttnScheduler sched{p, blockIdx.x, gridDim.x};
        for (uint32_t unit = sched.next(); unit != kAttnNoUnit; unit = sched.next()) {
          Core::announce(p, sm, st, unit, c);
          Core::produce(p, p.chunks[c], &maps.q, &maps.k[c], &maps.v[c], unit, sm, st);
        }
      }
      Core::announce(p, sm, st, kAttnNoUnit, 0);
    }
  } else {
    ptx::setmaxnreg_inc<T::kConsumerRegs>();
    const uint32_t wg = warpgroup - 1;
    const uint32_t tid = threadIdx.x % 128;
    typename Core::ConsumerState st;
    Core::consumer_begin(wg);
    // Bounded even if the channel carried garbage after a failed wait.
    const uint64_t max_units = static_cast<uint64_t>(p.num_units) * p.num_chunks;
    uint32_t unit, c;
    for (uint64_t i = 0; i < max_units && Core::receive(p, sm, st, unit, c); ++i) {
      if (c >= p.num_chunks || unit >= p.num_units) break;
      Core::consume(p, p.chunks[c], &maps.o, unit, sm, st, wg, tid);
    }
    Core::consumer_end(tid);
  }
#endif
}

#endif  // __CUDACC__

}  // namespace mkernel::kernels
