// grouped_gemm_bench.cu: the grouped bf16 GEMM (mixture-of-experts layers) side by side with one
// cuBLAS GEMM per group on the same inputs, and with our dense GEMM (and cuBLAS's) on the same
// total rows and one weight (what the grouped GEMM would be if the routing cost nothing).
//
//   grouped_gemm_bench [--json FILE] [--cases-out FILE] [--commit SHA] [--machine NAME] [--quick]
//                      [--aligned] [--case NAME] [--iters N] [--seed S] [--config BLOCK_N,CLUSTER]
//                      [--promo BYTES]
//
// --promo sets the L2 promotion of the operand maps of both our grouped and dense GEMMs
// (GemmConfig::l2_promotion; -1, the default, leaves kGemmDefaultL2Promotion): run it twice in
// one call to compare two promotions, each against the same cuBLAS calls.
//
// Cases (issue 13): 128 experts; the up projection (K = 7168 -> N = 2048) and the down
// projection (K = 2048 -> N = 7168); 4096 x 8 and 16384 x 8 routed rows (tokens x top-8);
// routing uniform (Gaussian logits, top-8 per token, as ../shared/baselines/moe_baseline.py),
// Zipf (logits log(1 / (e + 1)^1.1) + Gaussian) and "empty" (uniform over 96 experts, every
// fourth expert receives nothing). --aligned adds "aligned" (every expert exactly 256 or 1024
// rows: no partial m blocks, no split tiles), which separates what a group's last block costs
// from what grouping itself costs. The counts come from a seeded generator (--seed, printed and
// recorded); --cases-out writes them so bench/gemm/grouped_gemm_torch.py times
// torch._grouped_mm on the same counts.
//
// Per case: random bf16 inputs, one warm-up pass of every implementation, then --iters launches
// of each in 5 interleaved rounds (so clock and temperature drift hit all alike), median / p10 /
// p90 of per-launch event times. The weights alone (128 x 2048 x 7168 bf16 = 3.8 GB) are far
// larger than L2, so one operand set is used. mkernel's output is checked against the cuBLAS
// loop's (relative Frobenius error) before timing. Prints a table last; appends one JSON line
// per (case, impl) to FILE: impl mkernel, cublas_loop, mkernel_dense, cublas_dense.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "gemm/gemm_test_util.cuh"
#include "gemm/sm90_bf16_gemm.h"
#include "gemm/sm90_bf16_grouped_gemm.h"

namespace mk = mkernel::kernels;
using namespace gemm_test;

