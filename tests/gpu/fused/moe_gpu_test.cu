// MoE dispatch and combine correctness (ops.h), on emulated layouts (fused_harness.h): one GPU
// alone, one node of 2 ranks (NVLink), two nodes of one rank (the proxies, libfabric shm), two
// nodes of two ranks (both paths and the rail peers' forwarding and node sums).
//
// Every rank's tokens come from seeds every rank knows, so each rank rebuilds the whole cluster's
// inputs and routing on the host (moe_make_routing, moe_route, moe_row_layout: the plan's host
// reference) and checks:
//  - dispatch: expert_offsets; every expert row's home rank, token index and score; the row's
//    data equal, bit for bit, to that token's row of x on its home rank;
//  - combine: the "experts" are y = bf16(x * w_e) (w_e = 1 + (e mod 7) / 8, elementwise, by a
//    small kernel on the dispatched rows); out[t] against the fp64 sum over the token's choices
//    of score x y, within bf16 roundings of every partial that travelled (2^-7 of the sum of
//    magnitudes) plus the output's own (2^-8); tokens without a choice give zero rows;
//  - bit-identical results for the same inputs; three launches in a row with new routing each
//    (uniform, Zipf, all tokens to rank 0, masked choices); a CUDA graph of dispatch + experts +
//    combine replayed with routing changed between replays;
//  - the two-matrix MLP (MoeMlp: dispatch, w1, activation, w2, combine) for every activation,
//    against an fp64 reference rounding where the op rounds (run_mlp_rank), repeats, graphs;
//  - errors: a bad expert and routing over recv_tokens_per_source end the launch on every rank,
//    and check() names the cause; a combine without its dispatch is refused; the MLP's bad
//    arguments are refused naming the field.
// Exit 0 = pass, 1 = failure, 77 = no Hopper GPU.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "fused/moe/moe_act.h"
#include "fused/moe/moe_plan.h"
#include "fused_harness.h"
#include "random_cases.h"
#include "gemm/gemm_test_util.cuh"
#include "mkernel/runtime/ops.h"
#include "mkernel/runtime/runtime.h"

namespace {

namespace rt = mkernel::rt;
namespace mk = mkernel::kernels;
using gemm_test::fill_random;

uint64_t g_seed = 0;

struct Case {
  fused_test::Topology topo;
  uint32_t tokens, hidden, experts, top_k;
  uint32_t chunk_tokens = 0;
  uint32_t fused_n = 0;  // > 0: the fused kernel with expert weights [out_hidden = fused_n, hidden]
  bool adaptive = false; // fused: MoeConfig::adaptive_split, the bits checked at several splits
  uint32_t mlp_inter = 0;  // > 0: the two-matrix MLP (MoeMlp) with this intermediate size
  rt::MoeActivation act = rt::MoeActivation::kSwiGlu;
};

float expert_weight(uint32_t e) { return 1.0f + static_cast<float>(e % 7) / 8.0f; }

// y[row] = bf16(x_expert[row] * w_e) for the rows of local expert e (offsets on the device).
__global__ void fake_experts(const __nv_bfloat16* x, __nv_bfloat16* y, const uint32_t* offsets, uint32_t epr,
                             uint32_t first_expert, uint32_t hidden) {
  for (uint32_t e = 0; e < epr; ++e) {
    const float w = 1.0f + static_cast<float>((first_expert + e) % 7) / 8.0f;
    const uint64_t r0 = offsets[e], r1 = offsets[e + 1];
    for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < (r1 - r0) * hidden;
         i += uint64_t{gridDim.x} * blockDim.x)
      y[r0 * hidden + i] = __float2bfloat16(__bfloat162float(x[r0 * hidden + i]) * w);
  }
}

uint64_t x_seed(uint64_t launch_seed, uint32_t q) { return launch_seed * 7919 + q * 104729 + 3; }
uint64_t route_seed(uint64_t launch_seed) { return launch_seed * 31 + 17; }

std::vector<float> make_scores(uint32_t tokens, uint32_t k, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(0.1f, 1.0f);
  std::vector<float> s(size_t{tokens} * k);
  for (float& v : s) v = u(rng);
  return s;
}

mk::MoeRouteKind kind_of(int launch) {
  const mk::MoeRouteKind kinds[] = {mk::MoeRouteKind::kUniform, mk::MoeRouteKind::kZipf, mk::MoeRouteKind::kAllToOneRank,
                                    mk::MoeRouteKind::kNoChoices};
  return kinds[launch % 4];
}

