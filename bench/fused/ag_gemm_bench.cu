// ag_gemm_bench: the fused AllGather+GEMM (ops.h) beside, in the same run and on the same
// inputs: our GEMM alone on the per-rank problem (`mkernel_gemm`, the gathered A already in
// place), the fused op without the gathered output (`mkernel_c_only`) and with its kernel launched
// with programmatic dependence on begin_launch's kernel (`mkernel_pdl`), cuBLAS alone
// (`cublas`), and with more than one rank NCCL all-gather then cuBLAS in sequence
// (`nccl+cublas`, or `nccl_shm+cublas` with --nodes, where NCCL runs with NCCL_P2P_DISABLE=1 so
// both sides go through host memory).
//
// One process per rank on GPU rank % GPUs; one mkerneld (one node: the NVLink path) or, with
// --nodes, one mkerneld per rank (every rank a node: the proxy path, host-staged, over
// --provider). Shapes are global (M rows of the gathered activation, N and K of the whole
// weight; rank r holds M/world rows and N/world weight rows). Random bf16 inputs; every
// implementation's output is checked against cuBLAS on the same gathered inputs before timing.
// Timing: warm-up, then --rounds rounds that take turns between the implementations, --iters
// launches per implementation in all, each timed with CUDA events on rank 0's stream; medians
// (p10, p90) printed as a table with ratios last and appended as JSON lines to --jsonl. Each timed
// call starts on an idle GPU (the host waits for the previous one), so its time includes what the
// host spends before the GPU has work: the latency of one call. --graph N times, instead, replays
// of a CUDA graph holding N calls of each implementation (captured once per shape after the
// warm-up) and reports a replay's time / N: the GPU's time per call with no host in between.
// Records carry "timing": "graph N" or "eager".
//
//   ag_gemm_bench [--world W] [--nodes] [--provider shm] [--shapes 8192x8192x8192,...]
//                 [--small-m] [--iters 50] [--rounds 5] [--jsonl FILE] [--commit C] [--machine M]
//                 [--comm-blocks N] [--chunk-rows R] [--lsu] [--copy-engine] [--graph N]
// --copy-engine: the own rows go to the node peers by copy engines (copy_engine_pushes); the
// records' config says "ce".
// --trace DIR: the fused op records where its time goes (AllGatherGemmConfig::trace); after the
// timing, one more launch of it without the gathered output, and each rank writes that launch's
// trace_report() to DIR/ag_trace_<M>x<N>x<K>_r<rank>.txt. Timings taken with it carry its cost.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <nccl.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "gemm/gemm_test_util.cuh"
#include "gemm/sm90_bf16_gemm.h"
#include "mkernel/runtime/ops.h"
#include "mkernel/runtime/runtime.h"
#include "runtime_gpu_util.h"

namespace rt = mkernel::rt;
namespace mk = mkernel::kernels;

