// grouped_gemm_gpu_test.cu: correctness of the grouped bf16 GEMM (kernels/gemm/
// sm90_bf16_grouped_gemm.h) on one Hopper GPU.
//
// Every case draws fresh random inputs (the seed is printed; MKERNEL_TEST_SEED replays one),
// poisons the output with NaN, and compares every group's rows with an fp32 reference and with
// one cuBLAS GEMM per group (relative Frobenius error per group). Rows outside the groups
// (past offsets[G], before offsets[0]) must stay poisoned. Cases: random counts (uniform and
// Zipf), empty groups, one group holding nearly all rows, counts that are not multiples of 128,
// n and k multiples of 8 but not of 64, G = 1 and G = 1024, every tile width and cluster size;
// the readiness hook with a second stream raising group flags late (rows copied in just before
// each flag), flags that never come (bounded wait, status names the group); per-tile flags; a
// role that owns the epilogue of grouped tiles (it must learn the group and the rows);
// offsets the device must reject; a CUDA graph replayed with counts changed between replays;
// bit-identical repeats; argument errors. Exit 0 = pass, 1 = failure, 77 = no Hopper GPU.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gemm/gemm_test_util.cuh"
#include "gemm/sm90_bf16_grouped_gemm.h"
#include "gemm/sm90_bf16_grouped_gemm_instance.cuh"
#include "mkernel/protocol/sync.cuh"

namespace mk = mkernel::kernels;
using namespace gemm_test;

namespace {

constexpr double kTolerance = 5e-3;  // as the dense test: bf16 output rounding alone ~1.5e-3
int g_failures = 0;
uint64_t g_seed = 0;
cublasHandle_t g_cublas = nullptr;

void check(bool ok, const std::string& what) {
  if (!ok) {
    ++g_failures;
    std::printf("FAIL  %s\n", what.c_str());
  }
}

std::vector<uint32_t> offsets_from_counts(const std::vector<uint32_t>& counts, uint32_t first = 0) {
  std::vector<uint32_t> off(counts.size() + 1, first);
  for (size_t g = 0; g < counts.size(); ++g) off[g + 1] = off[g] + counts[g];
  return off;
}

// Rows routed to groups with weight 1 / (g + 1)^zipf (0: uniform), like the MoE baseline.
std::vector<uint32_t> routed_counts(std::mt19937_64& rng, uint32_t groups, uint32_t rows, double zipf) {
  std::vector<double> w(groups);
  for (uint32_t g = 0; g < groups; ++g) w[g] = 1.0 / std::pow(g + 1.0, zipf);
  std::discrete_distribution<uint32_t> pick(w.begin(), w.end());
  std::vector<uint32_t> counts(groups, 0);
  for (uint32_t r = 0; r < rows; ++r) ++counts[pick(rng)];
  return counts;
}

struct Problem {
  int64_t capacity = 0, groups = 0, n = 0, k = 0;
  __nv_bfloat16 *a = nullptr, *w = nullptr, *d = nullptr, *dc = nullptr;
  float* ref = nullptr;
  uint32_t* offsets = nullptr;
  mk::DeviceStatus* status = nullptr;
  std::vector<uint32_t> host_offsets;

