// gemm_rs_plan.h: the movement plan of GEMM+ReduceScatter, a host object (whose index arithmetic
// the kernel shares, gemm_rs.cuh), and its CPU replay for any layout.
//
//   rank r:  P_r [M, n] = A_r [M, k_local] * W_r [n, k_local]^T   (the rank's partial)
//            C_r [m_local, n] = rows r * m_local ... (r + 1) * m_local - 1 of sum over q of P_q
//
// Design notes
//  1. Bands and tiles. M = world * m_local rows, cut into bands of m_local rows: band b is rank
//     b's result. Every rank computes its partial over the whole of M with the same GEMM tiling
//     (128-row tiles, block_n columns); a tile may cover rows of several bands when m_local is
//     not a multiple of 128. What moves is a whole tile's partial, in the engine's fragment
//     order (each consumer thread's values contiguous, 16 bytes per store: coalesced 512-byte
//     writes per warp, and the reader, running the same tiling, reads them back in the same
//     order), as bf16. The receiver uses only the rows of the bands it owns.
//  2. Hierarchy. Rank r = (node n, local g) is the node's aggregator of the bands of rail g, the
//     bands (n', g) for every node n'. A finished tile of rank r goes:
//       (a) for every node peer o != g with a band of rail o in the tile: the raw partial into o's
//           NVLink staging (slot of source g, position of the tile among rail o's tiles), then
//           staged(slot, position) raised on o;
//       (b) for every band (n', g), n' != n, in the tile: the node sum (own partial plus the
//           node peers' staged partials of the tile) into the network send slot n', and through
//           the proxy into rail peer (n', g)'s receive slot n, raising arrival(n, index) there;
//       (c) for the own band's rows: the node sum plus the other nodes' node sums (receive
//           slots), rounded once to bf16, into C_r.
//     So a partial crosses NVLink once to its node's aggregator, a node sum crosses the network
//     once per destination node, and nothing goes to the own node through the network.
//  3. Summation order (deterministic, no atomics): an fp32 accumulator starts from the own
//     partial (fp32, never rounded), adds the node peers' bf16 partials in increasing local
//     index, then (own band only) the other nodes' bf16 node sums in increasing node index, and
//     is rounded to bf16 once. The same inputs give the same bits on every run.
//  4. Order of tiles and deadlock freedom. Waits happen only in the epilogue of tiles with rows
//     of rail g ((b) and (c)), after the tile's own pushes (a). Two orders are used:
//       rotated: each rank starts at the band after its own and ends with its own band, so
//         every node peer pushes to a different aggregator at any time and a band's partials
//         arrive long before the owner needs them. Safe when waits can only be for tiles other
//         ranks compute without waiting: one node (only (c) waits, on (a) tiles), bands of whole
//         cluster tiles (m_local a multiple of 128 x cluster_m: no tile shared by two bands), and
//         the raster's groups aligned with the bands (the group divides the band's m groups),
//         so every rank computes all (a) tiles before any (c) tile.
//       identical: otherwise every rank takes the tiles in the same order; then the earliest
//         unfinished tile of any rank is reachable on every rank (all earlier ones are done),
//         and each rank's pushes of it precede its waits, so it finishes: by induction, all do.
//     The replay runs the engine's scheduler (units round-robin over clusters) and checks both.
//  5. Buffers are reused launch after launch: before its first push to a node peer in a launch
//     a rank waits until that peer finished its previous fused launch (done flag, layout.h), and
//     before its first send to a rail peer until that peer's slot_free signal of its previous
//     launch arrived.
//  6. Flags (launch numbers, comm.cuh note 2), after the ones every fused op shares (layout.h):
//       NVLink fused-op flags: staged(slot, position) = world + slot * stage_tiles + position
//                              result(band, index)    = world + (gpus - 1) * stage_tiles
//                                                       + band * slot_tiles + index       (AllReduce)
//       flag array fused-op flags: arrival(node, index) = nodes + node * slot_tiles + index
//                                  result_arrival(node, index) = nodes + nodes * slot_tiles
//                                                       + node * slot_tiles + index       (AllReduce)
//  7. GEMM+AllReduce is the same kernel with a second half: the owner of a band, once a tile of
//     it is final (c), also stores it (bf16, fragment order: the same bits everywhere) into every
//     node peer's result staging (slot of the band) and, through the proxy, into every rail
//     peer's result receive slot. Once a GEMM block has finished its own tiles it takes its share
//     of the other bands' tiles (epilogue_end): first the ones its rank forwards (from the
//     network: into C and on to the node peers' result staging), then the rest (from the result
//     staging into C). Forwards wait only on owners' epilogues, the rest on owners' epilogues or
//     forwards, so this phase cannot wait in a circle either. Every byte of a result crosses the
//     network once per node and NVLink once per GPU.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fused/common/layout.h"

