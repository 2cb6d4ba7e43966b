// ag_gemm.cuh: the device code of AllGather+GEMM (host side: ag_gemm.h / ag_gemm.cu).
//
//   C[M, N_local] = AllGather(A_r [m_local, k] over ranks) [M, k] * W_r[N_local, k]^T
//
// One persistent kernel per rank: the GEMM engine (gemm/sm90_bf16_gemm.cuh) with this role.
//   GEMM blocks   compute the rank's own rows first, straight from A_r (GemmHooks::a_local), then
//                 every other tile once the chunks holding its rows are flagged ready in the
//                 gathered buffer (the engine's readiness hook, flags carry launch numbers).
//   comm blocks   run this rank's movement plan (ag_gemm_plan.h): every block moves a slice of
//                 every step, in order; the block finishing a step's last slice flags it. With
//                 copy-engine pushes (plan note 5) block 0 first opens the copy streams' gates.
//   every block   counts itself out (block_exit); the last one ends the launch: it records the
//                 launch and tells its node peers (done flags) and rail peers (slot-free signals)
//                 that its buffers may be written again.
#pragma once

#include <cstdint>

#include "common/bulk_copy.cuh"
#include "common/comm.cuh"
#include "common/split_control.cuh"
#include "fused/ag_gemm/ag_gemm_plan.h"
#include "fused/ag_gemm/ag_trace.h"
#include "fused/common/launch_state.cuh"
#include "fused/common/slice.cuh"
#include "gemm/sm90_bf16_gemm_params.h"

namespace mkernel::kernels {

// What the communication role needs, prepared once per plan in device memory
// (GemmParams::role_args). Per-launch pointers travel in GemmParams::role_ptrs:
//   role_ptrs[0]  A_r, this rank's shard [m_local, k] (packed, row-major)
//   role_ptrs[1]  an output for the whole gathered A [M, k], or null (then the workspace holds it
//                 until the next fused launch on this communicator)
struct AgGemmRoleArgs {
  DeviceComm comm;
  FusedLayout layout;
  uint32_t rank = 0;
  uint32_t m_local = 0;
  uint32_t k = 0;
  uint32_t chunk_rows = 0;
  uint32_t chunks = 0;
  uint32_t num_steps = 0;
  const AgStep* steps = nullptr;  // this rank's plan (device memory)
  uint8_t* gathered = nullptr;    // this rank's gathered A: the start of its NVLink buffer
  uint64_t* ready = nullptr;      // this rank's NVLink fused-op flags (ready(), done())
  uint8_t* workspace = nullptr;   // this rank's network workspace (nodes > 1), else null
  uint32_t* step_done = nullptr;  // per step: communication blocks done with their slice (zero between launches)
  uint32_t bulk = 1;              // 1: GPU-memory slices through the bulk copier; 0: 16-byte loads/stores
  // Copy-engine pushes (AgGemmConfig::copy_engine_pushes): the pushes of this rank's own chunks
  // to its node peers are the copy engines' (ag_gemm.cu), not the communication blocks'. Block 0
  // opens the gate of node peer i (go[i], i = 1 .. gpus - 1: L.node_peer(rank, i)) once that peer
  // finished its previous fused launch; the peer's copy stream waits for go[i] == 1
  // (cuStreamWaitValue32) and sets it back to 0.
  uint32_t* go = nullptr;  // device memory, gpus words (word 0 unused); null: SM pushes
  // With copy-engine pushes the gathered output goes by the copy engine too: block 0 opens the
  // gate of piece shard * chunks + chunk (out_go) once that chunk is in the gathered buffer; the
  // side stream waits for it, closes it and copies the chunk into gathered_out (walk_arrivals).
  uint32_t* out_go = nullptr;  // device memory, world * chunks words; null with SM pushes
  // AgGemmConfig::trace: %globaltimer stamps of the last launch (ag_trace.h has the layout);
  // null: nothing is recorded.
  uint64_t* trace = nullptr;
};

#if defined(__CUDACC__)

namespace ag_detail {

struct Ctx {
  const AgGemmRoleArgs& a;
  const DeviceComm& c;
  uint64_t launch;
  uint64_t prev;
  const uint8_t* a_local;
  uint8_t* gathered_out;