  Problem(int64_t cap, int64_t g, int64_t n_, int64_t k_) : capacity(cap), groups(g), n(n_), k(k_) {
    GT_CUDA(cudaMalloc(&a, sizeof(__nv_bfloat16) * cap * k));
    GT_CUDA(cudaMalloc(&w, sizeof(__nv_bfloat16) * g * n * k));
    GT_CUDA(cudaMalloc(&d, sizeof(__nv_bfloat16) * cap * n));
    GT_CUDA(cudaMalloc(&dc, sizeof(__nv_bfloat16) * cap * n));
    GT_CUDA(cudaMalloc(&ref, sizeof(float) * cap * n));
    GT_CUDA(cudaMalloc(&offsets, sizeof(uint32_t) * (g + 1)));
    GT_CUDA(cudaMalloc(&status, sizeof(mk::DeviceStatus)));
    GT_CUDA(cudaMemset(status, 0, sizeof(mk::DeviceStatus)));
  }
  ~Problem() {
    cudaFree(a);
    cudaFree(w);
    cudaFree(d);
    cudaFree(dc);
    cudaFree(ref);
    cudaFree(offsets);
    cudaFree(status);
  }
  void fill(uint64_t seed) {
    fill_random(a, static_cast<size_t>(capacity) * k, seed);  // all rows: rows past the groups too
    fill_random(w, static_cast<size_t>(groups) * n * k, seed + 1);
  }
  void set_offsets(const std::vector<uint32_t>& off, cudaStream_t s = nullptr) {
    host_offsets = off;
    GT_CUDA(cudaMemcpyAsync(offsets, host_offsets.data(), sizeof(uint32_t) * off.size(), cudaMemcpyHostToDevice, s));
    GT_CUDA(cudaStreamSynchronize(s));
  }
  // fp32 reference and one cuBLAS call per non-empty group.
  void references() {
    poison(dc, static_cast<size_t>(capacity) * n);
    for (int64_t g = 0; g < groups; ++g) {
      const uint32_t lo = host_offsets[g], rows = host_offsets[g + 1] - lo;
      if (rows == 0) continue;
      const __nv_bfloat16* ag = a + static_cast<size_t>(lo) * k;
      const __nv_bfloat16* wg = w + static_cast<size_t>(g) * n * k;
      reference_gemm(ag, wg, ref + static_cast<size_t>(lo) * n, static_cast<int>(rows), static_cast<int>(n),
                     static_cast<int>(k));
      cublas_gemm(g_cublas, ag, wg, dc + static_cast<size_t>(lo) * n, static_cast<int>(rows), static_cast<int>(n),
                  static_cast<int>(k));
    }
    GT_CUDA(cudaDeviceSynchronize());
  }
  mk::GroupedGemmArgs args(const mk::GroupedGemmConfig& cfg = {}) const {
    mk::GroupedGemmArgs x;
    x.a = a;
    x.w = w;
    x.d = d;
    x.offsets = offsets;
    x.capacity = capacity;
    x.num_groups = groups;
    x.n = n;
    x.k = k;
    x.config = cfg;
    x.wait.status = status;
    return x;
  }
  mk::DeviceStatus take_status() const {
    mk::DeviceStatus s{};
    GT_CUDA(cudaMemcpy(&s, status, sizeof(s), cudaMemcpyDeviceToHost));
    GT_CUDA(cudaMemset(status, 0, sizeof(s)));
    return s;
  }
  std::vector<uint16_t> output_bits() const {
    std::vector<uint16_t> h(static_cast<size_t>(capacity) * n);
    GT_CUDA(cudaMemcpy(h.data(), d, h.size() * 2, cudaMemcpyDeviceToHost));
    return h;
  }
};

struct Verdict {
  bool ok = true;
  double worst_ref = 0, worst_cublas = 0;
  std::string why;
};

// Every group's rows against the fp32 reference and cuBLAS; rows outside the groups poisoned.
Verdict verify(const Problem& p) {
  Verdict v;
  const size_t count = static_cast<size_t>(p.capacity) * p.n;
  const auto out = to_host_float(p.d, count);
  const auto ref = to_host(p.ref, count);
  const auto cub = to_host_float(p.dc, count);
  const auto bits = p.output_bits();
  for (int64_t g = 0; g < p.groups; ++g) {
    const size_t lo = static_cast<size_t>(p.host_offsets[g]) * p.n,
                 hi = static_cast<size_t>(p.host_offsets[g + 1]) * p.n;
    if (lo == hi) continue;
    const std::vector<float> o(out.begin() + lo, out.begin() + hi), r(ref.begin() + lo, ref.begin() + hi),
        c(cub.begin() + lo, cub.begin() + hi);
    const ErrorStats er = compare(o, r), ec = compare(o, c);
    v.worst_ref = std::max(v.worst_ref, er.rel_fro);
    v.worst_cublas = std::max(v.worst_cublas, ec.rel_fro);
    if (er.non_finite != 0 || er.rel_fro >= kTolerance || ec.rel_fro >= kTolerance) {
      if (v.ok) {
        v.why = "group " + std::to_string(g) + " (" + std::to_string(p.host_offsets[g + 1] - p.host_offsets[g]) +
                " rows): rel err vs fp32 " + std::to_string(er.rel_fro) + ", vs cuBLAS " + std::to_string(ec.rel_fro) +
                ", non-finite " + std::to_string(er.non_finite);
        if (er.non_finite) v.why += " (first at group row " + std::to_string(er.first_bad / p.n) + ")";
      }
      v.ok = false;
    }
  }
  // Rows that belong to no group were never written.
  const size_t first = static_cast<size_t>(p.host_offsets.front()) * p.n;
  const size_t last = static_cast<size_t>(p.host_offsets.back()) * p.n;
  size_t written = 0;
  for (size_t i = 0; i < first; ++i) written += bits[i] != 0xFFFF;
  for (size_t i = last; i < count; ++i) written += bits[i] != 0xFFFF;
  if (written != 0) {
    if (v.ok) v.why = std::to_string(written) + " elements outside every group were written";
    v.ok = false;
  }
  return v;
}

std::string describe(const std::vector<uint32_t>& off) {
  const size_t g = off.size() - 1;
  uint32_t mx = 0, empty = 0;
  for (size_t i = 0; i < g; ++i) {
    mx = std::max(mx, off[i + 1] - off[i]);
    empty += off[i + 1] == off[i];
  }
  return "G=" + std::to_string(g) + " rows=" + std::to_string(off.back() - off.front()) + " max=" + std::to_string(mx) +
         " empty=" + std::to_string(empty);
}

// Fresh inputs, poisoned output, launch twice (bit-identical), compare per group.
void run_case(const char* label, const std::vector<uint32_t>& off, int64_t capacity, int64_t n, int64_t k,
              const mk::GroupedGemmConfig& cfg = {}) {
  static uint64_t counter = 0;
  const int64_t groups = static_cast<int64_t>(off.size()) - 1;
  Problem p(capacity, groups, n, k);
  p.fill(g_seed + 1000 * (++counter));
  p.set_offsets(off);
  p.references();
  mk::GroupedGemmPlan plan;
  mk::GemmResult r = mk::grouped_gemm_plan(p.args(cfg), &plan);
  const std::string name =
      std::string(label) + " " + describe(off) + " n=" + std::to_string(n) + " k=" + std::to_string(k);
  if (!r.ok()) {
    check(false, name + ": plan failed: " + r.message);
    return;
  }
  std::printf("..    %s [%s]\n", name.c_str(), mk::grouped_gemm_config_string(plan).c_str());
  std::vector<uint16_t> first;
  for (int rep = 0; rep < 2; ++rep) {
    poison(p.d, static_cast<size_t>(capacity) * n);
    r = mk::grouped_gemm_launch(plan, nullptr);
    if (!r.ok()) {
      check(false, name + ": launch failed: " + r.message);
      return;
    }
    GT_CUDA(cudaGetLastError());
    GT_CUDA(cudaDeviceSynchronize());
    const mk::DeviceStatus st = p.take_status();
    check(st.code == mk::kDeviceOk, name + ": status " + mk::describe_device_status(st, 0));
    const Verdict v = verify(p);
    const auto bits = p.output_bits();
    bool same = true;
    if (rep == 0) {
      first = bits;
    } else {
      same = bits == first;
    }
    const bool ok = v.ok && same;
    if (!ok || rep == 1) {
      std::printf("%s  %-60s [%s] rep %d: worst group rel err vs fp32 %.2e, vs cuBLAS %.2e%s%s%s\n",
                  ok ? "ok  " : "FAIL", name.c_str(), mk::grouped_gemm_config_string(plan).c_str(), rep, v.worst_ref,
                  v.worst_cublas, same ? ", repeat bit-identical" : ", REPEAT DIFFERS", v.ok ? "" : ": ",
                  v.why.c_str());
    }
    if (!ok) ++g_failures;
  }
}

// ---- readiness: a second stream writes each group's rows and then raises its flag ----------

__global__ void deliver_rows_kernel(const __nv_bfloat16* staged, __nv_bfloat16* a, const uint32_t* offsets,
                                    uint32_t groups, int64_t k, uint64_t* flags, uint64_t value, uint64_t delay_ns) {
  // Groups in reverse order, one after another, with a pause before each: the GEMM's tiles of a
  // group can only be right if they waited for its flag.
  for (int64_t gi = static_cast<int64_t>(groups) - 1; gi >= 0; --gi) {
    const uint32_t g = static_cast<uint32_t>(gi);
    if (threadIdx.x == 0) {
      const uint64_t t0 = mkernel::sync::globaltimer_ns();
      while (mkernel::sync::globaltimer_ns() - t0 < delay_ns) __nanosleep(1000);
    }
    __syncthreads();
    const size_t lo = static_cast<size_t>(offsets[g]) * k, hi = static_cast<size_t>(offsets[g + 1]) * k;
    for (size_t i = lo + threadIdx.x; i < hi; i += blockDim.x) a[i] = staged[i];
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence_system();
      mkernel::sync::st_release_sys(flags + g, value);
    }
  }
}

