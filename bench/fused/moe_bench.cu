// moe_bench: the MoE kernels (ops.h MoeDispatchCombine) on the ranks of one node, in one run:
//   fused     dispatch + grouped GEMM (one weight [inter, hidden] per expert) + combine, one launch
//   unfused   dispatch, then our grouped GEMM on the dispatched rows, then combine (three launches)
//   dispatch  the dispatch alone: token bytes per GPU per second (every token row this rank sends,
//             its own included, and the bytes that crossed NVLink)
//   combine   the combine alone
//   mlp       (--mlp) the two-matrix MLP (MoeMlp, SwiGLU): dispatch, w1 [2 inter, hidden] per
//             expert, the activation, w2 [hidden, inter] per expert, combine of hidden-wide rows
//   act       (--mlp) the activation kernel alone on the dispatched rows (y [rows, 2 inter] -> h)
// The reference the issue names, NCCL all_to_all + torch._grouped_mm, is
// ../shared/baselines/moe_baseline.py; run_moe_on_gpu_machine.sh runs it in the same call and
// prints both tables. Shapes: T tokens per rank (--tokens 128,4096,16384), hidden 7168,
// intermediate 2048, 256 experts, top-8 (--hidden, --inter, --experts, --top-k), routing uniform
// and Zipf 1.1 (moe_make_routing, the same generator as the tests: weighted draws without
// replacement), and zipf_logits, moe_baseline.py's own Zipf: the top-k of Gaussian logits plus a
// prior -1.1 log(e + 1), which puts far more of the choices on the first experts (compare with the
// baseline's Zipf rows only this one; its uniform is our uniform's distribution). Random bf16 inputs and
// weights. Before timing, one fused launch is checked against the unfused path on every rank
// (relative Frobenius error < 1e-2). Timing: warm-up, then --iters launches per variant, each
// timed with CUDA events on rank 0's stream (all ranks launch in step); medians (p10, p90) in a
// table last and as JSON lines in --jsonl.
//
//   moe_bench [--world W] [--tokens 128,4096] [--routing uniform,zipf,zipf_logits] [--iters 30]
//             [--jsonl FILE] [--commit C] [--machine M] [--blocks N] [--gemm-blocks N] [--cluster-m C] [--mlp]
// --blocks: communication blocks (fused: role blocks); --gemm-blocks, --cluster-m: the fused
// kernel's GEMM blocks (0: every SM the role blocks leave) and cluster size (0: choose). Without
// --machine the record names the GPUs this program sees.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "fused/moe/moe_act.h"
#include "fused/moe/moe_plan.h"
#include "fused_harness.h"
#include "gemm/gemm_test_util.cuh"
#include "gemm/sm90_bf16_grouped_gemm.h"
#include "mkernel/runtime/ops.h"

// Present only in diagnostic builds of the fused kernel (common/phase_trace.cuh).
extern "C" __attribute__((weak)) void mkernel_moe_phase_trace_print();

