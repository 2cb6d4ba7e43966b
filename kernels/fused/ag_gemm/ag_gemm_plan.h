// ag_gemm_plan.h: the movement plan of AllGather+GEMM, a host object. It says, for one rank,
// which piece of the activation goes where, in which order, over which path, and which flag
// says it arrived; the kernel's communication blocks execute exactly this list
// (ag_gemm.cuh), and the CPU tests replay it for every layout up to 8 x 8 (ag_replay).
//
// Design notes
//  1. Pieces. Rank r = (node n, local g) holds shard r: rows [r * m_local, (r + 1) * m_local) of
//     the gathered activation A [world * m_local, k]. Each shard is cut into `chunks` chunks of
//     chunk_rows rows (the last may be shorter); a chunk is what moves and what is flagged.
//  2. Paths. Inside a node a rank stores its chunks straight into every node peer's gathered
//     buffer over NVLink (kAgPush). Between nodes it stages each chunk once in its network
//     workspace (slot n) and puts it, through its proxy, to its rail peer on every other node
//     (kAgSend), into that peer's slot n. The rail peer copies it into its own gathered buffer
//     (kAgReceive) and pushes it on to its node peers over NVLink (kAgPush of a shard that is
//     not its own). So every chunk crosses the network once per destination node and NVLink
//     once per destination GPU.
//  3. Flags (all carry launch numbers, comm.cuh note 2), with one writer each:
//       NVLink fused-op flags of a rank:
//         done(p)        = p                         node peer p finished its previous fused launch
//                                                    (so its gathered buffer may be written again)
//         ready(s, c)    = world + s * chunks + c    chunk c of shard s is in its gathered buffer
//       Fused-op flags of the flag array (raised by the proxy on arrival):
//         slot_free(n)   = n                         node n's rail peer finished its previous
//                                                    fused launch (its slots may be written again)
//         arrival(n, c)  = nodes + n * chunks + c    chunk c from node n is in workspace slot n
//     done() and slot_free() sit where every fused op keeps them (layout.h), whatever the shape.
//     The GEMM waits on ready(); the communication steps wait on ready() (to forward), arrival()
//     (to receive), done() and slot_free() of the previous launch (before overwriting).
//  4. Order. Steps are listed so that no step waits for one listed after it on the same rank, and
//     the only waits across ranks are for other ranks' first-phase steps (which wait only on the
//     previous launch). The kernel runs the list in order with every communication block moving
//     a slice of each step (ag_gemm.cuh); the replay checks that order (one block) and also any
//     round-robin assignment of whole steps to several blocks, so the plan does not depend on how
//     the kernel shares the work. Sends go first to the peer that needs the rows next (layout.h).
//  5. Copy-engine pushes (AgGemmConfig::copy_engine_pushes). The pushes of the own shard need
//     nothing of this launch, only that the peer finished its previous one, so they can leave
//     the SMs: one copy stream per node peer waits at a gate that role block 0 opens once the
//     peer's done() reached the previous launch, then copies the chunks in plan order, each
//     followed by its ready() flag (a copy of this rank's launch number, so a replayed graph
//     raises the right value). The launch ends when the kernel and every copy stream are done;
//     done() is still raised by the kernel's last block (this rank's reading is over then).
//     Forwarding pushes (shards from other nodes) wait on arrivals and stay with the blocks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fused/common/layout.h"

namespace mkernel::kernels {

enum AgStepKind : uint8_t {
  kAgLocal = 0,    // own shard chunk -> own gathered buffer; raise own ready(r, c)
  kAgPush = 1,     // chunk of `shard` -> node peer `peer`'s gathered buffer over NVLink; raise its ready
  kAgSend = 2,     // own shard chunk -> workspace slot `node` (= own node), then put to every
                   //   rail peer's slot `node`, raising its arrival(node, c)
  kAgReceive = 3,  // wait arrival(node, c); workspace slot `node` -> own gathered; raise own ready
};

struct AgStep {
  uint8_t kind;
  uint8_t reserved;
  uint16_t chunk;
  uint32_t shard;  // whose rows
  uint32_t peer;   // kAgPush: the destination rank
  uint32_t node;   // kAgSend: own node; kAgReceive: the node the chunk came from
};
static_assert(sizeof(AgStep) == 16);

// Everything the plan depends on.
struct AgGeometry {
  FusedLayout layout;
  uint32_t rank = 0;
  uint32_t m_local = 0;     // rows per shard (any positive value)
  uint32_t k = 0;           // columns (elements)
  uint32_t chunk_rows = 0;  // 0: ag_default_chunk_rows