void run_readiness_cases() {
  std::mt19937_64 rng(g_seed + 17);
  const int64_t groups = 24, n = 1024, k = 520, capacity = 3000;
  auto counts = routed_counts(rng, groups, 2800, 1.1);
  counts[3] = 0;
  const auto off = offsets_from_counts(counts);
  Problem p(capacity, groups, n, k);
  p.fill(g_seed + 31);
  p.set_offsets(off);
  p.references();  // from the real rows
  __nv_bfloat16* staged = nullptr;
  uint64_t *group_ready = nullptr, *band_ready = nullptr;
  GT_CUDA(cudaMalloc(&staged, sizeof(__nv_bfloat16) * capacity * k));
  GT_CUDA(cudaMemcpy(staged, p.a, sizeof(__nv_bfloat16) * capacity * k, cudaMemcpyDeviceToDevice));
  GT_CUDA(cudaMalloc(&group_ready, sizeof(uint64_t) * groups));
  const uint32_t band = 100;
  const int64_t bands = (capacity + band - 1) / band;
  GT_CUDA(cudaMalloc(&band_ready, sizeof(uint64_t) * bands));
  cudaStream_t s_gemm, s_data;
  GT_CUDA(cudaStreamCreateWithFlags(&s_gemm, cudaStreamNonBlocking));
  GT_CUDA(cudaStreamCreateWithFlags(&s_data, cudaStreamNonBlocking));

  for (int cluster : {1, 2}) {
    // A poisoned until the rows are delivered; group flags 0 until then (value 5 expected);
    // the row bands are all raised already (the two hooks combine).
    poison(p.a, static_cast<size_t>(capacity) * k);
    poison(p.d, static_cast<size_t>(capacity) * n);
    GT_CUDA(cudaMemset(group_ready, 0, sizeof(uint64_t) * groups));
    std::vector<uint64_t> h_band(bands, 5);
    GT_CUDA(cudaMemcpy(band_ready, h_band.data(), sizeof(uint64_t) * bands, cudaMemcpyHostToDevice));
    GT_CUDA(cudaDeviceSynchronize());
    mk::GroupedGemmConfig cfg;
    cfg.cluster_m = cluster;
    // Leave SMs free so the delivering kernel runs beside the persistent GEMM whatever the order
    // in which the two streams' blocks become resident.
    cfg.num_gemm_blocks = 112;
    mk::GroupedGemmArgs args = p.args(cfg);
    args.hooks.group_ready = group_ready;
    args.hooks.ready_flags = band_ready;
    args.hooks.ready_rows_per_flag = band;
    args.hooks.ready_value = 5;
    mk::GroupedGemmPlan plan;
    mk::GemmResult r = mk::grouped_gemm_plan(args, &plan);
    check(r.ok(), "readiness plan: " + r.message);
    if (!r.ok()) continue;
    deliver_rows_kernel<<<1, 256, 0, s_data>>>(staged, p.a, p.offsets, static_cast<uint32_t>(groups), k, group_ready, 5,
                                               200'000);
    GT_CUDA(cudaGetLastError());
    const auto t0 = std::chrono::steady_clock::now();
    r = mk::grouped_gemm_launch(plan, s_gemm);
    check(r.ok(), "readiness launch: " + r.message);
    GT_CUDA(cudaStreamSynchronize(s_gemm));
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    GT_CUDA(cudaStreamSynchronize(s_data));
    const mk::DeviceStatus st = p.take_status();
    const Verdict v = verify(p);
    const bool ok = st.code == mk::kDeviceOk && v.ok;
    std::printf(
        "%s  readiness c%d: %s, rows delivered group by group from a second stream (0.2 ms apart, last group "
        "first), GEMM done after %.1f ms, worst rel err %.2e, status '%s'%s%s\n",
        ok ? "ok  " : "FAIL", cluster, describe(off).c_str(), ms, v.worst_ref,
        mk::describe_device_status(st, 0).c_str(), v.ok ? "" : ": ", v.why.c_str());
    if (!ok) ++g_failures;
  }

  // A group flag that never comes: the launch ends with kDeviceWaitTimeout at kStepGroupReady
  // naming the group, instead of hanging.
  {
    std::vector<uint64_t> h_ready(groups, 5);
    const uint32_t missing = 7;
    h_ready[missing] = 4;
    GT_CUDA(cudaMemcpy(group_ready, h_ready.data(), sizeof(uint64_t) * groups, cudaMemcpyHostToDevice));
    mk::GroupedGemmArgs args = p.args();
    args.hooks.group_ready = group_ready;
    args.hooks.ready_value = 5;
    args.wait.timeout_ns = 20'000'000;
    const auto t0 = std::chrono::steady_clock::now();
    mk::GemmResult r = mk::grouped_gemm_bf16_tn(args, nullptr);
    check(r.ok(), "group timeout launch: " + r.message);
    GT_CUDA(cudaDeviceSynchronize());
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const mk::DeviceStatus st = p.take_status();
    const uint32_t step = static_cast<uint32_t>(st.where >> 56);
    const uint64_t index = st.where & ((uint64_t{1} << 56) - 1);
    const bool ok = st.code == mk::kDeviceWaitTimeout && step == mk::kStepGroupReady && index == missing &&
                    st.detail == missing && ms < 5000;
    std::printf("%s  group flag never raised: status '%s' after %.1f ms\n", ok ? "ok  " : "FAIL",
                mk::describe_device_status(st, 20'000'000).c_str(), ms);
    if (!ok) ++g_failures;
  }
  // A row band that never comes: kDeviceWaitTimeout at kStepGemmReady, naming the band's flag.
  {
    std::vector<uint64_t> h_band(bands, 5);
    const uint32_t missing = 11;  // rows 1100..1199
    h_band[missing] = 0;
    GT_CUDA(cudaMemcpy(band_ready, h_band.data(), sizeof(uint64_t) * bands, cudaMemcpyHostToDevice));
    mk::GroupedGemmArgs args = p.args();
    args.hooks.ready_flags = band_ready;
    args.hooks.ready_rows_per_flag = band;
    args.hooks.ready_value = 5;
    args.wait.timeout_ns = 20'000'000;
    mk::GemmResult r = mk::grouped_gemm_bf16_tn(args, nullptr);
    check(r.ok(), "band timeout launch: " + r.message);
    GT_CUDA(cudaDeviceSynchronize());
    const mk::DeviceStatus st = p.take_status();
    const uint32_t step = static_cast<uint32_t>(st.where >> 56);
    const bool ok = st.code == mk::kDeviceWaitTimeout && step == mk::kStepGemmReady && st.detail == missing;
    std::printf("%s  row band never raised: status '%s'\n", ok ? "ok  " : "FAIL",
                mk::describe_device_status(st, 20'000'000).c_str());
    if (!ok) ++g_failures;
  }
  GT_CUDA(cudaStreamDestroy(s_gemm));
  GT_CUDA(cudaStreamDestroy(s_data));
  GT_CUDA(cudaFree(staged));
  GT_CUDA(cudaFree(group_ready));
  GT_CUDA(cudaFree(band_ready));
}

// ---- per-tile flags ----------------------------------------------------------------------------

void run_tile_flag_case() {
  std::mt19937_64 rng(g_seed + 23);
  const int64_t groups = 16, n = 776, k = 256, capacity = 2500;
  auto counts = routed_counts(rng, groups, 2300, 0.0);
  counts[0] = 0;
  counts[9] = 0;
  const auto off = offsets_from_counts(counts);
  for (int cluster : {1, 2}) {
    Problem p(capacity, groups, n, k);
    p.fill(g_seed + 41 + cluster);
    p.set_offsets(off);
    p.references();
    poison(p.d, static_cast<size_t>(capacity) * n);
    mk::GroupedGemmConfig cfg;
    cfg.cluster_m = cluster;
    cfg.block_n = 128;
    mk::GroupedGemmArgs args = p.args(cfg);
    const uint64_t num_flags = mk::grouped_gemm_num_tile_flags(args);
    const uint64_t num_mblocks = mk::grouped_gemm_num_mblock_flags(args);
    uint64_t *flags = nullptr, *mflags = nullptr;
    unsigned long long* mcounts = nullptr;
    GT_CUDA(cudaMalloc(&flags, sizeof(uint64_t) * num_flags));
    GT_CUDA(cudaMemset(flags, 0, sizeof(uint64_t) * num_flags));
    GT_CUDA(cudaMalloc(&mflags, sizeof(uint64_t) * num_mblocks));
    GT_CUDA(cudaMemset(mflags, 0, sizeof(uint64_t) * num_mblocks));
    // The m block counts as an aborted launch (value 5) would have left them: 3 tiles counted.
    std::vector<unsigned long long> stale(num_mblocks, (5ull << 32) | 3ull);
    GT_CUDA(cudaMalloc(&mcounts, sizeof(unsigned long long) * num_mblocks));
    GT_CUDA(cudaMemcpy(mcounts, stale.data(), sizeof(unsigned long long) * num_mblocks, cudaMemcpyHostToDevice));
    args.hooks.tile_flags = flags;
    args.hooks.mblock_flags = mflags;
    args.hooks.mblock_counts = mcounts;
    uint64_t m_blocks = 0;
    for (auto c : counts) m_blocks += (c + 127) / 128;
    const uint64_t nb = (n + 127) / 128;
    // Two launches (values 77, then 78 over the first's counts): every flag of a flat m block
    // below the total raised to the launch's value, none after; the m block flags likewise.
    for (uint64_t value : {77ull, 78ull}) {
      args.hooks.tile_flag_value = value;
      mk::GemmResult r = mk::grouped_gemm_bf16_tn(args, nullptr);
      check(r.ok(), "tile flag launch: " + r.message);
      GT_CUDA(cudaDeviceSynchronize());
      std::vector<uint64_t> h(num_flags), hm(num_mblocks);
      GT_CUDA(cudaMemcpy(h.data(), flags, sizeof(uint64_t) * num_flags, cudaMemcpyDeviceToHost));
      GT_CUDA(cudaMemcpy(hm.data(), mflags, sizeof(uint64_t) * num_mblocks, cudaMemcpyDeviceToHost));
      uint64_t raised = 0, wrong = 0, m_raised = 0, m_wrong = 0;
      for (uint64_t i = 0; i < num_flags; ++i) {
        if (h[i] == value) ++raised;
        if ((i < m_blocks * nb) != (h[i] == value)) ++wrong;
      }
      for (uint64_t i = 0; i < num_mblocks; ++i) {
        if (hm[i] == value) ++m_raised;
        if ((i < m_blocks) != (hm[i] == value)) ++m_wrong;
      }
      const Verdict v = verify(p);
      const bool ok = p.take_status().code == mk::kDeviceOk && wrong == 0 && raised == m_blocks * nb && m_wrong == 0 &&
                      m_raised == m_blocks && v.ok;
      std::printf("%s  tile flags c%d value %llu: %llu of %llu raised (%llu expected), m block flags %llu of %llu "
                  "(%llu expected), rel err %.2e%s%s\n",
                  ok ? "ok  " : "FAIL", cluster, static_cast<unsigned long long>(value),
                  static_cast<unsigned long long>(raised), static_cast<unsigned long long>(num_flags),
                  static_cast<unsigned long long>(m_blocks * nb), static_cast<unsigned long long>(m_raised),
                  static_cast<unsigned long long>(num_mblocks), static_cast<unsigned long long>(m_blocks), v.worst_ref,
                  v.ok ? "" : ": ", v.why.c_str());
      if (!ok) ++g_failures;
    }
    // m block flags without counts (or without tile flags) are refused before any launch.
    mk::GroupedGemmArgs bad = args;
    bad.hooks.mblock_counts = nullptr;
    mk::GroupedGemmPlan bad_plan;
    const mk::GemmResult br = mk::grouped_gemm_plan(bad, &bad_plan);
    const bool refused = !br.ok() && br.message.find("hooks.mblock_counts") != std::string::npos;
    std::printf("%s  m block flags without counts refused: %s\n", refused ? "ok  " : "FAIL", br.message.c_str());
    if (!refused) ++g_failures;
    GT_CUDA(cudaFree(flags));
    GT_CUDA(cudaFree(mflags));
    GT_CUDA(cudaFree(mcounts));
  }
}

// ---- offsets the device rejects ------------------------------------------------------------

void run_bad_offsets_case() {
  const int64_t groups = 6, n = 256, k = 128, capacity = 1000;
  Problem p(capacity, groups, n, k);
  p.fill(g_seed + 51);
  struct Bad {
    std::vector<uint32_t> off;
    uint32_t group;
    const char* what;
  } cases[] = {{{0, 300, 600, 900, 1001, 1001, 1001}, 3, "offsets[G] past the capacity"},
               {{0, 300, 200, 400, 500, 600, 700}, 1, "decreasing offsets"}};
  for (const auto& c : cases) {
    p.set_offsets(c.off);
    poison(p.d, static_cast<size_t>(capacity) * n);
    mk::GemmResult r = mk::grouped_gemm_bf16_tn(p.args(), nullptr);
    check(r.ok(), std::string("bad offsets launch: ") + r.message);
    GT_CUDA(cudaDeviceSynchronize());
    const mk::DeviceStatus st = p.take_status();
    const auto bits = p.output_bits();
    size_t written = 0;
    for (uint16_t b : bits) written += b != 0xFFFF;
    const bool ok = st.code == mk::kDeviceBadArgument && st.detail == mk::kArgGroupOffsets &&
                    static_cast<uint32_t>(st.where >> 56) == mk::kStepGroupOffsets &&
                    (st.where & 0xFFFFFFFFu) == c.group && written == 0;
    std::printf("%s  %s: status '%s', %zu elements written\n", ok ? "ok  " : "FAIL", c.what,
                mk::describe_device_status(st, 0).c_str(), written);
    if (!ok) ++g_failures;
    const mk::GemmResult hc = mk::grouped_gemm_check_offsets(c.off.data(), groups, capacity);
    check(!hc.ok() && hc.code == mk::GemmError::kInvalidGroups, std::string("host check of ") + c.what);
  }
}

// ---- a CUDA graph replayed with counts changed between replays -------------------------------

void run_graph_case() {
  std::mt19937_64 rng(g_seed + 61);
  const int64_t groups = 32, n = 2048, k = 1024, capacity = 6000;
  Problem p(capacity, groups, n, k);
  p.fill(g_seed + 62);
  p.set_offsets(std::vector<uint32_t>(groups + 1, 0));
  cudaStream_t s;
  GT_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  mk::GroupedGemmPlan plan;
  mk::GemmResult r = mk::grouped_gemm_plan(p.args(), &plan);
  check(r.ok(), "graph plan: " + r.message);
  if (!r.ok()) return;
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  GT_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  r = mk::grouped_gemm_launch(plan, s);
  GT_CUDA(cudaStreamEndCapture(s, &graph));
  check(r.ok(), "graph capture: " + r.message);
  GT_CUDA(cudaGraphInstantiate(&exec, graph, 0));

  std::vector<std::vector<uint32_t>> runs;
  runs.push_back(routed_counts(rng, groups, 5000, 0.0));
  runs.push_back(routed_counts(rng, groups, 5900, 1.1));
  {
    std::vector<uint32_t> one(groups, 0);
    one[groups - 1] = 5999;
    runs.push_back(one);
  }
  runs.push_back(std::vector<uint32_t>(groups, 0));  // nothing routed at all
  runs.push_back(routed_counts(rng, groups, 137, 0.0));
  runs.push_back(runs[0]);  // the first counts again: the same bits as the first replay
  std::vector<uint16_t> first_bits;
  for (size_t i = 0; i < runs.size(); ++i) {
    const auto off = offsets_from_counts(runs[i]);
    p.set_offsets(off, s);  // as an earlier kernel would write them: the graph is unchanged
    p.references();
    poison(p.d, static_cast<size_t>(capacity) * n, s);
    GT_CUDA(cudaGraphLaunch(exec, s));
    GT_CUDA(cudaStreamSynchronize(s));
    const mk::DeviceStatus st = p.take_status();
    const Verdict v = verify(p);
    bool same = true;
    if (i == 0) first_bits = p.output_bits();
    if (i + 1 == runs.size()) same = p.output_bits() == first_bits;
    const bool ok = st.code == mk::kDeviceOk && v.ok && same;
    std::printf("%s  graph replay %zu: %s, worst rel err %.2e%s%s%s\n", ok ? "ok  " : "FAIL", i, describe(off).c_str(),
                v.worst_ref,
                i + 1 == runs.size() ? (same ? ", same bits as replay 0" : ", BITS DIFFER FROM REPLAY 0") : "",
                v.ok ? "" : ": ", v.why.c_str());
    if (!ok) ++g_failures;
  }
  GT_CUDA(cudaGraphExecDestroy(exec));
  GT_CUDA(cudaGraphDestroy(graph));
  GT_CUDA(cudaStreamDestroy(s));
}

// ---- a role that owns the epilogue of grouped tiles -----------------------------------------

// Stores each tile itself (masked stores of the engine, for every row of the tile's group) and
// counts, per group, the rows its n block 0 tiles own (role_args: uint32[G]), so the test sees
// that the epilogue learnt the group and the row range.
struct GroupedRecordRole {
  static constexpr bool kHasBlockExit = false;
  static constexpr bool kHasEpilogue = true;
  struct EpilogueState {
    uint32_t tiles = 0;
  };
  __device__ static void run(const mk::GemmParams&, uint32_t, uint32_t) {}
  template <class T>
  __device__ static void epilogue(const mk::GemmParams& p, EpilogueState& st, float (&acc)[T::kBlockN / 2],
                                  const mk::GroupedTile& tile, uint32_t ctid, const CUtensorMap*, uint8_t* smem_epi) {
    const uint32_t cw = ctid / 128, lane = ctid % 32, warp_in_wg = (ctid / 32) % 4;
    const uint32_t half_row0 = tile.row_begin + cw * 64;
    const uint32_t rows = tile.row_end > half_row0 ? min(tile.row_end - half_row0, 64u) : 0u;
    if (rows > 0) {
      mk::detail::store_tile_masked<T>(p, acc, smem_epi + cw * 2 * T::kEpiChunkBytes, half_row0, rows,
                                       tile.n_block * T::kBlockN, warp_in_wg, lane, ctid % 128 == 0, 3 + cw);
    }
    if (ctid == 0 && tile.n_block == 0) atomicAdd(static_cast<uint32_t*>(p.role_args) + tile.group, tile.rows());
    ++st.tiles;
  }
  template <class T>
  __device__ static void epilogue_end(const mk::GemmParams&, EpilogueState&, uint32_t) {}
};

template <int kBlockN, int kClusterM>
void run_role_case_with() {
  std::mt19937_64 rng(g_seed + 71 + kBlockN + kClusterM);
  const int64_t groups = 20, n = 1032, k = 264, capacity = 2600;
  auto counts = routed_counts(rng, groups, 2500, 1.1);
  counts[4] = 0;
  const auto off = offsets_from_counts(counts);
  Problem p(capacity, groups, n, k);
  p.fill(g_seed + 72);
  p.set_offsets(off);
  p.references();
  poison(p.d, static_cast<size_t>(capacity) * n);
  uint32_t* rows_seen = nullptr;
  GT_CUDA(cudaMalloc(&rows_seen, sizeof(uint32_t) * groups));
  GT_CUDA(cudaMemset(rows_seen, 0, sizeof(uint32_t) * groups));
  mk::GroupedGemmConfig cfg;
  cfg.block_n = kBlockN;
  cfg.cluster_m = kClusterM;
  mk::GroupedGemmArgs args = p.args(cfg);
  args.hooks.role_args = rows_seen;
  mk::GroupedGemmPlan plan;
  mk::GemmResult r = mk::grouped_gemm_plan(args, &plan);
  check(r.ok(), "role plan: " + r.message);
  if (!r.ok()) return;
  r = mk::launch_sm90_bf16_gemm<mk::GroupedGemmTraits<kBlockN, kClusterM>, GroupedRecordRole>(plan.engine, nullptr);
  check(r.ok(), "role launch: " + r.message);
  GT_CUDA(cudaDeviceSynchronize());
  std::vector<uint32_t> seen(groups);
  GT_CUDA(cudaMemcpy(seen.data(), rows_seen, sizeof(uint32_t) * groups, cudaMemcpyDeviceToHost));
  size_t wrong = 0;
  for (int64_t g = 0; g < groups; ++g) wrong += seen[g] != counts[g];
  const mk::DeviceStatus st = p.take_status();
  const Verdict v = verify(p);
  const bool ok = st.code == mk::kDeviceOk && wrong == 0 && v.ok;
  std::printf("%s  role epilogue n%d c%d: %s, rows per group seen by the epilogue %s, rel err %.2e%s%s\n",
              ok ? "ok  " : "FAIL", kBlockN, kClusterM, describe(off).c_str(), wrong == 0 ? "right" : "WRONG",
              v.worst_ref, v.ok ? "" : ": ", v.why.c_str());
  if (!ok) ++g_failures;
  GT_CUDA(cudaFree(rows_seen));
}

void run_role_cases() {
  run_role_case_with<256, 1>();
  run_role_case_with<128, 2>();
}

// ---- argument errors -------------------------------------------------------------------------

void expect_error(const char* what, mk::GroupedGemmArgs args, mk::GemmError code, const char* needle) {
  mk::GroupedGemmPlan plan;
  const mk::GemmResult r = mk::grouped_gemm_plan(args, &plan);
  const bool ok = !r.ok() && r.code == code && r.message.find(needle) != std::string::npos;
  std::printf("%s  argument error (%s): '%s'\n", ok ? "ok  " : "FAIL", what, r.message.c_str());
  if (!ok) ++g_failures;
}

void run_argument_errors() {
  Problem p(256, 4, 256, 128);
  const mk::GroupedGemmArgs good = p.args();
  mk::GroupedGemmArgs a = good;
  a.n = 1001;
  expect_error("n", a, mk::GemmError::kInvalidN, "n = 1001");
  a = good;
  a.k = 100;
  expect_error("k", a, mk::GemmError::kInvalidK, "k = 100");
  a = good;
  a.num_groups = 0;
  expect_error("groups", a, mk::GemmError::kInvalidGroups, "num_groups = 0");
  a = good;
  a.capacity = 0;
  expect_error("capacity", a, mk::GemmError::kInvalidGroups, "capacity = 0");
  a = good;
  a.a = reinterpret_cast<const char*>(good.a) + 2;
  expect_error("misaligned a", a, mk::GemmError::kInvalidPointer, "pointer a");
  a = good;
  a.offsets = nullptr;
  expect_error("offsets", a, mk::GemmError::kInvalidPointer, "pointer offsets");
  a = good;
  a.hooks.group_ready = reinterpret_cast<const uint64_t*>(reinterpret_cast<uintptr_t>(good.a) + 4);
  expect_error("misaligned group flags", a, mk::GemmError::kInvalidPointer, "hooks.group_ready");
  a = good;
  a.config.block_n = 192;
  expect_error("block_n", a, mk::GemmError::kInvalidConfig, "config.block_n = 192");
  a = good;
  a.config.l2_promotion = 32;
  expect_error("l2_promotion", a, mk::GemmError::kInvalidConfig, "config.l2_promotion = 32");
}

}  // namespace

