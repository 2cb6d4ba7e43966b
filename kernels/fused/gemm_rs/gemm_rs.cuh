// gemm_rs.cuh: the device code of GEMM+ReduceScatter (host side: gemm_rs.h / gemm_rs.cu; the
// plan and its design notes: gemm_rs_plan.h).
//
// One persistent kernel per rank: the GEMM engine (gemm/sm90_bf16_gemm.cuh) over the rank's
// partial P_r [M, n], with this role owning the epilogue. No block is set aside for
// communication: each finished tile moves from the consumers' registers, in fragment order,
// straight into the memory of whoever needs it (plan note 2):
//   (a) node peers whose bands have rows in the tile: the raw partial into their NVLink staging,
//       then their staged() flag;
//   (b) other nodes' bands of this rank's rail: the node sum into the network send slot, then a
//       put through the proxy into the rail peer's receive slot, raising its arrival() flag;
//   (c) the own band: node sum plus the other nodes' sums, rounded once, into C_r.
// Every block counts itself out at the end (block_exit); the last one tells the node peers (done)
// and rail peers (slot_free) that this rank's buffers may be written again.
#pragma once

#include <cstdint>

#include "common/comm.cuh"
#include "common/ptx.cuh"
#include "fused/common/launch_state.cuh"
#include "fused/gemm_rs/gemm_rs_plan.h"
#include "gemm/sm90_bf16_gemm.cuh"
#include "gemm/sm90_bf16_gemm_params.h"

namespace mkernel::kernels {

// Prepared once per plan in device memory (GemmParams::role_args). Per launch:
//   role_ptrs[0]  C_r [m_local, ldc] bf16, the rank's rows of the reduced result
struct GemmRsRoleArgs {
  DeviceComm comm;
  RsGeometry geo;
  uint32_t ldc = 0;
  uint8_t* staging = nullptr;     // this rank's NVLink staging (the start of its NVLink buffer)
  uint64_t* nvl_flags = nullptr;  // this rank's NVLink fused-op flags
  uint8_t* net = nullptr;         // this rank's network workspace (nodes > 1), else null
  // rs_tables(geo) (gemm_rs_plan.h), in the same allocation after these arguments: what the
  // per-tile path needs without dividing. rail_stage is null with one GPU per node.
  const RsMBlock* mblocks = nullptr;
  const uint32_t* rail_stage = nullptr;
  uint32_t num_n_blocks = 0;
  uint32_t stage_tiles = 0;
  uint32_t slot_tiles = 0;
  uint32_t node = 0, local = 0;      // of geo.rank
  uint64_t band_lo = 0, band_hi = 0;  // the rank's band
};

#if defined(__CUDACC__)

namespace rs_detail {

// A uniform answer for the 256 consumer threads of a GEMM block (named barrier 1, which the
// engine's consumers use only for such block-wide steps): true when any thread says true.
__device__ __forceinline__ bool consumers_any(bool pred) {
  uint32_t out;
  asm volatile(
      "{\n .reg .pred p, q;\n setp.ne.u32 p, %1, 0;\n bar.red.or.pred q, 1, 256, p;\n selp.u32 %0, 1, 0, q;\n}"
      : "=r"(out)
      : "r"(pred ? 1u : 0u)
      : "memory");
  return out != 0;
}

// The thread's fragment as bf16, 16 bytes per vector: vector i of consumer thread t at byte
// (i * 256 + t) * 16 of the tile (plan note 1).
template <int kBlockN>
__device__ __forceinline__ void store_fragment(uint8_t* tile, const float (&acc)[kBlockN / 2], uint32_t ctid) {
#pragma unroll
  for (int i = 0; i < kBlockN / 16; ++i) {
    const uint32_t w0 = ptx::pack_bf16x2(acc[8 * i], acc[8 * i + 1]);
    const uint32_t w1 = ptx::pack_bf16x2(acc[8 * i + 2], acc[8 * i + 3]);
    const uint32_t w2 = ptx::pack_bf16x2(acc[8 * i + 4], acc[8 * i + 5]);
    const uint32_t w3 = ptx::pack_bf16x2(acc[8 * i + 6], acc[8 * i + 7]);
    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(tile + (static_cast<uint64_t>(i) * 256 + ctid) * 16), "r"(w0),
                 "r"(w1), "r"(w2), "r"(w3)
                 : "memory");
  }
}

__device__ __forceinline__ void add_bf16x2(float& lo, float& hi, uint32_t w) {
  lo += __uint_as_float(w << 16);
  hi += __uint_as_float(w & 0xFFFF0000u);
}

// acc += a fragment stored by store_fragment. kVolatile: memory others write behind the GPU's
// caches (the network workspace, mapped host memory); else L2-coherent loads (NVLink staging).
template <int kBlockN, bool kVolatile>
__device__ __forceinline__ void add_fragment(float (&acc)[kBlockN / 2], const uint8_t* tile, uint32_t ctid) {
#pragma unroll
  for (int i = 0; i < kBlockN / 16; ++i) {
    uint32_t w0, w1, w2, w3;
    const uint8_t* at = tile + (static_cast<uint64_t>(i) * 256 + ctid) * 16;
    if constexpr (kVolatile) {
      asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                   : "=r"(w0), "=r"(w1), "=r"(w2), "=r"(w3)
                   : "l"(at)
                   : "memory");
    } else {
      asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];"
                   : "=r"(w0), "=r"(w1), "=r"(w2), "=r"(w3)
                   : "l"(at)
                   : "memory");
    }
    add_bf16x2(acc[8 * i], acc[8 * i + 1], w0);
    add_bf16x2(acc[8 * i + 2], acc[8 * i + 3], w1);
    add_bf16x2(acc[8 * i + 4], acc[8 * i + 5], w2);
    add_bf16x2(acc[8 * i + 6], acc[8 * i + 7], w3);
  }
}

