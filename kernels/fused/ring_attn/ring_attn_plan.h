// ring_attn_plan.h: the movement plan of ring attention (sequence parallelism), a host object.
// It says, for one rank, which rank's keys and values it attends to at each step, where that
// chunk comes from and into which buffer slot, how the rank's queries relate to it (full, causal
// diagonal, skipped), and which flag says what; the kernel's communication blocks execute the
// list (ring_attn.cuh) and its attention blocks walk the steps; the CPU test replays every rank's
// plan for every layout up to 8 x 8 (ring_replay).
//
// Design notes
//  1. Pieces. Rank r = (node n, local g) of R = nodes x gpus holds the queries, keys and values of
//     s_local consecutive positions of its placed sequence (note 5). What moves is its *chunk*:
//     its keys and values (both, [B, H_kv, s_local, D] bf16 in the caller's packed layout, K then
//     V in a slot). At step t, t = 0 .. R-1, rank r attends to the chunk of
//         source(t) = rank ((n + t / gpus) mod nodes, (g + t mod gpus) mod gpus),
//     so step 0 is its own chunk (read from its inputs, never copied), then the node peers' (over
//     NVLink, fast), then node by node the other nodes' (through the proxies, slow, started first).
//  2. Paths. Every chunk crosses the network once per destination node and NVLink once per
//     destination GPU:
//       kRingSend     stage the own chunk once in the network workspace (slot `own node`) and put
//                     it through the proxy to the rail peer on every other node (their slot
//                     `own node`), raising arrival(own node) there;
//       kRingReceive  wait arrival(node); copy the network slot into the own KV slot of the step
//                     that consumes the rail peer's chunk; raise the own arrived(step);
//       kRingPush     copy a chunk into a node peer's KV slot over NVLink, raise its arrived(step):
//                     the own chunk (src_step 0, from the inputs), or a chunk this rank received
//                     from its rail peer (a *forward*, from the own KV slot of src_step).
//     Rank (n, h) delivers to (n, h - j) exactly the chunks that rank consumes at steps
//     i * gpus + j: its own for i = 0, the one from node n + i otherwise.
//  3. Slots. A rank has `slots` KV slots in its NVLink buffer; step t >= 1 uses slot (t - 1) mod
//     slots. Before a slot is written for step t, its previous contents must be consumed: its
//     reader is step t - slots of this launch (flag freed(t - slots) of the receiving rank), or
//     for t <= slots the previous launch (the receiver's done flag, the rank's own stream order).
//     freed(t) is raised when every attention block of the rank finished loading chunk t *and*
//     every forward out of slot t finished reading it (a count per step, forwards_out(t)).
//     With forwards (nodes > 1) slots >= gpus is required: a forward out of step i * gpus into a
//     peer's step i * gpus + j waits for that peer's freed(i * gpus + j - slots), which must be an
//     earlier step for the waits to form no circle (the replay finds the deadlock otherwise).
//  4. Flags (all carry launch numbers, comm.cuh note 2), one writer each:
//       NVLink fused-op flags of a rank (after done(p), layout.h):
//         arrived(t) = world + t           chunk of step t is in its slot (writer: whoever delivers)
//         freed(t)   = world + R + t       slot of step t may be written again (writer: the rank)
//       Fused-op flags of the flag array (after slot_free(n), layout.h; raised by the proxy):
//         arrival(n) = nodes + n           the rail peer on node n's chunk is in network slot n
//     The list of a rank is ordered by the step at which the receiving rank consumes what it
//     delivers, so every wait is for an earlier step and the ranks cannot wait in a circle (note
//     3). The send (staging into host memory, then the puts) goes right after the pushes of the
//     own chunk, which the node peers need first (steps 1 .. gpus - 1) and which, like the send,
//     wait only on the previous launch (their steps are at most gpus - 1 <= slots across nodes);
//     the chunk it carries is first needed at step gpus.
//  5. Placement and relations. Positions are placed on ranks in one of three ways:
//       kRingNonCausal         contiguous, no mask: every (query, chunk) pair is full;
//       kRingCausalContiguous  contiguous, causal: rank r holds positions [r s, (r + 1) s); its
//                              own chunk is the causal diagonal, earlier ranks' full, later
//                              ranks' skipped (rank R - 1 does R times the work of rank 0);
//       kRingCausalZigzag      causal, balanced: the sequence is cut into 2R chunks of c =
//                              s_local / 2 positions and rank r holds chunks r and 2R - 1 - r.
//                              Its queries form two *groups* (rows [0, c) and [c, 2c)); for the
//                              chunk of rank q: group 0 sees q = r causally (offset 0), q < r
//                              over its first c keys, q > r not at all; group 1 sees q = r with
//                              causal offset c, q < r over its first c keys, q > r over all 2c.
//                              Every rank attends to exactly 2 R c^2 query-key pairs.
//     A group's pair (step, group) is a kernel chunk (AttnChunk: relation, keys, causal offset,
//     running-state flags over the group's non-skipped steps: the first starts the running
//     state, the last writes O and lse).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fused/common/layout.h"

