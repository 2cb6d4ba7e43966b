// gemm_bench.cu: the persistent bf16 GEMM side by side with cuBLAS and cuBLASLt, same layout
// (A [m, k] row-major, W [n, k] row-major, D [m, n] row-major), one process, one GPU.
//
//   gemm_bench [--sweep] [--quick] [--json FILE] [--commit SHA] [--machine NAME] [--shapes all|big|small]
//              [--random SEED [--count N]] [--variants] [--overhead]
//              [--shape-list MxNxK[,MxNxK...]] [--profile] [--prev-model] [--cluster-k] [--quads] [--promo] [--hot] [--oracle]
//
// --random replaces the list with a seeded random family of N shapes (default 64): M drawn
// log-uniformly in [1, 32768] (any integer), N and K multiples of 8 drawn log-uniformly in
// [256, 32768] (tests/gpu/gemm/gemm_random_family.h); the seed is printed and recorded with
// every row, and the five worst ratios are printed last.
// --variants also times, in the same interleaved rounds, the rule choosing between the 128- and
// 256-wide tiles only ("w2", the rule before the other widths), whole tiles only ("dp"),
// stream-K forced ("sk"), the rule with the other of 128 and 256 columns ("bn"), the other
// cluster size ("cl"), the rule held to 128-, 256- or 192-row tiles ("m128", "m256", "m192"), and the
// other fix-up of split tiles ("det" or "atomic", GemmConfig::deterministic), and the rule held
// to the operands as given or to swapped ones ("noswap", "swap", GemmConfig::swap_ab): the data
// that calibrates the cost model. With it (or alone with --cluster-k): the rule without split-K
// inside clusters ("nok") and, for m <= 256, with each cluster size forced ("k2", "k4", "k8");
// where the rule takes it at a width above 64, also the rule limited to widths up to 64 ("k64w").
// --m192 (alone or with --cluster-k) times, for m > 128, the rule held to 192-row tiles ("m192"),
// to 192-row tiles in clusters of 1 ("m192c1"), to 128-row tiles ("m128") and to 128-row tiles in
// clusters of 1 ("m128c1") beside its own choice.
// --pairs times, beside the rule, the rule told never to use pairs along n ("pn1":
// GemmConfig::cluster_n = 1), the rule weighing them itself ("pnrule": GemmScheduleRequest::
// cluster_n = 0), held to them ("pn2"), held to them with 192-row tiles ("pn2m192", m > 128) and
// with the operands as given ("pn2plain").
// --quads times 2 x 2 clusters (GemmConfig::cluster_m = cluster_n = 2: each CTA multicasts half of
// its A tile and half of its weight tile) beside the rule: the rule weighing them ("quadrule"), the
// rule's own tile in them where they are built for its width ("q22same"), and, for m > 128, held
// to them at each height and width, the rest the rule's choice ("q22m128w256", ...): the data
// that fits their cost (GemmCostModel::quad_factor).
// --oracle first times, with short sequential timings, every configuration of the engine's space
// that can apply to the shape (oracle_configs: operands as given at every width, in clusters of 1
// and 2, whole tiles, stream-K and 2-6 splits; 192-row tiles; swapped operands at every swapped
// width with the same decompositions and with split-K inside clusters of 2, 4 and 8), then times
// its three fastest in the interleaved rounds beside the rule ("oracle1" .. "oracle3"): whether a
// shape's gap to cuBLAS is the rule's choice or the engine's reach. A diagnosis, not a figure.
// --promo times, beside the rule's choice, the same configuration with each other L2 promotion of
// the operand maps ("pr0", "pr128", "pr256": GemmConfig::l2_promotion).
// --hot times every implementation on one set of operands, which then stay in L2 when they fit
// (the usual rotation over sets larger than L2 makes every launch read device memory): the
// difference says how much of a shape's time is waiting for DRAM. A diagnosis, not a figure.
// --overhead first measures, for a few small shapes, where a launch's time goes: host time per
// call (enqueue only), GPU time per launch from a CUDA graph of 20 launches, and the usual
// event time, for mkernel and cuBLAS.
//
// --prev-model also times, in the same rounds, the configuration another set of costs chooses
// ("prev", compared_cost_model() below, asked with everything the library weighs for a plain
// GEMM): the check of a refit of the model (bench/gemm/fit_cost_model.py) on shapes it was not
// fitted to, before it goes into the header.
// --shape-list times the given shapes instead of the fixed list (e.g. the worst of a random run).
// --profile launches cuBLAS, cuBLASLt and the default mkernel configuration twice each per shape
// and times nothing: a run for a profiler (`ncu`), which then sees every library kernel's name,
// grid, cluster and shared memory beside ours.
//
// --commit defaults to `git rev-parse --short HEAD` where git works, else "unknown".
//
// Per shape: random bf16 inputs, rotating input/output sets larger than L2 (so every launch
// reads from device memory), warm-up, then the median (and p10/p90) of per-launch event times,
// all implementations timed in interleaved rounds so that clock and temperature drift over the
// run affect them alike. Every mkernel configuration is first checked against cuBLAS's output.
// --sweep times every configuration of the engine's space that applies (oracle_configs, below) and
// reports the best next to the default one (--oracle also times its three fastest in the rounds).
// A SM-withheld sweep follows (4, 8, 16 SMs left to other work; cuBLASLt given the same SM
// target). Prints a table with ratios last; appends one JSON line per (shape, impl) to FILE.
#include <cublasLt.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gemm/gemm_random_family.h"
#include "gemm/gemm_test_util.cuh"
#include "gemm/sm90_bf16_gemm.h"

namespace mk = mkernel::kernels;
using namespace gemm_test;

namespace {

struct Shape {
  int m, n, k;
  const char* note;
};

struct Timing {
  double median_ms = 0, p10_ms = 0, p90_ms = 0;
  int iters = 0;
};

struct Options {
  bool sweep = false;
  bool quick = false;
  std::string json;
  std::string commit = "unknown";
  std::string machine;  // empty: "1x" and the device's name (the GPU that ran the records)
  std::string shapes = "all";
  uint64_t random_seed = 0;  // 0: the fixed list
  int random_count = 64;
  bool variants = false;
  bool overhead = false;
  std::string shape_list;  // "MxNxK,MxNxK": these shapes only
  bool profile = false;    // launch each implementation twice per shape, time nothing
  bool cluster_k = false;  // --cluster-k: time the in-cluster split-K variants only
  bool m192 = false;       // --m192: time the rule held to 192-row tiles beside it
  bool pairs = false;      // --pairs: time the rule without and held to pairs along n beside it
  bool quads = false;      // --quads: time 2 x 2 clusters beside the rule
  bool promo = false;      // --promo: the rule's configuration with the other L2 promotions
  bool hot = false;        // --hot: one operand set (in L2 when it fits), a diagnosis only
  bool prev_model = false; // also time the compared costs' choice ("mkernel_prev")
  bool oracle = false;     // --oracle: time the whole configuration space, the best three beside the rule
};

// Parses "MxNxK[,MxNxK...]"; an entry that is not three positive integers is an error naming it.
bool parse_shape_list(const std::string& text, std::vector<Shape>* out) {
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t end = std::min(text.find(',', pos), text.size());
    const std::string item = text.substr(pos, end - pos);
    int m = 0, n = 0, k = 0;
    char tail = 0;
    if (std::sscanf(item.c_str(), "%dx%dx%d%c", &m, &n, &k, &tail) != 3 || m <= 0 || n <= 0 || k <= 0) {
      std::fprintf(stderr, "--shape-list: entry '%s' is not MxNxK with positive integers\n", item.c_str());
      return false;
    }
    out->push_back({m, n, k, "listed"});
    pos = end + 1;
  }
  return !out->empty();
}