int run_rank(const Case& cs, uint32_t rank, rt::Communicator& comm, cudaStream_t stream, bool shared_gpu,
             const fused_test::RankSync& sync) {
  int fails = 0;
  const uint32_t R = cs.topo.world(), T = cs.tokens, H = cs.hidden, k = cs.top_k;
  rt::MoeConfig cfg;
  cfg.chunk_tokens = cs.chunk_tokens;
  if (shared_gpu) cfg.blocks = std::max(2, 120 / static_cast<int>(R) / 2);
  auto made = rt::MoeDispatchCombine::create(comm, T, H, H, cs.experts, k, cfg, stream);
  RANK_CHECK(made.ok(), "create: %s", made.status().to_string().c_str());
  if (!made.ok()) return fails;
  rt::MoeDispatchCombine& op = *made.value();
  const uint64_t rows_cap = op.rows_capacity();
  const uint32_t epr = op.experts_per_rank();
  if (rank == 0) {
    std::lock_guard<std::mutex> lock(fused_test::g_print);
    std::printf("      plan: %s\n", op.describe().c_str());
  }
  __nv_bfloat16 *x = nullptr, *xe = nullptr, *ye = nullptr, *out = nullptr, *scratch = nullptr;
  int32_t *choices = nullptr, *row_source = nullptr, *row_token = nullptr;
  float *scores = nullptr, *row_score = nullptr;
  uint32_t* offsets = nullptr;
  GT_CUDA(cudaMalloc(&x, sizeof(__nv_bfloat16) * T * H));
  GT_CUDA(cudaMalloc(&scratch, sizeof(__nv_bfloat16) * T * H));
  GT_CUDA(cudaMalloc(&xe, sizeof(__nv_bfloat16) * rows_cap * H));
  GT_CUDA(cudaMalloc(&ye, sizeof(__nv_bfloat16) * rows_cap * H));
  GT_CUDA(cudaMalloc(&out, sizeof(__nv_bfloat16) * T * H));
  GT_CUDA(cudaMalloc(&choices, sizeof(int32_t) * T * k));
  GT_CUDA(cudaMalloc(&scores, sizeof(float) * T * k));
  GT_CUDA(cudaMalloc(&row_source, sizeof(int32_t) * rows_cap));
  GT_CUDA(cudaMalloc(&row_token, sizeof(int32_t) * rows_cap));
  GT_CUDA(cudaMalloc(&row_score, sizeof(float) * rows_cap));
  GT_CUDA(cudaMalloc(&offsets, sizeof(uint32_t) * (epr + 1)));
  GT_CUDA(cudaStreamSynchronize(stream));
  sync();

  mk::MoeGeometry g = mk::moe_geometry(mk::FusedLayout{cs.topo.nodes, cs.topo.gpus}, rank, T, H, H, cs.experts, k);
  g.chunk_tokens = cs.chunk_tokens;

  // Every rank's x (bf16 bits) and routing for a launch seed, rebuilt here.
  struct World {
    std::vector<std::vector<uint16_t>> x;
    std::vector<std::vector<int32_t>> choices;
    std::vector<std::vector<float>> scores;
  };
  auto world_inputs = [&](uint64_t seed, mk::MoeRouteKind kind) {
    World w;
    for (uint32_t q = 0; q < R; ++q) {
      fill_random(scratch, uint64_t{T} * H, x_seed(seed, q), 1.0f, stream);
      GT_CUDA(cudaStreamSynchronize(stream));
      w.x.emplace_back(size_t{T} * H);
      GT_CUDA(cudaMemcpy(w.x.back().data(), scratch, size_t{T} * H * 2, cudaMemcpyDeviceToHost));
      w.choices.push_back(mk::moe_make_routing(kind, T, cs.experts, k, R, q, route_seed(seed)));
      w.scores.push_back(make_scores(T, k, route_seed(seed) + q));
    }
    return w;
  };
  auto prepare = [&](const World& w) {
    fill_random(x, uint64_t{T} * H, 0, 1.0f, stream);  // overwritten below; keeps the stream busy like a model
    GT_CUDA(cudaMemcpyAsync(x, w.x[rank].data(), size_t{T} * H * 2, cudaMemcpyHostToDevice, stream));
    GT_CUDA(cudaMemcpyAsync(choices, w.choices[rank].data(), size_t{T} * k * 4, cudaMemcpyHostToDevice, stream));
    GT_CUDA(cudaMemcpyAsync(scores, w.scores[rank].data(), size_t{T} * k * 4, cudaMemcpyHostToDevice, stream));
    gemm_test::poison(xe, rows_cap * H, stream);
    gemm_test::poison(out, uint64_t{T} * H, stream);
    GT_CUDA(cudaStreamSynchronize(stream));
  };
  auto experts_kernel = [&] {
    fake_experts<<<264, 256, 0, stream>>>(xe, ye, offsets, epr, rank * epr, H);
    GT_CUDA(cudaGetLastError());
  };
  auto bf = [](uint16_t b) {
    uint32_t u = uint32_t{b} << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  };
  std::vector<uint16_t> last_out;
  auto check = [&](const World& w, const std::string& what) {
    GT_CUDA(cudaStreamSynchronize(stream));
    const mkernel::Status st = comm.check();
    RANK_CHECK(st.ok(), "%s: check(): %s", what.c_str(), st.to_string().c_str());
    if (!st.ok()) return;
    // The host reference of this rank's rows.
    std::vector<mk::MoeRouting> routing(R);
    std::vector<std::vector<uint32_t>> counts(R);
    for (uint32_t q = 0; q < R; ++q) {
      mk::MoeGeometry gq = g;
      gq.rank = q;
      routing[q] = mk::moe_route(gq, w.choices[q].data());
      counts[q].push_back(routing[q].send_tokens[rank]);
      for (uint32_t e = 0; e < epr; ++e) counts[q].push_back(routing[q].rows[size_t{rank} * epr + e]);
    }
    mk::MoeGeometry gr = g;
    gr.rank = rank;
    const mk::MoeRowLayout lay = mk::moe_row_layout(gr, counts);
    RANK_CHECK(lay.error.empty(), "%s: reference layout: %s", what.c_str(), lay.error.c_str());
    std::vector<uint32_t> off(epr + 1);
    GT_CUDA(cudaMemcpy(off.data(), offsets, off.size() * 4, cudaMemcpyDeviceToHost));
    for (uint32_t e = 0; e <= epr; ++e)
      RANK_CHECK(off[e] == lay.expert_base[e], "%s: expert_offsets[%u] = %u, expected %llu", what.c_str(), e, off[e],
                 static_cast<unsigned long long>(lay.expert_base[e]));
    const uint64_t rows = lay.total_rows;
    std::vector<int32_t> src(rows), tok(rows);
    std::vector<float> sc(rows);
    std::vector<uint16_t> xr(rows * H);
    if (rows) {
      GT_CUDA(cudaMemcpy(src.data(), row_source, rows * 4, cudaMemcpyDeviceToHost));
      GT_CUDA(cudaMemcpy(tok.data(), row_token, rows * 4, cudaMemcpyDeviceToHost));
      GT_CUDA(cudaMemcpy(sc.data(), row_score, rows * 4, cudaMemcpyDeviceToHost));
      GT_CUDA(cudaMemcpy(xr.data(), xe, rows * H * 2, cudaMemcpyDeviceToHost));
    }
    size_t bad_rows = 0;
    for (uint32_t q = 0; q < R; ++q)
      for (uint32_t t = 0; t < T; ++t)
        for (uint32_t j = 0; j < k; ++j) {
          const int32_t e = w.choices[q][size_t{t} * k + j];
          if (e < 0 || static_cast<uint32_t>(e) / epr != rank) continue;
          const uint64_t row = lay.row_of(e % epr, q, routing[q].slot[size_t{t} * k + j]);
          const bool ok = row < rows && src[row] == static_cast<int32_t>(q) && tok[row] == static_cast<int32_t>(t) &&
                          sc[row] == w.scores[q][size_t{t} * k + j] &&
                          std::equal(xr.begin() + row * H, xr.begin() + (row + 1) * H, w.x[q].begin() + size_t{t} * H);
          if (!ok && bad_rows++ < 3)
            RANK_CHECK(false, "%s: expert %d row %llu (rank %u token %u): source %d token %d score %g, data %s",
                       what.c_str(), e, static_cast<unsigned long long>(row), q, t, row < rows ? src[row] : -1,
                       row < rows ? tok[row] : -1, row < rows ? sc[row] : -1.0f,
                       row < rows && std::equal(xr.begin() + row * H, xr.begin() + (row + 1) * H,
                                                w.x[q].begin() + size_t{t} * H)
                           ? "equal"
                           : "different");
        }
    RANK_CHECK(bad_rows == 0, "%s: %zu expert rows wrong", what.c_str(), bad_rows);
    // The combine.
    std::vector<uint16_t> o(size_t{T} * H);
    GT_CUDA(cudaMemcpy(o.data(), out, o.size() * 2, cudaMemcpyDeviceToHost));
    size_t bad = 0;
    double worst = 0;
    for (uint32_t t = 0; t < T; ++t)
      for (uint32_t c = 0; c < H; ++c) {
        double ref = 0, mag = 0;
        for (uint32_t j = 0; j < k; ++j) {
          const int32_t e = w.choices[rank][size_t{t} * k + j];
          if (e < 0) continue;
          const float y = __bfloat162float(__float2bfloat16(bf(w.x[rank][size_t{t} * H + c]) * expert_weight(e)));
          const double term = double{w.scores[rank][size_t{t} * k + j]} * y;
          ref += term;
          mag += std::fabs(term);
        }
        const double got = bf(o[size_t{t} * H + c]);
        const double tol = std::ldexp(mag, -7) + std::ldexp(std::fabs(ref), -8) + 1e-6;
        const double d = std::fabs(got - ref);
        if (!(d <= tol) && bad++ < 3)
          RANK_CHECK(false, "%s: out[%u][%u] = %g, expected %g (bound %g)", what.c_str(), t, c, got, ref, tol);
        worst = std::max(worst, std::isfinite(d) ? d / tol : 1e30);
      }
    RANK_CHECK(bad == 0, "%s: %zu output elements outside the bound (worst %.3f of it)", what.c_str(), bad, worst);
    last_out = o;
  };

  // Three launches with new routing each, then the first again (bit-identical).
  std::vector<uint16_t> first_out;
  for (int l = 0; l < 4; ++l) {
    const uint64_t seed = g_seed + (l == 3 ? 0 : l);
    const World w = world_inputs(seed, kind_of(l == 3 ? 0 : l));
    prepare(w);
    sync();
    mkernel::Status s = op.dispatch(x, choices, scores, xe, offsets, row_source, row_token, row_score, stream);
    RANK_CHECK(s.ok(), "dispatch %d: %s", l, s.to_string().c_str());
    experts_kernel();
    const mkernel::Status sc = op.combine(ye, out, stream);
    RANK_CHECK(sc.ok(), "combine %d: %s", l, sc.to_string().c_str());
    check(w, "launch " + std::to_string(l) + " routing " + std::to_string(static_cast<int>(kind_of(l == 3 ? 0 : l))));
    if (l == 0) first_out = last_out;
    if (l == 3) RANK_CHECK(last_out == first_out, "the same inputs gave different output bits");
  }
  // A graph of dispatch, experts and combine, replayed with new routing.
  {
    const World w0 = world_inputs(g_seed + 50, mk::MoeRouteKind::kUniform);
    prepare(w0);
    sync();
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    GT_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    mkernel::Status s = op.dispatch(x, choices, scores, xe, offsets, row_source, row_token, row_score, stream);
    experts_kernel();
    mkernel::Status s2 = op.combine(ye, out, stream);
    GT_CUDA(cudaStreamEndCapture(stream, &graph));
    RANK_CHECK(s.ok() && s2.ok(), "capture: %s / %s", s.to_string().c_str(), s2.to_string().c_str());
    GT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    for (int l = 0; l < 3; ++l) {
      const World w = world_inputs(g_seed + 60 + l, kind_of(l + 1));
      prepare(w);
      sync();
      GT_CUDA(cudaGraphLaunch(exec, stream));
      check(w, "graph replay " + std::to_string(l));
    }
    GT_CUDA(cudaGraphExecDestroy(exec));
    GT_CUDA(cudaGraphDestroy(graph));
  }
  sync();
  cudaFree(x);
  cudaFree(scratch);
  cudaFree(xe);
  cudaFree(ye);
  cudaFree(out);
  cudaFree(choices);
  cudaFree(scores);
  cudaFree(row_source);
  cudaFree(row_token);
  cudaFree(row_score);
  cudaFree(offsets);
  return fails;
}

