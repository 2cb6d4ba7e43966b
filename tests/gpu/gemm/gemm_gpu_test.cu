// gemm_gpu_test.cu: correctness of the persistent bf16 GEMM (kernels/gemm) on one Hopper GPU.
//
// Every case draws fresh random inputs (the seed is printed; MKERNEL_TEST_SEED replays one),
// poisons the output with NaN before the launch, and compares with an fp32 reference and with
// cuBLAS by relative Frobenius error. Also: every instantiation (BLOCK_N, cluster, split-K,
// raster, split-K inside clusters), the atomic-add epilogue, tile flags, readiness flags (satisfied and timing out), the
// role split, programmatic dependent launches back to back, and the argument errors. Exit 0 = pass, 1 = failure, 77 = no Hopper GPU.
#include <array>
#include <chrono>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "gemm/gemm_random_family.h"
#include "gemm/gemm_test_util.cuh"
#include "gemm/sm90_bf16_gemm.h"
#include "gemm/sm90_bf16_gemm_launch.cuh"

namespace mk = mkernel::kernels;
using namespace gemm_test;

namespace {

constexpr double kTolerance = 5e-3;  // bf16 output rounding alone gives ~1.5e-3
int g_failures = 0;
uint64_t g_seed = 0;
cublasHandle_t g_cublas = nullptr;

struct Buffers {
  __nv_bfloat16 *a = nullptr, *w = nullptr, *d = nullptr, *dc = nullptr;
  float* ref = nullptr;
  void* ws = nullptr;
  size_t ws_bytes = 0;
  mk::DeviceStatus* status = nullptr;
  Buffers(int m, int n, int k) {
    GT_CUDA(cudaMalloc(&a, sizeof(__nv_bfloat16) * m * k));
    GT_CUDA(cudaMalloc(&w, sizeof(__nv_bfloat16) * n * k));
    GT_CUDA(cudaMalloc(&d, sizeof(__nv_bfloat16) * m * n));
    GT_CUDA(cudaMalloc(&dc, sizeof(__nv_bfloat16) * m * n));
    GT_CUDA(cudaMalloc(&ref, sizeof(float) * m * n));
    GT_CUDA(cudaMalloc(&status, sizeof(mk::DeviceStatus)));
    GT_CUDA(cudaMemset(status, 0, sizeof(mk::DeviceStatus)));
  }
  void workspace(size_t bytes) {
    if (bytes <= ws_bytes) return;
    if (ws) GT_CUDA(cudaFree(ws));
    GT_CUDA(cudaMalloc(&ws, bytes));
    GT_CUDA(cudaMemset(ws, 0, bytes));
    ws_bytes = bytes;
  }
  ~Buffers() {
    cudaFree(a);
    cudaFree(w);
    cudaFree(d);
    cudaFree(dc);
    cudaFree(ref);
    cudaFree(ws);
    cudaFree(status);
  }
};

void check(bool ok, const std::string& what) {
  if (!ok) {
    ++g_failures;
    std::printf("FAIL  %s\n", what.c_str());
  }
}

mk::DeviceStatus read_status(const Buffers& b) {
  mk::DeviceStatus s{};
  GT_CUDA(cudaMemcpy(&s, b.status, sizeof(s), cudaMemcpyDeviceToHost));
  GT_CUDA(cudaMemset(b.status, 0, sizeof(s)));
  return s;
}

std::string status_text(const mk::DeviceStatus& s) { return mk::describe_device_status(s, 0); }

std::string shape_str(int m, int n, int k) {
  return std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k);
}

mk::GemmArgs make_args(Buffers& b, int m, int n, int k, const mk::GemmConfig& cfg) {
  mk::GemmArgs args;
  args.a = b.a;
  args.w = b.w;
  args.d = b.d;
  args.m = m;
  args.n = n;
  args.k = k;
  args.config = cfg;
  args.wait.status = b.status;
  const size_t ws = mk::gemm_workspace_bytes(args);
  b.workspace(ws);
  args.workspace = b.ws;
  args.workspace_bytes = b.ws_bytes;
  return args;
}

// Checks that planning a 64 x 64 x 64 GEMM with `c` and `epilogue` is refused as an invalid
// configuration with a message containing every one of `words` (the fields and values it names).
void expect_refused(const mk::GemmConfig& c, mk::GemmEpilogue epilogue, std::initializer_list<const char*> words,
                    const std::string& what) {
  Buffers b(64, 64, 64);
  mk::GemmArgs args = make_args(b, 64, 64, 64, c);
  args.epilogue = epilogue;
  mk::GemmPlan plan;
  const mk::GemmResult r = mk::gemm_plan(args, &plan);
  bool ok = r.code == mk::GemmError::kInvalidConfig;
  for (const char* w : words) ok = ok && r.message.find(w) != std::string::npos;
  check(ok, what + " (got: " + r.message + ")");
}

// The six decompositions every tile shape is checked in: clusters of 1 and 2, each whole tiles,
// 3 splits per tile and stream-K; the operands as given unless `swap_ab` (then block_n is the
// swapped problem's width).
std::vector<mk::GemmConfig> decompositions(int block_n, int block_m = 0, int swap_ab = 0) {
  std::vector<mk::GemmConfig> out;
  for (int cl : {1, 2})
    for (int mode = 0; mode < 3; ++mode) {
      mk::GemmConfig c;
      c.swap_ab = swap_ab;
      c.block_m = block_m;
      c.block_n = block_n;
      c.cluster_m = cl;
      c.num_splits = mode == 0 ? 1 : mode == 1 ? 3 : 0;
      c.stream_k = mode == 2 ? 1 : 0;
      out.push_back(c);
    }
  return out;
}

// Pairs along n (GemmConfig::cluster_n = 2): whole tiles, 3 splits per tile and stream-K.
std::vector<mk::GemmConfig> pair_decompositions(int block_n, int block_m, int swap_ab) {
  std::vector<mk::GemmConfig> out;
  for (int mode = 0; mode < 3; ++mode) {
    mk::GemmConfig c;
    c.swap_ab = swap_ab;
    c.block_m = block_m;
    c.block_n = block_n;
    c.cluster_m = 1;
    c.cluster_n = 2;
    c.num_splits = mode == 0 ? 1 : mode == 1 ? 3 : 0;
    c.stream_k = mode == 2 ? 1 : 0;
    out.push_back(c);
  }
  return out;
}

// 2 x 2 clusters (GemmConfig::cluster_m = cluster_n = 2): whole tiles, 3 splits per tile and
// stream-K.
std::vector<mk::GemmConfig> quad_decompositions(int block_n, int block_m, int swap_ab) {
  std::vector<mk::GemmConfig> out = pair_decompositions(block_n, block_m, swap_ab);
  for (auto& c : out) c.cluster_m = 2;
  return out;
}

// Fresh random inputs (from the test's seed and `seed_offset`), the fp32 reference and a plan;
// false (with the failure recorded) when planning fails.
bool prepare_case(Buffers& b, int m, int n, int k, const mk::GemmConfig& cfg, uint64_t seed_offset,
                  const std::string& name, mk::GemmPlan* plan) {
  const uint64_t seed = g_seed + seed_offset;
  fill_random(b.a, static_cast<size_t>(m) * k, seed);
  fill_random(b.w, static_cast<size_t>(n) * k, seed + 1);
  reference_gemm(b.a, b.w, b.ref, m, n, k);
  const mk::GemmResult r = mk::gemm_plan(make_args(b, m, n, k, cfg), plan);
  if (!r.ok()) check(false, name + ": plan failed: " + r.message);
  return r.ok();
}