namespace mkernel::kernels {

inline constexpr uint32_t kRsBlockM = 128;

struct RsGeometry {
  FusedLayout layout;
  uint32_t rank = 0;
  uint32_t m_local = 0;   // rows of C_r (any positive value); M = world * m_local
  uint32_t n = 0;         // columns (multiple of 8)
  uint32_t block_n = 0;   // the GEMM's tile width (128 or 256)
  bool all_reduce = false;  // GEMM+AllReduce: every rank gets every band (note 7)
  // M when it is not world x m_local (then m_local is not used): band b is rows
  // [b M / world, (b + 1) M / world), rounded down, so bands differ by at most a row and some are
  // empty when M < world. AllReduce takes any M this way.
  uint32_t m_rows = 0;

  MK_KERNEL_HD uint64_t m_total() const { return m_rows != 0 ? m_rows : uint64_t{layout.world()} * m_local; }
  MK_KERNEL_HD uint32_t num_m_blocks() const { return static_cast<uint32_t>((m_total() + kRsBlockM - 1) / kRsBlockM); }
  MK_KERNEL_HD uint32_t num_n_blocks() const { return (n + block_n - 1) / block_n; }
  MK_KERNEL_HD uint64_t tile_bytes() const { return uint64_t{kRsBlockM} * block_n * 2; }

  // Band b: rows [band_lo(b), band_lo(b + 1)).
  MK_KERNEL_HD uint64_t band_lo(uint32_t b) const { return uint64_t{b} * m_total() / layout.world(); }
  MK_KERNEL_HD uint64_t band_rows(uint32_t b) const { return band_lo(b + 1) - band_lo(b); }
  MK_KERNEL_HD uint64_t max_band_rows() const { return (m_total() + layout.world() - 1) / layout.world(); }
  MK_KERNEL_HD bool even_bands() const { return m_total() % layout.world() == 0; }
  // m blocks [band_mb_begin(b), band_mb_end(b)) hold rows of band b (none when it is empty).
  MK_KERNEL_HD uint32_t band_mb_begin(uint32_t b) const { return static_cast<uint32_t>(band_lo(b) / kRsBlockM); }
  MK_KERNEL_HD uint32_t band_mb_end(uint32_t b) const {
    if (band_rows(b) == 0) return band_mb_begin(b);
    return static_cast<uint32_t>((band_lo(b + 1) + kRsBlockM - 1) / kRsBlockM);
  }
  MK_KERNEL_HD uint32_t band_mb_count(uint32_t b) const { return band_mb_end(b) - band_mb_begin(b); }
  // The (non-empty) band holding row x: the last b with band_lo(b) <= x.
  MK_KERNEL_HD uint32_t band_of_row(uint64_t x) const {
    return static_cast<uint32_t>(((x + 1) * layout.world() - 1) / m_total());
  }
  // Bands with rows in m block mb lie in [first_band(mb), last_band(mb)]; empty bands in between
  // have no rows there (band_rows == 0).
  MK_KERNEL_HD uint32_t first_band(uint32_t mb) const { return band_of_row(uint64_t{mb} * kRsBlockM); }
  MK_KERNEL_HD uint32_t last_band(uint32_t mb) const {
    const uint64_t last_row = uint64_t{mb} * kRsBlockM + kRsBlockM - 1;
    return band_of_row(last_row < m_total() ? last_row : m_total() - 1);
  }
  MK_KERNEL_HD bool band_in_tile(uint32_t b, uint32_t mb) const {
    return b >= first_band(mb) && b <= last_band(mb) && band_rows(b) > 0;
  }

