// ring_attention_bench: the fused ring attention (ops.h RingAttention) beside, in the same run and
// on the same inputs, its floor: R times our attention core alone on one rank's block
// (`mkernel_attention_xR`: s_local queries over s_local keys, full, or causal for the causal
// placements; the ring's work per rank is R such blocks, so a ring that hides its communication
// takes this long). The SDPA + NCCL send/recv rings are ring_attention_torch.py's (run both with
// run_ring_on_gpu_machine.sh; the table there reads both from the JSON lines).
//
// Ranks are threads of this process (tests/gpu/fused/fused_harness.h), one per GPU; one mkerneld
// (one node: the NVLink path) or with --nodes one mkerneld per rank (every rank a node: the proxy
// path, host-staged, over --provider). Shapes: B = 1, --heads / --heads-kv, --dim, the whole
// sequence --seqs (each a multiple of 2 x world), --mask full, causal (zigzag) and/or contiguous.
// Random bf16 inputs. Before timing, one launch is checked for finite outputs and a clean status.
// Timing: warm-up, then --rounds rounds that take turns between the implementations, --iters
// launches per implementation in all, each timed with CUDA events on rank 0; medians (p10, p90)
// printed with ratios last and appended as JSON lines to --jsonl (impl "mkernel" and
// "mkernel_attention_xR", "causal" and "placement" in "shape").
//
//   ring_attention_bench [--world W] [--nodes] [--provider shm] [--seqs 32768,131072] [--heads 32]
//                        [--heads-kv 32] [--dim 128] [--mask full,causal,contiguous] [--iters 20]
//                        [--rounds 4] [--slots N] [--comm-blocks N] [--jsonl FILE] [--commit C]
//                        [--machine M]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>
#include <string>
#include <vector>

#include "attention/attention_test_util.cuh"
#include "attention/sm90_attention.h"
#include "fused_harness.h"
#include "mkernel/runtime/ops.h"
#include "mkernel/runtime/runtime.h"

namespace rt = mkernel::rt;
namespace mk = mkernel::kernels;

namespace {

struct Args {
  uint32_t world = 0;  // 0: every GPU
  bool nodes = false;
  std::string provider = "shm";
  std::vector<uint64_t> seqs = {32768, 131072};
  uint32_t heads = 32, heads_kv = 32, dim = 128;
  std::vector<std::string> masks = {"full", "causal"};
  int iters = 20, rounds = 4;
  uint32_t slots = 0;
  int comm_blocks = 0;
  std::string jsonl, commit = "unknown", machine = "unknown";
};

struct Stat {
  double median = 0, p10 = 0, p90 = 0;
  int n = 0;
};
Stat stat_of(std::vector<float> v) {
  Stat s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.n = static_cast<int>(v.size());
  s.median = v[v.size() / 2];
  s.p10 = v[v.size() / 10];
  s.p90 = v[(v.size() * 9) / 10];
  return s;
}

std::mutex g_print;

struct Row {
  uint64_t seq;
  std::string mask;
  Stat ring, floor;
  std::string config;
  double flops = 0;
  bool ok = false;
};

}  // namespace