std::vector<Shape> random_shapes(uint64_t seed, int count) {
  std::vector<Shape> v;
  for (const auto& r : random_family(seed, count)) v.push_back({r.m, r.n, r.k, "random"});
  return v;
}

double tflops(const Shape& s, double ms) { return 2.0 * s.m * s.n * s.k / (ms * 1e-3) / 1e12; }

// Sum of squares of (x - y) and of y, for the relative error of a bench output against cuBLAS.
__global__ void diff_kernel(const __nv_bfloat16* x, const __nv_bfloat16* y, size_t n, double* acc) {
  double num = 0, den = 0;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const double a = __bfloat162float(x[i]), b = __bfloat162float(y[i]);
    num += (a - b) * (a - b);
    den += b * b;
  }
  atomicAdd(&acc[0], num);
  atomicAdd(&acc[1], den);
}

double rel_diff(const __nv_bfloat16* x, const __nv_bfloat16* y, size_t n) {
  double* acc = nullptr;
  GT_CUDA(cudaMalloc(&acc, 2 * sizeof(double)));
  GT_CUDA(cudaMemset(acc, 0, 2 * sizeof(double)));
  diff_kernel<<<1024, 256>>>(x, y, n, acc);
  double h[2];
  GT_CUDA(cudaMemcpy(h, acc, sizeof(h), cudaMemcpyDeviceToHost));
  GT_CUDA(cudaFree(acc));
  return std::isfinite(h[0]) ? std::sqrt(h[0] / std::max(h[1], 1e-30)) : INFINITY;
}

// Rotating operand sets: enough that one pass over them is several times the L2.
struct Operands {
  std::vector<__nv_bfloat16*> a, w, d;
  __nv_bfloat16* check = nullptr;
  int sets = 1;
  Operands(const Shape& s, size_t l2_bytes, uint64_t seed) {
    const size_t bytes = 2ull * (static_cast<size_t>(s.m) * s.k + static_cast<size_t>(s.n) * s.k +
                                 static_cast<size_t>(s.m) * s.n);
    sets = static_cast<int>(std::min<size_t>(16, std::max<size_t>(1, (4 * l2_bytes + bytes - 1) / bytes)));
    for (int i = 0; i < sets; ++i) {
      __nv_bfloat16 *pa, *pw, *pd;
      GT_CUDA(cudaMalloc(&pa, 2ull * s.m * s.k));
      GT_CUDA(cudaMalloc(&pw, 2ull * s.n * s.k));
      GT_CUDA(cudaMalloc(&pd, 2ull * s.m * s.n));
      fill_random(pa, static_cast<size_t>(s.m) * s.k, seed + 3 * i);
      fill_random(pw, static_cast<size_t>(s.n) * s.k, seed + 3 * i + 1);
      poison(pd, static_cast<size_t>(s.m) * s.n);
      a.push_back(pa);
      w.push_back(pw);
      d.push_back(pd);
    }
    GT_CUDA(cudaMalloc(&check, 2ull * s.m * s.n));
  }
  ~Operands() {
    for (int i = 0; i < sets; ++i) {
      cudaFree(a[i]);
      cudaFree(w[i]);
      cudaFree(d[i]);
    }
    cudaFree(check);
  }
};

template <class F>
Timing time_launches(F&& launch, int sets, int warmup, int iters) {
  for (int i = 0; i < warmup; ++i) launch(i % sets);
  GT_CUDA(cudaDeviceSynchronize());
  std::vector<cudaEvent_t> ev(2 * iters);
  for (auto& e : ev) GT_CUDA(cudaEventCreate(&e));
  for (int i = 0; i < iters; ++i) {
    GT_CUDA(cudaEventRecord(ev[2 * i]));
    launch(i % sets);
    GT_CUDA(cudaEventRecord(ev[2 * i + 1]));
  }
  GT_CUDA(cudaDeviceSynchronize());
  std::vector<double> ms(iters);
  for (int i = 0; i < iters; ++i) {
    float t = 0;
    GT_CUDA(cudaEventElapsedTime(&t, ev[2 * i], ev[2 * i + 1]));
    ms[i] = t;
  }
  for (auto& e : ev) GT_CUDA(cudaEventDestroy(e));
  std::sort(ms.begin(), ms.end());
  Timing t;
  t.iters = iters;
  t.median_ms = ms[iters / 2];
  t.p10_ms = ms[iters / 10];
  t.p90_ms = ms[(iters * 9) / 10];
  return t;
}

// Times several implementations in interleaved rounds (each round: iters/rounds launches of
// each, in turn) and returns the median/p10/p90 of each one's per-launch times.
std::vector<Timing> time_round_robin(const std::vector<std::function<void(int)>>& fns, int sets, int warmup, int iters,
                                     int rounds) {
  for (const auto& f : fns)
    for (int i = 0; i < warmup; ++i) f(i % sets);
  GT_CUDA(cudaDeviceSynchronize());
  const int per_round = std::max(1, iters / rounds);
  std::vector<std::vector<double>> ms(fns.size());
  std::vector<cudaEvent_t> ev(2 * per_round);
  for (auto& e : ev) GT_CUDA(cudaEventCreate(&e));
  for (int r = 0; r < rounds; ++r) {
    for (size_t f = 0; f < fns.size(); ++f) {
      for (int i = 0; i < per_round; ++i) {
        GT_CUDA(cudaEventRecord(ev[2 * i]));
        fns[f]((r * per_round + i) % sets);
        GT_CUDA(cudaEventRecord(ev[2 * i + 1]));
      }
      GT_CUDA(cudaDeviceSynchronize());
      for (int i = 0; i < per_round; ++i) {
        float t = 0;
        GT_CUDA(cudaEventElapsedTime(&t, ev[2 * i], ev[2 * i + 1]));
        ms[f].push_back(t);
      }
    }
  }
  for (auto& e : ev) GT_CUDA(cudaEventDestroy(e));
  std::vector<Timing> out;
  for (auto& v : ms) {
    std::sort(v.begin(), v.end());
    const int n = static_cast<int>(v.size());
    Timing t;
    t.iters = n;
    t.median_ms = v[n / 2];
    t.p10_ms = v[n / 10];
    t.p90_ms = v[(n * 9) / 10];
    out.push_back(t);
  }
  return out;
}

