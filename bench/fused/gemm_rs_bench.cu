// gemm_rs_bench: the fused GEMM+ReduceScatter (ops.h) beside, in the same run and on the same
// inputs: our GEMM alone on the per-rank problem (`mkernel_gemm`: the partial [M, N] of this
// rank's share of K, nothing reduced), the same in the configuration the fused op's engine runs
// (`mkernel_gemm_as_fused`: widths 128 and 256, no swapped operands, no stream-K, at most two
// splits, no programmatic launch; what fusion costs beyond its configuration), the fused op with
// its kernel launched with programmatic dependence on begin_launch's kernel (`mkernel_pdl`),
// cuBLAS alone on the same problem (`cublas`), and with more than one rank cuBLAS then NCCL's
// reduce-scatter of the bf16 partials on the same stream (`nccl+cublas`, or `nccl_shm+cublas`
// with --nodes, where NCCL runs with NCCL_P2P_DISABLE=1 so both sides go through host memory).
// With one rank the fused op has nothing to move: the run measures its overhead over our GEMM
// and cuBLAS.
//
// --all-reduce: the same for the fused GEMM+AllReduce (`mkernel` is GemmAllReduce; every rank
// gets the whole sum [M, N]) and `nccl+cublas` is cuBLAS then ncclAllReduce of the bf16 partials
// (host-staged with --nodes as above); JSON records say "gemm_ar" instead of "gemm_rs".
//
// One process per rank on GPU rank % GPUs; one mkerneld (one node: the NVLink path) or, with
// --nodes, one mkerneld per rank (every rank a node: the proxy path, host-staged, over
// --provider). Shapes are global (M rows of the activation, N columns of the result, K the whole
// reduction dimension; rank r holds A_r [M, K/world] and W_r [N, K/world] and gets rows
// r*M/world ... of the sum, or with --all-reduce all of it). Random bf16 inputs (uniform in
// [-1, 1)). Before timing, one launch of the fused op is checked on every rank against the unfused
// result (cuBLAS partials reduce-scattered, or all-reduced, by NCCL; with one rank, cuBLAS's
// product) by relative Frobenius error < 1e-2, and our GEMM against cuBLAS the same way. Timing:
// 5 warm-up calls each, then --rounds rounds that take turns between the implementations, --iters
// launches per implementation in all, each timed with CUDA events on rank 0's stream; medians
// (p10, p90) printed as a table with ratios last and appended as JSON lines to --jsonl (or
// --json). Each timed call starts on an idle GPU (the host waits for the previous one), so its
// time includes what the host spends before the GPU has work: the latency of one call.
// --graph N times, instead, replays of a CUDA graph holding N calls of each implementation
// (captured once per shape after the warm-up; the fused op's launches are graph-capturable), and
// reports a replay's time / N: the GPU's time per call with no host in between, as a model
// captured in a graph sees it. Records then carry "timing": "graph N" (else "eager").
//
//   gemm_rs_bench [--all-reduce] [--world W] [--nodes] [--provider shm]
//                 [--shapes 8192x8192x8192,...] [--small-m] [--odd] [--iters 50] [--rounds 5]
//                 [--jsonl FILE] [--commit C] [--machine M] [--gemm-blocks N] [--block-n 128|256]
//                 [--cluster-m 1|2] [--graph N]
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <nccl.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "fused/gemm_rs/gemm_rs_plan.h"
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
constexpr int kImpls = 6;
constexpr int kNccl = 3;
constexpr int kGemmAsFused = 4;
constexpr int kPdl = 5;
const char* kImplNames[kImpls] = {"mkernel", "mkernel_gemm", "cublas", "nccl+cublas", "mkernel_gemm_as_fused",
                                  "mkernel_pdl"};

struct Result {
  double median_ms = 0, p10_ms = 0, p90_ms = 0;
  double host_us = 0;  // median host time inside one eager call (enqueue only); 0 with --graph
  double err = -1;  // rel. Frobenius error vs the unfused result (-1: not run)
  bool ran = false;
};

struct Shared {  // parent <-> ranks, in a shared anonymous mapping
  ncclUniqueId nccl_id;
  Result res[kMaxShapes][kImpls];
  char config[kMaxShapes][160];
  char error[512];
};