// One launch's inputs on this rank (x, routing, scores for a launch seed), drawn, kept on the host
// for the reference and uploaded; the output poisoned.
struct LaunchInputs {
  std::vector<uint16_t> x;
  std::vector<int32_t> choices;
  std::vector<float> scores;
};
struct LaunchBuffers {
  __nv_bfloat16 *x, *scratch, *out;
  int32_t* choices;
  float* scores;
  uint64_t out_elems;
};
LaunchInputs upload_inputs(uint64_t seed, mk::MoeRouteKind kind, uint32_t rank, uint32_t R, uint32_t T, uint32_t H,
                           uint32_t E, uint32_t k, const LaunchBuffers& b, cudaStream_t stream) {
  LaunchInputs in;
  in.x.resize(size_t{T} * H);
  fill_random(b.scratch, uint64_t{T} * H, x_seed(seed, rank), 1.0f, stream);
  GT_CUDA(cudaStreamSynchronize(stream));
  GT_CUDA(cudaMemcpy(in.x.data(), b.scratch, in.x.size() * 2, cudaMemcpyDeviceToHost));
  GT_CUDA(cudaMemcpy(b.x, b.scratch, in.x.size() * 2, cudaMemcpyDeviceToDevice));
  in.choices = mk::moe_make_routing(kind, T, E, k, R, rank, route_seed(seed));
  in.scores = make_scores(T, k, route_seed(seed) + rank);
  GT_CUDA(cudaMemcpy(b.choices, in.choices.data(), in.choices.size() * 4, cudaMemcpyHostToDevice));
  GT_CUDA(cudaMemcpy(b.scores, in.scores.data(), in.scores.size() * 4, cudaMemcpyHostToDevice));
  gemm_test::poison(b.out, b.out_elems, stream);
  GT_CUDA(cudaStreamSynchronize(stream));
  return in;
}

// One launch (the graph `exec` replayed, or `enqueue`), waited for, and the communicator's status.
template <class Enqueue>
void launch_and_check(uint32_t rank, int& fails, const char* what, uint64_t seed, cudaGraphExec_t exec,
                      Enqueue&& enqueue, rt::Communicator& comm, cudaStream_t stream) {
  if (exec != nullptr) {
    GT_CUDA(cudaGraphLaunch(exec, stream));
  } else {
    const mkernel::Status s = enqueue();
    RANK_CHECK(s.ok(), "%s: %s", what, s.to_string().c_str());
  }
  GT_CUDA(cudaStreamSynchronize(stream));
  const mkernel::Status st = comm.check();
  RANK_CHECK(st.ok(), "%s seed %llu: check(): %s", what, static_cast<unsigned long long>(seed), st.to_string().c_str());
}