int main(int argc, char** argv) {
  ::setenv("CUDA_MODULE_LOADING", "EAGER", 1);
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--world")
      args.world = static_cast<uint32_t>(std::stoul(next()));
    else if (a == "--nodes")
      args.nodes = true;
    else if (a == "--provider")
      args.provider = next();
    else if (a == "--seqs") {
      args.seqs.clear();
      for (const auto& s : mkt::split_commas(next())) args.seqs.push_back(std::stoull(s));
    } else if (a == "--heads")
      args.heads = static_cast<uint32_t>(std::stoul(next()));
    else if (a == "--heads-kv")
      args.heads_kv = static_cast<uint32_t>(std::stoul(next()));
    else if (a == "--dim")
      args.dim = static_cast<uint32_t>(std::stoul(next()));
    else if (a == "--mask")
      args.masks = mkt::split_commas(next());
    else if (a == "--iters")
      args.iters = std::stoi(next());
    else if (a == "--rounds")
      args.rounds = std::stoi(next());
    else if (a == "--slots")
      args.slots = static_cast<uint32_t>(std::stoul(next()));
    else if (a == "--comm-blocks")
      args.comm_blocks = std::stoi(next());
    else if (a == "--jsonl" || a == "--json")
      args.jsonl = next();
    else if (a == "--commit")
      args.commit = next();
    else if (a == "--machine")
      args.machine = next();
    else {
      std::printf("ring_attention_bench: unknown argument %s (see the top of ring_attention_bench.cu)\n", a.c_str());
      return 2;
    }
  }
  mkt::require_gpus_or_skip("ring_attention_bench", 1);
  int gpus = 0;
  (void)cudaGetDeviceCount(&gpus);
  const uint32_t R = args.world != 0 ? args.world : static_cast<uint32_t>(gpus);
  if (R > static_cast<uint32_t>(gpus)) {
    std::printf(
        "ring_attention_bench: --world %u needs a GPU per rank (found %d); timings of ranks sharing a GPU mean "
        "nothing\n",
        R, gpus);
    return 2;
  }
  fused_test::Topology topo{args.nodes ? R : 1, args.nodes ? 1 : R, args.provider};
  fused_test::Cluster cluster(topo, "ringbench");
  if (!cluster.start()) return 1;

  // The largest shape sizes the workspace.
  rt::RingAttentionShape biggest;
  biggest.heads_q = args.heads;
  biggest.heads_kv = args.heads_kv;
  biggest.head_dim = args.dim;
  biggest.s_local = *std::max_element(args.seqs.begin(), args.seqs.end()) / R;
  rt::Options o;
  o.nvlink_bytes =
      std::max<uint64_t>(1 << 20, rt::ring_attention_nvlink_bytes(topo.nodes, topo.gpus, biggest, args.slots));
  o.network_workspace_bytes = rt::ring_attention_network_bytes(topo.nodes, biggest);
  o.fused_flags = std::max<uint32_t>(4096, rt::ring_attention_fused_flags(topo.nodes, topo.gpus));
  o.device_wait_timeout_ns = 20'000'000'000ull;
  o.rendezvous_timeout = std::chrono::milliseconds(120000);

  std::vector<Row> rows;
  for (uint64_t S : args.seqs)
    for (const auto& m : args.masks) rows.push_back(Row{S, m, {}, {}, "", 0, false});

  const int failed = fused_test::run_ranks_in_threads(
      cluster, o, {4096},
      [&](uint32_t rank, rt::Communicator& comm, cudaStream_t stream, const fused_test::RankSync& sync) {
        for (Row& row : rows) {
          if (row.seq % (2ull * R) != 0) {
            if (rank == 0)
              std::printf("skip S = %llu: not a multiple of 2 x world\n", static_cast<unsigned long long>(row.seq));
            continue;
          }
          rt::RingAttentionShape sh = biggest;
          sh.s_local = row.seq / R;
          sh.placement = row.mask == "full"     ? rt::RingPlacement::kNonCausal
                         : row.mask == "causal" ? rt::RingPlacement::kCausalZigzag
                                                : rt::RingPlacement::kCausalContiguous;
          const uint64_t q_elems = uint64_t{sh.heads_q} * sh.s_local * sh.head_dim;
          const uint64_t kv_elems = uint64_t{sh.heads_kv} * sh.s_local * sh.head_dim;
          __nv_bfloat16 *q, *k, *v, *out;
          float* lse;
          void* ws = nullptr;
          if (cudaMalloc(&q, q_elems * 2) || cudaMalloc(&k, kv_elems * 2) || cudaMalloc(&v, kv_elems * 2) ||
              cudaMalloc(&out, q_elems * 2) || cudaMalloc(&lse, sh.heads_q * sh.s_local * 4) ||
              cudaMalloc(&ws, 1 << 20) || cudaMemset(ws, 0, 1 << 20))
            return 1;
          attn_test::fill_random(q, q_elems, 11 + rank, 1.0f, stream);
          attn_test::fill_random(k, kv_elems, 23 + rank, 1.0f, stream);
          attn_test::fill_random(v, kv_elems, 37 + rank, 1.0f, stream);
          (void)cudaStreamSynchronize(stream);
          sync();
          rt::RingAttentionConfig cfg;
          cfg.slots = args.slots;
          cfg.comm_blocks = args.comm_blocks;
          auto made = rt::RingAttention::create(comm, sh, cfg, stream);
          if (!made.ok()) {
            std::lock_guard<std::mutex> l(g_print);
            std::printf("rank %u: create: %s\n", rank, made.status().to_string().c_str());
            return 1;
          }
          auto& op = *made.value();
          // The floor: our core alone on one rank's block, full or causal.
          mk::AttnArgs one;
          one.q = q;
          one.k = k;
          one.v = v;
          one.o = out;
          one.lse = lse;
          one.batch = 1;
          one.heads_q = sh.heads_q;
          one.heads_kv = sh.heads_kv;
          one.seq_q = static_cast<int64_t>(sh.s_local);
          one.seq_kv = static_cast<int64_t>(sh.s_local);
          one.head_dim = sh.head_dim;
          one.causal = sh.placement != rt::RingPlacement::kNonCausal;
          one.workspace = ws;
          one.workspace_bytes = 1 << 20;
          mk::AttnPlan core;
          if (!mk::attention_plan(one, &core).ok()) return 1;
          // Check one launch.
          const mkernel::Status s0 = op.launch(q, k, v, out, lse, stream);
          (void)cudaStreamSynchronize(stream);
          const mkernel::Status st = comm.check();
          const std::vector<float> lse_h = attn_test::to_host(lse, sh.heads_q * sh.s_local);
          size_t bad = 0;
          for (float x : lse_h) bad += !std::isfinite(x);
          if (!s0.ok() || !st.ok() || bad != 0) {
            std::lock_guard<std::mutex> l(g_print);
            std::printf("rank %u: S %llu %s: launch %s, status %s, %zu non-finite lse\n", rank,
                        static_cast<unsigned long long>(row.seq), row.mask.c_str(), s0.to_string().c_str(),
                        st.to_string().c_str(), bad);
            return 1;
          }
          cudaEvent_t e0, e1;
          (void)cudaEventCreate(&e0);
          (void)cudaEventCreate(&e1);
          std::vector<float> t_ring, t_floor;
          auto time = [&](auto&& fn, std::vector<float>* out_t, int n) {
            for (int i = 0; i < n; ++i) {
              (void)cudaEventRecord(e0, stream);
              fn();
              (void)cudaEventRecord(e1, stream);
              (void)cudaEventSynchronize(e1);
              float ms = 0;
              (void)cudaEventElapsedTime(&ms, e0, e1);
              if (out_t != nullptr) out_t->push_back(ms);
            }
          };
          auto ring = [&] { (void)op.launch(q, k, v, out, lse, stream); };
          auto floor = [&] {
            for (uint32_t i = 0; i < R; ++i) (void)mk::attention_launch(core, stream);
          };
          sync();
          time(ring, nullptr, 3);
          time(floor, nullptr, 2);
          const int per = std::max(1, args.iters / std::max(1, args.rounds));
          for (int rd = 0; rd < args.rounds; ++rd) {
            sync();
            time(ring, &t_ring, per);
            sync();
            time(floor, &t_floor, per);
          }
          (void)cudaStreamSynchronize(stream);
          if (!comm.check().ok()) return 1;
          if (rank == 0) {
            row.ring = stat_of(t_ring);
            row.floor = stat_of(t_floor);
            row.config = op.describe();
            row.flops = op.flops();
            row.ok = true;
          }
          sync();
          (void)cudaEventDestroy(e0);
          (void)cudaEventDestroy(e1);
          made.value().reset();
          for (void* p : {static_cast<void*>(q), static_cast<void*>(k), static_cast<void*>(v), static_cast<void*>(out),
                          static_cast<void*>(lse), ws})
            (void)cudaFree(p);
          sync();
        }
        return 0;
      });

  char date[16];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y-%m-%d", std::gmtime(&now));
  FILE* jl = nullptr;
  if (!args.jsonl.empty() && (jl = std::fopen(args.jsonl.c_str(), "a")) == nullptr)
    std::printf("ring_attention_bench: cannot open %s for appending: %s\n", args.jsonl.c_str(), std::strerror(errno));
  std::printf("\nring attention, %u rank(s)%s, H %u/%u, D %u (rank 0, ms)\n", R, args.nodes ? " as nodes" : "",
              args.heads, args.heads_kv, args.dim);
  std::printf("%-8s %-10s %10s %10s %8s %8s  %s\n", "S", "mask", "mkernel", "core x R", "TFLOP/s", "ratio", "config");
  for (const Row& row : rows) {
    if (!row.ok) continue;
    const double tf = row.flops / (row.ring.median * 1e-3) / 1e12;
    std::printf("%-8llu %-10s %10.3f %10.3f %8.1f %8.3f  %s\n", static_cast<unsigned long long>(row.seq),
                row.mask.c_str(), row.ring.median, row.floor.median, tf, row.ring.median / row.floor.median,
                row.config.c_str());
    if (jl == nullptr) continue;
    const char* placement = row.mask == "full" ? "none" : (row.mask == "causal" ? "zigzag" : "contiguous");
    const struct {
      const char* impl;
      const Stat& s;
    } impls[] = {{"mkernel", row.ring}, {"mkernel_attention_xR", row.floor}};
    for (const auto& x : impls)
      std::fprintf(jl,
                   "{\"benchmark\": \"ring_attention\", \"shape\": {\"B\": 1, \"H\": %u, \"H_kv\": %u, \"S\": %llu, "
                   "\"D\": %u, \"causal\": %s, \"placement\": \"%s\", \"layout\": \"BHSD\"}, \"world\": %u, "
                   "\"nodes\": %u, \"impl\": \"%s\", \"median_ms\": %.4f, \"p10_ms\": %.4f, \"p90_ms\": %.4f, "
                   "\"iters\": %d, \"config\": \"%s\", \"machine\": \"%s\", \"commit\": \"%s\", \"date\": \"%s\"}\n",
                   args.heads, args.heads_kv, static_cast<unsigned long long>(row.seq), args.dim,
                   row.mask == "full" ? "false" : "true", placement, R, topo.nodes, x.impl, x.s.median, x.s.p10,
                   x.s.p90, x.s.n, row.config.c_str(), args.machine.c_str(), args.commit.c_str(), date);
  }
  if (jl != nullptr) std::fclose(jl);
  return failed == 0 ? 0 : 1;
}
