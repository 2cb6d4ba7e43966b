// AllGather+GEMM correctness (ops.h): every rank's C_r against an fp32 reference and cuBLAS on
// the gathered inputs, and the gathered output bit for bit against the concatenation of the
// shards (what an NCCL all-gather produces: copying is exact, so "NCCL all-gather then cuBLAS"
// and "cuBLAS on the concatenation" are the same check). Fresh random inputs per launch (seed
// printed; MKERNEL_TEST_SEED replays), outputs poisoned with NaN before every launch.
//
// Layouts (fused_harness.h): one node of 2 and of 3 ranks (the NVLink path), two nodes of one
// rank over libfabric shm and over tcp;ofi_rxm (the proxy path, host-staged), and two nodes of
// two ranks (rail peers through the proxies, then NVLink). On one GPU every rank shares it;
// with two GPUs the one-node layouts of two ranks use both. Per layout: M/R not a multiple of
// 128, odd chunk sizes, three launches in a row without resets, then a CUDA graph replayed with
// new data; argument errors and ranks that disagree on the shape. Then a random family
// (random_cases.h): 4 cases by default drawn from the seed, any m_local in [1, 700], n_local and
// k multiples of 8 in [8, 1024] and [16, 1536], 1 to 8 chunks per shard, clusters of 1 or 2, with
// or without the gathered output, with pushes by the blocks or the copy engines, on a random layout.
// With the adaptive split (four cases and a random draw in four): the same inputs give the same
// bits at six pinned splits, over 24 launches of the policy's own choosing, and as the static
// default split (check_adaptive). The kernel is launched with programmatic dependence on
// begin_launch's kernel (programmatic_launch, off by default) in two cases and one random draw
// in four.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "fused_harness.h"
#include "random_cases.h"
#include "gemm/gemm_test_util.cuh"
#include "mkernel/runtime/ops.h"
#include "mkernel/runtime/runtime.h"