// Plan-constant words (the role's tables): read-only for the whole launch, so through the
// non-coherent path, and loaded once into registers however many memory clobbers follow.
__device__ __forceinline__ RsMBlock load_mblock(const RsMBlock* e) {
  uint32_t x, y, z, w;
  asm("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(x), "=r"(y), "=r"(z), "=r"(w) : "l"(e));
  RsMBlock m;
  m.first_band = x;
  m.last_band = y;
  m.own_stage = z;
  m.own_slot = w;
  return m;
}
__device__ __forceinline__ uint32_t load_word(const uint32_t* p) {
  uint32_t v;
  asm("ld.global.nc.u32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}

// The rows [band_lo, band_hi) of tile (mb, nb), rounded once, into C (row-major, pitch ldc, its
// row 0 being row c_first_row of M; n columns): thread ctid holds rows row0 + 8h of the wgmma
// fragment and column pairs 8j + 2 (lane % 4).
template <int kBlockN>
__device__ __forceinline__ void store_band_rows(uint64_t band_lo, uint64_t band_hi, uint32_t n, uint16_t* c,
                                                uint32_t ldc, uint64_t c_first_row, const float (&acc)[kBlockN / 2],
                                                uint32_t mb, uint32_t nb, uint32_t ctid) {
  const uint32_t lane = ctid % 32, warp = ctid / 32;  // warp 0..7: 16 rows each
  const uint64_t row_base = uint64_t{mb} * kRsBlockM + warp * 16 + lane / 4;
  const uint32_t col_base = nb * kBlockN + 2 * (lane % 4);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint64_t row = row_base + 8 * h;
    if (row < band_lo || row >= band_hi) continue;
    uint16_t* out = c + (row - c_first_row) * ldc;
#pragma unroll
    for (int j = 0; j < kBlockN / 8; ++j) {
      const uint32_t col = col_base + 8 * j;
      if (col < n) ptx::st_global_b32(out + col, ptx::pack_bf16x2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]));
    }
  }
}

}  // namespace rs_detail

struct GemmRsRole {
  static constexpr bool kHasBlockExit = true;
  static constexpr bool kHasEpilogue = true;
  static constexpr bool kProgrammaticLaunch = true;  // may overlap begin_launch (GemmRsConfig)

  // Per consumer thread, across the block's tiles. Only the leader (consumer thread 0), which
  // does every wait and raises every flag, reads the launch numbers.
  struct EpilogueState {
    uint64_t launch = 0, prev = 0;
    bool started = false;
    bool failed = false;
    uint64_t peers_free = 0;  // node peers (by local index, below 64) known free this launch
    uint64_t nodes_free = 0;  // rail peers (by node, below 64) known free this launch
  };

