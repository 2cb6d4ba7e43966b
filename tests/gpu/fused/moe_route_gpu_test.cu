// moe_route_gpu_test: the MoE routing block on the GPU (kernels/fused/moe/moe_route.cuh) gives
// exactly what the host reference moe_route gives (moe_plan.h) on every layout and routing:
// positions, node positions, row slots, counts, and the first bad token or overflowing
// destination. Also a CUDA graph replayed with routing that changes between replays.
// Exit 0 = pass, 1 = failure, 77 = no Hopper GPU.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "fused/moe/moe_plan.h"
#include "fused/moe/moe_route.h"

namespace mk = mkernel::kernels;

namespace {

int g_failures = 0;

#define RT_CUDA(x)                                                                                  \
  do {                                                                                              \
    const cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                        \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));      \
      std::exit(1);                                                                                 \
    }                                                                                               \
  } while (0)

void check(bool ok, const std::string& what) {
  if (!ok) {
    ++g_failures;
    if (g_failures < 20) std::fprintf(stderr, "FAIL: %s\n", what.c_str());
  }
}

template <class T>
T* dev(size_t n) {
  T* p = nullptr;
  RT_CUDA(cudaMalloc(&p, sizeof(T) * (n ? n : 1)));
  RT_CUDA(cudaMemset(p, 0xcd, sizeof(T) * (n ? n : 1)));  // poison: every output must be written
  return p;
}
template <class T>
std::vector<T> back(const T* p, size_t n) {
  std::vector<T> v(n);
  if (n) RT_CUDA(cudaMemcpy(v.data(), p, sizeof(T) * n, cudaMemcpyDeviceToHost));
  return v;
}

struct Device {
  mk::MoeRouteArgs a;
  Device(const mk::MoeGeometry& g) {
    const uint32_t world = g.layout.world();
    a.shape = g.shape();
    a.rank = g.rank;
    a.tokens = g.tokens;
    a.capacity = g.capacity();
    a.choices = dev<int32_t>(size_t{g.tokens} * g.top_k);
    a.pos = dev<uint32_t>(size_t{g.tokens} * world);
    a.npos = dev<uint32_t>(size_t{g.tokens} * g.layout.nodes);
    a.slot = dev<uint32_t>(size_t{g.tokens} * g.top_k);
    a.send_tokens = dev<uint32_t>(world);
    a.node_tokens = dev<uint32_t>(g.layout.nodes);
    a.rows = dev<uint32_t>(g.experts);
    a.result = dev<mk::MoeRouteResult>(1);
  }
  ~Device() {
    cudaFree(const_cast<int32_t*>(a.choices));
    cudaFree(a.pos);
    cudaFree(a.npos);
    cudaFree(a.slot);
    cudaFree(a.send_tokens);
    cudaFree(a.node_tokens);
    cudaFree(a.rows);
    cudaFree(a.result);
  }
};

// Compares the device's outputs with the host reference for the choices now in a.choices.
void compare(const mk::MoeGeometry& g, const Device& d, const std::vector<int32_t>& ch, const std::string& name) {
  const mk::MoeRouting ref = mk::moe_route(g, ch.data());
  const auto res = back(d.a.result, 1)[0];
  if (!ref.error.empty()) {
    check(res.code != mk::kMoeRouteOk, name + ": the host found '" + ref.error + "', the GPU nothing");
    const std::string msg = mk::describe_moe_route(res, d.a);
    // Same token / destination named.
    const bool same = (res.code == mk::kMoeRouteBadChoice && ref.error.find("token " + std::to_string(res.index) + " choice " + std::to_string(res.value)) != std::string::npos) ||
                      (res.code != mk::kMoeRouteBadChoice && !msg.empty() && ref.error.rfind(msg, 0) == 0);
    check(same, name + ": host '" + ref.error + "' vs GPU '" + msg + "'");
    if (res.code == mk::kMoeRouteBadChoice) return;  // outputs undefined after a bad token
  } else {
    check(res.code == mk::kMoeRouteOk, name + ": GPU reported '" + mk::describe_moe_route(res, d.a) + "'");
  }
  check(back(d.a.pos, ref.pos.size()) == ref.pos, name + ": pos differs");
  check(back(d.a.npos, ref.npos.size()) == ref.npos, name + ": npos differs");
  check(back(d.a.slot, ref.slot.size()) == ref.slot, name + ": slot differs");
  check(back(d.a.send_tokens, ref.send_tokens.size()) == ref.send_tokens, name + ": send_tokens differs");
  check(back(d.a.node_tokens, ref.node_tokens.size()) == ref.node_tokens, name + ": node_tokens differs");
  check(back(d.a.rows, ref.rows.size()) == ref.rows, name + ": rows differs");
}

