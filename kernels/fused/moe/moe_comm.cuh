// moe_comm.cuh: the device code of the MoE's dispatch, the context the combine shares with it,
// and the end of a launch (the combine's items: moe_combine.cuh; host side: moe.h / moe.cu; the
// protocol and its CPU replay: moe_plan.h). Two persistent kernels, one launch each:
//
//   dispatch  route (block 0) -> count records -> tokens, once per rank over NVLink and once per
//             node through the proxies -> rail peers forward -> the receiver lays out its
//             expert rows and expands every token into the rows of its experts here.
//   combine   per received token, score x expert output summed over its experts here (fp32, choice
//             order) -> one bf16 partial back the way the token came -> rail peers sum their
//             node's partials and send one row home -> the home rank sums, in fixed order.
//
// Design notes
//  1. Work items. After block 0 routed, every block takes the items of each stage round-robin,
//     stage after stage: dispatch items (destination rank or node, chunk), forward items (source
//     node, chunk; and the node's count records), expand items (source, chunk). An item waits
//     only for earlier stages (of any rank) or the previous launch, and all blocks are resident
//     (one per SM at most), so the stages cannot wait on each other in a circle.
//  2. A warp moves a token: one row of `hidden` bf16 as 16-byte accesses per lane, and its
//     record (moe_plan.h MoeMeta). Rows to a peer go straight into its NVLink buffer; rows to
//     another node are staged in this rank's network workspace (host memory) chunk by chunk, a
//     chunk's rows then records contiguous, and put with one command that raises the arrival flag.
//  3. Flags (moe_plan.h MoeGeometry) carry launch numbers. A chunk's flag goes up after the whole
//     block's stores, one system fence per chunk. A forwarded chunk's tokens land in several
//     chunks of each destination's region: per (source, destination, chunk) counters in device
//     memory collect them, and whoever completes a chunk raises its flag and zeroes the counter.
//  4. The combine reads what the dispatch left: the routing, the count records, the token
//     records in the NVLink regions and network slots. So a combine must follow its dispatch on
//     the communicator with no other fused launch between (the runtime checks this), and each
//     rank's done() flag at the end of the dispatch tells writers only that partial regions may
//     be written (the token regions are read again by this rank's combine, and are next written
//     by a dispatch, which waits for the done() of the combine).
#pragma once

#include <cstdint>
#include <type_traits>

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#endif

#include "common/comm.cuh"
#include "common/phase_trace.cuh"
#include "common/split_control.cuh"
#include "fused/common/launch_state.cuh"
#include "fused/moe/moe_plan.h"
#include "fused/moe/moe_route.cuh"