int main() {
  require_hopper_or_skip("grouped_gemm_gpu_test");
  const char* env_seed = std::getenv("MKERNEL_TEST_SEED");
  g_seed = env_seed ? std::strtoull(env_seed, nullptr, 10)
                    : static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
  std::printf("grouped_gemm_gpu_test: seed %llu (MKERNEL_TEST_SEED=%llu replays it)\n",
              static_cast<unsigned long long>(g_seed), static_cast<unsigned long long>(g_seed));
  GT_CUBLAS(cublasCreate(&g_cublas));
  std::mt19937_64 rng(g_seed);

  run_argument_errors();

  // Random counts, uniform and skewed, over the MoE shapes scaled down (n, k of the up and down
  // projections with fewer rows so the fp32 reference stays quick).
  for (double zipf : {0.0, 1.1}) {
    const auto up = routed_counts(rng, 16, 3000, zipf);
    run_case(zipf == 0 ? "up, uniform" : "up, zipf", offsets_from_counts(up), 3000, 2048, 7168);
    const auto down = routed_counts(rng, 16, 3000, zipf);
    run_case(zipf == 0 ? "down, uniform" : "down, zipf", offsets_from_counts(down), 3100, 7168, 2048);
  }
  // Empty groups: the first, the last, runs of them.
  {
    std::vector<uint32_t> c = {0, 130, 0, 0, 257, 1, 0, 64, 65, 0, 128, 0};
    run_case("empty groups", offsets_from_counts(c), 1000, 1024, 512);
  }
  // One group holding nearly all rows (and a few rows elsewhere), in the middle and at the end.
  {
    std::vector<uint32_t> c(64, 0);
    c[20] = 4000;
    c[3] = 1;
    c[40] = 2;
    run_case("one group nearly all", offsets_from_counts(c), 4003, 1536, 1024);
    std::vector<uint32_t> last(64, 0);
    last[63] = 4003;
    run_case("one group all (last)", offsets_from_counts(last), 4003, 1536, 1024);
  }
  // Counts around the tile height; n and k multiples of 8 but not of 64 (partial n and k tiles).
  {
    std::vector<uint32_t> c = {1, 63, 64, 65, 127, 128, 129, 191, 192, 255, 256, 257, 383};
    run_case("counts around 128", offsets_from_counts(c), 2400, 520, 200);
    run_case("n, k not multiples of 64", offsets_from_counts(c), 2400, 136, 72);
  }
  // Every tile width and cluster size, both rasters, on one ragged set of counts.
  {
    const auto c = routed_counts(rng, 12, 2500, 1.1);
    for (int bn : {128, 256})
      for (int cl : {1, 2})
        for (int ra : {0, 1}) {
          mk::GroupedGemmConfig cfg;
          cfg.block_n = bn;
          cfg.cluster_m = cl;
          cfg.raster = ra;
          cfg.band = 3;
          run_case("config", offsets_from_counts(c), 2600, 1288, 776, cfg);
        }
    // Every L2 promotion of the operand maps (a cache hint: the results must not change).
    for (int pr : {0, 64, 128, 256}) {
      mk::GroupedGemmConfig cfg;
      cfg.l2_promotion = pr;
      run_case("l2 promotion", offsets_from_counts(c), 2600, 1288, 776, cfg);
    }
  }
  // G = 1 (a dense GEMM through the grouped path), G = 1024 with a few rows each, a first offset
  // that is not 0, spare capacity after the last group, few blocks.
  run_case("G=1", {0, 1000}, 1000, 2048, 1024);
  {
    auto c = routed_counts(rng, 1024, 6000, 0.0);
    run_case("G=1024", offsets_from_counts(c), 6000, 256, 128);
    auto z = routed_counts(rng, 1024, 6000, 1.1);
    run_case("G=1024 zipf", offsets_from_counts(z), 6100, 512, 256);
  }
  {
    std::vector<uint32_t> c = {200, 0, 333, 90};
    run_case("first offset 77, spare rows", offsets_from_counts(c, 77), 1200, 1024, 512);
    mk::GroupedGemmConfig few;
    few.num_gemm_blocks = 2;
    run_case("2 blocks", offsets_from_counts(c), 700, 1024, 512, few);
  }

  // A random family from the printed seed (MKERNEL_TEST_RANDOM_CASES cases, 6 by default): 1 to
  // 200 groups, 1 to 6000 routed rows (uniform or Zipf 0.5 to 1.5, some groups emptied), n and k
  // multiples of 8 in [8, 2048] and [16, 2048], spare capacity, any tile width, cluster size
  // and raster.
  {
    const char* e = std::getenv("MKERNEL_TEST_RANDOM_CASES");
    const uint32_t count = e ? static_cast<uint32_t>(std::strtoul(e, nullptr, 10)) : 6;
    auto log_uniform = [&](double lo, double hi) {
      return std::exp(std::uniform_real_distribution<double>(std::log(lo), std::log(hi + 1))(rng));
    };
    for (uint32_t i = 0; i < count; ++i) {
      const uint32_t groups = static_cast<uint32_t>(log_uniform(1, 200));
      const uint32_t rows = static_cast<uint32_t>(log_uniform(1, 6000));
      const double zipf = rng() % 2 ? 0.0 : 0.5 + (rng() % 11) / 10.0;
      auto c = routed_counts(rng, groups, rows, zipf);
      for (auto& x : c)
        if (rng() % 8 == 0) x = 0;
      uint32_t total = 0;
      for (uint32_t x : c) total += x;
      const int64_t n = static_cast<int64_t>(log_uniform(1, 256)) * 8, k = static_cast<int64_t>(log_uniform(2, 256)) * 8;
      const int64_t capacity = std::max<int64_t>(1, total + rng() % 200);
      mk::GroupedGemmConfig cfg;
      cfg.block_n = std::vector<int>{0, 128, 256}[rng() % 3];
      cfg.cluster_m = static_cast<int>(rng() % 3);
      cfg.raster = static_cast<int>(rng() % 3) - 1;
      char label[160];
      std::snprintf(label, sizeof(label), "random %u: G %u rows %u zipf %.1f n %lld k %lld cap %lld bn %d cl %d ra %d", i,
                    groups, total, zipf, static_cast<long long>(n), static_cast<long long>(k),
                    static_cast<long long>(capacity), cfg.block_n, cfg.cluster_m, cfg.raster);
      run_case(label, offsets_from_counts(c), capacity, n, k, cfg);
    }
  }

  run_tile_flag_case();
  run_role_cases();
  run_readiness_cases();
  run_bad_offsets_case();
  run_graph_case();

  GT_CUBLAS(cublasDestroy(g_cublas));
  if (g_failures) {
    std::printf("grouped_gemm_gpu_test: %d FAILED\n", g_failures);
    return 1;
  }
  std::printf("grouped_gemm_gpu_test: all passed\n");
  return 0;
}