namespace {

namespace rt = mkernel::rt;
using gemm_test::compare;
using gemm_test::ErrorStats;
using gemm_test::fill_random;
using gemm_test::poison;
using gemm_test::to_host;
using gemm_test::to_host_float;

constexpr double kTolerance = 5e-3;  // relative Frobenius error (the GEMM test's bound)
uint64_t g_seed = 0;

struct Case {
  fused_test::Topology topo;
  uint32_t m_local, n_local, k;
  uint32_t chunk_rows = 0;
  int cluster_m = 1;
  bool gathered_out = true;
  uint32_t launches_before = 0;  // launches of the communicator before the op is planned
  bool copy_engine = false;      // AllGatherGemmConfig::copy_engine_pushes
  bool trace = false;            // AllGatherGemmConfig::trace, and its report checked
  bool adaptive = false;         // AllGatherGemmConfig::adaptive_split, and the bits checked across splits
  bool pdl = false;              // AllGatherGemmConfig::programmatic_launch (off by default)
};

uint64_t shard_seed(uint64_t launch_seed, uint32_t shard) { return launch_seed * 7919 + shard * 104729 + 1; }

// The adaptive split (AllGatherGemmConfig::adaptive_split): the same inputs give the same bits
// at every split, pinned ones and the policy's own over many launches, and the same as a plan
// with the static default split (when its split-K parts are at most two: more are summed in
// arrival order there); the state counts the launches and says where it stands.
template <class Prepare, class Check>
int check_adaptive(const Case& cs, const rt::AllGatherGemmConfig& cfg, uint32_t rank, rt::AllGatherGemm& op,
                   rt::Communicator& comm, cudaStream_t stream,
                   const fused_test::RankSync& sync, Prepare& prepare, Check& check_launch, const __nv_bfloat16* a,
                   const __nv_bfloat16* w, __nv_bfloat16* c, __nv_bfloat16* g) {
  int fails = 0;
  const uint64_t M = uint64_t{cs.topo.world()} * cs.m_local;
  const size_t cn = M * cs.n_local;
  const uint64_t seed = g_seed + 77777;
  std::vector<uint16_t> first, now(cn);
  auto run_once = [&](const char* what) {
    prepare(seed);
    GT_CUDA(cudaStreamSynchronize(stream));
    sync();
    const mkernel::Status s = op.launch(a, w, c, cs.gathered_out ? g : nullptr, stream);
    RANK_CHECK(s.ok(), "%s: %s", what, s.to_string().c_str());
    check_launch(seed, what);
    GT_CUDA(cudaMemcpy(now.data(), c, cn * 2, cudaMemcpyDeviceToHost));
    if (first.empty()) {
      first = now;
      return;
    }
    size_t diff = 0, at = 0;
    for (size_t i = 0; i < cn; ++i)
      if (now[i] != first[i] && diff++ == 0) at = i;
    RANK_CHECK(diff == 0, "%s: C differs from the first split's in %zu elements (first at row %zu)", what, diff,
               at / cs.n_local);
  };
  auto state = op.split_state();
  RANK_CHECK(state.ok() && state.value().adaptive, "split_state: %s", state.ok() ? "not adaptive" : state.status().to_string().c_str());
  if (!state.ok()) return fails;
  const int start = state.value().comm_blocks;
  const uint32_t launches0 = state.value().launches;
  const int cl = cs.cluster_m > 1 ? cs.cluster_m : 1;  // whole clusters only
  auto whole = [&](int p) { return std::max(cl, p - p % cl); };
  const int pins[] = {whole(start), whole(1), whole(2), whole(3), whole(start + 3), whole(2 * start)};
  int pinned_runs = 0;
  for (const int p : pins) {
    const mkernel::Status st = op.pin_split(p);
    RANK_CHECK(st.ok(), "pin_split(%d): %s", p, st.to_string().c_str());
    run_once(("pinned " + std::to_string(p)).c_str());
    ++pinned_runs;
    auto after = op.split_state();
    RANK_CHECK(after.ok() && after.value().last_comm_blocks == p && after.value().pinned,
               "pinned %d: the launch ran with %d communication blocks", p,
               after.ok() ? after.value().last_comm_blocks : -1);
  }
  // A count that is not whole clusters, or leaves nothing to compute, is refused.
  const mkernel::Status bad = op.pin_split(100000);
  RANK_CHECK(!bad.ok() && bad.to_string().find("pin") != std::string::npos, "pin_split(100000) was accepted: %s",
             bad.to_string().c_str());
  // Free: the policy moves the split; the bits stay.
  RANK_CHECK(op.pin_split(0).ok(), "unpinning failed");
  std::vector<int> seen;
  for (int l = 0; l < 24; ++l) {
    run_once(("adaptive launch " + std::to_string(l)).c_str());
    auto st = op.split_state();
    if (st.ok()) seen.push_back(st.value().last_comm_blocks);
  }
  auto end = op.split_state();
  RANK_CHECK(end.ok() && end.value().launches == launches0 + pinned_runs + 24, "split_state counted %u launches, expected %u",
             end.ok() ? end.value().launches : 0u, launches0 + pinned_runs + 24);
  // The static default split on the same inputs.
  rt::AllGatherGemmConfig scfg = cfg;  // the adaptive plan's, whose split it started from
  scfg.adaptive_split = false;
  GT_CUDA(cudaStreamSynchronize(stream));
  sync();
  auto made = rt::AllGatherGemm::create(comm, cs.m_local, cs.n_local, cs.k, scfg, stream);
  RANK_CHECK(made.ok(), "static plan: %s", made.status().to_string().c_str());
  if (made.ok()) {
    sync();
    rt::AllGatherGemm& st = *made.value();
    const std::string d = st.describe();
    const size_t sp = d.find(" s", d.find("gemm "));
    const int splits = sp == std::string::npos ? 1 : std::atoi(d.c_str() + sp + 2);
    prepare(seed);
    GT_CUDA(cudaStreamSynchronize(stream));
    sync();
    const mkernel::Status s = st.launch(a, w, c, cs.gathered_out ? g : nullptr, stream);
    RANK_CHECK(s.ok(), "static launch: %s", s.to_string().c_str());
    check_launch(seed, "static default split");
    GT_CUDA(cudaMemcpy(now.data(), c, cn * 2, cudaMemcpyDeviceToHost));
    size_t diff = 0;
    for (size_t i = 0; i < cn; ++i) diff += now[i] != first[i];
    RANK_CHECK(splits > 2 || diff == 0, "the static default split (%s) differs from the adaptive plan in %zu elements",
               d.c_str(), diff);
    sync();
  }
  if (rank == 0 && end.ok()) {
    std::lock_guard<std::mutex> lock(fused_test::g_print);
    std::string path;
    for (int x : seen) path += " " + std::to_string(x);
    std::printf("      adaptive: %zu pinned splits and 24 free launches bit-identical; splits taken:%s\n      %s\n",
                std::size(pins), path.c_str(), end.value().text.c_str());
  }
  return fails;
}

// One rank of one case: plan, three launches, a graph replayed three times.
int run_rank(const Case& cs, uint32_t rank, rt::Communicator& comm, cudaStream_t stream, bool shared_gpu,
             const fused_test::RankSync& sync) {
  int fails = 0;
  const uint32_t R = cs.topo.world();
  const uint64_t M = uint64_t{R} * cs.m_local;
  const uint32_t n = cs.n_local, k = cs.k;
  __nv_bfloat16 *a = nullptr, *w = nullptr, *c = nullptr, *g = nullptr, *a_all = nullptr, *c_ref_cublas = nullptr;
  float* ref = nullptr;
  GT_CUDA(cudaMalloc(&a, sizeof(__nv_bfloat16) * cs.m_local * k));
  GT_CUDA(cudaMalloc(&w, sizeof(__nv_bfloat16) * n * k));
  GT_CUDA(cudaMalloc(&c, sizeof(__nv_bfloat16) * M * n));
  GT_CUDA(cudaMalloc(&g, sizeof(__nv_bfloat16) * M * k));
  GT_CUDA(cudaMalloc(&a_all, sizeof(__nv_bfloat16) * M * k));
  GT_CUDA(cudaMalloc(&c_ref_cublas, sizeof(__nv_bfloat16) * M * n));
  GT_CUDA(cudaMalloc(&ref, sizeof(float) * M * n));
  // cuBLAS with a workspace of its own, so no call of it allocates (fused_harness.h).
  void* blas_ws = nullptr;
  constexpr size_t kBlasWorkspace = 32 << 20;
  GT_CUDA(cudaMalloc(&blas_ws, kBlasWorkspace));
  cublasHandle_t blas;
  GT_CUBLAS(cublasCreate(&blas));
  GT_CUBLAS(cublasSetStream(blas, stream));
  GT_CUBLAS(cublasSetWorkspace(blas, blas_ws, kBlasWorkspace));

  rt::AllGatherGemmConfig cfg;
  cfg.chunk_rows = cs.chunk_rows;
  cfg.cluster_m = cs.cluster_m;
  cfg.copy_engine_pushes = cs.copy_engine;
  cfg.trace = cs.trace;
  cfg.adaptive_split = cs.adaptive;
  cfg.programmatic_launch = cs.pdl;
  if (shared_gpu) {
    // Every rank's kernel must be resident at once on the one GPU: split its 132 SMs.
    const int per_rank = 132 / static_cast<int>(R);
    cfg.comm_blocks = 4;
    cfg.gemm_blocks = (per_rank - cfg.comm_blocks) / cs.cluster_m * cs.cluster_m;
  }
  // Warm up what loads lazily (the test's kernels, cuBLAS), then move in step (fused_harness.h):
  // the plan's agreement is a kernel that waits for the other ranks.
  fill_random(a_all, 1024, 1, 1.0f, stream);
  poison(c, 8, stream);
  gemm_test::reference_gemm(a_all, w, ref, 8, 8, 8, stream);
  {
    const float alpha = 1.f, beta = 0.f;
    GT_CUBLAS(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, 8, 8, 8, &alpha, w, CUDA_R_16BF, 8, a_all, CUDA_R_16BF, 8,
                           &beta, c_ref_cublas, CUDA_R_16BF, 8, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
  // A communicator that has launched a while before the op is planned (the agreement's flag
  // values must not depend on the launch number: comm.cuh, agree_flag_value).
  for (uint32_t i = 0; i < cs.launches_before; ++i) {
    const mkernel::Status b = comm.begin_launch(stream);
    RANK_CHECK(b.ok(), "begin_launch %u: %s", i, b.to_string().c_str());
    if (!b.ok()) return fails;
  }
  GT_CUDA(cudaStreamSynchronize(stream));
  sync();
  auto made = rt::AllGatherGemm::create(comm, cs.m_local, n, k, cfg, stream);
  RANK_CHECK(made.ok(), "create: %s", made.status().to_string().c_str());
  if (!made.ok()) return fails;
  sync();  // every rank's plan made (its device allocations done) before anyone launches
  rt::AllGatherGemm& op = *made.value();
  if (rank == 0) {
    std::lock_guard<std::mutex> lock(fused_test::g_print);
    std::printf("      plan: %s\n", op.describe().c_str());
  }

  // Inputs of launch `l`: every rank draws shard q of A from the same seed, so each can build
  // the whole gathered A for its reference.
  auto check_launch = [&](uint64_t launch_seed, const char* what) {
    GT_CUDA(cudaStreamSynchronize(stream));
    const mkernel::Status st = comm.check();
    RANK_CHECK(st.ok(), "%s: check(): %s", what, st.to_string().c_str());
    for (uint32_t q = 0; q < R; ++q)
      fill_random(a_all + uint64_t{q} * cs.m_local * k, uint64_t{cs.m_local} * k, shard_seed(launch_seed, q), 1.0f,
                  stream);
    gemm_test::reference_gemm(a_all, w, ref, static_cast<int>(M), static_cast<int>(n), static_cast<int>(k), stream);
    const float alpha = 1.f, beta = 0.f;
    GT_CUBLAS(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, n, static_cast<int>(M), k, &alpha, w, CUDA_R_16BF, k, a_all,
                           CUDA_R_16BF, k, &beta, c_ref_cublas, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                           CUBLAS_GEMM_DEFAULT));
    GT_CUDA(cudaStreamSynchronize(stream));
    const size_t cn = M * n;
    const auto out = to_host_float(c, cn);
    const ErrorStats e_ref = compare(out, to_host(ref, cn));
    const ErrorStats e_blas = compare(out, to_host_float(c_ref_cublas, cn));
    RANK_CHECK(e_ref.non_finite == 0 && e_ref.rel_fro < kTolerance && e_blas.rel_fro < kTolerance,
               "%s: C: %zu unwritten (first at row %zu), rel err vs fp32 %.2e, vs cuBLAS %.2e", what,
               e_ref.non_finite, e_ref.first_bad == SIZE_MAX ? 0 : e_ref.first_bad / n, e_ref.rel_fro, e_blas.rel_fro);
    if (cs.gathered_out) {
      std::vector<uint16_t> hg(M * k), ha(M * k);
      GT_CUDA(cudaMemcpy(hg.data(), g, hg.size() * 2, cudaMemcpyDeviceToHost));
      GT_CUDA(cudaMemcpy(ha.data(), a_all, ha.size() * 2, cudaMemcpyDeviceToHost));
      size_t diff = 0, first = 0;
      for (size_t i = 0; i < hg.size(); ++i)
        if (hg[i] != ha[i] && diff++ == 0) first = i;
      RANK_CHECK(diff == 0, "%s: gathered A differs from the concatenation in %zu elements (first: row %zu)", what,
                 diff, first / k);
    }
    return e_ref.rel_fro;
  };
  auto prepare = [&](uint64_t launch_seed) {
    fill_random(a, uint64_t{cs.m_local} * k, shard_seed(launch_seed, rank), 1.0f, stream);
    fill_random(w, uint64_t{n} * k, launch_seed * 31 + rank, 1.0f, stream);
    poison(c, M * n, stream);
    if (cs.gathered_out) poison(g, M * k, stream);
  };

  double worst = 0;
  for (int l = 0; l < 3; ++l) {  // repeated launches, no reset
    const uint64_t seed = g_seed + 1000 * l + 1;
    prepare(seed);
    GT_CUDA(cudaStreamSynchronize(stream));
    sync();
    const mkernel::Status s = op.launch(a, w, c, cs.gathered_out ? g : nullptr, stream);
    RANK_CHECK(s.ok(), "launch %d: %s", l, s.to_string().c_str());
    worst = std::max(worst, check_launch(seed, ("launch " + std::to_string(l)).c_str()));
    if (cs.trace) {  // the launch's stamps: its start and end, and every other rank's chunks seen
      const std::string t = op.trace_report();
      const bool ended = t.find("launch end ") != std::string::npos && t.find("launch end -") == std::string::npos;
      const bool arrived = R < 2 || (t.find("shard ") != std::string::npos &&
                                     t.find(" -", t.find("arrivals")) == std::string::npos);
      RANK_CHECK(ended && arrived, "launch %d: the trace misses stamps:\n%s", l, t.c_str());
      if (rank == 0 && l == 0) {
        std::lock_guard<std::mutex> lock(fused_test::g_print);
        std::printf("%s", t.c_str());
      }
    }
  }
  // The same call captured in a CUDA graph and replayed with new data: each replay is a new
  // launch (its flags carry the new launch number).
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  sync();
  GT_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const mkernel::Status cap = op.launch(a, w, c, cs.gathered_out ? g : nullptr, stream);
  GT_CUDA(cudaStreamEndCapture(stream, &graph));
  RANK_CHECK(cap.ok(), "launch in capture: %s", cap.to_string().c_str());
  GT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  GT_CUDA(cudaGraphUpload(exec, stream));
  for (int l = 0; l < 3; ++l) {
    const uint64_t seed = g_seed + 5000 + 1000 * l;
    prepare(seed);
    GT_CUDA(cudaStreamSynchronize(stream));
    sync();
    GT_CUDA(cudaGraphLaunch(exec, stream));
    worst = std::max(worst, check_launch(seed, ("graph replay " + std::to_string(l)).c_str()));
  }
  GT_CUDA(cudaGraphExecDestroy(exec));
  GT_CUDA(cudaGraphDestroy(graph));
  if (rank == 0) {
    std::lock_guard<std::mutex> lock(fused_test::g_print);
    std::printf("      3 launches + 3 graph replays: worst rel err vs fp32 %.2e\n", worst);
  }
  if (cs.adaptive) fails += check_adaptive(cs, cfg, rank, op, comm, stream, sync, prepare, check_launch, a, w, c, g);

  sync();  // nobody frees (a device-wide synchronisation) while another rank's kernel runs
  cublasDestroy(blas);
  cudaFree(blas_ws);
  cudaFree(a);
  cudaFree(w);
  cudaFree(c);
  cudaFree(g);
  cudaFree(a_all);
  cudaFree(c_ref_cublas);
  cudaFree(ref);
  return fails;
}

rt::Options options_for(const Case& cs) {
  rt::Options o;
  o.nvlink_bytes = rt::all_gather_gemm_nvlink_bytes(cs.topo.world(), cs.m_local, cs.k);
  o.network_workspace_bytes = rt::all_gather_gemm_network_bytes(cs.topo.nodes, cs.m_local, cs.k);
  o.device_wait_timeout_ns = 10'000'000'000ull;
  o.rendezvous_timeout = std::chrono::milliseconds(60000);
  return o;
}

int run_case(const Case& cs) {
  fused_test::Cluster cluster(cs.topo, "ag");
  if (!cluster.start()) return 1;
  std::printf("case %s: m_local %u n_local %u k %u chunk_rows %u cluster %d gathered_out %d%s%s%s%s\n",
              cs.topo.name().c_str(), cs.m_local, cs.n_local, cs.k, cs.chunk_rows, cs.cluster_m, cs.gathered_out,
              cs.copy_engine ? " copy-engine pushes" : "", cs.adaptive ? " adaptive split" : "",
              cs.launches_before ? (" after " + std::to_string(cs.launches_before) + " launches").c_str() : "",
              cluster.shared_gpu() ? " (ranks share GPU 0)" : "");
  const auto t0 = std::chrono::steady_clock::now();
  const int failed = fused_test::run_ranks_in_threads(
      cluster, options_for(cs), {4096},
      [&](uint32_t rank, rt::Communicator& comm, cudaStream_t stream, const fused_test::RankSync& sync) {
        return run_rank(cs, rank, comm, stream, cluster.shared_gpu(), sync);
      });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%s  %s m_local %u: %d rank(s) failed (%.1f s)\n", failed == 0 ? "ok  " : "FAIL", cs.topo.name().c_str(),
              cs.m_local, failed, s);
  return failed == 0 ? 0 : 1;
}

// Bad arguments are refused before anything is launched, naming the field; ranks that disagree
// on the shape both get an error naming the two values.
int run_error_cases() {
  const fused_test::Topology topo{1, 2, "shm"};
  fused_test::Cluster cluster(topo, "agerr");
  if (!cluster.start()) return 1;
  rt::Options o;
  o.nvlink_bytes = 1 << 20;
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
        __nv_bfloat16* d = nullptr;
        GT_CUDA(cudaMalloc(&d, 1 << 20));
        std::vector<uint16_t> host(1 << 16);
        sync();  // allocations done everywhere before the agreements (fused_harness.h)
        expect(rt::AllGatherGemm::create(comm, 64, 128, 100, {}, stream).status(), "k = 100", "k not a multiple of 8");
        expect(rt::AllGatherGemm::create(comm, 64, 12, 128, {}, stream).status(), "n_local = 12", "n_local");
        expect(rt::AllGatherGemm::create(comm, 0, 128, 128, {}, stream).status(), "m_local = 0", "m_local");
        // The NVLink buffer (1 MiB) cannot hold 2 x 1024 x 1024 bf16.
        expect(rt::AllGatherGemm::create(comm, 1024, 128, 1024, {}, stream).status(), "nvlink_bytes",
               "workspace too small");
        // Disagreement: rank 1 plans k = 136, rank 0 k = 128.
        sync();  // every rank done with the refused plan (its frees) before the next agreement
        expect(rt::AllGatherGemm::create(comm, 64, 128, rank == 0 ? 128 : 136, {}, stream).status(),
               "ranks disagree on k", "ranks disagree");
        // A good plan, then a misaligned and a host pointer.
        sync();
        auto op = rt::AllGatherGemm::create(comm, 64, 128, 128, {}, stream);
        RANK_CHECK(op.ok(), "create: %s", op.status().to_string().c_str());
        if (op.ok()) {
          expect(op.value()->launch(reinterpret_cast<char*>(d) + 2, d, d, nullptr, stream), "pointer a",
                 "misaligned a");
          expect(op.value()->launch(d, host.data(), d, nullptr, stream), "pointer w", "host memory for w");
        }
        sync();
        cudaFree(d);
        bad += fails;
        return fails;
      });
  std::printf("%s  argument errors and disagreement\n", failed == 0 && bad == 0 ? "ok  " : "FAIL");
  return failed == 0 && bad == 0 ? 0 : 1;
}

