// Ring attention (ops.h RingAttention) against an fp32 reference of full attention on the gathered
// sequence. Layouts (fused_harness.h): one rank; one node of 2, 3 and 4 ranks (NVLink path, a GPU
// each when there are enough, else all sharing GPU 0 with the block split sized to fit); two
// nodes of one and of two ranks through two mkerneld over libfabric shm (the proxy path and the
// forwards over NVLink). Per case: causal zigzag, causal contiguous or no mask; head dim 64 or
// 128; grouped-query attention; [B, H, S, D] or [B, S, H, D]; s_local not a multiple of the
// 128-row tile; slots reused within a launch; three launches with new data and two CUDA-graph
// replays, O and lse poisoned with NaN before each. The zigzag reorder (device) against the host
// permutation, both ways. Argument errors and ranks that disagree; a peer that never launches
// ends the kernel within the bound with a named cause.
//
// Fresh random inputs each run (seed printed; MKERNEL_TEST_SEED replays). Exits 77 (skipped)
// with the reason where no Hopper GPU is present.
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
#include <string>
#include <vector>

#include "attention/attention_test_util.cuh"
#include "fused_harness.h"
#include "random_cases.h"
#include "mkernel/runtime/ops.h"
#include "mkernel/runtime/runtime.h"

namespace {

namespace rt = mkernel::rt;
using attn_test::Strides;

constexpr double kRelFro = 1e-2;  // O, relative Frobenius (the core's bound: bf16 P and bf16 O)
constexpr double kLseAbs = 2e-3;  // lse, largest absolute error
uint64_t g_seed = 0;

#define RANK_CUDA(call)                                                                                     \
  do {                                                                                                      \
    const cudaError_t e_ = (call);                                                                          \
    if (e_ != cudaSuccess) {                                                                                \
      std::lock_guard<std::mutex> lock_(fused_test::g_print);                                               \
      std::printf("FAIL rank %u %s:%d: %s: %s\n", rank, __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      return fails + 1;                                                                                     \
    }                                                                                                       \
  } while (0)

struct Case {
  fused_test::Topology topo;
  uint32_t batch, heads_q, heads_kv, s_local, head_dim;
  rt::AttentionLayout layout;
  rt::RingPlacement placement;
  uint32_t slots = 0;
  bool bulk = true;
  bool adaptive = false;  // RingAttentionConfig::adaptive_split: the same bits at every split
};

const char* placement_name(rt::RingPlacement p) {
  switch (p) {
    case rt::RingPlacement::kNonCausal:
      return "no mask";
    case rt::RingPlacement::kCausalContiguous:
      return "causal contiguous";
    case rt::RingPlacement::kCausalZigzag:
      return "causal zigzag";
  }
  return "?";
}

Strides strides_of(rt::AttentionLayout l, int64_t heads, int64_t seq, int64_t d) {
  if (l == rt::AttentionLayout::kBSHD) return Strides{seq * heads * d, d, heads * d};
  return Strides{heads * seq * d, seq * d, d};
}

// Copies rank r's positions [r s, (r + 1) s) of a whole [B, H, S, D] (or [B, S, H, D]) tensor.
cudaError_t slice_rank(const __nv_bfloat16* whole, __nv_bfloat16* part, const Case& cs, uint32_t heads, uint32_t r,
                       cudaStream_t stream) {
  const uint64_t R = cs.topo.world(), s = cs.s_local, d = cs.head_dim, S = R * s;
  if (cs.layout == rt::AttentionLayout::kBSHD) {
    const uint64_t row = s * heads * d * 2, pitch = S * heads * d * 2;
    return cudaMemcpy2DAsync(part, row, reinterpret_cast<const uint8_t*>(whole) + r * row, pitch, row, cs.batch,
                             cudaMemcpyDeviceToDevice, stream);
  }
  const uint64_t row = s * d * 2, pitch = S * d * 2;
  return cudaMemcpy2DAsync(part, row, reinterpret_cast<const uint8_t*>(whole) + r * row, pitch, row,
                           uint64_t{cs.batch} * heads, cudaMemcpyDeviceToDevice, stream);
}

// The global position (in the original order) of rank r's local position l.
uint64_t original_position(const Case& cs, uint32_t r, uint64_t l) {
  const uint64_t R = cs.topo.world();
  const uint64_t placed = uint64_t{r} * cs.s_local + l;
  if (cs.placement != rt::RingPlacement::kCausalZigzag) return placed;
  const uint64_t c = cs.s_local / 2, rr = placed / cs.s_local, ll = placed % cs.s_local;
  return (ll < c ? rr : 2 * R - 1 - rr) * c + ll % c;
}

int run_rank(const Case& cs, uint32_t rank, rt::Communicator& comm, cudaStream_t stream, bool shared_gpu,
             const fused_test::RankSync& sync) {
  int fails = 0;
  const uint32_t R = cs.topo.world();
  const uint64_t S = uint64_t{R} * cs.s_local, B = cs.batch, Hq = cs.heads_q, Hkv = cs.heads_kv, D = cs.head_dim;
  const size_t q_all = B * Hq * S * D, kv_all = B * Hkv * S * D;
  const size_t q_loc = B * Hq * cs.s_local * D, kv_loc = B * Hkv * cs.s_local * D;
  __nv_bfloat16 *qa = nullptr, *ka = nullptr, *va = nullptr, *tmp = nullptr;  // whole sequence, original order
  __nv_bfloat16 *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr;       // this rank's part
  float *lse = nullptr, *ref_o = nullptr, *ref_lse = nullptr;
  RANK_CUDA(cudaMalloc(&qa, q_all * 2));
  RANK_CUDA(cudaMalloc(&ka, kv_all * 2));
  RANK_CUDA(cudaMalloc(&va, kv_all * 2));
  RANK_CUDA(cudaMalloc(&tmp, std::max(q_all, kv_all) * 2));
  RANK_CUDA(cudaMalloc(&q, q_loc * 2));
  RANK_CUDA(cudaMalloc(&k, kv_loc * 2));
  RANK_CUDA(cudaMalloc(&v, kv_loc * 2));
  RANK_CUDA(cudaMalloc(&o, q_loc * 2));
  RANK_CUDA(cudaMalloc(&lse, B * Hq * cs.s_local * 4));
  RANK_CUDA(cudaMalloc(&ref_o, q_all * 4));
  RANK_CUDA(cudaMalloc(&ref_lse, B * Hq * S * 4));

  rt::RingAttentionShape shape;
  shape.batch = B;
  shape.heads_q = Hq;
  shape.heads_kv = Hkv;
  shape.s_local = cs.s_local;
  shape.head_dim = D;
  shape.layout = cs.layout;
  shape.placement = cs.placement;
  rt::RingAttentionConfig cfg;
  cfg.slots = cs.slots;
  cfg.bulk_copies = cs.bulk;
  cfg.adaptive_split = cs.adaptive && R > 1;
  if (shared_gpu) {  // every rank's blocks must be resident at once on the one GPU
    cfg.comm_blocks = R > 1 ? 2 : 0;
    cfg.attn_blocks = std::max(1, 132 / static_cast<int>(R) / 2 - cfg.comm_blocks);
  }
  // Warm-up of everything that may allocate or load modules before the ranks move in step.
  attn_test::fill_random(tmp, 1024, 1, 1.0f, stream);
  RANK_CUDA(cudaStreamSynchronize(stream));
  sync();
  auto made = rt::RingAttention::create(comm, shape, cfg, stream);
  RANK_CHECK(made.ok(), "create: %s", made.status().to_string().c_str());
  if (!made.ok()) return fails;
  std::unique_ptr<rt::RingAttention> op = std::move(made.value());
  sync();
  if (rank == 0) {
    std::lock_guard<std::mutex> lock(fused_test::g_print);
    std::printf("      plan: %s\n", op->describe().c_str());
  }

  const Strides qs = strides_of(cs.layout, Hq, S, D), ks = strides_of(cs.layout, Hkv, S, D);
  const bool causal = cs.placement != rt::RingPlacement::kNonCausal;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  // Inputs of one launch: the whole sequence drawn from a shared seed (the same on every rank),
  // placed, this rank's part cut out; the reference over the whole sequence in original order.
  auto prepare = [&](uint64_t seed) -> int {
    attn_test::fill_random(qa, q_all, seed * 3 + 1, 1.0f, stream);
    attn_test::fill_random(ka, kv_all, seed * 3 + 2, 1.0f, stream);
    attn_test::fill_random(va, kv_all, seed * 3 + 3, 1.0f, stream);
    attn_test::reference_attention(qa, ka, va, ref_o, ref_lse, static_cast<int>(B), static_cast<int>(Hq),
                                   static_cast<int>(Hkv), static_cast<int>(S), static_cast<int>(S), static_cast<int>(D),
                                   qs, ks, ks, causal, 0, scale, stream);
    struct {
      __nv_bfloat16* whole;
      __nv_bfloat16* part;
      uint64_t heads;
    } t[] = {{qa, q, Hq}, {ka, k, Hkv}, {va, v, Hkv}};
    for (auto& x : t) {
      const __nv_bfloat16* placed = x.whole;
      if (cs.placement == rt::RingPlacement::kCausalZigzag) {
        const mkernel::Status st = rt::zigzag_reorder(x.whole, tmp, B, x.heads, S, D, 2, cs.layout, R, true, stream);
        RANK_CHECK(st.ok(), "zigzag_reorder: %s", st.to_string().c_str());
        placed = tmp;
      }
      RANK_CUDA(slice_rank(placed, x.part, cs, static_cast<uint32_t>(x.heads), rank, stream));
    }
    attn_test::poison(o, q_loc, stream);
    attn_test::poison(lse, B * Hq * cs.s_local, stream);
    RANK_CUDA(cudaStreamSynchronize(stream));
    return 0;
  };
  // When O is wrong: which chunk was. Compares, after the launch, every K/V slot of this rank (the
  // chunk of step t >= 1 in slot (t - 1) mod slots of its NVLink buffer: K, then V; a slot holds
  // the last step that used it, so earlier steps of a reused slot cannot be checked) and every
  // network slot (the rail peer on node m's chunk at m x chunk bytes of the network workspace)
  // with the chunk it should hold, and prints the wrong byte ranges of each half. Slots that are
  // right afterwards while O was wrong point at a chunk read before it was complete or after it
  // was overwritten; a wrong slot at its writer (ring_attn_plan.h notes 1-3 give the layout).
  const uint32_t slots = [&] {
    const std::string d = op->describe();
    const size_t at = d.find("slots=");
    return at == std::string::npos ? 0u : static_cast<uint32_t>(std::atoi(d.c_str() + at + 6));
  }();
  auto diagnose = [&](const char* what) {
    const uint32_t G = cs.topo.gpus, N = cs.topo.nodes, n = rank / G, g = rank % G;
    const uint64_t half = kv_loc * 2;
    std::vector<uint8_t> want(2 * half), got(2 * half);
    auto expected = [&](uint32_t src) {  // the chunk of rank src, placed as prepare() placed it
      for (int part = 0; part < 2; ++part) {
        const __nv_bfloat16* whole = part == 0 ? ka : va;
        if (cs.placement == rt::RingPlacement::kCausalZigzag) {
          (void)rt::zigzag_reorder(whole, tmp, B, Hkv, S, D, 2, cs.layout, R, true, stream);
          whole = tmp;
        }
        auto* dst = reinterpret_cast<__nv_bfloat16*>(ref_o);  // scratch: q_all fp32 >= a chunk
        (void)slice_rank(whole, dst, cs, static_cast<uint32_t>(Hkv), src, stream);
        (void)cudaMemcpyAsync(want.data() + part * half, dst, half, cudaMemcpyDeviceToHost, stream);
      }
      (void)cudaStreamSynchronize(stream);
    };
    auto report = [&](const std::string& where) {
      for (int part = 0; part < 2; ++part) {
        uint64_t wrong = 0, first = 0, last = 0;
        for (uint64_t i = 0; i < half; ++i)
          if (got[part * half + i] != want[part * half + i]) {
            if (wrong++ == 0) first = i;
            last = i;
          }
        std::lock_guard<std::mutex> lock(fused_test::g_print);
        std::printf("      %s rank %u %s, %s: %llu of %llu bytes wrong", what, rank, where.c_str(), part ? "V" : "K",
                    static_cast<unsigned long long>(wrong), static_cast<unsigned long long>(half));
        if (wrong) std::printf(" (bytes %llu .. %llu)", static_cast<unsigned long long>(first),
                               static_cast<unsigned long long>(last));
        std::printf("\n");
      }
    };
    const auto* own = static_cast<const uint8_t*>(comm.nvlink_buffer(rank));
    for (uint32_t t = (R > slots + 1 ? R - slots : 1); t < R && own != nullptr && slots > 0; ++t) {
      const uint32_t src = ((n + t / G) % N) * G + (g + t % G) % G;
      expected(src);
      (void)cudaMemcpy(got.data(), own + uint64_t{(t - 1) % slots} * 2 * half, 2 * half, cudaMemcpyDeviceToHost);
      report("step " + std::to_string(t) + " (rank " + std::to_string(src) + "'s chunk, slot " +
             std::to_string((t - 1) % slots) + ")");
    }
    const auto* net = N > 1 ? static_cast<const uint8_t*>(comm.host_buffer(comm.network_workspace())) : nullptr;
    for (uint32_t m = 0; m < N && net != nullptr; ++m) {
      const uint32_t src = m * G + g;  // the rail peer on node m (m = n: this rank's own staging)
      expected(src);
      std::memcpy(got.data(), net + uint64_t{m} * 2 * half, 2 * half);
      report("network slot " + std::to_string(m) + " (rank " + std::to_string(src) + "'s chunk)");
    }
  };
  double worst_o = 0, worst_lse = 0;
  auto check = [&](const char* what) -> int {
    RANK_CUDA(cudaStreamSynchronize(stream));
    const mkernel::Status st = comm.check();
    RANK_CHECK(st.ok(), "%s: check(): %s", what, st.to_string().c_str());
    const Strides ls = strides_of(cs.layout, Hq, cs.s_local, D);
    const std::vector<float> out = attn_test::gather_bf16(o, q_loc, static_cast<int>(B), static_cast<int>(Hq),
                                                          static_cast<int>(cs.s_local), static_cast<int>(D), ls);
    const std::vector<float> out_lse = attn_test::to_host(lse, B * Hq * cs.s_local);
    const std::vector<float> all_o = attn_test::to_host(ref_o, q_all),
                             all_lse = attn_test::to_host(ref_lse, B * Hq * S);
    std::vector<float> want(out.size()), want_lse(out_lse.size());
    for (uint64_t b = 0; b < B; ++b)
      for (uint64_t h = 0; h < Hq; ++h)
        for (uint64_t l = 0; l < cs.s_local; ++l) {
          const uint64_t g = original_position(cs, rank, l);
          const uint64_t row = (b * Hq + h) * cs.s_local + l, grow = (b * Hq + h) * S + g;
          want_lse[row] = all_lse[grow];
          for (uint64_t d = 0; d < D; ++d) want[row * D + d] = all_o[grow * D + d];
        }
    const attn_test::ErrorStats eo = attn_test::compare(out, want), el = attn_test::compare(out_lse, want_lse);
    RANK_CHECK(eo.non_finite == 0 && eo.mismatched_inf == 0, "%s: O has %zu non-finite elements (first %zu)", what,
               eo.non_finite + eo.mismatched_inf, eo.first_bad);
    RANK_CHECK(el.non_finite == 0 && el.mismatched_inf == 0, "%s: lse has %zu non-finite elements (first %zu)", what,
               el.non_finite + el.mismatched_inf, el.first_bad);
    RANK_CHECK(eo.rel_fro < kRelFro, "%s: O relative error %.3e (bound %.0e)", what, eo.rel_fro, kRelFro);
    if (eo.rel_fro >= kRelFro && R > 1) diagnose(what);
    RANK_CHECK(el.max_abs < kLseAbs, "%s: lse largest error %.3e (bound %.0e)", what, el.max_abs, kLseAbs);
    worst_o = std::max(worst_o, eo.rel_fro);
    worst_lse = std::max(worst_lse, el.max_abs);
    return 0;
  };

  // The zigzag reorder against the host permutation, and back (rank 0, first case it sees).
  if (rank == 0 && cs.placement == rt::RingPlacement::kCausalZigzag) {
    attn_test::fill_random(qa, q_all, g_seed + 77, 1.0f, stream);
    const mkernel::Status a = rt::zigzag_reorder(qa, tmp, B, Hq, S, D, 2, cs.layout, R, true, stream);
    RANK_CHECK(a.ok(), "zigzag_reorder: %s", a.to_string().c_str());
    std::vector<uint16_t> whole(q_all), placed(q_all);
    RANK_CUDA(cudaMemcpyAsync(whole.data(), qa, q_all * 2, cudaMemcpyDeviceToHost, stream));
    RANK_CUDA(cudaMemcpyAsync(placed.data(), tmp, q_all * 2, cudaMemcpyDeviceToHost, stream));
    RANK_CUDA(cudaStreamSynchronize(stream));
    auto perm = rt::zigzag_permutation(S, R);
    RANK_CHECK(perm.ok(), "zigzag_permutation: %s", perm.status().to_string().c_str());
    size_t wrong = 0;
    for (uint64_t b = 0; b < B && perm.ok(); ++b)
      for (uint64_t h = 0; h < Hq; ++h)
        for (uint64_t p = 0; p < S; ++p)
          for (uint64_t d = 0; d < D; ++d)
            wrong +=
                placed[b * qs.b + h * qs.h + p * qs.s + d] != whole[b * qs.b + h * qs.h + perm.value()[p] * qs.s + d];
    RANK_CHECK(wrong == 0, "zigzag_reorder: %zu elements differ from the host permutation", wrong);
    auto* back_buf = reinterpret_cast<__nv_bfloat16*>(ref_o);  // q_all fp32: room for q_all bf16
    const mkernel::Status back = rt::zigzag_reorder(tmp, back_buf, B, Hq, S, D, 2, cs.layout, R, false, stream);
    RANK_CHECK(back.ok(), "zigzag_reorder back: %s", back.to_string().c_str());
    std::vector<uint16_t> round(q_all);
    RANK_CUDA(cudaMemcpyAsync(round.data(), back_buf, q_all * 2, cudaMemcpyDeviceToHost, stream));
    RANK_CUDA(cudaStreamSynchronize(stream));
    RANK_CHECK(round == whole, "zigzag_reorder there and back changed the tensor");
  }

  for (int l = 0; l < 3; ++l) {
    if (prepare(g_seed + 1000 * l + 1) != 0) return fails + 1;
    sync();
    const mkernel::Status s = op->launch(q, k, v, o, lse, stream);
    RANK_CHECK(s.ok(), "launch %d: %s", l, s.to_string().c_str());
    if (check(("launch " + std::to_string(l)).c_str()) != 0) return fails + 1;
  }
  // A CUDA graph replayed with new data (each replay a new launch number).
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  sync();
  RANK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const mkernel::Status cap = op->launch(q, k, v, o, lse, stream);
  RANK_CUDA(cudaStreamEndCapture(stream, &graph));
  RANK_CHECK(cap.ok(), "launch in capture: %s", cap.to_string().c_str());
  RANK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  RANK_CUDA(cudaGraphUpload(exec, stream));
  for (int l = 0; l < 2; ++l) {
    if (prepare(g_seed + 5000 + 1000 * l) != 0) return fails + 1;
    sync();
    RANK_CUDA(cudaGraphLaunch(exec, stream));
    if (check(("graph replay " + std::to_string(l)).c_str()) != 0) return fails + 1;
  }
  (void)cudaGraphExecDestroy(exec);
  (void)cudaGraphDestroy(graph);
  {
    std::lock_guard<std::mutex> lock(fused_test::g_print);
    std::printf("      rank %u: 3 launches + 2 graph replays: O rel err %.2e, lse err %.2e\n", rank, worst_o,
                worst_lse);
  }
  if (cfg.adaptive_split) {
    // The adaptive split: one input, six pinned splits and 16 launches of the policy's choosing,
    // O and lse bit for bit the same each time (and right against the reference).
    std::vector<uint16_t> o_first, o_now(q_loc);
    std::vector<float> lse_first, lse_now(B * Hq * cs.s_local);
    int runs = 0;
    auto run_once = [&](const std::string& what) -> int {
      if (prepare(g_seed + 424242) != 0) return 1;
      sync();
      const mkernel::Status s = op->launch(q, k, v, o, lse, stream);
      RANK_CHECK(s.ok(), "%s: %s", what.c_str(), s.to_string().c_str());
      if (check(what.c_str()) != 0) return 1;
      RANK_CUDA(cudaMemcpy(o_now.data(), o, q_loc * 2, cudaMemcpyDeviceToHost));
      RANK_CUDA(cudaMemcpy(lse_now.data(), lse, lse_now.size() * 4, cudaMemcpyDeviceToHost));
      ++runs;
      if (o_first.empty()) {
        o_first = o_now;
        lse_first = lse_now;
        return 0;
      }
      size_t diff = 0;
      for (size_t i = 0; i < o_now.size(); ++i) diff += o_now[i] != o_first[i];
      size_t ldiff = 0;
      for (size_t i = 0; i < lse_now.size(); ++i) ldiff += std::memcmp(&lse_now[i], &lse_first[i], 4) != 0;
      RANK_CHECK(diff == 0 && ldiff == 0, "%s: O differs in %zu elements, lse in %zu, from the first split's", what.c_str(),
                 diff, ldiff);
      return 0;
    };
    auto st0 = op->split_state();
    RANK_CHECK(st0.ok() && st0.value().adaptive, "split_state: %s",
               st0.ok() ? "not adaptive" : st0.status().to_string().c_str());
    const int start = st0.ok() ? st0.value().comm_blocks : 2;
    const uint32_t launches0 = st0.ok() ? st0.value().launches : 0;
    for (const int pin : {start, 1, 3, start + 4, 2 * start + 1}) {
      const mkernel::Status ps = op->pin_split(pin);
      RANK_CHECK(ps.ok(), "pin_split(%d): %s", pin, ps.to_string().c_str());
      if (run_once("pinned " + std::to_string(pin)) != 0) return fails + 1;
      auto st = op->split_state();
      RANK_CHECK(st.ok() && st.value().last_comm_blocks == pin, "pinned %d: the launch ran with %d", pin,
                 st.ok() ? st.value().last_comm_blocks : -1);
    }
    RANK_CHECK(op->pin_split(0).ok(), "unpinning failed");
    for (int l = 0; l < 16; ++l)
      if (run_once("adaptive launch " + std::to_string(l)) != 0) return fails + 1;
    auto st1 = op->split_state();
    RANK_CHECK(st1.ok() && st1.value().launches == launches0 + static_cast<uint32_t>(runs),
               "split_state counted %u launches, expected %u", st1.ok() ? st1.value().launches : 0u,
               launches0 + static_cast<uint32_t>(runs));
    if (rank == 0 && st1.ok()) {
      std::lock_guard<std::mutex> lock(fused_test::g_print);
      std::printf("      adaptive: %d launches bit-identical over pinned and chosen splits\n      %s\n", runs,
                  st1.value().text.c_str());
    }
  }
  sync();
  for (void* p : {static_cast<void*>(qa), static_cast<void*>(ka), static_cast<void*>(va), static_cast<void*>(tmp),
                  static_cast<void*>(q), static_cast<void*>(k), static_cast<void*>(v), static_cast<void*>(o),
                  static_cast<void*>(lse), static_cast<void*>(ref_o), static_cast<void*>(ref_lse)})
    (void)cudaFree(p);
  return fails;
}

rt::Options options_for(const Case& cs) {
  rt::RingAttentionShape s;
  s.batch = cs.batch;
  s.heads_q = cs.heads_q;
  s.heads_kv = cs.heads_kv;
  s.s_local = cs.s_local;
  s.head_dim = cs.head_dim;
  rt::Options o;
  o.nvlink_bytes =
      std::max<uint64_t>(1 << 20, rt::ring_attention_nvlink_bytes(cs.topo.nodes, cs.topo.gpus, s, cs.slots));
  o.network_workspace_bytes = rt::ring_attention_network_bytes(cs.topo.nodes, s);
  o.fused_flags = std::max<uint32_t>(4096, rt::ring_attention_fused_flags(cs.topo.nodes, cs.topo.gpus));
  o.device_wait_timeout_ns = 10'000'000'000ull;
  o.rendezvous_timeout = std::chrono::milliseconds(60000);
  return o;
}

int run_case(const Case& cs) {
  fused_test::Cluster cluster(cs.topo, "ring");
  if (!cluster.start()) return 1;
  std::printf("case %s %s: B %u Hq %u Hkv %u s_local %u D %u %s slots %u%s%s%s\n", cs.topo.name().c_str(),
              placement_name(cs.placement), cs.batch, cs.heads_q, cs.heads_kv, cs.s_local, cs.head_dim,
              cs.layout == rt::AttentionLayout::kBSHD ? "bshd" : "bhsd", cs.slots, cs.bulk ? "" : " (16-byte copies)", cs.adaptive ? " adaptive split" : "",
              cluster.shared_gpu() ? " (ranks share GPU 0)" : "");
  const auto t0 = std::chrono::steady_clock::now();
  const int failed = fused_test::run_ranks_in_threads(
      cluster, options_for(cs), {4096},
      [&](uint32_t rank, rt::Communicator& comm, cudaStream_t stream, const fused_test::RankSync& sync) {
        return run_rank(cs, rank, comm, stream, cluster.shared_gpu(), sync);
      });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%s  %s %s: %d rank(s) failed (%.1f s)\n", failed == 0 ? "ok  " : "FAIL", cs.topo.name().c_str(),
              placement_name(cs.placement), failed, s);
  return failed == 0 ? 0 : 1;
}

int run_error_cases() {
  const fused_test::Topology topo{1, 2, "shm"};
  fused_test::Cluster cluster(topo, "ringerr");
  if (!cluster.start()) return 1;
  rt::Options o;
  o.nvlink_bytes = 1 << 20;
  o.fused_flags = 4096;
  o.rendezvous_timeout = std::chrono::milliseconds(20000);
  std::atomic<int> bad{0};
  const int failed = fused_test::run_ranks_in_threads(
      cluster, o, {4096},
      [&](uint32_t rank, rt::Communicator& comm, cudaStream_t stream, const fused_test::RankSync& sync) {
        int fails = 0;
        auto expect = [&](const mkernel::Status& s, const char* must, const char* what) {
          const bool ok = !s.ok() && s.message().find(must) != std::string::npos;
          RANK_CHECK(ok, "%s: expected an error containing \"%s\", got \"%s\"", what, must, s.to_string().c_str());
          if (ok && rank == 0) {
            std::lock_guard<std::mutex> lock(fused_test::g_print);
            std::printf("      refused (%s): %s\n", what, s.message().c_str());
          }
        };
        auto shape = [](uint64_t hq, uint64_t hkv, uint64_t s_local, uint64_t d, rt::RingPlacement p) {
          rt::RingAttentionShape s;
          s.batch = 1;
          s.heads_q = hq;
          s.heads_kv = hkv;
          s.s_local = s_local;
          s.head_dim = d;
          s.placement = p;
          return s;
        };
        void* d = nullptr;
        RANK_CUDA(cudaMalloc(&d, 1 << 20));
        std::vector<uint16_t> host(1 << 16);
        sync();
        const auto nc = rt::RingPlacement::kNonCausal, zz = rt::RingPlacement::kCausalZigzag;
        expect(rt::RingAttention::create(comm, shape(6, 4, 64, 64, nc), {}, stream).status(), "heads_q = 6",
               "GQA heads");
        expect(rt::RingAttention::create(comm, shape(4, 4, 64, 96, nc), {}, stream).status(), "head_dim = 96",
               "head dim");
        expect(rt::RingAttention::create(comm, shape(4, 4, 63, 64, zz), {}, stream).status(), "s_local = 63",
               "odd zigzag");
        expect(rt::RingAttention::create(comm, shape(4, 4, 0, 64, nc), {}, stream).status(), "s_local = 0", "empty");
        expect(rt::RingAttention::create(comm, shape(4, 4, 64, 64, static_cast<rt::RingPlacement>(7)), {}, stream)
                   .status(),
               "placement = 7", "placement");
        rt::RingAttentionConfig many;
        many.slots = 9;
        expect(rt::RingAttention::create(comm, shape(4, 4, 64, 64, nc), many, stream).status(), "slots = 9", "slots");
        expect(rt::RingAttention::create(comm, shape(32, 32, 8192, 128, nc), {}, stream).status(), "nvlink_bytes",
               "workspace too small");
        expect(rt::RingAttention::create(comm, shape(4, 4, rank == 0 ? 64 : 72, 64, nc), {}, stream).status(),
               "ranks disagree on s_local", "ranks disagree");
        expect(rt::zigzag_permutation(100, 8).status(), "seq: 100", "zigzag length");
        auto op = rt::RingAttention::create(comm, shape(4, 4, 64, 64, nc), {}, stream);
        RANK_CHECK(op.ok(), "create: %s", op.status().to_string().c_str());
        if (op.ok()) {
          auto* f = static_cast<float*>(d);
          expect(op.value()->launch(static_cast<char*>(d) + 2, d, d, d, f, stream), "pointer q", "misaligned q");
          expect(op.value()->launch(d, host.data(), d, d, f, stream), "pointer k", "host memory for k");
        }
        // Back-to-back agreements, a disagreement then an agreement, with no pause between them:
        // the rank that finds the disagreement first moves on to the next agreement at once and
        // writes its words while the other rank may not have read its words for the first one
        // yet (they go to the other bank: comm.cuh, kAgreeBanks). With one bank, the slower rank
        // once read the next op's description and accepted the disagreement. With the
        // agreement's copies through pageable memory, the slower rank's copy waited for the
        // faster rank's, queued behind its spinning agreement kernel, and the faster rank timed
        // out here (the ranks share one GPU's context; docs/api.md, "Collective planning").
        expect(rt::RingAttention::create(comm, shape(4, 4, rank == 0 ? 64 : 72, 64, nc), {}, stream).status(),
               "ranks disagree on s_local", "ranks disagree, back to back");
        {
          auto again = rt::RingAttention::create(comm, shape(4, 4, 64, 64, nc), {}, stream);
          RANK_CHECK(again.ok(), "create after a disagreement: %s", again.status().to_string().c_str());
        }
        sync();
        (void)cudaFree(d);
        bad += fails;
        return fails;
      });
  std::printf("%s  argument errors and disagreement\n", failed == 0 && bad == 0 ? "ok  " : "FAIL");
  return failed == 0 && bad == 0 ? 0 : 1;
}

// A peer that planned the op but never launches (as a killed process would): rank 0's kernel must
// end within the bound and check() must name the step and the cause.
int run_dead_peer_case() {
  const fused_test::Topology topo{1, 2, "shm"};
  fused_test::Cluster cluster(topo, "ringdead");
  if (!cluster.start()) return 1;
  const Case cs{topo, 1, 4, 4, 256, 64, rt::AttentionLayout::kBHSD, rt::RingPlacement::kCausalZigzag};
  rt::Options o = options_for(cs);
  o.device_wait_timeout_ns = 2'000'000'000ull;
  std::atomic<int> bad{0};
  const int failed = fused_test::run_ranks_in_threads(
      cluster, o, {4096},
      [&](uint32_t rank, rt::Communicator& comm, cudaStream_t stream, const fused_test::RankSync& sync) {
        int fails = 0;
        rt::RingAttentionShape s;
        s.heads_q = 4;
        s.heads_kv = 4;
        s.s_local = 256;
        s.head_dim = 64;
        s.placement = rt::RingPlacement::kCausalZigzag;
        rt::RingAttentionConfig cfg;
        if (cluster.shared_gpu()) {
          cfg.comm_blocks = 2;
          cfg.attn_blocks = 30;
        }
        void* d = nullptr;
        RANK_CUDA(cudaMalloc(&d, 1 << 20));
        sync();
        auto op = rt::RingAttention::create(comm, s, cfg, stream);
        RANK_CHECK(op.ok(), "create: %s", op.status().to_string().c_str());
        sync();
        if (rank == 0 && op.ok()) {
          const auto t0 = std::chrono::steady_clock::now();
          const mkernel::Status l =
              op.value()->launch(d, d, d, static_cast<char*>(d) + (1 << 19), static_cast<float*>(d), stream);
          RANK_CHECK(l.ok(), "launch: %s", l.to_string().c_str());
          RANK_CUDA(cudaStreamSynchronize(stream));
          const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          const mkernel::Status st = comm.check();
          RANK_CHECK(!st.ok() && st.message().find("ring attention waiting for the K/V chunk") != std::string::npos,
                     "check() after a peer that never launched: \"%s\"", st.to_string().c_str());
          RANK_CHECK(secs < 6.0, "the kernel took %.1f s to end (bound 2 s)", secs);
          std::lock_guard<std::mutex> lock(fused_test::g_print);
          std::printf("      ended after %.2f s: %s\n", secs, st.to_string().c_str());
        }
        sync();
        (void)cudaFree(d);
        bad += fails;
        return fails;
      });
  std::printf("%s  a peer that never launches\n", failed == 0 && bad == 0 ? "ok  " : "FAIL");
  return failed == 0 && bad == 0 ? 0 : 1;
}

}  // namespace

