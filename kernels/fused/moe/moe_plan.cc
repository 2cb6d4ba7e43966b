// moe_plan.cc: the fused MoE's geometry, routing reference, row layout and routing generators
// (moe_plan.h); the CPU replay is moe_replay.cc.
#include "fused/moe/moe_plan.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

namespace mkernel::kernels {

namespace {
std::string str(uint64_t v) { return std::to_string(v); }
}  // namespace

uint64_t MoeGeometry::rows_capacity() const {
  if (expert_rows_capacity) return expert_rows_capacity;
  return uint64_t{layout.world()} * capacity() * std::min(top_k, experts_per_rank());
}

uint32_t moe_default_chunk_tokens(uint32_t capacity) {
  return std::clamp<uint32_t>((capacity + 7) / 8, 1, 64);
}

uint32_t MoeGeometry::chunk() const { return chunk_tokens ? chunk_tokens : moe_default_chunk_tokens(capacity()); }

int moe_default_blocks(const FusedLayout& layout, int sms) {
  const int want = 32 + 8 * static_cast<int>(layout.gpus - 1) + 4 * static_cast<int>(layout.nodes - 1);
  return std::max(2, std::min(std::min(want, 96), sms));
}

int moe_standalone_blocks(const MoeGeometry& g, int sms) {
  const uint64_t items = uint64_t{g.layout.world()} * g.chunks();
  const int floor = moe_default_blocks(g.layout, sms);
  return static_cast<int>(std::min<uint64_t>(std::max<uint64_t>(items, static_cast<uint64_t>(floor)),
                                             static_cast<uint64_t>(std::max(sms, floor))));
}

std::string moe_check_geometry(const MoeGeometry& g) {
  const uint32_t world = g.layout.world();
  if (g.layout.nodes == 0 || g.layout.gpus == 0)
    return "layout: " + str(g.layout.nodes) + " nodes x " + str(g.layout.gpus) + " GPUs; expected at least 1 x 1";
  if (g.rank >= world) return "rank: " + str(g.rank) + "; expected below the world size " + str(world);
  if (g.tokens == 0) return "tokens: 0; expected at least 1 token per rank";
  if (g.hidden == 0 || g.hidden % 8 != 0) return "hidden: " + str(g.hidden) + "; expected a positive multiple of 8";
  if (g.out_hidden == 0 || g.out_hidden % 8 != 0)
    return "out_hidden: " + str(g.out_hidden) + "; expected a positive multiple of 8";
  if (g.experts == 0 || g.experts % world != 0)
    return "experts: " + str(g.experts) + "; expected a positive multiple of the world size " + str(world) +
           " (experts are spread evenly over the ranks)";
  if (g.top_k == 0 || g.top_k > std::min(g.experts, kMoeMaxTopK))
    return "top_k: " + str(g.top_k) + "; expected 1 .. " + str(std::min(g.experts, kMoeMaxTopK));
  if (g.recv_tokens_per_source > g.tokens)
    return "recv_tokens_per_source: " + str(g.recv_tokens_per_source) + "; expected at most tokens = " +
           str(g.tokens) + " (a source sends each token to a rank at most once; 0 means tokens)";
  if (g.chunk_tokens > g.capacity())
    return "chunk_tokens: " + str(g.chunk_tokens) + "; expected at most the region capacity " + str(g.capacity());
  if (g.expert_rows_capacity > uint64_t{world} * g.capacity() * std::min(g.top_k, g.experts_per_rank()))
    return "expert_rows_capacity: " + str(g.expert_rows_capacity) + "; expected at most the worst case " +
           str(uint64_t{world} * g.capacity() * std::min(g.top_k, g.experts_per_rank()));
  if (g.rows_capacity() >= (uint64_t{1} << 31))
    return "expert rows: " + str(g.rows_capacity()) + "; expected below 2^31 (set expert_rows_capacity)";
  return "";
}

MoeRouting moe_route(const MoeGeometry& g, const int32_t* choices) {
  MoeRouting r;
  const uint32_t world = g.layout.world(), nodes = g.layout.nodes, epr = g.experts_per_rank(), k = g.top_k;
  const uint32_t own_node = g.layout.node_of(g.rank);
  const MoeShape sh = g.shape();
  r.send_tokens.assign(world, 0);
  r.node_tokens.assign(nodes, 0);
  r.rows.assign(size_t{world} * epr, 0);
  r.pos.assign(size_t{g.tokens} * world, kMoeNoChoice);
  r.npos.assign(size_t{g.tokens} * nodes, kMoeNoChoice);
  r.slot.assign(size_t{g.tokens} * k, kMoeNoChoice);
  for (uint32_t t = 0; t < g.tokens; ++t) {
    const int32_t* c = choices + size_t{t} * k;
    if (const uint32_t bad = moe_bad_choice(sh, c)) {
      const int32_t e = c[bad - 1];
      r.error = "rank " + str(g.rank) + " token " + str(t) + " choice " + str(bad - 1) + ": expert " +
                std::to_string(e) +
                (e < -1 || e >= static_cast<int32_t>(g.experts)
                     ? "; expected -1 (no choice) or 0 .. " + str(g.experts - 1)
                     : "; chosen twice by one token");
      return r;
    }
    for (uint32_t j = 0; j < k; ++j) {
      if (c[j] < 0) continue;
      const uint32_t e = static_cast<uint32_t>(c[j]);
      const uint32_t d = sh.rank_of_expert(e), n = g.layout.node_of(d);
      r.slot[size_t{t} * k + j] = r.rows[size_t{d} * epr + e % epr]++;
      if (moe_first_on_rank(sh, c, j)) r.pos[size_t{t} * world + d] = r.send_tokens[d]++;
      if (n != own_node && moe_first_on_node(sh, c, j)) r.npos[size_t{t} * nodes + n] = r.node_tokens[n]++;
    }
  }
  for (uint32_t d = 0; d < world; ++d)
    if (r.send_tokens[d] > g.capacity()) {
      r.error = "routing sends " + str(r.send_tokens[d]) + " tokens from rank " + str(g.rank) + " to rank " + str(d) +
                "; recv_tokens_per_source is " + str(g.capacity()) + " (raise it, at most tokens = " + str(g.tokens) +
                ")";
      return r;
    }
  for (uint32_t n = 0; n < nodes; ++n)
    if (r.node_tokens[n] > g.capacity()) {
      r.error = "routing sends " + str(r.node_tokens[n]) + " tokens from rank " + str(g.rank) + " to node " + str(n) +
                "; recv_tokens_per_source is " + str(g.capacity()) + " (raise it, at most tokens = " + str(g.tokens) +
                ")";
      return r;
    }
  return r;
}

MoeRowLayout moe_row_layout(const MoeGeometry& g, const std::vector<std::vector<uint32_t>>& counts) {
  MoeRowLayout l;
  const uint32_t world = g.layout.world(), epr = g.experts_per_rank();
  l.expert_base.assign(epr + 1, 0);
  l.source_base.assign(size_t{epr} * world, 0);
  for (uint32_t s = 0; s < world; ++s)
    if (counts[s][0] > g.capacity()) {
      l.error = "rank " + str(s) + " sends " + str(counts[s][0]) + " tokens to rank " + str(g.rank) +
                "; recv_tokens_per_source is " + str(g.capacity());
      return l;
    }
  for (uint32_t e = 0; e < epr; ++e) {
    uint64_t within = 0;
    for (uint32_t i = 0; i < world; ++i) {  // sources in arrival order (note 5)
      const uint32_t s = moe_source_order(g.layout, g.rank, i);
      l.source_base[size_t{e} * world + s] = within;
      within += counts[s][1 + e];
    }
    l.expert_base[e + 1] = l.expert_base[e] + within;
  }
  l.total_rows = l.expert_base[epr];
  if (l.total_rows > g.rows_capacity())
    l.error = "rank " + str(g.rank) + " receives " + str(l.total_rows) + " expert rows; expert_rows_capacity is " +
              str(g.rows_capacity());
  return l;
}

std::vector<int32_t> moe_make_routing(MoeRouteKind kind, uint32_t tokens, uint32_t experts, uint32_t top_k,
                                      uint32_t world, uint32_t rank, uint64_t seed) {
  std::mt19937_64 rng(seed * 1000003 + rank);
  std::vector<int32_t> out(size_t{tokens} * top_k, -1);
  std::vector<double> weight(experts, 1.0);
  uint32_t pool = experts;  // experts [0, pool) of `order` may be chosen
  std::vector<uint32_t> order(experts);
  std::iota(order.begin(), order.end(), 0u);
  if (kind == MoeRouteKind::kZipf) {
    std::mt19937_64 perm(seed);  // the same popularity on every rank
    std::shuffle(order.begin(), order.end(), perm);
    for (uint32_t i = 0; i < experts; ++i) weight[i] = 1.0 / std::pow(double(i + 1), 1.1);
  } else if (kind == MoeRouteKind::kAllToOneRank || kind == MoeRouteKind::kOnlyRankZeroSends) {
    pool = experts / world;  // rank 0's experts
    if (kind == MoeRouteKind::kOnlyRankZeroSends && rank != 0) pool = 0;
  } else if (kind == MoeRouteKind::kSomeEmpty) {
    // only every third expert is ever chosen: most experts (and, with few per rank, some ranks) get nothing
    pool = 0;
    for (uint32_t e = 0; e < experts; e += 3) order[pool++] = e;
  }
  const uint32_t k = std::min(top_k, pool);
  // Draws without replacement from the weights of order[0, pool): inverse CDF with retries on
  // a repeat, and an exact draw over what is left after a few misses (k close to pool).
  std::vector<double> cdf(pool);
  double total = 0;
  for (uint32_t i = 0; i < pool; ++i) cdf[i] = (total += weight[i]);
  std::uniform_real_distribution<double> u01(0.0, 1.0);
  std::vector<uint32_t> picked;
  for (uint32_t t = 0; t < tokens; ++t) {
    if (kind == MoeRouteKind::kNoChoices && t % 3 == 1) continue;  // a token with no choice at all
    picked.clear();
    for (uint32_t j = 0; j < k; ++j) {
      uint32_t i = pool;
      for (int attempt = 0; attempt < 16 && i == pool; ++attempt) {
        const auto it = std::upper_bound(cdf.begin(), cdf.end(), u01(rng) * total);
        const uint32_t c = static_cast<uint32_t>(std::min<size_t>(it - cdf.begin(), pool - 1));
        if (std::find(picked.begin(), picked.end(), c) == picked.end()) i = c;
      }
      if (i == pool) {  // exact: weighted over the experts not picked yet
        double left = 0;
        for (uint32_t c = 0; c < pool; ++c)
          if (std::find(picked.begin(), picked.end(), c) == picked.end()) left += weight[c];
        double x = u01(rng) * left;
        for (uint32_t c = 0; c < pool && i == pool; ++c) {
          if (std::find(picked.begin(), picked.end(), c) != picked.end()) continue;
          x -= weight[c];
          if (x <= 0) i = c;
        }
        if (i == pool)  // rounding: the last one left
          for (uint32_t c = pool; c-- > 0 && i == pool;)
            if (std::find(picked.begin(), picked.end(), c) == picked.end()) i = c;
      }
      picked.push_back(i);
      out[size_t{t} * top_k + j] = static_cast<int32_t>(order[i]);
    }
    if (kind == MoeRouteKind::kNoChoices && t % 3 == 2 && top_k > 1) out[size_t{t} * top_k] = -1;  // one masked choice
  }
  return out;
}

}  // namespace mkernel::kernels
