// moe_plan.h: the movement plan of the fused MoE (dispatch + expert GEMM + combine), a host
// object. Unlike AllGather+GEMM, what moves depends on the routing, which is known only on the
// GPU when the kernel runs; so the plan fixes everything else (buffers, regions, flags, the
// order of sources, the positions every row takes as functions of the routing) and the routing
// functions below are written once for host and device. The CPU replay (moe_replay) runs the
// whole protocol with those functions for layouts up to 8 x 8 and any routing.
//
// Design notes
//  1. Shapes. Every rank holds `tokens` tokens (rows of `hidden` bf16) and, per token, `top_k`
//     choices: an expert in [0, experts) or -1 (no choice: the token is not sent for it; a token
//     with no choice at all gets a zero output row) and a router score (fp32). Experts are spread
//     evenly: rank d hosts experts [d * epr, (d + 1) * epr), epr = experts / world. A choice
//     outside [-1, experts) or the same expert twice in one token is an error naming the token.
//  2. Dispatch, once per rank. A token goes to every rank hosting at least one of its experts,
//     once, whatever the number of its experts there. Rank s writes the tokens it sends to rank d
//     into d's receive region [s], densely, in token order: token t lands at pos(t, d), the
//     number of s's earlier tokens that also go to d. Regions hold `recv_tokens_per_source` tokens
//     (default `tokens`, the worst case: no routing can overflow it); the same capacity bounds
//     the tokens one source sends to one other node (note 3). A smaller capacity is
//     checked by the sender before anything moves and by the receiver when the counts arrive,
//     and overflow ends the launch on every rank with a named cause (never a dropped token).
//  3. Dispatch, once per node. For a node other than its own, rank s = (n, g) sends each token
//     that has any destination there once, to its rail peer (n', g), into network slot [n] at
//     npos(t, n'), the number of s's earlier tokens bound for node n'. Each token carries a record
//     (MoeTokenMeta) with, per choice, the expert's slot and score, and the token's pos() on every
//     rank of the destination node; the rail peer forwards the token over NVLink to each rank of
//     its node that the record names (itself included). So a token crosses the network once per
//     destination node and NVLink once per destination GPU.
//  4. Counts first. Before its tokens, s sends every rank d its count record: how many tokens it
//     sends d and how many (token, choice) rows it has for each of d's experts (through the rail
//     peer for other nodes, like the tokens). Receivers learn everything from the records: no
//     host synchronisation, no round trip (the sender's positions are its own prefix counts).
//  5. Expert-ordered rows. Receiver d lays out the rows of its expert GEMM by expert, then by
//     source in arrival order (itself, node peers in node_peer order, then the other nodes in
//     recv_node order, their ranks by local index: moe_source_order), then by token order. A row
//     (s, token, expert e) sits at expert_base(e) + source_base(e, s) + slot, where slot is the
//     number of s's earlier tokens choosing e (computed by the sender, carried in the record). A
//     band of rows therefore comes from a contiguous range of sources, and the first sources
//     are the ones that arrive first: the GEMM starts a band as soon as its sources are expanded.
//     Rows total at most `expert_rows_capacity` (default the worst case world x tokens x
//     min(top_k, epr)); more is the receiver's named error after the counts arrive.
//  6. Combine, mirrored. Receiver d sums, for each token it got, score x expert output over the
//     token's experts on d, in choice order, in fp32, and sends one bf16 partial row back the
//     way the token came. When the home rank s is on d's node: into s's partial region [local d]
//     over NVLink, at pos(t, d). Else the token came through s's rail peer on d's node,
//     f = (node of d, local of s): d writes the partial into f's partial region [local d], f sums
//     its node's partials of the token in local-index order (fp32) and sends one bf16 row over
//     the network to s's network slot [node of d] at npos(t, node of d). The home rank sums its
//     own node's partials (local-index order), then the other nodes' (node order), in fp32, and
//     writes the token's bf16 output row. Every order is fixed: results are bit-identical from
//     launch to launch for the same inputs. Where the partials land: note 8.
//  7. Flags carry launch numbers (comm.cuh note 2), one writer each; done() and slot_free() are
//     the places every fused op shares (layout.h). A writer into a peer's region waits for that
//     peer's done() (NVLink) or slot_free() (network) of the previous launch.
//  8. Partial regions. The partials node peer d returns to rank f concern tokens whose home is
//     f or one of f's rail peers (the tokens f forwarded), i.e. homes of f's local index on
//     every node. So f's partial region [l][n] holds, for node peer l and home node n, rows at
//     the token's position on d (pos(t, d) in d's region [home]): gpus x nodes x capacity rows.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fused/common/layout.h"