namespace mkernel::kernels {

// Threads of the fused kernel's blocks (the grouped GEMM's: a producer and two consumer
// warpgroups); the routing block uses at most this many warps there.
inline constexpr uint32_t kMoeFusedThreads = 384;

// Local flags (device memory, launch numbers): the routing is done; the row layout is done;
// source i (arrival order) is expanded.
inline constexpr uint32_t kMoeFlagRouted = 0;
inline constexpr uint32_t kMoeFlagLayout = 1;
inline constexpr uint32_t kMoeFlagExpanded = 2;  // + source index

// The fused kernel's waits let their sleep grow to an eighth of the time waited (wait.cuh
// note 6): its GEMM producers and combine warps wait for milliseconds beside the blocks that
// route, expand and compute.
inline constexpr uint32_t kMoeLongWaitShift = 3;

struct MoeKernelArgs {
  DeviceComm comm;
  FusedLayout layout;
  uint32_t rank = 0, tokens = 0, hidden = 0, out_hidden = 0, experts = 0, top_k = 0;
  uint32_t capacity = 0, chunk = 0, chunks = 0, meta_words = 0, count_words = 0, net_count_words = 0;
  uint64_t rows_capacity = 0;
  // NVLink buffer (every rank the same layout): count records [world] (count_stride bytes each),
  // token rows [world][capacity][hidden], records [world][capacity][meta_words], partials
  // [gpus][nodes][capacity][out_hidden].
  uint64_t off_counts = 0, count_stride = 0, off_tokens = 0, off_meta = 0, off_partials = 0;
  // Network workspace of this rank (host memory): incoming slot n at net_in + n * net_slot,
  // outgoing slot n at net_out + n * net_slot; inside a slot the count record at 0, chunk c's
  // rows and records at net_data + c * net_chunk_bytes, partial rows at net_part.
  uint8_t* net = nullptr;
  uint64_t net_in = 0, net_out = 0, net_slot = 0, net_data = 0, net_chunk_bytes = 0, net_part = 0;
  // Local workspace (device memory).
  MoeRouteArgs route;               // its outputs persist until the combine
  uint32_t route_warps = 0;
  uint32_t* order = nullptr;        // [world][capacity]: the token at pos
  uint32_t* norder = nullptr;       // [nodes][capacity]: the token at npos
  uint32_t* recv_counts = nullptr;  // [world][count_words]: the count records, kept for the combine
  uint32_t* expert_base = nullptr;  // [epr + 1]
  uint32_t* source_base = nullptr;  // [epr][world], by source rank
  uint64_t* flags = nullptr;        // kMoeFlagExpanded + world local flags
  uint32_t* fwd_count = nullptr;    // [nodes][gpus][chunks]: forwarded tokens per destination chunk (note 3)
  uint32_t* expand_count = nullptr; // [world]: chunks expanded per source
  uint32_t apply_scores = 1;        // the combine weights expert outputs by the router scores
  // The fused kernel (dispatch + grouped GEMM + combine, moe_fused.cu): the plan's own expert
  // rows, outputs and offsets; readiness of each 128-row band of expert rows for the GEMM
  // (band_flags, raised when band_count reaches the band's rows); the first flat m block of each
  // expert (the GEMM's m block flags are per flat m block, note 5 of the grouped map).
  void* x_expert = nullptr;
  void* y_expert = nullptr;
  uint32_t* expert_offsets = nullptr;
  uint64_t* band_flags = nullptr;
  uint32_t* band_count = nullptr;
  uint32_t* mblk_base = nullptr;    // [epr + 1]
  // One flag per flat m block, raised when all its n blocks are stored (the grouped GEMM's
  // hooks.mblock_flags, which count the tiles the GEMM flags): what the combine waits on.
  const uint64_t* mblock_flags = nullptr;
};

// Per-launch pointers (kernel parameters, so a CUDA graph captures them).
struct MoeDispatchPtrs {
  const void* x;            // [tokens][hidden] bf16
  const int32_t* choices;   // [tokens][top_k]
  const float* scores;      // [tokens][top_k]
  void* x_expert;           // [rows_capacity][hidden] bf16: the expert-ordered rows
  uint32_t* expert_offsets; // [epr + 1]: rows of local expert e are [offsets[e], offsets[e+1])
  int32_t* row_source;      // [rows_capacity] or null: the home rank of each row's token
  int32_t* row_token;       // [rows_capacity] or null: the token's index on its home rank
  float* row_score;         // [rows_capacity] or null: the router score of the row's choice
};
struct MoeCombinePtrs {
  const void* y_expert;     // [rows_capacity][out_hidden] bf16, the rows dispatch laid out
  void* out;                // [tokens][out_hidden] bf16
};

#if defined(__CUDACC__)

namespace moe_detail {

struct Ctx {
  const MoeKernelArgs& a;
  const DeviceComm& c;
  uint64_t launch, prev;
  WaitContext w;
  __device__ uint32_t world() const { return a.layout.world(); }
  __device__ uint32_t epr() const { return a.experts / world(); }
  __device__ uint32_t own_node() const { return a.layout.node_of(a.rank); }
  __device__ uint32_t local() const { return a.layout.local_of(a.rank); }
  __device__ MoeShape shape() const { return MoeShape{a.layout, a.experts, a.top_k}; }
  __device__ MoeMeta meta() const { return MoeMeta{a.top_k, a.layout.gpus}; }
  // Flag indices (MoeGeometry).
  __device__ uint32_t count_flag(uint32_t s) const { return a.layout.nvl_op_flags() + s; }
  __device__ uint32_t token_flag(uint32_t s, uint32_t ch) const {
    return a.layout.nvl_op_flags() + world() + s * a.chunks + ch;
  }
  __device__ uint32_t partial_flag(uint32_t l, uint32_t n, uint32_t ch) const {
    return a.layout.nvl_op_flags() + world() * (1 + a.chunks) + (l * a.layout.nodes + n) * a.chunks + ch;
  }
  __device__ uint32_t net_count_flag(uint32_t n) const { return a.layout.net_op_flags() + n; }
  __device__ uint32_t net_token_flag(uint32_t n, uint32_t ch) const {
    return a.layout.net_op_flags() + a.layout.nodes + n * a.chunks + ch;
  }
  __device__ uint32_t net_partial_flag(uint32_t n, uint32_t ch) const {
    return a.layout.net_op_flags() + a.layout.nodes * (1 + a.chunks) + n * a.chunks + ch;
  }
  // Places.
  __device__ uint8_t* nvl(uint32_t r) const { return nvl_ptr(c, r); }
  __device__ uint32_t* count_rec(uint32_t r, uint32_t s) const {
    return reinterpret_cast<uint32_t*>(nvl(r) + a.off_counts + s * a.count_stride);
  }
  __device__ uint8_t* token_row(uint32_t r, uint32_t s, uint32_t p) const {
    return nvl(r) + a.off_tokens + (uint64_t{s} * a.capacity + p) * a.hidden * 2;
  }
  __device__ uint32_t* meta_rec(uint32_t r, uint32_t s, uint32_t p) const {
    return reinterpret_cast<uint32_t*>(nvl(r) + a.off_meta + (uint64_t{s} * a.capacity + p) * a.meta_words * 4);
  }
  __device__ uint8_t* partial_row(uint32_t r, uint32_t l, uint32_t n, uint32_t p) const {
    return nvl(r) + a.off_partials + ((uint64_t{l} * a.layout.nodes + n) * a.capacity + p) * a.out_hidden * 2;
  }
  __device__ uint64_t in_slot(uint32_t n) const { return a.net_in + n * a.net_slot; }
  __device__ uint64_t out_slot(uint32_t n) const { return a.net_out + n * a.net_slot; }
  // Offsets inside a slot: chunk ch's rows, then its records; partial rows.
  __device__ uint64_t slot_row(uint32_t q) const {
    return a.net_data + uint64_t{q / a.chunk} * a.net_chunk_bytes + uint64_t{q % a.chunk} * a.hidden * 2;
  }
  __device__ uint64_t slot_meta(uint32_t q) const {
    return a.net_data + uint64_t{q / a.chunk} * a.net_chunk_bytes + uint64_t{a.chunk} * a.hidden * 2 +
           uint64_t{q % a.chunk} * a.meta_words * 4;
  }
  __device__ uint64_t slot_partial(uint32_t q) const { return a.net_part + uint64_t{q} * a.out_hidden * 2; }
  __device__ uint32_t chunk_tokens(uint32_t total, uint32_t ch) const {
    return total > ch * a.chunk ? min(a.chunk, total - ch * a.chunk) : 0;
  }