// The launch sequence every forward-style op runs here: `launches` launches with new routing each
// (seeds base, base + 1, ...), the first inputs again (the same output bits), then `enqueue`
// captured in a CUDA graph and replayed twice with new routing. check(seed, kind, exec, bits)
// runs one launch (exec: replay that graph instead) and checks it. Returns the first output bits.
template <class Check, class Enqueue>
std::vector<uint16_t> repeat_and_replay(uint32_t rank, int& fails, const char* what, uint64_t base, int launches,
                                        Check&& check, Enqueue&& enqueue, cudaStream_t stream,
                                        const fused_test::RankSync& sync) {
  std::vector<uint16_t> first, again;
  for (int l = 0; l < launches; ++l) check(base + l, kind_of(l), nullptr, l == 0 ? &first : nullptr);
  check(base, kind_of(0), nullptr, &again);
  RANK_CHECK(first == again, "%s: the same inputs gave different output bits", what);
  sync();
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  GT_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const mkernel::Status s = enqueue();
  GT_CUDA(cudaStreamEndCapture(stream, &graph));
  RANK_CHECK(s.ok(), "%s capture: %s", what, s.to_string().c_str());
  GT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (int l = 0; l < 2; ++l) check(base + 100 + l, kind_of(l + 1), exec, nullptr);
  GT_CUDA(cudaGraphExecDestroy(exec));
  GT_CUDA(cudaGraphDestroy(graph));
  return first;
}

// The fused kernel: out[t] = sum over t's choices of score x bf16(x_t @ W_e^T), W_e drawn from a
// seed per expert (every rank can rebuild every expert's weight), against the fp64 reference
// within bf16 roundings of each expert output and each partial (2^-6 of the sum of magnitudes),
// plus the relative Frobenius error; repeats bit-identical; a graph replayed with new routing.
uint64_t w_seed(uint32_t e) { return 7700 + e; }

int run_fused_rank(const Case& cs, uint32_t rank, rt::Communicator& comm, cudaStream_t stream, bool shared_gpu,
                   const fused_test::RankSync& sync) {
  int fails = 0;
  const uint32_t R = cs.topo.world(), T = cs.tokens, H = cs.hidden, N = cs.fused_n, k = cs.top_k, E = cs.experts;
  rt::MoeConfig cfg;
  cfg.chunk_tokens = cs.chunk_tokens;
  cfg.fused = true;
  cfg.adaptive_split = cs.adaptive;
  if (shared_gpu) {  // every rank's persistent kernel must fit beside the others'
    cfg.blocks = 8;
    cfg.cluster_m = 1;
    cfg.gemm_blocks = std::max(2, 120 / static_cast<int>(R) - cfg.blocks);
  }
  auto made = rt::MoeDispatchCombine::create(comm, T, H, N, E, k, cfg, stream);
  RANK_CHECK(made.ok(), "create (fused): %s", made.status().to_string().c_str());
  if (!made.ok()) return fails;
  rt::MoeDispatchCombine& op = *made.value();
  const uint32_t epr = op.experts_per_rank();
  if (rank == 0) {
    std::lock_guard<std::mutex> lock(fused_test::g_print);
    std::printf("      fused plan: %s\n", op.describe().c_str());
  }
  __nv_bfloat16 *x = nullptr, *w = nullptr, *out = nullptr, *scratch = nullptr;
  int32_t* choices = nullptr;
  float* scores = nullptr;
  GT_CUDA(cudaMalloc(&x, 2ull * T * H));
  GT_CUDA(cudaMalloc(&w, 2ull * epr * N * H));
  GT_CUDA(cudaMalloc(&scratch, 2ull * std::max<uint64_t>(uint64_t{T} * H, uint64_t{N} * H)));
  GT_CUDA(cudaMalloc(&out, 2ull * T * N));
  GT_CUDA(cudaMalloc(&choices, 4ull * T * k));
  GT_CUDA(cudaMalloc(&scores, 4ull * T * k));
  // Every expert's weight on the host (bf16 bits); this rank's into w.
  std::vector<std::vector<uint16_t>> W(E);
  for (uint32_t e = 0; e < E; ++e) {
    fill_random(scratch, uint64_t{N} * H, w_seed(e), 1.0f, stream);
    GT_CUDA(cudaStreamSynchronize(stream));
    W[e].resize(size_t{N} * H);
    GT_CUDA(cudaMemcpy(W[e].data(), scratch, W[e].size() * 2, cudaMemcpyDeviceToHost));
    if (e / epr == rank)
      GT_CUDA(cudaMemcpy(w + size_t{e % epr} * N * H, scratch, W[e].size() * 2, cudaMemcpyDeviceToDevice));
  }
  auto bf = [](uint16_t b) {
    uint32_t u = uint32_t{b} << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  };
  GT_CUDA(cudaStreamSynchronize(stream));
  sync();
  const LaunchBuffers bufs{x, scratch, out, choices, scores, uint64_t{T} * N};
  auto run_and_check = [&](uint64_t seed, mk::MoeRouteKind kind, cudaGraphExec_t exec, std::vector<uint16_t>* bits) {
    const LaunchInputs in = upload_inputs(seed, kind, rank, R, T, H, E, k, bufs, stream);
    const std::vector<uint16_t>& xh = in.x;
    const std::vector<int32_t>& ch = in.choices;
    const std::vector<float>& sc = in.scores;
    sync();
    launch_and_check(rank, fails, "fused", seed, exec, [&] { return op.forward(x, choices, scores, w, out, stream); }, comm, stream);
    std::vector<uint16_t> o(size_t{T} * N);
    GT_CUDA(cudaMemcpy(o.data(), out, o.size() * 2, cudaMemcpyDeviceToHost));
    size_t bad = 0;
    double num = 0, den = 0;
    for (uint32_t t = 0; t < T; ++t) {
      std::vector<double> ref(N, 0), mag(N, 0);
      for (uint32_t j = 0; j < k; ++j) {
        const int32_t e = ch[size_t{t} * k + j];
        if (e < 0) continue;
        for (uint32_t n = 0; n < N; ++n) {
          double y = 0;
          for (uint32_t h = 0; h < H; ++h) y += double(bf(xh[size_t{t} * H + h])) * bf(W[e][size_t{n} * H + h]);
          const double term = double(sc[size_t{t} * k + j]) * y;
          ref[n] += term;
          mag[n] += std::fabs(term);
        }
      }
      for (uint32_t n = 0; n < N; ++n) {
        const double got = bf(o[size_t{t} * N + n]);
        const double tol = std::ldexp(mag[n], -6) + std::ldexp(std::fabs(ref[n]), -8) + 1e-5;
        if (!(std::fabs(got - ref[n]) <= tol) && bad++ < 3)
          RANK_CHECK(false, "fused: out[%u][%u] = %g, expected %g (bound %g)", t, n, got, ref[n], tol);
        num += (got - ref[n]) * (got - ref[n]);
        den += ref[n] * ref[n];
      }
    }
    const double rel = std::sqrt(num / std::max(den, 1e-30));
    RANK_CHECK(bad == 0 && rel < 1e-2, "fused seed %llu routing %d: %zu elements outside the bound, rel err %.2e",
               static_cast<unsigned long long>(seed), static_cast<int>(kind), bad, rel);
    if (bits) *bits = o;
  };
  const std::vector<uint16_t> first = repeat_and_replay(
      rank, fails, "fused", g_seed + 200, 3, run_and_check,
      [&] { return op.forward(x, choices, scores, w, out, stream); }, stream, sync);
  if (cs.adaptive) {
    // The adaptive split: the first inputs again at pinned splits and over launches of the
    // policy's choosing, the same bits as the first launch each time.
    auto st0 = op.split_state();
    RANK_CHECK(st0.ok() && st0.value().adaptive, "split_state: %s",
               st0.ok() ? "not adaptive" : st0.status().to_string().c_str());
    const int start = st0.ok() ? st0.value().comm_blocks : 4;
    const uint32_t launches0 = st0.ok() ? st0.value().launches : 0;
    uint32_t runs = 0;
    auto same_bits = [&](const std::string& what) {
      std::vector<uint16_t> now;
      run_and_check(g_seed + 200, kind_of(0), nullptr, &now);
      ++runs;
      RANK_CHECK(now == first, "%s: the output bits differ from the first launch's", what.c_str());
    };
    // Whole clusters only: the smallest candidate is one cluster.
    const int cl = st0.ok() && !st0.value().candidates.empty() ? st0.value().candidates.front() : 1;
    auto whole = [&](int p) { return std::max(cl, p - p % cl); };
    for (const int pin : {whole(start), whole(1), whole(2), whole(start + 2), whole(2 * start)}) {
      const mkernel::Status ps = op.pin_split(pin);
      RANK_CHECK(ps.ok(), "pin_split(%d): %s", pin, ps.to_string().c_str());
      same_bits("pinned " + std::to_string(pin));
      auto st = op.split_state();
      RANK_CHECK(st.ok() && st.value().last_comm_blocks == pin, "pinned %d: the launch ran with %d", pin,
                 st.ok() ? st.value().last_comm_blocks : -1);
    }
    RANK_CHECK(op.pin_split(0).ok(), "unpinning failed");
    for (int l = 0; l < 12; ++l) same_bits("adaptive launch " + std::to_string(l));
    auto st1 = op.split_state();
    RANK_CHECK(st1.ok() && st1.value().launches == launches0 + runs, "split_state counted %u launches, expected %u",
               st1.ok() ? st1.value().launches : 0u, launches0 + runs);
    if (rank == 0 && st1.ok()) {
      std::lock_guard<std::mutex> lock(fused_test::g_print);
      std::printf("      adaptive: %u launches bit-identical over pinned and chosen splits\n      %s\n", runs,
                  st1.value().text.c_str());
    }
  }
  sync();
  cudaFree(x);
  cudaFree(w);
  cudaFree(scratch);
  cudaFree(out);
  cudaFree(choices);
  cudaFree(scores);
  return fails;
}