namespace {

struct Shape {
  int64_t m, n, k;  // global
};

constexpr int kMaxShapes = 32;
// mkernel writes the gathered A too (as the all-gather of the baseline does, and as a training
// step needs it for the backward pass); mkernel_c_only computes C alone.
constexpr int kImpls = 6;
const char* kImplNames[kImpls] = {"mkernel", "mkernel_gemm", "cublas", "nccl+cublas", "mkernel_c_only",
                                  "mkernel_pdl"};

struct Result {
  double median_ms = 0, p10_ms = 0, p90_ms = 0;
  double host_us = 0;  // median host time inside one eager call (enqueue only); 0 with --graph
  double err = -1;  // rel. error vs cuBLAS on the gathered inputs (-1: not run)
  bool ran = false;
};

struct Shared {  // parent <-> ranks, in a shared anonymous mapping
  ncclUniqueId nccl_id;
  Result res[kMaxShapes][kImpls];
  char config[kMaxShapes][160];
  char error[512];
};

struct Args {
  int world = 0;
  bool nodes = false;
  std::string provider = "shm";
  std::vector<Shape> shapes;
  int iters = 50, rounds = 5;
  int graph = 0;  // > 0: time replays of a CUDA graph of this many calls (header)
  rt::AllGatherGemmConfig config;  // --comm-blocks, --lsu, --chunk-rows, --copy-engine, --trace
  std::string jsonl, commit = "unknown", machine = "unknown";
  std::string trace_dir;            // --trace
};

std::vector<Shape> parse_shapes(const std::string& s) {
  std::vector<Shape> out;
  size_t pos = 0;
  while (pos < s.size()) {
    const size_t end = std::min(s.find(',', pos), s.size());
    Shape sh{};
    if (std::sscanf(s.substr(pos, end - pos).c_str(), "%ldx%ldx%ld", &sh.m, &sh.n, &sh.k) == 3) out.push_back(sh);
    pos = end + 1;
  }
  return out;
}

void stats(std::vector<float> v, Result* r) {
  std::sort(v.begin(), v.end());
  r->median_ms = v[v.size() / 2];
  r->p10_ms = v[v.size() / 10];
  r->p90_ms = v[std::min(v.size() - 1, v.size() * 9 / 10)];
  r->ran = true;
}

double rel_err(const __nv_bfloat16* a, const __nv_bfloat16* b, size_t n) {
  const auto x = gemm_test::to_host_float(a, n), y = gemm_test::to_host_float(b, n);
  return gemm_test::compare(x, y).rel_fro;
}

int run_rank(uint32_t rank, const Args& args, const rt::UniqueId& id, const std::vector<std::string>& sockets,
             Shared* sh) {
  int gpus = 0;
  cudaGetDeviceCount(&gpus);
  const int dev = static_cast<int>(rank) % std::max(1, gpus);
  cudaSetDevice(dev);
  const uint32_t W = static_cast<uint32_t>(args.world);
  int64_t max_mk = 0, max_nk = 0, max_mn = 0;
  for (const Shape& s : args.shapes) {
    max_mk = std::max(max_mk, s.m * s.k);
    max_nk = std::max(max_nk, s.n / W * s.k);
    max_mn = std::max(max_mn, s.m * s.n / W);
  }
  rt::Options o;
  o.socket_path = sockets[args.nodes ? rank : 0];
  o.cuda_device = dev;
  o.nvlink_bytes = static_cast<uint64_t>(max_mk) * 2;
  if (args.nodes && W > 1) o.network_workspace_bytes = static_cast<uint64_t>(max_mk) * 2;
  o.device_wait_timeout_ns = 20'000'000'000ull;
  auto made = rt::Communicator::create(rank, W, id, {4096}, o);
  if (!made.ok()) {
    std::snprintf(sh->error, sizeof(sh->error), "rank %u: create: %s", rank, made.status().to_string().c_str());
    return 1;
  }
  rt::Communicator& comm = *made.value();
  cudaStream_t st;
  cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
  ncclComm_t nc = nullptr;
  if (W > 1 && ncclCommInitRank(&nc, static_cast<int>(W), sh->nccl_id, static_cast<int>(rank)) != ncclSuccess) {
    std::snprintf(sh->error, sizeof(sh->error), "rank %u: ncclCommInitRank failed", rank);
    return 1;
  }
  cublasHandle_t blas;
  cublasCreate(&blas);
  cublasSetStream(blas, st);
  __nv_bfloat16 *a = nullptr, *w = nullptr, *c = nullptr, *c_ref = nullptr, *g = nullptr, *g2 = nullptr;
  cudaMalloc(&a, max_mk / W * 2 + 256);
  cudaMalloc(&w, max_nk * 2);
  cudaMalloc(&c, max_mn * 2);
  cudaMalloc(&c_ref, max_mn * 2);
  cudaMalloc(&g, max_mk * 2);
  cudaMalloc(&g2, max_mk * 2);
  void* ws = nullptr;
  const size_t ws_bytes = 256u << 20;
  cudaMalloc(&ws, ws_bytes);
  cudaMemset(ws, 0, ws_bytes);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);