  __device__ static void run(const GemmParams&, uint32_t, uint32_t) {}  // no communication blocks

  // The launch numbers, once per block, by the leader (both come from earlier kernels in stream
  // order: begin_launch and the previous fused launch).
  __device__ static void start(const DeviceComm& c, EpilogueState& st) {
    if (st.started) return;
    st.started = true;
    st.launch = launch_number(c);
    st.prev = previous_fused_launch(c);
  }

  // Flags and offsets of the NVLink staging and result slots (gemm_rs_plan.h note 6), from the
  // plan's constants instead of the geometry's loops.
  __device__ static uint32_t staged_flag(const GemmRsRoleArgs& a, uint32_t slot, uint32_t pos) {
    return a.geo.layout.nvl_op_flags() + slot * a.stage_tiles + pos;
  }
  __device__ static uint32_t result_tile(const GemmRsRoleArgs& a, uint32_t band, uint32_t idx) {
    return (a.geo.layout.gpus - 1) * a.stage_tiles + band * a.slot_tiles + idx;
  }

  // Waits (leader, bounded) until node peer `peer` (local index pl) finished its previous fused
  // launch, once per launch; false (uniformly) when the wait failed.
  __device__ static bool peer_free(const GemmRsRoleArgs& a, EpilogueState& st, uint32_t peer, uint32_t pl,
                                   bool leader) {
    if (pl < 64 && ((st.peers_free >> pl) & 1) != 0) return true;
    bool bad = false;
    if (leader) {
      start(a.comm, st);
      const uint32_t f = a.geo.layout.done_flag(peer);
      bad = !wait_geq(a.nvl_flags + f, st.prev, wait_context(a.comm), f, where_tag(kStepPeerFree, peer));
    }
    if (rs_detail::consumers_any(bad)) return st.failed = true, false;
    if (pl < 64) st.peers_free |= uint64_t{1} << pl;
    return true;
  }

  // The same for the rail peer on node `to_node` (its slot_free signal of the previous launch).
  __device__ static bool node_free(const GemmRsRoleArgs& a, EpilogueState& st, uint32_t to_node, bool leader) {
    const DeviceComm& c = a.comm;
    const FusedLayout& L = a.geo.layout;
    if (to_node < 64 && ((st.nodes_free >> to_node) & 1) != 0) return true;
    bool bad = false;
    if (leader) {
      start(c, st);
      const uint32_t f = fused_flag_index(c, L.slot_free_flag(to_node));
      bad = !wait_geq(c.flags + f, st.prev, wait_context(c), f,
                      where_tag(kStepPeerFree, L.rail_peer(a.geo.rank, to_node)));
    }
    if (rs_detail::consumers_any(bad)) return st.failed = true, false;
    if (to_node < 64) st.nodes_free |= uint64_t{1} << to_node;
    return true;
  }

  // A final tile (bf16, fragment order) to every node peer's result staging of band `band`,
  // raising result(band, idx) there (AllReduce, plan note 7).
  template <int kBN>
  __device__ static bool push_result(const GemmRsRoleArgs& a, EpilogueState& st, const float (&acc)[kBN / 2],
                                     uint32_t band, uint32_t idx, uint32_t ctid) {
    constexpr uint64_t kTileBytes = uint64_t{kRsBlockM} * kBN * 2;
    const DeviceComm& c = a.comm;
    for (uint32_t i = 1; i < a.geo.layout.gpus; ++i) {
      const uint32_t peer = a.geo.layout.node_peer(a.geo.rank, i), pl = a.geo.layout.local_of(peer);
      if (!peer_free(a, st, peer, pl, ctid == 0)) return false;
      rs_detail::store_fragment<kBN>(nvl_ptr(c, peer) + uint64_t{result_tile(a, band, idx)} * kTileBytes, acc, ctid);
      ptx::named_barrier_sync(1, 256);
      if (ctid == 0)
        raise_flag(nvl_fused_flag(c, peer, a.geo.layout.nvl_op_flags() + result_tile(a, band, idx)), st.launch);
    }
    return true;
  }