mk::MoeGeometry geometry(mk::FusedLayout l, uint32_t rank, uint32_t tokens, uint32_t experts, uint32_t k) {
  return mk::moe_geometry(l, rank, tokens, 8, 8, experts, k);
}

void run_case(const mk::MoeGeometry& g, mk::MoeRouteKind kind, uint64_t seed) {
  Device d(g);
  const auto ch = mk::moe_make_routing(kind, g.tokens, g.experts, g.top_k, g.layout.world(), g.rank, seed);
  RT_CUDA(cudaMemcpy(const_cast<int32_t*>(d.a.choices), ch.data(), ch.size() * 4, cudaMemcpyHostToDevice));
  const std::string e = mk::moe_route_check(d.a);
  check(e.empty(), "check: " + e);
  RT_CUDA(mk::moe_route_launch(d.a, nullptr));
  RT_CUDA(cudaDeviceSynchronize());
  char name[160];
  std::snprintf(name, sizeof(name), "%ux%u rank %u T %u E %u k %u routing %d cap %u", g.layout.nodes, g.layout.gpus,
                g.rank, g.tokens, g.experts, g.top_k, int(kind), g.capacity());
  compare(g, d, ch, name);
}

}  // namespace

int main() {
  int dev_count = 0;
  if (cudaGetDeviceCount(&dev_count) != cudaSuccess || dev_count == 0) {
    std::printf("SKIPPED moe_route_gpu_test: no CUDA device\n");
    return 77;
  }
  cudaDeviceProp prop{};
  RT_CUDA(cudaGetDeviceProperties(&prop, 0));
  if (prop.major < 9) {
    std::printf("SKIPPED moe_route_gpu_test: needs a Hopper GPU (sm_90), found sm_%d%d\n", prop.major, prop.minor);
    return 77;
  }
  const mk::MoeRouteKind kinds[] = {mk::MoeRouteKind::kUniform, mk::MoeRouteKind::kZipf, mk::MoeRouteKind::kAllToOneRank,
                                    mk::MoeRouteKind::kSomeEmpty, mk::MoeRouteKind::kNoChoices,
                                    mk::MoeRouteKind::kOnlyRankZeroSends};
  struct Shape {
    mk::FusedLayout l;
    uint32_t rank, tokens, experts, k;
  };
  const Shape shapes[] = {{{1, 1}, 0, 1, 8, 2},      {{1, 2}, 1, 37, 16, 4},     {{1, 2}, 0, 4096, 256, 8},
                          {{1, 8}, 5, 16384, 256, 8}, {{2, 4}, 6, 1000, 64, 6},  {{8, 8}, 63, 777, 512, 8},
                          {{3, 3}, 4, 129, 18, 3},    {{2, 1}, 1, 128, 256, 8},  {{1, 4}, 2, 300, 32, 32},
                          {{8, 8}, 9, 3000, 1024, 8}, {{1, 2}, 0, 1000, 64, 1},  {{2, 2}, 1, 513, 40, 5},
                          {{2, 4}, 3, 2000, 128, 16}, {{4, 2}, 5, 4099, 256, 7}};
  uint64_t seed = 11;
  for (const Shape& s : shapes)
    for (mk::MoeRouteKind kind : kinds) run_case(geometry(s.l, s.rank, s.tokens, s.experts, s.k), kind, ++seed);

  // Overflow: a capacity below what all-to-one routing sends.
  {
    auto g = geometry({2, 2}, 3, 500, 64, 4);
    g.recv_tokens_per_source = 300;
    run_case(g, mk::MoeRouteKind::kAllToOneRank, 5);  // rank 0 gets all 500: overflow named
    g.recv_tokens_per_source = 500;
    run_case(g, mk::MoeRouteKind::kAllToOneRank, 5);  // fits exactly
  }
  // Bad choices: out of range, chosen twice, the first one in token order wins.
  {
    auto g = geometry({1, 2}, 0, 3000, 32, 4);
    Device d(g);
    for (int variant = 0; variant < 4; ++variant) {
      auto ch = mk::moe_make_routing(mk::MoeRouteKind::kUniform, g.tokens, g.experts, g.top_k, 2, 0, 99);
      if (variant == 0) ch[2500 * 4 + 2] = 32;                 // out of range
      if (variant == 1) ch[1700 * 4 + 3] = ch[1700 * 4 + 0];   // twice
      if (variant == 2) {
        ch[2900 * 4 + 1] = -7;
        ch[10 * 4 + 3] = ch[10 * 4 + 1];  // the earlier one is named
      }
      if (variant == 3) {  // two bad tokens routed in the same warp step: the earlier one is named
        ch[1001 * 4 + 0] = 40;
        ch[1000 * 4 + 3] = ch[1000 * 4 + 1];
      }
      RT_CUDA(cudaMemcpy(const_cast<int32_t*>(d.a.choices), ch.data(), ch.size() * 4, cudaMemcpyHostToDevice));
      RT_CUDA(mk::moe_route_launch(d.a, nullptr));
      RT_CUDA(cudaDeviceSynchronize());
      compare(g, d, ch, "bad choice variant " + std::to_string(variant));
    }
  }
  // A CUDA graph captured once, replayed with new routing written into the same buffer.
  {
    auto g = geometry({2, 4}, 2, 2048, 128, 8);
    Device d(g);
    cudaStream_t st;
    RT_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    RT_CUDA(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    RT_CUDA(mk::moe_route_launch(d.a, st));
    RT_CUDA(cudaStreamEndCapture(st, &graph));
    RT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    for (int replay = 0; replay < 4; ++replay) {
      const auto ch = mk::moe_make_routing(replay % 2 ? mk::MoeRouteKind::kZipf : mk::MoeRouteKind::kUniform, g.tokens,
                                           g.experts, g.top_k, g.layout.world(), g.rank, 1000 + replay);
      RT_CUDA(cudaMemcpyAsync(const_cast<int32_t*>(d.a.choices), ch.data(), ch.size() * 4, cudaMemcpyHostToDevice, st));
      RT_CUDA(cudaGraphLaunch(exec, st));
      RT_CUDA(cudaStreamSynchronize(st));
      compare(g, d, ch, "graph replay " + std::to_string(replay));
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(st);
  }
  // Argument errors name the field.
  {
    auto g = geometry({1, 2}, 0, 10, 8, 2);
    Device d(g);
    mk::MoeRouteArgs bad = d.a;
    bad.shape.experts = 7;
    check(mk::moe_route_check(bad).rfind("experts: 7", 0) == 0, "experts error: " + mk::moe_route_check(bad));
    bad = d.a;
    bad.rank = 2;
    check(mk::moe_route_check(bad).rfind("rank: 2", 0) == 0, "rank error: " + mk::moe_route_check(bad));
    bad = d.a;
    bad.shape.top_k = 33;
    check(mk::moe_route_check(bad).rfind("top_k: 33", 0) == 0, "top_k error: " + mk::moe_route_check(bad));
    check(mk::moe_route_launch(bad, nullptr) == cudaErrorInvalidValue, "a bad launch is refused");
  }
  if (g_failures) {
    std::printf("moe_route_gpu_test: %d checks FAILED\n", g_failures);
    return 1;
  }
  std::printf("moe_route_gpu_test: PASS\n");
  return 0;
}