  for (size_t si = 0; si < args.shapes.size(); ++si) {
    const Shape& s = args.shapes[si];
    const int64_t m_local = s.m / W, n_local = s.n / W, k = s.k;
    gemm_test::fill_random(a, m_local * k, 1000 + si * 64 + rank, 1.0f, st);
    gemm_test::fill_random(w, n_local * k, 2000 + si * 64 + rank, 1.0f, st);
    auto op = rt::AllGatherGemm::create(comm, m_local, n_local, k, args.config, st);
    if (!op.ok()) {
      std::snprintf(sh->error, sizeof(sh->error), "rank %u: plan %ldx%ldx%ld: %s", rank, s.m, s.n, s.k,
                    op.status().to_string().c_str());
      return 1;
    }
    if (rank == 0) std::snprintf(sh->config[si], sizeof(sh->config[si]), "%s", op.value()->describe().c_str());
    // The same op with its kernel launched with programmatic dependence on begin_launch's kernel
    // (`mkernel_pdl`, with the gathered output: what the programmatic launch saves).
    rt::AllGatherGemmConfig cfg_pdl = args.config;
    cfg_pdl.programmatic_launch = true;
    auto op_pdl = rt::AllGatherGemm::create(comm, m_local, n_local, k, cfg_pdl, st);
    if (!op_pdl.ok()) {
      std::snprintf(sh->error, sizeof(sh->error), "rank %u: plan %ldx%ldx%ld (programmatic launch): %s", rank, s.m,
                    s.n, s.k, op_pdl.status().to_string().c_str());
      return 1;
    }
    // The gathered A for the baselines: the fused op's own output, checked against NCCL's.
    auto fused = [&](void* gathered_out) { return op.value()->launch(a, w, c, gathered_out, st); };
    mk::GemmArgs ga;
    ga.a = g;
    ga.w = w;
    ga.d = c;
    ga.m = s.m;
    ga.n = n_local;
    ga.k = k;
    ga.workspace = ws;
    ga.workspace_bytes = ws_bytes;
    mk::GemmPlan gp;
    if (mk::GemmResult r = mk::gemm_plan(ga, &gp); !r.ok()) {
      std::snprintf(sh->error, sizeof(sh->error), "rank %u: gemm plan: %s", rank, r.message.c_str());
      return 1;
    }
    const float alpha = 1.f, beta = 0.f;
    auto blas_gemm = [&](__nv_bfloat16* out) {
      cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n_local), static_cast<int>(s.m),
                   static_cast<int>(k), &alpha, w, CUDA_R_16BF, static_cast<int>(k), g, CUDA_R_16BF, static_cast<int>(k),
                   &beta, out, CUDA_R_16BF, static_cast<int>(n_local), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    };
    auto run_impl = [&](int impl) -> bool {
      switch (impl) {
        case 0: return fused(g2).ok();
        case 4: return fused(nullptr).ok();
        case 5: return op_pdl.value()->launch(a, w, c, g2, st).ok();
        case 1: return mk::gemm_launch(gp, st).ok();
        case 2: blas_gemm(c); return true;
        case 3:
          if (nc == nullptr) return false;
          ncclAllGather(a, g, static_cast<size_t>(m_local * k), ncclBfloat16, nc, st);
          blas_gemm(c);
          return true;
      }
      return false;
    };
    // Correctness first: the gathered A by NCCL (or the fused op with one rank), cuBLAS on it
    // as the reference, then each implementation's C against it.
    if (nc != nullptr) {
      ncclAllGather(a, g, static_cast<size_t>(m_local * k), ncclBfloat16, nc, st);
    } else {
      cudaMemcpyAsync(g, a, m_local * k * 2, cudaMemcpyDeviceToDevice, st);
    }
    blas_gemm(c_ref);
    cudaStreamSynchronize(st);
    for (int impl = 0; impl < kImpls; ++impl) {
      if (impl == 3 && nc == nullptr) continue;
      gemm_test::poison(c, s.m * n_local, st);
      if (!run_impl(impl)) {
        std::snprintf(sh->error, sizeof(sh->error), "rank %u: %s failed to launch", rank, kImplNames[impl]);
        return 1;
      }
      cudaStreamSynchronize(st);
      const double e = rel_err(c, c_ref, s.m * n_local);
      if (rank == 0) sh->res[si][impl].err = e;
      bool gathered_ok = true;
      if (impl == 0) {  // the gathered A, bit for bit
        std::vector<uint16_t> x(s.m * k), y(s.m * k);
        cudaMemcpy(x.data(), g, x.size() * 2, cudaMemcpyDeviceToHost);
        cudaMemcpy(y.data(), g2, y.size() * 2, cudaMemcpyDeviceToHost);
        gathered_ok = x == y;
      }
      if (!(e < 1e-2) || !gathered_ok || !comm.check().ok()) {
        std::snprintf(sh->error, sizeof(sh->error), "rank %u: %s wrong on %ldx%ldx%ld: rel err %.3e%s; %s", rank,
                      kImplNames[impl], s.m, s.n, s.k, e, gathered_ok ? "" : ", gathered A differs",
                      comm.check().to_string().c_str());
        return 1;
      }
    }
    // Timing: rounds take turns between implementations.
    std::vector<float> times[kImpls];
    std::vector<float> host_us[kImpls];
    for (int warm = 0; warm < 5; ++warm)
      for (int impl = 0; impl < kImpls; ++impl) run_impl(impl);
    cudaStreamSynchronize(st);
    // --graph: one graph of args.graph calls per implementation, captured after the warm-up.
    cudaGraphExec_t graphs[kImpls] = {};
    if (args.graph > 0) {
      for (int impl = 0; impl < kImpls; ++impl) {
        if (impl == 3 && nc == nullptr) continue;
        const std::string e = gemm_test::capture_calls(st, args.graph, [&] { return run_impl(impl); }, &graphs[impl]);
        if (!e.empty()) {
          std::snprintf(sh->error, sizeof(sh->error), "rank %u: capturing %d calls of %s in a CUDA graph on %ldx%ldx%ld: "
                        "%s; %s", rank, args.graph, kImplNames[impl], s.m, s.n, s.k, e.c_str(),
                        comm.check().to_string().c_str());
          return 1;
        }
        cudaGraphLaunch(graphs[impl], st);  // warm-up replay
      }
      cudaStreamSynchronize(st);
    }
    const int per_round = std::max(1, args.iters / args.rounds);
    for (int round = 0; round < args.rounds; ++round)
      for (int impl = 0; impl < kImpls; ++impl) {
        if (impl == 3 && nc == nullptr) continue;
        for (int i = 0; i < per_round; ++i) {
          cudaEventRecord(e0, st);
          if (graphs[impl] != nullptr) {
            cudaGraphLaunch(graphs[impl], st);
          } else {
            const auto h0 = std::chrono::steady_clock::now();
            run_impl(impl);
            host_us[impl].push_back(std::chrono::duration<float, std::micro>(std::chrono::steady_clock::now() - h0).count());
          }
          cudaEventRecord(e1, st);
          cudaEventSynchronize(e1);
          float ms = 0;
          cudaEventElapsedTime(&ms, e0, e1);
          times[impl].push_back(graphs[impl] != nullptr ? ms / static_cast<float>(args.graph) : ms);
        }
      }
    for (cudaGraphExec_t& ge : graphs)
      if (ge != nullptr) cudaGraphExecDestroy(ge);
    if (!comm.check().ok()) {
      std::snprintf(sh->error, sizeof(sh->error), "rank %u: %s", rank, comm.check().to_string().c_str());
      return 1;
    }
    if (!args.trace_dir.empty()) {  // one more launch, its trace to a file per rank
      const mkernel::Status t = fused(nullptr);
      cudaStreamSynchronize(st);
      const std::string path = args.trace_dir + "/ag_trace_" + std::to_string(s.m) + "x" + std::to_string(s.n) + "x" +
                               std::to_string(s.k) + "_r" + std::to_string(rank) + ".txt";
      FILE* f = std::fopen(path.c_str(), "w");
      if (f == nullptr || !t.ok()) {
        std::snprintf(sh->error, sizeof(sh->error), "rank %u: trace launch: %s; writing %s: %s", rank,
                      t.to_string().c_str(), path.c_str(), f == nullptr ? std::strerror(errno) : "ok");
        if (f != nullptr) std::fclose(f);
        return 1;
      }
      std::fprintf(f, "%s\n%s", op.value()->describe().c_str(), op.value()->trace_report().c_str());
      std::fclose(f);
    }
    if (rank == 0)
      for (int impl = 0; impl < kImpls; ++impl)
        if (!times[impl].empty()) {
          stats(times[impl], &sh->res[si][impl]);
          if (!host_us[impl].empty()) {
            std::sort(host_us[impl].begin(), host_us[impl].end());
            sh->res[si][impl].host_us = host_us[impl][host_us[impl].size() / 2];
          }
        }
  }
  if (nc != nullptr) ncclCommDestroy(nc);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--world") args.world = std::atoi(next().c_str());
    else if (a == "--nodes") args.nodes = true;
    else if (a == "--provider") args.provider = next();
    else if (a == "--shapes") {
      const auto more = parse_shapes(next());
      args.shapes.insert(args.shapes.end(), more.begin(), more.end());
    }
    else if (a == "--small-m")
      for (int64_t m : {128, 256, 512, 1024, 2048})
        for (int64_t n : {8192, 28672}) args.shapes.push_back({m, n, 8192});
    else if (a == "--iters") args.iters = std::atoi(next().c_str());
    else if (a == "--comm-blocks") args.config.comm_blocks = std::atoi(next().c_str());
    else if (a == "--chunk-rows") args.config.chunk_rows = static_cast<uint32_t>(std::atoi(next().c_str()));
    else if (a == "--lsu") args.config.bulk_copies = false;
    else if (a == "--copy-engine") args.config.copy_engine_pushes = true;
    else if (a == "--trace") {
      args.trace_dir = next();
      args.config.trace = true;
    }
    else if (a == "--rounds") args.rounds = std::atoi(next().c_str());
    else if (a == "--graph") args.graph = std::atoi(next().c_str());
    else if (a == "--jsonl") args.jsonl = next();
    else if (a == "--commit") args.commit = next();
    else if (a == "--machine") args.machine = next();
    else {
      std::printf("ag_gemm_bench: unknown argument \"%s\" (see the header of bench/fused/ag_gemm_bench.cu)\n", a.c_str());
      return 2;
    }
  }
  if (args.graph < 0 || args.graph > 1000) {
    std::printf("ag_gemm_bench: --graph %d; expected 0 (eager calls) to 1000 calls per graph\n", args.graph);
    return 2;
  }
  ::setenv("CUDA_MODULE_LOADING", "EAGER", 1);  // no module load while a rank's kernel waits for another
  const int gpus = mkt::driver_gpu_count();
  if (gpus < 1) {
    std::printf("ag_gemm_bench: needs a Hopper GPU, the driver lists none\n");
    return 77;
  }
  if (args.world <= 0) args.world = gpus;
  if (args.shapes.empty()) args.shapes = {{4096, 8192, 8192}, {8192, 8192, 8192}, {16384, 14336, 4096}, {32768, 8192, 8192}};
  if (args.shapes.size() > kMaxShapes) args.shapes.resize(kMaxShapes);
  for (const Shape& s : args.shapes)
    if (s.m % args.world != 0 || s.n % (8 * args.world) != 0 || s.k % 8 != 0) {
      std::printf("ag_gemm_bench: shape %ldx%ldx%ld does not split over %d ranks (M %% world, N %% (8 world), K %% 8)\n",
                  s.m, s.n, s.k, args.world);
      return 2;
    }
  if (args.world > gpus)
    std::printf("note: %d ranks on %d GPU(s): ranks share GPUs, timings are not those of a deployment\n", args.world,
                gpus);
  if (args.nodes) ::setenv("NCCL_P2P_DISABLE", "1", 1);  // NCCL through host memory too
  ::setenv("NCCL_NVLS_ENABLE", "0", 1);
  auto* sh = static_cast<Shared*>(::mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  std::memset(sh, 0, sizeof(Shared));
  if (args.world > 1) ncclGetUniqueId(&sh->nccl_id);
  std::vector<std::unique_ptr<mkt::Daemon>> daemons;
  std::string ids;
  for (int g = 0; g < gpus; ++g) ids += (g ? ", " : "") + std::to_string(g);
  const int num_daemons = args.nodes ? args.world : 1;
  std::vector<std::string> sockets;
  for (int d = 0; d < num_daemons; ++d) {
    daemons.push_back(std::make_unique<mkt::Daemon>(
        mkt::temp_dir("agbench"),
        mkt::daemon_yaml(args.provider, ids) + "node: {name: \"bench-node-" + std::to_string(d) + "\"}\n"));
    if (!daemons.back()->start()) {
      std::printf("ag_gemm_bench: mkerneld %d did not start (log in %s)\n", d, daemons.back()->dir().c_str());
      return 1;
    }
    sockets.push_back(daemons.back()->socket());
  }
  rt::Options o;
  o.socket_path = sockets[0];
  o.proxy = 0;
  auto id = rt::get_unique_id(o);
  if (!id.ok()) {
    std::printf("ag_gemm_bench: get_unique_id: %s\n", id.status().to_string().c_str());
    return 1;
  }
  const int failed = mkt::run_ranks(static_cast<uint32_t>(args.world),
                                    [&](uint32_t r) { return run_rank(r, args, id.value(), sockets, sh); },
                                    std::chrono::seconds(1200));
  if (failed != 0) {
    std::printf("ag_gemm_bench: %d rank(s) failed: %s\n", failed, sh->error[0] ? sh->error : "(no message)");
    return 1;
  }
  char date[16];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y-%m-%d", std::gmtime(&now));
  FILE* jl = args.jsonl.empty() ? nullptr : std::fopen(args.jsonl.c_str(), "a");
  const char* nccl_name = args.nodes ? "nccl_shm+cublas" : "nccl+cublas";
  const std::string timing = args.graph > 0 ? "graph " + std::to_string(args.graph) : "eager";
  std::printf("\nag_gemm_bench: world %d, nodes %d%s, %s, commit %s, timing %s\n", args.world,
              args.nodes ? args.world : 1, args.nodes ? (" over " + args.provider + ", host-staged").c_str() : "",
              args.machine.c_str(), args.commit.c_str(),
              args.graph > 0 ? (timing + " (a replay / " + std::to_string(args.graph) + ")").c_str()
                             : "eager (each call from an idle GPU)");
  std::printf("%-20s %10s %10s %10s %10s %10s %10s %9s %9s %9s\n", "M x N x K", "mkernel", "pdl", "C only",
              "our gemm", "cublas", nccl_name, "vs seq", "vs gemm", "vs cublas");
  for (size_t si = 0; si < args.shapes.size(); ++si) {
    const Shape& s = args.shapes[si];
    const Result* r = sh->res[si];
    char shape[32];
    std::snprintf(shape, sizeof(shape), "%ldx%ldx%ld", s.m, s.n, s.k);
    const double seq = r[3].ran ? r[3].median_ms : 0;
    std::printf("%-20s %10.4f %10.4f %10.4f %10.4f %10.4f %10.4f %9.3f %9.3f %9.3f\n", shape, r[0].median_ms,
                r[5].median_ms, r[4].median_ms, r[1].median_ms, r[2].median_ms, seq, seq > 0 ? seq / r[0].median_ms : 0.0,
                r[0].median_ms / r[1].median_ms, r[2].median_ms / r[0].median_ms);
    if (args.graph == 0) {
      std::printf("%-20s host us per call (enqueue):", "");
      for (int impl = 0; impl < kImpls; ++impl)
        if (r[impl].ran) std::printf(" %s %.1f", kImplNames[impl], r[impl].host_us);
      std::printf("\n");
    }
    for (int impl = 0; impl < kImpls && jl; ++impl) {
      if (!r[impl].ran) continue;
      std::fprintf(jl,
                   "{\"benchmark\": \"ag_gemm\", \"shape\": {\"M\": %ld, \"N\": %ld, \"K\": %ld}, \"split\": \"A rows and W "
                   "rows over world\", \"world\": %d, \"nodes\": %d, \"impl\": \"%s\", \"median_ms\": %.4f, \"p10_ms\": "
                   "%.4f, \"p90_ms\": %.4f, \"iters\": %d, \"rel_err_vs_cublas\": %.2e, \"config\": \"%s\", "
                   "\"provider\": \"%s\", \"timing\": \"%s\", \"host_us\": %.1f, \"machine\": \"%s\", \"commit\": \"%s\", \"date\": \"%s\"}\n",
                   s.m, s.n, s.k, args.world, args.nodes ? args.world : 1, impl == 3 ? nccl_name : kImplNames[impl],
                   r[impl].median_ms, r[impl].p10_ms, r[impl].p90_ms, args.iters, r[impl].err,
                   impl == 0 || impl == 4 || impl == 5 ? sh->config[si] : "",
                   args.nodes ? args.provider.c_str() : (args.world > 1 ? "nvlink" : "none (one rank)"), timing.c_str(), r[impl].host_us,
                   args.machine.c_str(), args.commit.c_str(), date);
    }
  }
  if (jl) std::fclose(jl);
  std::printf("(vs seq: NCCL+cuBLAS time / fused time; vs gemm: fused / our GEMM alone, goal <= 1.08; vs cublas: "
              "cuBLAS / fused)\n");
  return 0;
}