namespace {

namespace rt = mkernel::rt;
namespace mk = mkernel::kernels;

// moe_baseline.py's Zipf routing (header): per token the top-k experts of Gaussian logits plus
// the prior -1.1 log(e + 1), best first, the same popularity on every rank.
std::vector<int32_t> logit_routing(uint32_t tokens, uint32_t experts, uint32_t k, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  std::vector<int32_t> out(size_t{tokens} * k);
  std::vector<std::pair<float, int32_t>> logits(experts);
  for (uint32_t t = 0; t < tokens; ++t) {
    for (uint32_t e = 0; e < experts; ++e)
      logits[e] = {-1.1f * std::log(static_cast<float>(e + 1)) + n01(rng), static_cast<int32_t>(e)};
    std::partial_sort(logits.begin(), logits.begin() + k, logits.end(),
                      [](const auto& a, const auto& b) { return a.first > b.first; });
    for (uint32_t j = 0; j < k; ++j) out[size_t{t} * k + j] = logits[j].second;
  }
  return out;
}

struct Args {
  int world = 0;
  std::vector<uint32_t> tokens{128, 4096, 16384};
  std::vector<std::string> routing{"uniform", "zipf"};
  uint32_t hidden = 7168, inter = 2048, experts = 256, top_k = 8;
  int iters = 30, blocks = 0, gemm_blocks = 0, cluster_m = 0;
  std::string jsonl, commit = "unknown", machine = "unknown";
  bool mlp = false;  // --mlp: also the two-matrix MLP and its activation alone
};

struct Stat {
  double med = 0, p10 = 0, p90 = 0;
};
Stat stats(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  if (v.empty()) return {};
  return {v[v.size() / 2], v[v.size() / 10], v[std::min(v.size() - 1, v.size() * 9 / 10)]};
}

std::vector<uint32_t> parse_u32(const char* s) {
  std::vector<uint32_t> out;
  for (const char* p = s; *p;) {
    out.push_back(static_cast<uint32_t>(std::strtoul(p, nullptr, 10)));
    while (*p && *p != ',') ++p;
    if (*p == ',') ++p;
  }
  return out;
}

struct Row {
  uint32_t tokens;
  std::string routing;
  Stat fused, unfused, dispatch, combine, mlp, act;
  double err = -1;
  uint64_t sent_rows = 0, nvlink_rows = 0;  // rank 0's dispatched token rows, and those to other GPUs
  std::string plan;
};

std::mutex g_mu;
std::vector<Row> g_rows;
std::string g_error;

#define B_CUDA(call)                                                                                  \
  do {                                                                                                \
    const cudaError_t e_ = (call);                                                                    \
    if (e_ != cudaSuccess) {                                                                          \
      std::lock_guard<std::mutex> l_(g_mu);                                                           \
      g_error = "rank " + std::to_string(rank) + ": " + #call + ": " + cudaGetErrorString(e_);        \
      return 1;                                                                                       \
    }                                                                                                 \
  } while (0)
#define B_OK(status, what)                                                                            \
  do {                                                                                                \
    const mkernel::Status s_ = (status);                                                              \
    if (!s_.ok()) {                                                                                   \
      std::lock_guard<std::mutex> l_(g_mu);                                                           \
      g_error = "rank " + std::to_string(rank) + ": " + (what) + ": " + s_.to_string();               \
      return 1;                                                                                       \
    }                                                                                                 \
  } while (0)

double rel_err(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b) {
  auto f = [](uint16_t h) {
    uint32_t u = uint32_t{h} << 16;
    float x;
    std::memcpy(&x, &u, 4);
    return double(x);
  };
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = f(a[i]), y = f(b[i]);
    if (!std::isfinite(x)) return INFINITY;
    num += (x - y) * (x - y);
    den += y * y;
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

int run_rank(const Args& args, uint32_t rank, rt::Communicator& comm, cudaStream_t st, const fused_test::RankSync& sync) {
  const uint32_t R = comm.size(), H = args.hidden, N = args.inter, E = args.experts, k = args.top_k;
  const uint32_t epr = E / R;
  // The weights of this rank's experts [epr, N, H], once.
  __nv_bfloat16* w = nullptr;
  B_CUDA(cudaMalloc(&w, 2ull * epr * N * H));
  gemm_test::fill_random(w, uint64_t{epr} * N * H, 900 + rank, 0.05f, st);
  // --mlp: the MLP's weights, w1 [epr, 2N, H] (gate rows, then up rows) and w2 [epr, H, N].
  __nv_bfloat16 *w1 = nullptr, *w2 = nullptr;
  if (args.mlp) {
    B_CUDA(cudaMalloc(&w1, 4ull * epr * N * H));
    B_CUDA(cudaMalloc(&w2, 2ull * epr * N * H));
    gemm_test::fill_random(w1, 2ull * epr * N * H, 1900 + rank, 0.03f, st);
    gemm_test::fill_random(w2, uint64_t{epr} * N * H, 2900 + rank, 0.03f, st);
  }
  for (uint32_t T : args.tokens)
    for (const std::string& routing : args.routing) {
      rt::MoeConfig plain, fused;
      plain.blocks = args.blocks;
      fused.blocks = args.blocks;
      fused.gemm_blocks = args.gemm_blocks;
      fused.cluster_m = args.cluster_m;
      fused.fused = true;
      auto a = rt::MoeDispatchCombine::create(comm, T, H, N, E, k, plain, st);
      B_OK(a.status(), "create");
      auto b = rt::MoeDispatchCombine::create(comm, T, H, N, E, k, fused, st);
      B_OK(b.status(), "create (fused)");
      rt::MoeDispatchCombine& op = *a.value();
      rt::MoeDispatchCombine& fop = *b.value();
      const uint64_t rows = op.rows_capacity();
      __nv_bfloat16 *x, *xe, *ye, *out, *out_f;
      int32_t* ch;
      float* sc;
      uint32_t* off;
      B_CUDA(cudaMalloc(&x, 2ull * T * H));
      B_CUDA(cudaMalloc(&xe, 2ull * rows * H));
      B_CUDA(cudaMalloc(&ye, 2ull * rows * N));
      B_CUDA(cudaMalloc(&out, 2ull * T * N));
      B_CUDA(cudaMalloc(&out_f, 2ull * T * N));
      B_CUDA(cudaMalloc(&ch, 4ull * T * k));
      B_CUDA(cudaMalloc(&sc, 4ull * T * k));
      B_CUDA(cudaMalloc(&off, 4ull * (epr + 1)));
      gemm_test::fill_random(x, uint64_t{T} * H, 100 + rank, 1.0f, st);
      const auto choices =
          routing == "zipf_logits"
              ? logit_routing(T, E, k, 4242 + T + 7ull * rank)
              : mk::moe_make_routing(routing == "zipf" ? mk::MoeRouteKind::kZipf : mk::MoeRouteKind::kUniform, T, E,
                                     k, R, rank, 4242 + T);
      std::vector<float> scores(size_t{T} * k);
      std::mt19937 rng(rank * 31 + T);
      for (float& v : scores) v = std::uniform_real_distribution<float>(0.05f, 0.25f)(rng);
      B_CUDA(cudaMemcpy(ch, choices.data(), choices.size() * 4, cudaMemcpyHostToDevice));
      B_CUDA(cudaMemcpy(sc, scores.data(), scores.size() * 4, cudaMemcpyHostToDevice));
      // Our grouped GEMM on the dispatched rows (offsets written by the dispatch, on the device).
      mk::GroupedGemmArgs ga;
      ga.a = xe;
      ga.w = w;
      ga.d = ye;
      ga.offsets = off;
      ga.capacity = static_cast<int64_t>(rows);
      ga.num_groups = epr;
      ga.n = N;
      ga.k = H;
      ga.wait = comm.wait_context();
      mk::GroupedGemmPlan gplan;
      if (const mk::GemmResult r = mk::grouped_gemm_plan(ga, &gplan); !r.ok()) {
        std::lock_guard<std::mutex> l(g_mu);
        g_error = "rank " + std::to_string(rank) + ": grouped_gemm_plan: " + r.message;
        return 1;
      }
      auto unfused = [&]() -> mkernel::Status {
        MK_RETURN_IF_ERROR(op.dispatch(x, ch, sc, xe, off, nullptr, nullptr, nullptr, st));
        if (const mk::GemmResult r = mk::grouped_gemm_launch(gplan, st); !r.ok())
          return mkernel::Status(mkernel::StatusCode::kInternal, r.message);
        return op.combine(ye, out, st);
      };
      B_CUDA(cudaStreamSynchronize(st));
      sync();
      // Check: the fused launch against the unfused path.
      B_OK(unfused(), "unfused");
      B_OK(fop.forward(x, ch, sc, w, out_f, st), "fused");
      B_CUDA(cudaStreamSynchronize(st));
      B_OK(comm.check(), "check");
      std::vector<uint16_t> h1(size_t{T} * N), h2(size_t{T} * N);
      B_CUDA(cudaMemcpy(h1.data(), out, h1.size() * 2, cudaMemcpyDeviceToHost));
      B_CUDA(cudaMemcpy(h2.data(), out_f, h2.size() * 2, cudaMemcpyDeviceToHost));
      const double err = rel_err(h2, h1);
      // Timing.
      auto time = [&](auto&& fn) -> std::vector<float> {
        std::vector<float> ms;
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0);
        cudaEventCreate(&e1);
        for (int i = 0; i < 3; ++i) (void)fn();
        cudaStreamSynchronize(st);
        sync();
        for (int i = 0; i < args.iters; ++i) {
          cudaEventRecord(e0, st);
          (void)fn();
          cudaEventRecord(e1, st);
          cudaEventSynchronize(e1);
          float t = 0;
          cudaEventElapsedTime(&t, e0, e1);
          ms.push_back(t);
        }
        cudaEventDestroy(e0);
        cudaEventDestroy(e1);
        return ms;
      };
      const auto t_fused = time([&] { return fop.forward(x, ch, sc, w, out_f, st); });
      if (mkernel_moe_phase_trace_print != nullptr && rank == 0) {  // a diagnostic build's phase trace
        B_CUDA(cudaStreamSynchronize(st));
        mkernel_moe_phase_trace_print();
      }
      const auto t_unfused = time(unfused);
      // Dispatch and combine alone: events around each in dispatch + combine pairs (a combine
      // must follow its dispatch).
      std::vector<float> t_dispatch, t_combine;
      {
        cudaEvent_t e0, e1, e2;
        cudaEventCreate(&e0);
        cudaEventCreate(&e1);
        cudaEventCreate(&e2);
        sync();
        for (int i = 0; i < args.iters + 3; ++i) {
          cudaEventRecord(e0, st);
          const mkernel::Status s1 = op.dispatch(x, ch, sc, xe, off, nullptr, nullptr, nullptr, st);
          cudaEventRecord(e1, st);
          const mkernel::Status s2 = op.combine(ye, out, st);
          cudaEventRecord(e2, st);
          cudaEventSynchronize(e2);
          B_OK(s1, "dispatch");
          B_OK(s2, "combine");
          float a1 = 0, a2 = 0;
          cudaEventElapsedTime(&a1, e0, e1);
          cudaEventElapsedTime(&a2, e1, e2);
          if (i >= 3) {  // warm-up
            t_dispatch.push_back(a1);
            t_combine.push_back(a2);
          }
        }
        cudaEventDestroy(e0);
        cudaEventDestroy(e1);
        cudaEventDestroy(e2);
      }
      B_CUDA(cudaStreamSynchronize(st));
      B_OK(comm.check(), "check after timing");
      // --mlp: the two-matrix MLP, and its activation alone on this routing's rows.
      std::vector<float> t_mlp, t_act;
      if (args.mlp) {
        auto m = rt::MoeMlp::create(comm, T, H, N, E, k, rt::MoeActivation::kSwiGlu, plain, st);
        B_OK(m.status(), "create (mlp)");
        __nv_bfloat16 *out_m, *y1, *hh;
        B_CUDA(cudaMalloc(&out_m, 2ull * T * H));
        B_CUDA(cudaMalloc(&y1, 4ull * rows * N));
        B_CUDA(cudaMalloc(&hh, 2ull * rows * N));
        gemm_test::fill_random(y1, 2ull * rows * N, 77 + rank, 2.0f, st);
        t_mlp = time([&] { return m.value()->forward(x, ch, sc, w1, w2, out_m, st); });
        B_CUDA(cudaStreamSynchronize(st));
        B_OK(comm.check(), "check after the mlp");
        std::vector<uint16_t> hm(size_t{T} * H);
        B_CUDA(cudaMemcpy(hm.data(), out_m, hm.size() * 2, cudaMemcpyDeviceToHost));
        if (!std::isfinite(rel_err(hm, hm))) B_OK(mkernel::Status(mkernel::StatusCode::kInternal, "non-finite output"), "mlp");
        int sms = 0;
        B_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, comm.cuda_device()));
        t_act = time([&] {
          const cudaError_t e = mk::moe_activation_launch(mk::MoeAct::kSwiGlu, y1, hh, off, epr, rows, N, sms, st);
          return e == cudaSuccess ? mkernel::Status::Ok()
                                  : mkernel::Status(mkernel::StatusCode::kDeviceError, cudaGetErrorString(e));
        });
        B_CUDA(cudaStreamSynchronize(st));
        cudaFree(out_m);
        cudaFree(y1);
        cudaFree(hh);
      }
      if (rank == 0) {
        Row row;
        row.tokens = T;
        row.routing = routing;
        row.fused = stats(t_fused);
        row.unfused = stats(t_unfused);
        row.dispatch = stats(t_dispatch);
        row.combine = stats(t_combine);
        if (!t_mlp.empty()) row.mlp = stats(t_mlp);
        if (!t_act.empty()) row.act = stats(t_act);
        row.err = err;
        const mk::MoeRouting r = mk::moe_route(mk::moe_geometry(mk::FusedLayout{1, R}, 0, T, H, N, E, k), choices.data());
        for (uint32_t d = 0; d < R; ++d) {
          row.sent_rows += r.send_tokens[d];
          if (d != 0) row.nvlink_rows += r.send_tokens[d];
        }
        row.plan = fop.describe();
        std::lock_guard<std::mutex> l(g_mu);
        g_rows.push_back(row);
      }
      sync();
      cudaFree(x);
      cudaFree(xe);
      cudaFree(ye);
      cudaFree(out);
      cudaFree(out_f);
      cudaFree(ch);
      cudaFree(sc);
      cudaFree(off);
    }
  cudaFree(w);
  cudaFree(w1);
  cudaFree(w2);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  ::setenv("CUDA_MODULE_LOADING", "EAGER", 1);
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "moe_bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--world") args.world = std::atoi(next());
    else if (a == "--tokens") args.tokens = parse_u32(next());
    else if (a == "--routing") {
      args.routing.clear();
      for (std::string s = next(); !s.empty();) {
        const size_t c = s.find(',');
        args.routing.push_back(s.substr(0, c));
        s = c == std::string::npos ? "" : s.substr(c + 1);
      }
      for (const std::string& r : args.routing)
        if (r != "uniform" && r != "zipf" && r != "zipf_logits") {
          std::fprintf(stderr, "moe_bench: --routing %s; expected uniform, zipf or zipf_logits\n", r.c_str());
          return 2;
        }
    } else if (a == "--hidden") args.hidden = static_cast<uint32_t>(std::atoi(next()));
    else if (a == "--inter") args.inter = static_cast<uint32_t>(std::atoi(next()));
    else if (a == "--experts") args.experts = static_cast<uint32_t>(std::atoi(next()));
    else if (a == "--top-k") args.top_k = static_cast<uint32_t>(std::atoi(next()));
    else if (a == "--iters") args.iters = std::atoi(next());
    else if (a == "--blocks") args.blocks = std::atoi(next());
    else if (a == "--gemm-blocks") args.gemm_blocks = std::atoi(next());
    else if (a == "--cluster-m") args.cluster_m = std::atoi(next());
    else if (a == "--jsonl") args.jsonl = next();
    else if (a == "--commit") args.commit = next();
    else if (a == "--machine") args.machine = next();
    else if (a == "--mlp") args.mlp = true;
    else {
      std::fprintf(stderr, "moe_bench: unknown argument %s (see the header of moe_bench.cu)\n", a.c_str());
      return 2;
    }
  }
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) {
    std::fprintf(stderr, "moe_bench: no CUDA device; nothing to measure\n");
    return 1;
  }
  if (args.machine == "unknown") {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) args.machine = std::to_string(gpus) + "x" + prop.name;
  }
  if (args.world <= 0) args.world = gpus;
  if (args.world > gpus) {
    std::fprintf(stderr, "moe_bench: --world %d needs that many GPUs (ranks must not share one: their persistent "
                         "kernels would wait on each other); this machine has %d\n", args.world, gpus);
    return 1;
  }
  fused_test::Topology topo{1, static_cast<uint32_t>(args.world), "shm"};
  fused_test::Cluster cluster(topo, "moebench");
  if (!cluster.start()) {
    std::fprintf(stderr, "moe_bench: mkerneld did not start (MKERNELD, or the path built in)\n");
    return 1;
  }
  rt::Options o;
  uint64_t nvl = 1 << 20;
  uint32_t flags = 65536;
  for (uint32_t T : args.tokens) {
    nvl = std::max(nvl, rt::moe_nvlink_bytes(1, args.world, T, args.hidden, args.inter, args.experts, args.top_k));
    if (args.mlp)  // the MLP's combine carries hidden-wide rows
      nvl = std::max(nvl, rt::moe_nvlink_bytes(1, args.world, T, args.hidden, args.hidden, args.experts, args.top_k));
    flags = std::max(flags, rt::moe_fused_flags(1, args.world, T, args.experts, args.top_k) + 64);
  }
  o.nvlink_bytes = nvl;
  o.fused_flags = flags;
  o.device_wait_timeout_ns = 20'000'000'000ull;
  o.rendezvous_timeout = std::chrono::milliseconds(120000);
  const int failed = fused_test::run_ranks_in_threads(
      cluster, o, {4096},
      [&](uint32_t rank, rt::Communicator& comm, cudaStream_t st, const fused_test::RankSync& sync) {
        return run_rank(args, rank, comm, st, sync);
      });
  if (failed != 0) {
    std::fprintf(stderr, "moe_bench: %d rank(s) failed: %s\n", failed, g_error.c_str());
    return 1;
  }
  FILE* js = args.jsonl.empty() ? nullptr : std::fopen(args.jsonl.c_str(), "a");
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y-%m-%d", std::gmtime(&now));
  std::printf("moe_bench: world %d, hidden %u, inter %u, %u experts, top-%u, %d iterations (medians, ms)\n",
              args.world, args.hidden, args.inter, args.experts, args.top_k, args.iters);
  std::printf("%-7s %-8s %10s %10s %10s %10s %12s %12s %9s%s\n", "T", "routing", "fused", "unfused", "dispatch", "combine",
              "disp GB/s", "NVLink GB/s", "err", args.mlp ? "        mlp        act" : "");
  bool bad = false;
  for (const Row& r : g_rows) {
    const double bytes = double(r.sent_rows) * args.hidden * 2, nvbytes = double(r.nvlink_rows) * args.hidden * 2;
    const double gbs = r.dispatch.med > 0 ? bytes / r.dispatch.med / 1e6 : 0;
    const double nvgbs = r.dispatch.med > 0 ? nvbytes / r.dispatch.med / 1e6 : 0;
    std::printf("%-7u %-8s %10.3f %10.3f %10.3f %10.3f %12.1f %12.1f %9.1e", r.tokens, r.routing.c_str(), r.fused.med,
                r.unfused.med, r.dispatch.med, r.combine.med, gbs, nvgbs, r.err);
    if (args.mlp) std::printf(" %10.3f %10.3f", r.mlp.med, r.act.med);
    std::printf("\n");
    bad = bad || !(r.err < 1e-2);
    if (js) {
      auto rec = [&](const char* impl, const Stat& s, const char* extra) {
        std::fprintf(js,
                     "{\"bench\":\"moe\",\"date\":\"%s\",\"machine\":\"%s\",\"commit\":\"%s\",\"impl\":\"%s\","
                     "\"world\":%d,\"shape\":{\"T\":%u,\"H\":%u,\"I\":%u,\"E\":%u,\"top_k\":%u,\"routing\":\"%s\"},"
                     "\"median_ms\":%.4f,\"p10_ms\":%.4f,\"p90_ms\":%.4f,\"iters\":%d%s}\n",
                     date, args.machine.c_str(), args.commit.c_str(), impl, args.world, r.tokens, args.hidden,
                     args.inter, args.experts, args.top_k, r.routing.c_str(), s.med, s.p10, s.p90, args.iters, extra);
      };
      char extra[160];
      std::snprintf(extra, sizeof(extra), ",\"rel_err_vs_unfused\":%.3e,\"plan\":\"%s\"", r.err, r.plan.c_str());
      rec("mkernel", r.fused, extra);
      rec("mkernel_unfused", r.unfused, "");
      std::snprintf(extra, sizeof(extra), ",\"token_GBps\":%.1f,\"nvlink_GBps\":%.1f", gbs, nvgbs);
      rec("mkernel_dispatch", r.dispatch, extra);
      rec("mkernel_combine", r.combine, "");
      if (args.mlp) {
        rec("mkernel_mlp", r.mlp, ",\"activation\":\"swiglu\",\"out_hidden\":\"hidden\"");
        rec("mkernel_mlp_activation", r.act, ",\"activation\":\"swiglu\"");
      }
    }
  }
  if (js) std::fclose(js);
  if (bad) std::fprintf(stderr, "moe_bench: the fused result differs from the unfused one (err column)\n");
  return bad ? 1 : 0;
}
