// moe_combine.cuh: the device code of the MoE's combine (host side: moe.h / moe.cu): each
// received token's partial back the way it came, the rail peers' node sums, the home sums
// (moe_plan.h note 6), and the stage driver for any block count. The shared context, the
// dispatch and the end of a launch: moe_comm.cuh.
#pragma once

#include "fused/moe/moe_comm.cuh"

namespace mkernel::kernels {

#if defined(__CUDACC__)

namespace moe_detail {

// ---- combine ----------------------------------------------------------------------------------

// Adds one bf16 row (8 values per uint4) into fp32 accumulators.
__device__ __forceinline__ void add8(float* acc, const uint4& u) {
  const auto* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const float2 f = __bfloat1622float2(h[q]);
    acc[2 * q] += f.x;
    acc[2 * q + 1] += f.y;
  }
}
__device__ __forceinline__ uint4 pack8(const float* acc) {
  uint4 o;
  auto* oh = reinterpret_cast<__nv_bfloat162*>(&o);
#pragma unroll
  for (int q = 0; q < 4; ++q) oh[q] = __floats2bfloat162_rn(acc[2 * q], acc[2 * q + 1]);
  return o;
}

// A combine item: the partials of chunk ch of source index i's tokens on this rank.
__device__ inline bool combine_item(const Ctx& x, const MoeCombinePtrs& p, uint32_t i, uint32_t ch) {
  const MoeKernelArgs& a = x.a;
  const uint32_t s = moe_source_order(a.layout, a.rank, i), world = x.world(), epr = x.epr();
  const uint32_t total = a.recv_counts[size_t{s} * a.count_words];
  const uint32_t n_tok = x.chunk_tokens(total, ch);
  if (n_tok == 0) return true;
  const bool same_node = a.layout.node_of(s) == x.own_node();
  const uint32_t target = same_node ? s : a.layout.rank_of(x.own_node(), a.layout.local_of(s));
  __shared__ bool ok;
  if (threadIdx.x == 0)
    ok = target == a.rank || x.wait_nvl(a.layout.done_flag(target), x.prev, where_tag(kStepPeerFree, target));
  __syncthreads();
  if (!ok) return false;
  const MoeMeta mm = x.meta();
  const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  const uint32_t first = a.rank * epr, vecs = a.out_hidden / 8;
  const auto* y = static_cast<const uint4*>(p.y_expert);
  __shared__ bool failed;
  if (threadIdx.x == 0) failed = false;
  __syncthreads();
  // Fused: the expert rows of every token of the chunk are stored. Warp 0 waits on the m block
  // flag of each (token, choice) on this rank, the others at the barrier (few pollers: see
  // kernels.md section 14 on what many polling warps cost the GEMM blocks beside them).
  if (a.mblock_flags != nullptr) {
    bool good = true;
    if (warp == 0) {
      for (uint32_t q = lane; q < n_tok * a.top_k && good; q += 32) {
        const uint32_t* m = x.meta_rec(a.rank, s, ch * a.chunk + q / a.top_k);
        const uint32_t j = q % a.top_k, e = __ldcg(m + mm.expert(j));
        if (e == 0xffffffffu || e < first || e >= first + epr) continue;
        const uint32_t el = e - first;
        const uint32_t r = a.source_base[size_t{el} * world + s] + __ldcg(m + mm.slot(j));  // row within the expert
        const uint32_t f = a.mblk_base[el] + r / 128;
        good = wait_geq(a.mblock_flags + f, x.launch, x.w, f, where_tag(kStepMoeLayout, 0x80000000ull | f));
      }
      if (!good) failed = true;
    }
    __syncthreads();
    if (failed) return false;
  }
  // Per token, one warp: lane j < top_k resolves choice j's row and score once; then per 16
  // bytes of the output the rows are loaded up to 8 at once and summed in choice order (the
  // order is the result's, so it stays fixed).
  constexpr uint32_t kAll = 0xffffffffu, kNone = 0xffffffffu, kBatch = 8;
  for (uint32_t t = warp; t < n_tok && !failed; t += warps) {
    const uint32_t pos = ch * a.chunk + t;
    const uint32_t* m = x.meta_rec(a.rank, s, pos);
    auto* dst = reinterpret_cast<uint4*>(x.partial_row(target, x.local(), a.layout.node_of(s), pos));
    uint32_t row = kNone;
    float sc = 0.0f;
    if (lane < a.top_k) {
      const uint32_t e = __ldcg(m + mm.expert(lane));
      if (e != 0xffffffffu && e >= first && e < first + epr) {
        const uint32_t el = e - first;
        row = a.expert_base[el] + a.source_base[size_t{el} * world + s] + __ldcg(m + mm.slot(lane));
        sc = a.apply_scores ? __uint_as_float(__ldcg(m + mm.score(lane))) : 1.0f;
      }
    }
    const uint32_t rows = __ballot_sync(kAll, row != kNone);
    // Warp-uniform passes (the shuffles need all 32 lanes; see expand_token): whole passes with
    // no bounds test, then one guarded pass for the rest.
    auto pass = [&](uint32_t v0, auto guarded) {
      const uint32_t v = v0 + lane;
      const bool in = !decltype(guarded)::value || v < vecs;
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (uint32_t h = rows; h != 0;) {
        uint4 u[kBatch];
        float c[kBatch];
        uint32_t got = 0;
#pragma unroll
        for (uint32_t q = 0; q < kBatch; ++q) {
          if (h != 0) {  // warp-uniform
            const int b = __ffs(static_cast<int>(h)) - 1;
            h &= h - 1;
            const uint32_t r = __shfl_sync(kAll, row, b);
            c[q] = __shfl_sync(kAll, sc, b);
            u[q] = in ? __ldcg(y + uint64_t{r} * vecs + v) : uint4{0, 0, 0, 0};
            got = q + 1;
          }
        }
#pragma unroll
        for (uint32_t q = 0; q < kBatch; ++q) {
          if (q < got) {
            const auto* hv = reinterpret_cast<const __nv_bfloat162*>(&u[q]);
#pragma unroll
            for (int w = 0; w < 4; ++w) {
              const float2 f = __bfloat1622float2(hv[w]);
              acc[2 * w] += c[q] * f.x;
              acc[2 * w + 1] += c[q] * f.y;
            }
          }
        }
      }
      if (in) dst[v] = pack8(acc);
    };
    uint32_t v0 = 0;
    for (; v0 + 32 <= vecs; v0 += 32) pass(v0, std::false_type{});
    if (v0 < vecs) pass(v0, std::true_type{});
  }
  __syncthreads();
  if (failed) return false;
  publish(nvl_fused_flag(x.c, target, x.partial_flag(x.local(), a.layout.node_of(s), ch)), x.launch);
  return true;
}

// An aggregate item (nodes > 1): this rank sums its node's partials of the tokens it forwarded
// from node n (chunk ch of its slot) and sends one row per token home.
__device__ inline bool aggregate_item(const Ctx& x, uint32_t n, uint32_t ch) {
  const MoeKernelArgs& a = x.a;
  const auto* rec = reinterpret_cast<const volatile uint32_t*>(a.net + x.in_slot(n));
  const uint32_t n_tok = x.chunk_tokens(rec[0], ch);
  if (n_tok == 0) return true;
  const uint32_t home = a.layout.rail_peer(a.rank, n);
  __shared__ bool ok;
  __shared__ bool failed;
  if (threadIdx.x == 0) {
    ok = x.wait_net(a.layout.slot_free_flag(n), x.prev, where_tag(kStepPeerFree, home));
    failed = false;
  }
  __syncthreads();
  if (!ok) return false;
  const MoeMeta mm = x.meta();
  const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  const uint32_t vecs = a.out_hidden / 8;
  for (uint32_t i = warp; i < n_tok && !failed; i += warps) {
    const uint32_t q = ch * a.chunk + i;
    const auto* m = reinterpret_cast<const uint32_t*>(a.net + x.in_slot(n) + x.slot_meta(q));
    auto* dst = reinterpret_cast<uint4*>(a.net + x.out_slot(n) + x.slot_partial(q));
    // Wait for every partial of this token, then sum in local-index order.
    bool good = true;
    for (uint32_t l = 0; l < a.layout.gpus && good; ++l) {
      const uint32_t pos = __ldcv(m + mm.pos(l));
      if (pos == kMoeNoChoice) continue;
      good = warp_wait(lane, [&] {
        return x.wait_nvl(x.partial_flag(l, n, pos / a.chunk), x.launch,
                          where_tag(kStepMoePartial, (uint64_t{l} << 32) | (uint64_t{n} * 65536 + pos / a.chunk)));
      });
    }
    if (!good) {
      if (lane == 0) failed = true;
      break;
    }
    for (uint32_t v = lane; v < vecs; v += 32) {
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (uint32_t l = 0; l < a.layout.gpus; ++l) {
        const uint32_t pos = __ldcv(m + mm.pos(l));
        if (pos == kMoeNoChoice) continue;
        add8(acc, __ldcg(reinterpret_cast<const uint4*>(x.partial_row(a.rank, l, n, pos)) + v));
      }
      dst[v] = pack8(acc);
    }
  }
  __syncthreads();
  if (failed) return false;
  if (threadIdx.x == 0) {
    sync::fence_acq_rel_sys();
    const uint64_t at = x.slot_partial(ch * a.chunk);
    ok = put_signal(x.c, home, x.c.network_workspace, x.out_slot(n) + at, x.c.network_workspace,
                    x.in_slot(x.own_node()) + at, uint64_t{n_tok} * a.out_hidden * 2,
                    fused_flag_index(x.c, x.net_partial_flag(x.own_node(), ch)), where_tag(kStepNetworkSend, home));
  }
  __syncthreads();
  return ok;
}

// A home item: the output rows of this rank's tokens [ch * chunk, ...).
__device__ inline bool home_item(const Ctx& x, const MoeCombinePtrs& p, uint32_t ch) {
  const MoeKernelArgs& a = x.a;
  const uint32_t world = x.world(), nodes = a.layout.nodes, own = x.own_node();
  const uint32_t n_tok = x.chunk_tokens(a.tokens, ch);
  __shared__ bool failed;
  if (threadIdx.x == 0) failed = false;
  __syncthreads();
  const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  const uint32_t vecs = a.out_hidden / 8;
  for (uint32_t i = warp; i < n_tok && !failed; i += warps) {
    const uint32_t t = ch * a.chunk + i;
    bool good = true;
    for (uint32_t l = 0; l < a.layout.gpus && good; ++l) {
      const uint32_t pos = a.route.pos[size_t{t} * world + a.layout.rank_of(own, l)];
      if (pos == kMoeNoChoice) continue;
      good = warp_wait(lane, [&] {
        return x.wait_nvl(x.partial_flag(l, own, pos / a.chunk), x.launch,
                          where_tag(kStepMoePartial, (uint64_t{l} << 32) | (uint64_t{own} * 65536 + pos / a.chunk)));
      });
    }
    for (uint32_t n = 0; n < nodes && good; ++n) {
      const uint32_t q = a.route.npos[size_t{t} * nodes + n];
      if (q == kMoeNoChoice) continue;
      good = warp_wait(lane, [&] {
        return x.wait_net(x.net_partial_flag(n, q / a.chunk), x.launch,
                          where_tag(kStepMoeNodeSum, uint64_t{n} * 65536 + q / a.chunk));
      });
    }
    if (!good) {
      if (lane == 0) failed = true;
      break;
    }
    auto* dst = static_cast<uint4*>(p.out) + uint64_t{t} * vecs;
    for (uint32_t v = lane; v < vecs; v += 32) {
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (uint32_t l = 0; l < a.layout.gpus; ++l) {
        const uint32_t pos = a.route.pos[size_t{t} * world + a.layout.rank_of(own, l)];
        if (pos != kMoeNoChoice) add8(acc, __ldcg(reinterpret_cast<const uint4*>(x.partial_row(a.rank, l, own, pos)) + v));
      }
      for (uint32_t n = 0; n < nodes; ++n) {
        const uint32_t q = a.route.npos[size_t{t} * nodes + n];
        if (q != kMoeNoChoice)
          add8(acc, __ldcv(reinterpret_cast<const uint4*>(a.net + x.in_slot(n) + x.slot_partial(q)) + v));
      }
      dst[v] = pack8(acc);
    }
  }
  __syncthreads();
  return !failed;
}

__device__ inline bool combine_stages(const Ctx& x, const MoeCombinePtrs& p, uint32_t block, uint32_t blocks) {
  const MoeKernelArgs& a = x.a;
  __shared__ bool ok;
  if (threadIdx.x == 0) ok = true;
  __syncthreads();
  const uint32_t nodes = a.layout.nodes, world = a.layout.world();
  for (uint32_t it = block; ok && it < world * a.chunks; it += blocks) {
    const bool r = combine_item(x, p, it % world, it / world);
    if (threadIdx.x == 0) ok = ok && r;
    __syncthreads();
  }
  for (uint32_t it = block; ok && it < (nodes - 1) * a.chunks; it += blocks) {
    const uint32_t n = a.layout.recv_node(a.layout.node_of(a.rank), it % (nodes - 1) + 1);
    const bool r = aggregate_item(x, n, it / (nodes - 1));
    if (threadIdx.x == 0) ok = ok && r;
    __syncthreads();
  }
  const uint32_t home_items = (a.tokens + a.chunk - 1) / a.chunk;
  for (uint32_t it = block; ok && it < home_items; it += blocks) {
    const bool r = home_item(x, p, it);
    if (threadIdx.x == 0) ok = ok && r;
    __syncthreads();
  }
  __syncthreads();
  return ok;
}

}  // namespace moe_detail

#endif  // __CUDACC__

}  // namespace mkernel::kernels