// Fresh inputs, reference, poisoned output, launch, compare with reference and cuBLAS.
void run_case(int m, int n, int k, const mk::GemmConfig& cfg, const char* label) {
  static uint64_t counter = 0;
  Buffers b(m, n, k);
  const std::string name = std::string(label) + " " + shape_str(m, n, k);
  mk::GemmPlan plan;
  if (!prepare_case(b, m, n, k, cfg, 1000 * (++counter), name, &plan)) return;
  poison(b.dc, static_cast<size_t>(m) * n);
  cublas_gemm(g_cublas, b.a, b.w, b.dc, m, n, k);
  mk::GemmResult r;
  const std::string cfg_str = mk::gemm_config_string(plan);
  double worst = 0;
  for (int rep = 0; rep < 2; ++rep) {  // twice: the split-K counters must come back to zero
    poison(b.d, static_cast<size_t>(m) * n);
    r = mk::gemm_launch(plan, nullptr);
    if (!r.ok()) {
      check(false, name + ": launch failed: " + r.message);
      return;
    }
    GT_CUDA(cudaGetLastError());
    GT_CUDA(cudaDeviceSynchronize());
    const mk::DeviceStatus st = read_status(b);
    check(st.code == mk::kDeviceOk, name + ": status " + status_text(st));
    const size_t count = static_cast<size_t>(m) * n;
    const auto out = to_host_float(b.d, count);
    const auto ref = to_host(b.ref, count);
    const auto cub = to_host_float(b.dc, count);
    const ErrorStats e_ref = compare(out, ref);
    const ErrorStats e_cub = compare(out, cub);
    const ErrorStats e_cub_ref = compare(cub, ref);
    const bool ok = e_ref.non_finite == 0 && e_ref.rel_fro < kTolerance && e_cub.rel_fro < kTolerance;
    worst = std::max(worst, e_ref.rel_fro);
    if (!ok || rep == 1) {
      std::printf("%s  %-34s [%s] rep %d: rel err vs fp32 %.2e (cuBLAS vs fp32 %.2e), vs cuBLAS %.2e, max abs %.3g, "
                  "unwritten/non-finite %zu",
                  ok ? "ok  " : "FAIL", name.c_str(), cfg_str.c_str(), rep, e_ref.rel_fro, e_cub_ref.rel_fro,
                  e_cub.rel_fro, e_ref.max_abs, e_ref.non_finite);
      if (e_ref.non_finite) std::printf(" (first at row %zu col %zu)", e_ref.first_bad / n, e_ref.first_bad % n);
      std::printf("\n");
    }
    if (!ok) ++g_failures;
  }
}

// Bitwise reproducibility: the same inputs launched `launches` times, the output's bits
// compared with the first launch's (and the first launch against the fp32 reference). With
// deterministic = true every launch must give the same bits; otherwise the number of launches
// that differed is only reported (fp32 additions in arrival order).
void run_bitwise_case(int m, int n, int k, const mk::GemmConfig& cfg, const char* label, int launches = 5) {
  static uint64_t counter = 0;
  Buffers b(m, n, k);
  const std::string name = std::string(label) + " " + shape_str(m, n, k);
  mk::GemmPlan plan;
  if (!prepare_case(b, m, n, k, cfg, 7777 * (++counter), name, &plan)) return;
  mk::GemmResult r;
  const size_t count = static_cast<size_t>(m) * n;
  std::vector<uint16_t> first(count), now(count);
  int differed = 0;
  for (int i = 0; i < launches; ++i) {
    poison(b.d, count);
    r = mk::gemm_launch(plan, nullptr);
    if (!r.ok()) {
      check(false, name + ": launch failed: " + r.message);
      return;
    }
    GT_CUDA(cudaDeviceSynchronize());
    const mk::DeviceStatus st = read_status(b);
    check(st.code == mk::kDeviceOk, name + ": status " + status_text(st));
    GT_CUDA(cudaMemcpy((i == 0 ? first : now).data(), b.d, count * sizeof(uint16_t), cudaMemcpyDeviceToHost));
    if (i == 0) {
      const ErrorStats e = compare(to_host_float(b.d, count), to_host(b.ref, count));
      check(e.non_finite == 0 && e.rel_fro < kTolerance, name + ": rel err vs fp32 " + std::to_string(e.rel_fro));
    } else if (std::memcmp(first.data(), now.data(), count * sizeof(uint16_t)) != 0) {
      ++differed;
    }
  }
  const std::string cfg_str = mk::gemm_config_string(plan);
  // In-cluster split-K sums its partials in rank order: always reproducible.
  const bool cluster_k = plan.config.cluster_k > 1;
  const bool want_same = cfg.deterministic || cluster_k;
  const bool ok = !want_same || differed == 0;
  std::printf("%s  %-34s [%s] %d launches, %d differed from the first in some bit%s\n", ok ? "ok  " : "FAIL", name.c_str(),
              cfg_str.c_str(), launches, differed, want_same ? " (deterministic: must be 0)" : " (arrival order)");
  if (!ok) ++g_failures;
  if (cluster_k && plan.config.cluster_k < 3) {
    check(false, name + ": the case does not split a tile into 3 or more parts (" + cfg_str + "), so it checks nothing");
  } else if (want_same && !cluster_k && plan.schedule.max_participants() < 3) {
    check(false, name + ": the case does not split a tile into 3 or more parts (" + cfg_str + "), so it checks nothing");
  }
}