struct MkRunner {
  std::vector<mk::GemmPlan> plans;  // one per operand set
  void* ws = nullptr;
  size_t ws_bytes = 0;
  mk::DeviceStatus* status = nullptr;
  bool ok = false;
  std::string error;
  MkRunner(const Shape& s, Operands& ops, const mk::GemmConfig& cfg) {
    GT_CUDA(cudaMalloc(&status, sizeof(mk::DeviceStatus)));
    GT_CUDA(cudaMemset(status, 0, sizeof(mk::DeviceStatus)));
    for (int i = 0; i < ops.sets; ++i) {
      mk::GemmArgs args;
      args.a = ops.a[i];
      args.w = ops.w[i];
      args.d = ops.d[i];
      args.m = s.m;
      args.n = s.n;
      args.k = s.k;
      args.config = cfg;
      args.wait.status = status;
      if (i == 0) {
        ws_bytes = mk::gemm_workspace_bytes(args);
        if (ws_bytes) {
          GT_CUDA(cudaMalloc(&ws, ws_bytes));
          GT_CUDA(cudaMemset(ws, 0, ws_bytes));
        }
      }
      args.workspace = ws;
      args.workspace_bytes = ws_bytes;
      mk::GemmPlan plan;
      mk::GemmResult r = mk::gemm_plan(args, &plan);
      if (!r.ok()) {
        error = r.message;
        return;
      }
      plans.push_back(plan);
    }
    ok = true;
  }
  void launch(int set) {
    mk::GemmResult r = mk::gemm_launch(plans[set], nullptr);
    if (!r.ok()) {
      std::fprintf(stderr, "mkernel launch failed: %s\n", r.message.c_str());
      std::exit(1);
    }
  }
  mk::DeviceStatus read_status() {
    mk::DeviceStatus s{};
    GT_CUDA(cudaMemcpy(&s, status, sizeof(s), cudaMemcpyDeviceToHost));
    return s;
  }
  ~MkRunner() {
    cudaFree(ws);
    cudaFree(status);
  }
};

struct LtRunner {
  cublasLtHandle_t lt = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulHeuristicResult_t heur{};
  void* ws = nullptr;
  size_t ws_bytes = 64ull << 20;
  bool ok = false;
  LtRunner(cublasLtHandle_t h, const Shape& s, int sm_target) : lt(h) {
    GT_CUBLAS(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    GT_CUBLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    GT_CUBLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    if (sm_target > 0) {
      GT_CUBLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &sm_target,
                                               sizeof(sm_target)));
    }
    GT_CUBLAS(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, s.k, s.n, s.k));
    GT_CUBLAS(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, s.k, s.m, s.k));
    GT_CUBLAS(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, s.n, s.m, s.n));
    cublasLtMatmulPreference_t pref;
    GT_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
    GT_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                   sizeof(ws_bytes)));
    int found = 0;
    cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 1, &heur, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    GT_CUDA(cudaMalloc(&ws, ws_bytes));
    ok = found > 0;
  }
  void launch(const __nv_bfloat16* a, const __nv_bfloat16* w, __nv_bfloat16* d) {
    const float alpha = 1.f, beta = 0.f;
    GT_CUBLAS(cublasLtMatmul(lt, desc, &alpha, w, la, a, lb, &beta, d, lc, d, lc, &heur.algo, ws, ws_bytes, nullptr));
  }
  ~LtRunner() {
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(desc);
    cudaFree(ws);
  }
};

struct Row {
  Shape shape;
  std::string impl;
  std::string config;
  Timing t;
  double err = 0;  // relative error vs cuBLAS (mkernel rows)
  int sms = 0;     // SMs given to the GEMM (withheld sweep), 0 = all
  double predicted_us = 0;  // the cost model's prediction (mkernel rows)
};