  __device__ bool wait_nvl(uint32_t idx, uint64_t value, uint64_t where) const {
    return wait_geq(nvl_fused_flag(c, a.rank, idx), value, w, idx, where);
  }
  __device__ bool wait_net(uint32_t idx, uint64_t value, uint64_t where) const {
    const uint32_t f = fused_flag_index(c, idx);
    return wait_geq(c.flags + f, value, w, f, where);
  }
  __device__ bool wait_local(uint32_t idx, uint64_t value, uint64_t where) const {
    return wait_geq(a.flags + idx, value, w, idx, where);
  }
};

// One warp copies a row of `bytes` (a multiple of 16).
template <LoadPolicy kPolicy>
__device__ __forceinline__ void warp_copy(void* dst, const void* src, uint64_t bytes, uint32_t lane) {
  auto* d = static_cast<uint4*>(dst);
  const auto* s = static_cast<const uint4*>(src);
  const uint32_t n = static_cast<uint32_t>(bytes / 16);
  uint32_t i = lane;
  for (; i + 96 < n; i += 128) {
    const uint4 v0 = load16<kPolicy>(s + i), v1 = load16<kPolicy>(s + i + 32), v2 = load16<kPolicy>(s + i + 64),
                v3 = load16<kPolicy>(s + i + 96);
    d[i] = v0;
    d[i + 32] = v1;
    d[i + 64] = v2;
    d[i + 96] = v3;
  }
  for (; i < n; i += 32) d[i] = load16<kPolicy>(s + i);
}

// A warp-wide bounded wait: lane 0 waits, every lane gets the answer.
template <class F>
__device__ __forceinline__ bool warp_wait(uint32_t lane, F&& wait) {
  bool ok = true;
  if (lane == 0) ok = wait();
  return __shfl_sync(0xffffffffu, ok ? 1 : 0, 0) != 0;
}

// The record of token t for destination node `node` (moe_plan.h MoeMeta), by one lane.
__device__ __forceinline__ void write_meta(const Ctx& x, const MoeDispatchPtrs& p, uint32_t t, uint32_t node,
                                           uint32_t* m) {
  const MoeMeta mm = x.meta();
  const MoeShape sh = x.shape();
  const uint32_t k = x.a.top_k;
  for (uint32_t j = 0; j < k; ++j) {
    const int32_t e = p.choices[size_t{t} * k + j];
    const bool here = e >= 0 && sh.node_of_expert(static_cast<uint32_t>(e)) == node;
    m[mm.expert(j)] = here ? static_cast<uint32_t>(e) : 0xffffffffu;
    m[mm.slot(j)] = here ? x.a.route.slot[size_t{t} * k + j] : kMoeNoChoice;
    m[mm.score(j)] = __float_as_uint(here ? p.scores[size_t{t} * k + j] : 0.0f);
  }
  for (uint32_t l = 0; l < x.a.layout.gpus; ++l)
    m[mm.pos(l)] = x.a.route.pos[size_t{t} * x.world() + x.a.layout.rank_of(node, l)];
  m[mm.token()] = t;
  for (uint32_t i = mm.token() + 1; i < x.a.meta_words; ++i) m[i] = 0;
}

// After a block's stores: one thread fences (system scope) and raises `flag`.
__device__ __forceinline__ void publish(uint64_t* flag, uint64_t launch) {
  __syncthreads();
  if (threadIdx.x == 0) raise_flag(flag, launch);
  __syncthreads();
}

// ---- dispatch ---------------------------------------------------------------------------------

// Block 0: routing, then count records to every rank (note 1 of moe_plan.h, note 4).
__device__ inline bool route_and_count(const Ctx& x, const MoeDispatchPtrs& p, uint32_t* smem) {
  const MoeKernelArgs& a = x.a;
  MoeRouteArgs r = a.route;
  r.choices = p.choices;
  moe_route_block(r, smem, a.route_warps);
  if (threadIdx.x == 0) MK_TRACE_MARK(12);  // phase trace: routed
  __shared__ bool ok;
  if (threadIdx.x == 0) {
    const MoeRouteResult res = *a.route.result;
    ok = res.code == kMoeRouteOk;
    if (!ok) report(x.c, kDeviceMoeRouting, res.code, where_tag(kStepMoeRoute, res.index));
  }
  __syncthreads();
  if (!ok) return false;
  // The inverse of pos() and npos(): the token at each position (for the dispatch items).
  const uint32_t world = x.world(), nodes = a.layout.nodes;
  for (uint32_t t = threadIdx.x; t < a.tokens; t += blockDim.x) {
    for (uint32_t d = 0; d < world; ++d) {
      const uint32_t q = a.route.pos[size_t{t} * world + d];
      if (q != kMoeNoChoice) a.order[size_t{d} * a.capacity + q] = t;
    }
    for (uint32_t n = 0; n < nodes; ++n) {
      const uint32_t q = a.route.npos[size_t{t} * nodes + n];
      if (q != kMoeNoChoice) a.norder[size_t{n} * a.capacity + q] = t;
    }
  }
  if (threadIdx.x == 0) MK_TRACE_MARK(13);  // the positions inverted
  publish(a.flags + kMoeFlagRouted, x.launch);
  if (threadIdx.x == 0) MK_TRACE_MARK(14);  // the routed flag raised
  // Count records: node peers (and this rank) over NVLink, other nodes through the rail peers.
  const uint32_t epr = x.epr();
  for (uint32_t i = 0; i < a.layout.gpus; ++i) {
    const uint32_t d = i == 0 ? a.rank : a.layout.node_peer(a.rank, i);
    if (threadIdx.x == 0 && d != a.rank)
      ok = x.wait_nvl(a.layout.done_flag(d), x.prev, where_tag(kStepPeerFree, d));
    __syncthreads();
    if (!ok) return false;
    uint32_t* rec = x.count_rec(d, a.rank);
    for (uint32_t j = threadIdx.x; j < a.count_words; j += blockDim.x)
      rec[j] = j == 0 ? a.route.send_tokens[d] : a.route.rows[size_t{d} * epr + j - 1];
    publish(nvl_fused_flag(x.c, d, x.count_flag(a.rank)), x.launch);
  }
  for (uint32_t i = 1; i < nodes; ++i) {
    const uint32_t n = a.layout.send_node(x.own_node(), i), f = a.layout.rail_peer(a.rank, n);
    if (threadIdx.x == 0) ok = x.wait_net(a.layout.slot_free_flag(n), x.prev, where_tag(kStepPeerFree, f));
    __syncthreads();
    if (!ok) return false;
    auto* rec = reinterpret_cast<uint32_t*>(a.net + x.out_slot(n));
    for (uint32_t j = threadIdx.x; j < a.net_count_words; j += blockDim.x) {
      if (j == 0) {
        rec[0] = a.route.node_tokens[n];
        continue;
      }
      const uint32_t l = (j - 1) / a.count_words, w = (j - 1) % a.count_words, d = a.layout.rank_of(n, l);
      rec[j] = w == 0 ? a.route.send_tokens[d] : a.route.rows[size_t{d} * epr + w - 1];
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      sync::fence_acq_rel_sys();
      ok = put_signal(x.c, f, x.c.network_workspace, x.out_slot(n), x.c.network_workspace, x.in_slot(x.own_node()),
                      uint64_t{a.net_count_words} * 4, fused_flag_index(x.c, x.net_count_flag(x.own_node())),
                      where_tag(kStepNetworkSend, f));
    }
    __syncthreads();
    if (!ok) return false;
  }
  return true;
}

// A dispatch item: chunk ch of the tokens for rank d of this node, or for node n (note 2).
__device__ inline bool dispatch_item(const Ctx& x, const MoeDispatchPtrs& p, bool to_node, uint32_t dest,
                                     uint32_t ch) {
  const MoeKernelArgs& a = x.a;
  const uint32_t total = to_node ? a.route.node_tokens[dest] : a.route.send_tokens[dest];
  const uint32_t n_tok = x.chunk_tokens(total, ch);
  if (n_tok == 0) return true;
  __shared__ bool ok;
  if (threadIdx.x == 0) {
    if (to_node) ok = x.wait_net(a.layout.slot_free_flag(dest), x.prev, where_tag(kStepPeerFree, a.layout.rail_peer(a.rank, dest)));
    else ok = dest == a.rank || x.wait_nvl(a.layout.done_flag(dest), x.prev, where_tag(kStepPeerFree, dest));
  }
  __syncthreads();
  if (!ok) return false;
  const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  const uint64_t row_bytes = uint64_t{a.hidden} * 2;
  const uint32_t node = to_node ? dest : x.own_node();
  for (uint32_t i = warp; i < n_tok; i += warps) {
    const uint32_t q = ch * a.chunk + i;
    const uint32_t t = to_node ? a.norder[size_t{dest} * a.capacity + q] : a.order[size_t{dest} * a.capacity + q];
    const void* src = static_cast<const uint8_t*>(p.x) + size_t{t} * row_bytes;
    if (to_node) {
      warp_copy<LoadPolicy::kStream>(a.net + x.out_slot(dest) + x.slot_row(q), src, row_bytes, lane);
      if (lane == 0) write_meta(x, p, t, node, reinterpret_cast<uint32_t*>(a.net + x.out_slot(dest) + x.slot_meta(q)));
    } else {
      warp_copy<LoadPolicy::kStream>(x.token_row(dest, a.rank, q), src, row_bytes, lane);
      if (lane == 0) write_meta(x, p, t, node, x.meta_rec(dest, a.rank, q));
    }
  }
  if (!to_node) {
    publish(nvl_fused_flag(x.c, dest, x.token_flag(a.rank, ch)), x.launch);
    return true;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    sync::fence_acq_rel_sys();
    const uint32_t f = a.layout.rail_peer(a.rank, dest);
    const uint64_t at = a.net_data + uint64_t{ch} * a.net_chunk_bytes;
    // The whole chunk (rows, then records; a short last chunk still moves its full stride).
    ok = put_signal(x.c, f, x.c.network_workspace, x.out_slot(dest) + at, x.c.network_workspace,
                    x.in_slot(x.own_node()) + at, a.net_chunk_bytes,
                    fused_flag_index(x.c, x.net_token_flag(x.own_node(), ch)), where_tag(kStepNetworkSend, f));
  }
  __syncthreads();
  return ok;
}

// Forward items: the count records of node n (ch == chunks), or its token chunk ch.
__device__ inline bool forward_item(const Ctx& x, uint32_t n, uint32_t ch) {
  const MoeKernelArgs& a = x.a;
  const uint32_t s = a.layout.rail_peer(a.rank, n);  // the sender on node n
  __shared__ bool ok;
  if (threadIdx.x == 0) ok = x.wait_net(x.net_count_flag(n), x.launch, where_tag(kStepMoeNetwork, uint64_t{n} * 65536 + 0xffff));
  __syncthreads();
  if (!ok) return false;
  const auto* rec = reinterpret_cast<const volatile uint32_t*>(a.net + x.in_slot(n));
  if (ch == a.chunks) {  // spread the count records to this node's ranks
    for (uint32_t l = 0; l < a.layout.gpus; ++l) {
      const uint32_t d = a.layout.rank_of(x.own_node(), l);
      if (threadIdx.x == 0) ok = d == a.rank || x.wait_nvl(a.layout.done_flag(d), x.prev, where_tag(kStepPeerFree, d));
      __syncthreads();
      if (!ok) return false;
      uint32_t* dst = x.count_rec(d, s);
      for (uint32_t j = threadIdx.x; j < a.count_words; j += blockDim.x) dst[j] = rec[1 + l * a.count_words + j];
      publish(nvl_fused_flag(x.c, d, x.count_flag(s)), x.launch);
    }
    return true;
  }
  const uint32_t n_tok = x.chunk_tokens(rec[0], ch);
  if (n_tok == 0) return true;
  if (threadIdx.x == 0)
    ok = x.wait_net(x.net_token_flag(n, ch), x.launch, where_tag(kStepMoeNetwork, uint64_t{n} * 65536 + ch));
  __syncthreads();
  if (!ok) return false;
  // Every destination of this node must have finished its previous launch (once per item: a
  // flag read each).
  if (threadIdx.x < a.layout.gpus) {
    const uint32_t d = a.layout.rank_of(x.own_node(), threadIdx.x);
    if (d != a.rank && !x.wait_nvl(a.layout.done_flag(d), x.prev, where_tag(kStepPeerFree, d))) ok = false;
  }
  __syncthreads();
  if (!ok) return false;
  const MoeMeta mm = x.meta();
  const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  const uint64_t row_bytes = uint64_t{a.hidden} * 2;
  for (uint32_t i = warp; i < n_tok; i += warps) {
    const uint32_t q = ch * a.chunk + i;
    const uint8_t* row = a.net + x.in_slot(n) + x.slot_row(q);
    const auto* m = reinterpret_cast<const uint32_t*>(a.net + x.in_slot(n) + x.slot_meta(q));
    for (uint32_t l = 0; l < a.layout.gpus; ++l) {
      const uint32_t pos = __ldcv(m + mm.pos(l));
      if (pos == kMoeNoChoice) continue;
      const uint32_t d = a.layout.rank_of(x.own_node(), l);
      warp_copy<LoadPolicy::kVolatile>(x.token_row(d, s, pos), row, row_bytes, lane);
      uint32_t* dm = x.meta_rec(d, s, pos);
      for (uint32_t j = lane; j < a.meta_words; j += 32) dm[j] = __ldcv(m + j);
    }
  }
  // Count what this chunk put into each destination's chunks; complete chunks get their flag
  // (note 3). Positions grow with q, so the chunk's tokens for one destination are a range.
  __syncthreads();
  if (threadIdx.x == 0) {
    sync::fence_acq_rel_sys();
    const uint32_t q0 = ch * a.chunk;
    for (uint32_t l = 0; l < a.layout.gpus && ok; ++l) {
      const uint32_t d = a.layout.rank_of(x.own_node(), l);
      const uint32_t total_d = rec[1 + l * a.count_words];
      uint32_t cur = 0xffffffffu, run = 0;
      auto flush = [&](uint32_t dc) {
        uint32_t* cnt = a.fwd_count + (size_t{n} * a.layout.gpus + l) * a.chunks + dc;
        const uint32_t want = x.chunk_tokens(total_d, dc);
        if (atomicAdd(cnt, run) + run == want) {
          *cnt = 0;
          sync::fence_acq_rel_sys();
          raise_flag(nvl_fused_flag(x.c, d, x.token_flag(s, dc)), x.launch);
        }
      };
      for (uint32_t i = 0; i < n_tok; ++i) {
        const auto* m = reinterpret_cast<const uint32_t*>(a.net + x.in_slot(n) + x.slot_meta(q0 + i));
        const uint32_t pos = __ldcv(m + mm.pos(l));
        if (pos == kMoeNoChoice) continue;
        const uint32_t dc = pos / a.chunk;
        if (dc != cur) {
          if (run) flush(cur);
          cur = dc;
          run = 0;
        }
        ++run;
      }
      if (run) flush(cur);
    }
  }
  __syncthreads();
  return ok;
}

// In-place exclusive prefix sum of v[0 .. n) by the calling warp (v in shared memory, n + 1
// words): each lane sums a contiguous segment, the lanes scan their sums with shuffles, then
// write their segment's prefixes. v[n] becomes the total. Values and prefixes saturate at
// 2^32 - 1; the exact total is returned (to every lane).
__device__ inline uint64_t warp_exclusive_scan(uint32_t* v, uint32_t n, uint32_t lane) {
  constexpr uint32_t kAll = 0xffffffffu;
  const uint32_t per = (n + 31) / 32, b = min(n, lane * per), e = min(n, b + per);
  uint64_t sum = 0;
  for (uint32_t i = b; i < e; ++i) sum += v[i];
  uint64_t inc = sum;
  for (uint32_t off = 1; off < 32; off <<= 1) {
    const uint64_t o = __shfl_up_sync(kAll, inc, off);
    if (lane >= off) inc += o;
  }
  uint64_t run = inc - sum;
  auto cap = [](uint64_t x) { return static_cast<uint32_t>(x < 0xffffffffull ? x : 0xffffffffull); };
  for (uint32_t i = b; i < e; ++i) {
    const uint32_t x = v[i];
    v[i] = cap(run);
    run += x;
  }
  const uint64_t total = __shfl_sync(kAll, inc, 31);
  __syncwarp();
  if (lane == 0) v[n] = cap(total);
  __syncwarp();
  return total;
}

// The row layout, once every count record is in (moe_plan.h note 5); by block 0. `smem`: at
// least experts-per-rank + 1 words of shared memory (the routing's, free by now). The scans
// over the experts run in shared memory (warp_exclusive_scan): one thread walking them in
// global memory paid a load's latency per expert, one after the other (hundreds of
// microseconds beside a busy GEMM).
__device__ inline bool lay_out_rows(const Ctx& x, MoeDispatchPtrs& p, uint32_t* smem) {
  const MoeKernelArgs& a = x.a;
  const uint32_t world = x.world(), epr = x.epr();
  const uint32_t lane = threadIdx.x % 32;
  __shared__ bool ok;
  __shared__ uint32_t bad;
  for (uint32_t i = 0; i < world; ++i) {
    const uint32_t s = moe_source_order(a.layout, a.rank, i);
    if (threadIdx.x == 0) ok = x.wait_nvl(x.count_flag(s), x.launch, where_tag(kStepMoeCounts, s));
    __syncthreads();
    if (!ok) return false;
    for (uint32_t j = threadIdx.x; j < a.count_words; j += blockDim.x)
      a.recv_counts[size_t{s} * a.count_words + j] = __ldcg(x.count_rec(a.rank, s) + j);
  }
  __syncthreads();
  if (threadIdx.x == 0) MK_TRACE_MARK(8);  // phase trace: the count records are in
  if (threadIdx.x == 0) bad = 0;
  __syncthreads();
  // Per expert: sources in arrival order. One thread per expert, then a scan over the experts.
  uint32_t* sizes = smem;
  for (uint32_t e = threadIdx.x; e < epr; e += blockDim.x) {
    uint32_t within = 0;
    for (uint32_t i = 0; i < world; ++i) {
      const uint32_t s = moe_source_order(a.layout, a.rank, i);
      a.source_base[size_t{e} * world + s] = within;
      within += a.recv_counts[size_t{s} * a.count_words + 1 + e];
    }
    sizes[e] = within;
  }
  if (threadIdx.x == 0) MK_TRACE_MARK(9);  // sizes per expert
  for (uint32_t s = threadIdx.x; s < world; s += blockDim.x)
    if (a.recv_counts[size_t{s} * a.count_words] > a.capacity) bad = 1;  // a sender's check failed to stop it
  __syncthreads();
  if (threadIdx.x < 32) {
    const uint64_t run = warp_exclusive_scan(sizes, epr, lane);
    if (lane == 0) {
      ok = bad == 0 && run <= a.rows_capacity;
      if (!ok)
        report(x.c, kDeviceMoeRouting, bad ? kMoeRouteRankOverflow : kMoeRouteRowsOverflow,
               where_tag(kStepMoeRoute, bad ? a.rank : run));
    }
  }
  __syncthreads();
  if (!ok) return false;
  if (threadIdx.x == 0) MK_TRACE_MARK(10);  // scanned
  for (uint32_t e = threadIdx.x; e <= epr; e += blockDim.x) {
    a.expert_base[e] = sizes[e];
    p.expert_offsets[e] = sizes[e];
  }
  if (a.mblk_base != nullptr) {  // the GEMM's flat m blocks per expert
    __syncthreads();
    for (uint32_t e = threadIdx.x; e < epr; e += blockDim.x) sizes[e] = (a.expert_base[e + 1] - a.expert_base[e] + 127) / 128;
    __syncthreads();
    if (threadIdx.x < 32) (void)warp_exclusive_scan(sizes, epr, lane);
    __syncthreads();
    for (uint32_t e = threadIdx.x; e <= epr; e += blockDim.x) a.mblk_base[e] = sizes[e];
  }
  // Sources that send nothing are expanded already.
  for (uint32_t i = threadIdx.x; i < world; i += blockDim.x)
    if (a.recv_counts[size_t{moe_source_order(a.layout, a.rank, i)} * a.count_words] == 0)
      raise_flag(a.flags + kMoeFlagExpanded + i, x.launch);
  if (threadIdx.x == 0) MK_TRACE_MARK(11);  // m blocks written
  publish(a.flags + kMoeFlagLayout, x.launch);
  return true;
}

// One warp expands token `pos` of source s into the rows of its experts on this rank (expand
// note): lane j < top_k resolves choice j's row (its record's fields and the layout, loaded by
// all lanes at once), the row is read once and written to every one of them (8 x 16 bytes a
// lane in flight), then each lane with a row fences once and counts its row into its band (fused
// kernel: the band's flag rises with its last row). Before, each choice was resolved, copied
// (seven dependent loads of 2 KB for a 14 KB row) and fenced in turn: dozens of memory
// latencies one after the other per token.
__device__ inline void expand_token(const Ctx& x, const MoeDispatchPtrs& p, uint32_t s, uint32_t pos, uint32_t lane) {
  constexpr uint32_t kAll = 0xffffffffu, kNone = 0xffffffffu, kUnroll = 8;
  const MoeKernelArgs& a = x.a;
  const uint32_t world = x.world(), epr = x.epr(), first = a.rank * epr;
  const MoeMeta mm = x.meta();
  const uint32_t* m = x.meta_rec(a.rank, s, pos);
  uint32_t row = kNone;
  if (lane < a.top_k) {
    const uint32_t e = __ldcg(m + mm.expert(lane));
    if (e != 0xffffffffu && e >= first && e < first + epr) {
      const uint32_t el = e - first;
      row = a.expert_base[el] + a.source_base[size_t{el} * world + s] + __ldcg(m + mm.slot(lane));
      if (p.row_source) p.row_source[row] = static_cast<int32_t>(s);
      if (p.row_token) p.row_token[row] = static_cast<int32_t>(__ldcg(m + mm.token()));
      if (p.row_score) p.row_score[row] = __uint_as_float(__ldcg(m + mm.score(lane)));
    }
  }
  const uint32_t rows = __ballot_sync(kAll, row != kNone);
  if (rows == 0) return;
  const auto* src = reinterpret_cast<const uint4*>(x.token_row(a.rank, s, pos));
  auto* dst = static_cast<uint4*>(p.x_expert);
  const uint64_t n = uint64_t{a.hidden} * 2 / 16;  // 16-byte pieces of a row
  // Warp-uniform passes: every lane runs every pass, in range or not, because the shuffles need
  // all 32 lanes (a loop bounded per lane, `for (i = lane; i < n; ...)`, leaves lanes out when
  // n is not a multiple of 32, and a full-mask shuffle then waits for them forever). Whole
  // passes carry no bounds tests; one guarded pass takes the rest.
  auto pass = [&](uint64_t base, auto guarded) {
    constexpr bool kGuarded = decltype(guarded)::value;
    uint4 v[kUnroll] = {};
#pragma unroll
    for (uint32_t u = 0; u < kUnroll; ++u)
      if (!kGuarded || base + u * 32 + lane < n) v[u] = load16<LoadPolicy::kL2>(src + base + u * 32 + lane);
    for (uint32_t h = rows; h != 0; h &= h - 1) {
      const uint64_t r = __shfl_sync(kAll, row, __ffs(static_cast<int>(h)) - 1);
      uint4* d = dst + r * n + base + lane;
#pragma unroll
      for (uint32_t u = 0; u < kUnroll; ++u)
        if (!kGuarded || base + u * 32 + lane < n) d[u * 32] = v[u];
    }
  };
  uint64_t base = 0;
  for (; base + kUnroll * 32 <= n; base += kUnroll * 32) pass(base, std::false_type{});
  if (base < n) pass(base, std::true_type{});
  if (a.band_flags != nullptr) {  // fused: the GEMM starts a band once all its rows are here
    __syncwarp();
    if (row != kNone) {
      __threadfence();  // the warp's stores (ordered before it by __syncwarp), then the count
      const uint32_t band = row / 128, total = a.expert_base[epr];
      const uint32_t want = min(128u, total - band * 128);
      if (atomicAdd(&a.band_count[band], 1u) + 1 == want) {
        a.band_count[band] = 0;
        raise_flag(a.band_flags + band, x.launch);
      }
    }
  }
}

// An expand item: chunk ch of source index i (arrival order) into the expert rows.
__device__ inline bool expand_item(const Ctx& x, const MoeDispatchPtrs& p, uint32_t i, uint32_t ch) {
  const MoeKernelArgs& a = x.a;
  const uint32_t s = moe_source_order(a.layout, a.rank, i);
  __shared__ bool ok;
  if (threadIdx.x == 0) ok = x.wait_local(kMoeFlagLayout, x.launch, where_tag(kStepMoeLayout, i));
  __syncthreads();
  if (!ok) return false;
  const uint32_t total = a.recv_counts[size_t{s} * a.count_words];
  const uint32_t n_tok = x.chunk_tokens(total, ch);
  if (n_tok == 0) return true;
  if (threadIdx.x == 0)
    ok = x.wait_nvl(x.token_flag(s, ch), x.launch, where_tag(kStepMoeTokens, uint64_t{s} * 65536 + ch));
  __syncthreads();
  if (!ok) return false;
  const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  for (uint32_t t = warp; t < n_tok; t += warps) expand_token(x, p, s, ch * a.chunk + t, lane);
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    const uint32_t want = (total + a.chunk - 1) / a.chunk;
    if (atomicAdd(&a.expand_count[i], 1u) + 1 == want) {
      a.expand_count[i] = 0;
      raise_flag(a.flags + kMoeFlagExpanded + i, x.launch);
    }
  }
  __syncthreads();
  return true;
}

// ---- the stages, for any block count (a kernel's grid, or a GEMM launch's role blocks) ----------

// Every thread of block `block` of `blocks` (block 0 routes and lays out). False: this block
// stopped on an error (recorded); it still counts itself out at the end of the launch.
__device__ inline bool dispatch_stages(const Ctx& x, const MoeDispatchPtrs& p, uint32_t* route_smem, uint32_t block,
                                       uint32_t blocks) {
  const MoeKernelArgs& a = x.a;
  __shared__ bool ok;
  if (threadIdx.x == 0) ok = true;
  __syncthreads();
  if (block == 0) {
    const bool r = route_and_count(x, p, route_smem);
    if (threadIdx.x == 0) ok = r;
    if (threadIdx.x == 0) MK_TRACE_MARK(3);
  } else if (threadIdx.x == 0) {
    ok = x.wait_local(kMoeFlagRouted, x.launch, where_tag(kStepMoeRoute, 0));
  }
  __syncthreads();
  const uint32_t gpus = a.layout.gpus, nodes = a.layout.nodes, world = a.layout.world();
  // Dispatch items, chunk-major so every destination's link is busy at once (note 1).
  const uint32_t dests = gpus + nodes - 1;
  for (uint32_t it = block; ok && it < dests * a.chunks; it += blocks) {
    const uint32_t ch = it / dests, di = it % dests;
    const bool to_node = di >= gpus;
    const uint32_t dest = to_node ? a.layout.send_node(a.layout.node_of(a.rank), di - gpus + 1)
                                  : (di == 0 ? a.rank : a.layout.node_peer(a.rank, di));
    const bool r = dispatch_item(x, p, to_node, dest, ch);
    if (threadIdx.x == 0) ok = ok && r;
    __syncthreads();
  }
  if (threadIdx.x == 0) MK_TRACE_MARK(5);
  // Forward items: per other node, its count records first, then its chunks.
  for (uint32_t it = block; ok && it < (nodes - 1) * (a.chunks + 1); it += blocks) {
    const uint32_t ni = it % (nodes - 1), k = it / (nodes - 1);
    const uint32_t n = a.layout.recv_node(a.layout.node_of(a.rank), ni + 1);
    const bool r = forward_item(x, n, k == 0 ? a.chunks : k - 1);
    if (threadIdx.x == 0) ok = ok && r;
    __syncthreads();
  }
  if (block == 0 && ok) {
    MoeDispatchPtrs q = p;
    const bool r = lay_out_rows(x, q, route_smem);
    if (threadIdx.x == 0) ok = r;
    if (threadIdx.x == 0) MK_TRACE_MARK(4);
    __syncthreads();
  }
  // Expand items, chunk-major over the sources in arrival order.
  for (uint32_t it = block; ok && it < world * a.chunks; it += blocks) {
    const bool r = expand_item(x, p, it % world, it / world);
    if (threadIdx.x == 0) ok = ok && r;
    __syncthreads();
  }
  if (threadIdx.x == 0) MK_TRACE_MARK(6);
  __syncthreads();
  return ok;
}

// ---- end of a launch --------------------------------------------------------------------------

// Thread 0 of every block after its work: the last block ends the launch (launch_state.cuh),
// and with an adaptive split (the fused kernel's, or null) measures it and chooses the next split.
__device__ inline void end_launch(const MoeKernelArgs& a, SplitControl* split = nullptr) {
  if (count_block_exit(a.comm)) {
    if (split != nullptr) split_launch_end(split, sync::ld_acquire_sys(&a.comm.status->code) != 0);
    end_fused_launch(a.comm, a.layout, a.rank);
  }
}

}  // namespace moe_detail

#endif  // __CUDACC__

}  // namespace mkernel::kernels
