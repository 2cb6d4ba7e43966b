// ring_attn.cuh: the device code of ring attention (host side: ring_attn.h / ring_attn.cu; the
// movement plan: ring_attn_plan.h).
//
//   rank r:  O_r = softmax(scale Q_r K^T [mask]) V,  lse_r,   K, V = every rank's K_q, V_q
//
// One persistent kernel per rank, 384 threads per block, one block per SM:
//   blocks [0, comm_blocks)   communication: run this rank's movement plan (RingStep list) in
//                             order, every block a slice of every item; the block that finishes
//                             an item's last slice publishes it (raises the receiver's arrived
//                             flag, puts to the rail peers, counts a forward out of a slot);
//   the other blocks          attention: the attention core (attention/sm90_attention.cuh) driven
//                             through its role contract. The producer thread walks the steps in
//                             order; before the units of step t it waits (bounded) until the
//                             chunk of step t arrived in its slot, then announces and produces
//                             every unit it owns of every query group that sees the chunk (a
//                             static head-major order: a unit has the same block in every step, so
//                             its fp32 running (O, lse) needs no synchronisation between blocks,
//                             sm90_attention_params.h note 4). The consumers merge each chunk's
//                             partial result into the running state (online softmax, fp32) and
//                             write bf16 O and lse at the group's last step;
//   every block               counts itself out; the last one ends the launch (done flags,
//                             slot-free signals: launch_state.cuh end_fused_launch).
//
// Design notes
//  1. A slot of step t is free again when every attention block finished *loading* chunk t (TMA
//     loads complete; what the consumers still compute on lives in shared memory) and every
//     forward out of it finished reading it (ring_attn_plan.h note 3): per step a count of
//     readers, the last raises freed(t). After the last unit of step t the producer announces a
//     step-end marker (kRingStepEnd, step t); the first consumer warpgroup, receiving it, has
//     waited on every full barrier of every unit of chunk t (the channel is in order), so its
//     thread 0 counts the block out of slot t then. The marker goes out after the step's units
//     and before the wait for the next step's chunk: counting out when a later step's unit
//     arrives would make freed(t) wait for arrived(t + 1), which with one slot waits for freed(t).
//     Every block waits for every step's chunk before its marker, even with no units in it, so a
//     slot is never freed before its chunk arrived (a step every group skips still has a chunk
//     in flight).
//  2. Data written by other agents and published by a flag is read by TMA (the attention core's
//     loads, the bulk copier's forwards): after the acquire of the flag a proxy fence orders the
//     generic-proxy observation before the async-proxy reads.
//  3. Errors: every flag wait is bounded (wait_geq, the communicator's bound) and names the step
//     (kStepRingKV: step and source rank; kStepRingSlotFree: rank and step; kStepPeerFree;
//     kStepNetworkArrival; kStepRingCopy: a bulk copy whose pipeline stalled). A failed wait of
//     the producer makes the core's pipeline run through (ProducerState::fail) and ends the
//     announcements; a failed communication item ends the block's list. The last block's end of launch aborts the
//     NVLink peers when the status word holds an error, so a failure on one rank ends every rank's waits at once.
#pragma once

#include <cstdint>

#include "attention/sm90_attention.cuh"
#include "attention/sm90_attention_params.h"
#include "common/bulk_copy.cuh"
#include "common/comm.cuh"
#include "fused/common/launch_state.cuh"
#include "fused/common/slice.cuh"
#include "common/split_control.cuh"
#include "fused/ring_attn/ring_attn_plan.h"

