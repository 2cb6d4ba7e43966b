// ring_attn_plan.cc: the ring-attention movement plan, the relations of zigzag placement, and the
// CPU replay (ring_attn_plan.h).
#include "fused/ring_attn/ring_attn_plan.h"

#include <algorithm>
#include <map>
#include <random>
#include <tuple>

namespace mkernel::kernels {

uint32_t ring_default_slots(const FusedLayout& L) {
  const uint32_t R = L.world();
  if (R <= 1) return 1;
  uint32_t s = std::max<uint32_t>(4, L.nodes > 1 ? L.gpus : 1);
  s = std::min(s, R - 1);
  return std::min(s, kRingMaxSlots);
}

std::string ring_check_geometry(const RingGeometry& g) {
  const FusedLayout& L = g.layout;
  if (L.nodes == 0 || L.gpus == 0)
    return "layout: " + std::to_string(L.nodes) + " nodes x " + std::to_string(L.gpus) +
           " GPUs; expected at least 1 x 1";
  if (L.world() > kRingMaxWorld)
    return "layout: " + std::to_string(L.world()) + " ranks; expected at most " + std::to_string(kRingMaxWorld);
  if (g.rank >= L.world())
    return "rank: " + std::to_string(g.rank) + "; expected below the world size " + std::to_string(L.world());
  if (g.s_local == 0) return "s_local: 0; expected at least 1 position per rank";
  if (g.placement != kRingNonCausal && g.placement != kRingCausalContiguous && g.placement != kRingCausalZigzag)
    return "placement: " + std::to_string(g.placement) +
           "; expected kRingNonCausal, kRingCausalContiguous or kRingCausalZigzag";
  if (g.placement == kRingCausalZigzag && g.s_local % 2 != 0)
    return "s_local: " + std::to_string(g.s_local) +
           " with zigzag placement; expected an even number (each rank holds two chunks of s_local / 2 positions)";
  if (g.slots == 0 || g.slots > kRingMaxSlots)
    return "slots: " + std::to_string(g.slots) + "; expected 1 to " + std::to_string(kRingMaxSlots) +
           " (ring_default_slots gives " + std::to_string(ring_default_slots(L)) + ")";
  if (L.world() > 1 && g.slots > L.world() - 1)
    return "slots: " + std::to_string(g.slots) + "; expected at most world - 1 = " + std::to_string(L.world() - 1) +
           " (one per chunk that arrives)";
  if (L.nodes > 1 && g.slots < L.gpus)
    return "slots: " + std::to_string(g.slots) + " across " + std::to_string(L.nodes) +
           " nodes; expected at least gpus = " + std::to_string(L.gpus) +
           " (a chunk forwarded to the node peers must not wait for its own slot, ring_attn_plan.h note 3)";
  return "";
}

RingChunk ring_chunk(const RingGeometry& g, uint32_t t, uint32_t group) {
  const uint32_t R = g.world();
  auto raw = [&](uint32_t step) -> RingChunk {
    RingChunk c;
    if (group >= g.groups()) return c;  // kRingSkip
    const uint32_t q = g.source_of(g.rank, step), r = g.rank;
    const uint32_t s = g.s_local, h = s / 2;
    switch (g.placement) {
      case kRingNonCausal:
        c = RingChunk{s, kRingFull, 0, 0};
        break;
      case kRingCausalContiguous:
        c = q == r ? RingChunk{s, kRingCausal, 0, 0} : (q < r ? RingChunk{s, kRingFull, 0, 0} : RingChunk{});
        break;
      case kRingCausalZigzag:
        if (group == 0) {
          c = q == r ? RingChunk{h, kRingCausal, 0, 0} : (q < r ? RingChunk{h, kRingFull, 0, 0} : RingChunk{});
        } else {
          c = q == r ? RingChunk{s, kRingCausal, static_cast<int32_t>(h), 0}
                     : (q < r ? RingChunk{h, kRingFull, 0, 0} : RingChunk{s, kRingFull, 0, 0});
        }
        break;
      default:
        break;
    }
    return c;
  };
  RingChunk c = raw(t);
  if (c.relation == kRingSkip) return c;
  // Running-state flags over the group's non-skipped steps (note 5).
  bool earlier = false, later = false;
  for (uint32_t u = 0; u < t; ++u) earlier |= raw(u).relation != kRingSkip;
  for (uint32_t u = t + 1; u < R; ++u) later |= raw(u).relation != kRingSkip;
  c.flags = (earlier ? kRingReadRunning : 0u) | (later ? 0u : kRingWriteFinal);
  return c;
}

std::vector<RingChunk> ring_chunks(const RingGeometry& g) {
  std::vector<RingChunk> out(size_t{g.world()} * 2);
  for (uint32_t t = 0; t < g.world(); ++t)
    for (uint32_t grp = 0; grp < 2; ++grp) out[size_t{t} * 2 + grp] = ring_chunk(g, t, grp);
  return out;
}

uint64_t ring_visible_pairs(const RingGeometry& g) {
  uint64_t pairs = 0;
  for (uint32_t t = 0; t < g.world(); ++t)
    for (uint32_t grp = 0; grp < g.groups(); ++grp) {
      const RingChunk c = ring_chunk(g, t, grp);
      const uint64_t rows = g.group_rows(grp);
      if (c.relation == kRingFull) pairs += rows * c.kv_len;
      if (c.relation == kRingCausal)
        for (uint64_t i = 0; i < rows; ++i) {
          const int64_t n = static_cast<int64_t>(i) + c.causal_offset + 1;
          pairs += n <= 0 ? 0 : std::min<uint64_t>(static_cast<uint64_t>(n), c.kv_len);
        }
    }
  return pairs;
}

std::vector<RingStep> ring_steps(const RingGeometry& g) {
  const FusedLayout& L = g.layout;
  const uint32_t r = g.rank, n = L.node_of(r), G = L.gpus, N = L.nodes, S = g.slots;
  std::vector<RingStep> steps;
  auto wait_for = [&](uint32_t dst) { return static_cast<uint16_t>(dst > S ? dst - S : 0); };
  // Every delivery in the order its receiver consumes it (note 4); the send right after the own
  // chunk's NVLink pushes (note 4: it waits only on the previous launch, and so do those pushes
  // since slots >= gpus across nodes).
  for (uint32_t i = 0; i < N; ++i) {
    const uint32_t base = i * G;
    if (i == 1) steps.push_back(RingStep{kRingSend, 0, 0, 0, static_cast<uint16_t>(n), r, 0, 0});
    if (i > 0) {
      steps.push_back(RingStep{kRingReceive, 0, 0, static_cast<uint16_t>(base), static_cast<uint16_t>((n + i) % N), r,
                               wait_for(base), 0});
    }
    for (uint32_t j = 1; j < G; ++j) {
      const uint32_t peer = L.node_peer(r, j);  // (n, h - j): consumes this at its step base + j
      steps.push_back(RingStep{kRingPush, 0, static_cast<uint16_t>(base), static_cast<uint16_t>(base + j), 0, peer,
                               wait_for(base + j), 0});
    }
  }
  return steps;
}

// ---- zigzag placement ----------------------------------------------------------------------------

std::string ring_zigzag_check(uint64_t seq, uint32_t world) {
  if (world == 0) return "world: 0; expected at least 1 rank";
  if (seq == 0 || seq % (2ull * world) != 0)
    return "seq: " + std::to_string(seq) +
           "; expected a positive multiple of 2 x world = " + std::to_string(2ull * world) +
           " (zigzag placement cuts the sequence into 2 x world equal chunks)";
  return "";
}

std::vector<uint64_t> ring_zigzag_permutation(uint64_t seq, uint32_t world) {
  std::vector<uint64_t> perm(seq);
  for (uint64_t p = 0; p < seq; ++p) perm[p] = ring_zigzag_source(seq, world, p);
  return perm;
}

// ---- replay ------------------------------------------------------------------------------------

namespace {

// What a slot holds: which launch's copy of which rank's chunk (launch 0: nothing yet).
struct Slot {
  uint32_t launch = 0, chunk = 0;
  uint32_t pending = 0;  // reads still to come of what it holds (attention blocks, forwards, puts)
  uint32_t active = 0;   // reads in progress
  bool writing = false;  // a write in progress
};

struct Message {
  bool put = false;  // a put into network slot `slot` (else a signal of flag `flag`)
  uint32_t from = 0, to = 0, slot = 0, flag = 0;
  uint32_t launch = 0, chunk = 0;
};

struct Agent {
  size_t next = 0;     // comm: index in the list; attention: step
  uint32_t phase = 0;  // 0: waiting to start the item; 1: started
  bool done = false;
  uint32_t late = 0;  // RingPlanFault::kLateStepCount: the step whose count waits for the next chunk
};

struct RankState {
  std::vector<Slot> kv, net;
  std::vector<uint64_t> nvl_flags, net_flags;
  std::vector<uint32_t> freed_count;
  std::vector<uint32_t> seen;
  uint32_t launch = 0, prev = 0;
  bool running = false;
  std::vector<Agent> comm;                  // communication blocks, each taking a slice of every item
  std::vector<uint32_t> started, finished;  // per item: blocks that began / ended their slice
  std::vector<Agent> attn;
};

}  // namespace

RingReplayReport ring_replay(const FusedLayout& L, const RingReplayOptions& o) {
  RingReplayReport rep;
  const uint32_t R = L.world(), N = L.nodes, G = L.gpus, B = std::max<uint32_t>(1, o.attn_blocks);
  const uint32_t C = std::max<uint32_t>(1, o.comm_blocks);
  std::vector<RingGeometry> geo(R);
  std::vector<std::vector<RingStep>> plan(R);
  for (uint32_t r = 0; r < R; ++r) {
    geo[r] = RingGeometry{L, r, 16, o.placement, o.slots != 0 ? o.slots : ring_default_slots(L)};
    if (o.fault == RingPlanFault::kTooFewSlots) geo[r].slots = std::max<uint32_t>(1, G - 1);
    if (o.fault != RingPlanFault::kTooFewSlots)
      if (std::string e = ring_check_geometry(geo[r]); !e.empty()) return rep.error = e, rep;
    plan[r] = ring_steps(geo[r]);
  }
  if (o.fault == RingPlanFault::kDropLastPush) {
    auto& p0 = plan[0];
    for (size_t i = p0.size(); i-- > 0;)
      if (p0[i].kind == kRingPush) {
        p0.erase(p0.begin() + static_cast<std::ptrdiff_t>(i));
        break;
      }
  }
  const RingGeometry& g0 = geo[0];
  const uint32_t S = g0.slots;
  const bool wait_freed = o.fault != RingPlanFault::kNoFreedWait;
  const bool count_forwards = o.fault != RingPlanFault::kFreeBeforeForward;
  const bool wait_slot_free = o.fault != RingPlanFault::kNoSlotFreeWait;
  const bool late_count = o.fault == RingPlanFault::kLateStepCount;

  std::vector<RankState> st(R);
  for (auto& s : st) {
    s.kv.assign(S, Slot{});
    s.net.assign(N, Slot{});
    s.nvl_flags.assign(g0.nvl_flags_needed(), 0);
    s.net_flags.assign(std::max<uint32_t>(1, g0.net_flags_needed()), 0);
    s.freed_count.assign(R, 0);
    s.attn.assign(B, Agent{});
  }
  for (uint32_t r = 0; r < R; ++r) {
    st[r].started.assign(plan[r].size(), 0);
    st[r].finished.assign(plan[r].size(), 0);
  }
  std::vector<Message> wire;
  std::map<std::tuple<uint32_t, uint32_t, uint32_t>, uint32_t> sends;  // (launch, chunk, node)
  auto fail = [&](std::string e) {
    if (rep.error.empty()) rep.error = std::move(e);
  };
  auto rk = [](uint32_t r) { return "rank " + std::to_string(r); };
  auto item_name = [&](uint32_t r, const RingStep& s) {
    static const char* kinds[] = {"send", "push", "receive"};
    return rk(r) + " " + kinds[s.kind] + "(src_step " + std::to_string(s.src_step) + ", dst_step " +
           std::to_string(s.dst_step) + ", node " + std::to_string(s.node) + ", peer " + std::to_string(s.peer) + ")";
  };
  auto write_begin = [&](Slot& d, const std::string& who, const std::string& what) {
    if (d.pending > 0 || d.active > 0 || d.writing)
      fail(who + ": writes " + what + " while " +
           (d.writing ? std::string("another write is in progress")
                      : "launch " + std::to_string(d.launch) + "'s chunk of rank " + std::to_string(d.chunk) +
                            " there still has " + std::to_string(d.pending) + " read(s) to come, " +
                            std::to_string(d.active) + " in progress"));
    d.writing = true;
  };
  auto write_end = [&](Slot& d, uint32_t launch, uint32_t chunk, uint32_t readers) {
    d.writing = false;
    d.launch = launch;
    d.chunk = chunk;
    d.pending = readers;
  };
  auto read_begin = [&](Slot& s, uint32_t launch, uint32_t chunk, const std::string& who, const std::string& what) {
    if (s.launch != launch || s.chunk != chunk || s.writing)
      fail(who + ": reads " + what + " expecting launch " + std::to_string(launch) + "'s chunk of rank " +
           std::to_string(chunk) + ", finds launch " + std::to_string(s.launch) + "'s of rank " +
           std::to_string(s.chunk) + (s.writing ? " (being written)" : ""));
    ++s.active;
  };
  auto read_end = [&](Slot& s) {
    if (s.active > 0) --s.active;
    if (s.pending > 0) --s.pending;
  };
  auto count_freed = [&](uint32_t r, uint32_t t) {
    RankState& me = st[r];
    const uint32_t need = B + (count_forwards ? g0.forwards_out(t) : 0);  // readers of slot t
    if (++me.freed_count[t] == need) {
      me.freed_count[t] = 0;
      me.nvl_flags[g0.freed_flag(t)] = me.launch;
    }
  };

  auto start_launch = [&](uint32_t r) {
    RankState& s = st[r];
    s.prev = s.launch;
    ++s.launch;
    s.running = true;
    s.comm.assign(C, Agent{});
    std::fill(s.started.begin(), s.started.end(), 0);
    std::fill(s.finished.begin(), s.finished.end(), 0);
    std::fill(s.attn.begin(), s.attn.end(), Agent{});
    s.seen.assign(R, 0);
  };
  for (uint32_t r = 0; r < R; ++r) start_launch(r);
  uint32_t ranks_finished = 0;
  auto end_launch = [&](uint32_t r) {
    RankState& s = st[r];
    for (uint32_t q = 0; q < R; ++q)
      if (s.seen[q] != 1)
        fail(rk(r) + " launch " + std::to_string(s.launch) + ": attended to rank " + std::to_string(q) + "'s chunk " +
             std::to_string(s.seen[q]) + " times; expected once");
    for (uint32_t t = 0; t < R; ++t)
      if (s.freed_count[t] != 0)
        fail(rk(r) + " launch " + std::to_string(s.launch) + ": the freed count of step " + std::to_string(t) + " is " +
             std::to_string(s.freed_count[t]) + " at the end; expected 0 (counted by every reader once)");
    s.running = false;
    // The last block: done to the node peers, slot_free to the rail peers (through the network).
    for (uint32_t i = 1; i < G; ++i) st[L.node_peer(r, i)].nvl_flags[L.done_flag(r)] = s.launch;
    const uint32_t n = L.node_of(r);
    for (uint32_t i = 1; i < N; ++i)
      wire.push_back(Message{false, r, L.rail_peer(r, L.send_node(n, i)), 0, L.slot_free_flag(n), s.launch, 0});
    if (s.launch < o.launches)
      start_launch(r);
    else
      ++ranks_finished;
  };

  // Whether an agent's next event may happen now (its waits hold), and the event itself.
  auto comm_ready = [&](uint32_t r, uint32_t cb) -> bool {
    RankState& me = st[r];
    const Agent& a = me.comm[cb];
    if (!me.running || a.done) return false;
    if (a.next >= plan[r].size()) return true;  // finishing
    if (a.phase == 1) return true;
    const RingStep& s = plan[r][a.next];
    const uint32_t l = me.launch, prev = me.prev;
    switch (s.kind) {
      case kRingSend:
        for (uint32_t i = 1; i < N && wait_slot_free; ++i)
          if (me.net_flags[L.slot_free_flag(L.send_node(s.node, i))] < prev) return false;
        return true;
      case kRingPush:
        if (s.src_step > 0 && me.nvl_flags[g0.arrived_flag(s.src_step)] < l) return false;
        if (!wait_freed) return true;
        if (s.wait_freed > 0) return st[s.peer].nvl_flags[g0.freed_flag(s.wait_freed)] >= l;
        return me.nvl_flags[L.done_flag(s.peer)] >= prev;
      case kRingReceive:
        if (me.net_flags[g0.arrival_flag(s.node)] < l) return false;
        return !wait_freed || s.wait_freed == 0 || me.nvl_flags[g0.freed_flag(s.wait_freed)] >= l;
    }
    return false;
  };
  // A block's slice of an item: the item's writes and reads begin with the first block's slice and
  // end with the last block's, which publishes (the kernel's per-step counter, ring_attn.cuh).
  auto comm_event = [&](uint32_t r, uint32_t cb) {
    RankState& me = st[r];
    Agent& a = me.comm[cb];
    if (a.next >= plan[r].size()) {
      a.done = true;
      return;
    }
    const size_t item = a.next;
    const bool begin = a.phase == 0;
    if (begin) {
      a.phase = 1;
    } else {
      a.phase = 0;
      ++a.next;
    }
    if (begin ? me.started[item]++ != 0 : ++me.finished[item] != C) return;  // not the first / last slice
    const RingStep& s = plan[r][item];
    const uint32_t l = me.launch;
    const std::string who = item_name(r, s);
    const uint32_t phase = begin ? 0 : 1;
    switch (s.kind) {
      case kRingSend:
        if (phase == 0) {
          write_begin(me.net[s.node], who, "its network staging slot " + std::to_string(s.node));
        } else {
          write_end(me.net[s.node], l, r, N - 1);
          for (uint32_t i = 1; i < N; ++i) {
            const uint32_t to_node = L.send_node(s.node, i);
            wire.push_back(Message{true, r, L.rail_peer(r, to_node), s.node, 0, l, r});
            if (to_node == L.node_of(r)) fail(who + ": sends to its own node");
            const uint32_t n = ++sends[{l, r, to_node}];
            rep.max_sends_per_chunk_node = std::max<uint64_t>(rep.max_sends_per_chunk_node, n);
            ++rep.network_chunk_transfers;
          }
        }
        break;
      case kRingPush: {
        Slot& dst = st[s.peer].kv[g0.slot_of(s.dst_step)];
        const uint32_t chunk = s.src_step == 0 ? r : g0.source_of(r, s.src_step);
        if (L.node_of(s.peer) != L.node_of(r)) fail(who + ": pushes over NVLink to another node");
        if (g0.source_of(s.peer, s.dst_step) != chunk)
          fail(who + ": delivers rank " + std::to_string(chunk) + "'s chunk to a step that attends to rank " +
               std::to_string(g0.source_of(s.peer, s.dst_step)) + "'s");
        if (phase == 0) {
          if (s.src_step > 0)
            read_begin(me.kv[g0.slot_of(s.src_step)], l, chunk, who,
                       "its slot of its step " + std::to_string(s.src_step));
          write_begin(dst, who, rk(s.peer) + "'s slot of its step " + std::to_string(s.dst_step));
        } else {
          if (s.src_step > 0) {
            read_end(me.kv[g0.slot_of(s.src_step)]);
            if (count_forwards) count_freed(r, s.src_step);
          }
          write_end(dst, l, chunk, B + g0.forwards_out(s.dst_step));
          st[s.peer].nvl_flags[g0.arrived_flag(s.dst_step)] = l;
          ++rep.nvlink_chunk_transfers;
        }
        break;
      }
      case kRingReceive: {
        Slot& dst = me.kv[g0.slot_of(s.dst_step)];
        const uint32_t chunk = L.rail_peer(r, s.node);
        if (g0.source_of(r, s.dst_step) != chunk) fail(who + ": receives a chunk its step does not attend to");
        if (phase == 0) {
          read_begin(me.net[s.node], l, chunk, who, "its network slot " + std::to_string(s.node));
          write_begin(dst, who, "its slot of step " + std::to_string(s.dst_step));
        } else {
          read_end(me.net[s.node]);
          write_end(dst, l, chunk, B + g0.forwards_out(s.dst_step));
          me.nvl_flags[g0.arrived_flag(s.dst_step)] = l;
        }
        break;
      }
    }
  };
  auto attn_ready = [&](uint32_t r, uint32_t b) -> bool {
    RankState& me = st[r];
    Agent& a = me.attn[b];
    if (!me.running || a.done) return false;
    if (a.next >= R || a.phase == 1 || a.next == 0) return true;
    return me.nvl_flags[g0.arrived_flag(static_cast<uint32_t>(a.next))] >= me.launch;
  };
  auto attn_event = [&](uint32_t r, uint32_t b) {
    RankState& me = st[r];
    Agent& a = me.attn[b];
    if (a.next >= R) {
      if (a.late != 0) count_freed(r, a.late);
      a.late = 0;
      a.done = true;
      return;
    }
    const uint32_t t = static_cast<uint32_t>(a.next);
    const uint32_t src = g0.source_of(r, t);
    if (a.phase == 0) {
      if (a.late != 0) count_freed(r, a.late);  // the next chunk arrived (attn_ready waited for it)
      a.late = 0;
      if (t > 0)
        read_begin(me.kv[g0.slot_of(t)], me.launch, src,
                   rk(r) + " attention block " + std::to_string(b) + " at step " + std::to_string(t),
                   "its slot " + std::to_string(g0.slot_of(t)));
      a.phase = 1;
      return;
    }
    if (t > 0) {
      read_end(me.kv[g0.slot_of(t)]);
      if (late_count) {
        a.late = t;
      } else {
        count_freed(r, t);
      }
    }
    if (b == 0) ++me.seen[src];
    a.phase = 0;
    ++a.next;
  };
  auto deliver = [&](size_t i) {
    const Message m = wire[i];
    wire[i] = wire.back();
    wire.pop_back();
    RankState& to = st[m.to];
    if (!m.put) {
      to.net_flags[m.flag] = std::max<uint64_t>(to.net_flags[m.flag], m.launch);
      return;
    }
    const std::string who =
        "the put of rank " + std::to_string(m.from) + "'s chunk (launch " + std::to_string(m.launch) + ")";
    write_begin(to.net[m.slot], who, rk(m.to) + "'s network slot " + std::to_string(m.slot));
    write_end(to.net[m.slot], m.launch, m.chunk, 1);
    read_end(st[m.from].net[m.slot]);  // the staging slot: one put fewer reads it
    to.net_flags[g0.arrival_flag(m.slot)] = std::max<uint64_t>(to.net_flags[g0.arrival_flag(m.slot)], m.launch);
  };

  std::mt19937_64 rng(o.seed);
  std::vector<std::pair<int, uint32_t>> runnable;  // (kind: -3 - b comm, 1 + b attention, -1 wire, -2 end), rank/index
  while (ranks_finished < R && rep.error.empty()) {
    runnable.clear();
    for (uint32_t r = 0; r < R; ++r) {
      RankState& me = st[r];
      if (!me.running) continue;
      bool all_done = true;
      for (uint32_t cb = 0; cb < C; ++cb) {
        all_done = all_done && me.comm[cb].done;
        if (comm_ready(r, cb)) runnable.emplace_back(-3 - static_cast<int>(cb), r);
      }
      for (uint32_t b = 0; b < B; ++b) {
        all_done = all_done && me.attn[b].done;
        if (attn_ready(r, b)) runnable.emplace_back(1 + static_cast<int>(b), r);
      }
      if (all_done) runnable.emplace_back(-2, r);
    }
    for (size_t i = 0; i < wire.size(); ++i) runnable.emplace_back(-1, static_cast<uint32_t>(i));
    if (runnable.empty()) {
      std::string waiting;
      for (uint32_t r = 0; r < R && waiting.size() < 600; ++r) {
        const RankState& me = st[r];
        if (!me.running) continue;
        for (uint32_t cb = 0; cb < C; ++cb)
          if (!me.comm[cb].done && me.comm[cb].next < plan[r].size())
            waiting += "; " + item_name(r, plan[r][me.comm[cb].next]) + " (comm block " + std::to_string(cb) + ")";
        for (uint32_t b = 0; b < B; ++b)
          if (!me.attn[b].done)
            waiting +=
                "; " + rk(r) + " attention block " + std::to_string(b) + " at step " + std::to_string(me.attn[b].next);
      }
      fail("deadlock: nobody can move (launches under way" + waiting + ")");
      break;
    }
    const auto [kind, who] = runnable[std::uniform_int_distribution<size_t>(0, runnable.size() - 1)(rng)];
    ++rep.events;
    if (kind <= -3)
      comm_event(who, static_cast<uint32_t>(-3 - kind));
    else if (kind > 0)
      attn_event(who, static_cast<uint32_t>(kind - 1));
    else if (kind == -1)
      deliver(who);
    else
      end_launch(who);
  }
  // Signals of the last launch may still be on the wire; nothing else may be.
  for (const Message& m : wire)
    if (m.put && rep.error.empty()) fail("a put of rank " + std::to_string(m.from) + " was never delivered");
  return rep;
}

}  // namespace mkernel::kernels
