// ag_gemm_plan.cc: the AllGather+GEMM movement plan and its CPU replay (ag_gemm_plan.h), and the
// report of its trace (ag_trace.h).
#include "fused/ag_gemm/ag_gemm_plan.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <random>
#include <tuple>

#include "fused/ag_gemm/ag_trace.h"

namespace mkernel::kernels {

uint32_t ag_default_chunk_rows(uint32_t m_local) {
  if (m_local <= 128) return std::max<uint32_t>(1, m_local);
  const uint32_t chunks = std::min<uint32_t>(8, (m_local + 127) / 128);
  const uint32_t rows = (m_local + chunks - 1) / chunks;
  return (rows + 127) / 128 * 128;
}

std::string ag_check_geometry(const AgGeometry& g) {
  if (g.layout.nodes == 0 || g.layout.gpus == 0)
    return "layout: " + std::to_string(g.layout.nodes) + " nodes x " + std::to_string(g.layout.gpus) +
           " GPUs; expected at least 1 x 1";
  if (g.rank >= g.layout.world())
    return "rank: " + std::to_string(g.rank) + "; expected below the world size " + std::to_string(g.layout.world());
  if (g.m_local == 0) return "m_local: 0; expected at least 1 row per rank";
  if (g.k == 0 || g.k % 8 != 0) return "k: " + std::to_string(g.k) + "; expected a positive multiple of 8";
  if (g.chunk_rows == 0) return "chunk_rows: 0; expected at least 1";
  if (g.chunks() > 0xFFFF) return "chunk_rows: " + std::to_string(g.chunk_rows) + " gives over 65535 chunks";
  return "";
}

std::vector<AgStep> ag_steps(const AgGeometry& g) {
  const FusedLayout& L = g.layout;
  const uint32_t r = g.rank, n = L.node_of(r);
  std::vector<AgStep> steps;
  auto add = [&](AgStepKind kind, uint32_t chunk, uint32_t shard, uint32_t peer, uint32_t node) {
    steps.push_back(AgStep{static_cast<uint8_t>(kind), 0, static_cast<uint16_t>(chunk), shard, peer, node});
  };
  // Phase 1: the own shard, chunk by chunk: into the own gathered buffer (the GEMM's tiles that
  // straddle a shard boundary read it there), to the node peers, to the other nodes.
  for (uint32_t c = 0; c < g.chunks(); ++c) {
    add(kAgLocal, c, r, r, n);
    for (uint32_t i = 1; i < L.gpus; ++i) add(kAgPush, c, r, L.node_peer(r, i), n);
    if (L.nodes > 1) add(kAgSend, c, r, r, n);
  }
  // Phase 2: what the rail peers sent, node by node, spread over the node.
  for (uint32_t i = 1; i < L.nodes; ++i) {
    const uint32_t from = L.recv_node(n, i);
    const uint32_t shard = L.rail_peer(r, from);
    for (uint32_t c = 0; c < g.chunks(); ++c) {
      add(kAgReceive, c, shard, r, from);
      for (uint32_t j = 1; j < L.gpus; ++j) add(kAgPush, c, shard, L.node_peer(r, j), from);
    }
  }
  return steps;
}

namespace {
bool own_push(const AgGeometry& g, const AgStep& s) { return s.kind == kAgPush && s.shard == g.rank; }
}  // namespace

std::vector<AgStep> ag_block_steps(const AgGeometry& g, bool copy_engine_pushes) {
  std::vector<AgStep> steps = ag_steps(g);
  if (copy_engine_pushes) std::erase_if(steps, [&](const AgStep& s) { return own_push(g, s); });
  return steps;
}

std::vector<std::vector<AgStep>> ag_copy_engine_pushes(const AgGeometry& g) {
  const FusedLayout& L = g.layout;
  std::vector<std::vector<AgStep>> out(L.gpus);
  for (const AgStep& s : ag_steps(g)) {
    if (!own_push(g, s)) continue;
    for (uint32_t i = 1; i < L.gpus; ++i)
      if (L.node_peer(g.rank, i) == s.peer) out[i].push_back(s);
  }
  return out;
}

std::vector<std::vector<AgCopy>> ag_copy_engine_copies(const AgGeometry& g, uint64_t fused_flags_offset) {
  const std::vector<std::vector<AgStep>> lists = ag_copy_engine_pushes(g);
  std::vector<std::vector<AgCopy>> out(lists.size());
  for (uint32_t i = 1; i < lists.size(); ++i)
    for (const AgStep& s : lists[i]) {
      AgCopy c;
      c.shard = s.shard;
      c.chunk = s.chunk;
      c.gate = i;
      c.src_offset = uint64_t{s.chunk} * g.chunk_rows * g.row_bytes();
      c.dst_offset = uint64_t{s.shard} * g.shard_bytes() + c.src_offset;
      c.bytes = uint64_t{g.rows_of_chunk(s.chunk)} * g.row_bytes();
      c.flag_offset = fused_flags_offset + uint64_t{g.ready_flag(s.shard, s.chunk)} * 8;
      out[i].push_back(c);
    }
  return out;
}

std::vector<AgCopy> ag_gathered_out_copies(const AgGeometry& g) {
  std::vector<AgCopy> out;
  for (uint32_t shard = 0; shard < g.layout.world(); ++shard) {
    if (shard == g.rank) continue;
    for (uint32_t c = 0; c < g.chunks(); ++c) {
      AgCopy x;
      x.shard = shard;
      x.chunk = c;
      x.gate = shard * g.chunks() + c;
      x.src_offset = x.dst_offset = uint64_t{shard} * g.shard_bytes() + uint64_t{c} * g.chunk_rows * g.row_bytes();
      x.bytes = uint64_t{g.rows_of_chunk(c)} * g.row_bytes();
      out.push_back(x);
    }
  }
  return out;
}

std::string ag_trace_report(const AgGeometry& g, const std::vector<AgStep>& steps, const std::vector<uint64_t>& t) {
  const uint32_t pieces = g.layout.world() * g.chunks();
  const uint32_t n = static_cast<uint32_t>(steps.size());
  if (t.size() < ag_trace_words(n, pieces))
    return "trace: " + std::to_string(t.size()) + " stamps; expected " + std::to_string(ag_trace_words(n, pieces)) + "\n";
  const uint64_t t0 = t[kAgTraceStart];
  if (t0 == 0) return "trace: the launch did not start (no stamps)\n";
  char buf[256];
  auto us = [&](uint64_t v) -> std::string {
    if (v == 0) return "-";
    std::snprintf(buf, sizeof(buf), "%.1f", (static_cast<double>(v) - static_cast<double>(t0)) / 1000.0);
    return buf;
  };
  std::string out = "trace (us from the role's start): gates open " + us(t[kAgTraceGatesOpen]) + ", block 0's steps done " +
                    us(t[kAgTraceStepsDone]) + ", launch end " + us(t[kAgTraceEnd]) + "\n";
  static const char* kinds[] = {"local", "push", "send", "receive"};
  std::snprintf(buf, sizeof(buf), "%5s %-8s %5s %5s %6s %10s %9s %9s %9s %9s %8s\n", "step", "kind", "shard", "chunk",
                "to", "bytes", "wait", "ready", "copied", "done", "GB/s");
  out += buf;
  for (uint32_t i = 0; i < n; ++i) {
    const AgStep& s = steps[i];
    const uint64_t* st = t.data() + ag_trace_step(i);
    const uint64_t bytes =
        s.kind == kAgLocal && !g.straddled(s.chunk) ? 0 : uint64_t{g.rows_of_chunk(s.chunk)} * g.row_bytes();
    // Where it goes: a rank (push), every rail peer (send), from a node (receive), here (local).
    const std::string to = s.kind == kAgPush      ? "r" + std::to_string(s.peer)
                           : s.kind == kAgSend    ? std::string("rails")
                           : s.kind == kAgReceive ? "n" + std::to_string(s.node)
                                                  : std::string("here");
    std::string rate = "-";
    if (bytes > 0 && st[kAgTraceInputsReady] != 0 && st[kAgTracePublished] > st[kAgTraceInputsReady]) {
      char r[32];
      std::snprintf(r, sizeof(r), "%.1f",
                    static_cast<double>(bytes) / static_cast<double>(st[kAgTracePublished] - st[kAgTraceInputsReady]));
      rate = r;
    }
    std::string cells[4];
    for (uint32_t j = 0; j < 4; ++j) cells[j] = us(st[j]);
    std::snprintf(buf, sizeof(buf), "%5u %-8s %5u %5u %6s %10llu %9s %9s %9s %9s %8s\n", i, kinds[s.kind & 3], s.shard,
                  s.chunk, to.c_str(), static_cast<unsigned long long>(bytes), cells[0].c_str(), cells[1].c_str(),
                  cells[2].c_str(), cells[3].c_str(), rate.c_str());
    out += buf;
  }
  out += "arrivals (first seen by role block 0), per shard: chunk times\n";
  for (uint32_t sh = 0; sh < g.layout.world(); ++sh) {
    if (sh == g.rank) continue;
    out += "  shard " + std::to_string(sh) + ":";
    for (uint32_t c = 0; c < g.chunks(); ++c) out += " " + us(t[ag_trace_arrival(n, sh * g.chunks() + c)]);
    out += "\n";
  }
  return out;
}

// ---- replay ------------------------------------------------------------------------------------

namespace {

// What a buffer chunk holds: which launch's copy of which shard chunk (0 launch: nothing yet).
struct Piece {
  uint32_t launch = 0, shard = 0, chunk = 0;
  bool operator==(const Piece&) const = default;
};

struct RankState {
  std::vector<Piece> gathered;          // [shard * chunks + chunk]
  std::vector<Piece> slots;             // [node * chunks + chunk]: network workspace
  std::vector<uint64_t> nvl_flags;      // NVLink fused-op flags
  std::vector<uint64_t> net_flags;      // fused-op flags of the flag array
  std::vector<uint32_t> received;       // writes into gathered this launch, per piece
  uint32_t launch = 0;                  // launch in progress (or last finished)
  uint32_t prev = 0;                    // fused_state[0] at the start of `launch`
  bool running = false;                 // the kernel of `launch` runs (its GEMM may read)
  std::vector<size_t> next_step;        // per comm block
  std::vector<size_t> ce_next;          // per node peer: copy-engine pushes done this launch
  size_t gemm_next = 0;                 // GEMM reads pieces in order
  bool gemm_done = false;
  uint32_t reads_outstanding = 0;       // GEMM reads of `launch` still to come
};

}  // namespace

AgReplayReport ag_replay(const FusedLayout& L, uint32_t m_local, uint32_t chunk_rows, const AgReplayOptions& o) {
  AgReplayReport rep;
  const uint32_t R = L.world();
  std::vector<AgGeometry> geo(R);
  std::vector<std::vector<AgStep>> plan(R);
  for (uint32_t r = 0; r < R; ++r) {
    geo[r] = AgGeometry{L, r, m_local, 8, chunk_rows == 0 ? ag_default_chunk_rows(m_local) : chunk_rows};
    if (std::string e = ag_check_geometry(geo[r]); !e.empty()) return rep.error = e, rep;
    plan[r] = ag_block_steps(geo[r], o.copy_engine_pushes);
  }
  std::vector<std::vector<std::vector<AgStep>>> ce(R);  // [rank][node peer index]
  if (o.copy_engine_pushes)
    for (uint32_t r = 0; r < R; ++r) ce[r] = ag_copy_engine_pushes(geo[r]);
  else
    for (uint32_t r = 0; r < R; ++r) ce[r].resize(L.gpus);
  // Faults (AgPlanFault): break rank 0's plan on purpose.
  auto& p0 = plan[0];
  switch (o.fault) {
    case AgPlanFault::kDropLastPush:
      if (o.copy_engine_pushes && L.gpus > 1) {  // the last copy-engine push
        ce[0][L.gpus - 1].pop_back();
        break;
      }
      for (size_t i = p0.size(); i-- > 0;)
        if (p0[i].kind == kAgPush) {
          p0.erase(p0.begin() + static_cast<std::ptrdiff_t>(i));
          break;
        }
      break;
    case AgPlanFault::kSendTwice:
      for (size_t i = 0; i < p0.size(); ++i)
        if (p0[i].kind == kAgSend) {
          p0.insert(p0.begin() + static_cast<std::ptrdiff_t>(i), p0[i]);
          break;
        }
      break;
    case AgPlanFault::kForwardFirst:
      std::stable_partition(p0.begin(), p0.end(), [](const AgStep& s) { return !(s.kind == kAgPush && s.shard != 0); });
      std::stable_partition(p0.begin(), p0.end(), [](const AgStep& s) { return s.kind != kAgReceive; });
      break;
    default: break;
  }
  const bool wait_free = o.fault != AgPlanFault::kNoPeerFreeWait;
  const bool wait_arrival = o.fault != AgPlanFault::kReceiveUnflagged;
  const AgGeometry& g0 = geo[0];
  const uint32_t C = g0.chunks();
  std::vector<RankState> st(R);
  for (auto& s : st) {
    s.gathered.assign(size_t{R} * C, Piece{});
    s.slots.assign(size_t{L.nodes} * C, Piece{});
    s.nvl_flags.assign(g0.nvl_flags_needed(), 0);
    s.net_flags.assign(std::max<uint32_t>(1, g0.net_flags_needed()), 0);
    s.next_step.assign(o.comm_blocks, 0);
    s.ce_next.assign(L.gpus, 0);
  }
  // Per (launch, shard, destination node): network sends, to prove "once per node".
  std::map<std::tuple<uint32_t, uint32_t, uint32_t>, uint32_t> sends;
  auto fail = [&](std::string e) {
    if (rep.error.empty()) rep.error = std::move(e);
  };
  auto name = [](uint32_t r, const AgStep& s) {
    static const char* kinds[] = {"local", "push", "send", "receive"};
    return "rank " + std::to_string(r) + " step " + kinds[s.kind] + "(shard " + std::to_string(s.shard) + ", chunk " +
           std::to_string(s.chunk) + ", peer " + std::to_string(s.peer) + ", node " + std::to_string(s.node) + ")";
  };

  // A step of rank r for launch l: runnable when its waits hold; running it performs its writes
  // and checks them.
  auto ready_to_run = [&](uint32_t r, const AgStep& s) -> bool {
    const RankState& me = st[r];
    const uint32_t l = me.launch, prev = me.prev;
    switch (s.kind) {
      case kAgLocal: return true;
      case kAgPush:
        if (s.shard != r && me.nvl_flags[g0.ready_flag(s.shard, s.chunk)] < l) return false;
        return !wait_free || me.nvl_flags[g0.done_flag(s.peer)] >= prev;
      case kAgSend:
        for (uint32_t i = 1; i < L.nodes && wait_free; ++i)
          if (me.net_flags[g0.slot_free_flag(L.send_node(s.node, i))] < prev) return false;
        return true;
      case kAgReceive: return !wait_arrival || me.net_flags[g0.arrival_flag(s.node, s.chunk)] >= l;
    }
    return false;
  };
  auto write_gathered = [&](uint32_t dst, uint32_t shard, uint32_t chunk, Piece p, const std::string& who) {
    RankState& d = st[dst];
    // The destination must be in this launch (its previous GEMM finished) or have finished the
    // previous one: a write for launch l while dst's GEMM of launch l - 1 still reads is a
    // write-after-read race.
    if (d.launch + 1 == p.launch && d.running)
      fail(who + ": writes rank " + std::to_string(dst) + "'s gathered buffer for launch " + std::to_string(p.launch) +
           " while its launch " + std::to_string(d.launch) + " still runs");
    if (d.launch + 1 < p.launch || d.launch > p.launch)
      fail(who + ": writes rank " + std::to_string(dst) + " for launch " + std::to_string(p.launch) +
           " while it is at launch " + std::to_string(d.launch));
    d.gathered[size_t{shard} * C + chunk] = p;
    // Counted for launch p.launch: a write that arrives before dst started that launch (dst
    // finished the previous one) is counted when dst ends it.
    ++d.received[size_t{shard} * C + chunk];
  };

  // Agents: (rank, block) comm blocks, and (rank, gemm). A rank's next launch starts when its
  // previous one ended (all blocks and its GEMM done): stream order.
  std::mt19937_64 rng(o.seed);
  auto start_launch = [&](uint32_t r) {
    RankState& s = st[r];
    s.prev = s.launch;  // fused_state[0]: the last fused launch (0 before the first)
    ++s.launch;
    s.running = true;
    std::fill(s.next_step.begin(), s.next_step.end(), 0);
    std::fill(s.ce_next.begin(), s.ce_next.end(), 0);
    s.gemm_next = 0;
    s.gemm_done = false;
  };
  for (uint32_t r = 0; r < R; ++r) {
    st[r].received.assign(size_t{R} * C, 0);
    start_launch(r);
  }
  auto end_launch = [&](uint32_t r) {
    RankState& s = st[r];
    // Every piece received exactly once in this launch.
    for (uint32_t sh = 0; sh < R; ++sh)
      for (uint32_t c = 0; c < C; ++c) {
        const uint32_t n = s.received[size_t{sh} * C + c];
        if (n != 1)
          fail("rank " + std::to_string(r) + " launch " + std::to_string(s.launch) + ": shard " + std::to_string(sh) +
               " chunk " + std::to_string(c) + " arrived " + std::to_string(n) + " times; expected once");
      }
    std::fill(s.received.begin(), s.received.end(), 0);
    s.running = false;
    // block_exit of the last block: done() to node peers, slot_free() to rail peers.
    for (uint32_t i = 1; i < L.gpus; ++i) {
      const uint32_t p = L.node_peer(r, i);
      st[p].nvl_flags[g0.done_flag(r)] = std::max<uint64_t>(st[p].nvl_flags[g0.done_flag(r)], s.launch);
    }
    for (uint32_t i = 1; i < L.nodes; ++i) {
      const uint32_t p = L.rail_peer(r, L.send_node(L.node_of(r), i));
      uint64_t& f = st[p].net_flags[g0.slot_free_flag(L.node_of(r))];
      f = std::max<uint64_t>(f, s.launch);
    }
  };

  for (;;) {
    // Collect runnable agents.
    // (rank, agent): agent >= 0 a comm block, -1 the GEMM, -1 - i the copy stream to node peer i.
    std::vector<std::pair<uint32_t, int>> runnable;
    bool all_finished = true;
    for (uint32_t r = 0; r < R; ++r) {
      RankState& s = st[r];
      // A copy stream still runs after the kernel ended; the launch ends when it is done too.
      for (uint32_t i = 1; i < L.gpus; ++i) {
        if (s.ce_next[i] >= ce[r][i].size()) continue;
        all_finished = false;
        // The gate: role block 0 waited until the peer finished its previous launch.
        if (!wait_free || s.nvl_flags[g0.done_flag(L.node_peer(r, i))] >= s.prev)
          runnable.emplace_back(r, -1 - static_cast<int>(i));
      }
      if (!s.running) continue;
      all_finished = false;
      for (uint32_t b = 0; b < o.comm_blocks; ++b) {
        // Block b takes steps b, b + blocks, ...
        const size_t i = b + s.next_step[b] * o.comm_blocks;
        if (i < plan[r].size() && ready_to_run(r, plan[r][i])) runnable.emplace_back(r, static_cast<int>(b));
      }
      if (!s.gemm_done) {
        const uint32_t sh = static_cast<uint32_t>(s.gemm_next / C), c = static_cast<uint32_t>(s.gemm_next % C);
        if (s.nvl_flags[g0.ready_flag(sh, c)] >= s.launch) runnable.emplace_back(r, -1);
      }
    }
    if (all_finished) break;
    if (runnable.empty()) {
      // Deadlock: name every waiting agent.
      std::string e = "deadlock: no agent can run;";
      for (uint32_t r = 0; r < R && e.size() < 2000; ++r) {
        const RankState& s = st[r];
        if (!s.running) continue;
        for (uint32_t b = 0; b < o.comm_blocks; ++b) {
          const size_t i = b + s.next_step[b] * o.comm_blocks;
          if (i < plan[r].size()) e += " [block " + std::to_string(b) + " of " + name(r, plan[r][i]) + " waits]";
        }
        if (!s.gemm_done)
          e += " [rank " + std::to_string(r) + " GEMM waits for piece " + std::to_string(s.gemm_next) + "]";
      }
      for (uint32_t r = 0; r < R && e.size() < 2000; ++r)
        for (uint32_t i = 1; i < L.gpus; ++i)
          if (st[r].ce_next[i] < ce[r][i].size())
            e += " [copy stream of " + name(r, ce[r][i][st[r].ce_next[i]]) + " waits]";
      fail(e);
      break;
    }
    const auto [r, b] = runnable[rng() % runnable.size()];
    RankState& me = st[r];
    const uint32_t l = me.launch, n = L.node_of(r);
    if (b < -1) {
      // A copy-engine push: the chunk, then its ready flag, into the peer.
      const uint32_t i = static_cast<uint32_t>(-1 - b);
      const AgStep s = ce[r][i][me.ce_next[i]++];
      const std::string who = "copy stream: " + name(r, s) + " launch " + std::to_string(l);
      if (L.node_of(s.peer) != n || s.peer == r || s.shard != r) fail(who + ": not an own chunk to a node peer");
      write_gathered(s.peer, r, s.chunk, Piece{l, r, s.chunk}, who);
      st[s.peer].nvl_flags[g0.ready_flag(r, s.chunk)] = l;
      ++rep.nvlink_chunk_transfers;
    } else if (b < 0) {
      // The GEMM reads the next piece: it must be this launch's.
      const uint32_t sh = static_cast<uint32_t>(me.gemm_next / C), c = static_cast<uint32_t>(me.gemm_next % C);
      const Piece want{l, sh, c};
      if (!(me.gathered[me.gemm_next] == want))
        fail("rank " + std::to_string(r) + " launch " + std::to_string(l) + ": GEMM read shard " + std::to_string(sh) +
             " chunk " + std::to_string(c) + " holding launch " + std::to_string(me.gathered[me.gemm_next].launch) +
             " shard " + std::to_string(me.gathered[me.gemm_next].shard));
      if (++me.gemm_next == size_t{R} * C) me.gemm_done = true;
    } else {
      const size_t i = static_cast<size_t>(b) + me.next_step[b] * o.comm_blocks;
      const AgStep s = plan[r][i];
      ++me.next_step[b];
      ++rep.steps_run;
      const std::string who = name(r, s) + " launch " + std::to_string(l);
      switch (s.kind) {
        case kAgLocal:
          write_gathered(r, r, s.chunk, Piece{l, r, s.chunk}, who);
          me.nvl_flags[g0.ready_flag(r, s.chunk)] = l;
          break;
        case kAgPush: {
          if (L.node_of(s.peer) != n || s.peer == r) fail(who + ": pushes outside its node or to itself");
          const Piece p = s.shard == r ? Piece{l, r, s.chunk} : me.gathered[size_t{s.shard} * C + s.chunk];
          if (!(p == Piece{l, s.shard, s.chunk})) fail(who + ": forwards a piece it does not hold");
          write_gathered(s.peer, s.shard, s.chunk, p, who);
          st[s.peer].nvl_flags[g0.ready_flag(s.shard, s.chunk)] = l;
          ++rep.nvlink_chunk_transfers;
          break;
        }
        case kAgSend: {
          me.slots[size_t{n} * C + s.chunk] = Piece{l, r, s.chunk};
          for (uint32_t k = 1; k < L.nodes; ++k) {
            const uint32_t to_node = L.send_node(n, k);
            const uint32_t p = L.rail_peer(r, to_node);
            RankState& d = st[p];
            // The rail peer must have finished reading this slot in its previous launch.
            if (d.launch + 1 == l && d.running)
              fail(who + ": overwrites rank " + std::to_string(p) + "'s slot while its launch " +
                   std::to_string(d.launch) + " may still read it");
            d.slots[size_t{n} * C + s.chunk] = Piece{l, r, s.chunk};
            d.net_flags[g0.arrival_flag(n, s.chunk)] = std::max<uint64_t>(d.net_flags[g0.arrival_flag(n, s.chunk)], l);
            ++rep.network_chunk_transfers;
            const uint32_t cnt = ++sends[{l, r * 65536 + s.chunk, to_node}];
            rep.max_network_sends_per_shard_node = std::max<uint64_t>(rep.max_network_sends_per_shard_node, cnt);
            if (to_node == n) fail(who + ": sends to its own node");
          }
          break;
        }
        case kAgReceive: {
          const Piece p = me.slots[size_t{s.node} * C + s.chunk];
          if (!(p == Piece{l, s.shard, s.chunk}))
            fail(who + ": slot holds launch " + std::to_string(p.launch) + " shard " + std::to_string(p.shard) +
                 ", not this launch's");
          write_gathered(r, s.shard, s.chunk, p, who);
          me.nvl_flags[g0.ready_flag(s.shard, s.chunk)] = l;
          break;
        }
      }
    }
    // A rank whose blocks and GEMM are all done ends its launch and starts the next.
    bool blocks_done = true;
    for (uint32_t bb = 0; bb < o.comm_blocks; ++bb)
      if (bb + me.next_step[bb] * o.comm_blocks < plan[r].size()) blocks_done = false;
    if (me.running && blocks_done && me.gemm_done) end_launch(r);
    bool copies_done = true;
    for (uint32_t i = 1; i < L.gpus; ++i)
      if (me.ce_next[i] < ce[r][i].size()) copies_done = false;
    // Stream order: the next launch waits for the kernel and the copy streams (join).
    if (!me.running && copies_done && me.launch < o.launches) start_launch(r);
    if (!rep.error.empty()) break;
  }
  // Every shard chunk went to every other node exactly once per launch.
  if (rep.error.empty()) {
    const uint64_t want = uint64_t{o.launches} * R * (L.nodes - 1) * C;
    if (rep.network_chunk_transfers != want)
      fail("network chunk transfers: " + std::to_string(rep.network_chunk_transfers) + "; expected " +
           std::to_string(want) + " (each chunk once per other node)");
    if (L.nodes > 1 && rep.max_network_sends_per_shard_node != 1)
      fail("a chunk went to one node " + std::to_string(rep.max_network_sends_per_shard_node) + " times");
    const uint64_t want_nvl = uint64_t{o.launches} * R * (L.gpus - 1) * L.nodes * C;
    if (rep.nvlink_chunk_transfers != want_nvl)
      fail("NVLink chunk transfers: " + std::to_string(rep.nvlink_chunk_transfers) + "; expected " +
           std::to_string(want_nvl));
  }
  return rep;
}

}  // namespace mkernel::kernels
