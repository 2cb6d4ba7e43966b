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
//     no atomics and the same answer every time. Each warp stages its tokens' choices in
//     shared memory 32 tokens at a time (one coalesced load per lane), and a token's lanes
//     compare their choices with warp match instructions (__match_any_sync): the loop over a
//     warp's tokens then holds no global load, whose latency would otherwise be paid a few
//     times per token, one token after the other (about 1 us each under a busy memory system:
//     milliseconds at T = 4096). Cost: the warp's share of tokens, a few shared-memory and warp
//     operations each (T = 16384 on 32 warps: 512 tokens a warp).
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

// One token's choices as its lanes hold them (lane j < top_k: choice j, the others none), and
// what moe_bad_choice / moe_first_on_rank / moe_first_on_node say of them, for every lane at
// once: lanes with the same key (expert, rank, node) are found with one match instruction, and
// "first" means no lower lane shares the key. Bit for bit the host functions' answers.
struct TokenLanes {
  int32_t e;         // this lane's choice (-1: none)
  bool valid;        // a choice of an expert in [0, experts)
  bool first_rank;   // the token's first choice on that rank
  bool first_node;   // and on that node
  uint32_t bad;      // 0, or 1 + the first bad choice of the token (the same in every lane)
};

__device__ __forceinline__ TokenLanes token_lanes(const MoeShape& s, const int32_t* staged, uint32_t lane) {
  constexpr uint32_t kAll = 0xffffffffu;
  const uint32_t k = s.top_k, lower = (1u << lane) - 1u, none = 0x80000000u | lane;
  TokenLanes r;
  r.e = lane < k ? staged[lane] : -1;
  const bool chosen = lane < k && r.e >= 0;
  r.valid = chosen && r.e < static_cast<int32_t>(s.experts);
  const uint32_t same_e = __match_any_sync(kAll, chosen ? static_cast<uint32_t>(r.e) : none);
  const bool bad = lane < k && (r.e < -1 || r.e >= static_cast<int32_t>(s.experts) || (chosen && (same_e & lower)));
  r.bad = static_cast<uint32_t>(__ffs(static_cast<int>(__ballot_sync(kAll, bad))));
  const uint32_t d = r.valid ? s.rank_of_expert(static_cast<uint32_t>(r.e)) : none;
  const uint32_t same_d = __match_any_sync(kAll, d);
  const uint32_t n = r.valid ? s.layout.node_of(d) : none;
  const uint32_t same_n = __match_any_sync(kAll, n);
  // A lower lane with a choice >= experts makes the token bad; no answer below is used then.
  r.first_rank = r.valid && (same_d & lower) == 0;
  r.first_node = r.valid && (same_n & lower) == 0;
  return r;
}

// Stages the choices of tokens [t, t + n) (n <= kMoeRouteStageTokens) into the warp's buffer.
__device__ __forceinline__ void stage_choices(const int32_t* choices, uint32_t k, uint32_t t, uint32_t n,
                                              int32_t* buf, uint32_t lane) {
  __syncwarp();
  const int32_t* src = choices + size_t{t} * k;
  for (uint32_t i = lane; i < n * k; i += 32) buf[i] = __ldg(src + i);
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
  const uint32_t per = (a.tokens + warps - 1) / warps;
  const uint32_t t0 = min(a.tokens, warp * per), t1 = min(a.tokens, t0 + per);
  __shared__ uint32_t bad_token;
  for (uint32_t i = threadIdx.x; i < warps * cols; i += blockDim.x) counts[i] = 0;
  if (threadIdx.x == 0) bad_token = 0xffffffffu;
  __syncthreads();
  int32_t* staged = reinterpret_cast<int32_t*>(counts + warps * cols) + warp * kMoeRouteStageTokens * k;

  // Pass 1: counts per warp range, and the first bad token.
  uint32_t* mine = counts + warp * cols;
  if (warp < warps) {
    for (uint32_t c0 = t0; c0 < t1; c0 += kMoeRouteStageTokens) {
      const uint32_t n = min(kMoeRouteStageTokens, t1 - c0);
      stage_choices(a.choices, k, c0, n, staged, lane);
      for (uint32_t i = 0; i < n; ++i) {
        const TokenLanes tl = token_lanes(s, staged + i * k, lane);
        if (lane == 0 && tl.bad != 0) atomicMin(&bad_token, c0 + i);
        if (tl.valid) {
          const uint32_t d = s.rank_of_expert(static_cast<uint32_t>(tl.e)), nd = s.layout.node_of(d);
          mine[tl.e] += 1;  // distinct experts in a good token; a bad one ends the routing anyway
          if (tl.first_rank) mine[col_rank + d] += 1;
          if (nd != own_node && tl.first_node) mine[col_node + nd] += 1;
        }
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

  // Pass 3: positions in token order from each warp's running counters.
  if (warp < warps) {
    for (uint32_t c0 = t0; c0 < t1; c0 += kMoeRouteStageTokens) {
      const uint32_t n = min(kMoeRouteStageTokens, t1 - c0);
      stage_choices(a.choices, k, c0, n, staged, lane);
      for (uint32_t i = 0; i < n; ++i) {
        const uint32_t t = c0 + i;
        for (uint32_t d = lane; d < world; d += 32) a.pos[size_t{t} * world + d] = kMoeNoChoice;
        for (uint32_t nd = lane; nd < nodes; nd += 32) a.npos[size_t{t} * nodes + nd] = kMoeNoChoice;
        __syncwarp();  // the stores above before a lane's own store to the same word below
        const TokenLanes tl = token_lanes(s, staged + i * k, lane);
        if (lane < k) {
          uint32_t slot = kMoeNoChoice;
          if (tl.e >= 0) {
            slot = mine[tl.e]++;
            const uint32_t d = s.rank_of_expert(static_cast<uint32_t>(tl.e)), nd = s.layout.node_of(d);
            if (tl.first_rank) a.pos[size_t{t} * world + d] = mine[col_rank + d]++;
            if (nd != own_node && tl.first_node) a.npos[size_t{t} * nodes + nd] = mine[col_node + nd]++;
          }
          a.slot[size_t{t} * k + lane] = slot;
        }
        __syncwarp();
      }
    }
  }
  __threadfence();
  __syncthreads();
}

#endif  // __CUDACC__

}  // namespace mkernel::kernels