  // NVLink staging (note 2a): on the aggregator of rail o, slot of source local s, the m blocks
  // of rail o's bands in node order (a block shared by two of them counted once per band; the
  // first one is used).
  MK_KERNEL_HD uint32_t stage_slot(uint32_t owner_local, uint32_t src_local) const {
    return (src_local + layout.gpus - owner_local - 1) % layout.gpus;
  }
  MK_KERNEL_HD uint32_t rail_mblocks(uint32_t rail) const {
    uint32_t total = 0;
    for (uint32_t node = 0; node < layout.nodes; ++node) total += band_mb_count(layout.rank_of(node, rail));
    return total;
  }
  MK_KERNEL_HD uint32_t stage_mblocks() const {
    uint32_t most = 0;
    for (uint32_t g = 0; g < layout.gpus; ++g) most = rail_mblocks(g) > most ? rail_mblocks(g) : most;
    return most;
  }
  MK_KERNEL_HD uint32_t stage_tiles() const { return stage_mblocks() * num_n_blocks(); }
  // The first band of rail `rail` with rows in m block mb, or world when there is none.
  MK_KERNEL_HD uint32_t rail_band_in(uint32_t mb, uint32_t rail) const {
    for (uint32_t b = first_band(mb); b <= last_band(mb); ++b)
      if (layout.local_of(b) == rail && band_rows(b) > 0) return b;
    return layout.world();
  }
  // Position of tile (mb, nb) among rail `rail`'s staged tiles (its m block must hold rows of the
  // rail: rail_band_in(mb, rail) < world).
  MK_KERNEL_HD uint32_t stage_position(uint32_t mb, uint32_t nb, uint32_t rail) const {
    const uint32_t b = rail_band_in(mb, rail);
    uint32_t pos = 0;
    for (uint32_t node = 0; node < layout.node_of(b); ++node) pos += band_mb_count(layout.rank_of(node, rail));
    pos += mb - band_mb_begin(b);
    return pos * num_n_blocks() + nb;
  }

  // Network slots (note 2b): tile (mb, nb) of band b at index (mb - band_mb_begin(b)) * n blocks
  // + nb; slot_tiles covers the largest band.
  MK_KERNEL_HD uint32_t slot_mblocks() const {
    return static_cast<uint32_t>((max_band_rows() + kRsBlockM - 1) / kRsBlockM) + 1;
  }
  MK_KERNEL_HD uint32_t slot_tiles() const { return slot_mblocks() * num_n_blocks(); }
  MK_KERNEL_HD uint32_t slot_index(uint32_t band, uint32_t mb, uint32_t nb) const {
    return (mb - band_mb_begin(band)) * num_n_blocks() + nb;
  }
  MK_KERNEL_HD uint64_t slot_bytes() const { return uint64_t{slot_tiles()} * tile_bytes(); }
  // Network workspace: receive slots [nodes] then send slots [nodes].
  MK_KERNEL_HD uint64_t recv_slot_offset(uint32_t from_node) const { return uint64_t{from_node} * slot_bytes(); }
  MK_KERNEL_HD uint64_t send_slot_offset(uint32_t to_node) const { return uint64_t{layout.nodes + to_node} * slot_bytes(); }

  // Flags (note 6).
  MK_KERNEL_HD uint32_t staged_flag(uint32_t slot, uint32_t position) const {
    return layout.nvl_op_flags() + slot * stage_tiles() + position;
  }
  MK_KERNEL_HD uint32_t arrival_flag(uint32_t from_node, uint32_t index) const {
    return layout.net_op_flags() + from_node * slot_tiles() + index;
  }

  // AllReduce (note 7): result staging after the partials' staging in the NVLink buffer, one
  // slot per band; result receive slots (one per node) and the own band's send slot after the
  // reduce-scatter's slots in the network workspace.
  MK_KERNEL_HD uint64_t result_offset(uint32_t band, uint32_t index) const {
    return (uint64_t{layout.gpus - 1} * stage_tiles() + uint64_t{band} * slot_tiles() + index) * tile_bytes();
  }
  MK_KERNEL_HD uint32_t result_flag(uint32_t band, uint32_t index) const {
    return layout.nvl_op_flags() + (layout.gpus - 1) * stage_tiles() + band * slot_tiles() + index;
  }
  MK_KERNEL_HD uint64_t result_recv_offset(uint32_t from_node) const {
    return uint64_t{2 * layout.nodes + from_node} * slot_bytes();
  }
  MK_KERNEL_HD uint64_t result_send_offset() const { return uint64_t{3 * layout.nodes} * slot_bytes(); }
  MK_KERNEL_HD uint32_t result_arrival_flag(uint32_t from_node, uint32_t index) const {
    return layout.net_op_flags() + (layout.nodes + from_node) * slot_tiles() + index;
  }