// The two-matrix MLP (MoeMlp): out[t] = sum over t's choices of score x bf16(bf16(act(bf16(x_t
// W1_e^T))) W2_e^T), weights drawn from a seed per expert, against an fp64 reference that rounds
// where the op rounds (each GEMM output, the activation); the bound allows a bf16 rounding of
// every intermediate value times what it multiplies (2^-7 of the sum of magnitudes through W2,
// counting the activation's slope), of each expert output (2^-6) and of the output (2^-8), and
// the relative Frobenius error must stay under 1e-2. Repeats bit-identical; a graph replayed with
// new routing.
int run_mlp_rank(const Case& cs, uint32_t rank, rt::Communicator& comm, cudaStream_t stream, bool shared_gpu,
                 const fused_test::RankSync& sync) {
  int fails = 0;
  const uint32_t R = cs.topo.world(), T = cs.tokens, H = cs.hidden, I = cs.mlp_inter, k = cs.top_k, E = cs.experts;
  rt::MoeConfig cfg;
  cfg.chunk_tokens = cs.chunk_tokens;
  if (shared_gpu) {  // the ranks' dispatch kernels wait for each other: leave them room beside the GEMMs
    cfg.blocks = std::max(2, 120 / static_cast<int>(R) / 2);
    cfg.gemm_blocks = std::max(2, 120 / static_cast<int>(R));
  }
  {  // refusals before anything collective: the field, the value, what was expected
    rt::MoeConfig fused = cfg;
    fused.fused = true;
    auto r1 = rt::MoeMlp::create(comm, T, H, 12, E, k, cs.act, cfg, stream);
    RANK_CHECK(!r1.ok() && r1.status().message().find("inter = 12; expected a positive multiple of 8") != std::string::npos,
               "inter 12: %s", r1.ok() ? "accepted" : r1.status().to_string().c_str());
    auto r2 = rt::MoeMlp::create(comm, T, H, I, E, k, cs.act, fused, stream);
    RANK_CHECK(!r2.ok() && r2.status().message().find("config.fused = true") != std::string::npos, "fused: %s",
               r2.ok() ? "accepted" : r2.status().to_string().c_str());
    auto r3 = rt::MoeMlp::create(comm, T, H, I, E, k, static_cast<rt::MoeActivation>(9), cfg, stream);
    RANK_CHECK(!r3.ok() && r3.status().message().find("activation = 9") != std::string::npos, "activation 9: %s",
               r3.ok() ? "accepted" : r3.status().to_string().c_str());
  }
  auto made = rt::MoeMlp::create(comm, T, H, I, E, k, cs.act, cfg, stream);
  RANK_CHECK(made.ok(), "create (mlp): %s", made.status().to_string().c_str());
  if (!made.ok()) return fails;
  rt::MoeMlp& op = *made.value();
  const uint32_t epr = op.experts_per_rank();
  const mk::MoeAct act = static_cast<mk::MoeAct>(static_cast<int>(cs.act));
  const bool gated = mk::moe_act_gated(act);
  const uint32_t N1 = static_cast<uint32_t>(op.w1_rows());
  RANK_CHECK(N1 == (gated ? 2 * I : I), "w1_rows() = %u, expected %u", N1, gated ? 2 * I : I);
  if (rank == 0) {
    std::lock_guard<std::mutex> lock(fused_test::g_print);
    std::printf("      mlp plan: %s (%s, workspace %llu bytes)\n", op.describe().c_str(), mk::moe_act_name(act),
                static_cast<unsigned long long>(op.workspace_bytes()));
  }
  __nv_bfloat16 *x = nullptr, *w1 = nullptr, *w2 = nullptr, *out = nullptr, *scratch = nullptr;
  int32_t* choices = nullptr;
  float* scores = nullptr;
  const uint64_t scratch_elems = std::max({uint64_t{T} * H, uint64_t{N1} * H, uint64_t{H} * I});
  GT_CUDA(cudaMalloc(&x, 2ull * T * H));
  GT_CUDA(cudaMalloc(&w1, 2ull * epr * N1 * H));
  GT_CUDA(cudaMalloc(&w2, 2ull * epr * H * I));
  GT_CUDA(cudaMalloc(&scratch, 2ull * scratch_elems));
  GT_CUDA(cudaMalloc(&out, 2ull * T * H));
  GT_CUDA(cudaMalloc(&choices, 4ull * T * k));
  GT_CUDA(cudaMalloc(&scores, 4ull * T * k));
  auto bf = [](uint16_t b) {
    uint32_t u = uint32_t{b} << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  };
  auto round_bf = [](double v) { return __bfloat162float(__float2bfloat16(static_cast<float>(v))); };
  // Every expert's weights on the host as floats; this rank's into w1 / w2. Scaled by 2 / sqrt(k)
  // so the intermediate values are of order one (the activation's curved part is exercised).
  std::vector<std::vector<float>> W1(E), W2(E);
  auto draw = [&](std::vector<float>* host, __nv_bfloat16* dst, uint64_t n, uint64_t seed, float scale) {
    fill_random(scratch, n, seed, scale, stream);
    GT_CUDA(cudaStreamSynchronize(stream));
    std::vector<uint16_t> bits(n);
    GT_CUDA(cudaMemcpy(bits.data(), scratch, n * 2, cudaMemcpyDeviceToHost));
    host->resize(n);
    for (uint64_t i = 0; i < n; ++i) (*host)[i] = bf(bits[i]);
    if (dst != nullptr) GT_CUDA(cudaMemcpy(dst, scratch, n * 2, cudaMemcpyDeviceToDevice));
  };
  for (uint32_t e = 0; e < E; ++e) {
    const bool mine = e / epr == rank;
    draw(&W1[e], mine ? w1 + size_t{e % epr} * N1 * H : nullptr, uint64_t{N1} * H, 9100 + e, 2.0f / std::sqrt(float(H)));
    draw(&W2[e], mine ? w2 + size_t{e % epr} * H * I : nullptr, uint64_t{H} * I, 9900 + e, 2.0f / std::sqrt(float(I)));
  }
  GT_CUDA(cudaStreamSynchronize(stream));
  sync();
  // The expert's output for one token: y2 (rounded as the op rounds) and the bound's magnitude.
  auto expert_ref = [&](const float* xt, uint32_t e, std::vector<double>* y2, std::vector<double>* y2mag) {
    std::vector<double> hv(I), hmag(I);
    std::vector<float> y1(N1);
    for (uint32_t n = 0; n < N1; ++n) {
      double acc = 0;
      const float* wr = &W1[e][size_t{n} * H];
      for (uint32_t c = 0; c < H; ++c) acc += double(xt[c]) * wr[c];
      y1[n] = round_bf(acc);
    }
    for (uint32_t j = 0; j < I; ++j) {
      const float g = y1[j];
      const float a = mk::moe_act_value(act, g);
      const float u = gated ? y1[I + j] : 1.0f;
      hv[j] = round_bf(double(a) * u);
      // The slope of silu and gelu stays under 1.13: a rounding of g moves act(g) by at most 1.13 |g| u.
      hmag[j] = (std::fabs(a) + 1.13 * std::fabs(g)) * std::fabs(u);
    }
    for (uint32_t c = 0; c < H; ++c) {
      double acc = 0, mag = 0;
      const float* wr = &W2[e][size_t{c} * I];
      for (uint32_t j = 0; j < I; ++j) {
        acc += double(wr[j]) * hv[j];
        mag += std::fabs(double(wr[j])) * hmag[j];
      }
      (*y2)[c] = round_bf(acc);
      (*y2mag)[c] = mag;
    }
  };
  const LaunchBuffers bufs{x, scratch, out, choices, scores, uint64_t{T} * H};
  auto run_and_check = [&](uint64_t seed, mk::MoeRouteKind kind, cudaGraphExec_t exec, std::vector<uint16_t>* bits) {
    const LaunchInputs in = upload_inputs(seed, kind, rank, R, T, H, E, k, bufs, stream);
    const std::vector<uint16_t>& xh = in.x;
    const std::vector<int32_t>& ch = in.choices;
    const std::vector<float>& sc = in.scores;
    sync();
    launch_and_check(rank, fails, "mlp", seed, exec, [&] { return op.forward(x, choices, scores, w1, w2, out, stream); }, comm, stream);
    std::vector<uint16_t> o(size_t{T} * H);
    GT_CUDA(cudaMemcpy(o.data(), out, o.size() * 2, cudaMemcpyDeviceToHost));
    size_t bad = 0;
    double num = 0, den = 0;
    std::vector<float> xt(H);
    std::vector<double> y2(H), y2mag(H);
    for (uint32_t t = 0; t < T; ++t) {
      for (uint32_t c = 0; c < H; ++c) xt[c] = bf(xh[size_t{t} * H + c]);
      std::vector<double> ref(H, 0), mag(H, 0), through(H, 0);
      for (uint32_t j = 0; j < k; ++j) {
        const int32_t e = ch[size_t{t} * k + j];
        if (e < 0) continue;
        expert_ref(xt.data(), static_cast<uint32_t>(e), &y2, &y2mag);
        const double s = sc[size_t{t} * k + j];
        for (uint32_t c = 0; c < H; ++c) {
          ref[c] += s * y2[c];
          mag[c] += std::fabs(s * y2[c]);
          through[c] += s * y2mag[c];
        }
      }
      for (uint32_t c = 0; c < H; ++c) {
        const double got = bf(o[size_t{t} * H + c]);
        const double tol =
            std::ldexp(through[c], -7) + std::ldexp(mag[c], -6) + std::ldexp(std::fabs(ref[c]), -8) + 1e-5;
        if (!(std::fabs(got - ref[c]) <= tol) && bad++ < 3)
          RANK_CHECK(false, "mlp: out[%u][%u] = %g, expected %g (bound %g)", t, c, got, ref[c], tol);
        num += (got - ref[c]) * (got - ref[c]);
        den += ref[c] * ref[c];
      }
    }
    const double rel = std::sqrt(num / std::max(den, 1e-30));
    RANK_CHECK(bad == 0 && (den == 0 || rel < 1e-2),
               "mlp seed %llu routing %d: %zu elements outside the bound, rel err %.2e",
               static_cast<unsigned long long>(seed), static_cast<int>(kind), bad, rel);
    if (bits) *bits = o;
  };
  (void)repeat_and_replay(
      rank, fails, "mlp", g_seed + 400, 4, run_and_check,
      [&] { return op.forward(x, choices, scores, w1, w2, out, stream); }, stream, sync);
  sync();
  cudaFree(x);
  cudaFree(w1);
  cudaFree(w2);
  cudaFree(scratch);
  cudaFree(out);
  cudaFree(choices);
  cudaFree(scores);
  return fails;
}