// Programmatic dependent launch (GemmConfig::programmatic_launch): four GEMMs back to back on one
// stream with no synchronisation between them, each reading the one before (read after write)
// and the third overwriting what the second reads (write after read):
//   D1 = A W1^T;  D2 = D1 W2^T;  D1 = B W1^T;  D3 = D1 W2^T.
// Their results must equal, bit for bit, the same plans launched without the attribute with the
// stream synchronised after each launch (the deterministic fix-up makes any split reproducible).
// Fresh inputs per round from two sets; outputs poisoned before every round.
void run_pdl_chain(int m, int k, int n1, int n2, const char* label, int cluster_k = 0) {
  const std::string name = std::string(label) + " m" + std::to_string(m) + " k" + std::to_string(k) + " n" +
                           std::to_string(n1) + "/" + std::to_string(n2);
  auto alloc = [](size_t elems) {
    __nv_bfloat16* p = nullptr;
    GT_CUDA(cudaMalloc(&p, elems * sizeof(__nv_bfloat16)));
    return p;
  };
  __nv_bfloat16 *a[2], *bb[2];
  for (int i = 0; i < 2; ++i) {
    a[i] = alloc(static_cast<size_t>(m) * k);
    bb[i] = alloc(static_cast<size_t>(m) * k);
    fill_random(a[i], static_cast<size_t>(m) * k, g_seed + 101 + i);
    fill_random(bb[i], static_cast<size_t>(m) * k, g_seed + 201 + i);
  }
  __nv_bfloat16* w1 = alloc(static_cast<size_t>(n1) * k);
  __nv_bfloat16* w2 = alloc(static_cast<size_t>(n2) * n1);
  fill_random(w1, static_cast<size_t>(n1) * k, g_seed + 301, 0.1f);
  fill_random(w2, static_cast<size_t>(n2) * n1, g_seed + 302, 0.1f);
  __nv_bfloat16* d1 = alloc(static_cast<size_t>(m) * n1);
  __nv_bfloat16* d2 = alloc(static_cast<size_t>(m) * n2);
  __nv_bfloat16* d3 = alloc(static_cast<size_t>(m) * n2);
  mk::DeviceStatus* status = nullptr;
  GT_CUDA(cudaMalloc(&status, sizeof(mk::DeviceStatus)));
  GT_CUDA(cudaMemset(status, 0, sizeof(mk::DeviceStatus)));
  cudaStream_t st;
  GT_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  std::vector<void*> workspaces;
  // plans[set][step][pdl]
  mk::GemmPlan plans[2][4][2];
  bool ok = true;
  for (int set = 0; set < 2 && ok; ++set) {
    for (int step = 0; step < 4 && ok; ++step) {
      for (int pdl = 0; pdl < 2 && ok; ++pdl) {
        mk::GemmArgs args;
        args.a = step == 0 ? a[set] : step == 2 ? bb[set] : d1;
        args.w = step % 2 == 0 ? w1 : w2;
        args.d = step == 0 || step == 2 ? d1 : step == 1 ? d2 : d3;
        args.m = m;
        args.n = step % 2 == 0 ? n1 : n2;
        args.k = step % 2 == 0 ? k : n1;
        args.config.deterministic = true;
        args.config.programmatic_launch = pdl == 1;
        args.config.cluster_k = cluster_k;
        args.wait.status = status;
        const size_t ws = mk::gemm_workspace_bytes(args);
        if (ws > 0) {
          void* p = nullptr;
          GT_CUDA(cudaMalloc(&p, ws));
          GT_CUDA(cudaMemset(p, 0, ws));
          workspaces.push_back(p);
          args.workspace = p;
          args.workspace_bytes = ws;
        }
        const mk::GemmResult r = mk::gemm_plan(args, &plans[set][step][pdl]);
        if (!r.ok()) {
          check(false, name + ": plan failed: " + r.message);
          ok = false;
        }
      }
    }
  }
  const size_t c2 = static_cast<size_t>(m) * n2;
  std::vector<uint16_t> ref2(c2), ref3(c2), got2(c2), got3(c2);
  int mismatched = 0, rounds = 0;
  std::string configs;
  for (int round = 0; round < 8 && ok; ++round, ++rounds) {
    const int set = round % 2;
    // The four launches from poisoned outputs: without the attribute, the stream synchronised
    // after each (the reference), or with it, back to back.
    auto run_chain = [&](int pdl) {
      for (__nv_bfloat16* p : {d1, d2, d3}) poison(p, p == d1 ? static_cast<size_t>(m) * n1 : c2, st);
      GT_CUDA(cudaStreamSynchronize(st));
      for (int step = 0; step < 4 && ok; ++step) {
        const mk::GemmResult r = mk::gemm_launch(plans[set][step][pdl], st);
        if (!r.ok()) {
          check(false, name + ": launch failed: " + r.message);
          ok = false;
        }
        if (!pdl) GT_CUDA(cudaStreamSynchronize(st));
      }
      GT_CUDA(cudaStreamSynchronize(st));
    };
    run_chain(0);
    GT_CUDA(cudaMemcpy(ref2.data(), d2, c2 * sizeof(uint16_t), cudaMemcpyDeviceToHost));
    GT_CUDA(cudaMemcpy(ref3.data(), d3, c2 * sizeof(uint16_t), cudaMemcpyDeviceToHost));
    run_chain(1);
    GT_CUDA(cudaMemcpy(got2.data(), d2, c2 * sizeof(uint16_t), cudaMemcpyDeviceToHost));
    GT_CUDA(cudaMemcpy(got3.data(), d3, c2 * sizeof(uint16_t), cudaMemcpyDeviceToHost));
    if (std::memcmp(ref2.data(), got2.data(), c2 * 2) != 0 || std::memcmp(ref3.data(), got3.data(), c2 * 2) != 0)
      ++mismatched;
    // The reference itself must be finite (a poisoned input would propagate NaN into both).
    if (round == 0) {
      size_t bad = 0;
      for (uint16_t v : ref3) bad += (v & 0x7f80) == 0x7f80;
      check(bad == 0, name + ": the reference chain has " + std::to_string(bad) + " non-finite outputs");
    }
  }
  mk::DeviceStatus stv{};
  GT_CUDA(cudaMemcpy(&stv, status, sizeof(stv), cudaMemcpyDeviceToHost));
  check(stv.code == mk::kDeviceOk, name + ": status " + status_text(stv));
  for (int step = 0; step < 4; ++step) configs += (step ? " | " : "") + mk::gemm_config_string(plans[0][step][1]);
  const bool pass = ok && mismatched == 0;
  std::printf("%s  %-34s %d rounds, %d differed from one launch at a time  [%s]\n", pass ? "ok  " : "FAIL",
              name.c_str(), rounds, mismatched, configs.c_str());
  if (!pass) ++g_failures;
  for (void* p : workspaces) GT_CUDA(cudaFree(p));
  for (int i = 0; i < 2; ++i) {
    GT_CUDA(cudaFree(a[i]));
    GT_CUDA(cudaFree(bb[i]));
  }
  for (void* p : {static_cast<void*>(w1), static_cast<void*>(w2), static_cast<void*>(d1), static_cast<void*>(d2),
                  static_cast<void*>(d3), static_cast<void*>(status)})
    GT_CUDA(cudaFree(p));
  GT_CUDA(cudaStreamDestroy(st));
}

// D starts as random C; D += A W^T with the atomic-add epilogue.
void run_atomic_case(int m, int n, int k, int block_n, int cluster, int stream_k = -1) {
  Buffers b(m, n, k);
  const size_t count = static_cast<size_t>(m) * n;
  fill_random(b.a, static_cast<size_t>(m) * k, g_seed + 77);
  fill_random(b.w, static_cast<size_t>(n) * k, g_seed + 78);
  fill_random(b.d, count, g_seed + 79, 8.0f);
  reference_gemm(b.a, b.w, b.ref, m, n, k);
  const auto c0 = to_host_float(b.d, count);
  mk::GemmConfig cfg;
  cfg.block_n = block_n;
  cfg.cluster_m = cluster;
  cfg.stream_k = stream_k;
  mk::GemmArgs args = make_args(b, m, n, k, cfg);
  args.epilogue = mk::kEpilogueAtomicAdd;
  mk::GemmPlan plan;
  mk::GemmResult r = mk::gemm_plan(args, &plan);
  check(r.ok(), "atomic-add plan: " + r.message);
  r = mk::gemm_launch(plan, nullptr);
  check(r.ok(), "atomic-add launch: " + r.message);
  GT_CUDA(cudaDeviceSynchronize());
  check(read_status(b).code == mk::kDeviceOk, "atomic-add status");
  const auto out = to_host_float(b.d, count);
  auto ref = to_host(b.ref, count);
  for (size_t i = 0; i < count; ++i) ref[i] += c0[i];
  const ErrorStats e = compare(out, ref);
  const bool ok = e.non_finite == 0 && e.rel_fro < 2 * kTolerance;
  std::printf("%s  atomic-add %s [%s]: rel err vs fp32(C + AW^T) %.2e\n", ok ? "ok  " : "FAIL",
              shape_str(m, n, k).c_str(), mk::gemm_config_string(plan).c_str(), e.rel_fro);
  if (!ok) ++g_failures;
}

