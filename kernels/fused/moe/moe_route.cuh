// moe_route.cuh: the routing phase of the fused MoE on the GPU: from one rank's choices it
// computes what moe_route (moe_plan.h) computes on the host, bit for bit: pos(t, d), npos(t, n),
// each choice's row slot, and the counts that go into the count records. No host
// synchronisation: the counts stay in device memory for the kernels that follow (or for the
// blocks of the same persistent kernel that wait on the routing's flag).
//
// Design notes
//  1. One block, deterministic. Positions are prefix counts in token order, so the block cuts the
//     tokens into one contiguous range per warp: pass 1, each warp counts its range per column
//     (columns: the experts, then the ranks, then the nodes) into its own shared-memory row;
//     pass 2, every column's counts become exclusive prefixes over the warps (and the totals);
//     pass 3, each warp walks its range in token order and hands out positions from its running
//     counters. A warp takes several tokens a step: its lanes in groups of the next power of two
//     >= top_k (4 tokens a step at top-8), lane j of a group on choice j. One match instruction
//     per key (expert, rank, node) over the warp says both whether a lower choice of the same
//     token shares the key (within the group: a duplicate expert, or not the token's first
//     choice on that rank or node) and which earlier tokens of the step share it (lower lanes
//     are earlier tokens): a lane's position is the counter plus their number, and the last
//     lane of each set advances the counter past all of them. No atomics, the same answer every
//     time, bit for bit the host's. Each warp stages its tokens' choices in shared memory 32
//     tokens at a time (a lane's loads issued together): the loop over a warp's tokens then
//     holds no global load, whose latency would otherwise be paid a few times per token, one
//     token after the other (about 1 us each under a busy memory system: milliseconds at
//     T = 4096). Measured before the steps (one token a step, three match instructions per
//     token and pass): 0.89 ms for T = 4096 with 12 warps in the fused kernel (one H100), about
//     1.3 us a token and pass.
//  2. Shared memory: warps x (columns + 32 x top_k) x 4 bytes (counters, staged choices);
//     moe_route_warps picks the most warps that fit, moe_route_smem_bytes sizes them.
//  3. Errors, in token order: the first bad token (an expert outside [-1, E) or chosen twice),
//     else the first rank and then node that would receive more than `capacity` tokens. The
//     result word says which (MoeRouteResult); a fused kernel turns it into its named report.
#pragma once

#include <cstdint>

#include "fused/moe/moe_plan.h"