rt::Options options_for(const Case& cs, const rt::MoeConfig& cfg = {}) {
  rt::Options o;
  const uint64_t out_hidden = cs.fused_n > 0 ? cs.fused_n : cs.hidden;
  o.nvlink_bytes = std::max<uint64_t>(
      1 << 20, rt::moe_nvlink_bytes(cs.topo.nodes, cs.topo.gpus, cs.tokens, cs.hidden, out_hidden, cs.experts, cs.top_k, cfg));
  o.network_workspace_bytes =
      rt::moe_network_bytes(cs.topo.nodes, cs.topo.gpus, cs.tokens, cs.hidden, out_hidden, cs.experts, cs.top_k, cfg);
  o.fused_flags = std::max<uint32_t>(4096, rt::moe_fused_flags(cs.topo.nodes, cs.topo.gpus, cs.tokens, cs.experts, cs.top_k, cfg));
  o.device_wait_timeout_ns = 10'000'000'000ull;
  o.rendezvous_timeout = std::chrono::milliseconds(60000);
  return o;
}

int run_case(const Case& cs) {
  fused_test::Cluster cluster(cs.topo, "moe");
  if (!cluster.start()) return 1;
  std::printf("case %s: T %u H %u E %u top-%u chunk %u%s%s\n", cs.topo.name().c_str(), cs.tokens, cs.hidden, cs.experts,
              cs.top_k, cs.chunk_tokens, cs.mlp_inter > 0 ? (" mlp inter " + std::to_string(cs.mlp_inter)).c_str() : "",
              cluster.shared_gpu() ? " (ranks share GPU 0)" : "");
  // The buffers sized for the chunk the ranks' ops will use (the chunk changes the network slots).
  rt::MoeConfig sizing;
  sizing.chunk_tokens = cs.chunk_tokens;
  const auto t0 = std::chrono::steady_clock::now();
  const int failed = fused_test::run_ranks_in_threads(
      cluster, options_for(cs, sizing), {4096},
      [&](uint32_t rank, rt::Communicator& comm, cudaStream_t stream, const fused_test::RankSync& sync) {
        return cs.mlp_inter > 0 ? run_mlp_rank(cs, rank, comm, stream, cluster.shared_gpu(), sync)
               : cs.fused_n > 0 ? run_fused_rank(cs, rank, comm, stream, cluster.shared_gpu(), sync)
                                : run_rank(cs, rank, comm, stream, cluster.shared_gpu(), sync);
      });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%s  %s T %u: %d rank(s) failed (%.1f s)\n", failed == 0 ? "ok  " : "FAIL", cs.topo.name().c_str(),
              cs.tokens, failed, s);
  return failed == 0 ? 0 : 1;
}