// A rank whose kernel fails tells its NVLink peers (comm.cuh note 3): rank 0 waits (bound 10 s)
// for a flag nobody raises; rank 1's kernel records an error; rank 0's wait ends at once with
// "a peer rank's kernel failed (rank 1 failed first)".
__global__ void wait_for_nothing(rt::DeviceComm c) {
  if (threadIdx.x == 0) rt::nvl_wait(c, 0, ~0ull >> 1, 7);
}
__global__ void fail_now(rt::DeviceComm c) {
  if (threadIdx.x == 0) rt::report(c, rt::kDeviceBadArgument, mkernel::kernels::kArgRange, 9);
}

int run_abort_case() {
  const fused_test::Topology topo{1, 2, "shm"};
  fused_test::Cluster cluster(topo, "agabort");
  if (!cluster.start()) return 1;
  rt::Options o;
  o.nvlink_bytes = 1 << 20;
  o.device_wait_timeout_ns = 10'000'000'000ull;
  std::atomic<int> bad{0};
  const int failed = fused_test::run_ranks_in_threads(
      cluster, o, {4096}, [&](uint32_t rank, rt::Communicator& comm, cudaStream_t stream, const fused_test::RankSync& sync) {
        int fails = 0;
        sync();
        if (rank == 0) {
          const auto t0 = std::chrono::steady_clock::now();
          RANK_CHECK(comm.begin_launch(stream).ok(), "begin_launch");
          wait_for_nothing<<<1, 32, 0, stream>>>(comm.device());
          GT_CUDA(cudaStreamSynchronize(stream));
          const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
          const mkernel::Status why = comm.check();
          RANK_CHECK(why.message().find("a peer rank's kernel failed (rank 1 failed first)") != std::string::npos,
                     "check(): %s", why.to_string().c_str());
          RANK_CHECK(ms < 5000, "the wait ended %.0f ms after the launch; the peer failed about 300 ms in", ms);
          std::lock_guard<std::mutex> lock(fused_test::g_print);
          std::printf("      rank 0's wait ended %.0f ms after its launch (rank 1 failed ~300 ms in): %s\n", ms,
                      why.message().c_str());
        } else {
          std::this_thread::sleep_for(std::chrono::milliseconds(300));
          RANK_CHECK(comm.begin_launch(stream).ok(), "begin_launch");
          fail_now<<<1, 32, 0, stream>>>(comm.device());
          GT_CUDA(cudaStreamSynchronize(stream));
          RANK_CHECK(!comm.check().ok(), "rank 1 recorded its own failure");
        }
        bad += fails;
        sync();
        return fails;
      });
  std::printf("%s  a failed peer ends the others' waits\n", failed == 0 && bad == 0 ? "ok  " : "FAIL");
  return failed == 0 && bad == 0 ? 0 : 1;
}

}  // namespace

