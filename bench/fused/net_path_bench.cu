// net_path_bench: where the time of AllGather+GEMM between nodes goes (the path through the
// proxies, host-staged), measurable on one GPU.
//
// Two emulated nodes of one rank each (fused_harness.h: one mkerneld per node over libfabric
// --provider, ranks as threads of this process, both kernels resident on GPU 0 with its SMs
// split between them). The SMs are shared, so the GEMM part of a shape runs on half the GPU;
// what this program is for is the network path itself, which runs for real: the sender's
// communication blocks stage each chunk in pinned host memory, its proxy writes it through
// libfabric into the peer's workspace with the arrival flag, and the receiver's blocks copy it
// into GPU memory. Shapes with a tiny n (N = 16: n_local = 8) time that path alone.
//
// Before timing each variant, the gathered output of --check-launches launches (fresh inputs for
// each) is checked bit for bit against the concatenation of the shards on both ranks. Timing:
// --iters launches per variant, both ranks released together before each (a barrier of their
// threads), each launch timed with CUDA events on its rank's stream; medians (p10, p90) of rank 0
// and of the slower rank per launch. Then one launch of the same plan with AllGatherGemmConfig::trace, and rank 0's report
// (each step's wait, copy and publication; each chunk's arrival) printed and, with --trace DIR,
// written there.
//
//   net_path_bench [--provider shm] [--shapes 8192x16x8192,8192x8192x8192] [--comm-blocks 4,8,16]
//                  [--chunk-rows 0,512] [--pieces auto,0] [--iters 10] [--check-launches 1]
//                  [--no-trace] [--trace DIR]
//                  [--jsonl FILE --commit C --machine M]
// --pieces: the daemons' transport.write_piece_bytes, one setting after another (fresh daemons
// for each; docs/config.md).
// Shapes are global as in ag_gemm_bench (M rows of the gathered activation over 2 ranks, N the
// whole weight's rows, K). Exit status: 0 when every check passed, 1 (with the reason printed)
// otherwise.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include "fused_harness.h"
#include "gemm/gemm_test_util.cuh"
#include "mkernel/runtime/ops.h"
#include "mkernel/runtime/runtime.h"

namespace {

namespace rt = mkernel::rt;

struct Shape {
  uint64_t m, n, k;
};

struct Args {
  std::string provider = "shm";
  std::vector<Shape> shapes = {{8192, 16, 8192}, {8192, 8192, 8192}};
  std::vector<int> comm_blocks = {4, 8, 16};
  std::vector<uint32_t> chunk_rows = {0};
  std::vector<std::string> pieces = {"auto"};
  int iters = 10;
  int check_launches = 1;
  bool trace = true;
  std::string trace_dir, jsonl, commit = "unknown", machine = "unknown";
};

struct Result {
  std::string pieces;
  Shape shape;
  int comm_blocks = 0;
  uint32_t chunk_rows = 0;
  std::string plan;
  double r0_med = 0, r0_p10 = 0, r0_p90 = 0, slow_med = 0;
};

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5)];
}

uint64_t shard_seed(uint64_t launch_seed, uint32_t shard) { return launch_seed * 7919 + shard * 104729 + 1; }

constexpr uint32_t kWorld = 2;
constexpr int kSmsPerRank = 66;  // half of the H200's 132: both ranks' kernels resident at once

}  // namespace