// Errors on the GPU end the launch on every rank with the cause; host-side misuse is refused.
int run_error_case(const fused_test::Topology& topo, const char* name, uint32_t capacity, bool bad_expert,
                   const char* must) {
  const Case cs{topo, 96, 64, 8, 2};
  rt::MoeConfig cfg;
  cfg.recv_tokens_per_source = capacity;
  fused_test::Cluster cluster(topo, "moeerr");
  if (!cluster.start()) return 1;
  const int failed = fused_test::run_ranks_in_threads(
      cluster, options_for(cs, cfg), {4096},
      [&](uint32_t rank, rt::Communicator& comm, cudaStream_t stream, const fused_test::RankSync& sync) {
        int fails = 0;
        if (cluster.shared_gpu()) cfg.blocks = 8;
        auto made = rt::MoeDispatchCombine::create(comm, cs.tokens, cs.hidden, cs.hidden, cs.experts, cs.top_k, cfg, stream);
        RANK_CHECK(made.ok(), "create: %s", made.status().to_string().c_str());
        if (!made.ok()) return fails;
        auto& op = *made.value();
        const uint64_t rows = op.rows_capacity();
        __nv_bfloat16 *x, *xe, *ye, *out;
        int32_t* ch;
        float* sc;
        uint32_t* off;
        GT_CUDA(cudaMalloc(&x, 2ull * cs.tokens * cs.hidden));
        GT_CUDA(cudaMalloc(&xe, 2ull * rows * cs.hidden));
        GT_CUDA(cudaMalloc(&ye, 2ull * rows * cs.hidden));
        GT_CUDA(cudaMalloc(&out, 2ull * cs.tokens * cs.hidden));
        GT_CUDA(cudaMalloc(&ch, 4ull * cs.tokens * cs.top_k));
        GT_CUDA(cudaMalloc(&sc, 4ull * cs.tokens * cs.top_k));
        GT_CUDA(cudaMalloc(&off, 4ull * (op.experts_per_rank() + 1)));
        const mkernel::Status early = op.combine(ye, out, stream);
        RANK_CHECK(!early.ok() && early.message().find("no dispatch before it") != std::string::npos,
                   "combine first: %s", early.to_string().c_str());
        auto choices = mk::moe_make_routing(mk::MoeRouteKind::kAllToOneRank, cs.tokens, cs.experts, cs.top_k,
                                            topo.world(), rank, 3);
        if (bad_expert && rank == topo.world() - 1) choices[5 * cs.top_k + 1] = static_cast<int32_t>(cs.experts);
        const auto scores = make_scores(cs.tokens, cs.top_k, 9);
        GT_CUDA(cudaMemcpy(ch, choices.data(), choices.size() * 4, cudaMemcpyHostToDevice));
        GT_CUDA(cudaMemcpy(sc, scores.data(), scores.size() * 4, cudaMemcpyHostToDevice));
        fill_random(x, uint64_t{cs.tokens} * cs.hidden, rank + 1, 1.0f, stream);
        GT_CUDA(cudaStreamSynchronize(stream));
        sync();
        const mkernel::Status s = op.dispatch(x, ch, sc, xe, off, nullptr, nullptr, nullptr, stream);
        RANK_CHECK(s.ok(), "dispatch enqueue: %s", s.to_string().c_str());
        const auto t0 = std::chrono::steady_clock::now();
        GT_CUDA(cudaStreamSynchronize(stream));
        const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const mkernel::Status st = comm.check();
        RANK_CHECK(!st.ok() && (st.message().find(must) != std::string::npos ||
                                st.message().find("peer rank's kernel failed") != std::string::npos),
                   "%s: expected '%s' (or a peer's failure), got '%s'", name, must, st.to_string().c_str());
        RANK_CHECK(waited < 5.0, "%s: the launch took %.1f s to end", name, waited);
        sync();
        cudaFree(x);
        cudaFree(xe);
        cudaFree(ye);
        cudaFree(out);
        cudaFree(ch);
        cudaFree(sc);
        cudaFree(off);
        return fails;
      });
  std::printf("%s  errors: %s on %s\n", failed == 0 ? "ok  " : "FAIL", name, topo.name().c_str());
  return failed == 0 ? 0 : 1;
}

}  // namespace