int main() {
  // Ranks that share a GPU run kernels that wait for each other; loading a module on first use
  // (CUDA's lazy loading) can wait for the running ones. Load everything up front.
  ::setenv("CUDA_MODULE_LOADING", "EAGER", 1);
  // The ranks here are threads of one process, so their streams share the GPU's hardware queues
  // (8 by default). With copy-engine pushes each rank has a stream per node peer that waits at a
  // gate; aliased into one queue with another rank's stream, a rank's copies for this launch can
  // sit behind a wait for the next launch, which opens only once this launch is done everywhere:
  // both wait until the bound (seen once, 1 x 3 with copy-engine pushes, 12 streams). A rank of
  // its own process enqueues a launch's work before the next's, so queue order follows launch
  // order and cannot do that. One queue per stream here (32, the most CUDA allows).
  ::setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
  mkt::require_gpus_or_skip("ag_gemm_gpu_test", 1);
  const char* env_seed = std::getenv("MKERNEL_TEST_SEED");
  g_seed = env_seed ? std::strtoull(env_seed, nullptr, 10)
                    : static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count() % 1000000007);
  std::printf("ag_gemm_gpu_test: seed %llu (MKERNEL_TEST_SEED replays it)\n", static_cast<unsigned long long>(g_seed));
  const std::vector<Case> cases = {
      {{1, 2, "shm"}, 300, 264, 520, 0, 1, true},     // M/R not a multiple of 128
      {{1, 2, "shm"}, 300, 264, 520, 0, 2, false},    // the same, own rows only where tiles straddle
      {{1, 2, "shm"}, 512, 256, 512, 0, 2, false},    // clusters of 2, workspace view only
      {{1, 2, "shm"}, 64, 512, 1024, 0, 1, true},     // decode-sized: one chunk per shard
      {{1, 3, "shm"}, 200, 136, 264, 50, 1, true},    // odd rank count, chunks of 50 rows
      {{2, 1, "shm"}, 257, 256, 512, 0, 1, true},     // two nodes through the proxies
      {{2, 1, "tcp;ofi_rxm"}, 130, 128, 256, 64, 1, true},
      {{2, 2, "shm"}, 130, 128, 256, 0, 1, true},     // rail peers, then NVLink
      {{2, 1, "shm"}, 130, 128, 256, 0, 1, true, 300},  // planned after 300 launches, across nodes
      // Copy-engine pushes (ag_gemm_plan.h note 5): the own chunks by one copy stream per peer.
      {{1, 2, "shm"}, 300, 264, 520, 0, 1, true, 0, true, true},  // and its trace
      {{1, 2, "shm"}, 512, 256, 512, 128, 2, false, 0, true},
      {{1, 3, "shm"}, 200, 136, 264, 50, 1, true, 0, true},
      {{2, 2, "shm"}, 130, 128, 256, 0, 1, true, 0, true},  // forwards stay with the blocks
      {{2, 2, "shm"}, 130, 128, 256, 0, 1, false, 0, false, true},  // the blocks' pushes, traced
      // The adaptive split: the bits at every split (pinned, and the policy's own).
      {{1, 2, "shm"}, 300, 264, 520, 0, 1, true, 0, false, false, true},
      {{1, 2, "shm"}, 512, 256, 512, 0, 2, false, 0, false, false, true},   // clusters of 2
      {{1, 2, "shm"}, 64, 512, 1024, 0, 1, true, 0, false, false, true},    // split-K parts
      {{2, 1, "shm"}, 257, 256, 512, 0, 1, true, 0, false, false, true},    // through the proxies
      // The kernel launched with programmatic dependence on begin_launch's kernel.
      {{1, 2, "shm"}, 300, 264, 520, 0, 1, true, 0, false, false, false, true},
      {{2, 1, "shm"}, 257, 256, 512, 0, 1, true, 0, true, false, false, true},
  };
  // The random family (random_cases.h): shapes nobody chose, from the printed seed.
  std::vector<Case> all = cases;
  fused_test::ShapeDraw draw(g_seed);
  const uint32_t random_cases = fused_test::random_case_count(4);
  for (uint32_t i = 0; i < random_cases; ++i) {
    Case cs;
    cs.topo = fused_test::random_topology(draw);
    cs.m_local = draw.log_uniform(1, 700);
    cs.n_local = draw.log_uniform_multiple(8, 1024, 8);
    cs.k = draw.log_uniform_multiple(16, 1536, 8);
    const uint32_t chunks = 1 + draw.below(8);
    cs.chunk_rows = draw.coin() ? 0 : (cs.m_local + chunks - 1) / chunks;
    cs.cluster_m = draw.coin() ? 2 : 1;
    cs.gathered_out = draw.coin();
    cs.copy_engine = draw.coin();
    cs.adaptive = draw.below(4) == 0;
    cs.pdl = i % 4 == 3;  // not drawn: the family's shapes stay those of its seed
    std::printf("random case %u: %s m_local %u n_local %u k %u chunk_rows %u cluster %d gathered_out %d ce %d adaptive %d"
                " pdl %d\n", i, cs.topo.name().c_str(), cs.m_local, cs.n_local, cs.k, cs.chunk_rows, cs.cluster_m,
                cs.gathered_out, cs.copy_engine, cs.adaptive, cs.pdl ? 1 : 0);
    all.push_back(cs);
  }
  all = fused_test::select_cases(all, "MKERNEL_AG_CASES");  // e.g. "0,9": a subset, for quick runs
  int failures = 0;
  for (const Case& cs : all) failures += run_case(cs);
  failures += run_error_cases();
  failures += run_abort_case();
  if (failures == 0) std::printf("PASS ag_gemm_gpu_test\n");
  return failures == 0 ? 0 : 1;
}
