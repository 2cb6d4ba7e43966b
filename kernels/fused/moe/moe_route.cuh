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
//     pass 3, each warp walks its range in token order, lane j on choice j, and hands out
//     positions from its running counters. Lanes of one token never share a column (experts of
//     a token are distinct; only the first choice on a rank or node counts the token there), so
//     no atomics and the same answer every time. Cost: the warp's share of tokens, a few
//     shared-memory operations each (T = 16384 on 32 warps: 512 tokens a warp).
//  2. Shared memory: warps x columns x 4 bytes; moe_route_warps picks the most warps that fit.
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
// Warps of the routing block for a shared-memory budget (note 2); 0 when not even one fits.
MK_KERNEL_HD constexpr uint32_t moe_route_warps(const MoeShape& s, uint32_t smem_bytes) {
  const uint32_t per_warp = moe_route_columns(s) * 4;
  const uint32_t w = smem_bytes / per_warp;
  return w > 32 ? 32 : w;
}

#if defined(__CUDACC__)

// The whole routing by one block of warps * 32 threads; `counts` is warps x columns words of
// shared memory. Every thread returns after the block's results are written (and fenced).
__device__ inline void moe_route_block(const MoeRouteArgs& a, uint32_t* counts, uint32_t warps) {
  const MoeShape& s = a.shape;
  const uint32_t world = s.layout.world(), nodes = s.layout.nodes, k = s.top_k;
  const uint32_t cols = moe_route_columns(s), col_rank = s.experts, col_node = s.experts + world;
  const uint32_t own_node = s.layout.node_of(a.rank);
  const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const uint32_t per = (a.tokens + warps - 1) / warps;
  const uint32_t t0 = min(a.tokens, warp * per), t1 = min(a.tokens, t0 + per);
  __shared__ uint32_t bad_token;
  for (uint32_t i = threadIdx.x; i < warps * cols; i += blockDim.x) counts[i] = 0;
  if (threadIdx.x == 0) bad_token = 0xffffffffu;
  __syncthreads();

  // Pass 1: counts per warp range, and the first bad token.
  uint32_t* mine = counts + warp * cols;
  if (warp < warps) {
    for (uint32_t t = t0; t < t1; ++t) {
      const int32_t* c = a.choices + size_t{t} * k;
      const int32_t e = lane < k ? c[lane] : -1;
      if (lane == 0 && moe_bad_choice(s, c) != 0) atomicMin(&bad_token, t);
      if (e >= 0 && e < static_cast<int32_t>(s.experts)) {
        mine[e] += 1;  // distinct experts in a good token; a bad one ends the routing anyway
        const uint32_t d = s.rank_of_expert(static_cast<uint32_t>(e)), n = s.layout.node_of(d);
        if (moe_first_on_rank(s, c, lane)) mine[col_rank + d] += 1;
        if (n != own_node && moe_first_on_node(s, c, lane)) mine[col_node + n] += 1;
      }
      __syncwarp();
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

  // Pass 3: positions in token order from each warp's running counters.
  if (warp < warps) {
    for (uint32_t t = t0; t < t1; ++t) {
      const int32_t* c = a.choices + size_t{t} * k;
      for (uint32_t d = lane; d < world; d += 32) a.pos[size_t{t} * world + d] = kMoeNoChoice;
      for (uint32_t n = lane; n < nodes; n += 32) a.npos[size_t{t} * nodes + n] = kMoeNoChoice;
      __syncwarp();
      if (lane < k) {
        const int32_t e = c[lane];
        uint32_t slot = kMoeNoChoice;
        if (e >= 0) {
          slot = mine[e]++;
          const uint32_t d = s.rank_of_expert(static_cast<uint32_t>(e)), n = s.layout.node_of(d);
          if (moe_first_on_rank(s, c, lane)) a.pos[size_t{t} * world + d] = mine[col_rank + d]++;
          if (n != own_node && moe_first_on_node(s, c, lane)) a.npos[size_t{t} * nodes + n] = mine[col_node + n]++;
        }
        a.slot[size_t{t} * k + lane] = slot;
      }
      __syncwarp();
    }
  }
  __threadfence();
  __syncthreads();
}

#endif  // __CUDACC__

}  // namespace mkernel::kernels