int main() {
  ::setenv("CUDA_MODULE_LOADING", "EAGER", 1);
  mkt::require_gpus_or_skip("moe_gpu_test", 1);
  const char* env_seed = std::getenv("MKERNEL_TEST_SEED");
  g_seed = env_seed ? std::strtoull(env_seed, nullptr, 10)
                    : static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count() % 1000000007);
  std::printf("moe_gpu_test: seed %llu (MKERNEL_TEST_SEED replays it)\n", static_cast<unsigned long long>(g_seed));
  int failed = 0;
  const Case cases[] = {
      {{1, 1, "shm"}, 200, 256, 16, 4, 32},
      {{1, 2, "shm"}, 333, 512, 64, 8, 0},
      {{1, 2, "shm"}, 1000, 7168, 256, 8, 0},
      {{2, 1, "shm"}, 129, 256, 16, 4, 16},
      {{2, 2, "shm"}, 150, 128, 32, 6, 32},
      // The fused kernel: dispatch + one GEMM per expert + combine in one launch.
      {{1, 1, "shm"}, 300, 256, 8, 2, 32, 136},
      {{1, 2, "shm"}, 333, 512, 16, 4, 0, 256},
      {{2, 1, "shm"}, 129, 256, 8, 4, 16, 128},
      // ... with the adaptive split: the same bits at every split.
      {{1, 2, "shm"}, 333, 512, 16, 4, 0, 256, true},
      // The two-matrix MLP (dispatch, w1, activation, w2, combine), every activation.
      {{1, 1, "shm"}, 200, 256, 8, 2, 0, 0, false, 128, rt::MoeActivation::kSwiGlu},
      {{1, 2, "shm"}, 150, 128, 16, 4, 32, 0, false, 64, rt::MoeActivation::kGeGlu},
      {{2, 1, "shm"}, 129, 128, 8, 3, 0, 0, false, 96, rt::MoeActivation::kGelu},
      {{1, 2, "shm"}, 77, 64, 4, 1, 0, 0, false, 40, rt::MoeActivation::kRelu},
      {{1, 1, "shm"}, 1, 64, 2, 2, 0, 0, false, 8, rt::MoeActivation::kSilu},
  };
  for (const Case& cs : cases) failed += run_case(cs);
  // The random family (random_cases.h): 4 cases by default drawn from the printed seed: any token
  // count in [1, 600], hidden a multiple of 8 in [8, 2048], 1 to 16 experts per rank, top-k up to
  // 8, a random chunk size, half of them the fused kernel with out_hidden a multiple of 8 in
  // [8, 1024]; every case runs the four routings (uniform, Zipf, all to one rank, no choices).
  fused_test::ShapeDraw draw(g_seed);
  const uint32_t random_cases = fused_test::random_case_count(4);
  for (uint32_t i = 0; i < random_cases; ++i) {
    Case cs;
    cs.topo = fused_test::random_topology(draw);
    cs.tokens = draw.log_uniform(1, 600);
    cs.hidden = draw.log_uniform_multiple(8, 2048, 8);
    cs.experts = (1 + draw.below(16)) * cs.topo.world();
    cs.top_k = 1 + draw.below(std::min<uint32_t>(cs.experts, 8));
    cs.chunk_tokens = draw.coin() ? 0 : draw.log_uniform(1, cs.tokens);
    cs.fused_n = i % 2 == 1 ? draw.log_uniform_multiple(8, 1024, 8) : 0;
    cs.adaptive = cs.fused_n > 0 && draw.coin();
    if (i % 4 == 2) {  // the two-matrix MLP, a random activation and intermediate size
      cs.mlp_inter = draw.log_uniform_multiple(8, 256, 8);
      cs.act = static_cast<rt::MoeActivation>(draw.below(5));
      cs.hidden = std::min<uint32_t>(cs.hidden, 256);  // the host reference's two products per choice
      cs.tokens = std::min<uint32_t>(cs.tokens, 200);
      cs.chunk_tokens = std::min(cs.chunk_tokens, cs.tokens);
    }
    std::printf("random case %u: %s tokens %u hidden %u experts %u top_k %u chunk_tokens %u fused_n %u mlp_inter %u%s\n",
                i, cs.topo.name().c_str(), cs.tokens, cs.hidden, cs.experts, cs.top_k, cs.chunk_tokens, cs.fused_n,
                cs.mlp_inter, cs.adaptive ? " adaptive split" : "");
    failed += run_case(cs);
  }
  failed += run_error_case({1, 2, "shm"}, "capacity", 40, false, "recv_tokens_per_source");
  failed += run_error_case({1, 2, "shm"}, "bad expert", 0, true, "bad expert");
  failed += run_error_case({2, 1, "shm"}, "capacity between nodes", 40, false, "recv_tokens_per_source");
  std::printf("%s\n", failed == 0 ? "moe_gpu_test: PASS" : "moe_gpu_test: FAIL");
  return failed == 0 ? 0 : 1;
}