namespace mkernel::kernels {

// What the kernel needs of a plan, prepared once in device memory.
struct RingAttnArgs {
  DeviceComm comm;
  RingGeometry geo;                   // slots resolved
  uint32_t comm_blocks = 0;           // blocks [0, comm_blocks) move data, the others attend
  uint32_t num_steps = 0;             // movement items
  const RingStep* steps = nullptr;    // this rank's movement plan
  const AttnChunk* chunks = nullptr;  // [t * 2 + group] (ring_chunks: the same values as RingChunk)
  uint64_t kv_bytes = 0;              // bytes of K (and of V) of one chunk; a slot holds K then V
  uint8_t* slots = nullptr;           // this rank's KV slots: the start of its NVLink buffer
  uint64_t* nvl_flags = nullptr;      // this rank's NVLink fused-op flags
  uint8_t* net = nullptr;             // this rank's network workspace (nodes > 1), else null
  uint32_t* item_done = nullptr;      // per movement item: blocks done with their slice (zero between launches)
  uint32_t* freed_count = nullptr;    // per step: readers done with its slot (zero between launches)
  uint32_t units_per_group = 0;       // query tiles of one group: batch x heads_q x ceil(rows / 128)
  uint32_t bulk = 1;                  // 1: GPU-memory copies through the bulk copier; 0: 16-byte loads/stores
  SplitControl* split = nullptr;      // the adaptive split (common/split_control.h), or null: comm_blocks fixed
};

// Kernel parameters of one launch (the pointers of this launch's tensors live in the maps and
// in attn[].lse).
struct RingAttnLaunch {
  AttnParams attn[2];  // per query group (ring_attn_plan.h note 5); [1] unused with one group
  const RingAttnArgs* args = nullptr;
  const uint8_t* k_local = nullptr;  // this rank's K and V, packed in the layout of the plan
  const uint8_t* v_local = nullptr;
};

struct RingAttnMaps {
  CUtensorMap q[2], o[2];                                  // per query group
  CUtensorMap k[kRingMaxSlots + 1], v[kRingMaxSlots + 1];  // [0]: own inputs, [1 + s]: slot s
};

// The unit value of a step-end marker in the attention core's announcement channel (note 1).
inline constexpr uint32_t kRingStepEnd = 0xFFFFFFFEu;
static_assert(kRingStepEnd != kAttnNoUnit);

#if defined(__CUDACC__)

namespace ring_detail {

// This launch's communication blocks: the plan's, or the adaptive split's (the same words for
// the whole launch: split_control.h note 1). kAdaptive: the kernel's instantiation for plans with
// an adaptive split (its measures cost registers, so static plans run code without them).
template <bool kAdaptive>
__device__ __forceinline__ uint32_t comm_blocks_of(const RingAttnArgs& a) {
  if constexpr (kAdaptive) {
    if (a.split != nullptr) return split_comm_blocks(a.split);
  }
  return a.comm_blocks;
}

// A reader of the slot of step t is done (note 1); the last raises freed(t). The launch number
// is read here, and the caller reads the launch's communication blocks at the call, rather than
// keeping them live across the consumers' loop.
__device__ __forceinline__ void count_freed(const RingAttnArgs& a, uint32_t t, uint32_t comm_blocks) {
  if (t == 0) return;  // the own inputs: no slot
  __threadfence();
  const uint64_t launch = launch_number(a.comm);
  const uint32_t need = gridDim.x - comm_blocks + a.geo.forwards_out(t);
  if (atomicAdd(&a.freed_count[t], 1u) + 1 == need) {
    a.freed_count[t] = 0;  // zero again for the next launch
    raise_flag(a.nvl_flags + a.geo.freed_flag(t), launch);
  }
}

struct Ctx {
  const RingAttnArgs& a;
  const DeviceComm& c;
  uint64_t launch, prev;
  const uint8_t* k_local;
  const uint8_t* v_local;