namespace mkernel::kernels {

inline constexpr uint32_t kMoeMaxTopK = 32;
inline constexpr uint32_t kMoeNoChoice = 0xffffffffu;  // "not sent there" in positions and slots

// ---- routing functions (host and device) ---------------------------------------------------------

struct MoeShape {
  FusedLayout layout;
  uint32_t experts = 0;
  uint32_t top_k = 0;

  MK_KERNEL_HD constexpr uint32_t experts_per_rank() const { return experts / layout.world(); }
  MK_KERNEL_HD constexpr uint32_t rank_of_expert(uint32_t e) const { return e / experts_per_rank(); }
  MK_KERNEL_HD constexpr uint32_t node_of_expert(uint32_t e) const { return layout.node_of(rank_of_expert(e)); }
};

// Whether choice j of a token is the first of its choices on its expert's rank (the one that
// counts the token for that rank). Choices of -1 are never first.
MK_KERNEL_HD inline bool moe_first_on_rank(const MoeShape& s, const int32_t* choices, uint32_t j) {
  if (choices[j] < 0) return false;
  const uint32_t r = s.rank_of_expert(static_cast<uint32_t>(choices[j]));
  for (uint32_t i = 0; i < j; ++i)
    if (choices[i] >= 0 && s.rank_of_expert(static_cast<uint32_t>(choices[i])) == r) return false;
  return true;
}

// Likewise for the expert's node.
MK_KERNEL_HD inline bool moe_first_on_node(const MoeShape& s, const int32_t* choices, uint32_t j) {
  if (choices[j] < 0) return false;
  const uint32_t n = s.node_of_expert(static_cast<uint32_t>(choices[j]));
  for (uint32_t i = 0; i < j; ++i)
    if (choices[i] >= 0 && s.node_of_expert(static_cast<uint32_t>(choices[i])) == n) return false;
  return true;
}

// 0 when a token's choices are usable, else 1 + the index of the first bad choice (outside
// [-1, experts), or an expert chosen twice).
MK_KERNEL_HD inline uint32_t moe_bad_choice(const MoeShape& s, const int32_t* choices) {
  for (uint32_t j = 0; j < s.top_k; ++j) {
    const int32_t e = choices[j];
    if (e < -1 || e >= static_cast<int32_t>(s.experts)) return j + 1;
    for (uint32_t i = 0; e >= 0 && i < j; ++i)
      if (choices[i] == e) return j + 1;
  }
  return 0;
}

// The i-th source (i = 0 .. world-1) of receiver d in arrival order (note 5): d itself, its node
// peers (node_peer order), then the other nodes (recv_node order), each node's ranks by local
// index. moe_source_index is its inverse.
MK_KERNEL_HD inline uint32_t moe_source_order(const FusedLayout& l, uint32_t d, uint32_t i) {
  if (i < l.gpus) return i == 0 ? d : l.node_peer(d, i);
  const uint32_t k = i - l.gpus;
  return l.rank_of(l.recv_node(l.node_of(d), 1 + k / l.gpus), k % l.gpus);
}
MK_KERNEL_HD inline uint32_t moe_source_index(const FusedLayout& l, uint32_t d, uint32_t s) {
  const uint32_t nd = l.node_of(d), ns = l.node_of(s);
  if (ns == nd) {
    if (s == d) return 0;
    return (l.local_of(d) + l.gpus - l.local_of(s)) % l.gpus;  // node_peer(d, i) = d - i
  }
  return l.gpus + ((ns + l.nodes - nd) % l.nodes - 1) * l.gpus + l.local_of(s);
}

// What travels with every dispatched token (notes 3 and 6): per choice, the expert (global
// index; -1 when it is not on the destination node), the row slot within (source, expert) and
// the score; per rank of the destination node, the token's position in that rank's region
// (kMoeNoChoice when it does not go there); the token's index on its home rank. Stored as
// 32-bit words, padded to 16 bytes (MoeMeta gives the offsets).
MK_KERNEL_HD constexpr uint32_t moe_meta_words(uint32_t top_k, uint32_t gpus) {
  return (3 * top_k + gpus + 1 + 3) / 4 * 4;
}
struct MoeMeta {
  uint32_t top_k, gpus;
  MK_KERNEL_HD constexpr uint32_t expert(uint32_t j) const { return j; }
  MK_KERNEL_HD constexpr uint32_t slot(uint32_t j) const { return top_k + j; }
  MK_KERNEL_HD constexpr uint32_t score(uint32_t j) const { return 2 * top_k + j; }
  MK_KERNEL_HD constexpr uint32_t pos(uint32_t local) const { return 3 * top_k + local; }
  MK_KERNEL_HD constexpr uint32_t token() const { return 3 * top_k + gpus; }
  MK_KERNEL_HD constexpr uint32_t words() const { return moe_meta_words(top_k, gpus); }
};

// ---- the plan -------------------------------------------------------------------------------------

struct MoeGeometry {
  FusedLayout layout;
  uint32_t rank = 0;
  uint32_t tokens = 0;       // per rank, every launch
  uint32_t hidden = 0;       // elements per token row (bf16), multiple of 8
  uint32_t out_hidden = 0;   // elements per expert output row (the combine's width), multiple of 8
  uint32_t experts = 0;      // multiple of the world size
  uint32_t top_k = 0;        // 1 .. min(experts, kMoeMaxTopK)
  uint32_t recv_tokens_per_source = 0;  // 0: tokens (the worst case)
  uint64_t expert_rows_capacity = 0;    // 0: the worst case (note 5)
  uint32_t chunk_tokens = 0;            // tokens per flagged chunk; 0: moe_default_chunk_tokens