namespace {

struct Options {
  std::string json;
  std::string cases_out;
  std::string commit = "unknown";
  std::string machine;  // empty: "1x" and the device's name
  bool quick = false;
  bool aligned = false;
  std::string only;  // --case NAME: run that case alone (profiling)  // also the "aligned" routing (a diagnostic beside the issue's cases)
  int iters = 50;
  uint64_t seed = 20261201;
  int block_n = 0, cluster = 0;
  int promo = -1;  // --promo BYTES: the operand maps' L2 promotion, grouped and dense (-1: the default)
};

struct Case {
  std::string name;  // e.g. up_T4096_uniform
  std::string proj;  // up / down
  int tokens = 0;
  std::string routing;
  int n = 0, k = 0;
  std::vector<uint32_t> counts;
  int64_t rows() const {
    int64_t r = 0;
    for (auto c : counts) r += c;
    return r;
  }
};

struct Timing {
  double median_ms = 0, p10_ms = 0, p90_ms = 0;
  int iters = 0;
};

constexpr int kExperts = 128, kTopK = 8;

// Top-8 experts per token from Gaussian logits (plus a per-expert prior), as the MoE baseline.
std::vector<uint32_t> route(int tokens, const std::string& routing, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> prior(kExperts, 0.f);
  for (int e = 0; e < kExperts; ++e) {
    if (routing == "zipf") prior[e] = -1.1f * std::log(static_cast<float>(e + 1));
    if (routing == "empty" && e % 4 == 3) prior[e] = -INFINITY;
  }
  std::vector<uint32_t> counts(kExperts, 0);
  if (routing == "aligned") {  // every expert the same rows, a multiple of 128: no tails, no split tiles
    for (auto& c : counts) c = static_cast<uint32_t>(tokens) * kTopK / kExperts;
    return counts;
  }
  std::vector<int> idx(kExperts);
  std::vector<float> logit(kExperts);
  for (int t = 0; t < tokens; ++t) {
    for (int e = 0; e < kExperts; ++e) {
      logit[e] = prior[e] + normal(rng);
      idx[e] = e;
    }
    std::partial_sort(idx.begin(), idx.begin() + kTopK, idx.end(), [&](int a, int b) { return logit[a] > logit[b]; });
    for (int i = 0; i < kTopK; ++i) ++counts[idx[i]];
  }
  return counts;
}

std::vector<Case> make_cases(const Options& o) {
  std::vector<Case> out;
  const std::vector<int> tokens = o.quick ? std::vector<int>{4096} : std::vector<int>{4096, 16384};
  for (const char* proj : {"up", "down"})
    for (int t : tokens)
      for (const char* routing : {"uniform", "zipf", "empty", "aligned"}) {
        if (std::string(routing) == "aligned" && !o.aligned) continue;
        Case c;
        c.proj = proj;
        c.tokens = t;
        c.routing = routing;
        c.n = c.proj == "up" ? 2048 : 7168;
        c.k = c.proj == "up" ? 7168 : 2048;
        c.name = c.proj + "_T" + std::to_string(t) + "_" + routing;
        if (!o.only.empty() && c.name != o.only) continue;
        c.counts = route(t, routing,
                         o.seed + 1000003ull * t +
                             (c.routing == "zipf"    ? 1
                              : c.routing == "empty" ? 2
                                                     : 0));
        out.push_back(c);
      }
  return out;
}

// Each implementation's launches in interleaved rounds; median / p10 / p90 of per-launch times.
std::vector<Timing> time_round_robin(const std::vector<std::function<void()>>& fns, int iters, int rounds) {
  for (const auto& f : fns) f();
  GT_CUDA(cudaDeviceSynchronize());
  const int per_round = std::max(1, iters / rounds);
  std::vector<std::vector<double>> ms(fns.size());
  std::vector<cudaEvent_t> ev(2 * per_round);
  for (auto& e : ev) GT_CUDA(cudaEventCreate(&e));
  for (int r = 0; r < rounds; ++r) {
    for (size_t f = 0; f < fns.size(); ++f) {
      for (int i = 0; i < per_round; ++i) {
        GT_CUDA(cudaEventRecord(ev[2 * i]));
        fns[f]();
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
    out.push_back(Timing{v[n / 2], v[n / 10], v[(n * 9) / 10], n});
  }
  return out;
}

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

std::string today() {
  char buf[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(buf, sizeof buf, "%Y-%m-%d", std::gmtime(&now));
  return buf;
}

struct Row {
  const Case* c;
  std::string impl, config;
  Timing t;
};

double tflops(const Case& c, double ms) { return 2.0 * static_cast<double>(c.rows()) * c.n * c.k / (ms * 1e-3) / 1e12; }

void append_json(const Options& o, const std::vector<Row>& rows) {
  if (o.json.empty()) return;
  std::ofstream f(o.json, std::ios::app);
  const std::string date = today();
  for (const Row& r : rows) {
    const Case& c = *r.c;
    uint32_t mx = 0, empty = 0;
    for (auto v : c.counts) {
      mx = std::max(mx, v);
      empty += v == 0;
    }
    char line[1200];
    std::snprintf(line, sizeof line,
                  "{\"benchmark\": \"grouped_gemm\", \"shape\": {\"case\": \"%s\", \"experts\": %d, \"tokens\": %d, "
                  "\"topk\": %d, \"rows\": %lld, \"N\": %d, \"K\": %d, \"routing\": \"%s\", \"max_rows\": %u, "
                  "\"empty_experts\": %u}, \"world\": 1, \"nodes\": 1, \"impl\": \"%s\", \"median_ms\": %.4f, "
                  "\"p10_ms\": %.4f, \"p90_ms\": %.4f, \"iters\": %d, \"tflops\": %.1f, \"config\": \"%s\", "
                  "\"seed\": %llu, \"machine\": \"%s\", \"commit\": \"%s\", \"date\": \"%s\"}",
                  c.name.c_str(), kExperts, c.tokens, kTopK, static_cast<long long>(c.rows()), c.n, c.k,
                  c.routing.c_str(), mx, empty, r.impl.c_str(), r.t.median_ms, r.t.p10_ms, r.t.p90_ms, r.t.iters,
                  tflops(c, r.t.median_ms), r.config.c_str(), static_cast<unsigned long long>(o.seed),
                  o.machine.c_str(), o.commit.c_str(), date.c_str());
    f << line << "\n";
  }
}

void write_cases(const Options& o, const std::vector<Case>& cases) {
  if (o.cases_out.empty()) return;
  std::ofstream f(o.cases_out);
  f << "{\"seed\": " << o.seed << ", \"experts\": " << kExperts << ", \"topk\": " << kTopK << ", \"cases\": [\n";
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    f << "  {\"case\": \"" << c.name << "\", \"tokens\": " << c.tokens << ", \"routing\": \"" << c.routing
      << "\", \"N\": " << c.n << ", \"K\": " << c.k << ", \"counts\": [";
    for (size_t g = 0; g < c.counts.size(); ++g) f << (g ? ", " : "") << c.counts[g];
    f << "]}" << (i + 1 < cases.size() ? "," : "") << "\n";
  }
  f << "]}\n";
}

std::vector<Row> run_case(const Options& o, const Case& c, cublasHandle_t cublas) {
  const int64_t rows = c.rows();
  const int64_t groups = kExperts;
  __nv_bfloat16 *a, *w, *d, *dc, *dd;
  uint32_t* offsets;
  mk::DeviceStatus* status;
  GT_CUDA(cudaMalloc(&a, 2ull * rows * c.k));
  GT_CUDA(cudaMalloc(&w, 2ull * groups * c.n * c.k));
  GT_CUDA(cudaMalloc(&d, 2ull * rows * c.n));
  GT_CUDA(cudaMalloc(&dc, 2ull * rows * c.n));
  GT_CUDA(cudaMalloc(&dd, 2ull * rows * c.n));
  GT_CUDA(cudaMalloc(&offsets, sizeof(uint32_t) * (groups + 1)));
  GT_CUDA(cudaMalloc(&status, sizeof(mk::DeviceStatus)));
  GT_CUDA(cudaMemset(status, 0, sizeof(mk::DeviceStatus)));
  fill_random(a, static_cast<size_t>(rows) * c.k, o.seed + 11);
  fill_random(w, static_cast<size_t>(groups) * c.n * c.k, o.seed + 12, 0.05f);
  poison(d, static_cast<size_t>(rows) * c.n);
  poison(dc, static_cast<size_t>(rows) * c.n);
  std::vector<uint32_t> off(groups + 1, 0);
  for (int64_t g = 0; g < groups; ++g) off[g + 1] = off[g] + c.counts[g];
  GT_CUDA(cudaMemcpy(offsets, off.data(), sizeof(uint32_t) * off.size(), cudaMemcpyHostToDevice));

  // mkernel grouped: planned from the bounds only (capacity = the routed rows here).
  mk::GroupedGemmArgs ga;
  ga.a = a;
  ga.w = w;
  ga.d = d;
  ga.offsets = offsets;
  ga.capacity = rows;
  ga.num_groups = groups;
  ga.n = c.n;
  ga.k = c.k;
  ga.config.block_n = o.block_n;
  ga.config.cluster_m = o.cluster;
  ga.config.l2_promotion = o.promo;
  ga.wait.status = status;
  mk::GroupedGemmPlan gplan;
  mk::GemmResult r = mk::grouped_gemm_plan(ga, &gplan);
  if (!r.ok()) {
    std::fprintf(stderr, "%s: grouped plan failed: %s\n", c.name.c_str(), r.message.c_str());
    std::exit(1);
  }
  auto launch_grouped = [&] {
    const mk::GemmResult e = mk::grouped_gemm_launch(gplan, nullptr);
    if (!e.ok()) {
      std::fprintf(stderr, "grouped launch failed: %s\n", e.message.c_str());
      std::exit(1);
    }
  };
  // One cuBLAS call per non-empty group (the host knows the counts: the baseline's advantage).
  auto launch_loop = [&] {
    for (int64_t g = 0; g < groups; ++g) {
      if (c.counts[g] == 0) continue;
      cublas_gemm(cublas, a + static_cast<size_t>(off[g]) * c.k, w + static_cast<size_t>(g) * c.n * c.k,
                  dc + static_cast<size_t>(off[g]) * c.n, static_cast<int>(c.counts[g]), c.n, c.k);
    }
  };
  // Dense equivalents: all rows times group 0's weight.
  mk::GemmArgs da;
  da.a = a;
  da.w = w;
  da.d = dd;
  da.m = rows;
  da.n = c.n;
  da.k = c.k;
  da.config.l2_promotion = o.promo;
  da.wait.status = status;
  void* ws = nullptr;
  da.workspace_bytes = mk::gemm_workspace_bytes(da);
  if (da.workspace_bytes) {
    GT_CUDA(cudaMalloc(&ws, da.workspace_bytes));
    GT_CUDA(cudaMemset(ws, 0, da.workspace_bytes));
  }
  da.workspace = ws;
  mk::GemmPlan dplan;
  r = mk::gemm_plan(da, &dplan);
  if (!r.ok()) {
    std::fprintf(stderr, "%s: dense plan failed: %s\n", c.name.c_str(), r.message.c_str());
    std::exit(1);
  }
  auto launch_dense = [&] {
    const mk::GemmResult e = mk::gemm_launch(dplan, nullptr);
    if (!e.ok()) std::exit(1);
  };
  auto launch_cublas_dense = [&] { cublas_gemm(cublas, a, w, dd, static_cast<int>(rows), c.n, c.k); };

  // Check before timing.
  launch_grouped();
  launch_loop();
  GT_CUDA(cudaDeviceSynchronize());
  mk::DeviceStatus st{};
  GT_CUDA(cudaMemcpy(&st, status, sizeof(st), cudaMemcpyDeviceToHost));
  const double err = rel_diff(d, dc, static_cast<size_t>(rows) * c.n);
  if (st.code != mk::kDeviceOk || !(err < 5e-3)) {
    std::printf("FAIL %s: mkernel vs cuBLAS loop rel err %.3e, status '%s'\n", c.name.c_str(), err,
                mk::describe_device_status(st, 0).c_str());
  }

  const auto t = time_round_robin({launch_grouped, launch_loop, launch_dense, launch_cublas_dense}, o.iters, 5);
  // Every timed launch must have ended cleanly too (a wait that expired would time an error).
  GT_CUDA(cudaDeviceSynchronize());
  GT_CUDA(cudaMemcpy(&st, status, sizeof(st), cudaMemcpyDeviceToHost));
  if (st.code != mk::kDeviceOk) {
    std::printf("FAIL %s: a timed launch ended with status '%s'\n", c.name.c_str(),
                mk::describe_device_status(st, 0).c_str());
  }
  std::vector<Row> out;
  out.push_back({&c, "mkernel", mk::grouped_gemm_config_string(gplan) + " err " + std::to_string(err), t[0]});
  out.push_back({&c, "cublas_loop", "cublasGemmEx x " + std::to_string(groups), t[1]});
  out.push_back({&c, "mkernel_dense", mk::gemm_config_string(dplan), t[2]});
  out.push_back({&c, "cublas_dense", "cublasGemmEx", t[3]});

  cudaFree(ws);
  cudaFree(a);
  cudaFree(w);
  cudaFree(d);
  cudaFree(dc);
  cudaFree(dd);
  cudaFree(offsets);
  cudaFree(status);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // a run ended by its bound still shows how far it got
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
    if (a == "--json")
      o.json = next("--json");
    else if (a == "--cases-out")
      o.cases_out = next("--cases-out");
    else if (a == "--commit")
      o.commit = next("--commit");
    else if (a == "--machine")
      o.machine = next("--machine");
    else if (a == "--quick")
      o.quick = true;
    else if (a == "--aligned")
      o.aligned = true;
    else if (a == "--case")
      o.only = next("--case");
    else if (a == "--iters")
      o.iters = std::max(5, std::atoi(next("--iters").c_str()));
    else if (a == "--seed")
      o.seed = std::strtoull(next("--seed").c_str(), nullptr, 10);
    else if (a == "--promo")
      o.promo = std::atoi(next("--promo").c_str());
    else if (a == "--config") {
      const std::string v = next("--config");
      if (std::sscanf(v.c_str(), "%d,%d", &o.block_n, &o.cluster) != 2) {
        std::fprintf(stderr, "--config expects BLOCK_N,CLUSTER (e.g. 256,2)\n");
        return 2;
      }
    } else {
      std::fprintf(stderr,
                   "usage: %s [--json FILE] [--cases-out FILE] [--commit SHA] [--machine NAME] [--quick] [--aligned] [--case NAME] [--iters N] "
                   "[--seed S] [--config BLOCK_N,CLUSTER] [--promo BYTES]\n",
                   argv[0]);
      return 2;
    }
  }
  if (o.commit == "unknown") {
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
  const std::vector<Case> cases = make_cases(o);
  if (cases.empty()) {
    std::fprintf(stderr, "grouped_gemm_bench: --case %s names no case (NAME is proj_Ttokens_routing, e.g. up_T4096_zipf; "
                 "aligned cases need --aligned, T16384 ones no --quick)\n", o.only.c_str());
    return 2;
  }
  write_cases(o, cases);  // before the GPU check: the torch script can use them either way
  require_hopper_or_skip("grouped_gemm_bench");
  cudaDeviceProp prop{};
  GT_CUDA(cudaGetDeviceProperties(&prop, 0));
  if (o.machine.empty()) o.machine = std::string("1x") + prop.name;
  std::printf("grouped_gemm_bench: %s, %d SMs, seed %llu, %zu cases, %d iterations each\n", prop.name,
              prop.multiProcessorCount, static_cast<unsigned long long>(o.seed), cases.size(), o.iters);
  cublasHandle_t cublas;
  GT_CUBLAS(cublasCreate(&cublas));

  std::vector<Row> all;
  for (const Case& c : cases) {
    const auto rows = run_case(o, c, cublas);
    append_json(o, rows);
    all.insert(all.end(), rows.begin(), rows.end());
    std::printf("%-22s mkernel %.3f ms  cublas_loop %.3f ms  mkernel_dense %.3f ms  [%s]\n", c.name.c_str(),
                rows[0].t.median_ms, rows[1].t.median_ms, rows[2].t.median_ms, rows[0].config.c_str());
  }
  GT_CUBLAS(cublasDestroy(cublas));

  std::printf("\n%-22s %7s %6s %6s | %9s %9s %9s %9s | %8s %8s\n", "case", "rows", "max", "empty", "mkernel",
              "cub_loop", "mk_dense", "cub_dense", "vs loop", "vs dense");
  for (size_t i = 0; i < all.size(); i += 4) {
    const Case& c = *all[i].c;
    uint32_t mx = 0, empty = 0;
    for (auto v : c.counts) {
      mx = std::max(mx, v);
      empty += v == 0;
    }
    std::printf("%-22s %7lld %6u %6u | %9.1f %9.1f %9.1f %9.1f | %8.3f %8.3f\n", c.name.c_str(),
                static_cast<long long>(c.rows()), mx, empty, tflops(c, all[i].t.median_ms),
                tflops(c, all[i + 1].t.median_ms), tflops(c, all[i + 2].t.median_ms), tflops(c, all[i + 3].t.median_ms),
                all[i + 1].t.median_ms / all[i].t.median_ms, all[i + 2].t.median_ms / all[i].t.median_ms);
  }
  std::printf(
      "(TFLOP/s from medians; 'vs loop' = cuBLAS loop time / mkernel time, 'vs dense' = mkernel dense "
      "time on the same rows / mkernel grouped time: the issue's goal is >= 0.9 with uniform routing)\n");
  return 0;
}