  __device__ uint64_t chunk_bytes() const { return 2 * a.kv_bytes; }
  __device__ uint64_t slot_offset(uint32_t t) const { return uint64_t{a.geo.slot_of(t)} * chunk_bytes(); }
  __device__ uint64_t net_offset(uint32_t node) const { return uint64_t{node} * chunk_bytes(); }
};

// Thread 0 waits (bounded) for what an item needs. False: recorded; the block stops.
__device__ __forceinline__ bool wait_item(const Ctx& x, const RingStep& s) {
  const WaitContext w = wait_context(x.c);
  const FusedLayout& L = x.a.geo.layout;
  const uint32_t r = x.c.rank;
  switch (s.kind) {
    case kRingSend:
      // Every rail peer finished its previous launch: its slot of this node was read, and the
      // proxy's reads of this rank's staging slot for the previous launch's puts are done.
      for (uint32_t i = 1; i < L.nodes; ++i) {
        const uint32_t to = L.send_node(s.node, i);
        const uint32_t f = fused_flag_index(x.c, L.slot_free_flag(to));
        if (!wait_geq(x.c.flags + f, x.prev, w, f, where_tag(kStepPeerFree, L.rail_peer(r, to)))) return false;
      }
      return true;
    case kRingPush: {
      if (s.src_step > 0) {  // a forward: this rank received the chunk first
        const uint32_t f = x.a.geo.arrived_flag(s.src_step);
        const uint32_t src = x.a.geo.source_of(r, s.src_step);
        if (!wait_geq(x.a.nvl_flags + f, x.launch, w, f, where_tag(kStepRingKV, uint64_t{s.src_step} * 65536 + src)))
          return false;
      }
      if (s.wait_freed > 0) {  // the peer's slot: its reader of this launch is done
        const uint32_t f = x.a.geo.freed_flag(s.wait_freed);
        return wait_geq(nvl_fused_flag(x.c, s.peer, f), x.launch, w, f,
                        where_tag(kStepRingSlotFree, uint64_t{s.peer} * 65536 + s.wait_freed));
      }
      const uint32_t done = L.done_flag(s.peer);  // its previous fused launch is over
      return wait_geq(x.a.nvl_flags + done, x.prev, w, done, where_tag(kStepPeerFree, s.peer));
    }
    case kRingReceive: {
      const uint32_t f = fused_flag_index(x.c, x.a.geo.arrival_flag(s.node));
      if (!wait_geq(x.c.flags + f, x.launch, w, f, where_tag(kStepNetworkArrival, uint64_t{s.node} * 65536)))
        return false;
      if (s.wait_freed == 0) return true;  // the previous launch of this rank ended (stream order)
      const uint32_t g = x.a.geo.freed_flag(s.wait_freed);
      return wait_geq(x.a.nvl_flags + g, x.launch, w, g,
                      where_tag(kStepRingSlotFree, uint64_t{r} * 65536 + s.wait_freed));
    }
  }
  return false;
}

// This block's slice [begin, begin + bytes) of a chunk (K then V, 2 x kv_bytes) from `src` (a slot
// or network slot) or, with src null, from the own inputs (K and V are two tensors).
template <LoadPolicy kPolicy>
__device__ __forceinline__ void copy_range(const Ctx& x, uint8_t* dst, const uint8_t* src, Slice sl, bool bulk,
                                           BulkCopier& copier, bool& ok, uint64_t where) {
  auto piece = [&](uint8_t* d, const uint8_t* s, uint64_t n) {
    if (n == 0) return;
    if (bulk) {
      if (threadIdx.x == 0 && !copier.copy(d, s, n, x.c.wait_timeout_ns)) {
        report(x.c, kDevicePipelineTimeout, 0, where);
        ok = false;
      }
    } else {
      block_copy<kPolicy>(d, s, n);
    }
  };
  if (src != nullptr) {
    piece(dst + sl.begin, src + sl.begin, sl.bytes);
    return;
  }
  const uint64_t kv = x.a.kv_bytes, b0 = sl.begin, b1 = sl.begin + sl.bytes;
  if (b0 < kv) piece(dst + b0, x.k_local + b0, (b1 < kv ? b1 : kv) - b0);
  if (b1 > kv) {
    const uint64_t v0 = b0 > kv ? b0 : kv;
    piece(dst + v0, x.v_local + (v0 - kv), b1 - v0);
  }
}

// Runs this block's part of item i; returns the same on every thread.
__device__ __forceinline__ bool run_item(const Ctx& x, uint32_t i, const RingStep& s, BulkCopier& copier,
                                         uint32_t block, uint32_t blocks) {
  __shared__ bool ok;
  __shared__ bool last;
  __syncthreads();  // every thread read the previous item's `ok` before it is written again
  if (threadIdx.x == 0) {
    ok = wait_item(x, s);
    if (ok) sync::fence_proxy_async_global();  // note 2: the bulk copier reads what was flagged
  }
  __syncthreads();
  if (!ok) return false;
  const uint32_t r = x.c.rank;
  const Slice sl = slice_of(x.chunk_bytes(), block, blocks);
  const bool bulk = x.a.bulk != 0;
  switch (s.kind) {
    case kRingSend:  // stage the own chunk once in the own network slot (mapped host memory)
      copy_range<LoadPolicy::kStream>(x, x.a.net + x.net_offset(s.node), nullptr, sl, false, copier, ok,
                                      where_tag(kStepRingCopy, uint64_t{r} * 65536));
      break;
    case kRingPush: {
      uint8_t* dst = nvl_ptr(x.c, s.peer) + x.slot_offset(s.dst_step);
      const uint8_t* src = s.src_step == 0 ? nullptr : x.a.slots + x.slot_offset(s.src_step);
      const uint64_t where = where_tag(kStepRingCopy, uint64_t{s.peer} * 65536 + s.dst_step);
      if (src == nullptr)
        copy_range<LoadPolicy::kStream>(x, dst, src, sl, bulk, copier, ok, where);
      else
        copy_range<LoadPolicy::kL2>(x, dst, src, sl, bulk, copier, ok, where);
      break;
    }
    case kRingReceive:  // the network slot (mapped host memory, written by the NIC or proxy)
      copy_range<LoadPolicy::kVolatile>(x, x.a.slots + x.slot_offset(s.dst_step), x.a.net + x.net_offset(s.node), sl,
                                        false, copier, ok, where_tag(kStepRingCopy, uint64_t{r} * 65536 + s.dst_step));
      break;
  }
  // Count this block's slice done; the last one publishes the item. Each block's fence makes its
  // slice visible system-wide before its count; the last block's fence after the count carries
  // them all before the flag (fence cumulativity), as in ag_gemm.cuh.
  __syncwarp();
  __syncthreads();
  if (threadIdx.x == 0) {
    sync::fence_acq_rel_sys();
    last = atomicAdd(&x.a.item_done[i], 1u) == blocks - 1;
    if (last) {
      x.a.item_done[i] = 0;  // zero again for the next launch
      sync::fence_acq_rel_sys();
    }
  }
  __syncthreads();
  if (!ok) return false;
  if (!last || threadIdx.x != 0) return true;
  const RingGeometry& g = x.a.geo;
  switch (s.kind) {
    case kRingSend: {
      const FusedLayout& L = g.layout;
      for (uint32_t j = 1; j < L.nodes; ++j) {
        const uint32_t to = L.rail_peer(r, L.send_node(s.node, j));
        if (!put_signal(x.c, to, x.c.network_workspace, x.net_offset(s.node), x.c.network_workspace,
                        x.net_offset(s.node), x.chunk_bytes(), fused_flag_index(x.c, g.arrival_flag(s.node)),
                        where_tag(kStepNetworkSend, to)))
          break;  // recorded; this rank's waits end and its peers' time out or see the abort
      }
      break;
    }
    case kRingPush:
      raise_flag(nvl_fused_flag(x.c, s.peer, g.arrived_flag(s.dst_step)), x.launch);
      if (s.src_step > 0) count_freed(x.a, s.src_step, blocks);  // one forward fewer reads it
      break;
    case kRingReceive:
      raise_flag(x.a.nvl_flags + g.arrived_flag(s.dst_step), x.launch);
      break;
  }
  return true;
}

}  // namespace ring_detail

// Communication blocks: this rank's movement plan, in order, a slice of every item each.
__device__ __forceinline__ void ring_comm_role(const RingAttnLaunch& L, uint64_t launch, uint32_t block,
                                               uint32_t blocks) {
  const RingAttnArgs& a = *L.args;
  const ring_detail::Ctx x{a, a.comm, launch, previous_fused_launch(a.comm), L.k_local, L.v_local};
  extern __shared__ uint8_t ring_smem_raw[];
  BulkCopier copier;
  if (threadIdx.x == 0)
    copier.init(reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(ring_smem_raw) + 1023) & ~uintptr_t{1023}));
  for (uint32_t i = 0; i < a.num_steps; ++i)
    if (!ring_detail::run_item(x, i, a.steps[i], copier, block, blocks)) return;
}

