// The AllGather+GEMM movement plan (kernels/fused/ag_gemm/ag_gemm_plan.h), replayed on the CPU
// for every layout up to 8 nodes x 8 GPUs and odd ones, with several launches in a row, several
// communication block counts and random interleavings: every rank receives every chunk of every
// shard exactly once per launch before its GEMM reads it, nothing is overwritten while it may
// still be read, each chunk crosses the network once per destination node, and nobody waits on
// a flag nobody raises; also with the pushes of the own rows by copy engines (plan note 5).
#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <string>

#include "fused/ag_gemm/ag_gemm_plan.h"
#include "fused/ag_gemm/ag_trace.h"

namespace mk = mkernel::kernels;

namespace {

std::string layout_name(const mk::FusedLayout& l) {
  return std::to_string(l.nodes) + "x" + std::to_string(l.gpus);
}

TEST(AgGemmPlan, EveryLayoutUpTo8x8) {
  for (const bool ce : {false, true})
    for (uint32_t nodes = 1; nodes <= 8; ++nodes)
      for (uint32_t gpus = 1; gpus <= 8; ++gpus) {
        const mk::FusedLayout l{nodes, gpus};
        for (uint32_t blocks : {1u, 3u}) {
          mk::AgReplayOptions o;
          o.launches = 3;
          o.comm_blocks = blocks;
          o.seed = nodes * 131 + gpus * 7 + blocks + (ce ? 5000 : 0);
          o.copy_engine_pushes = ce;
          // 300 rows in chunks of 128: 3 chunks, the last short.
          const mk::AgReplayReport r = mk::ag_replay(l, 300, 128, o);
          EXPECT_EQ(r.error, "") << layout_name(l) << " with " << blocks << " blocks, copy engines " << ce;
          EXPECT_EQ(r.network_chunk_transfers, uint64_t{3} * l.world() * (nodes - 1) * 3) << layout_name(l);
          EXPECT_EQ(r.nvlink_chunk_transfers, uint64_t{3} * l.world() * (gpus - 1) * nodes * 3) << layout_name(l);
          if (nodes > 1) {
            EXPECT_EQ(r.max_network_sends_per_shard_node, 1u) << layout_name(l);
          }
        }
      }
}

TEST(AgGemmPlan, OddLayoutsAndShapes) {
  struct Case {
    mk::FusedLayout l;
    uint32_t m_local, chunk_rows;
  };
  for (const Case& c : {Case{{3, 2}, 1, 1}, Case{{1, 5}, 77, 0}, Case{{3, 2}, 1000, 0}, Case{{2, 3}, 129, 128},
                        Case{{5, 1}, 4096, 0}, Case{{4, 2}, 64, 16}, Case{{7, 3}, 333, 100}}) {
    for (uint64_t seed = 1; seed <= 5; ++seed) {
      mk::AgReplayOptions o;
      o.launches = 4;
      o.comm_blocks = static_cast<uint32_t>(seed);
      o.seed = seed;
      o.copy_engine_pushes = seed % 2 == 0;
      const mk::AgReplayReport r = mk::ag_replay(c.l, c.m_local, c.chunk_rows, o);
      EXPECT_EQ(r.error, "") << layout_name(c.l) << " m_local " << c.m_local << " seed " << seed << " copy engines "
                             << o.copy_engine_pushes;
    }
  }
}

// Each rank's list: one local step per chunk; pushes only to its own node; sends only when the
// ranks span nodes; a receive for every chunk of every other node; every forward push comes after
// the receive it forwards.
TEST(AgGemmPlan, StepsOfOneRank) {
  const mk::FusedLayout l{3, 4};
  for (uint32_t r = 0; r < l.world(); ++r) {
    mk::AgGeometry g{l, r, 1000, 4096, mk::ag_default_chunk_rows(1000)};
    ASSERT_EQ(mk::ag_check_geometry(g), "");
    const auto steps = mk::ag_steps(g);
    std::set<std::pair<uint32_t, uint32_t>> received;
    uint32_t locals = 0, sends = 0, pushes = 0;
    for (const mk::AgStep& s : steps) {
      switch (s.kind) {
        case mk::kAgLocal: ++locals; EXPECT_EQ(s.shard, r); break;
        case mk::kAgSend: ++sends; EXPECT_EQ(s.node, l.node_of(r)); break;
        case mk::kAgReceive:
          EXPECT_NE(s.node, l.node_of(r));
          EXPECT_EQ(l.local_of(s.shard), l.local_of(r));
          received.insert({s.shard, s.chunk});
          break;
        case mk::kAgPush:
          ++pushes;
          EXPECT_EQ(l.node_of(s.peer), l.node_of(r));
          EXPECT_NE(s.peer, r);
          if (s.shard != r) {
            EXPECT_TRUE(received.count({s.shard, s.chunk})) << "forward before receive";
          }
          break;
      }
    }
    EXPECT_EQ(locals, g.chunks());
    EXPECT_EQ(sends, g.chunks());
    EXPECT_EQ(received.size(), size_t{2} * g.chunks());
    EXPECT_EQ(pushes, 3 * g.chunks() * 3);  // own + two forwarded shards, to three node peers
  }
}

// The first peer a rank sends to is the one that computes the rank's rows next (rank - 1).
TEST(AgGemmPlan, SendOrderFollowsConsumption) {
  const mk::FusedLayout l{1, 4};
  EXPECT_EQ(l.node_peer(2, 1), 1u);
  EXPECT_EQ(l.node_peer(0, 1), 3u);
  const mk::FusedLayout n{4, 1};
  EXPECT_EQ(n.send_node(0, 1), 3u);
  EXPECT_EQ(n.recv_node(0, 1), 1u);
}

// The replay's checks fail on broken plans (so a passing replay means something).
TEST(AgGemmPlan, ReplayCatchesBrokenPlans) {
  struct Case {
    mk::AgPlanFault fault;
    mk::FusedLayout l;
    const char* expect;
    bool ce = false;  // copy-engine pushes: the fault hits a copy agent (a dropped copy, an open gate)
  };
  for (const Case& c : {Case{mk::AgPlanFault::kDropLastPush, {2, 2}, "GEMM waits for piece"},
                        Case{mk::AgPlanFault::kDropLastPush, {1, 2}, "GEMM waits for piece", true},
                        Case{mk::AgPlanFault::kDropLastPush, {2, 3}, "GEMM waits for piece", true},
                        Case{mk::AgPlanFault::kNoPeerFreeWait, {1, 4}, "still runs", true},
                        Case{mk::AgPlanFault::kNoPeerFreeWait, {1, 4}, "still runs"},
                        Case{mk::AgPlanFault::kNoPeerFreeWait, {4, 1}, "may still read"},
                        Case{mk::AgPlanFault::kSendTwice, {2, 2}, "each chunk once per other node"},
                        Case{mk::AgPlanFault::kReceiveUnflagged, {2, 2}, "not this launch's"},
                        Case{mk::AgPlanFault::kForwardFirst, {2, 2}, "deadlock"}}) {
    bool caught = false;
    std::string seen;
    // Races show up in some interleavings only: try several.
    for (uint64_t seed = 1; seed <= 60 && !caught; ++seed) {
      mk::AgReplayOptions o;
      o.launches = 3;
      o.comm_blocks = c.fault == mk::AgPlanFault::kForwardFirst ? 1 : 2;
      o.seed = seed;
      o.fault = c.fault;
      o.copy_engine_pushes = c.ce;
      const mk::AgReplayReport r = mk::ag_replay(c.l, 256, 128, o);
      seen = r.error;
      caught = r.error.find(c.expect) != std::string::npos;
    }
    EXPECT_TRUE(caught) << "fault " << static_cast<int>(c.fault) << " on " << layout_name(c.l) << " (copy engines "
                        << c.ce << ") not caught; last error: \"" << seen << "\"";
  }
}

// The split is exact: the blocks' steps and the copy lists together are the plan, each list in
// the plan's order, every own chunk once to its peer, nothing else.
TEST(AgGemmPlan, CopyEnginePushesSplitThePlan) {
  const mk::FusedLayout l{3, 4};
  for (uint32_t r = 0; r < l.world(); ++r) {
    const mk::AgGeometry g{l, r, 1000, 4096, 256};
    const auto all = mk::ag_steps(g);
    const auto blocks = mk::ag_block_steps(g, true);
    const auto lists = mk::ag_copy_engine_pushes(g);
    EXPECT_EQ(mk::ag_block_steps(g, false).size(), all.size());
    ASSERT_EQ(lists.size(), l.gpus);
    EXPECT_TRUE(lists[0].empty());
    size_t copied = 0;
    for (uint32_t i = 1; i < l.gpus; ++i) {
      ASSERT_EQ(lists[i].size(), g.chunks()) << "peer index " << i;
      for (uint32_t c = 0; c < g.chunks(); ++c) {
        const mk::AgStep& s = lists[i][c];
        EXPECT_EQ(s.kind, mk::kAgPush);
        EXPECT_EQ(s.shard, r);
        EXPECT_EQ(s.chunk, c) << "in plan order";
        EXPECT_EQ(s.peer, l.node_peer(r, i));
      }
      copied += lists[i].size();
    }
    EXPECT_EQ(blocks.size() + copied, all.size());
    for (const mk::AgStep& s : blocks) EXPECT_FALSE(s.kind == mk::kAgPush && s.shard == r) << "an own push left";
    // The blocks keep the plan's order for what is theirs.
    size_t j = 0;
    for (const mk::AgStep& s : all)
      if (j < blocks.size() && std::memcmp(&s, &blocks[j], sizeof(s)) == 0) ++j;
    EXPECT_EQ(j, blocks.size());
  }
  // One GPU per node: nothing for the copy engines.
  const mk::AgGeometry g{mk::FusedLayout{4, 1}, 2, 512, 64, 128};
  EXPECT_EQ(mk::ag_block_steps(g, true).size(), mk::ag_steps(g).size());
}

// The copies the copy engines make, in bytes (what the launcher adds base pointers to): each
// node peer's copies fill exactly the rank's rows of the peer's gathered buffer from A_r, chunk
// by chunk in plan order, each raising that chunk's ready() flag; the gathered output's copies
// cover every other rank's rows once, each behind its own gate, in the order the kernel opens
// them (shard by shard).
TEST(AgGemmPlan, CopyEngineCopiesInBytes) {
  constexpr uint64_t kFlags = uint64_t{1} << 40;  // where the fused-op flags start (past any data)
  const mk::FusedLayout layouts[] = {{1, 2}, {1, 5}, {2, 3}, {1, 8}};
  for (const mk::FusedLayout& l : layouts)
    for (const uint32_t m_local : {1u, 300u, 1024u})
      for (uint32_t r = 0; r < l.world(); ++r) {
        const mk::AgGeometry g{l, r, m_local, 264, m_local == 1 ? 1u : 128u};
        const auto peers = mk::ag_copy_engine_copies(g, kFlags);
        ASSERT_EQ(peers.size(), l.gpus);
        EXPECT_TRUE(peers[0].empty());
        for (uint32_t i = 1; i < l.gpus; ++i) {
          uint64_t next = 0;
          for (const mk::AgCopy& c : peers[i]) {
            EXPECT_EQ(c.gate, i);
            EXPECT_EQ(c.shard, r);
            EXPECT_EQ(c.src_offset, next) << "contiguous, in order";
            EXPECT_EQ(c.dst_offset, r * g.shard_bytes() + next);
            EXPECT_EQ(c.flag_offset, kFlags + 8 * uint64_t{g.ready_flag(r, c.chunk)});
            EXPECT_LT(g.ready_flag(r, c.chunk), g.nvl_flags_needed());
            EXPECT_GT(c.bytes, 0u);
            next += c.bytes;
          }
          EXPECT_EQ(next, g.shard_bytes()) << "the whole shard to peer index " << i;
        }
        const auto out = mk::ag_gathered_out_copies(g);
        std::set<uint32_t> gates;
        uint64_t covered = 0;
        uint32_t last_gate = 0;
        for (const mk::AgCopy& c : out) {
          EXPECT_NE(c.shard, r) << "the own rows go by the plain copy";
          EXPECT_EQ(c.gate, c.shard * g.chunks() + c.chunk);
          EXPECT_TRUE(gates.insert(c.gate).second) << "one gate per chunk";
          EXPECT_TRUE(gates.size() == 1 || c.gate > last_gate) << "in the kernel's order";
          last_gate = c.gate;
          EXPECT_EQ(c.src_offset, c.dst_offset);
          EXPECT_EQ(c.dst_offset, c.shard * g.shard_bytes() + uint64_t{c.chunk} * g.chunk_rows * g.row_bytes());
          EXPECT_EQ(c.flag_offset, mk::kAgNoFlag);
          covered += c.bytes;
        }
        EXPECT_EQ(covered, (l.world() - 1) * g.shard_bytes());
        EXPECT_EQ(out.size(), size_t{l.world() - 1} * g.chunks());
      }
}

// The trace's report (ag_trace.h) reads the stamps where the kernel writes them: a push of 4 MiB
// that became ready 10 us in and was published 30 us in moved 4194304 B / 20000 ns = 209.7 GB/s.
TEST(AgGemmPlan, TraceReport) {
  const mk::AgGeometry g{mk::FusedLayout{1, 2}, 0, 1024, 4096, 512};  // 2 chunks of 512 rows, 4 MiB
  const auto steps = mk::ag_block_steps(g, false);
  const uint32_t pieces = 2 * g.chunks();
  std::vector<uint64_t> t(mk::ag_trace_words(static_cast<uint32_t>(steps.size()), pieces), 0);
  EXPECT_NE(mk::ag_trace_report(g, steps, t).find("did not start"), std::string::npos);
  EXPECT_NE(mk::ag_trace_report(g, steps, std::vector<uint64_t>(3, 1)).find("expected"), std::string::npos);
  const uint64_t t0 = 1'000'000'000;
  t[mk::kAgTraceStart] = t0;
  t[mk::kAgTraceStepsDone] = t0 + 50'000;
  t[mk::kAgTraceEnd] = t0 + 700'000;
  size_t push = steps.size();
  for (size_t i = 0; i < steps.size(); ++i)
    if (steps[i].kind == mk::kAgPush) {
      push = i;
      break;
    }
  ASSERT_LT(push, steps.size());
  uint64_t* st = t.data() + mk::ag_trace_step(static_cast<uint32_t>(push));
  st[mk::kAgTraceWaitFrom] = t0 + 5'000;
  st[mk::kAgTraceInputsReady] = t0 + 10'000;
  st[mk::kAgTraceSliceDone] = t0 + 29'000;
  st[mk::kAgTracePublished] = t0 + 30'000;
  t[mk::ag_trace_arrival(static_cast<uint32_t>(steps.size()), 1 * g.chunks() + 1)] = t0 + 123'400;
  const std::string r = mk::ag_trace_report(g, steps, t);
  EXPECT_NE(r.find("launch end 700.0"), std::string::npos) << r;
  EXPECT_NE(r.find("gates open -"), std::string::npos) << r;
  EXPECT_NE(r.find("push"), std::string::npos) << r;
  EXPECT_NE(r.find("4194304"), std::string::npos) << r;
  EXPECT_NE(r.find("209.7"), std::string::npos) << r;
  EXPECT_NE(r.find("shard 1: - 123.4"), std::string::npos) << r;
  EXPECT_EQ(r.find("shard 0:"), std::string::npos) << "the own rows are not listed\n" << r;
}

// Which own chunks a kAgLocal step copies: those a 128-row tile reaching outside the rank's
// rows reads. 2 ranks x 300 rows in chunks of 128: tile [256, 384) spans both ranks.
TEST(AgGemmPlan, StraddledChunks) {
  const mk::AgGeometry r0{mk::FusedLayout{1, 2}, 0, 300, 64, 128}, r1{mk::FusedLayout{1, 2}, 1, 300, 64, 128};
  EXPECT_FALSE(r0.straddled(0));
  EXPECT_FALSE(r0.straddled(1));
  EXPECT_TRUE(r0.straddled(2));   // rows 256 .. 299
  EXPECT_TRUE(r1.straddled(0));   // rows 300 .. 427
  EXPECT_FALSE(r1.straddled(1));  // rows 428 .. 555
  EXPECT_FALSE(r1.straddled(2));  // rows 556 .. 599: the last tile is clipped at M = 600
  const mk::AgGeometry whole{mk::FusedLayout{1, 4}, 2, 512, 64, 128};
  for (uint32_t c = 0; c < whole.chunks(); ++c) EXPECT_FALSE(whole.straddled(c)) << "m_local a multiple of 128";
}

TEST(AgGemmPlan, Geometry) {
  EXPECT_EQ(mk::ag_default_chunk_rows(1), 1u);
  EXPECT_EQ(mk::ag_default_chunk_rows(100), 100u);
  EXPECT_EQ(mk::ag_default_chunk_rows(4096), 512u);
  EXPECT_EQ(mk::ag_default_chunk_rows(1000), 128u);
  mk::AgGeometry g{{2, 4}, 5, 1000, 4096, 128};
  EXPECT_EQ(g.chunks(), 8u);
  EXPECT_EQ(g.rows_of_chunk(7), 1000u - 7 * 128);
  EXPECT_EQ(g.nvl_flags_needed(), 8u * 8 + 8);
  EXPECT_EQ(g.net_flags_needed(), 2u * 8 + 2);
  EXPECT_EQ(g.nvl_bytes_needed(), uint64_t{8} * 1000 * 4096 * 2);
  EXPECT_EQ(g.net_bytes_needed(), uint64_t{2} * 1000 * 4096 * 2);
  mk::AgGeometry bad = g;
  bad.k = 100;
  EXPECT_NE(mk::ag_check_geometry(bad).find("k: 100"), std::string::npos);
  bad = g;
  bad.rank = 8;
  EXPECT_NE(mk::ag_check_geometry(bad).find("rank: 8"), std::string::npos);
  bad = g;
  bad.m_local = 0;
  EXPECT_NE(mk::ag_check_geometry(bad).find("m_local"), std::string::npos);
}

}  // namespace