  __device__ uint64_t row_bytes() const { return uint64_t{a.k} * 2; }
  __device__ uint64_t shard_bytes() const { return uint64_t{a.m_local} * row_bytes(); }
  __device__ uint64_t chunk_offset(uint32_t c) const { return uint64_t{c} * a.chunk_rows * row_bytes(); }
  __device__ uint64_t chunk_bytes(uint32_t c) const {
    const uint32_t rows = c + 1 < a.chunks ? a.chunk_rows : a.m_local - (a.chunks - 1) * a.chunk_rows;
    return uint64_t{rows} * row_bytes();
  }
  __device__ uint32_t ready_flag(uint32_t shard, uint32_t c) const { return a.layout.nvl_op_flags() + shard * a.chunks + c; }
  // Whether a GEMM tile (128 rows) that reaches outside this rank's rows reads chunk c of them.
  __device__ bool straddled(uint32_t c) const {
    return ag_chunk_straddled(a.layout.world(), a.rank, a.m_local, a.chunk_rows, c,
                              static_cast<uint32_t>(chunk_bytes(c) / row_bytes()));
  }
  __device__ uint32_t done_flag(uint32_t peer) const { return a.layout.done_flag(peer); }
  __device__ uint32_t arrival_flag(uint32_t node, uint32_t c) const { return a.layout.net_op_flags() + node * a.chunks + c; }
  __device__ uint32_t slot_free_flag(uint32_t node) const { return a.layout.slot_free_flag(node); }
};

// Thread 0 waits for what a step needs (bounded). False: the error is recorded, the block stops.
__device__ __forceinline__ bool wait_step_inputs(const Ctx& x, const AgStep& s) {
  const WaitContext w = wait_context(x.c);
  const uint32_t r = x.a.rank;
  switch (s.kind) {
    case kAgLocal: return true;
    case kAgPush: {
      // The peer finished reading its gathered buffer in the previous fused launch.
      const uint32_t done = x.done_flag(s.peer);
      if (!wait_geq(x.a.ready + done, x.prev, w, done, where_tag(kStepPeerFree, s.peer))) return false;
      if (s.shard == r) return true;
      // Forwarding a shard from another node: this rank received it first.
      const uint32_t f = x.ready_flag(s.shard, s.chunk);
      return wait_geq(x.a.ready + f, x.launch, w, f, where_tag(kStepShardArrival, uint64_t{s.shard} * 65536 + s.chunk));
    }
    case kAgSend:
      // Every rail peer finished forwarding out of the slot this rank writes (previous launch).
      for (uint32_t i = 1; i < x.a.layout.nodes; ++i) {
        const uint32_t to = x.a.layout.send_node(s.node, i);
        const uint32_t f = fused_flag_index(x.c, x.slot_free_flag(to));
        if (!wait_geq(x.c.flags + f, x.prev, w, f, where_tag(kStepPeerFree, x.a.layout.rail_peer(r, to))))
          return false;
      }
      return true;
    case kAgReceive: {
      const uint32_t f = fused_flag_index(x.c, x.arrival_flag(s.node, s.chunk));
      return wait_geq(x.c.flags + f, x.launch, w, f, where_tag(kStepNetworkArrival, uint64_t{s.node} * 65536 + s.chunk));
    }
  }
  return false;
}

// Copies this block's slice of a `bytes`-long transfer (fused/common/slice.cuh): every
// communication block moves part of every step and all of them drive their links at once. GPU
// memory to GPU memory (local or a peer's over NVLink) goes through thread 0's bulk copier (or,
// with bulk == 0, every thread's loads and stores); anything touching mapped host memory with
// every thread's loads and stores (kPolicy).
using kernels::Slice;
using kernels::slice_of;

// Runs this block's part of one step; returns the same on every thread. The block that finishes
// the step's last slice publishes it (raises the flag, or puts to the rail peers).
__device__ __forceinline__ bool run_step(const Ctx& x, uint32_t i, const AgStep& s, BulkCopier& copier,
                                         uint32_t block, uint32_t blocks) {
  __shared__ bool ok;
  __shared__ bool last;
  uint64_t* const stamps = x.a.trace != nullptr ? x.a.trace + ag_trace_step(i) : nullptr;
  const bool stamp = stamps != nullptr && block == 0 && threadIdx.x == 0;
  __syncthreads();  // every thread read the previous step's `ok` before it is written again
  if (stamp) stamps[kAgTraceWaitFrom] = sync::globaltimer_ns();
  if (threadIdx.x == 0) ok = wait_step_inputs(x, s);
  if (stamp) stamps[kAgTraceInputsReady] = sync::globaltimer_ns();
  __syncthreads();
  if (!ok) return false;
  const uint32_t r = x.a.rank;
  const uint64_t off = x.chunk_offset(s.chunk);
  const uint64_t at = uint64_t{s.shard} * x.shard_bytes() + off;  // the chunk in a gathered buffer
  const uint64_t slot_at = uint64_t{s.node} * x.shard_bytes() + off;  // in the network workspace
  const uint64_t where = where_tag(kStepShardArrival, uint64_t{s.shard} * 65536 + s.chunk);
  uint64_t bytes = x.chunk_bytes(s.chunk);
  if (s.kind == kAgLocal && !x.straddled(s.chunk)) bytes = 0;  // read from A_r by the GEMM itself
  const Slice sl = slice_of(bytes, block, blocks);
  // GPU memory to GPU memory.
  auto device_copy = [&](uint8_t* dst, const uint8_t* src, bool src_written_here) {
    if (sl.bytes == 0) return;
    if (x.a.bulk != 0) {
      if (threadIdx.x == 0 && !copier.copy(dst + sl.begin, src + sl.begin, sl.bytes, x.c.wait_timeout_ns)) {
        report(x.c, kDevicePipelineTimeout, 0, where);
        ok = false;
      }
    } else if (src_written_here) {
      block_copy<LoadPolicy::kL2>(dst + sl.begin, src + sl.begin, sl.bytes);
    } else {
      block_copy<LoadPolicy::kStream>(dst + sl.begin, src + sl.begin, sl.bytes);
    }
  };
  switch (s.kind) {
    case kAgLocal: device_copy(x.a.gathered + at, x.a_local + off, false); break;
    case kAgPush:
      device_copy(nvl_ptr(x.c, s.peer) + at, s.shard == r ? x.a_local + off : x.a.gathered + at, s.shard != r);
      break;
    case kAgSend:  // stage once in slot `node` of the own workspace (mapped host memory)
      if (sl.bytes > 0) block_copy<LoadPolicy::kStream>(x.a.workspace + slot_at + sl.begin, x.a_local + off + sl.begin, sl.bytes);
      break;
    case kAgReceive:
      if (sl.bytes > 0)
        block_copy<LoadPolicy::kVolatile>(x.a.gathered + at + sl.begin, x.a.workspace + slot_at + sl.begin, sl.bytes);
      break;
  }
  // Count this block's slice done; the last one publishes the step. Each block's fence makes its
  // slice visible system-wide before its count; the last block's fence after the count carries
  // them all before the flag (fence cumulativity).
  __syncwarp();
  __syncthreads();
  if (stamp) stamps[kAgTraceSliceDone] = sync::globaltimer_ns();
  if (threadIdx.x == 0) {
    sync::fence_acq_rel_sys();
    last = atomicAdd(&x.a.step_done[i], 1u) == blocks - 1;
    if (last) {
      x.a.step_done[i] = 0;  // zero again for the next launch
      sync::fence_acq_rel_sys();
    }
  }
  __syncthreads();
  if (!ok) return false;
  if (!last || threadIdx.x != 0) return true;
  if (stamps != nullptr) stamps[kAgTracePublished] = sync::globaltimer_ns();
  switch (s.kind) {
    case kAgLocal:
    case kAgReceive: raise_flag(x.a.ready + x.ready_flag(s.shard, s.chunk), x.launch); break;
    case kAgPush: raise_flag(nvl_fused_flag(x.c, s.peer, x.ready_flag(s.shard, s.chunk)), x.launch); break;
    case kAgSend:
      for (uint32_t j = 1; j < x.a.layout.nodes; ++j) {
        const uint32_t to = x.a.layout.rail_peer(r, x.a.layout.send_node(s.node, j));
        if (!put_signal(x.c, to, x.c.network_workspace, slot_at, x.c.network_workspace, slot_at, bytes,
                        fused_flag_index(x.c, x.arrival_flag(s.node, s.chunk)), where_tag(kStepNetworkSend, to)))
          break;  // recorded; this rank's waits end and its peers' time out or see the abort
      }
      break;
  }
  return true;
}

// Thread 0 of role block 0, with copy-engine pushes: for each node peer, wait (bounded) until it
// finished reading its gathered buffer in the previous fused launch, then let the copy stream
// that pushes to it go. The gate opens even when the wait failed: the copy stream must not be
// left waiting past the kernel (its wait has no bound of its own). The failure is then in this
// rank's status word and its peers' abort words; such a failure means a peer did not finish its
// previous launch within the bound (a hung or stopped process), and the copies that follow may
// overwrite rows that launch still reads (docs/kernels.md section 10).
__device__ __forceinline__ void open_gates(const Ctx& x) {
  const WaitContext w = wait_context(x.c);
  const FusedLayout& L = x.a.layout;
  bool ok = true;
  for (uint32_t i = 1; i < L.gpus; ++i) {
    const uint32_t peer = L.node_peer(x.a.rank, i);
    const uint32_t done = x.done_flag(peer);
    if (ok && !wait_geq(x.a.ready + done, x.prev, w, done, where_tag(kStepPeerFree, peer))) {
      ok = false;
      abort_peers(x.c);
    }
    sync::fence_acq_rel_sys();
    sync::st_relaxed_sys(x.a.go + i, 1u);
  }
  if (x.a.trace != nullptr) x.a.trace[kAgTraceGatesOpen] = sync::globaltimer_ns();
}

// Thread 0 of role block 0: every other rank's chunk in piece order, waiting (bounded) until it is
// in the gathered buffer; stamps when it was first seen (AgGemmConfig::trace: not before this walk
// began, which the trace also says) and, with `open` (copy-engine pushes and a gathered output),
// then opens its gate, in the order the side stream copies them (ag_gemm.cu). With `open` every
// gate opens, also after a failure (`ok` false, or a wait that expired: the error is in the
// status word), so the side stream never waits past the kernel; without, the walk ends there.
__device__ __forceinline__ void walk_arrivals(const Ctx& x, bool ok, bool open) {
  const WaitContext w = wait_context(x.c);
  const uint32_t pieces = x.a.layout.world() * x.a.chunks;
  for (uint32_t i = 0; i < pieces; ++i) {
    const uint32_t shard = i / x.a.chunks, chunk = i % x.a.chunks;
    if (shard == x.a.rank) continue;
    const uint32_t f = x.ready_flag(shard, chunk);
    if (ok) ok = wait_geq(x.a.ready + f, x.launch, w, f, where_tag(kStepShardArrival, uint64_t{shard} * 65536 + chunk));
    if (ok && x.a.trace != nullptr) x.a.trace[ag_trace_arrival(x.a.num_steps, i)] = sync::globaltimer_ns();
    if (!open) {
      if (!ok) return;
      continue;
    }
    sync::fence_acq_rel_sys();
    sync::st_relaxed_sys(x.a.out_go + i, 1u);
  }
}

}  // namespace ag_detail

// kAdaptive: the instantiation for plans with AgGemmConfig::adaptive_split (the engine reads the
// split from GemmParams::split and measures; docs/kernels.md section 16).
template <bool kAdaptive>
struct AgGemmRoleT {
  static constexpr bool kHasBlockExit = true;
  static constexpr bool kAdaptiveSplit = kAdaptive;
  static constexpr bool kProgrammaticLaunch = true;  // may overlap begin_launch (AgGemmConfig)