// Tile flags raised with the launch's value; readiness flags satisfied; readiness flags that
// never come end the launch with kDeviceWaitTimeout (at step kStepGemmReady) instead of hanging;
// a ring error word raised while waiting ends it with kDeviceRingError.
void run_flag_cases() {
  const int m = 1000, n = 2048, k = 1024;
  for (int cluster : {1, 2}) {
    Buffers b(m, n, k);
    fill_random(b.a, static_cast<size_t>(m) * k, g_seed + 5);
    fill_random(b.w, static_cast<size_t>(n) * k, g_seed + 6);
    reference_gemm(b.a, b.w, b.ref, m, n, k);
    mk::GemmConfig cfg;
    cfg.cluster_m = cluster;
    cfg.block_n = 256;
    mk::GemmArgs args = make_args(b, m, n, k, cfg);
    const uint32_t tiles = mk::gemm_num_tiles(args);
    const int m_blocks = (m + 127) / 128;
    uint64_t *tile_flags = nullptr, *ready = nullptr;
    GT_CUDA(cudaMalloc(&tile_flags, tiles * sizeof(uint64_t)));
    GT_CUDA(cudaMalloc(&ready, m_blocks * sizeof(uint64_t)));
    GT_CUDA(cudaMemset(tile_flags, 0, tiles * sizeof(uint64_t)));
    std::vector<uint64_t> h_ready(m_blocks, 41);
    GT_CUDA(cudaMemcpy(ready, h_ready.data(), m_blocks * sizeof(uint64_t), cudaMemcpyHostToDevice));
    args.hooks.tile_flags = tile_flags;
    args.hooks.tile_flag_value = 41;
    args.hooks.ready_flags = ready;
    args.hooks.ready_value = 41;
    args.hooks.first_m_block = 3;  // rotated order must still cover every tile
    poison(b.d, static_cast<size_t>(m) * n);
    mk::GemmResult r = mk::gemm_bf16_tn(args, nullptr);
    check(r.ok(), "flags launch: " + r.message);
    GT_CUDA(cudaDeviceSynchronize());
    check(read_status(b).code == mk::kDeviceOk, "flags status");
    std::vector<uint64_t> h_flags(tiles);
    GT_CUDA(cudaMemcpy(h_flags.data(), tile_flags, tiles * sizeof(uint64_t), cudaMemcpyDeviceToHost));
    uint32_t raised = 0;
    for (uint64_t f : h_flags) raised += f == 41;
    const ErrorStats e = compare(to_host_float(b.d, static_cast<size_t>(m) * n), to_host(b.ref, static_cast<size_t>(m) * n));
    const bool ok = raised == tiles && e.non_finite == 0 && e.rel_fro < kTolerance;
    std::printf("%s  flags c%d: %u/%u tile flags raised, rel err %.2e (ready flags satisfied, rotated order)\n",
                ok ? "ok  " : "FAIL", cluster, raised, tiles, e.rel_fro);
    if (!ok) ++g_failures;

    // Readiness never reached: bounded wait, error code, clean exit.
    args.hooks.ready_value = 42;
    args.wait.timeout_ns = 20'000'000;  // 20 ms
    const auto t0 = std::chrono::steady_clock::now();
    r = mk::gemm_bf16_tn(args, nullptr);
    check(r.ok(), "timeout launch: " + r.message);
    const cudaError_t sync = cudaDeviceSynchronize();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const mk::DeviceStatus st = read_status(b);
    const bool ok2 = sync == cudaSuccess && st.code == mk::kDeviceWaitTimeout &&
                     (st.where >> 56) == mk::kStepGemmReady && ms < 5000;
    std::printf("%s  readiness timeout c%d: status '%s' after %.1f ms, launch %s\n", ok2 ? "ok  " : "FAIL", cluster,
                status_text(st).c_str(), ms, cudaGetErrorString(sync));
    if (!ok2) ++g_failures;

    // The same wait with a long bound ends at once when the ring's error word is set.
    uint32_t* ring_error = nullptr;
    GT_CUDA(cudaMalloc(&ring_error, sizeof(uint32_t)));
    const uint32_t gone = mkernel::protocol::kRingErrDaemonGone;
    GT_CUDA(cudaMemcpy(ring_error, &gone, sizeof(gone), cudaMemcpyHostToDevice));
    args.wait.timeout_ns = 10'000'000'000ull;
    args.wait.ring_error = ring_error;
    const auto t1 = std::chrono::steady_clock::now();
    r = mk::gemm_bf16_tn(args, nullptr);
    check(r.ok(), "ring-error launch: " + r.message);
    const cudaError_t sync3 = cudaDeviceSynchronize();
    const double ms3 = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t1).count();
    const mk::DeviceStatus st3 = read_status(b);
    const bool ok3 = sync3 == cudaSuccess && st3.code == mk::kDeviceRingError && st3.detail == gone && ms3 < 1000;
    std::printf("%s  ring error while waiting c%d: status '%s' after %.1f ms\n", ok3 ? "ok  " : "FAIL", cluster,
                status_text(st3).c_str(), ms3);
    if (!ok3) ++g_failures;
    GT_CUDA(cudaFree(ring_error));
    GT_CUDA(cudaFree(tile_flags));
    GT_CUDA(cudaFree(ready));
  }
}

// Role split: the last blocks of the grid run another role while the others compute the GEMM.
// block_exit runs once per block (GEMM and role blocks) after its work: it counts them.
struct MarkRole {
  static constexpr bool kHasBlockExit = true;
  __device__ static void run(const mk::GemmParams& p, uint32_t role_block, uint32_t num_role_blocks) {
    if (threadIdx.x == 0) static_cast<uint32_t*>(p.role_args)[role_block] = 1000 + num_role_blocks;
  }
  __device__ static void block_exit(const mk::GemmParams& p) {
    atomicAdd(static_cast<uint32_t*>(p.role_args) + 63, 1u);
  }
};

void run_role_case() {
  const int m = 2048, n = 4096, k = 1024, kRoleBlocks = 8;
  Buffers b(m, n, k);
  fill_random(b.a, static_cast<size_t>(m) * k, g_seed + 9);
  fill_random(b.w, static_cast<size_t>(n) * k, g_seed + 10);
  reference_gemm(b.a, b.w, b.ref, m, n, k);
  uint32_t* marks = nullptr;
  GT_CUDA(cudaMalloc(&marks, 64 * sizeof(uint32_t)));  // [0, kRoleBlocks): role marks; [63]: exits
  GT_CUDA(cudaMemset(marks, 0, 64 * sizeof(uint32_t)));
  mk::GemmConfig cfg;
  cfg.block_n = 256;
  cfg.cluster_m = 2;
  cfg.num_role_blocks = kRoleBlocks;
  mk::GemmArgs args = make_args(b, m, n, k, cfg);
  args.hooks.role_args = marks;
  mk::GemmPlan plan;
  mk::GemmResult r = mk::gemm_plan(args, &plan);
  check(r.ok(), "role plan: " + r.message);
  poison(b.d, static_cast<size_t>(m) * n);
  using T = mk::Sm90GemmTraits<256, 4, 2, mk::kEpilogueStore>;
  r = mk::launch_sm90_bf16_gemm<T, MarkRole>(plan, nullptr);
  check(r.ok(), "role launch: " + r.message);
  GT_CUDA(cudaDeviceSynchronize());
  check(read_status(b).code == mk::kDeviceOk, "role status");
  std::vector<uint32_t> h(64);
  GT_CUDA(cudaMemcpy(h.data(), marks, 64 * sizeof(uint32_t), cudaMemcpyDeviceToHost));
  int marked = 0;
  for (int i = 0; i < kRoleBlocks; ++i) marked += h[i] == 1000 + kRoleBlocks;
  const uint32_t blocks = static_cast<uint32_t>(plan.config.num_gemm_blocks + plan.config.num_role_blocks);
  const ErrorStats e = compare(to_host_float(b.d, static_cast<size_t>(m) * n), to_host(b.ref, static_cast<size_t>(m) * n));
  const bool ok = marked == kRoleBlocks && h[63] == blocks && e.non_finite == 0 && e.rel_fro < kTolerance;
  std::printf("%s  role split: %d GEMM blocks, %d/%d role blocks ran, block_exit %u/%u, GEMM rel err %.2e\n",
              ok ? "ok  " : "FAIL", plan.config.num_gemm_blocks, marked, kRoleBlocks, h[63], blocks, e.rel_fro);
  if (!ok) ++g_failures;
  GT_CUDA(cudaFree(marks));
}