int main(int argc, char** argv) {
  ::setenv("CUDA_MODULE_LOADING", "EAGER", 1);  // fused_harness.h: nothing loads while a peer's kernel waits
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::printf("net_path_bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--provider") args.provider = next();
    else if (a == "--shapes") {
      args.shapes.clear();
      for (const std::string& s : mkt::split_commas(next())) {
        Shape sh{};
        if (std::sscanf(s.c_str(), "%lux%lux%lu", &sh.m, &sh.n, &sh.k) != 3) {
          std::printf("net_path_bench: --shapes entry \"%s\" is not MxNxK\n", s.c_str());
          return 2;
        }
        args.shapes.push_back(sh);
      }
    } else if (a == "--comm-blocks") {
      args.comm_blocks.clear();
      for (const std::string& s : mkt::split_commas(next())) args.comm_blocks.push_back(std::atoi(s.c_str()));
    } else if (a == "--chunk-rows") {
      args.chunk_rows.clear();
      for (const std::string& s : mkt::split_commas(next())) args.chunk_rows.push_back(static_cast<uint32_t>(std::atoi(s.c_str())));
    } else if (a == "--pieces") {
      args.pieces = mkt::split_commas(next());
    } else if (a == "--check-launches") {
      args.check_launches = std::atoi(next().c_str());
    } else if (a == "--iters") args.iters = std::atoi(next().c_str());
    else if (a == "--no-trace") args.trace = false;
    else if (a == "--trace") args.trace_dir = next();
    else if (a == "--jsonl") args.jsonl = next();
    else if (a == "--commit") args.commit = next();
    else if (a == "--machine") args.machine = next();
    else {
      std::printf("net_path_bench: unknown argument %s (see the comment at the top of net_path_bench.cu)\n", a.c_str());
      return 2;
    }
  }
  for (const Shape& s : args.shapes)
    if (s.m % kWorld != 0 || s.n % (8 * kWorld) != 0 || s.k % 8 != 0 || s.m == 0 || s.n == 0 || s.k == 0) {
      std::printf("net_path_bench: shape %lux%lux%lu does not split over 2 ranks (M %% 2, N %% 16, K %% 8, none 0)\n",
                  s.m, s.n, s.k);
      return 2;
    }
  for (int c : args.comm_blocks)
    if (c < 1 || c >= kSmsPerRank) {
      std::printf("net_path_bench: --comm-blocks %d: expected 1 .. %d (each rank has %d SMs)\n", c, kSmsPerRank - 1,
                  kSmsPerRank);
      return 2;
    }
  if (args.check_launches < 1) {
    std::printf("net_path_bench: --check-launches %d: expected at least 1\n", args.check_launches);
    return 2;
  }
  if (args.iters < 1) {
    std::printf("net_path_bench: --iters %d: expected at least 1\n", args.iters);
    return 2;
  }
  mkt::require_gpus_or_skip("net_path_bench", 1);
  gemm_test::require_hopper_or_skip("net_path_bench");

  uint64_t max_m_local = 0, max_k = 0;
  for (const Shape& s : args.shapes) {
    max_m_local = std::max(max_m_local, s.m / kWorld);
    max_k = std::max(max_k, s.k);
  }
  const fused_test::Topology topo{kWorld, 1, args.provider};
  rt::Options o;
  o.nvlink_bytes = rt::all_gather_gemm_nvlink_bytes(kWorld, max_m_local, max_k);
  o.network_workspace_bytes = rt::all_gather_gemm_network_bytes(kWorld, max_m_local, max_k);
  o.device_wait_timeout_ns = 20'000'000'000ull;
  o.rendezvous_timeout = std::chrono::milliseconds(60000);

  std::vector<Result> results;
  std::mutex results_mu;
  std::vector<std::string> traces;
  // Per launch, both ranks' elapsed ms (rank-major), filled by each rank's thread.
  std::vector<std::vector<double>> times(kWorld);

  int failed = 0;
  for (const std::string& pieces : args.pieces) {
    fused_test::Cluster cluster(topo, "netpath", "write_piece_bytes: " + pieces);
    if (!cluster.start()) {
      std::printf("net_path_bench: the emulated nodes' mkerneld did not start with write_piece_bytes %s (MKERNELD=%s)\n",
                  pieces.c_str(), std::getenv("MKERNELD") ? std::getenv("MKERNELD") : MKERNELD_PATH);
      return 1;
    }
    failed += fused_test::run_ranks_in_threads(
        cluster, o, {4096},
        [&](uint32_t rank, rt::Communicator& comm, cudaStream_t stream, const fused_test::RankSync& sync) -> int {
          int fails = 0;
          for (const Shape& sh : args.shapes) {
            const uint64_t m_local = sh.m / kWorld, n_local = sh.n / kWorld, k = sh.k;
            __nv_bfloat16 *a = nullptr, *w = nullptr, *c = nullptr, *g = nullptr, *a_all = nullptr;
            GT_CUDA(cudaMalloc(&a, 2 * m_local * k));
            GT_CUDA(cudaMalloc(&w, 2 * n_local * k));
            GT_CUDA(cudaMalloc(&c, 2 * sh.m * n_local));
            GT_CUDA(cudaMalloc(&g, 2 * sh.m * k));
            GT_CUDA(cudaMalloc(&a_all, 2 * sh.m * k));
            cudaEvent_t e0, e1;
            GT_CUDA(cudaEventCreate(&e0));
            GT_CUDA(cudaEventCreate(&e1));
            const uint64_t seed = 20261204 + sh.m * 31 + sh.k;
            gemm_test::fill_random(a, m_local * k, shard_seed(seed, rank), 1.0f, stream);
            gemm_test::fill_random(w, n_local * k, seed * 13 + rank, 1.0f, stream);
            for (uint32_t q = 0; q < kWorld; ++q)
              gemm_test::fill_random(a_all + q * m_local * k, m_local * k, shard_seed(seed, q), 1.0f, stream);
            std::vector<uint16_t> want(sh.m * k), got(sh.m * k);
            GT_CUDA(cudaMemcpyAsync(want.data(), a_all, want.size() * 2, cudaMemcpyDeviceToHost, stream));
            GT_CUDA(cudaStreamSynchronize(stream));
            for (const int cb : args.comm_blocks)
              for (const uint32_t cr : args.chunk_rows)
                for (int traced = 0; traced < (args.trace ? 2 : 1); ++traced) {
                  rt::AllGatherGemmConfig cfg;
                  cfg.comm_blocks = cb;
                  cfg.gemm_blocks = kSmsPerRank - cb;
                  cfg.cluster_m = 1;  // clusters of 2 could leave a rank's kernel partly resident on the split GPU
                  cfg.chunk_rows = cr;
                  cfg.trace = traced != 0;
                  sync();  // every rank done with its allocations and copies (fused_harness.h)
                  auto made = rt::AllGatherGemm::create(comm, m_local, n_local, k, cfg, stream);
                  RANK_CHECK(made.ok(), "create (comm_blocks %d, chunk_rows %u): %s", cb, cr,
                             made.status().to_string().c_str());
                  if (!made.ok()) return fails;
                  rt::AllGatherGemm& op = *made.value();
                  sync();
                  if (traced) {
                    // One launch with the trace, its report from rank 0.
                    const mkernel::Status s = op.launch(a, w, c, nullptr, stream);
                    RANK_CHECK(s.ok(), "traced launch: %s", s.to_string().c_str());
                    GT_CUDA(cudaStreamSynchronize(stream));
                    const mkernel::Status st = comm.check();
                    RANK_CHECK(st.ok(), "traced launch: check(): %s", st.to_string().c_str());
                    if (rank == 0) {
                      char head[160];
                      std::snprintf(head, sizeof(head), "== pieces %s, %lux%lux%lu, comm_blocks %d, chunk_rows %u (%s)\n",
                                    pieces.c_str(), sh.m, sh.n, sh.k, cb, cr, op.describe().c_str());
                      std::lock_guard<std::mutex> lock(results_mu);
                      traces.push_back(std::string(head) + op.trace_report());
                    }
                    sync();
                    continue;
                  }
                  // Checked: --check-launches launches, each with fresh inputs (stale rows would
                  // otherwise look right), their gathered output bit for bit on every rank.
                  for (int l = 0; l < args.check_launches; ++l) {
                    if (l > 0) {
                      const uint64_t ls = seed + 1000003 * static_cast<uint64_t>(l);
                      gemm_test::fill_random(a, m_local * k, shard_seed(ls, rank), 1.0f, stream);
                      for (uint32_t q = 0; q < kWorld; ++q)
                        gemm_test::fill_random(a_all + q * m_local * k, m_local * k, shard_seed(ls, q), 1.0f, stream);
                      GT_CUDA(cudaMemcpyAsync(want.data(), a_all, want.size() * 2, cudaMemcpyDeviceToHost, stream));
                    }
                    gemm_test::poison(g, sh.m * k, stream);
                    GT_CUDA(cudaStreamSynchronize(stream));
                    sync();
                    const mkernel::Status s = op.launch(a, w, c, g, stream);
                    RANK_CHECK(s.ok(), "launch: %s", s.to_string().c_str());
                    GT_CUDA(cudaStreamSynchronize(stream));
                    const mkernel::Status st = comm.check();
                    RANK_CHECK(st.ok(), "check(): %s", st.to_string().c_str());
                    GT_CUDA(cudaMemcpy(got.data(), g, got.size() * 2, cudaMemcpyDeviceToHost));
                    size_t diff = 0, first = 0;
                    for (size_t i = 0; i < got.size(); ++i)
                      if (got[i] != want[i] && diff++ == 0) first = i;
                    RANK_CHECK(diff == 0,
                               "%lux%lux%lu comm_blocks %d, checked launch %d: gathered A differs in %zu elements "
                               "(first: row %zu)",
                               sh.m, sh.n, sh.k, cb, l, diff, first / k);
                    if (diff != 0) break;
                  }
                  // Timed: C only (the gathered output is the copy engine's, beside the path).
                  std::vector<double> mine;
                  for (int it = 0; it < args.iters + 2; ++it) {
                    sync();
                    GT_CUDA(cudaEventRecord(e0, stream));
                    const mkernel::Status ls = op.launch(a, w, c, nullptr, stream);
                    GT_CUDA(cudaEventRecord(e1, stream));
                    GT_CUDA(cudaStreamSynchronize(stream));
                    if (!ls.ok()) {
                      RANK_CHECK(false, "timed launch: %s", ls.to_string().c_str());
                      break;
                    }
                    float ms = 0;
                    GT_CUDA(cudaEventElapsedTime(&ms, e0, e1));
                    if (it >= 2) mine.push_back(ms);  // two warm-up launches
                  }
                  const mkernel::Status tst = comm.check();
                  RANK_CHECK(tst.ok(), "timed launches: check(): %s", tst.to_string().c_str());
                  {
                    std::lock_guard<std::mutex> lock(results_mu);
                    times[rank] = mine;
                  }
                  sync();
                  if (rank == 0) {
                    Result r;
                    r.pieces = pieces;
                    r.shape = sh;
                    r.comm_blocks = cb;
                    r.chunk_rows = cr;
                    r.plan = op.describe();
                    r.r0_med = quantile(times[0], 0.5);
                    r.r0_p10 = quantile(times[0], 0.1);
                    r.r0_p90 = quantile(times[0], 0.9);
                    std::vector<double> slow;
                    for (size_t i = 0; i < std::min(times[0].size(), times[1].size()); ++i)
                      slow.push_back(std::max(times[0][i], times[1][i]));
                    r.slow_med = quantile(slow, 0.5);
                    std::lock_guard<std::mutex> lock(results_mu);
                    results.push_back(r);
                  }
                  sync();  // rank 0 read both ranks' times before the next variant overwrites them
                }
            sync();  // nobody frees (a device-wide synchronisation) while the other rank's kernel runs
            cudaEventDestroy(e0);
            cudaEventDestroy(e1);
            cudaFree(a);
            cudaFree(w);
            cudaFree(c);
            cudaFree(g);
            cudaFree(a_all);
          }
          return fails;
        });
  }

  for (const std::string& t : traces) std::printf("%s", t.c_str());
  if (!args.trace_dir.empty()) {
    std::ofstream f(args.trace_dir + "/net_path_traces.txt");
    for (const std::string& t : traces) f << t;
  }
  char date[16];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y-%m-%d", std::gmtime(&now));
  FILE* jf = args.jsonl.empty() ? nullptr : std::fopen(args.jsonl.c_str(), "a");
  if (!args.jsonl.empty() && jf == nullptr) std::printf("net_path_bench: cannot append to %s\n", args.jsonl.c_str());
  std::printf("\nnet_path_bench: 2 nodes x 1 GPU emulated on one GPU (66 SMs per rank), libfabric %s, host-pinned "
              "staging, commit %s\n",
              args.provider.c_str(), args.commit.c_str());
  std::printf("%-7s %-18s %5s %6s %10s %10s %10s %10s %9s  %s\n", "pieces", "M x N x K", "comm", "chunk", "r0 ms", "p10",
              "p90", "slower ms", "GB/s", "plan");
  for (const Result& r : results) {
    const double shard = 2.0 * static_cast<double>(r.shape.m / kWorld) * static_cast<double>(r.shape.k);
    const double gbs = shard / (r.slow_med * 1e6);
    char sh[40];
    std::snprintf(sh, sizeof(sh), "%lux%lux%lu", r.shape.m, r.shape.n, r.shape.k);
    std::printf("%-7s %-18s %5d %6u %10.3f %10.3f %10.3f %10.3f %9.2f  %s\n", r.pieces.c_str(), sh, r.comm_blocks, r.chunk_rows, r.r0_med,
                r.r0_p10, r.r0_p90, r.slow_med, gbs, r.plan.c_str());
    if (jf != nullptr)
      std::fprintf(jf,
                   "{\"benchmark\": \"ag_gemm_net_path\", \"shape\": {\"M\": %lu, \"N\": %lu, \"K\": %lu}, \"world\": 2, "
                   "\"nodes\": 2, \"impl\": \"mkernel\", \"median_ms\": %.4f, \"p10_ms\": %.4f, \"p90_ms\": %.4f, "
                   "\"slower_rank_median_ms\": %.4f, \"iters\": %d, \"shard_gbytes_per_s\": %.3f, \"comm_blocks\": %d, "
                   "\"chunk_rows\": %u, \"write_piece_bytes\": \"%s\", \"config\": \"%s\", \"provider\": \"%s\", \"staging\": \"host-pinned\", "
                   "\"gpus\": \"both ranks on one GPU, 66 SMs each\", \"machine\": \"%s\", \"commit\": \"%s\", "
                   "\"date\": \"%s\"}\n",
                   r.shape.m, r.shape.n, r.shape.k, r.r0_med, r.r0_p10, r.r0_p90, r.slow_med, args.iters,
                   gbs, r.comm_blocks, r.chunk_rows, r.pieces.c_str(), r.plan.c_str(), args.provider.c_str(), args.machine.c_str(),
                   args.commit.c_str(), date);
  }
  if (jf != nullptr) std::fclose(jf);
  if (failed != 0) {
    std::printf("net_path_bench: %d rank(s) failed (their messages above)\n", failed);
    return 1;
  }
  return 0;
}