  __device__ static void run(const GemmParams& p, uint32_t role_block, uint32_t num_role_blocks) {
    const auto& a = *static_cast<const AgGemmRoleArgs*>(p.role_args);
    const ag_detail::Ctx x{a,
                           a.comm,
                           launch_number(a.comm),
                           previous_fused_launch(a.comm),
                           static_cast<const uint8_t*>(p.role_ptrs[0]),
                           static_cast<uint8_t*>(const_cast<void*>(p.role_ptrs[1]))};
    // The block's shared memory is the role's (the GEMM contract): thread 0's bulk copier.
    extern __shared__ uint8_t role_smem_raw[];
    BulkCopier copier;
    if (threadIdx.x == 0)
      copier.init(reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(role_smem_raw) + 1023) & ~uintptr_t{1023}));
    const bool stamp = a.trace != nullptr && role_block == 0 && threadIdx.x == 0;
    if (stamp) a.trace[kAgTraceStart] = sync::globaltimer_ns();
    // Copy-engine pushes: open every node peer's gate first, whatever happens (the copy streams
    // wait for it, and only a kernel that ends can release them: this is what bounds their wait).
    if (a.go != nullptr && role_block == 0 && threadIdx.x == 0) ag_detail::open_gates(x);
    // Every block takes part in every step (its slice), in the plan's order (with copy-engine
    // pushes, the plan without the own chunks' pushes: ag_block_steps).
    bool steps_ok = true;
    for (uint32_t i = 0; i < a.num_steps && steps_ok; ++i)
      steps_ok = ag_detail::run_step(x, i, a.steps[i], copier, role_block, num_role_blocks);
    if (stamp) a.trace[kAgTraceStepsDone] = sync::globaltimer_ns();
    // The gathered output with copy-engine pushes: its gates, opened whatever happened above.
    if (x.gathered_out != nullptr && a.out_go != nullptr) {
      if (role_block == 0 && threadIdx.x == 0) ag_detail::walk_arrivals(x, steps_ok, true);
      return;
    }
    if (x.gathered_out == nullptr) {
      if (stamp && steps_ok) ag_detail::walk_arrivals(x, true, false);
      return;
    }
    if (!steps_ok) return;
    // The gathered output, when the caller asked for one: every other rank's chunk once it is
    // here, each block its slice (the own rows are the copy engine's, ag_gemm.cu).
    const WaitContext w = wait_context(a.comm);
    const uint32_t pieces = a.layout.world() * a.chunks;
    __shared__ bool ok;
    for (uint32_t i = 0; i < pieces; ++i) {
      const uint32_t shard = i / a.chunks, chunk = i % a.chunks;
      if (shard == a.rank) continue;
      const uint64_t where = where_tag(kStepShardArrival, uint64_t{shard} * 65536 + chunk);
      __syncthreads();
      const uint32_t f = x.ready_flag(shard, chunk);
      if (threadIdx.x == 0) ok = wait_geq(a.ready + f, x.launch, w, f, where);
      if (stamp && ok) a.trace[ag_trace_arrival(a.num_steps, i)] = sync::globaltimer_ns();
      __syncthreads();
      if (!ok) return;
      const uint64_t at = uint64_t{shard} * x.shard_bytes() + x.chunk_offset(chunk);
      const ag_detail::Slice sl = ag_detail::slice_of(x.chunk_bytes(chunk), role_block, num_role_blocks);
      if (sl.bytes == 0) continue;
      if (a.bulk != 0) {
        if (threadIdx.x == 0 && !copier.copy(x.gathered_out + at + sl.begin, a.gathered + at + sl.begin, sl.bytes,
                                             a.comm.wait_timeout_ns))
          report(a.comm, kDevicePipelineTimeout, 0, where);
      } else {
        block_copy<LoadPolicy::kL2>(x.gathered_out + at + sl.begin, a.gathered + at + sl.begin, sl.bytes);
      }
    }
  }

  // Thread 0 of every block after its work; the last block ends the launch (launch_state.cuh).
  __device__ static void block_exit(const GemmParams& p) {
    const auto& a = *static_cast<const AgGemmRoleArgs*>(p.role_args);
    if (count_block_exit(a.comm)) {
      if (a.trace != nullptr) a.trace[kAgTraceEnd] = sync::globaltimer_ns();
      // The adaptive split: measure this launch, choose the next one's (common/split_control.cuh).
      if constexpr (kAdaptive) {
        if (p.split != nullptr) split_launch_end(p.split, sync::ld_acquire_sys(&a.comm.status->code) != 0);
      }
      end_fused_launch(a.comm, a.layout, a.rank);
    }
  }

};

using AgGemmRole = AgGemmRoleT<false>;
using AgGemmRoleAdaptive = AgGemmRoleT<true>;

#endif  // __CUDACC__

}  // namespace mkernel::kernels