  MoeShape shape() const { return MoeShape{layout, experts, top_k}; }
  uint32_t experts_per_rank() const { return experts / layout.world(); }
  uint32_t capacity() const { return recv_tokens_per_source ? recv_tokens_per_source : tokens; }
  uint64_t rows_capacity() const;
  uint32_t chunk() const;
  uint32_t chunks() const { return (capacity() + chunk() - 1) / chunk(); }  // per source region
  uint32_t meta_words() const { return moe_meta_words(top_k, layout.gpus); }
  uint32_t count_words() const { return 1 + experts_per_rank(); }  // tokens, then rows per expert
  // A network count record: tokens sent to the node, then count_words() per rank of the node.
  uint32_t net_count_words() const { return 1 + layout.gpus * count_words(); }

  // NVLink flags after the shared ones (layout.h): count record of source s arrived; chunk c of
  // source s's tokens arrived; chunk c of the partials from node peer (local index) l for homes
  // on node n arrived.
  uint32_t count_flag(uint32_t s) const { return layout.nvl_op_flags() + s; }
  uint32_t token_flag(uint32_t s, uint32_t c) const { return layout.nvl_op_flags() + layout.world() + s * chunks() + c; }
  uint32_t partial_flag(uint32_t l, uint32_t n, uint32_t c) const {
    return layout.nvl_op_flags() + layout.world() * (1 + chunks()) + (l * layout.nodes + n) * chunks() + c;
  }
  uint32_t nvl_flags_needed() const { return partial_flag(layout.gpus, 0, 0); }
  // Network flags after the shared ones: node n's count records, token chunks and summed
  // partial chunks arrived in slot [n].
  uint32_t net_count_flag(uint32_t n) const { return layout.net_op_flags() + n; }
  uint32_t net_token_flag(uint32_t n, uint32_t c) const { return layout.net_op_flags() + layout.nodes + n * chunks() + c; }
  uint32_t net_partial_flag(uint32_t n, uint32_t c) const {
    return layout.net_op_flags() + layout.nodes * (1 + chunks()) + n * chunks() + c;
  }
  uint32_t net_flags_needed() const { return layout.nodes > 1 ? net_partial_flag(layout.nodes, 0) : 0; }