int main() {
  ::setenv("CUDA_MODULE_LOADING", "EAGER", 1);
  mkt::require_gpus_or_skip("ring_attention_gpu_test", 1);
  const char* env_seed = std::getenv("MKERNEL_TEST_SEED");
  g_seed = env_seed ? std::strtoull(env_seed, nullptr, 10)
                    : static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count() % 1000000007);
  std::printf("ring_attention_gpu_test: seed %llu (MKERNEL_TEST_SEED replays it)\n",
              static_cast<unsigned long long>(g_seed));
  using L = rt::AttentionLayout;
  using P = rt::RingPlacement;
  std::vector<Case> cases = {
      {{1, 1, "shm"}, 1, 4, 2, 300, 128, L::kBHSD, P::kCausalZigzag},         // one rank: the core alone
      {{1, 2, "shm"}, 1, 4, 4, 200, 64, L::kBHSD, P::kCausalZigzag},          // halves of 100 rows
      {{1, 2, "shm"}, 2, 8, 2, 333, 128, L::kBSHD, P::kNonCausal},            // GQA, [B, S, H, D], odd s_local
      {{1, 2, "shm"}, 1, 4, 1, 256, 128, L::kBHSD, P::kCausalContiguous, 1},  // MQA, contiguous causal
      {{1, 3, "shm"}, 1, 4, 2, 130, 64, L::kBSHD, P::kCausalZigzag},          // odd rank count
      {{1, 4, "shm"}, 1, 2, 2, 100, 64, L::kBHSD, P::kNonCausal, 1, false},   // one slot reused, 16-byte copies
      {{2, 1, "shm"}, 1, 4, 2, 200, 128, L::kBHSD, P::kCausalZigzag},         // two nodes through the proxies
      {{2, 2, "shm"}, 1, 4, 4, 150, 64, L::kBHSD, P::kCausalZigzag, 2},       // forwards over NVLink, slots reused
      // Halves of one row and an odd B x Hq x rows: the second half's running state must still be
      // 8-byte aligned (a misaligned float2 store the random family found).
      {{1, 3, "shm"}, 1, 9, 3, 2, 64, L::kBHSD, P::kCausalZigzag},
      // The adaptive split: the same bits at every split.
      {{1, 2, "shm"}, 1, 8, 4, 300, 128, L::kBHSD, P::kCausalZigzag, 0, true, true},
      {{2, 1, "shm"}, 1, 4, 2, 200, 64, L::kBSHD, P::kNonCausal, 0, true, true},  // through the proxies
  };
  // The random family (random_cases.h): 4 cases by default drawn from the printed seed: any
  // s_local in [1, 600] (even for zigzag), 1 or 2 sequences, 1 to 8 K/V heads with a group of 1
  // to 4 query heads each, head dim 64 or 128, either layout and placement, a random slot count
  // and copy kind, on a random layout.
  fused_test::ShapeDraw draw(g_seed);
  const uint32_t random_cases = fused_test::random_case_count(4);
  for (uint32_t i = 0; i < random_cases; ++i) {
    Case cs;
    cs.topo = fused_test::random_topology(draw);
    cs.batch = 1 + draw.below(2);
    cs.heads_kv = 1 + draw.below(8);
    cs.heads_q = cs.heads_kv * (1 + draw.below(4));
    cs.head_dim = draw.coin() ? 64 : 128;
    cs.layout = draw.coin() ? L::kBHSD : L::kBSHD;
    cs.placement = draw.pick(std::vector<P>{P::kNonCausal, P::kCausalContiguous, P::kCausalZigzag});
    cs.s_local = draw.log_uniform(1, 600);
    if (cs.placement == P::kCausalZigzag) cs.s_local = std::max(2u, cs.s_local & ~1u);
    // Slots: 0 (the op's choice) or any count the plan accepts: at most world - 1 (one per chunk
    // that arrives), and across nodes at least the GPUs per node (ring_attn_plan.h note 3).
    const uint32_t lo = cs.topo.nodes > 1 ? cs.topo.gpus : 1, hi = cs.topo.world() - 1;
    cs.slots = lo <= hi && draw.coin() ? lo + draw.below(hi - lo + 1) : 0;
    cs.bulk = draw.coin(0.75);
    cs.adaptive = draw.below(4) == 0;
    std::printf("random case %zu: %s B %u heads %u/%u s_local %u D %u %s %s slots %u %s%s\n", cases.size(),
                cs.topo.name().c_str(), cs.batch, cs.heads_q, cs.heads_kv, cs.s_local, cs.head_dim,
                cs.layout == L::kBHSD ? "BHSD" : "BSHD", placement_name(cs.placement), cs.slots,
                cs.bulk ? "bulk copies" : "16-byte copies", cs.adaptive ? " adaptive split" : "");
    cases.push_back(cs);
  }
  cases = fused_test::select_cases(cases, "MKERNEL_RING_CASES");  // e.g. "0,2": a subset, for quick runs
  int failures = 0;
  for (const Case& cs : cases) failures += run_case(cs);
  failures += run_error_cases();
  failures += run_dead_peer_case();
  if (failures == 0) std::printf("PASS ring_attention_gpu_test\n");
  return failures == 0 ? 0 : 1;
}