// Shards and local rows (what AllGather+GEMM uses): A is a stack of shards of 333 rows flagged
// in chunks of 100 rows, so shard boundaries fall inside tiles; rows [333, 666) are also held
// in a separate buffer (a_local), and A's copy of the rows of tiles lying wholly inside them is
// poisoned, so only a kernel that reads those tiles from a_local gets them right. All flags are
// raised but one chunk's, which must end the launch with a timeout naming a tile that needs it.
void run_shard_case() {
  const int m = 1332, n = 1024, k = 512, shard = 333, chunk = 100;
  const int lb = 333, le = 666;
  Buffers b(m, n, k);
  fill_random(b.a, static_cast<size_t>(m) * k, g_seed + 21);
  fill_random(b.w, static_cast<size_t>(n) * k, g_seed + 22);
  reference_gemm(b.a, b.w, b.ref, m, n, k);
  __nv_bfloat16* local = nullptr;
  GT_CUDA(cudaMalloc(&local, sizeof(__nv_bfloat16) * (le - lb) * k));
  GT_CUDA(cudaMemcpy(local, b.a + static_cast<size_t>(lb) * k, sizeof(__nv_bfloat16) * (le - lb) * k,
                     cudaMemcpyDeviceToDevice));
  // m blocks wholly inside [333, 666): rows [384, 512) and [512, 640).
  poison(b.a + static_cast<size_t>(384) * k, static_cast<size_t>(640 - 384) * k);
  const int chunks_per_shard = (shard + chunk - 1) / chunk;
  const int num_flags = (m / shard) * chunks_per_shard;
  uint64_t* ready = nullptr;
  GT_CUDA(cudaMalloc(&ready, num_flags * sizeof(uint64_t)));
  std::vector<uint64_t> h_ready(num_flags, 9);
  GT_CUDA(cudaMemcpy(ready, h_ready.data(), num_flags * sizeof(uint64_t), cudaMemcpyHostToDevice));
  for (int cluster : {1, 2}) {
    mk::GemmConfig cfg;
    cfg.cluster_m = cluster;
    mk::GemmArgs args = make_args(b, m, n, k, cfg);
    args.hooks.ready_flags = ready;
    args.hooks.ready_value = 9;
    args.hooks.ready_rows_per_flag = chunk;
    args.hooks.ready_shard_rows = shard;
    args.hooks.a_local = local;
    args.hooks.local_rows_begin = lb;
    args.hooks.local_rows_end = le;
    args.hooks.first_m_block = lb / 128;
    poison(b.d, static_cast<size_t>(m) * n);
    mk::GemmResult r = mk::gemm_bf16_tn(args, nullptr);
    check(r.ok(), "shard launch: " + r.message);
    GT_CUDA(cudaDeviceSynchronize());
    const mk::DeviceStatus st = read_status(b);
    const ErrorStats e = compare(to_host_float(b.d, static_cast<size_t>(m) * n), to_host(b.ref, static_cast<size_t>(m) * n));
    const bool ok = st.code == mk::kDeviceOk && e.non_finite == 0 && e.rel_fro < kTolerance;
    std::printf("%s  shards of %d rows, chunks of %d, local rows [%d, %d) c%d: rel err %.2e, status %s\n",
                ok ? "ok  " : "FAIL", shard, chunk, lb, le, cluster, e.rel_fro, status_text(st).c_str());
    if (!ok) ++g_failures;
  }
  // Chunk 1 of shard 3 (rows 1099..1198) never ready: m block 8 (rows 1024..1151) waits on it.
  const uint64_t stale = 8;
  GT_CUDA(cudaMemcpy(ready + 3 * chunks_per_shard + 1, &stale, sizeof(stale), cudaMemcpyHostToDevice));
  mk::GemmArgs args = make_args(b, m, n, k, mk::GemmConfig{});
  args.hooks.ready_flags = ready;
  args.hooks.ready_value = 9;
  args.hooks.ready_rows_per_flag = chunk;
  args.hooks.ready_shard_rows = shard;
  args.wait.timeout_ns = 20'000'000;
  mk::GemmResult r = mk::gemm_bf16_tn(args, nullptr);
  check(r.ok(), "shard timeout launch: " + r.message);
  GT_CUDA(cudaDeviceSynchronize());
  const mk::DeviceStatus st = read_status(b);
  const uint64_t where_index = st.where & ((uint64_t{1} << 56) - 1);
  const bool ok = st.code == mk::kDeviceWaitTimeout && st.detail == static_cast<uint32_t>(3 * chunks_per_shard + 1) &&
                  (where_index == 8 || where_index == 9);
  std::printf("%s  missing chunk: status %s\n", ok ? "ok  " : "FAIL", status_text(st).c_str());
  if (!ok) ++g_failures;
  GT_CUDA(cudaFree(ready));
  GT_CUDA(cudaFree(local));
}

void expect_error(int64_t m, int64_t n, int64_t k, mk::GemmError code, const char* must_contain, bool misalign = false) {
  Buffers b(8, 8, 8);
  mk::GemmArgs args;
  args.a = misalign ? static_cast<const void*>(reinterpret_cast<const char*>(b.a) + 2) : b.a;
  args.w = b.w;
  args.d = b.d;
  args.m = m;
  args.n = n;
  args.k = k;
  mk::GemmPlan plan;
  const mk::GemmResult r = mk::gemm_plan(args, &plan);
  const bool ok = r.code == code && r.message.find(must_contain) != std::string::npos;
  std::printf("%s  error m=%lld n=%lld k=%lld%s -> \"%s\"\n", ok ? "ok  " : "FAIL", static_cast<long long>(m),
              static_cast<long long>(n), static_cast<long long>(k), misalign ? " (misaligned a)" : "",
              r.message.c_str());
  if (!ok) ++g_failures;
}

}  // namespace