namespace mkernel::kernels {

enum RingPlacement : uint32_t {
  kRingNonCausal = 0,
  kRingCausalContiguous = 1,
  kRingCausalZigzag = 2,
};

// The most KV slots a rank keeps (each slot's two tensor maps travel as kernel parameters).
inline constexpr uint32_t kRingMaxSlots = 8;
// The most ranks one ring spans (step numbers are 16-bit in RingStep).
inline constexpr uint32_t kRingMaxWorld = 4096;

// Relations (the attention core's AttnRelation values) and running-state flags, repeated here so
// the plan stays plain C++ (ring_attn.cu checks they equal the core's).
enum RingRelation : uint32_t { kRingFull = 0, kRingCausal = 1, kRingSkip = 2 };
enum RingChunkFlags : uint32_t { kRingReadRunning = 1, kRingWriteFinal = 2 };

// What one query group does with the chunk of one step (note 5). Layout-compatible with AttnChunk.
struct RingChunk {
  uint32_t kv_len = 0;  // keys visited, from the chunk's first position
  uint32_t relation = kRingSkip;
  int32_t causal_offset = 0;  // kRingCausal: row i sees key j iff j <= i + causal_offset
  uint32_t flags = 0;         // RingChunkFlags
};
static_assert(sizeof(RingChunk) == 16);

enum RingStepKind : uint8_t {
  kRingSend = 0,     // own chunk -> own network slot `node`, then put to every other node's rail peer
  kRingPush = 1,     // chunk (own inputs, or own slot of src_step) -> node peer `peer`'s slot of dst_step
  kRingReceive = 2,  // wait arrival(node); network slot `node` -> own slot of dst_step
};

struct RingStep {
  uint8_t kind;
  uint8_t reserved;
  uint16_t src_step;    // kRingPush: 0 = the own inputs, else the own step whose slot holds the chunk
  uint16_t dst_step;    // kRingPush: the peer's step; kRingReceive: the own step
  uint16_t node;        // kRingSend: the own node; kRingReceive: the node the chunk came from
  uint32_t peer;        // kRingPush: the destination rank; else this rank
  uint16_t wait_freed;  // the destination's step whose freed flag must be up (0: the previous launch's done)
  uint16_t reserved2;
};
static_assert(sizeof(RingStep) == 16);

struct RingGeometry {
  FusedLayout layout;
  uint32_t rank = 0;
  uint32_t s_local = 0;  // positions per rank (queries, keys and values)
  uint32_t placement = kRingNonCausal;
  uint32_t slots = 0;  // KV slots per rank (note 3); 0: ring_default_slots

  MK_KERNEL_HD constexpr uint32_t world() const { return layout.world(); }
  // The rank whose chunk rank `r` attends to at step t (note 1), and the inverse.
  MK_KERNEL_HD constexpr uint32_t source_of(uint32_t r, uint32_t t) const {
    const uint32_t G = layout.gpus, N = layout.nodes;
    return layout.rank_of((layout.node_of(r) + t / G) % N, (layout.local_of(r) + t % G) % G);
  }
  MK_KERNEL_HD constexpr uint32_t step_of(uint32_t r, uint32_t src) const {
    const uint32_t G = layout.gpus, N = layout.nodes;
    const uint32_t i = (layout.node_of(src) + N - layout.node_of(r)) % N;
    const uint32_t j = (layout.local_of(src) + G - layout.local_of(r)) % G;
    return i * G + j;
  }
  MK_KERNEL_HD constexpr uint32_t slot_of(uint32_t t) const { return (t - 1) % slots; }  // t >= 1
  // Forwards out of the slot of step t (note 3): a chunk received from a rail peer goes on to
  // every node peer.
  MK_KERNEL_HD constexpr uint32_t forwards_out(uint32_t t) const {
    return (t >= layout.gpus && t % layout.gpus == 0) ? layout.gpus - 1 : 0;
  }
  // Query groups (note 5): first row and rows.
  MK_KERNEL_HD constexpr uint32_t groups() const { return placement == kRingCausalZigzag ? 2 : 1; }
  MK_KERNEL_HD constexpr uint32_t group_row0(uint32_t g) const { return g == 0 ? 0 : s_local / 2; }
  MK_KERNEL_HD constexpr uint32_t group_rows(uint32_t g) const {
    return placement == kRingCausalZigzag ? s_local / 2 : (g == 0 ? s_local : 0);
  }