namespace mkernel::kernels {

enum MoeRouteCode : uint32_t {
  kMoeRouteOk = 0,
  kMoeRouteBadChoice = 1,    // index: token, value: the choice (j)
  kMoeRouteRankOverflow = 2, // index: rank, value: tokens it would receive
  kMoeRouteNodeOverflow = 3, // index: node, value: tokens it would receive
  kMoeRouteRowsOverflow = 4, // found by a receiver: index: its rank, value: rows (capped at 2^32-1)
};

struct MoeRouteResult {
  uint32_t code;
  uint32_t index;
  uint32_t value;
  uint32_t reserved;
};

struct MoeRouteArgs {
  MoeShape shape;
  uint32_t rank = 0;
  uint32_t tokens = 0;
  uint32_t capacity = 0;          // recv_tokens_per_source
  const int32_t* choices = nullptr;  // [tokens][top_k]
  uint32_t* pos = nullptr;           // [tokens][world]
  uint32_t* npos = nullptr;          // [tokens][nodes]
  uint32_t* slot = nullptr;          // [tokens][top_k]
  uint32_t* send_tokens = nullptr;   // [world]
  uint32_t* node_tokens = nullptr;   // [nodes] (own node: 0)
  uint32_t* rows = nullptr;          // [experts]: (token, choice) rows per expert
  MoeRouteResult* result = nullptr;
};

// Columns of the per-warp counters (note 1).
MK_KERNEL_HD constexpr uint32_t moe_route_columns(const MoeShape& s) {
  return s.experts + s.layout.world() + s.layout.nodes;
}
// Tokens a warp stages at a time (note 1).
inline constexpr uint32_t kMoeRouteStageTokens = 32;
// Shared-memory words per warp of the routing block: its counters and its staged choices.
MK_KERNEL_HD constexpr uint32_t moe_route_words_per_warp(const MoeShape& s) {
  return moe_route_columns(s) + kMoeRouteStageTokens * s.top_k;
}
// Warps of the routing block for a shared-memory budget (note 2); 0 when not even one fits.
MK_KERNEL_HD constexpr uint32_t moe_route_warps(const MoeShape& s, uint32_t smem_bytes) {
  const uint32_t w = smem_bytes / (moe_route_words_per_warp(s) * 4);
  return w > 32 ? 32 : w;
}
// The routing block's shared memory for `warps` warps.
MK_KERNEL_HD constexpr uint32_t moe_route_smem_bytes(const MoeShape& s, uint32_t warps) {
  return warps * moe_route_words_per_warp(s) * 4;
}

#if defined(__CUDACC__)

namespace moe_route_detail {

// Tokens routed together by a warp (note 1): lanes in groups of the next power of two >= top_k,
// one token a group, lane j of a group on choice j.
__device__ __forceinline__ uint32_t group_lanes(uint32_t k) {
  uint32_t g = 1;
  while (g < k) g <<= 1;
  return g;
}

// The choices of one step's tokens as their lanes hold them, and what moe_bad_choice /
// moe_first_on_rank / moe_first_on_node say of them, for every lane at once. One match
// instruction per key (expert, rank, node) over the whole warp gives both answers a lane needs:
// within its group (restricted to the group's lanes) whether a lower choice of the same token
// shares the key, and across the groups how many earlier tokens' choices share it (lower lanes
// are earlier tokens, and a token holds an expert, and counts a rank or node, once). Bit for bit
// the host functions' answers.
struct StepLanes {
  int32_t e;         // this lane's choice (-1: none, or no token in this group)
  bool valid;        // a choice of an expert in [0, experts)
  bool first_rank;   // the token's first choice on that rank
  bool first_node;   // and on that node (another node than this rank's)
  uint32_t d, n;     // the expert's rank and node (valid lanes)
  uint32_t bad;      // 0, or 1 + the first bad choice of this lane's token (the same in its group)
  uint32_t same_e;   // lanes of this step choosing the same expert (0 unless valid)
  uint32_t same_d;   // first_rank lanes of this step on the same rank (0 unless first_rank)
  uint32_t same_n;   // lanes counting the same other node (0 unless this lane counts there)
};

__device__ __forceinline__ StepLanes step_lanes(const MoeShape& s, const int32_t* staged, uint32_t tokens_left,
                                                uint32_t own_node, uint32_t lane) {
  constexpr uint32_t kAll = 0xffffffffu;
  const uint32_t k = s.top_k, gl = group_lanes(k), g = lane / gl, j = lane % gl;
  const uint32_t gmask = (gl == 32 ? kAll : ((1u << gl) - 1u)) << (g * gl);
  const uint32_t lower = (1u << lane) - 1u, none = 0x80000000u | lane;
  const bool active = j < k && g < tokens_left;
  StepLanes r;
  r.e = active ? staged[g * k + j] : -1;
  const bool chosen = active && r.e >= 0;
  r.valid = chosen && r.e < static_cast<int32_t>(s.experts);
  const uint32_t all_e = __match_any_sync(kAll, chosen ? static_cast<uint32_t>(r.e) : none);
  const bool bad = active && (r.e < -1 || r.e >= static_cast<int32_t>(s.experts) || (chosen && (all_e & gmask & lower)));
  r.bad = static_cast<uint32_t>(__ffs(static_cast<int>((__ballot_sync(kAll, bad) & gmask) >> (g * gl))));
  r.d = r.valid ? s.rank_of_expert(static_cast<uint32_t>(r.e)) : none;
  const uint32_t all_d = __match_any_sync(kAll, r.d);
  r.n = r.valid ? s.layout.node_of(r.d) : none;
  const uint32_t all_n = __match_any_sync(kAll, r.n);
  // A lower lane of the token with a choice >= experts makes the token bad; nothing below is used then.
  r.first_rank = r.valid && (all_d & gmask & lower) == 0;
  r.first_node = r.valid && (all_n & gmask & lower) == 0;
  const bool counts_node = r.first_node && r.n != own_node;
  const uint32_t rank_lanes = __ballot_sync(kAll, r.first_rank), node_lanes = __ballot_sync(kAll, counts_node);
  r.same_e = r.valid ? all_e : 0u;
  r.same_d = r.first_rank ? all_d & rank_lanes : 0u;
  r.same_n = counts_node ? all_n & node_lanes : 0u;
  return r;
}

// Of the lanes in `same` (this lane among them), how many come before this one, and whether this
// lane is the last (the one that advances the shared counter by all of them).
__device__ __forceinline__ uint32_t earlier(uint32_t same, uint32_t lane) { return __popc(same & ((1u << lane) - 1u)); }
__device__ __forceinline__ bool last_of(uint32_t same, uint32_t lane) { return (same >> lane) == 1u; }

// Stages the choices of tokens [t, t + n) (n <= kMoeRouteStageTokens) into the warp's buffer:
// a lane's loads are issued together, then stored, so a stage costs one memory latency.
__device__ __forceinline__ void stage_choices(const int32_t* choices, uint32_t k, uint32_t t, uint32_t n,
                                              int32_t* buf, uint32_t lane) {
  constexpr uint32_t kBatch = 8;
  __syncwarp();
  const int32_t* src = choices + size_t{t} * k;
  const uint32_t words = n * k;
  for (uint32_t base = 0; base < words; base += 32 * kBatch) {
    int32_t v[kBatch];
#pragma unroll
    for (uint32_t u = 0; u < kBatch; ++u) {
      const uint32_t i = base + u * 32 + lane;
      v[u] = i < words ? __ldg(src + i) : 0;
    }
#pragma unroll
    for (uint32_t u = 0; u < kBatch; ++u) {
      const uint32_t i = base + u * 32 + lane;
      if (i < words) buf[i] = v[u];
    }
  }
  __syncwarp();
}

}  // namespace moe_route_detail

// The whole routing by one block of warps * 32 threads; `counts` is moe_route_smem_bytes(s,
// warps) of shared memory. Every thread returns after the block's results are written (and fenced).
__device__ inline void moe_route_block(const MoeRouteArgs& a, uint32_t* counts, uint32_t warps) {
  using namespace moe_route_detail;
  const MoeShape& s = a.shape;
  const uint32_t world = s.layout.world(), nodes = s.layout.nodes, k = s.top_k;
  const uint32_t cols = moe_route_columns(s), col_rank = s.experts, col_node = s.experts + world;
  const uint32_t own_node = s.layout.node_of(a.rank);
  const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const uint32_t gl = group_lanes(k), per_step = 32 / gl, my_group = lane / gl, my_choice = lane % gl;
  const uint32_t per = (a.tokens + warps - 1) / warps;
  const uint32_t t0 = min(a.tokens, warp * per), t1 = min(a.tokens, t0 + per);
  __shared__ uint32_t bad_token;
  for (uint32_t i = threadIdx.x; i < warps * cols; i += blockDim.x) counts[i] = 0;
  if (threadIdx.x == 0) bad_token = 0xffffffffu;
  __syncthreads();
  int32_t* staged = reinterpret_cast<int32_t*>(counts + warps * cols) + warp * kMoeRouteStageTokens * k;

  // Pass 1: counts per warp range, and the first bad token. Each counter is advanced by the last
  // of the step's lanes that count in it, by their number: no atomics.
  uint32_t* mine = counts + warp * cols;
  if (warp < warps) {
    for (uint32_t c0 = t0; c0 < t1; c0 += kMoeRouteStageTokens) {
      const uint32_t n = min(kMoeRouteStageTokens, t1 - c0);
      stage_choices(a.choices, k, c0, n, staged, lane);
      for (uint32_t i = 0; i < n; i += per_step) {
        const StepLanes sl = step_lanes(s, staged + i * k, n - i, own_node, lane);
        if (my_choice == 0 && sl.bad != 0) atomicMin(&bad_token, c0 + i + my_group);
        if (sl.valid && last_of(sl.same_e, lane)) mine[sl.e] += __popc(sl.same_e);
        if (sl.same_d != 0 && last_of(sl.same_d, lane)) mine[col_rank + sl.d] += __popc(sl.same_d);
        if (sl.same_n != 0 && last_of(sl.same_n, lane)) mine[col_node + sl.n] += __popc(sl.same_n);
        __syncwarp();
      }
    }
  }
  __syncthreads();
  if (bad_token != 0xffffffffu) {
    if (threadIdx.x == 0) {
      const uint32_t bad = moe_bad_choice(s, a.choices + size_t{bad_token} * k);
      *a.result = MoeRouteResult{kMoeRouteBadChoice, bad_token, bad - 1, 0};
      __threadfence();
    }
    __syncthreads();
    return;
  }

  // Pass 2: exclusive prefixes over the warps, per column; the totals.
  for (uint32_t col = threadIdx.x; col < cols; col += blockDim.x) {
    uint32_t run = 0;
    for (uint32_t w = 0; w < warps; ++w) {
      const uint32_t v = counts[w * cols + col];
      counts[w * cols + col] = run;
      run += v;
    }
    if (col < col_rank) a.rows[col] = run;
    else if (col < col_node) a.send_tokens[col - col_rank] = run;
    else a.node_tokens[col - col_node] = run;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    MoeRouteResult r{kMoeRouteOk, 0, 0, 0};
    for (uint32_t d = 0; d < world && r.code == kMoeRouteOk; ++d)
      if (a.send_tokens[d] > a.capacity) r = MoeRouteResult{kMoeRouteRankOverflow, d, a.send_tokens[d], 0};
    for (uint32_t n = 0; n < nodes && r.code == kMoeRouteOk; ++n)
      if (a.node_tokens[n] > a.capacity) r = MoeRouteResult{kMoeRouteNodeOverflow, n, a.node_tokens[n], 0};
    *a.result = r;
  }

  // Pass 3: positions in token order from each warp's running counters. A step's tokens take
  // consecutive values in lane order (token order), then the last lane of each set advances the
  // counter past them.
  if (warp < warps) {
    for (uint32_t c0 = t0; c0 < t1; c0 += kMoeRouteStageTokens) {
      const uint32_t n = min(kMoeRouteStageTokens, t1 - c0);
      stage_choices(a.choices, k, c0, n, staged, lane);
      for (uint32_t i = 0; i < n; i += per_step) {
        const uint32_t step_tokens = min(per_step, n - i), tb = c0 + i;
        for (uint32_t w = lane; w < step_tokens * world; w += 32) a.pos[size_t{tb} * world + w] = kMoeNoChoice;
        for (uint32_t w = lane; w < step_tokens * nodes; w += 32) a.npos[size_t{tb} * nodes + w] = kMoeNoChoice;
        __syncwarp();  // the stores above before a lane's own store to the same word below
        const StepLanes sl = step_lanes(s, staged + i * k, n - i, own_node, lane);
        const uint32_t t = tb + my_group;
        uint32_t slot = kMoeNoChoice, p = kMoeNoChoice, q = kMoeNoChoice;
        if (sl.valid) slot = mine[sl.e] + earlier(sl.same_e, lane);
        if (sl.same_d != 0) p = mine[col_rank + sl.d] + earlier(sl.same_d, lane);
        if (sl.same_n != 0) q = mine[col_node + sl.n] + earlier(sl.same_n, lane);
        __syncwarp();  // every lane read its counters before any advances them
        if (sl.valid && last_of(sl.same_e, lane)) mine[sl.e] = slot + 1;
        if (sl.same_d != 0 && last_of(sl.same_d, lane)) mine[col_rank + sl.d] = p + 1;
        if (sl.same_n != 0 && last_of(sl.same_n, lane)) mine[col_node + sl.n] = q + 1;
        if (p != kMoeNoChoice) a.pos[size_t{t} * world + sl.d] = p;
        if (q != kMoeNoChoice) a.npos[size_t{t} * nodes + sl.n] = q;
        if (my_choice < k && my_group < step_tokens) a.slot[size_t{t} * k + my_choice] = slot;
        __syncwarp();
      }
    }
  }
  __threadfence();
  __syncthreads();
}

#endif  // __CUDACC__

}  // namespace mkernel::kernels