int main() {
  require_hopper_or_skip("gemm_gpu_test");
  const char* env_seed = std::getenv("MKERNEL_TEST_SEED");
  g_seed = env_seed ? std::strtoull(env_seed, nullptr, 10)
                    : static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
  std::printf("gemm_gpu_test: seed %llu (MKERNEL_TEST_SEED=%llu replays it)\n", static_cast<unsigned long long>(g_seed),
              static_cast<unsigned long long>(g_seed));
  GT_CUBLAS(cublasCreate(&g_cublas));

  // Argument errors first: they need no kernel.
  expect_error(1000, 1001, 4096, mk::GemmError::kInvalidN, "n = 1001");
  expect_error(1000, 4096, 100, mk::GemmError::kInvalidK, "multiple of 8");
  expect_error(0, 4096, 4096, mk::GemmError::kInvalidM, "m = 0");
  expect_error(16, 4, 64, mk::GemmError::kInvalidN, "n = 4");
  expect_error(16, 64, 64, mk::GemmError::kInvalidPointer, "16-byte", true);

  // Shapes with the default configuration: large, non-square, odd m, decode-like m, smallest.
  const mk::GemmConfig def;
  run_case(8, 8, 8, def, "smallest");
  run_case(1, 8192, 8192, def, "decode m=1");
  run_case(16, 8192, 8192, def, "decode m=16");
  run_case(128, 8192, 8192, def, "m=128");
  run_case(1000, 8192, 8192, def, "odd m");
  run_case(333, 1000, 520, def, "ragged m, n, k");
  run_case(4096, 4096, 4096, def, "square");
  run_case(2048, 14336, 4096, def, "wide");
  run_case(8192, 8192, 8192, def, "large");
  run_case(4096, 2048, 14336, def, "deep k");

  // Programmatic dependent launches back to back: tiny grids (the next launch starts beside the
  // running one), a decode-like m, and full waves.
  run_pdl_chain(16, 512, 512, 256, "pdl chain, tiny");
  run_pdl_chain(3, 2048, 4096, 1024, "pdl chain, m=3");
  run_pdl_chain(1000, 1024, 2048, 1040, "pdl chain, waves");
  run_pdl_chain(4096, 4096, 4096, 4096, "pdl chain, large");
  run_pdl_chain(5, 1224, 1512, 1032, "pdl chain, cluster_k 4", 4);

  // Every library instantiation and work decomposition on one ragged shape: data-parallel,
  // split-K, stream-K with the chosen units and with 7 units (each spanning several tiles).
  for (int bn : {128, 256})
    for (int cl : {1, 2})
      for (int mode = 0; mode < 4; ++mode)
        for (int ra : {0, 1}) {
          mk::GemmConfig c;
          c.block_n = bn;
          c.cluster_m = cl;
          c.num_splits = mode == 0 ? 1 : mode == 1 ? 3 : 0;
          c.stream_k = mode >= 2 ? 1 : 0;
          c.sk_units = mode == 3 ? 7 : 0;
          c.raster = ra;
          c.group = 3;
          c.swap_ab = 0;
          c.block_m = 128;
          run_case(1100, 1280, 1096, c, "config");  // 9 m blocks: a padding tile with clusters of 2
        }
  // The other tile widths (multiples of 16 between 128 and 256; one that is not a multiple of 64
  // stores its last columns with masked stores): data-parallel, split-K and stream-K with
  // clusters of 1 and 2 on a shape whose n ends inside a tile for every width (and inside the
  // masked columns for some), then a narrow n (what the widths are for) and the atomic-add
  // epilogue. Unwritten or overwritten columns show as errors (the output is poisoned first).
  for (int bn : mk::kGemmBlockWidths) {
    if (bn == 128 || bn == 256) continue;
    for (const auto& c : decompositions(bn)) run_case(1100, 1000, 1096, c, "width");
    mk::GemmConfig narrow;
    narrow.block_n = bn;
    narrow.swap_ab = 0;
    run_case(777, 280, 2000, narrow, "width, narrow n");
    run_atomic_case(300, 1000, 512, bn, 2);
  }
  // Swapped operands (GemmConfig::swap_ab = 1: D^T = W A^T, stored transposed through
  // stmatrix .trans and 16 x 64 boxes): every width of kGemmSwapWidths in the six
  // decompositions, with m = 2 widths + 8 (the last tile ends 8 rows into its width, inside a
  // 16-row box that TMA clips at m) and n = 1096 (9 weight blocks: a padding tile with clusters
  // of 2, the last block 72 rows, so its second consumer's rows end inside it); then
  // decode-like m with the rule's width, and the rule left to choose on shapes where it may.
  for (int bn : mk::kGemmSwapWidths)
    for (const auto& c : decompositions(bn, 128, 1)) run_case(2 * bn + 8, 1096, 1096, c, "swapped");
  // 64-row swapped tiles (each consumer half of the width: 8 to 32 columns, stored in 8-row
  // boxes): n = 1096 gives 18 weight blocks, the last of 8 rows; m ends inside the second
  // consumer's half of the last tile (2 widths + 8 + width / 2).
  for (int bn : mk::kGemmSwap64Widths)
    for (const auto& c : decompositions(bn, 64, 1)) {
      run_case(2 * bn + 8, 1096, 1096, c, "swapped, 64 rows");
      run_case(2 * bn + bn / 2 + 8, 1096, 1096, c, "swapped, 64 rows");
    }
  for (int m : {1, 5, 16, 40, 100, 130}) {
    mk::GemmConfig c;
    c.swap_ab = 1;
    run_case(m, 4104, 3000, c, "swapped, rule's width");
  }
  // Pairs along n (the A tile multicast): every width with 128-row tiles, the 192-row widths and
  // every swapped width, each whole, split 3 ways and stream-K; n ends 8 columns into an odd
  // last n block (the pair's second CTA is padding: its weight loads are out of bounds and it
  // stores nothing) or an even one, m ends inside the last m block (inside its second half, which
  // the pair's second CTA loads, for the 128-row tiles).
  for (int bn : mk::kGemmBlockWidths)
    for (const auto& c : pair_decompositions(bn, 128, 0)) {
      run_case(1100, 2 * bn + 8, 1096, c, "pair along n, odd n blocks");
      run_case(1000, 3 * bn + 8, 520, c, "pair along n, even n blocks");
    }
  for (int bn : mk::kGemmM192Widths)
    for (const auto& c : pair_decompositions(bn, 192, 0)) run_case(1100, 2 * bn + 8, 1096, c, "pair along n, 192 rows");
  for (int bn : mk::kGemmSwapWidths)
    for (const auto& c : pair_decompositions(bn, 128, 1)) run_case(2 * bn + 8, 1096, 1096, c, "pair along n, swapped");
  // Every L2 promotion of the operand maps (GemmConfig::l2_promotion: how much a load's miss
  // fills): a cache hint, so results must not change, with the operands as given, with pairs
  // along n and swapped, on shapes whose m, n and k end inside a tile.
  for (int pr : {0, 64, 128, 256}) {
    mk::GemmConfig c;
    c.l2_promotion = pr;
    run_case(1100, 1000, 1096, c, "l2 promotion, rule");
    c.swap_ab = 0;
    c.block_m = 128;
    c.block_n = 128;
    c.cluster_n = 2;
    run_case(764, 1160, 1048, c, "l2 promotion, pair along n");
    c.cluster_n = 1;
    c.swap_ab = 1;
    c.block_n = 0;
    run_case(40, 1096, 2056, c, "l2 promotion, swapped");
  }
  // 2 x 2 clusters: each CTA multicasts half of its A tile to its n neighbour and half of its
  // weight tile to its m neighbour. Odd and even m and n block counts (a padding CTA along m,
  // along n, or both: its loads are out of bounds, it stores nothing, and it still sends its
  // halves), m and n ending inside a tile, every decomposition, operands as given and swapped,
  // 192-row tiles.
  for (int bn : mk::kGemmQuadWidths) {
    for (const auto& c : quad_decompositions(bn, 128, 0)) {
      run_case(1100, 2 * bn + 8, 1096, c, "2 x 2 clusters, odd m and n blocks");
      run_case(1000, 3 * bn + 8, 520, c, "2 x 2 clusters, even n blocks");
      run_case(200, bn - 8, 776, c, "2 x 2 clusters, one m block, one n block");
    }
    if (mk::gemm_m192_width_built(bn))
      for (const auto& c : quad_decompositions(bn, 192, 0)) run_case(1100, 2 * bn + 8, 1096, c, "2 x 2 clusters, 192 rows");
    for (const auto& c : quad_decompositions(bn, 128, 1)) run_case(2 * bn + 8, 1096, 1096, c, "2 x 2 clusters, swapped");
  }
  {
    // Deterministic split-K and stream-K with pairs along n: bitwise equal over launches.
    mk::GemmConfig c;
    c.swap_ab = 0;
    c.block_m = 128;
    c.block_n = 128;
    c.cluster_n = 2;
    c.deterministic = true;
    c.stream_k = 1;
    c.sk_units = 64;  // 9 x 5 = 45 pair tiles of 18 k blocks: units of 12 or 13, up to 3 parts
    run_bitwise_case(1100, 1280, 1096, c, "deterministic, pairs along n, 64 units");
    c.stream_k = 0;
    c.sk_units = 0;
    c.num_splits = 5;
    run_bitwise_case(300, 1000, 4096, c, "deterministic, pairs along n, 5 splits");
    c.cluster_m = 2;
    run_bitwise_case(300, 1000, 4096, c, "deterministic, 2 x 2 clusters, 5 splits");
    c.cluster_m = 0;
    // Refusals, naming the field and what the call has.
    mk::GemmConfig bad;
    bad.cluster_n = 3;
    expect_refused(bad, mk::kEpilogueStore, {"cluster_n = 3"}, "cluster_n = 3 refused");
    bad.cluster_n = 2;
    expect_refused(bad, mk::kEpilogueAtomicAdd, {"cluster_n = 2", "atomic-add"}, "cluster_n = 2 with atomic add refused");
    bad.cluster_m = 2;
    bad.block_n = 144;
    expect_refused(bad, mk::kEpilogueStore, {"cluster_n = 2", "cluster_m = 2", "block_n = 144"},
                   "2 x 2 clusters at a width they are not built for refused");
    bad.block_n = 0;
    bad.cluster_m = 0;
    bad.cluster_n = 0;
    bad.quads = 2;
    expect_refused(bad, mk::kEpilogueStore, {"quads = 2"}, "quads = 2 refused");
    bad.quads = 0;
    bad.l2_promotion = 96;
    expect_refused(bad, mk::kEpilogueStore, {"l2_promotion = 96"}, "l2_promotion = 96 refused");
    bad.l2_promotion = -1;
    bad.cluster_n = 2;
    bad.block_m = 256;
    expect_refused(bad, mk::kEpilogueStore, {"cluster_n = 2", "block_m = 256"}, "cluster_n = 2 with block_m = 256 refused");
    bad.block_m = 0;
    bad.cluster_k = 2;
    expect_refused(bad, mk::kEpilogueStore, {"cluster_n = 2", "cluster_k = 2"}, "cluster_n = 2 with cluster_k = 2 refused");
  }
  // Split-K inside clusters (GemmConfig::cluster_k: the CTAs of a cluster share each tile's k
  // blocks and sum their partials through distributed shared memory): every width of
  // kGemmSwapClusterKWidths with clusters of 2, 4 and 8, on
  //   - m = 2 widths + 8 (the last tile's width ends inside it), n = 1096 (9 weight blocks, the
  //     last of 72 rows: its second consumer's rows end inside it), k = 1096 (18 k blocks);
  //   - m = width - 3 (odd), n = 264 (the last weight block 8 rows), k = 200 (4 k blocks: with
  //     8 CTAs half of the shares are empty) and k = 8 (one k block, one share);
  //   - 8 GEMM blocks only, so each cluster reduces several tiles in turn (the barriers' phases);
  // then bitwise reproducibility over launches, the rule's own choices on small shapes, a width
  // above 128 refused, and the refusals of what it cannot combine with.
  for (int bn : mk::kGemmSwapClusterKWidths)
    for (int ck : mk::kGemmClusterKSizes) {
      mk::GemmConfig c;
      c.swap_ab = 1;
      c.block_n = bn;
      c.cluster_k = ck;
      run_case(2 * bn + 8, 1096, 1096, c, "cluster_k");
      run_case(bn - 3, 264, 200, c, "cluster_k, shallow k");
      run_case(bn - 3, 264, 8, c, "cluster_k, one k block");
      c.num_gemm_blocks = 8;
      run_case(2 * bn + 8, 1096, 1096, c, "cluster_k, 8 blocks");
    }
  {
    mk::GemmConfig c;
    c.cluster_k = 4;  // swap_ab left to the rule: in-cluster split-K implies swapped operands
    run_bitwise_case(5, 1512, 1224, c, "cluster_k 4, bitwise");
    c.cluster_k = 8;
    c.block_n = 64;
    run_bitwise_case(61, 3000, 6144, c, "cluster_k 8, bitwise");
  }
  for (const auto& sh : std::vector<std::array<int, 3>>{{11, 336, 504}, {36, 504, 888}, {2, 1512, 1224},
                                                        {4, 776, 5872}, {5, 3744, 1240}, {126, 456, 5680}}) {
    run_case(sh[0], sh[1], sh[2], mk::GemmConfig{}, "rule, small m");
  }
  {
    // Refusals: swapped operands need a plain GEMM; a width or height built only swapped needs
    // them. Each names the field (and the value) in its message.
    const auto refused = expect_refused;
    mk::GemmConfig c;
    c.swap_ab = 1;
    refused(c, mk::kEpilogueAtomicAdd, {"swap_ab = 1", "atomic-add"},
            "swap_ab = 1 with the atomic-add epilogue refused, naming both");
    c.swap_ab = 0;
    c.block_n = 16;
    refused(c, mk::kEpilogueStore, {"block_n = 16"}, "block_n = 16 without swapped operands refused");
    c.block_n = 0;
    c.block_m = 64;
    refused(c, mk::kEpilogueStore, {"block_m = 64"}, "block_m = 64 without swapped operands refused");
    c.swap_ab = 1;
    c.block_n = 128;
    refused(c, mk::kEpilogueStore, {"block_n = 128"}, "block_m = 64 with a width over 64 refused");
    mk::GemmConfig k;
    k.cluster_k = 3;
    refused(k, mk::kEpilogueStore, {"cluster_k = 3"}, "cluster_k = 3 refused");
    k.cluster_k = 4;
    k.swap_ab = 0;
    refused(k, mk::kEpilogueStore, {"cluster_k = 4", "swap_ab = 0"}, "cluster_k with swap_ab = 0 refused, naming both");
    k.swap_ab = 1;
    k.block_n = 144;
    refused(k, mk::kEpilogueStore, {"cluster_k = 4", "block_n = 144"}, "cluster_k with a width over 128 refused");
    k.block_n = 0;
    k.swap_ab = -1;
    refused(k, mk::kEpilogueAtomicAdd, {"cluster_k = 4", "atomic-add"}, "cluster_k with the atomic-add epilogue refused");
    k.num_splits = 3;
    refused(k, mk::kEpilogueStore, {"cluster_k = 4", "split-K"}, "cluster_k with split-K refused");
  }
  // A last m block of at most 64 rows (one consumer warpgroup computes, the other follows the
  // stages with a zero fragment): every width with clusters of 1 and 2, data-parallel, 3 splits
  // and stream-K, on m whose last block holds 36 rows (9 m blocks: with clusters of 2 its
  // partner is a padding tile) and 28 rows (10 m blocks: its partner is a whole tile).
  for (int bn : mk::kGemmBlockWidths)
    for (const auto& c : decompositions(bn)) {
      run_case(1060, 1000, 1096, c, "short last block");
      run_case(1180, 1000, 1096, c, "short last block");
    }
  // 256-row tiles (block_m = 256, widths 128 to 192): every width with clusters of 1 and 2,
  // data-parallel, split-K and stream-K (a split tile's fix-up covers both sub-tiles of each
  // consumer), on m that ends inside the first and inside the second 128 rows of the last tile,
  // m below one tile, and the refusals (a width not built tall, the atomic-add epilogue, hooks).
  for (int bn : mk::kGemmTallWidths) {
    for (const auto& c : decompositions(bn, 256)) {
      run_case(1100, 1000, 1096, c, "tall");  // last tile: rows 1024..1099 (first sub-tiles only)
      run_case(1200, 712, 520, c, "tall");    // last tile: rows 1024..1199 (into the second)
    }
    mk::GemmConfig one;
    one.block_m = 256;
    one.block_n = bn;
    run_case(90, 1000, 2000, one, "tall, m < 128");
    run_case(6080, 544, 2048, one, "tall, narrow n");
  }
  {
    mk::GemmConfig tall;
    tall.block_m = 256;
    run_case(5000, 3000, 3000, tall, "tall, rule's width");
    run_case(2058, 920, 11712, tall, "tall, rule's width");
  }
  {
    mk::GemmConfig c;
    c.block_m = 256;
    c.block_n = 256;
    expect_refused(c, mk::kEpilogueStore, {"block_n = 256", "block_m = 256"},
                   "block_m = 256 with block_n = 256 refused, naming both");
    c.block_n = 0;
    expect_refused(c, mk::kEpilogueAtomicAdd, {"atomic-add", "block_m = 256"},
                   "block_m = 256 with the atomic-add epilogue refused");
    c.block_m = 200;
    expect_refused(c, mk::kEpilogueStore, {"block_m = 200"}, "block_m = 200 refused, naming it");
  }
  // 192-row tiles (block_m = 192, three consumer warpgroups, widths 128 to 192): every width with
  // clusters of 1 and 2, data-parallel, split-K and stream-K (the fix-up over 384 consumer
  // threads), on m that ends inside the last tile's first, second and third 64 rows, m below one
  // tile, odd n and k, the rule's width; then the refusals.
  for (int bn : mk::kGemmM192Widths) {
    for (const auto& c : decompositions(bn, 192)) {
      run_case(1000, 1000, 1096, c, "192 rows");  // last tile: rows 960..999 (first slice only)
      run_case(1100, 712, 520, c, "192 rows");    // last tile: rows 960..1099 (into the third)
    }
    mk::GemmConfig one;
    one.block_m = 192;
    one.block_n = bn;
    run_case(150, 1000, 2000, one, "192 rows, m < 192");
    run_case(6083, 552, 2056, one, "192 rows, odd m, narrow n");
  }
  {
    mk::GemmConfig r192;
    r192.block_m = 192;
    run_case(3389, 4208, 4200, r192, "192 rows, rule's width");
    run_case(1282, 1240, 2424, r192, "192 rows, rule's width");
    run_case(2058, 920, 11712, r192, "192 rows, rule's width");
    r192.deterministic = true;
    r192.stream_k = 1;
    r192.block_n = 192;
    r192.sk_units = 100;
    run_bitwise_case(1300, 1000, 3000, r192, "192 rows, deterministic stream-K");
    mk::GemmConfig c;
    c.block_m = 192;
    c.block_n = 256;
    expect_refused(c, mk::kEpilogueStore, {"block_n = 256", "block_m = 192"},
                   "block_m = 192 with block_n = 256 refused, naming both");
    c.block_n = 0;
    expect_refused(c, mk::kEpilogueAtomicAdd, {"atomic-add", "block_m = 192"},
                   "block_m = 192 with the atomic-add epilogue refused");
    c.swap_ab = 1;
    expect_refused(c, mk::kEpilogueStore, {"block_m = 192", "swap_ab = 1"},
                   "block_m = 192 with swap_ab = 1 refused, naming both");
  }
  // Deterministic fix-up: stream-K units shorter than a tile (3+ parts a tile), split-K into
  // 5 and 8, a decode-like m, clusters of 1 and 2; first correct, then bitwise equal over
  // launches; the same schedules without it are timed for their spread only.
  for (bool det : {true, false}) {
    mk::GemmConfig c;
    c.deterministic = det;
    c.swap_ab = 0;  // the tile counts below are those of the operands as given, 128-row tiles
    c.block_m = 128;
    c.cluster_n = 1;  // ... and of pairs along m or single CTAs
    c.stream_k = 1;
    c.sk_units = 120;  // 45 tiles of 18 k blocks: units of 6 or 7 k blocks, 3 or 4 parts a tile
    c.cluster_m = 1;
    run_bitwise_case(1100, 1280, 1096, c, det ? "deterministic, 120 units" : "atomic, 120 units");
    c.cluster_m = 2;
    c.block_n = 128;  // 50 cluster tiles of 18 k blocks: 64 units of 14, up to 3 parts a tile
    c.sk_units = 64;
    run_bitwise_case(1100, 1280, 1096, c, det ? "deterministic, 64 units c2" : "atomic, 64 units c2");
    mk::GemmConfig sk;
    sk.deterministic = det;
    sk.num_splits = 5;
    run_bitwise_case(300, 1000, 4096, sk, det ? "deterministic, 5 splits" : "atomic, 5 splits");
    sk.num_splits = 8;
    run_bitwise_case(5, 2048, 8192, sk, det ? "deterministic, m=5, 8 splits" : "atomic, m=5, 8 splits");
    mk::GemmConfig ts;  // swapped operands: the same fix-up on the transposed tiles
    ts.deterministic = det;
    ts.swap_ab = 1;
    ts.num_splits = 6;
    run_bitwise_case(40, 3000, 6144, ts, det ? "deterministic, swapped, 6 splits" : "atomic, swapped, 6 splits");
    mk::GemmConfig tall;
    tall.deterministic = det;
    tall.block_m = 256;
    tall.stream_k = 1;
    tall.block_n = 128;  // 30 tiles of 40 k blocks: 64 units of 18 or 19, up to 4 parts a tile
    tall.cluster_m = 1;
    tall.sk_units = 64;
    run_bitwise_case(1200, 712, 2520, tall, det ? "deterministic, 256 rows" : "atomic, 256 rows");
  }
  {
    // The rule with the deterministic fix-up on the random family's kind of shapes (correctness
    // and workspace sizing through gemm_workspace_bytes; any schedule it picks).
    mk::GemmConfig c;
    c.deterministic = true;
    run_case(77, 4096, 3000, c, "deterministic rule");
    run_case(2058, 920, 11712, c, "deterministic rule");
    run_case(137, 9440, 2056, c, "deterministic rule");
  }
  run_case(5000, 280, 3000, def, "narrow n");
  run_case(2289, 320, 3672, def, "narrow n");
  run_case(3000, 536, 2376, def, "narrow n");
  {
    // A width no translation unit builds is refused, naming the field and the widths there are.
    Buffers b(64, 64, 64);
    mk::GemmConfig c;
    c.block_n = 100;
    mk::GemmArgs args = make_args(b, 64, 64, 64, c);
    mk::GemmPlan plan;
    const mk::GemmResult r = mk::gemm_plan(args, &plan);
    check(r.code == mk::GemmError::kInvalidConfig && r.message.find("block_n = 100") != std::string::npos &&
              r.message.find("144") != std::string::npos,
          "block_n = 100 refused with a message naming it and the built widths (got: " + r.message + ")");
  }
  // Stream-K edges: one k block per tile (units are whole tiles), units that split one tile
  // many ways (decode-like m), a tail of a few tiles after full waves, many waves.
  {
    mk::GemmConfig sk;
    sk.stream_k = 1;
    run_case(300, 2048, 64, sk, "stream-K, 1 k block");
    run_case(5, 520, 4104, sk, "stream-K, m=5");
    run_case(77, 4096, 3000, sk, "stream-K, m=77");
    sk.sk_units = 13;
    run_case(1000, 776, 2000, sk, "stream-K, 13 units");
    mk::GemmConfig tail;
    tail.stream_k = 1;
    tail.block_n = 128;
    tail.cluster_m = 1;
    run_case(137, 9440, 2056, tail, "stream-K, 148 tiles");
    run_case(4096, 8320, 1024, mk::GemmConfig{}, "waves + tail");
  }
  // Split last waves: whole tiles in waves, then the last tiles split (num_splits with dp_tiles, and
  // the rule's own choice). Clusters of 1 and 2, a swapped problem, and both fix-ups: the
  // deterministic one bitwise equal over launches.
  {
    mk::GemmConfig st;
    st.swap_ab = 0;
    st.block_m = 128;  // the tile counts below are those of 128-row tiles
    st.cluster_n = 1;  // ... not in pairs along n
    st.block_n = 224;
    st.cluster_m = 2;
    st.num_splits = 3;
    st.dp_tiles = 198;  // 14 x 19 = 266 cluster tiles: 3 waves of 66 whole, 68 tiles split 3 ways
    run_case(3389, 4208, 1000, st, "split last wave, c2, 3 splits");
    st.cluster_m = 1;
    st.block_n = 128;
    st.num_splits = 5;
    st.dp_tiles = 132;  // 8 x 20 = 160 tiles: one wave whole, 28 tiles split 5 ways
    run_case(1000, 2560, 1480, st, "split last wave, c1, 5 splits");
    st.deterministic = true;
    run_bitwise_case(1000, 2560, 1480, st, "split last wave, deterministic, c1, 5 splits");
    mk::GemmConfig ts;  // swapped: 3000 weight rows in 24 tiles of 128, 16 whole, 8 split 4 ways
    ts.swap_ab = 1;
    ts.block_n = 48;
    ts.cluster_m = 1;
    ts.num_splits = 4;
    ts.dp_tiles = 16;
    ts.num_gemm_blocks = 16;
    run_case(40, 3000, 6144, ts, "split last wave, swapped");
    // The rule, on shapes where it takes a split last wave (gemm_model_eval --choose).
    run_case(7658, 608, 5776, def, "rule (split last wave)");
    run_case(585, 9168, 4024, def, "rule");
    mk::GemmConfig weigh_quads;  // the rule weighing 2 x 2 clusters (it takes them here)
    weigh_quads.quads = -1;
    run_case(764, 2296, 4120, weigh_quads, "rule, 2 x 2 clusters weighed");
    run_case(1061, 1776, 3400, weigh_quads, "rule, 2 x 2 clusters weighed");
  }
  // The random family (issue 13), smaller: fresh shapes every run from the test's seed, the same
  // distribution as gemm_bench --random without the shapes whose fp32 reference would take
  // long (m * n * k > 2^38 or m * n > 2^25).
  {
    const auto family = gemm_test::random_family_capped(g_seed, 24, 0x1p38, 0x1p25);
    std::printf("random family: seed %llu, %zu shapes\n", static_cast<unsigned long long>(g_seed), family.size());
    for (const auto& sh : family) run_case(sh.m, sh.n, sh.k, def, "random");
    // The same shapes held to pairs along n (the rest the rule's choice).
    mk::GemmConfig pairs;
    pairs.cluster_n = 2;
    for (size_t i = 0; i < family.size(); i += 2) run_case(family[i].m, family[i].n, family[i].k, pairs, "random, pairs along n");
    // ... and in 2 x 2 clusters.
    mk::GemmConfig quads = pairs;
    quads.cluster_m = 2;
    for (size_t i = 1; i < family.size(); i += 2) run_case(family[i].m, family[i].n, family[i].k, quads, "random, 2 x 2 clusters");
  }
  // Fewer blocks than SMs (SMs withheld) and a single block.
  for (int blocks : {116, 2}) {
    mk::GemmConfig c;
    c.num_gemm_blocks = blocks;
    run_case(2000, 3072, 2048, c, blocks == 2 ? "2 blocks" : "116 blocks");
  }

  run_atomic_case(1000, 4096, 2048, 256, 2);
  run_atomic_case(300, 2048, 1024, 128, 1);
  run_atomic_case(700, 1536, 3000, 256, 2, 1);  // stream-K: the last participant adds the sum
  run_flag_cases();
  run_role_case();
  run_shard_case();

  GT_CUBLAS(cublasDestroy(g_cublas));
  if (g_failures) {
    std::printf("gemm_gpu_test: %d FAILED\n", g_failures);
    return 1;
  }
  std::printf("gemm_gpu_test: all passed\n");
  return 0;
}