struct Args {
  bool all_reduce = false;  // GemmAllReduce and ncclAllReduce instead of the reduce-scatter ones
  int world = 0;
  bool nodes = false;
  std::string provider = "shm";
  std::vector<Shape> shapes;
  int iters = 50, rounds = 5;
  int graph = 0;  // > 0: time replays of a CUDA graph of this many calls (header)
  rt::GemmReduceScatterConfig config;  // --gemm-blocks, --block-n, --cluster-m
  std::string jsonl, commit = "unknown", machine = "unknown";
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

// sums[0] += (x - y)^2, sums[1] += y^2 over finite x; sums[2] counts non-finite x (unwritten
// elements are NaN: the output is poisoned before the checked launch). On the GPU, so that the
// largest shapes (2^28 elements) check in milliseconds.
__global__ void diff_norms(const __nv_bfloat16* x, const __nv_bfloat16* y, size_t n, double* sums) {
  double num = 0, den = 0, bad = 0;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    const double a = __bfloat162float(x[i]), b = __bfloat162float(y[i]);
    if (!isfinite(a)) {
      bad += 1;
      continue;
    }
    num += (a - b) * (a - b);
    den += b * b;
  }
  for (int o = 16; o > 0; o /= 2) {
    num += __shfl_down_sync(0xffffffffu, num, o);
    den += __shfl_down_sync(0xffffffffu, den, o);
    bad += __shfl_down_sync(0xffffffffu, bad, o);
  }
  if (threadIdx.x % 32 == 0) {
    atomicAdd(&sums[0], num);
    atomicAdd(&sums[1], den);
    atomicAdd(&sums[2], bad);
  }
}

// ||x - y||_F / ||y||_F, or +inf when x holds a non-finite element.
double rel_err(const __nv_bfloat16* x, const __nv_bfloat16* y, size_t n, double* sums, cudaStream_t st) {
  cudaMemsetAsync(sums, 0, 3 * sizeof(double), st);
  diff_norms<<<264, 256, 0, st>>>(x, y, n, sums);
  double h[3] = {};
  cudaMemcpyAsync(h, sums, sizeof(h), cudaMemcpyDeviceToHost, st);
  if (cudaStreamSynchronize(st) != cudaSuccess) return INFINITY;
  if (h[2] > 0) return INFINITY;
  return h[1] > 0 ? std::sqrt(h[0] / h[1]) : std::sqrt(h[0]);
}