  uint32_t chunks() const { return (m_local + chunk_rows - 1) / chunk_rows; }
  uint32_t rows_of_chunk(uint32_t c) const {
    return c + 1 < chunks() ? chunk_rows : m_local - (chunks() - 1) * chunk_rows;
  }
  uint64_t row_bytes() const { return uint64_t{k} * 2; }
  uint64_t shard_bytes() const { return uint64_t{m_local} * row_bytes(); }
  // ag_chunk_straddled for this rank (the trace's report).
  bool straddled(uint32_t c) const;

  // Flag indices (note 3; done() and slot_free() are the places every fused op shares, layout.h).
  uint32_t ready_flag(uint32_t shard, uint32_t chunk) const { return layout.nvl_op_flags() + shard * chunks() + chunk; }
  uint32_t done_flag(uint32_t peer) const { return layout.done_flag(peer); }
  uint32_t arrival_flag(uint32_t node, uint32_t chunk) const { return layout.net_op_flags() + node * chunks() + chunk; }
  uint32_t slot_free_flag(uint32_t node) const { return layout.slot_free_flag(node); }
  uint32_t nvl_flags_needed() const { return layout.nvl_op_flags() + layout.world() * chunks(); }
  uint32_t net_flags_needed() const { return layout.nodes > 1 ? layout.net_op_flags() + layout.nodes * chunks() : 0; }