  // AllReduce (plan note 7): after the block's own tiles, its share of the other bands' tiles:
  // first those this rank forwards (from the network into C and on to the node peers), then the
  // rest (from the result staging into C).
  // Not inlined: once per block, after the block's tiles, and only for AllReduce; inlined, it
  // made ptxas spill more in the consumers' code (ptxas -v: a 200-byte stack frame in the 256-wide
  // instantiations, 24 and 32 bytes out of line). The state comes by value; false when it failed.
  template <class T>
  __device__ static void epilogue_end(const GemmParams& p, EpilogueState& st, uint32_t ctid) {
    if (!static_cast<const GemmRsRoleArgs*>(p.role_args)->geo.all_reduce || st.failed) return;
    st.failed = !all_reduce_rest<T>(p, st, ctid);
  }
  template <class T>
  __device__ __noinline__ static bool all_reduce_rest(const GemmParams& p, EpilogueState st, uint32_t ctid) {
    constexpr int kBN = T::kBlockN;
    const auto& a = *static_cast<const GemmRsRoleArgs*>(p.role_args);
    const DeviceComm& c = a.comm;
    const RsGeometry& g = a.geo;
    const bool leader = ctid == 0;
    if (leader) start(c, st);
    const FusedLayout& L = g.layout;
    const uint32_t r = g.rank, node = a.node, local = a.local;
    auto* out = static_cast<uint16_t*>(const_cast<void*>(p.role_ptrs[0]));
    const uint64_t tile_bytes = g.tile_bytes();
    uint32_t item = 0;
    float acc[kBN / 2];
    for (uint32_t phase = 0; phase < 2; ++phase) {
      for (uint32_t b = 0; b < L.world(); ++b) {
        if (b == r) continue;
        const bool forward = L.node_of(b) != node && L.local_of(b) == local;
        if (forward != (phase == 0)) continue;
        for (uint32_t mb = g.band_mb_begin(b); mb < g.band_mb_end(b); ++mb) {
          for (uint32_t nb = 0; nb < a.num_n_blocks; ++nb) {
            if (item++ % p.num_gemm_blocks != blockIdx.x) continue;
            const uint32_t idx = g.slot_index(b, mb, nb);
            const uint32_t tile = mb * a.num_n_blocks + nb;
            bool bad = false;
            if (leader) {
              const WaitContext w = wait_context(c);
              if (forward) {
                const uint32_t f = fused_flag_index(c, g.result_arrival_flag(L.node_of(b), idx));
                bad = !wait_geq(c.flags + f, st.launch, w, f,
                                where_tag(kStepNodeSum, (uint64_t{L.node_of(b)} << 32) | tile));
              } else {
                const uint32_t f = L.nvl_op_flags() + result_tile(a, b, idx);
                bad = !wait_geq(a.nvl_flags + f, st.launch, w, f, where_tag(kStepPartialTile, (uint64_t{b} << 32) | tile));
              }
            }
            if (rs_detail::consumers_any(bad)) return false;
#pragma unroll
            for (int i = 0; i < kBN / 2; ++i) acc[i] = 0.0f;
            if (forward) {
              rs_detail::add_fragment<kBN, true>(acc, a.net + g.result_recv_offset(L.node_of(b)) + uint64_t{idx} * tile_bytes,
                                                 ctid);
            } else {
              rs_detail::add_fragment<kBN, false>(acc, a.staging + uint64_t{result_tile(a, b, idx)} * tile_bytes, ctid);
            }
            rs_detail::store_band_rows<kBN>(g.band_lo(b), g.band_lo(b + 1), g.n, out, a.ldc, 0, acc, mb, nb, ctid);
            if (forward && !push_result<kBN>(a, st, acc, b, idx, ctid)) return false;
          }
        }
      }
    }
    return true;
  }