std::string today() {
  char buf[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(buf, sizeof buf, "%Y-%m-%d", std::gmtime(&now));
  return buf;
}

void append_json(const Options& o, const std::vector<Row>& rows) {
  if (o.json.empty()) return;
  std::ofstream f(o.json, std::ios::app);
  const std::string date = today();
  for (const Row& r : rows) {
    char line[1024];
    std::snprintf(line, sizeof line,
                  "{\"benchmark\": \"gemm\", \"shape\": {\"M\": %d, \"N\": %d, \"K\": %d}, \"world\": 1, \"nodes\": 1, "
                  "\"impl\": \"%s\", \"median_ms\": %.4f, \"p10_ms\": %.4f, \"p90_ms\": %.4f, \"iters\": %d, "
                  "\"tflops\": %.1f, \"config\": \"%s\", \"sms\": %d, \"split\": \"%s\", \"machine\": \"%s\", "
                  "\"commit\": \"%s\", \"date\": \"%s\"%s%s}",
                  r.shape.m, r.shape.n, r.shape.k, r.impl.c_str(), r.t.median_ms, r.t.p10_ms, r.t.p90_ms, r.t.iters,
                  tflops(r.shape, r.t.median_ms), r.config.c_str(), r.sms, r.shape.note, o.machine.c_str(),
                  o.commit.c_str(), date.c_str(),
                  o.random_seed != 0 ? (", \"seed\": " + std::to_string(o.random_seed)).c_str() : "",
                  r.predicted_us > 0 ? (", \"predicted_us\": " + std::to_string(r.predicted_us)).c_str() : "");
    f << line << "\n";
  }
}

std::vector<mk::GemmConfig> oracle_configs(const Shape& s) {
  std::vector<mk::GemmConfig> v;
  auto decompositions = [&](mk::GemmConfig c) {
    c.num_splits = 1;
    c.stream_k = 0;
    v.push_back(c);
    c.stream_k = 1;
    v.push_back(c);
    c.stream_k = 0;
    for (int sp : {2, 3, 4, 6}) {
      c.num_splits = sp;
      v.push_back(c);
    }
  };
  for (int w : mk::kGemmBlockWidths)
    for (int cl : {1, 2}) {
      mk::GemmConfig c;
      c.swap_ab = 0;
      c.cluster_k = 1;
      c.block_n = w;
      c.cluster_m = cl;
      decompositions(c);
    }
  if (s.m > 128)
    for (int w : mk::kGemmM192Widths)
      for (int cl : {1, 2}) {
        mk::GemmConfig c;
        c.swap_ab = 0;
        c.cluster_k = 1;
        c.block_m = 192;
        c.block_n = w;
        c.cluster_m = cl;
        c.num_splits = 1;
        c.stream_k = 0;
        v.push_back(c);
        c.stream_k = 1;
        v.push_back(c);
      }
  // Swapped: widths up to the first that covers m (wider ones only pad), all of them for m <= 256.
  const int cover = (s.m + 15) / 16 * 16;
  for (int w : mk::kGemmSwapWidths) {
    if (w > cover && w > 16 && s.m > 256) continue;
    for (int cl : {1, 2}) {
      mk::GemmConfig c;
      c.swap_ab = 1;
      c.cluster_k = 1;
      c.block_n = w;
      c.cluster_m = cl;
      decompositions(c);
    }
  }
  for (int w : mk::kGemmSwapClusterKWidths)
    for (int ck : mk::kGemmClusterKSizes) {
      mk::GemmConfig c;
      c.swap_ab = 1;
      c.block_n = w;
      c.cluster_k = ck;
      v.push_back(c);
    }
  return v;
}

__global__ void empty_kernel() {}

// --overhead: where the time of a small launch goes (see the header comment). Event time is what
// the tables report; host time is the caller's thread inside the call (enqueue only); graph time
// is the GPU's time per launch when 20 launches replay from a CUDA graph (no host in between).
void overhead_report(cublasHandle_t cublas, size_t l2) {
  const Shape shapes[] = {{1, 2032, 392, "tiny"}, {25, 352, 320, "tiny"}, {774, 984, 784, "small"},
                          {137, 9440, 9016, "mid"}, {1, 8192, 8192, "decode"}};
  std::printf("\nlaunch overhead (microseconds per launch: event-timed median / host enqueue / graph replay)\n");
  cudaStream_t st;
  GT_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  GT_CUBLAS(cublasSetStream(cublas, st));
  auto measure = [&](const char* name, const Shape& s, const std::function<void(int)>& f, int sets) {
    constexpr int kIters = 200, kGraph = 20;
    for (int i = 0; i < 20; ++i) f(i % sets);
    GT_CUDA(cudaStreamSynchronize(st));
    // Event-timed, one launch per event pair (as the tables).
    std::vector<cudaEvent_t> ev(2 * kIters);
    for (auto& e : ev) GT_CUDA(cudaEventCreate(&e));
    for (int i = 0; i < kIters; ++i) {
      GT_CUDA(cudaEventRecord(ev[2 * i], st));
      f(i % sets);
      GT_CUDA(cudaEventRecord(ev[2 * i + 1], st));
    }
    GT_CUDA(cudaStreamSynchronize(st));
    std::vector<double> ms(kIters);
    for (int i = 0; i < kIters; ++i) {
      float t = 0;
      GT_CUDA(cudaEventElapsedTime(&t, ev[2 * i], ev[2 * i + 1]));
      ms[i] = t;
    }
    std::sort(ms.begin(), ms.end());
    // Host time of the call alone.
    std::vector<double> host(kIters);
    for (int i = 0; i < kIters; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      f(i % sets);
      host[i] = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
      if (i % 32 == 31) GT_CUDA(cudaStreamSynchronize(st));
    }
    GT_CUDA(cudaStreamSynchronize(st));
    std::sort(host.begin(), host.end());
    // Graph replay.
    cudaGraph_t g;
    cudaGraphExec_t ge;
    GT_CUDA(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < kGraph; ++i) f(i % sets);
    GT_CUDA(cudaStreamEndCapture(st, &g));
    GT_CUDA(cudaGraphInstantiate(&ge, g, 0));
    GT_CUDA(cudaGraphLaunch(ge, st));
    GT_CUDA(cudaStreamSynchronize(st));
    std::vector<double> gms(10);
    for (int r = 0; r < 10; ++r) {
      GT_CUDA(cudaEventRecord(ev[0], st));
      GT_CUDA(cudaGraphLaunch(ge, st));
      GT_CUDA(cudaEventRecord(ev[1], st));
      GT_CUDA(cudaStreamSynchronize(st));
      float t = 0;
      GT_CUDA(cudaEventElapsedTime(&t, ev[0], ev[1]));
      gms[r] = t * 1e3 / kGraph;
    }
    std::sort(gms.begin(), gms.end());
    GT_CUDA(cudaGraphExecDestroy(ge));
    GT_CUDA(cudaGraphDestroy(g));
    for (auto& e : ev) GT_CUDA(cudaEventDestroy(e));
    std::printf("  %-16s %-8s event %7.2f  host %6.2f  graph %7.2f\n", (std::to_string(s.m) + "x" + std::to_string(s.n) + "x" + std::to_string(s.k)).c_str(),
                name, ms[kIters / 2] * 1e3, host[kIters / 2], gms[5]);
  };
  for (const Shape& s : shapes) {
    Operands ops(s, l2, 977);
    MkRunner mkr(s, ops, mk::GemmConfig{});
    if (!mkr.ok) continue;
    for (auto& pl : mkr.plans) (void)pl;
    measure("cublas", s, [&](int i) { cublas_gemm(cublas, ops.a[i], ops.w[i], ops.d[i], s.m, s.n, s.k); }, ops.sets);
    auto launch = [&](const MkRunner& r, int i) {
      const mk::GemmResult res = mk::gemm_launch(r.plans[i], st);
      if (!res.ok()) {
        std::fprintf(stderr, "gemm_bench: launch failed: %s\n", res.message.c_str());
        std::exit(1);
      }
    };
    measure("mkernel", s, [&](int i) { launch(mkr, i); }, ops.sets);
    mk::GemmConfig no_pdl;  // the same without programmatic dependent launch
    no_pdl.programmatic_launch = false;
    MkRunner mkr_np(s, ops, no_pdl);
    if (mkr_np.ok) measure("no-pdl", s, [&](int i) { launch(mkr_np, i); }, ops.sets);
    if (&s == &shapes[0]) measure("empty", s, [&](int) { empty_kernel<<<1, 32, 0, st>>>(); }, 1);
    std::fflush(stdout);
  }
  GT_CUBLAS(cublasSetStream(cublas, nullptr));
  GT_CUDA(cudaStreamDestroy(st));
}

}  // namespace

// The costs --prev-model compares with the header's: a refit under test goes here. It holds the
// last one measured, which was not kept (the clusters-of-1 k blocks and no partial-GPU penalty
// for clusters of 2, fitted at 128-byte L2 promotion; docs/kernels.md section 7, "The load path").
mk::GemmCostModel compared_cost_model() {
  mk::GemmCostModel m;
  m.cluster_partial_penalty = 0.0;
  m.general.iter_us_n256_c1 = 0.93;
  m.general.iter_us_n128_c1 = 0.60;
  return m;
}

// A configuration that makes the library plan exactly `s` (tile, cluster, swap, blocks and
// decomposition all fixed).
// Split-K inside clusters (GemmConfig::cluster_k): never ("nok"), and for m <= 256 each cluster
// size ("k2", "k4", "k8"; the rule choosing everything else: swapped operands, widths up to 128).
void add_cluster_k_variants(const Shape& s, std::vector<std::pair<std::string, mk::GemmConfig>>* vs) {
  mk::GemmConfig c;
  c.cluster_k = 1;
  vs->emplace_back("nok", c);
  if (s.m > 256) return;
  for (int ck : {2, 4, 8}) {
    c.cluster_k = ck;
    vs->emplace_back("k" + std::to_string(ck), c);
  }
}