  // What the communicator must provide.
  uint64_t nvl_bytes_needed() const {
    if (layout.gpus == 1) return 0;
    return uint64_t{layout.gpus - 1} * stage_tiles() * tile_bytes() +
           (all_reduce ? uint64_t{layout.world()} * slot_tiles() * tile_bytes() : 0);
  }
  uint32_t nvl_flags_needed() const {
    return layout.nvl_op_flags() + (layout.gpus - 1) * stage_tiles() + (all_reduce ? layout.world() * slot_tiles() : 0);
  }
  uint64_t net_bytes_needed() const {
    return layout.nodes > 1 ? (all_reduce ? 3ull * layout.nodes + 1 : 2ull * layout.nodes) * slot_bytes() : 0;
  }
  uint32_t net_flags_needed() const {
    return layout.nodes > 1 ? layout.net_op_flags() + (all_reduce ? 2 : 1) * layout.nodes * slot_tiles() : 0;
  }
};

// "" when the geometry is usable, else what is wrong (field, value, expectation).
std::string rs_check_geometry(const RsGeometry& g);

// What one rank's epilogue needs of each m block, computed once per plan on the host
// (rs_tables) so that the per-tile path of the kernel (gemm_rs.cuh) reads one 16-byte entry
// instead of evaluating the geometry's 64-bit divisions and loops on every tile. Every entry is
// the value of the geometry function named beside it (tests/cpu/fused/gemm_rs_plan_test.cc).
inline constexpr uint32_t kRsNone = 0xFFFFFFFFu;
struct alignas(16) RsMBlock {
  uint32_t first_band = 0;        // first_band(mb)
  uint32_t last_band = 0;         // last_band(mb)
  uint32_t own_stage = kRsNone;   // stage_position(mb, 0, local) / num_n_blocks(), or kRsNone when
                                  // rail_band_in(mb, local) == world (no band of the rank's rail)
  uint32_t own_slot = kRsNone;    // mb - band_mb_begin(rank) when band_in_tile(rank, mb), else kRsNone
};
struct RsTables {
  std::vector<RsMBlock> mblocks;   // [num_m_blocks]
  // [mb * gpus + rail]: stage_position(mb, 0, rail) / num_n_blocks(), or kRsNone when
  // rail_band_in(mb, rail) == world. Empty with one GPU per node (nothing is staged).
  std::vector<uint32_t> rail_stage;
  uint32_t stage_tiles = 0;        // stage_tiles()
  uint32_t slot_tiles = 0;         // slot_tiles()
  uint64_t band_lo = 0, band_hi = 0;  // the rank's band: band_lo(rank), band_lo(rank + 1)
};
RsTables rs_tables(const RsGeometry& g);

// The order of tiles (note 4): the GEMM's m-block rotation and raster group for this rank, given
// the engine's cluster size and the group it would choose. Every rank gets the same group.
struct RsOrder {
  bool rotated = false;
  uint32_t first_m_block = 0;
  uint32_t group = 1;
};
RsOrder rs_order(const RsGeometry& g, uint32_t cluster_m, uint32_t engine_group);

// ---- CPU replay (tests) --------------------------------------------------------------------------

enum class RsPlanFault : uint8_t {
  kNone,
  kDropPush,        // rank 0 skips its push of one tile to a node peer
  kNoPeerFreeWait,  // pushes and sends do not wait for the previous launch's readers
  kSendTwice,       // rank 0 sends one node sum twice
  kRotateAlways,    // the rotated order even where note 4 says it is not safe
};

struct RsReplayOptions {
  uint32_t launches = 3;
  uint32_t clusters = 3;     // GEMM clusters per rank (units round-robin, as the engine)
  uint32_t cluster_m = 1;
  uint32_t group = 8;        // the engine's raster group before rs_order adjusts it
  uint32_t block_n = 256;
  uint32_t n = 512;
  uint64_t seed = 1;
  bool all_reduce = false;   // GEMM+AllReduce (note 7): results spread to every rank too
  uint32_t m_rows = 0;       // M for uneven bands (RsGeometry::m_rows); then m_local is unused
  RsPlanFault fault = RsPlanFault::kNone;
};

struct RsReplayReport {
  std::string error;  // "" when every check held
  uint64_t tiles_finished = 0;
  uint64_t network_tile_sends = 0;
  uint64_t nvlink_tile_pushes = 0;
  uint32_t max_sends_per_tile_node = 0;  // of one band tile to one node in one launch
  uint64_t network_result_sends = 0;     // AllReduce: final tiles through the proxies
  uint64_t results_taken = 0;            // AllReduce: other bands' tiles written into a rank's C
};

// Replays every rank's GEMM clusters (the engine's scheduler, note 4's order) and epilogues as an
// interleaving of agents over `launches` launches, and checks: every rank's result rows hold every
// rank's partial exactly once, of the right launch; nothing is overwritten before its reader of
// the previous launch read it; each node sum crosses the network once per destination node and
// never to its own node; nobody waits on a flag nobody raises (no agent left waiting). With
// all_reduce, also: every rank's C gets every other band's tiles exactly once, final and of the
// right launch, and each final tile crosses the network once per destination node.
RsReplayReport rs_replay(const FusedLayout& layout, uint32_t m_local, const RsReplayOptions& o);

}  // namespace mkernel::kernels