// Attention blocks: the attention core over every step's chunk (see the top of this file).
template <class T, bool kAdaptive>
__device__ __forceinline__ void ring_attention_role(const RingAttnMaps& maps, const RingAttnLaunch& L, uint64_t launch,
                                                    uint32_t block, uint32_t grid) {
  using Core = Sm90AttnCore<T>;
  const RingAttnArgs& a = *L.args;
  extern __shared__ uint8_t ring_smem_raw[];
  const AttnSmem<T> sm = AttnSmem<T>::from(ring_smem_raw);
  if (threadIdx.x == 0) sm.init();
  __syncthreads();
  const uint32_t R = a.geo.world();
  const uint32_t groups = a.geo.groups();
  const uint32_t total = groups * a.units_per_group;
  // Broadcast: the warpgroup index is then warp-uniform for the compiler (the core's habit).
  const uint32_t warpgroup = __shfl_sync(0xffffffffu, threadIdx.x / 128, 0);
  if (warpgroup == 0) {
    ptx::setmaxnreg_dec<T::kProducerRegs>();
    if (threadIdx.x == 0) {
      typename Core::ProducerState st;
      // The adaptive split's measure, this block's waits for chunks: in shared memory (the
      // producer's registers are few; kept in one, it spilled).
      [[maybe_unused]] __shared__ unsigned long long waited_ns;
      if constexpr (kAdaptive) waited_ns = 0;
      for (uint32_t g = 0; g < groups; ++g) ptx::prefetch_tensor_map(&maps.q[g]);
      for (uint32_t t = 0; t < R; ++t) {
        const uint32_t kv = t == 0 ? 0 : 1 + a.geo.slot_of(t);
        if (t > 0) {
          const uint32_t f = a.geo.arrived_flag(t);
          const uint64_t where = where_tag(kStepRingKV, uint64_t{t} * 65536 + a.geo.source_of(a.comm.rank, t));
          // ptxas reports 44 bytes of spill for the kernel; compiled without this wait, 4 remain
          // (the wait's slow path under the producer's 40 registers; once per step). Where the
          // other 4 bytes sit was not checked: the SASS is to be read on the GPU machine.
          [[maybe_unused]] uint64_t t0 = 0;
          if constexpr (kAdaptive) t0 = sync::globaltimer_ns();
          if (!wait_geq(a.nvl_flags + f, launch, wait_context(a.comm), f, where)) {
            st.fail();  // recorded; the pipeline runs through (nothing hangs) and the announcements end
            break;
          }
          if constexpr (kAdaptive) waited_ns += sync::globaltimer_ns() - t0;
          sync::fence_proxy_async_global();  // note 2
        }
        ptx::prefetch_tensor_map(&maps.k[kv]);
        ptx::prefetch_tensor_map(&maps.v[kv]);
        for (uint32_t u = block; u < total; u += grid) {
          const uint32_t g = u / a.units_per_group, unit = u - g * a.units_per_group;
          const AttnChunk c = a.chunks[t * 2 + g];
          if (c.relation == kAttnSkip) continue;  // this group does not see the chunk at all
          Core::announce(L.attn[g], sm, st, unit, t * 2 + g);
          Core::produce(L.attn[g], c, &maps.q[g], &maps.k[kv], &maps.v[kv], unit, sm, st);
        }
        if (t > 0) Core::announce(L.attn[0], sm, st, kRingStepEnd, t * 2);  // note 1
      }
      Core::announce(L.attn[0], sm, st, kAttnNoUnit, 0);
      if constexpr (kAdaptive) {
        if (a.split != nullptr) split_add_wait(a.split, waited_ns);
      }
    }
  } else {
    ptx::setmaxnreg_inc<T::kConsumerRegs>();
    const uint32_t wg = warpgroup - 1;
    const uint32_t tid = threadIdx.x % 128;
    typename Core::ConsumerState st;
    Core::consumer_begin(wg);
    // Bounded even if the channel carried garbage after a failed wait: units and step-end markers.
    const uint64_t max_items = (uint64_t{total} + 1) * R;
    uint32_t unit, cw;
    for (uint64_t i = 0; i < max_items && Core::receive(L.attn[0], sm, st, unit, cw); ++i) {
      const uint32_t t = cw / 2, g = cw % 2;
      if (t >= R || g >= groups) break;
      if (unit == kRingStepEnd) {  // this block's loads of chunk t completed (note 1)
        if (wg == 0 && tid == 0) ring_detail::count_freed(a, t, ring_detail::comm_blocks_of<kAdaptive>(a));
        continue;
      }
      if (unit >= a.units_per_group) break;
      const AttnChunk c = a.chunks[cw];
      Core::consume(L.attn[g], c, &maps.o[g], unit, sm, st, wg, tid);
    }
    Core::consumer_end(tid);
  }
}