  // Workspace: the gathered activation in the NVLink buffer; one slot per node in the network
  // workspace when the ranks span nodes.
  uint64_t nvl_bytes_needed() const { return uint64_t{layout.world()} * shard_bytes(); }
  uint64_t net_bytes_needed() const { return layout.nodes > 1 ? uint64_t{layout.nodes} * shard_bytes() : 0; }
};

// Whether a 128-row GEMM tile that reaches outside rank `rank`'s rows reads its chunk c, rows
// [c chunk_rows, c chunk_rows + rows) of the shard: then a kAgLocal step copies the chunk into
// the workspace, else it moves nothing (the GEMM reads A_r). Host and device (the kernel's rule).
MK_KERNEL_HD constexpr bool ag_chunk_straddled(uint32_t world, uint32_t rank, uint32_t m_local, uint32_t chunk_rows,
                                               uint32_t c, uint32_t rows) {
  const uint64_t lo = uint64_t{rank} * m_local, hi = lo + m_local, m = uint64_t{world} * m_local;
  const uint64_t g0 = lo + uint64_t{c} * chunk_rows, g1 = g0 + rows;
  for (uint64_t b = g0 / 128; b * 128 < g1; ++b) {
    const uint64_t t0 = b * 128, t1 = t0 + 128 < m ? t0 + 128 : m;
    if (t0 < lo || t1 > hi) return true;
  }
  return false;
}

inline bool AgGeometry::straddled(uint32_t c) const {
  return ag_chunk_straddled(layout.world(), rank, m_local, chunk_rows, c, rows_of_chunk(c));
}

// Chunks of at least 128 rows (a GEMM tile's height), at most 8 per shard: enough for the GEMM to
// start on a shard before all of it arrived, few enough that flags and steps stay cheap.
uint32_t ag_default_chunk_rows(uint32_t m_local);

// "" when the geometry is usable, else what is wrong (field, value, expectation).
std::string ag_check_geometry(const AgGeometry& g);

// This rank's steps, in the order the communication blocks take them (note 4).
std::vector<AgStep> ag_steps(const AgGeometry& g);

// Copy-engine pushes (note 5). ag_block_steps: the steps left to the communication blocks (every
// step but the pushes of the own shard). ag_copy_engine_pushes: those pushes, [i] for node peer i
// (L.node_peer(rank, i), i = 1 .. gpus - 1; [0] is empty), each in the plan's order; one copy
// stream per peer runs its list after that peer's gate opened.
std::vector<AgStep> ag_block_steps(const AgGeometry& g, bool copy_engine_pushes);
std::vector<std::vector<AgStep>> ag_copy_engine_pushes(const AgGeometry& g);

// One copy of the copy engines, in bytes: `bytes` from `src_offset` to `dst_offset`, then (when
// flag_offset != kAgNoFlag) the launch number into the 8 bytes at flag_offset; `gate` is the
// word the copy waits at.
inline constexpr uint64_t kAgNoFlag = ~uint64_t{0};
struct AgCopy {
  uint32_t shard = 0, chunk = 0;
  uint32_t gate = 0;
  uint64_t src_offset = 0, dst_offset = 0, bytes = 0;
  uint64_t flag_offset = kAgNoFlag;
};
// The pushes of ag_copy_engine_pushes as copies: src in A_r, dst and flag in the node peer's
// NVLink buffer (its gathered rows; its ready() flag, the fused-op flags starting at
// `fused_flags_offset`, NvlLayout::fused_flags_offset); [i] for node peer i, gate i.
std::vector<std::vector<AgCopy>> ag_copy_engine_copies(const AgGeometry& g, uint64_t fused_flags_offset);
// The gathered output's copies with copy-engine pushes: every other rank's chunk from the
// gathered buffer to the same offset of the output, in the order role block 0 opens their gates
// (gate shard * chunks + chunk); no flag.
std::vector<AgCopy> ag_gathered_out_copies(const AgGeometry& g);

// ---- CPU replay (tests) --------------------------------------------------------------------------

// Broken plans, to prove the replay's checks catch what they claim to.
enum class AgPlanFault : uint8_t {
  kNone,
  kDropLastPush,       // rank 0's last NVLink push is missing
  kNoPeerFreeWait,     // pushes and sends do not wait for the previous launch's readers
  kSendTwice,          // rank 0 sends its first chunk twice
  kReceiveUnflagged,   // receives do not wait for the arrival flag
  kForwardFirst,       // rank 0 lists its forwarding pushes before the receives they forward
};

struct AgReplayOptions {
  uint32_t launches = 3;           // consecutive launches, no reset in between
  uint32_t comm_blocks = 2;        // blocks per rank taking steps round-robin
  uint64_t seed = 1;               // interleaving of ranks, blocks and GEMMs
  AgPlanFault fault = AgPlanFault::kNone;
  bool copy_engine_pushes = false;  // own-shard pushes by one copy agent per node peer (note 5)
};

struct AgReplayReport {
  std::string error;                    // "" when every check held
  uint64_t steps_run = 0;
  uint64_t network_chunk_transfers = 0; // chunks put through the proxies, all launches
  uint64_t nvlink_chunk_transfers = 0;  // chunks stored into a peer over NVLink, all launches
  uint64_t max_network_sends_per_shard_node = 0;  // of one shard to one node in one launch
};

// Replays every rank's plan as an interleaving of independent agents (each rank's communication
// blocks and its GEMM, which reads every chunk once its ready flag says so), over `launches`
// launches, and checks: every rank receives every chunk of every shard exactly once per launch,
// with the right launch's data, before its GEMM reads it; nothing is overwritten while its reader
// of the previous launch may still read it; every chunk crosses the network once per destination
// node and never to its own node; nobody waits on a flag nobody raises (no agent left waiting).
AgReplayReport ag_replay(const FusedLayout& layout, uint32_t m_local, uint32_t chunk_rows, const AgReplayOptions& o);

}  // namespace mkernel::kernels