  // NVLink buffer (every rank the same), byte offsets: count records [world] (count_stride
  // each), token rows [world][capacity][hidden], token records [world][capacity][meta_words],
  // partial rows [gpus][nodes][capacity][out_hidden]. Everything 16-byte aligned.
  uint64_t count_stride() const { return (uint64_t{count_words()} * 4 + 15) / 16 * 16; }
  uint64_t off_tokens() const { return uint64_t{layout.world()} * count_stride(); }
  uint64_t off_meta() const { return off_tokens() + uint64_t{layout.world()} * capacity() * hidden * 2; }
  uint64_t off_partials() const { return off_meta() + uint64_t{layout.world()} * capacity() * meta_words() * 4; }
  uint64_t nvl_bytes_needed() const {
    return off_partials() + uint64_t{layout.gpus} * layout.nodes * capacity() * out_hidden * 2;
  }
  // Network workspace (nodes > 1): an incoming slot per node, then an outgoing slot per node
  // (puts leave from registered memory). In a slot: the count record, then chunk by chunk the
  // rows and records of the chunk's tokens (one put moves a chunk), then the partial rows.
  uint64_t net_data() const { return (uint64_t{net_count_words()} * 4 + 15) / 16 * 16; }
  uint64_t net_chunk_bytes() const { return uint64_t{chunk()} * (uint64_t{hidden} * 2 + uint64_t{meta_words()} * 4); }
  uint64_t net_part() const { return net_data() + uint64_t{chunks()} * net_chunk_bytes(); }
  uint64_t net_slot() const { return net_part() + uint64_t{capacity()} * out_hidden * 2; }
  uint64_t net_bytes_needed() const { return layout.nodes > 1 ? 2 * uint64_t{layout.nodes} * net_slot() : 0; }
  // The caller's buffers for the expert-ordered rows and the expert outputs.
  uint64_t local_bytes_needed() const { return rows_capacity() * (uint64_t{hidden} + out_hidden) * 2; }
};

// The geometry of one rank (capacities and chunk left to their defaults).
inline MoeGeometry moe_geometry(const FusedLayout& layout, uint32_t rank, uint32_t tokens, uint32_t hidden,
                                uint32_t out_hidden, uint32_t experts, uint32_t top_k) {
  MoeGeometry g;
  g.layout = layout;
  g.rank = rank;
  g.tokens = tokens;
  g.hidden = hidden;
  g.out_hidden = out_hidden;
  g.experts = experts;
  g.top_k = top_k;
  return g;
}

// 64 tokens per chunk, fewer for small capacities (at least 8 chunks per region when possible).
uint32_t moe_default_chunk_tokens(uint32_t capacity);

// "" when the geometry is usable, else what is wrong (field, value, expectation).
std::string moe_check_geometry(const MoeGeometry& g);

// The fused kernel's role blocks when the caller leaves it open: 32 + 8 per node peer + 4 per
// other node, at most 96 and the SMs. On one rank (one H100, T = 128 / 4096 / 16384) 32 ran
// 1.0 / 1.18 / 1.21x faster than 16 and 48 or 64 slower at T = 4096 (docs/kernels.md section 14);
// the per-peer terms follow the NVLink store rate of one SM (about 20 GB/s, section 10), not yet
// measured with more than one GPU.
int moe_default_blocks(const FusedLayout& layout, int sms);

// Blocks of the dispatch and combine launched on their own (no GEMM beside them): one per work
// item of a stage (a chunk of one source's tokens: world x chunks), at least moe_default_blocks,
// at most the GPU's SMs. The copies into the expert rows and the combine's sums are bound by
// what each SM keeps in flight (about 50 GB/s a block), so they run faster on more SMs; more
// blocks than items would only wait. Measured (one H100, T = 4096, world 1, 64 items): 16 / 32
// / 64 blocks took 0.82 / 0.55 / 0.46 ms to dispatch and 0.37 / 0.20 / 0.12 ms to combine
// (docs/kernels.md section 14).
int moe_standalone_blocks(const MoeGeometry& g, int sms);

// What the routing phase of rank `rank` computes from its tokens' choices (note 2-4), on the
// GPU in the kernel; here as the reference the replay uses.
struct MoeRouting {
  std::string error;                     // bad choice or capacity overflow, named
  std::vector<uint32_t> send_tokens;     // [world] tokens sent to each rank
  std::vector<uint32_t> node_tokens;     // [nodes] tokens sent to each node (own node: 0)
  std::vector<uint32_t> rows;            // [world][epr] (token, choice) rows per destination expert
  std::vector<uint32_t> pos;             // [tokens][world] pos(t, d) or kMoeNoChoice
  std::vector<uint32_t> npos;            // [tokens][nodes] npos(t, n) or kMoeNoChoice (own node)
  std::vector<uint32_t> slot;            // [tokens][top_k] row slot within (rank, expert) or kMoeNoChoice
};
MoeRouting moe_route(const MoeGeometry& g, const int32_t* choices);

// The receiver's layout of expert-ordered rows (note 5), from the count records of all sources
// (counts[s] = source s's record for this rank: tokens, then rows per local expert).
struct MoeRowLayout {
  std::string error;                     // over expert_rows_capacity or recv_tokens_per_source
  uint64_t total_rows = 0;
  std::vector<uint64_t> expert_base;     // [epr + 1]
  std::vector<uint64_t> source_base;     // [epr][world] within the expert, by source rank
  uint64_t row_of(uint32_t e_local, uint32_t s, uint32_t slot) const {
    return expert_base[e_local] + source_base[size_t{e_local} * (source_base.size() / (expert_base.size() - 1)) + s] + slot;
  }
};
MoeRowLayout moe_row_layout(const MoeGeometry& g, const std::vector<std::vector<uint32_t>>& counts);

// ---- CPU replay (tests) --------------------------------------------------------------------------

// kUniform: top_k distinct experts, uniformly. kZipf: expert popularity ~ 1 / i^1.1 (the same
// popularity on every rank). kAllToOneRank: every token's experts on rank 0. kSomeEmpty: only
// every third expert is ever chosen. kNoChoices: every third token has no choice and others one
// masked choice. kOnlyRankZeroSends: rank 0's tokens choose its own experts, every other rank's
// tokens choose nothing (one busy rank, the others idle: only count records move between them).
enum class MoeRouteKind : uint8_t { kUniform, kZipf, kAllToOneRank, kSomeEmpty, kNoChoices, kOnlyRankZeroSends };

// Broken protocols, to prove the replay's checks catch what they claim to.
enum class MoePlanFault : uint8_t {
  kNone,
  kDropLastToken,        // rank 0 does not send its last routed token to its last destination
  kNoDoneWait,           // senders do not wait for the receiver's previous launch
  kExpandUnflagged,      // receivers expand chunks without waiting for their flags
  kForwardTwice,         // rail peers forward each token twice to the first rank of their node
  kSendPerChoice,        // tokens sent once per choice instead of once per rank
};

struct MoeReplayOptions {
  uint32_t launches = 3;        // consecutive launches, new routing each (graph replay)
  MoeRouteKind route = MoeRouteKind::kUniform;
  uint64_t seed = 1;
  MoePlanFault fault = MoePlanFault::kNone;
  uint32_t recv_tokens_per_source = 0;
  uint64_t expert_rows_capacity = 0;
  uint32_t chunk_tokens = 0;
  uint32_t fast_rank = ~0u;     // a rank that takes 3 of 4 turns when it can run (races ahead)
};

struct MoeReplayReport {
  std::string error;                         // "" when every check held
  std::vector<std::string> launch_errors;    // per rank, the named cause a launch ended with
  uint64_t network_token_transfers = 0;      // tokens put through the proxies, all launches
  uint64_t nvlink_token_transfers = 0;       // tokens stored into another GPU over NVLink
  uint64_t network_partial_transfers = 0;
  uint64_t nvlink_partial_transfers = 0;
  uint64_t rows = 0;                         // expert rows computed, all ranks and launches
  uint64_t gemm_bands_started_early = 0;     // bands computed before every source was expanded
};

// Replays every rank's kernel as interleaved agents (count and token senders, rail forwarders,
// expanders, the grouped GEMM, combiners, node aggregators, the home sum) over `launches`
// launches with fresh routing each, and checks: every token reaches every rank hosting one of
// its experts exactly once, with the right launch's data, read only after its flag; it crosses
// the network at most once per node and never to its own node; each expert row is computed once
// from the right token; every output row is the sum of exactly its token's choices; nothing is
// overwritten while its reader of the previous launch may still read it; no agent waits on a
// flag nobody raises; a capacity overflow or a bad choice ends the launch on every rank with the
// named cause and moves nothing.
MoeReplayReport moe_replay(const FusedLayout& layout, uint32_t tokens, uint32_t experts, uint32_t top_k,
                           const MoeReplayOptions& o);

// Routing generators (also for the GPU tests and benchmarks): choices [tokens][top_k] for one rank.
std::vector<int32_t> moe_make_routing(MoeRouteKind kind, uint32_t tokens, uint32_t experts, uint32_t top_k,
                                      uint32_t world, uint32_t rank, uint64_t seed);

}  // namespace mkernel::kernels