// The kernel: blocks [0, comm_blocks) communicate, the others attend; the last block to leave
// ends the launch.
template <class T, bool kAdaptive>
__global__ void __launch_bounds__(T::kThreads, 1)
    ring_attention_kernel(const __grid_constant__ RingAttnMaps maps, const __grid_constant__ RingAttnLaunch L) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  const RingAttnArgs& a = *L.args;
  const uint64_t launch = launch_number(a.comm);
  const uint32_t comm_blocks = ring_detail::comm_blocks_of<kAdaptive>(a);
  if constexpr (kAdaptive) {
    if (a.split != nullptr && threadIdx.x == 0) split_block_start(a.split);
  }
  const bool comm = blockIdx.x < comm_blocks;
  if (comm) {
    ring_comm_role(L, launch, blockIdx.x, comm_blocks);
  } else {
    ring_attention_role<T, kAdaptive>(maps, L, launch, blockIdx.x - comm_blocks, gridDim.x - comm_blocks);
  }
  __syncthreads();
  // A consumer thread of an attention block (the producer warpgroup gave its registers away).
  const uint32_t exit_thread = comm ? 0 : 128;
  if (threadIdx.x == exit_thread) {
    if constexpr (kAdaptive) {
      if (a.split != nullptr) split_block_done(a.split, !comm);
    }
    if (count_block_exit(a.comm)) {
      // The adaptive split: measure this launch, choose the next one's (common/split_control.cuh).
      if constexpr (kAdaptive) {
        if (a.split != nullptr) split_launch_end(a.split, sync::ld_acquire_sys(&a.comm.status->code) != 0);
      }
      end_fused_launch(a.comm, a.geo.layout, a.comm.rank);
    }
  }
#endif
}

#endif  // __CUDACC__

}  // namespace mkernel::kernels