// GEMM blocks the library launches with split-K inside clusters of 2, 4 and 8 on a problem
// with more tiles than SMs (its residency limit per cluster size), found once by planning one.
std::array<int, 3> resident_cluster_k_blocks(Operands& ops) {
  static std::array<int, 3> res = {-1, -1, -1};
  if (res[0] >= 0) return res;
  for (int i = 0; i < 3; ++i) {
    mk::GemmArgs args;
    args.a = ops.a[0];
    args.w = ops.w[0];
    args.d = ops.d[0];
    args.m = 16;
    args.n = 128 * 300;  // 300 tiles: more than any cluster count
    args.k = 1024;
    args.config.swap_ab = 1;
    args.config.block_n = 16;
    args.config.cluster_k = 2 << i;
    mk::GemmPlan plan;
    res[i] = mk::gemm_plan(args, &plan).ok() ? plan.config.num_gemm_blocks : 0;
  }
  return res;
}

mk::GemmConfig config_forcing(const mk::GemmSchedule& s) {
  mk::GemmConfig c;
  c.swap_ab = s.swap_ab ? 1 : 0;
  c.block_m = s.block_m;
  c.block_n = s.block_n;
  c.cluster_m = s.cluster_m;
  c.cluster_n = s.cluster_n;
  c.cluster_k = s.cluster_k;
  c.num_gemm_blocks = s.num_clusters * s.cluster_ctas();
  if (s.sk_units == 0) {
    c.stream_k = 0;
    c.num_splits = 1;
  } else if (s.sk_per_tile != 0) {
    c.stream_k = 0;
    c.num_splits = static_cast<int>(s.sk_per_tile);
    c.dp_tiles = static_cast<int>(s.dp_tiles);
  } else {
    c.stream_k = 1;
    c.sk_units = static_cast<int>(s.sk_units);
    c.dp_tiles = static_cast<int>(s.dp_tiles);
  }
  return c;
}


