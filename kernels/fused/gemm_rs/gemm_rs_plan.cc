// gemm_rs_plan.cc: the GEMM+ReduceScatter plan's order of tiles and its CPU replay
// (gemm_rs_plan.h).
#include "fused/gemm_rs/gemm_rs_plan.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include "common/tile_scheduler.cuh"

namespace mkernel::kernels {

std::string rs_check_geometry(const RsGeometry& g) {
  if (g.layout.nodes == 0 || g.layout.gpus == 0)
    return "layout: " + std::to_string(g.layout.nodes) + " nodes x " + std::to_string(g.layout.gpus) +
           " GPUs; expected at least 1 x 1";
  if (g.rank >= g.layout.world())
    return "rank: " + std::to_string(g.rank) + "; expected below the world size " + std::to_string(g.layout.world());
  if (g.m_rows == 0 && g.m_local == 0) return "m_local: 0; expected at least 1 row per rank";
  if (g.n == 0 || g.n % 8 != 0) return "n: " + std::to_string(g.n) + "; expected a positive multiple of 8";
  if (g.block_n != 128 && g.block_n != 256) return "block_n: " + std::to_string(g.block_n) + "; expected 128 or 256";
  if (g.m_total() > (uint64_t{1} << 31) - 1)
    return "M = world x m_local = " + std::to_string(g.m_total()) + "; expected at most 2^31 - 1";
  return "";
}

RsTables rs_tables(const RsGeometry& g) {
  RsTables t;
  const FusedLayout& L = g.layout;
  const uint32_t world = L.world(), local = L.local_of(g.rank), mbs = g.num_m_blocks(), nnb = g.num_n_blocks();
  t.stage_tiles = L.gpus > 1 ? g.stage_tiles() : 0;
  t.slot_tiles = g.slot_tiles();
  t.band_lo = g.band_lo(g.rank);
  t.band_hi = g.band_lo(g.rank + 1);
  t.mblocks.resize(mbs);
  if (L.gpus > 1) t.rail_stage.assign(uint64_t{mbs} * L.gpus, kRsNone);
  for (uint32_t mb = 0; mb < mbs; ++mb) {
    RsMBlock& e = t.mblocks[mb];
    e.first_band = g.first_band(mb);
    e.last_band = g.last_band(mb);
    if (g.rail_band_in(mb, local) < world) e.own_stage = g.stage_position(mb, 0, local) / nnb;
    if (g.band_in_tile(g.rank, mb)) e.own_slot = mb - g.band_mb_begin(g.rank);
    for (uint32_t rail = 0; rail < L.gpus && L.gpus > 1; ++rail)
      if (g.rail_band_in(mb, rail) < world) t.rail_stage[uint64_t{mb} * L.gpus + rail] = g.stage_position(mb, 0, rail) / nnb;
  }
  return t;
}

RsOrder rs_order(const RsGeometry& g, uint32_t cluster_m, uint32_t engine_group) {
  RsOrder o;
  o.group = std::max<uint32_t>(1, engine_group);
  const uint32_t world = g.layout.world();
  const uint32_t tile_rows = kRsBlockM * std::max<uint32_t>(1, cluster_m);
  if (world == 1 || g.layout.nodes != 1 || !g.even_bands() || g.band_rows(0) % tile_rows != 0)
    return o;  // identical order
  // The own band's m groups start at position (world - 1) * band_groups of the rotated order;
  // the raster's groups must not straddle that boundary (note 4).
  const uint32_t band_groups = static_cast<uint32_t>(g.band_rows(0) / tile_rows);
  const uint64_t boundary = uint64_t{world - 1} * band_groups;
  uint32_t group = std::min(o.group, band_groups);
  while (group > 1 && boundary % group != 0) --group;
  o.rotated = true;
  o.group = group;
  o.first_m_block = static_cast<uint32_t>((g.band_lo((g.rank + 1) % world) / kRsBlockM) % g.num_m_blocks());
  return o;
}

// ---- replay ------------------------------------------------------------------------------------

namespace {

// What a slot holds: which ranks' partials, of which launch, and whether its reader took it.
struct Content {
  uint64_t launch = 0;
  std::set<uint32_t> ranks;
  bool consumed = true;
};

struct RankState {
  std::vector<uint64_t> nvl_flags;
  std::vector<uint64_t> net_flags;
  std::map<std::pair<uint32_t, uint32_t>, Content> staged;  // (slot, position)
  std::map<std::pair<uint32_t, uint32_t>, Content> recv;    // (from node, index)
  uint64_t launch = 0;                                     // the launch it is in (1-based)
  uint32_t clusters_done = 0;
  std::map<std::pair<uint32_t, uint32_t>, uint32_t> finished;  // own tiles finished, this launch
  // AllReduce: final tiles of other bands in the result staging (band, index) and the result
  // receive slots (from node, index); tiles of other bands taken into C this launch.
  std::map<std::pair<uint32_t, uint32_t>, Content> result;
  std::map<std::pair<uint32_t, uint32_t>, Content> result_recv;
  std::map<std::tuple<uint32_t, uint32_t, uint32_t>, uint32_t> taken;
  bool all_done = false;
};

enum OpKind {
  kWaitFree, kPush, kWaitStaged, kSumStaged, kWaitSlotFree, kSend, kWaitArrival, kFinish,
  // AllReduce (note 7)
  kPushResult, kSendResult, kWaitResultArrival, kWaitResult, kTake,
};

struct Op {
  OpKind kind;
  uint32_t a = 0, b = 0;  // peer local / node; band
};

struct Cluster {
  uint32_t rank = 0;
  std::vector<std::pair<uint32_t, uint32_t>> tiles;  // (mb, nb) in processing order, per unit all CTAs
  std::vector<uint32_t> unit_of;                     // tile i belongs to unit unit_of[i]
  std::vector<uint32_t> band;                        // ~0u: a GEMM tile; else an AllReduce item of that band
  size_t next_tile = 0;
  std::vector<Op> ops;
  size_t next_op = 0;
  std::set<uint32_t> node_sum;  // of the tile in progress
  bool done = false;
};

}  // namespace

RsReplayReport rs_replay(const FusedLayout& L, uint32_t m_local, const RsReplayOptions& o) {
  RsReplayReport rep;
  const uint32_t world = L.world();
  RsGeometry g0{L, 0, m_local, o.n, o.block_n, o.all_reduce, o.m_rows};
  if (std::string e = rs_check_geometry(g0); !e.empty()) {
    rep.error = e;
    return rep;
  }
  const uint32_t mbs = g0.num_m_blocks(), nbs = g0.num_n_blocks();
  std::vector<RankState> st(world);
  for (auto& s : st) {
    s.nvl_flags.assign(g0.nvl_flags_needed(), 0);
    s.net_flags.assign(std::max<uint32_t>(1, g0.net_flags_needed()), 0);
  }
  std::mt19937_64 rng(o.seed);
  // Ranks run at speeds far apart (weights over three orders of magnitude), so interleavings
  // where one rank runs a launch ahead of another come up.
  std::vector<double> speed(world);
  for (auto& w : speed) w = std::pow(1000.0, std::uniform_real_distribution<double>(0, 1)(rng));

  // Every rank's clusters, with the engine's scheduler and this rank's order.
  auto make_clusters = [&](uint32_t r) {
    RsGeometry g = g0;
    g.rank = r;
    RsOrder ord = rs_order(g, o.cluster_m, o.group);
    if (o.fault == RsPlanFault::kRotateAlways && !ord.rotated && world > 1) {
      ord.rotated = true;
      ord.first_m_block = static_cast<uint32_t>((g0.band_lo((r + 1) % world) / kRsBlockM) % mbs);
    }
    const uint32_t cm = std::max<uint32_t>(1, o.cluster_m);
    const uint32_t groups = (mbs + cm - 1) / cm;
    std::vector<Cluster> cl(o.clusters);
    // The engine's own tile order (common/tile_scheduler.cuh, kRasterAlongN as the fused ops
    // plan it; whole tiles, cluster c taking tiles c, c + clusters, ...).
    const uint32_t offset = (ord.first_m_block / cm) % groups;
    auto get = [&](uint32_t unit, uint32_t cta) {
      TileCoord t;
      if (cm == 2) {
        t = TileScheduler<2>{mbs, nbs, 1, kRasterAlongN, ord.group, offset}.tile_coord(unit, cta);
      } else {
        t = TileScheduler<1>{mbs, nbs, 1, kRasterAlongN, ord.group, offset}.tile_coord(unit, cta);
      }
      return std::make_pair(t.m_block, t.n_block);
    };
    const uint32_t units = groups * nbs;
    for (uint32_t c = 0; c < o.clusters; ++c) {
      cl[c].rank = r;
      for (uint32_t u = c; u < units; u += o.clusters)
        for (uint32_t cta = 0; cta < cm; ++cta) {
          auto t = get(u, cta);
          if (t.first < mbs) {
            cl[c].tiles.push_back(t);
            cl[c].unit_of.push_back(u);
            cl[c].band.push_back(~0u);
          }
        }
    }
    // AllReduce: after its tiles, each block takes every clusters-th item of the other bands,
    // forwards first (note 7).
    if (o.all_reduce) {
      uint32_t item = 0;
      const uint32_t n = L.node_of(r), local = L.local_of(r);
      for (uint32_t phase = 0; phase < 2; ++phase)
        for (uint32_t b = 0; b < world; ++b) {
          if (b == r) continue;
          const bool forward = L.node_of(b) != n && L.local_of(b) == local;
          if (forward != (phase == 0)) continue;
          for (uint32_t mb = g0.band_mb_begin(b); mb < g0.band_mb_end(b); ++mb)
            for (uint32_t nb = 0; nb < nbs; ++nb) {
              Cluster& c = cl[item++ % o.clusters];
              c.tiles.emplace_back(mb, nb);
              c.unit_of.push_back(~0u);
              c.band.push_back(b);
            }
        }
    }
    return cl;
  };

  // The epilogue of tile (mb, nb) on rank r (note 2), as a list of operations.
  auto epilogue_ops = [&](uint32_t r, uint32_t mb, uint32_t item_band) {
    std::vector<Op> ops;
    const uint32_t n = L.node_of(r), g = L.local_of(r);
    if (item_band != ~0u) {  // AllReduce item: take a final tile of another band into C
      const bool forward = L.node_of(item_band) != n && L.local_of(item_band) == g;
      ops.push_back({forward ? kWaitResultArrival : kWaitResult, L.node_of(item_band), item_band});
      ops.push_back({kTake, forward ? 1u : 0u, item_band});
      if (forward)
        for (uint32_t i = 1; i < L.gpus; ++i) {
          const uint32_t pl = L.local_of(L.node_peer(r, i));
          if (o.fault != RsPlanFault::kNoPeerFreeWait) ops.push_back({kWaitFree, pl});
          ops.push_back({kPushResult, pl, item_band});
        }
      return ops;
    }
    for (uint32_t i = 1; i < L.gpus; ++i) {
      const uint32_t o_rank = L.node_peer(r, i), ol = L.local_of(o_rank);
      if (g0.rail_band_in(mb, ol) >= world) continue;
      if (o.fault != RsPlanFault::kNoPeerFreeWait) ops.push_back({kWaitFree, ol});
      ops.push_back({kPush, ol});
    }
    if (g0.rail_band_in(mb, g) >= world) return ops;
    for (uint32_t i = 1; i < L.gpus; ++i) ops.push_back({kWaitStaged, L.local_of(L.node_peer(r, i))});
    ops.push_back({kSumStaged});
    for (uint32_t b = g0.first_band(mb); b <= g0.last_band(mb); ++b) {
      if (L.local_of(b) != g || L.node_of(b) == n || g0.band_rows(b) == 0) continue;
      if (o.fault != RsPlanFault::kNoPeerFreeWait) ops.push_back({kWaitSlotFree, L.node_of(b), b});
      ops.push_back({kSend, L.node_of(b), b});
    }
    if (g0.band_in_tile(r, mb)) {
      for (uint32_t i = 1; i < L.nodes; ++i) ops.push_back({kWaitArrival, L.recv_node(n, i)});
      ops.push_back({kFinish});
      if (o.all_reduce) {
        for (uint32_t i = 1; i < L.gpus; ++i) {
          const uint32_t pl = L.local_of(L.node_peer(r, i));
          if (o.fault != RsPlanFault::kNoPeerFreeWait) ops.push_back({kWaitFree, pl});
          ops.push_back({kPushResult, pl, r});
        }
        for (uint32_t i = 1; i < L.nodes; ++i)
          if (o.fault != RsPlanFault::kNoPeerFreeWait) ops.push_back({kWaitSlotFree, L.send_node(n, i)});
        for (uint32_t i = 1; i < L.nodes; ++i) ops.push_back({kSendResult, L.send_node(n, i), r});
      }
    }
    return ops;
  };

  std::vector<std::vector<Cluster>> clusters(world);
  std::map<std::tuple<uint64_t, uint32_t, uint32_t, uint32_t, uint32_t, uint32_t>, uint32_t> sends;  // (launch, band, mb, nb, from, to node)
  bool dropped = false, doubled = false;

  auto start_launch = [&](uint32_t r) {
    RankState& s = st[r];
    ++s.launch;
    s.clusters_done = 0;
    s.finished.clear();
    s.taken.clear();
    clusters[r] = make_clusters(r);
    for (auto& c : clusters[r]) {
      if (c.tiles.empty()) {
        c.done = true;
        ++s.clusters_done;
      } else {
        c.ops = epilogue_ops(r, c.tiles[0].first, c.band[0]);
      }
    }
  };
  for (uint32_t r = 0; r < world; ++r) start_launch(r);

  auto fail = [&](const std::string& e) {
    if (rep.error.empty()) rep.error = e;
  };
  auto tile_name = [](uint32_t r, uint32_t mb, uint32_t nb, uint64_t l) {
    return "rank " + std::to_string(r) + " tile (" + std::to_string(mb) + ", " + std::to_string(nb) + ") launch " +
           std::to_string(l);
  };

  // Can cluster c of rank r run its next operation? Runs it when `run`.
  auto step = [&](uint32_t r, Cluster& c, bool run) -> bool {
    RankState& me = st[r];
    const uint64_t l = me.launch, prev = l - 1;
    const uint32_t n = L.node_of(r), g = L.local_of(r);
    const auto [mb, nb] = c.tiles[c.next_tile];
    const Op& op = c.ops[c.next_op];
    switch (op.kind) {
      case kWaitFree: {
        const uint32_t peer = L.rank_of(n, op.a);
        if (me.nvl_flags[L.done_flag(peer)] < prev) return false;
        break;
      }
      case kPush: {
        if (!run) return true;
        const uint32_t peer = L.rank_of(n, op.a);
        if (o.fault == RsPlanFault::kDropPush && r == 0 && !dropped) {
          dropped = true;
          break;
        }
        const uint32_t slot = g0.stage_slot(op.a, g), pos = g0.stage_position(mb, nb, op.a);
        Content& dst = st[peer].staged[{slot, pos}];
        if (!dst.consumed && dst.launch < l)
          fail(tile_name(r, mb, nb, l) + ": overwrote rank " + std::to_string(peer) +
               "'s staged partial of launch " + std::to_string(dst.launch) + " before it was read");
        dst = Content{l, {r}, false};
        st[peer].nvl_flags[g0.staged_flag(slot, pos)] = l;
        ++rep.nvlink_tile_pushes;
        break;
      }
      case kWaitStaged: {
        const uint32_t slot = g0.stage_slot(g, op.a), pos = g0.stage_position(mb, nb, g);
        if (me.nvl_flags[g0.staged_flag(slot, pos)] < l) return false;
        break;
      }
      case kSumStaged: {
        if (!run) return true;
        c.node_sum = {r};
        for (uint32_t i = 1; i < L.gpus; ++i) {
          const uint32_t s = L.local_of(L.node_peer(r, i));
          Content& src = me.staged[{g0.stage_slot(g, s), g0.stage_position(mb, nb, g)}];
          if (src.launch != l)
            fail(tile_name(r, mb, nb, l) + ": staged partial from local " + std::to_string(s) + " is of launch " +
                 std::to_string(src.launch));
          for (uint32_t q : src.ranks)
            if (!c.node_sum.insert(q).second) fail(tile_name(r, mb, nb, l) + ": rank " + std::to_string(q) + " twice");
          src.consumed = true;
        }
        break;
      }
      case kWaitSlotFree:
        if (me.net_flags[L.slot_free_flag(op.a)] < prev) return false;
        break;
      case kSend: {
        if (!run) return true;
        const uint32_t peer = op.b;  // the band's owner, rail peer on node op.a
        const uint32_t idx = g0.slot_index(op.b, mb, nb);
        const int times = (o.fault == RsPlanFault::kSendTwice && r == 0 && !doubled) ? 2 : 1;
        doubled = doubled || times == 2;
        for (int t = 0; t < times; ++t) {
          uint32_t& count = sends[{l, op.b, mb, nb, n, op.a}];
          ++count;
          rep.max_sends_per_tile_node = std::max(rep.max_sends_per_tile_node, count);
          if (count > 1)
            fail(tile_name(r, mb, nb, l) + ": band " + std::to_string(op.b) + " sent to node " + std::to_string(op.a) +
                 " " + std::to_string(count) + " times");
          if (op.a == n) fail(tile_name(r, mb, nb, l) + ": sent to its own node");
          Content& dst = st[peer].recv[{n, idx}];
          if (!dst.consumed && dst.launch < l)
            fail(tile_name(r, mb, nb, l) + ": overwrote rank " + std::to_string(peer) + "'s received node sum of launch " +
                 std::to_string(dst.launch) + " before it was read");
          dst = Content{l, c.node_sum, false};
          st[peer].net_flags[g0.arrival_flag(n, idx)] = l;
          ++rep.network_tile_sends;
        }
        break;
      }
      case kWaitArrival:
        if (me.net_flags[g0.arrival_flag(op.a, g0.slot_index(r, mb, nb))] < l) return false;
        break;
      case kFinish: {
        if (!run) return true;
        std::set<uint32_t> all = c.node_sum;
        for (uint32_t i = 1; i < L.nodes; ++i) {
          const uint32_t from = L.recv_node(n, i);
          Content& src = me.recv[{from, g0.slot_index(r, mb, nb)}];
          if (src.launch != l)
            fail(tile_name(r, mb, nb, l) + ": node sum from node " + std::to_string(from) + " is of launch " +
                 std::to_string(src.launch));
          for (uint32_t q : src.ranks)
            if (!all.insert(q).second) fail(tile_name(r, mb, nb, l) + ": rank " + std::to_string(q) + " twice");
          src.consumed = true;
        }
        if (all.size() != world)
          fail(tile_name(r, mb, nb, l) + ": holds " + std::to_string(all.size()) + " of " + std::to_string(world) +
               " partials");
        ++me.finished[{mb, nb}];
        ++rep.tiles_finished;
        break;
      }
      case kPushResult: {
        if (!run) return true;
        const uint32_t peer = L.rank_of(n, op.a), idx = g0.slot_index(op.b, mb, nb);
        Content& dst = st[peer].result[{op.b, idx}];
        if (!dst.consumed && dst.launch < l)
          fail(tile_name(r, mb, nb, l) + ": overwrote rank " + std::to_string(peer) + "'s result of band " +
               std::to_string(op.b) + " of launch " + std::to_string(dst.launch) + " before it was read");
        dst = Content{l, {op.b}, false};
        st[peer].nvl_flags[g0.result_flag(op.b, idx)] = l;
        ++rep.nvlink_tile_pushes;
        break;
      }
      case kSendResult: {
        if (!run) return true;
        const uint32_t peer = L.rail_peer(r, op.a), idx = g0.slot_index(op.b, mb, nb);
        uint32_t& count = sends[{l, op.b + world, mb, nb, n, op.a}];  // bands + world: results
        rep.max_sends_per_tile_node = std::max(rep.max_sends_per_tile_node, ++count);
        if (count > 1) fail(tile_name(r, mb, nb, l) + ": final tile sent to node " + std::to_string(op.a) + " twice");
        Content& dst = st[peer].result_recv[{n, idx}];
        if (!dst.consumed && dst.launch < l)
          fail(tile_name(r, mb, nb, l) + ": overwrote rank " + std::to_string(peer) + "'s received result of launch " +
               std::to_string(dst.launch) + " before it was read");
        dst = Content{l, {op.b}, false};
        st[peer].net_flags[g0.result_arrival_flag(n, idx)] = l;
        ++rep.network_result_sends;
        break;
      }
      case kWaitResultArrival:
        if (me.net_flags[g0.result_arrival_flag(op.a, g0.slot_index(op.b, mb, nb))] < l) return false;
        break;
      case kWaitResult:
        if (me.nvl_flags[g0.result_flag(op.b, g0.slot_index(op.b, mb, nb))] < l) return false;
        break;
      case kTake: {
        if (!run) return true;
        const uint32_t idx = g0.slot_index(op.b, mb, nb);
        Content& src = op.a != 0 ? me.result_recv[{L.node_of(op.b), idx}] : me.result[{op.b, idx}];
        if (src.launch != l || src.ranks != std::set<uint32_t>{op.b})
          fail(tile_name(r, mb, nb, l) + ": result of band " + std::to_string(op.b) + " is of launch " +
               std::to_string(src.launch));
        src.consumed = true;
        ++me.taken[{op.b, mb, nb}];
        ++rep.results_taken;
        break;
      }
    }
    if (!run) return true;
    if (++c.next_op == c.ops.size()) {
      c.next_op = 0;
      if (++c.next_tile == c.tiles.size()) {
        c.done = true;
        ++me.clusters_done;
      } else {
        c.ops = epilogue_ops(r, c.tiles[c.next_tile].first, c.band[c.next_tile]);
      }
    }
    return true;
  };

  // End of a launch on rank r (block_exit): checks, done flags, slot-free signals.
  auto end_launch = [&](uint32_t r) {
    RankState& me = st[r];
    const uint64_t l = me.launch;
    const uint32_t n = L.node_of(r);
    for (uint32_t mb = g0.band_mb_begin(r); mb < g0.band_mb_end(r); ++mb)
      for (uint32_t nb = 0; nb < nbs; ++nb) {
        auto it = me.finished.find({mb, nb});
        if (it == me.finished.end() || it->second != 1)
          fail(tile_name(r, mb, nb, l) + ": own tile finished " + std::to_string(it == me.finished.end() ? 0 : it->second) +
               " times");
      }
    if (o.all_reduce)
      for (uint32_t b = 0; b < world; ++b) {
        if (b == r) continue;
        for (uint32_t mb = g0.band_mb_begin(b); mb < g0.band_mb_end(b); ++mb)
          for (uint32_t nb = 0; nb < nbs; ++nb) {
            auto it = me.taken.find({b, mb, nb});
            if (it == me.taken.end() || it->second != 1)
              fail(tile_name(r, mb, nb, l) + ": band " + std::to_string(b) + "'s tile taken " +
                   std::to_string(it == me.taken.end() ? 0 : it->second) + " times");
          }
      }
    for (uint32_t i = 1; i < L.gpus; ++i) {
      auto& f = st[L.node_peer(r, i)].nvl_flags[L.done_flag(r)];
      f = std::max(f, l);
    }
    for (uint32_t i = 1; i < L.nodes; ++i) {
      auto& f = st[L.rail_peer(r, L.send_node(n, i))].net_flags[L.slot_free_flag(n)];
      f = std::max(f, l);
    }
    if (l < o.launches) {
      start_launch(r);
    } else {
      me.all_done = true;
    }
  };

  // Every ops list begins with a fresh tile; empty ones (no epilogue work) are skipped at once.
  while (rep.error.empty()) {
    std::vector<std::pair<uint32_t, uint32_t>> runnable;  // (rank, cluster or ~0u for the launch end)
    bool unfinished = false;
    for (uint32_t r = 0; r < world; ++r) {
      if (st[r].all_done) continue;
      unfinished = true;
      if (st[r].clusters_done == clusters[r].size()) {
        runnable.emplace_back(r, ~0u);
        continue;
      }
      for (uint32_t c = 0; c < clusters[r].size(); ++c) {
        Cluster& cl = clusters[r][c];
        if (cl.done) continue;
        if (cl.ops.empty() || step(r, cl, false)) runnable.emplace_back(r, c);
      }
    }
    if (!unfinished) break;
    if (runnable.empty()) {
      std::string who;
      for (uint32_t r = 0; r < world && who.size() < 400; ++r)
        for (auto& cl : clusters[r])
          if (!cl.done)
            who += " rank " + std::to_string(r) + " tile (" + std::to_string(cl.tiles[cl.next_tile].first) + ", " +
                   std::to_string(cl.tiles[cl.next_tile].second) + ") op " + std::to_string(cl.ops[cl.next_op].kind) +
                   " launch " + std::to_string(st[r].launch) + ";";
      fail("deadlock: nobody can go on; waiting:" + who);
      break;
    }
    double total = 0;
    for (auto& rc : runnable) total += speed[rc.first];
    double pick = std::uniform_real_distribution<double>(0, total)(rng);
    size_t k = 0;
    while (k + 1 < runnable.size() && pick >= speed[runnable[k].first]) pick -= speed[runnable[k++].first];
    auto [r, c] = runnable[k];
    if (c == ~0u) {
      end_launch(r);
      continue;
    }
    Cluster& cl = clusters[r][c];
    if (cl.ops.empty()) {  // a tile with nothing to move (cannot happen with world > 1 and gpus > 1)
      if (++cl.next_tile == cl.tiles.size()) {
        cl.done = true;
        ++st[r].clusters_done;
      } else {
        cl.ops = epilogue_ops(r, cl.tiles[cl.next_tile].first, cl.band[cl.next_tile]);
      }
      continue;
    }
    step(r, cl, true);
  }
  return rep;
}

}  // namespace mkernel::kernels