  // Flag indices (note 4).
  MK_KERNEL_HD constexpr uint32_t arrived_flag(uint32_t t) const { return layout.nvl_op_flags() + t; }
  MK_KERNEL_HD constexpr uint32_t freed_flag(uint32_t t) const { return layout.nvl_op_flags() + world() + t; }
  MK_KERNEL_HD constexpr uint32_t arrival_flag(uint32_t node) const { return layout.net_op_flags() + node; }
  MK_KERNEL_HD constexpr uint32_t nvl_flags_needed() const { return layout.nvl_op_flags() + 2 * world(); }
  MK_KERNEL_HD constexpr uint32_t net_flags_needed() const {
    return layout.nodes > 1 ? layout.net_op_flags() + layout.nodes : 0;
  }
};

// The default slot count: 4 (at most R - 1, at least gpus across nodes, at most kRingMaxSlots).
uint32_t ring_default_slots(const FusedLayout& layout);

// "" when the geometry is usable, else what is wrong (field, value, expectation).
std::string ring_check_geometry(const RingGeometry& g);

// What group `group` of rank g.rank does with the chunk of step t (note 5), flags included.
RingChunk ring_chunk(const RingGeometry& g, uint32_t t, uint32_t group);
// All of them, [t * 2 + group] (a second group is kRingSkip when there is none).
std::vector<RingChunk> ring_chunks(const RingGeometry& g);
// Query-key pairs a rank attends to (for balance checks and FLOP counts).
uint64_t ring_visible_pairs(const RingGeometry& g);

// This rank's communication steps, in the order the communication blocks take them (note 4).
std::vector<RingStep> ring_steps(const RingGeometry& g);

// ---- zigzag placement (note 5) -----------------------------------------------------------------

// For a sequence of seq positions over `world` ranks in kRingCausalZigzag placement: the original
// position of placed position p (placed = rank 0's s_local positions, then rank 1's, ...), and
// the inverse. seq must be a positive multiple of 2 x world. "" or what is wrong.
// Host and device (ring_zigzag.cu's reorder kernel uses the same two functions).
std::string ring_zigzag_check(uint64_t seq, uint32_t world);
MK_KERNEL_HD constexpr uint64_t ring_zigzag_source(uint64_t seq, uint32_t world, uint64_t placed) {
  const uint64_t s_local = seq / world, c = s_local / 2;
  const uint64_t r = placed / s_local, l = placed % s_local;
  return (l < c ? r : 2ull * world - 1 - r) * c + l % c;
}
MK_KERNEL_HD constexpr uint64_t ring_zigzag_target(uint64_t seq, uint32_t world, uint64_t original) {
  const uint64_t s_local = seq / world, c = s_local / 2;
  const uint64_t chunk = original / c, k = original % c;
  return chunk < world ? chunk * s_local + k : (2ull * world - 1 - chunk) * s_local + c + k;
}
// The whole permutation: perm[placed] = original.
std::vector<uint64_t> ring_zigzag_permutation(uint64_t seq, uint32_t world);

// ---- CPU replay (tests) --------------------------------------------------------------------------

// Broken plans, to prove the replay's checks catch what they claim to.
enum class RingPlanFault : uint8_t {
  kNone,
  kNoFreedWait,        // pushes and receives ignore freed() and the previous launch's done
  kFreeBeforeForward,  // freed(t) counts only the attention blocks, not the forwards
  kDropLastPush,       // rank 0's last push is missing
  kNoSlotFreeWait,     // sends do not wait for the rail peers' previous launch
  kTooFewSlots,        // slots = gpus - 1 across nodes (below the rule of note 3)
  kLateStepCount,      // an attention block counts itself out of step t only once chunk t + 1
                       //   arrived (the kernel's first version: a deadlock with one slot)
};

struct RingReplayOptions {
  uint32_t launches = 3;     // consecutive launches, no reset in between
  uint32_t attn_blocks = 2;  // attention blocks per rank, each loading every chunk
  uint32_t comm_blocks = 2;  // communication blocks per rank, each moving a slice of every item
  uint32_t slots = 0;        // 0: ring_default_slots
  uint32_t placement = kRingCausalZigzag;
  uint64_t seed = 1;  // interleaving of every agent
  RingPlanFault fault = RingPlanFault::kNone;
};

struct RingReplayReport {
  std::string error;  // "" when every check held
  uint64_t events = 0;
  uint64_t network_chunk_transfers = 0;   // puts through the proxies, all launches
  uint64_t nvlink_chunk_transfers = 0;    // pushes into a node peer, all launches
  uint64_t max_sends_per_chunk_node = 0;  // of one chunk to one node in one launch
};

// Replays every rank's plan as an interleaving of independent agents (each rank's communication
// list, its attention blocks walking the steps, the proxies delivering puts and signals in any
// order), over `launches` launches, and checks: every rank attends to every rank's chunk exactly
// once per launch, with the right launch's data; no slot (KV or network) is written while its
// contents are still to be read or being read; every chunk crosses the network once per other
// node; nobody waits on a flag nobody raises (a deadlock names every waiting agent).
RingReplayReport ring_replay(const FusedLayout& layout, const RingReplayOptions& o);

}  // namespace mkernel::kernels