int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&](const char* what) -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", what);
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--sweep") o.sweep = true;
    else if (a == "--quick") o.quick = true;
    else if (a == "--json") o.json = next("--json");
    else if (a == "--commit") o.commit = next("--commit");
    else if (a == "--machine") o.machine = next("--machine");
    else if (a == "--shapes") o.shapes = next("--shapes");
    else if (a == "--random") o.random_seed = std::strtoull(next("--random").c_str(), nullptr, 10);
    else if (a == "--count") o.random_count = std::atoi(next("--count").c_str());
    else if (a == "--variants") o.variants = true;
    else if (a == "--prev-model") o.prev_model = true;
    else if (a == "--cluster-k") o.cluster_k = true;
    else if (a == "--m192") o.m192 = true;
    else if (a == "--oracle") o.oracle = true;
    else if (a == "--pairs") o.pairs = true;
    else if (a == "--quads") o.quads = true;
    else if (a == "--promo") o.promo = true;
    else if (a == "--hot") o.hot = true;
    else if (a == "--overhead") o.overhead = true;
    else if (a == "--shape-list") o.shape_list = next("--shape-list");
    else if (a == "--profile") o.profile = true;
    else {
      std::fprintf(stderr, "usage: %s [--sweep] [--quick] [--json FILE] [--commit SHA] [--machine NAME] [--shapes all|big|small] [--random SEED [--count N]] [--variants] [--overhead] [--shape-list MxNxK,...] [--profile] [--prev-model] [--cluster-k] [--m192] [--pairs] [--quads] [--promo] [--hot] [--oracle]\n", argv[0]);
      return 2;
    }
  }
  if (o.commit == "unknown") {
    // The commit of the tree being measured, when git and the repository are at hand.
    if (FILE* f = popen("git rev-parse --short HEAD 2>/dev/null", "r")) {
      char buf[64] = {};
      if (std::fgets(buf, sizeof buf, f) != nullptr) {
        std::string c(buf);
        while (!c.empty() && (c.back() == '\n' || c.back() == '\r')) c.pop_back();
        if (!c.empty()) o.commit = c;
      }
      pclose(f);
    }
  }
  require_hopper_or_skip("gemm_bench");
  cudaDeviceProp prop{};
  GT_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("gemm_bench: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
  if (o.machine.empty()) o.machine = std::string("1x") + prop.name;

  std::vector<Shape> shapes;
  if (o.random_seed != 0) {
    o.shapes = "random";
    shapes = random_shapes(o.random_seed, o.random_count);
    std::printf("random family: seed %llu, %d shapes (--random %llu replays it)\n",
                static_cast<unsigned long long>(o.random_seed), o.random_count,
                static_cast<unsigned long long>(o.random_seed));
  }
  if (!o.shape_list.empty()) {
    if (!parse_shape_list(o.shape_list, &shapes)) return 2;
    o.shapes = "listed";
  }
  if (o.shapes == "all" || o.shapes == "big") {
    shapes.insert(shapes.end(), {{8192, 8192, 8192, "full"},
                                 {8192, 14336, 4096, "full"},
                                 {8192, 4096, 14336, "full"},
                                 {4096, 28672, 8192, "full"},
                                 {16384, 8192, 8192, "full"},
                                 // per-rank shapes of the 2-GPU tensor-parallel cases
                                 {8192, 4096, 8192, "tp2 N/2 of 8192x8192x8192"},
                                 {8192, 8192, 4096, "tp2 K/2 of 8192x8192x8192"},
                                 {16384, 7168, 4096, "tp2 N/2 of 16384x14336x4096"},
                                 {16384, 14336, 2048, "tp2 K/2 of 16384x14336x4096"},
                                 {4096, 4096, 8192, "tp2 N/2 of 4096x8192x8192"},
                                 {4096, 8192, 4096, "tp2 K/2 of 4096x8192x8192"},
                                 {32768, 4096, 8192, "tp2 N/2 of 32768x8192x8192"},
                                 {32768, 8192, 4096, "tp2 K/2 of 32768x8192x8192"}});
  }
  if (o.shapes == "all" || o.shapes == "small") {
    shapes.insert(shapes.end(), {{1, 8192, 8192, "decode"},
                                 {16, 8192, 8192, "decode"},
                                 {128, 8192, 8192, "decode"},
                                 {1000, 8192, 8192, "decode"}});
  }
  const int warmup = o.quick ? 5 : 10, iters = o.quick ? 20 : 50;
  const size_t l2 = static_cast<size_t>(prop.l2CacheSize);

  cublasHandle_t cublas;
  GT_CUBLAS(cublasCreate(&cublas));
  cublasLtHandle_t lt;
  GT_CUBLAS(cublasLtCreate(&lt));

  if (o.overhead) overhead_report(cublas, l2);

  std::vector<Row> rows;
  uint64_t seed = static_cast<uint64_t>(std::time(nullptr)) * 1000003ull;
  for (const Shape& s : shapes) {
    // --profile: one set, fewer kernels to profile; --hot: one set, read from L2 where it fits.
    Operands ops(s, (o.profile || o.hot) ? 0 : l2, seed += 101);
    const size_t count = static_cast<size_t>(s.m) * s.n;
    // cuBLAS's output is the correctness reference for every mkernel configuration.
    cublas_gemm(cublas, ops.a[0], ops.w[0], ops.check, s.m, s.n, s.k);

    // Builds a runner for `cfg` and checks one launch against cuBLAS (poisoned output first).
    auto make_mk = [&](const mk::GemmConfig& cfg, Row* out) -> std::unique_ptr<MkRunner> {
      auto r = std::make_unique<MkRunner>(s, ops, cfg);
      if (!r->ok) {
        std::printf("  skip config: %s\n", r->error.c_str());
        return nullptr;
      }
      poison(ops.d[0], count);
      r->launch(0);
      GT_CUDA(cudaDeviceSynchronize());
      const double err = rel_diff(ops.d[0], ops.check, count);
      const mk::DeviceStatus st = r->read_status();
      out->err = err;
      out->config = mk::gemm_config_string(r->plans[0]);
      out->predicted_us = r->plans[0].schedule.predicted_us;
      if (st.code != mk::kDeviceOk || !(err < 1e-2)) {
        std::printf("  WRONG %dx%dx%d [%s]: rel err vs cuBLAS %.3e, status %s\n", s.m, s.n, s.k, out->config.c_str(),
                    err, mk::describe_device_status(st, 0).c_str());
        return nullptr;
      }
      return r;
    };

    // Optional sweep: short sequential timings only to pick a configuration.
    bool have_best = false;
    mk::GemmConfig best_cfg;
    if (o.sweep) {
      double best_ms = 1e30;
      for (const mk::GemmConfig& c : oracle_configs(s)) {
        Row r{s, "", "", {}, 0, 0};
        auto runner = make_mk(c, &r);
        if (!runner) continue;
        r.t = time_launches([&](int i) { runner->launch(i); }, ops.sets, 5, 20);
        std::printf("  sweep %5dx%5dx%5d  %-24s %7.1f TFLOP/s\n", s.m, s.n, s.k, r.config.c_str(),
                    tflops(s, r.t.median_ms));
        if (r.t.median_ms < best_ms) {
          best_ms = r.t.median_ms;
          best_cfg = c;
          have_best = true;
        }
      }
    }

    // --oracle: every applicable configuration, short sequential timings; the three fastest are
    // timed again below in the interleaved rounds.
    std::vector<std::pair<double, mk::GemmConfig>> oracle_best;
    if (o.oracle) {
      int tried = 0, planned = 0;
      for (const mk::GemmConfig& c : oracle_configs(s)) {
        ++tried;
        auto r = std::make_unique<MkRunner>(s, ops, c);
        if (!r->ok) continue;
        ++planned;
        const Timing t = time_launches([&](int i) { r->launch(i); }, ops.sets, 3, 15);
        oracle_best.emplace_back(t.median_ms, c);
      }
      std::sort(oracle_best.begin(), oracle_best.end(),
                [](const auto& x, const auto& y) { return x.first < y.first; });
      if (oracle_best.size() > 3) oracle_best.resize(3);
      std::printf("  oracle %dx%dx%d: %d configurations, %d planned\n", s.m, s.n, s.k, tried, planned);
    }

    // Final figures: all implementations timed round-robin (rounds interleaved), so clock and
    // temperature drift during the run affects them alike.
    std::vector<Row> shape_rows;
    std::vector<std::function<void(int)>> fns;
    shape_rows.push_back({s, "cublas", "cublasGemmEx", {}, 0, 0});
    fns.push_back([&](int i) { cublas_gemm(cublas, ops.a[i], ops.w[i], ops.d[i], s.m, s.n, s.k); });
    LtRunner ltr(lt, s, 0);
    if (ltr.ok) {
      shape_rows.push_back({s, "cublaslt", "heuristic #1", {}, 0, 0});
      fns.push_back([&](int i) { ltr.launch(ops.a[i], ops.w[i], ops.d[i]); });
    }
    Row def{s, "mkernel", "", {}, 0, 0};
    auto def_runner = make_mk(mk::GemmConfig{}, &def);
    if (def_runner) {
      shape_rows.push_back(def);
      fns.push_back([&](int i) { def_runner->launch(i); });
    }
    Row best{s, "mkernel_best", "", {}, 0, 0};
    std::unique_ptr<MkRunner> best_runner;
    if (have_best) best_runner = make_mk(best_cfg, &best);
    if (best_runner) {
      shape_rows.push_back(best);
      fns.push_back([&](int i) { best_runner->launch(i); });
    }
    if (o.profile) {
      for (auto& f : fns) {
        f(0);
        f(0);
      }
      GT_CUDA(cudaDeviceSynchronize());
      std::printf("  profiled %dx%dx%d: %s\n", s.m, s.n, s.k, def.config.c_str());
      continue;
    }
    std::vector<std::unique_ptr<MkRunner>> variant_runners;
    // The request the library makes for this shape on all SMs, with either cluster size.
    auto full_gpu_request = [&] {
      mk::GemmScheduleRequest req;
      req.m = s.m;
      req.n = s.n;
      req.k = s.k;
      req.num_sms = prop.multiProcessorCount;
      req.blocks_cluster1 = prop.multiProcessorCount;
      req.blocks_cluster2 = prop.multiProcessorCount / 2 * 2;
      req.swap_ab = -1;
      return req;
    };
    // ... and with everything the library weighs for a plain GEMM: 192-row tiles and split-K inside
    // clusters of the sizes the device fits.
    auto plain_gemm_request = [&] {
      mk::GemmScheduleRequest req = full_gpu_request();
      req.allow_m192 = true;
      const std::array<int, 3> res = resident_cluster_k_blocks(ops);
      req.blocks_cluster_k2 = res[0];
      req.blocks_cluster_k4 = res[1];
      req.blocks_cluster_k8 = res[2];
      return req;
    };
    if (o.prev_model && def_runner) {
      // The compared costs' choice for this shape, asked as the library asks.
      const mk::GemmSchedule prev = mk::choose_gemm_schedule(plain_gemm_request(), compared_cost_model());
      for (const auto& [tag, sched] : {std::pair<const char*, mk::GemmSchedule>{"prev", prev}}) {
        Row v{s, std::string("mkernel_") + tag, "", {}, 0, 0};
        auto runner = make_mk(config_forcing(sched), &v);
        if (!runner) continue;
        MkRunner* rp = runner.get();
        shape_rows.push_back(v);
        fns.push_back([rp](int i) { rp->launch(i); });
        variant_runners.push_back(std::move(runner));
      }
    }
    // One more configuration timed in the same rounds as "mkernel_<tag>" (skipped with the reason
    // when it cannot be planned or is wrong).
    auto add_variant = [&](const std::string& tag, const mk::GemmConfig& c) {
      Row v{s, "mkernel_" + tag, "", {}, 0, 0};
      auto runner = make_mk(c, &v);
      if (!runner) return;
      MkRunner* rp = runner.get();
      shape_rows.push_back(v);
      fns.push_back([rp](int i) { rp->launch(i); });
      variant_runners.push_back(std::move(runner));
    };
    for (size_t i = 0; i < oracle_best.size(); ++i) add_variant("oracle" + std::to_string(i + 1), oracle_best[i].second);
    if (o.m192 && !o.variants && def_runner && s.m > 128) {
      mk::GemmConfig c;  // the rule held to 192-row tiles (width and decomposition its choice)
      c.block_m = 192;
      add_variant("m192", c);
      c.cluster_m = 1;  // and to clusters of 1 with them
      add_variant("m192c1", c);
      c.block_m = 128;  // the rule held to 128-row tiles, and to those in clusters of 1
      add_variant("m128c1", c);
      c.cluster_m = 0;
      add_variant("m128", c);
    }
    if (o.pairs && !o.variants && def_runner) {
      // Pairs along n (GemmConfig::cluster_n): the rule told never to use them ("pn1", the
      // library's default), weighing them itself ("pnrule"), held to them ("pn2", the rest its
      // choice), held to them with 192-row tiles ("pn2m192", m > 128) and held to them with the
      // operands as given ("pn2plain").
      mk::GemmConfig c;
      c.cluster_n = 1;
      add_variant("pn1", c);
      {
        // The rule weighing pairs along n itself (GemmScheduleRequest::cluster_n = 0; the library
        // asks for them only when told to).
        mk::GemmScheduleRequest req = plain_gemm_request();
        req.cluster_n = 0;
        add_variant("pnrule", config_forcing(mk::choose_gemm_schedule(req)));
      }
      c.cluster_n = 2;
      add_variant("pn2", c);
      if (s.m > 128) {
        c.block_m = 192;
        add_variant("pn2m192", c);
        c.block_m = 0;
      }
      c.swap_ab = 0;
      add_variant("pn2plain", c);
    }
    if (o.quads && !o.variants && def_runner) {
      // 2 x 2 clusters (cluster_m = cluster_n = 2, both tiles multicast): the rule weighing them
      // ("quadrule": GemmConfig::quads = -1), the rule's own tile (height, width, operand order) in
      // them where they are built for it ("q22same", when the rule did not take them), and held to
      // them at each height and width with the operands as given, the decomposition the rule's
      // ("q22m<rows>w<width>"; for m > 128: one m block would leave half of the CTAs padding).
      mk::GemmConfig qr;
      qr.quads = -1;
      add_variant("quadrule", qr);
      const mk::GemmConfig& dc = def_runner->plans[0].config;
      if (mk::gemm_quad_width_built(dc.block_n) && (dc.block_m == 128 || dc.block_m == 192) && dc.cluster_k <= 1 &&
          !(dc.cluster_m == 2 && dc.cluster_n == 2)) {
        mk::GemmConfig c;
        c.block_n = dc.block_n;
        c.block_m = dc.block_m;
        c.swap_ab = dc.swap_ab;
        c.cluster_m = 2;
        c.cluster_n = 2;
        add_variant("q22same", c);
      }
      if (s.m > 128) {
        for (int bm : {128, 192})
          for (int bn : mk::kGemmQuadWidths) {
            if (bm == 192 && !mk::gemm_m192_width_built(bn)) continue;
            mk::GemmConfig c;
            c.swap_ab = 0;
            c.block_m = bm;
            c.block_n = bn;
            c.cluster_m = 2;
            c.cluster_n = 2;
            add_variant("q22m" + std::to_string(bm) + "w" + std::to_string(bn), c);
          }
      }
    }
    if (o.promo && def_runner) {
      // The rule's own configuration with each other L2 promotion of the operand maps
      // ("pr<bytes>": GemmConfig::l2_promotion), in the same rounds.
      for (int pr : {0, 128, 256}) {
        if (pr == mk::kGemmDefaultL2Promotion) continue;
        mk::GemmConfig c;
        c.l2_promotion = pr;
        add_variant("pr" + std::to_string(pr), c);
      }
    }
    if (o.cluster_k && !o.variants && def_runner) {
      std::vector<std::pair<std::string, mk::GemmConfig>> vs;
      add_cluster_k_variants(s, &vs);
      for (const auto& [tag, c] : vs) add_variant(tag, c);
      // Where the rule takes in-cluster split-K at a width above 64, also the rule without
      // those widths ("k64w": its choice before they were built), in the same rounds.
      const mk::GemmSchedule& ds = def_runner->plans[0].schedule;
      if (ds.cluster_k > 1 && ds.block_n > 64) {
        const mk::GemmScheduleRequest req = plain_gemm_request();
        mk::GemmCostModel narrow;
        narrow.clusterk_max_width = 64;
        add_variant("k64w", config_forcing(mk::choose_gemm_schedule(req, narrow)));
      }
    }
    if (o.variants && def_runner) {
      const mk::GemmPlan& dp = def_runner->plans[0];
      std::vector<std::pair<std::string, mk::GemmConfig>> vs;
      {
        mk::GemmConfig c;  // the rule with the 128- and 256-wide tiles only
        c.widths_128_256 = true;
        vs.emplace_back("w2", c);
      }
      {
        mk::GemmConfig c;  // whole tiles only
        c.stream_k = 0;
        c.num_splits = 1;
        vs.emplace_back("dp", c);
      }
      {
        mk::GemmConfig c;  // stream-K wherever it can be used
        c.stream_k = 1;
        vs.emplace_back("sk", c);
      }
      {
        mk::GemmConfig c;
        c.block_n = dp.config.block_n == 128 ? 256 : 128;
        vs.emplace_back("bn", c);
      }
      if ((s.m + 127) / 128 >= 2) {
        mk::GemmConfig c;
        c.cluster_m = dp.config.cluster_m == 2 ? 1 : 2;
        vs.emplace_back("cl", c);
      }
      {
        // The other fix-up: deterministic (a slot per work item, summed in unit order) against
        // the default, or the atomic one when the default is deterministic.
        mk::GemmConfig c;
        c.deterministic = !mk::GemmConfig{}.deterministic;
        vs.emplace_back(c.deterministic ? "det" : "atomic", c);
      }
      {
        // The rule held to the operands as given, and to swapped operands (GemmConfig::swap_ab).
        mk::GemmConfig c;
        c.swap_ab = 0;
        vs.emplace_back("noswap", c);
        c.swap_ab = 1;
        vs.emplace_back("swap", c);
        if (s.m <= 64) {  // swapped, held to 128-row (weight) tiles and to 64-row ones
          c.block_m = 128;
          vs.emplace_back("t128", c);
          c.block_m = 64;
          vs.emplace_back("t64", c);
        }
      }
      add_cluster_k_variants(s, &vs);
      for (int bm : {128, 256, 192}) {  // the rule held to one tile height
        if (bm != 128 && s.m <= 128) continue;
        mk::GemmConfig c;
        c.block_m = bm;
        vs.emplace_back("m" + std::to_string(bm), c);
      }
      for (const auto& [tag, c] : vs) add_variant(tag, c);
    }
    const std::vector<Timing> ts = time_round_robin(fns, ops.sets, warmup, iters, 5);
    for (size_t i = 0; i < shape_rows.size(); ++i) {
      shape_rows[i].t = ts[i];
      rows.push_back(shape_rows[i]);
    }
    std::fflush(stdout);
  }

  // SM-withheld sweep: fewer GEMM blocks (the rest of the SMs left to communication roles);
  // cuBLASLt gets the same SM-count target. Timed round-robin like the main table.
  std::vector<Row> withheld;
  for (const Shape& s : {Shape{8192, 8192, 8192, "full"}, Shape{8192, 14336, 4096, "full"}}) {
    if (o.shapes == "small" || o.shapes == "random" || o.shapes == "listed" || o.profile) break;
    Operands ops(s, l2, seed += 7);
    std::vector<std::unique_ptr<MkRunner>> mks;
    std::vector<std::unique_ptr<LtRunner>> lts;
    std::vector<Row> shape_rows;
    std::vector<std::function<void(int)>> fns;
    for (int held : {0, 4, 8, 16}) {
      const int sms = prop.multiProcessorCount - held;
      mk::GemmConfig c;
      c.num_gemm_blocks = sms;
      auto r = std::make_unique<MkRunner>(s, ops, c);
      if (r->ok) {
        // Named apart from the main table's rows of the same shapes (records: impl and "sms").
        shape_rows.push_back({s, "mkernel_withheld", mk::gemm_config_string(r->plans[0]), {}, 0, sms});
        MkRunner* rp = r.get();
        fns.push_back([&ops, rp](int i) { rp->launch(i); });
        mks.push_back(std::move(r));
      }
      auto lr = std::make_unique<LtRunner>(lt, s, held ? sms : 0);
      if (lr->ok) {
        shape_rows.push_back({s, "cublaslt_withheld", "sm_count_target", {}, 0, sms});
        LtRunner* lp = lr.get();
        fns.push_back([&ops, lp](int i) { lp->launch(ops.a[i], ops.w[i], ops.d[i]); });
        lts.push_back(std::move(lr));
      }
    }
    const std::vector<Timing> ts = time_round_robin(fns, ops.sets, warmup, iters, 5);
    for (size_t i = 0; i < shape_rows.size(); ++i) {
      shape_rows[i].t = ts[i];
      withheld.push_back(shape_rows[i]);
    }
  }

  append_json(o, rows);
  append_json(o, withheld);

  // ---- tables, ratios last ------------------------------------------------------------------------
  std::printf("\nSM-withheld sweep (TFLOP/s; scaling = throughput / (full-GPU throughput x SMs/%d))\n",
              prop.multiProcessorCount);
  std::printf("%-18s %5s %-17s %9s %8s  %s\n", "shape", "SMs", "impl", "TFLOP/s", "scaling", "config");
  for (const Row& r : withheld) {
    double full = 0;
    for (const Row& q : withheld)
      if (q.shape.m == r.shape.m && q.shape.n == r.shape.n && q.shape.k == r.shape.k && q.impl == r.impl &&
          q.sms == prop.multiProcessorCount)
        full = tflops(q.shape, q.t.median_ms);
    const double scaling = tflops(r.shape, r.t.median_ms) / (full * r.sms / prop.multiProcessorCount);
    char shape[32];
    std::snprintf(shape, sizeof shape, "%dx%dx%d", r.shape.m, r.shape.n, r.shape.k);
    std::printf("%-18s %5d %-17s %9.1f %8.3f  %s\n", shape, r.sms, r.impl.c_str(), tflops(r.shape, r.t.median_ms),
                scaling, r.config.c_str());
  }

  // Per shape: TFLOP/s of each library and of mkernel, mkernel / faster library, the measured and
  // predicted times of mkernel's default, and (with --sweep / --variants) the other
  // configurations' ratios against the same library figure.
  std::printf("\n%-18s %8s %8s %8s %7s %9s %9s  %-32s %s\n", "M x N x K", "cuBLAS", "cuBLASLt", "mkernel", "ratio",
              "meas us", "model us", "mkernel config", "other configurations (ratio)");
  std::vector<std::pair<double, std::string>> ratios;  // (mkernel / faster library, shape)
  std::map<std::string, std::vector<double>> other_ratios;
  for (size_t i = 0; i < rows.size();) {
    const Shape s = rows[i].shape;
    double tc = 0, tl = 0, tm = 0, pred = 0, meas = 0;
    std::string cm;
    std::vector<std::pair<std::string, double>> others;  // (impl [config], TFLOP/s)
    size_t j = i;
    for (; j < rows.size() && rows[j].shape.m == s.m && rows[j].shape.n == s.n && rows[j].shape.k == s.k; ++j) {
      const double t = tflops(s, rows[j].t.median_ms);
      if (rows[j].impl == "cublas") tc = t;
      else if (rows[j].impl == "cublaslt") tl = t;
      else if (rows[j].impl == "mkernel") {
        tm = t;
        cm = rows[j].config;
        pred = rows[j].predicted_us;
        meas = rows[j].t.median_ms * 1e3;
      } else {
        others.emplace_back(rows[j].impl.substr(rows[j].impl.find('_') + 1), t);
      }
    }
    const double ref = std::max(tc, tl);
    char shape[32];
    std::snprintf(shape, sizeof shape, "%dx%dx%d", s.m, s.n, s.k);
    std::string other;
    for (const auto& [tag, t] : others) {
      char buf[48];
      std::snprintf(buf, sizeof buf, " %s %.3f", tag.c_str(), ref > 0 ? t / ref : 0);
      other += buf;
      if (ref > 0) other_ratios[tag].push_back(t / ref);
    }
    std::printf("%-18s %8.1f %8.1f %8.1f %7.3f %9.1f %9.1f  %-32s%s\n", shape, tc, tl, tm, ref > 0 ? tm / ref : 0, meas,
                pred, cm.c_str(), other.c_str());
    if (ref > 0 && tm > 0) ratios.emplace_back(tm / ref, std::string(shape) + "  [" + cm + "]");
    i = j;
  }
  for (const auto& [tag, v] : other_ratios) {
    double lg = 0;
    for (double x : v) lg += std::log(x);
    std::printf("configuration %-6s: geometric mean %.3f over %zu shapes\n", tag.c_str(), std::exp(lg / v.size()), v.size());
  }
  std::printf("(ratios are against the faster of cuBLAS and cuBLASLt; TFLOP/s from median times)\n");
  if (!ratios.empty()) {
    double log_sum = 0;
    for (const auto& r : ratios) log_sum += std::log(r.first);
    std::sort(ratios.begin(), ratios.end());
    std::printf("\n%zu shapes%s: geometric mean of mkernel / faster library %.3f, lowest %.3f; the five worst:\n",
                ratios.size(),
                o.random_seed != 0 ? (" of random family seed " + std::to_string(o.random_seed)).c_str() : "",
                std::exp(log_sum / ratios.size()), ratios.front().first);
    for (size_t i = 0; i < ratios.size() && i < 5; ++i)
      std::printf("  %.3f  %s\n", ratios[i].first, ratios[i].second.c_str());
  }
  cublasLtDestroy(lt);
  cublasDestroy(cublas);
  return 0;
}