#define RANK_CUDA(call)                                                                                     \
  do {                                                                                                      \
    const cudaError_t e_ = (call);                                                                          \
    if (e_ != cudaSuccess) {                                                                                \
      std::snprintf(sh->error, sizeof(sh->error), "rank %u: %s: %s", rank, #call, cudaGetErrorString(e_)); \
      return 1;                                                                                             \
    }                                                                                                       \
  } while (0)

int run_rank(uint32_t rank, const Args& args, const rt::UniqueId& id, const std::vector<std::string>& sockets,
             Shared* sh) {
  int gpus = 0;
  cudaGetDeviceCount(&gpus);
  const int dev = static_cast<int>(rank) % std::max(1, gpus);
  RANK_CUDA(cudaSetDevice(dev));
  const uint32_t W = static_cast<uint32_t>(args.world);
  const uint32_t nodes = args.nodes ? W : 1, per_node = args.nodes ? 1 : W;
  // The workspace for the largest shape: the node peers' staged partials in the NVLink buffer,
  // a receive and a send slot per node in the network workspace, and the flags of the plan with
  // the narrower tile (more tiles, more flags) whichever width the engine picks.
  int64_t max_mk = 0, max_nk = 0, max_mn = 0;
  uint64_t nvl_bytes = 1 << 20, net_bytes = 0;
  uint32_t fused_flags = 4096;
  for (const Shape& s : args.shapes) {
    const uint64_t m_local = s.m / W, k = s.k / W;
    max_mk = std::max<int64_t>(max_mk, s.m * k);
    max_nk = std::max<int64_t>(max_nk, s.n * k);
    max_mn = std::max<int64_t>(max_mn, s.m * s.n);
    nvl_bytes = std::max(nvl_bytes, args.all_reduce
                                        ? rt::gemm_all_reduce_nvlink_bytes(nodes, per_node, s.m, s.n)
                                        : rt::gemm_reduce_scatter_nvlink_bytes(nodes, per_node, m_local, s.n));
    net_bytes = std::max(net_bytes, args.all_reduce ? rt::gemm_all_reduce_network_bytes(nodes, s.m, s.n)
                                                    : rt::gemm_reduce_scatter_network_bytes(nodes, m_local, s.n));
    fused_flags = std::max(fused_flags, (args.all_reduce ? rt::gemm_all_reduce_fused_flags(nodes, per_node, s.m, s.n)
                                                         : rt::gemm_reduce_scatter_fused_flags(nodes, per_node, m_local,
                                                                                               s.n)) + 64);
  }
  rt::Options o;
  o.socket_path = sockets[args.nodes ? rank : 0];
  o.cuda_device = dev;
  o.nvlink_bytes = nvl_bytes;
  o.fused_flags = (fused_flags + 1023) / 1024 * 1024;
  if (args.nodes && W > 1) o.network_workspace_bytes = net_bytes;
  o.device_wait_timeout_ns = 20'000'000'000ull;
  auto made = rt::Communicator::create(rank, W, id, {4096}, o);
  if (!made.ok()) {
    std::snprintf(sh->error, sizeof(sh->error), "rank %u: create: %s", rank, made.status().to_string().c_str());
    return 1;
  }
  rt::Communicator& comm = *made.value();
  cudaStream_t st;
  RANK_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  ncclComm_t nc = nullptr;
  if (W > 1) {
    if (const ncclResult_t r = ncclCommInitRank(&nc, static_cast<int>(W), sh->nccl_id, static_cast<int>(rank));
        r != ncclSuccess) {
      std::snprintf(sh->error, sizeof(sh->error), "rank %u: ncclCommInitRank: %s", rank, ncclGetErrorString(r));
      return 1;
    }
  }
  cublasHandle_t blas;
  if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) {
    std::snprintf(sh->error, sizeof(sh->error), "rank %u: cublasCreate failed", rank);
    return 1;
  }
  cublasSetStream(blas, st);
  // a [M, k], w [N, k]; p: cuBLAS's partial [M, N] (the input of NCCL's reduce-scatter or
  // all-reduce); p2: our GEMM's partial; c: the fused op's rows [M/world, N] (all [M, N] with
  // --all-reduce); c_ref: NCCL's.
  const int64_t max_out = args.all_reduce ? max_mn : max_mn / W;
  __nv_bfloat16 *a = nullptr, *w = nullptr, *p = nullptr, *p2 = nullptr, *c = nullptr, *c_ref = nullptr;
  RANK_CUDA(cudaMalloc(&a, max_mk * 2));
  RANK_CUDA(cudaMalloc(&w, max_nk * 2));
  RANK_CUDA(cudaMalloc(&p, max_mn * 2));
  RANK_CUDA(cudaMalloc(&p2, max_mn * 2));
  RANK_CUDA(cudaMalloc(&c, max_out * 2 + 256));
  RANK_CUDA(cudaMalloc(&c_ref, max_out * 2 + 256));
  double* sums = nullptr;
  RANK_CUDA(cudaMalloc(&sums, 3 * sizeof(double)));
  void* ws = nullptr;
  const size_t ws_bytes = 256u << 20;
  RANK_CUDA(cudaMalloc(&ws, ws_bytes));
  RANK_CUDA(cudaMemset(ws, 0, ws_bytes));
  cudaEvent_t e0, e1;
  RANK_CUDA(cudaEventCreate(&e0));
  RANK_CUDA(cudaEventCreate(&e1));

  for (size_t si = 0; si < args.shapes.size(); ++si) {
    const Shape& s = args.shapes[si];
    const int64_t m_local = s.m / W, n = s.n, k = s.k / W;
    const int64_t out_elems = (args.all_reduce ? s.m : m_local) * n;  // of c and c_ref
    gemm_test::fill_random(a, s.m * k, 1000 + si * 64 + rank, 1.0f, st);
    gemm_test::fill_random(w, n * k, 2000 + si * 64 + rank, 1.0f, st);
    // GemmAllReduce is a GemmReduceScatter (the same launch, c [M, N]).
    // The fused op as configured, and the same with its kernel launched with programmatic
    // dependence on begin_launch's kernel (`mkernel_pdl`: what the programmatic launch saves).
    std::unique_ptr<rt::GemmReduceScatter> op, op_pdl;
    for (int variant = 0; variant < 2; ++variant) {
      rt::GemmReduceScatterConfig cfg = args.config;
      if (variant == 1) cfg.programmatic_launch = true;
      std::unique_ptr<rt::GemmReduceScatter>& dst = variant == 0 ? op : op_pdl;
      mkernel::Status made_op;
      if (args.all_reduce) {
        auto r = rt::GemmAllReduce::create(comm, s.m, n, k, cfg, st);
        if (r.ok()) dst = std::move(r.value());
        else made_op = r.status();
      } else {
        auto r = rt::GemmReduceScatter::create(comm, m_local, n, k, cfg, st);
        if (r.ok()) dst = std::move(r.value());
        else made_op = r.status();
      }
      if (!dst) {
        std::snprintf(sh->error, sizeof(sh->error), "rank %u: plan %ldx%ldx%ld%s: %s", rank, s.m, s.n, s.k,
                      variant == 1 ? " (programmatic launch)" : "", made_op.to_string().c_str());
        return 1;
      }
    }
    if (rank == 0) std::snprintf(sh->config[si], sizeof(sh->config[si]), "%s", op->describe().c_str());
    mk::GemmArgs ga;
    ga.a = a;
    ga.w = w;
    ga.d = p2;
    ga.m = s.m;
    ga.n = n;
    ga.k = k;
    ga.workspace = ws;
    ga.workspace_bytes = ws_bytes;
    mk::GemmPlan gp;
    if (mk::GemmResult r = mk::gemm_plan(ga, &gp); !r.ok()) {
      std::snprintf(sh->error, sizeof(sh->error), "rank %u: gemm plan %ldx%ldx%ld: %s", rank, s.m, n, k,
                    r.message.c_str());
      return 1;
    }
    // Our GEMM alone in the configuration the fused op's engine runs (the choices it leaves the
    // rule: widths 128 and 256, no swapped operands or split-K inside clusters, no stream-K, at
    // most two splits; launched without programmatic dependence, as the fused kernel is): the
    // difference to `mkernel` is then what the fusion itself costs, not the configuration.
    mk::GemmArgs gf = ga;
    gf.config.widths_128_256 = true;
    gf.config.stream_k = 0;
    gf.config.swap_ab = 0;
    gf.config.cluster_k = 1;
    gf.config.programmatic_launch = false;
    mk::GemmPlan gpf;
    if (mk::GemmResult r = mk::gemm_plan(gf, &gpf); !r.ok()) {
      std::snprintf(sh->error, sizeof(sh->error), "rank %u: gemm plan as fused %ldx%ldx%ld: %s", rank, s.m, n, k,
                    r.message.c_str());
      return 1;
    }
    if (gpf.config.num_splits > 2) {
      gf.config = gpf.config;
      gf.config.num_splits = 2;
      if (mk::GemmResult r = mk::gemm_plan(gf, &gpf); !r.ok()) {
        std::snprintf(sh->error, sizeof(sh->error), "rank %u: gemm plan as fused (2 splits) %ldx%ldx%ld: %s", rank, s.m,
                      n, k, r.message.c_str());
        return 1;
      }
    }
    const float alpha = 1.f, beta = 0.f;
    auto blas_gemm = [&]() {
      return cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(s.m),
                          static_cast<int>(k), &alpha, w, CUDA_R_16BF, static_cast<int>(k), a, CUDA_R_16BF,
                          static_cast<int>(k), &beta, p, CUDA_R_16BF, static_cast<int>(n), CUBLAS_COMPUTE_32F,
                          CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS;
    };
    auto run_impl = [&](int impl) -> bool {
      switch (impl) {
        case 0: return op->launch(a, w, c, st).ok();
        case 1: return mk::gemm_launch(gp, st).ok();
        case kGemmAsFused: return mk::gemm_launch(gpf, st).ok();
        case kPdl: return op_pdl->launch(a, w, c, st).ok();
        case 2: return blas_gemm();
        case kNccl:
          if (nc == nullptr || !blas_gemm()) return false;
          if (args.all_reduce)
            return ncclAllReduce(p, c_ref, static_cast<size_t>(s.m * n), ncclBfloat16, ncclSum, nc, st) ==
                   ncclSuccess;
          return ncclReduceScatter(p, c_ref, static_cast<size_t>(m_local * n), ncclBfloat16, ncclSum, nc, st) ==
                 ncclSuccess;
      }
      return false;
    };
    // Correctness first: the unfused result (cuBLAS, then NCCL's reduce-scatter or all-reduce
    // with more than one rank) is the reference for the fused op; cuBLAS's partial for our GEMM
    // alone. With --all-reduce every rank checks the whole [M, N].
    gemm_test::poison(c, out_elems, st);
    gemm_test::poison(p2, s.m * n, st);
    gemm_test::poison(c_ref, out_elems, st);
    const bool launched[3] = {run_impl(nc != nullptr ? kNccl : 2), run_impl(0), run_impl(1)};
    const cudaError_t ce = cudaStreamSynchronize(st);
    if (!launched[0] || !launched[1] || !launched[2] || ce != cudaSuccess) {
      const char* which = !launched[0] ? (nc != nullptr ? "nccl+cublas" : "cublas")
                          : !launched[1] ? "mkernel"
                          : !launched[2] ? "mkernel_gemm"
                                         : "the checked launches";
      std::snprintf(sh->error, sizeof(sh->error), "rank %u: %s failed on %ldx%ldx%ld: %s; %s", rank, which, s.m, s.n,
                    s.k, cudaGetErrorString(ce), comm.check().to_string().c_str());
      return 1;
    }
    const __nv_bfloat16* ref = nc != nullptr ? c_ref : p;  // one rank: its partial is the result
    const double e_fused = rel_err(c, ref, out_elems, sums, st);
    const double e_gemm = rel_err(p2, p, s.m * n, sums, st);
    if (rank == 0) {
      sh->res[si][0].err = e_fused;
      sh->res[si][1].err = e_gemm;
      sh->res[si][2].err = 0;
      sh->res[si][kNccl].err = 0;
    }
    if (!(e_fused < 1e-2) || !(e_gemm < 1e-2) || !comm.check().ok()) {
      std::snprintf(sh->error, sizeof(sh->error),
                    "rank %u: wrong on %ldx%ldx%ld: mkernel rel err %.3e vs %s, mkernel_gemm rel err %.3e vs cublas "
                    "(bound 1e-2; inf: a non-finite element); %s",
                    rank, s.m, s.n, s.k, e_fused, nc != nullptr ? "nccl+cublas" : "cublas", e_gemm,
                    comm.check().to_string().c_str());
      return 1;
    }
    gemm_test::poison(p2, s.m * n, st);
    if (!run_impl(kGemmAsFused) || cudaStreamSynchronize(st) != cudaSuccess) {
      std::snprintf(sh->error, sizeof(sh->error), "rank %u: mkernel_gemm_as_fused failed on %ldx%ldx%ld", rank, s.m,
                    s.n, s.k);
      return 1;
    }
    if (const double e = rel_err(p2, p, s.m * n, sums, st); !(e < 1e-2)) {
      std::snprintf(sh->error, sizeof(sh->error),
                    "rank %u: wrong on %ldx%ldx%ld: mkernel_gemm_as_fused rel err %.3e vs cublas (bound 1e-2)", rank,
                    s.m, s.n, s.k, e);
      return 1;
    } else if (rank == 0) {
      sh->res[si][kGemmAsFused].err = e;
    }
    gemm_test::poison(c, out_elems, st);
    if (!run_impl(kPdl) || cudaStreamSynchronize(st) != cudaSuccess) {
      std::snprintf(sh->error, sizeof(sh->error), "rank %u: mkernel_pdl failed on %ldx%ldx%ld: %s", rank, s.m, s.n,
                    s.k, comm.check().to_string().c_str());
      return 1;
    }
    if (const double e = rel_err(c, ref, out_elems, sums, st); !(e < 1e-2) || !comm.check().ok()) {
      std::snprintf(sh->error, sizeof(sh->error), "rank %u: wrong on %ldx%ldx%ld: mkernel_pdl rel err %.3e (bound "
                    "1e-2); %s", rank, s.m, s.n, s.k, e, comm.check().to_string().c_str());
      return 1;
    } else if (rank == 0) {
      sh->res[si][kPdl].err = e;
    }
    // Timing: rounds take turns between implementations.
    std::vector<float> times[kImpls];
    std::vector<float> host_us[kImpls];
    for (int warm = 0; warm < 5; ++warm)
      for (int impl = 0; impl < kImpls; ++impl)
        if (impl != kNccl || nc != nullptr) run_impl(impl);
    RANK_CUDA(cudaStreamSynchronize(st));
    // --graph: one graph of args.graph calls per implementation, captured after the warm-up.
    cudaGraphExec_t graphs[kImpls] = {};
    if (args.graph > 0) {
      for (int impl = 0; impl < kImpls; ++impl) {
        if (impl == kNccl && nc == nullptr) continue;
        const std::string e = gemm_test::capture_calls(st, args.graph, [&] { return run_impl(impl); }, &graphs[impl]);
        if (!e.empty()) {
          std::snprintf(sh->error, sizeof(sh->error), "rank %u: capturing %d calls of %s in a CUDA graph on %ldx%ldx%ld: "
                        "%s; %s", rank, args.graph, kImplNames[impl], s.m, s.n, s.k, e.c_str(),
                        comm.check().to_string().c_str());
          return 1;
        }
        RANK_CUDA(cudaGraphLaunch(graphs[impl], st));  // warm-up replay
      }
      RANK_CUDA(cudaStreamSynchronize(st));
    }
    const int per_round = std::max(1, args.iters / args.rounds);
    for (int round = 0; round < args.rounds; ++round)
      for (int impl = 0; impl < kImpls; ++impl) {
        if (impl == kNccl && nc == nullptr) continue;
        for (int i = 0; i < per_round; ++i) {
          cudaEventRecord(e0, st);
          const auto h0 = std::chrono::steady_clock::now();
          const bool ok = graphs[impl] != nullptr ? cudaGraphLaunch(graphs[impl], st) == cudaSuccess : run_impl(impl);
          if (graphs[impl] == nullptr)
            host_us[impl].push_back(std::chrono::duration<float, std::micro>(std::chrono::steady_clock::now() - h0).count());
          cudaEventRecord(e1, st);
          const cudaError_t te = cudaEventSynchronize(e1);
          if (!ok || te != cudaSuccess) {
            std::snprintf(sh->error, sizeof(sh->error), "rank %u: %s failed while timed on %ldx%ldx%ld: %s; %s", rank,
                          kImplNames[impl], s.m, s.n, s.k, cudaGetErrorString(te), comm.check().to_string().c_str());
            return 1;
          }
          float ms = 0;
          cudaEventElapsedTime(&ms, e0, e1);
          times[impl].push_back(graphs[impl] != nullptr ? ms / static_cast<float>(args.graph) : ms);
        }
      }
    for (cudaGraphExec_t& g : graphs)
      if (g != nullptr) cudaGraphExecDestroy(g);
    if (!comm.check().ok()) {
      std::snprintf(sh->error, sizeof(sh->error), "rank %u: %s", rank, comm.check().to_string().c_str());
      return 1;
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
  cublasDestroy(blas);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--world") args.world = std::atoi(next().c_str());
    else if (a == "--all-reduce") args.all_reduce = true;
    else if (a == "--nodes") args.nodes = true;
    else if (a == "--provider") args.provider = next();
    else if (a == "--shapes") {
      const auto more = parse_shapes(next());
      args.shapes.insert(args.shapes.end(), more.begin(), more.end());
    }
    else if (a == "--small-m")
      for (int64_t m : {128, 256, 512, 1024, 2048})
        for (int64_t k : {8192, 28672}) args.shapes.push_back({m, 8192, k});
    else if (a == "--odd")  // M not a multiple of 128 x world, N a multiple of 8 only
      for (Shape s : {Shape{4104, 8200, 8192}, Shape{1000, 4104, 4160}, Shape{8200, 1544, 2112}})
        args.shapes.push_back(s);
    else if (a == "--iters") args.iters = std::atoi(next().c_str());
    else if (a == "--rounds") args.rounds = std::atoi(next().c_str());
    else if (a == "--graph") args.graph = std::atoi(next().c_str());
    else if (a == "--gemm-blocks") args.config.gemm_blocks = std::atoi(next().c_str());
    else if (a == "--block-n") args.config.block_n = std::atoi(next().c_str());
    else if (a == "--cluster-m") args.config.cluster_m = std::atoi(next().c_str());
    else if (a == "--jsonl" || a == "--json") args.jsonl = next();
    else if (a == "--commit") args.commit = next();
    else if (a == "--machine") args.machine = next();
    else {
      std::printf("gemm_rs_bench: unknown argument \"%s\" (see the header of bench/fused/gemm_rs_bench.cu)\n", a.c_str());
      return 2;
    }
  }
  if (args.iters < 1 || args.rounds < 1) {
    std::printf("gemm_rs_bench: --iters %d, --rounds %d; expected both at least 1\n", args.iters, args.rounds);
    return 2;
  }
  if (args.graph < 0 || args.graph > 1000) {
    std::printf("gemm_rs_bench: --graph %d; expected 0 (eager calls) to 1000 calls per graph\n", args.graph);
    return 2;
  }
  ::setenv("CUDA_MODULE_LOADING", "EAGER", 1);  // no module load while a rank's kernel waits for another
  const int gpus = mkt::driver_gpu_count();
  if (gpus < 1) {
    std::printf("gemm_rs_bench: needs a Hopper GPU, the driver lists none\n");
    return 77;
  }
  if (args.world <= 0) args.world = gpus;
  if (args.shapes.empty()) args.shapes = {{4096, 8192, 8192}, {8192, 8192, 8192}, {16384, 14336, 4096}, {32768, 8192, 8192}};
  if (args.shapes.size() > kMaxShapes) {
    std::printf("gemm_rs_bench: %zu shapes; at most %d per run\n", args.shapes.size(), kMaxShapes);
    return 2;
  }
  for (const Shape& s : args.shapes)
    if (s.m <= 0 || s.m % args.world != 0 || s.n <= 0 || s.n % 8 != 0 || s.k <= 0 || s.k % (8 * args.world) != 0) {
      std::printf("gemm_rs_bench: shape %ldx%ldx%ld does not split over %d ranks (M %% world, N %% 8, K %% (8 world))\n",
                  s.m, s.n, s.k, args.world);
      return 2;
    }
  if (args.world > gpus)
    std::printf("note: %d ranks on %d GPU(s): ranks share GPUs, timings are not those of a deployment\n", args.world,
                gpus);
  if (args.nodes) ::setenv("NCCL_P2P_DISABLE", "1", 1);  // NCCL through host memory too
  ::setenv("NCCL_NVLS_ENABLE", "0", 1);                   // never NVLink multicast (DESIGN.md)
  auto* sh = static_cast<Shared*>(::mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  if (sh == MAP_FAILED) {
    std::printf("gemm_rs_bench: mmap of %zu bytes: %s\n", sizeof(Shared), std::strerror(errno));
    return 1;
  }
  std::memset(sh, 0, sizeof(Shared));
  if (args.world > 1) {
    if (const ncclResult_t r = ncclGetUniqueId(&sh->nccl_id); r != ncclSuccess) {
      std::printf("gemm_rs_bench: ncclGetUniqueId: %s\n", ncclGetErrorString(r));
      return 1;
    }
  }
  std::vector<std::unique_ptr<mkt::Daemon>> daemons;
  std::string ids;
  for (int g = 0; g < gpus; ++g) ids += (g ? ", " : "") + std::to_string(g);
  const int num_daemons = args.nodes ? args.world : 1;
  std::vector<std::string> sockets;
  for (int d = 0; d < num_daemons; ++d) {
    daemons.push_back(std::make_unique<mkt::Daemon>(
        mkt::temp_dir("rsbench"),
        mkt::daemon_yaml(args.provider, ids) + "node: {name: \"bench-node-" + std::to_string(d) + "\"}\n"));
    if (!daemons.back()->start()) {
      std::printf("gemm_rs_bench: mkerneld %d did not start (log in %s)\n", d, daemons.back()->dir().c_str());
      return 1;
    }
    sockets.push_back(daemons.back()->socket());
  }
  rt::Options o;
  o.socket_path = sockets[0];
  o.proxy = 0;
  auto id = rt::get_unique_id(o);
  if (!id.ok()) {
    std::printf("gemm_rs_bench: get_unique_id: %s\n", id.status().to_string().c_str());
    return 1;
  }
  const int failed = mkt::run_ranks(static_cast<uint32_t>(args.world),
                                    [&](uint32_t r) { return run_rank(r, args, id.value(), sockets, sh); },
                                    std::chrono::seconds(1200));
  if (failed != 0) {
    std::printf("gemm_rs_bench: %d rank(s) failed: %s\n", failed,
                sh->error[0] ? sh->error : "(no message: a rank crashed or was killed; see its output above)");
    return 1;
  }
  char date[16];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y-%m-%d", std::gmtime(&now));
  FILE* jl = nullptr;
  if (!args.jsonl.empty() && (jl = std::fopen(args.jsonl.c_str(), "a")) == nullptr) {
    std::printf("gemm_rs_bench: cannot open %s for appending: %s\n", args.jsonl.c_str(), std::strerror(errno));
    return 1;
  }
  const char* nccl_name = args.nodes ? "nccl_shm+cublas" : "nccl+cublas";
  const std::string timing = args.graph > 0 ? "graph " + std::to_string(args.graph) : "eager";
  const bool seq_ran = args.world > 1;
  std::printf("\ngemm_rs_bench%s: world %d, nodes %d%s, %s, commit %s, timing %s\n",
              args.all_reduce ? " --all-reduce" : "", args.world, args.nodes ? args.world : 1,
              args.nodes ? (" over " + args.provider + ", host-staged").c_str() : "", args.machine.c_str(),
              args.commit.c_str(),
              args.graph > 0 ? (timing + " (a replay / " + std::to_string(args.graph) + ")").c_str()
                             : "eager (each call from an idle GPU)");
  std::printf("checked before timing: one launch of mkernel vs %s, mkernel_gemm vs cublas (rel. Frobenius error < "
              "1e-2): all passed\n",
              seq_ran ? nccl_name : "cublas (one rank: the partial is the result)");
  std::printf("%-20s %10s %10s %10s %10s %10s %15s %9s %9s %9s %9s %9s\n", "M x N x K", "mkernel", "pdl", "our gemm",
              "as fused", "cublas", nccl_name, "rel err", "vs gemm", "vs as f.", "vs seq", "vs cublas");
  for (size_t si = 0; si < args.shapes.size(); ++si) {
    const Shape& s = args.shapes[si];
    const Result* r = sh->res[si];
    char shape[32];
    std::snprintf(shape, sizeof(shape), "%ldx%ldx%ld", s.m, s.n, s.k);
    const double seq = r[kNccl].ran ? r[kNccl].median_ms : 0;
    std::printf("%-20s %10.4f %10.4f %10.4f %10.4f %10.4f %15.4f %9.1e %9.3f %9.3f %9.3f %9.3f\n", shape,
                r[0].median_ms, r[kPdl].median_ms, r[1].median_ms, r[kGemmAsFused].median_ms, r[2].median_ms, seq, r[0].err, r[0].median_ms / r[1].median_ms,
                r[0].median_ms / r[kGemmAsFused].median_ms, seq > 0 ? seq / r[0].median_ms : 0.0,
                r[2].median_ms / r[0].median_ms);
    if (args.graph == 0) {
      std::printf("%-20s host us per call (enqueue):", "");
      for (int impl = 0; impl < kImpls; ++impl)
        if (r[impl].ran) std::printf(" %s %.1f", kImplNames[impl], r[impl].host_us);
      std::printf("\n");
    }
    for (int impl = 0; impl < kImpls && jl; ++impl) {
      if (!r[impl].ran) continue;
      std::fprintf(jl,
                   "{\"benchmark\": \"%s\", \"shape\": {\"M\": %ld, \"N\": %ld, \"K\": %ld}, \"split\": \"K over "
                   "world (A columns and W columns); %s\", \"world\": %d, \"nodes\": %d, \"impl\": "
                   "\"%s\", \"median_ms\": %.4f, \"p10_ms\": %.4f, \"p90_ms\": %.4f, \"iters\": %d, "
                   "\"rel_err_vs_unfused\": %.2e, \"config\": \"%s\", \"provider\": \"%s\", \"timing\": \"%s\", \"host_us\": %.1f, "
                   "\"machine\": \"%s\", \"commit\": \"%s\", \"date\": \"%s\"}\n",
                   args.all_reduce ? "gemm_ar" : "gemm_rs", s.m, s.n, s.k,
                   args.all_reduce ? "the whole result on every rank" : "result rows over world", args.world,
                   args.nodes ? args.world : 1, impl == kNccl ? nccl_name : kImplNames[impl],
                   r[impl].median_ms, r[impl].p10_ms, r[impl].p90_ms, args.iters, r[impl].err,
                   impl == 0 || impl == kPdl ? sh->config[si] : "",
                   args.nodes ? args.provider.c_str() : (args.world > 1 ? "nvlink" : "none (one rank)"),
                   timing.c_str(), r[impl].host_us, args.machine.c_str(), args.commit.c_str(), date);
    }
  }
  if (jl) std::fclose(jl);
  std::printf("(rel err: mkernel vs the unfused result; vs gemm: fused / our GEMM alone on the per-rank problem; vs "
              "as f.: fused / our GEMM alone in the fused op's configuration; vs seq: %s / fused%s; vs cublas: cuBLAS alone / fused%s)\n",
              nccl_name, seq_ran ? "" : " (not run with one rank)",
              args.all_reduce ? "" : "; torch_fused / fused: gemm_rs_torch.py");
  return 0;
}