  // A finished tile (gemm_rs_plan.h note 2). The per-tile path reads the plan's m-block entry
  // and constants (rs_tables) and nothing else of the arguments unless the tile moves between
  // ranks: at one rank it is the engine's own store plus one 16-byte load (docs/kernels.md
  // section 11 measured what the geometry's divisions and per-thread acquire loads cost here).
  template <class T>
  __device__ static void epilogue(const GemmParams& p, EpilogueState& st, float (&acc)[T::kBlockN / 2], uint32_t mb,
                                  uint32_t nb, uint32_t ctid, const CUtensorMap* tma_c, uint8_t* smem_epi) {
    constexpr int kBN = T::kBlockN;
    constexpr uint64_t kTileBytes = uint64_t{kRsBlockM} * kBN * 2;
    if (st.failed) return;
    const auto& a = *static_cast<const GemmRsRoleArgs*>(p.role_args);
    const bool leader = ctid == 0;
    const RsMBlock info = rs_detail::load_mblock(a.mblocks + mb);
    const uint32_t nnb = a.num_n_blocks, gpus = a.geo.layout.gpus, nodes = a.geo.layout.nodes;
    const uint32_t r = a.geo.rank, node = a.node, local = a.local;
    const uint32_t tile = mb * nnb + nb;

    // (a) The raw partial to every node peer with rows of its rail in the tile.
    if (gpus > 1) {
      const DeviceComm& c = a.comm;
      const uint32_t stage_tiles = a.stage_tiles;
      for (uint32_t i = 1; i < gpus; ++i) {
        const uint32_t pl = local >= i ? local - i : local + gpus - i;  // FusedLayout::node_peer
        const uint32_t at = rs_detail::load_word(a.rail_stage + uint64_t{mb} * gpus + pl);
        if (at == kRsNone) continue;
        const uint32_t peer = node * gpus + pl;
        if (!peer_free(a, st, peer, pl, leader)) return;
        const uint32_t slot = i - 1;  // RsGeometry::stage_slot(pl, local)
        const uint32_t pos = at * nnb + nb;
        uint8_t* dst = nvl_ptr(c, peer) + (uint64_t{slot} * stage_tiles + pos) * kTileBytes;
        rs_detail::store_fragment<kBN>(dst, acc, ctid);
        ptx::named_barrier_sync(1, 256);
        if (leader) raise_flag(nvl_fused_flag(c, peer, staged_flag(a, slot, pos)), st.launch);
      }
    }
    if (info.own_stage == kRsNone) return;  // no band of this rank's rail in the tile

    // The node sum: own partial, then the node peers' in increasing local index (plan note 3).
    if (gpus > 1) {
      const DeviceComm& c = a.comm;
      const uint32_t pos = info.own_stage * nnb + nb;
      bool bad = false;
      if (leader) {
        start(c, st);
        const WaitContext w = wait_context(c);
        for (uint32_t s = 0; s < gpus && !bad; ++s) {
          if (s == local) continue;
          const uint32_t slot = s > local ? s - local - 1 : s + gpus - local - 1;  // stage_slot(local, s)
          const uint32_t f = staged_flag(a, slot, pos);
          bad = !wait_geq(a.nvl_flags + f, st.launch, w, f,
                          where_tag(kStepPartialTile, (uint64_t{node * gpus + s} << 32) | tile));
        }
      }
      if (rs_detail::consumers_any(bad)) {
        st.failed = true;
        return;
      }
      for (uint32_t s = 0; s < gpus; ++s) {
        if (s == local) continue;
        const uint32_t slot = s > local ? s - local - 1 : s + gpus - local - 1;
        rs_detail::add_fragment<kBN, false>(acc, a.staging + (uint64_t{slot} * a.stage_tiles + pos) * kTileBytes, ctid);
      }
    }

    // (b) The node sum to the rail peer of every other node with a band in the tile.
    if (nodes > 1) {
      const DeviceComm& c = a.comm;
      const RsGeometry& g = a.geo;
      const FusedLayout& L = g.layout;
      for (uint32_t b = info.first_band; b <= info.last_band; ++b) {
        if (L.local_of(b) != local || L.node_of(b) == node || g.band_rows(b) == 0) continue;
        const uint32_t to_node = L.node_of(b);
        if (!node_free(a, st, to_node, leader)) return;
        const uint32_t idx = g.slot_index(b, mb, nb);
        const uint64_t src_off = g.send_slot_offset(to_node) + uint64_t{idx} * kTileBytes;
        rs_detail::store_fragment<kBN>(a.net + src_off, acc, ctid);
        ptx::named_barrier_sync(1, 256);
        bool bad = false;
        if (leader) {
          sync::fence_acq_rel_sys();
          bad = !put_signal(c, b, c.network_workspace, src_off, c.network_workspace,
                            g.recv_slot_offset(node) + uint64_t{idx} * kTileBytes, kTileBytes,
                            fused_flag_index(c, g.arrival_flag(node, idx)), where_tag(kStepNetworkSend, b));
        }
        if (rs_detail::consumers_any(bad)) {
          st.failed = true;
          return;
        }
      }
    }

    // (c) The own band: plus the other nodes' sums in increasing node index, rounded once.
    if (info.own_slot == kRsNone) return;
    const uint32_t idx = info.own_slot * nnb + nb;  // RsGeometry::slot_index(r, mb, nb)
    if (nodes > 1) {
      const DeviceComm& c = a.comm;
      const RsGeometry& g = a.geo;
      bool bad = false;
      if (leader) {
        start(c, st);
        const WaitContext w = wait_context(c);
        for (uint32_t from = 0; from < nodes && !bad; ++from) {
          if (from == node) continue;
          const uint32_t f = fused_flag_index(c, g.arrival_flag(from, idx));
          bad = !wait_geq(c.flags + f, st.launch, w, f, where_tag(kStepNodeSum, (uint64_t{from} << 32) | tile));
        }
      }
      if (rs_detail::consumers_any(bad)) {
        st.failed = true;
        return;
      }
      for (uint32_t from = 0; from < nodes; ++from) {
        if (from == node) continue;
        rs_detail::add_fragment<kBN, true>(acc, a.net + g.recv_slot_offset(from) + uint64_t{idx} * kTileBytes, ctid);
      }
    }
    const bool all_reduce = a.geo.all_reduce;
    const uint64_t band_lo = a.band_lo, band_hi = a.band_hi;
    const uint64_t c_first_row = all_reduce ? 0 : band_lo;
    const uint64_t row0 = uint64_t{mb} * kRsBlockM;
    if (row0 >= band_lo && row0 + kRsBlockM <= band_hi) {
      // A tile inside the band: through shared memory and TMA stores that drain while the next
      // tile runs, as the engine's own epilogue (the map is over C, gemm_rebind).
      const uint32_t cw = ctid / 128, lane = ctid % 32, warp_in_wg = (ctid / 32) % 4;
      detail::store_tile_tma<T>(tma_c, acc, smem_epi + cw * 2 * T::kEpiChunkBytes,
                                static_cast<int32_t>(row0 - c_first_row + cw * 64), static_cast<int32_t>(nb * kBN),
                                warp_in_wg, lane, ctid % 128 == 0, 3 + cw);
    } else {
      rs_detail::store_band_rows<kBN>(band_lo, band_hi, a.geo.n, static_cast<uint16_t*>(const_cast<void*>(p.role_ptrs[0])),
                                      a.ldc, c_first_row, acc, mb, nb, ctid);
    }
    if (!all_reduce) return;
    // AllReduce: the final tile to the node peers and, through the proxy, to the rail peers.
    if (!push_result<kBN>(a, st, acc, r, idx, ctid)) return;
    if (nodes == 1) return;
    const DeviceComm& c = a.comm;
    const RsGeometry& g = a.geo;
    const FusedLayout& L = g.layout;
    for (uint32_t to = 0; to < nodes; ++to)
      if (to != node && !node_free(a, st, to, leader)) return;
    const uint64_t src_off = g.result_send_offset() + uint64_t{idx} * kTileBytes;
    rs_detail::store_fragment<kBN>(a.net + src_off, acc, ctid);
    ptx::named_barrier_sync(1, 256);
    bool bad = false;
    if (leader) {
      sync::fence_acq_rel_sys();
      for (uint32_t i = 1; i < nodes && !bad; ++i) {
        const uint32_t to = L.rail_peer(r, L.send_node(node, i));
        bad = !put_signal(c, to, c.network_workspace, src_off, c.network_workspace,
                          g.result_recv_offset(node) + uint64_t{idx} * kTileBytes, kTileBytes,
                          fused_flag_index(c, g.result_arrival_flag(node, idx)), where_tag(kStepNetworkSend, to));
      }
    }
    if (rs_detail::consumers_any(bad)) st.failed = true;
  }

  // Thread 0 of every block after its work; the last block ends the launch (launch_state.cuh).
  __device__ static void block_exit(const GemmParams& p) {
    const auto& a = *static_cast<const GemmRsRoleArgs*>(p.role_args);
    if (count_block_exit(a.comm)) end_fused_launch(a.comm, a.geo.layout, a.geo.rank);
  }
};

#endif  // __CUDACC__

}  // namespace mkernel::kernels
