// split_bench: the adaptive split of a fused kernel's blocks (docs/kernels.md section 16) beside
// every useful static split and the documented default, in one run, on the same inputs:
//   mkernel_static_<c>   the op made with c communication blocks (and the same grid)
//   mkernel_default      the op with the default rule's split
//   mkernel_adaptive     the op with adaptive_split, after --converge launches to find its split
//   mkernel_best_static  the fastest of the static rows (its count in "config"); with finalists
//                        (--finalists N, default 3) the N fastest statics of the sweep are timed
//                        again beside the default and the adaptive, in rounds of their own, and
//                        best_static, default and adaptive are that pass's (the fastest of many
//                        noisy medians is biased low: the winner's curse); the static rows stay
//                        the sweep's
//   mkernel_adaptive_pinned  the adaptive op pinned at the default split: what the adaptive
//                        instantiation's measures cost beside mkernel_default
// for AllGather+GEMM (--kernels ag_gemm; shapes M x N x K, global), ring attention (ring;
// global sequence lengths --seqs, --heads, --dim, masks full / causal) and the fused MoE kernel
// (moe; --tokens per rank, --moe-model hidden,out_hidden,experts,top_k, uniform and Zipf
// routing), on one node (NVLink) or with --nodes every rank its own node (through the proxies
// over --provider, host-staged).
// The static counts are the adaptive policy's candidates plus the default's (for MoE at most 12
// of them, spread: each plan holds its own expert rows).
//
// Ranks are threads of this process, one per GPU; with more ranks than GPUs they share GPU 0 and
// each gets an equal part of its SMs (the grid is then that part: timings are not a
// deployment's, but every split runs on the same part). Every implementation's output is checked
// before timing: AllGather+GEMM's C against cuBLAS on the gathered A, ring attention's O and lse
// and MoE's output against the default split's, bit for bit (the splits move work, never change
// it). Timing:
// warm-up, then --rounds rounds taking turns between the implementations, --iters launches each
// in all, CUDA events on rank 0's stream; medians. A table is printed last; --jsonl appends one
// line per implementation and shape (benchmark "adaptive_split", the kernel in "shape").
//
//   split_bench [--kernels ag_gemm,ring,moe] [--world W] [--nodes] [--provider shm]
//               [--shapes 8192x8192x8192,...] [--seqs 32768] [--masks full,causal] [--heads 32]
//               [--dim 128] [--tokens 4096] [--moe-model 7168,2048,256,8] [--routing uniform,zipf]
//               [--iters 20] [--rounds 4] [--converge 64] [--jsonl FILE] [--commit C] [--machine M]
//               [--trace FILE] [--max-statics N] [--finalists N]
// --max-statics N times N static counts spread over the candidates (both ends kept) besides the
// default's, not every candidate.
// --trace appends one line per rank and launch of the adaptive op (converging, then "timed"):
// launch, rank, communication blocks, the launch's time, the compute role's average wait, when
// each role finished (us), the phase.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <functional>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "attention/attention_test_util.cuh"
#include "fused/moe/moe_plan.h"
#include "fused_harness.h"
#include "gemm/gemm_test_util.cuh"
#include "mkernel/runtime/ops.h"
#include "mkernel/runtime/runtime.h"

namespace rt = mkernel::rt;

namespace {

struct Args {
  std::vector<std::string> kernels = {"ag_gemm", "ring", "moe"};
  uint32_t world = 0;
  bool nodes = false;
  std::string provider = "shm";
  std::vector<std::array<int64_t, 3>> shapes;
  std::vector<uint64_t> seqs = {32768};
  std::vector<std::string> masks = {"full", "causal"};
  uint32_t heads = 32, dim = 128;
  std::vector<uint32_t> tokens = {4096};
  uint32_t moe_hidden = 7168, moe_out = 2048, moe_experts = 256, moe_top_k = 8;
  std::vector<std::string> routings = {"uniform", "zipf"};
  int iters = 20, rounds = 4, converge = 64;
  int finalists = 3;  // the fastest statics re-timed beside the default and the adaptive (0: none)
  size_t max_statics = 0;  // 0: every candidate (MoE: at most 12 whatever is asked)
  std::string jsonl, commit = "unknown", machine = "unknown", trace;
};

std::mutex g_trace_mu;
FILE* g_trace = nullptr;

// Progress on stderr (rank 0), with the seconds since the start: where a slow or stuck run is.
const std::chrono::steady_clock::time_point g_start = std::chrono::steady_clock::now();
void progress(uint32_t rank, const std::string& what) {
  if (rank != 0) return;
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - g_start).count();
  std::fprintf(stderr, "[%7.1f s] %s\n", s, what.c_str());
}

// One line of --trace: a launch of the adaptive op and what its state says of it.
void trace_launch(const std::string& shape, const char* when, int launch, uint32_t rank, const rt::SplitState& t) {
  if (g_trace == nullptr) return;
  std::lock_guard<std::mutex> lock(g_trace_mu);
  std::fprintf(g_trace, "%s launch %s%d rank %u comm %d us %.1f wait %.1f compute_done %.1f comm_done %.1f %s\n",
               shape.c_str(), when, launch, rank, t.last_comm_blocks, t.last_us, t.last_wait_us, t.last_compute_done_us,
               t.last_comm_done_us, t.settled ? "settled" : "exploring");
}

// One shape of one kernel: what rank 0 measured.
struct Row {
  std::string kernel, shape;
  int grid = 0, default_comm = 0;
  std::vector<int> comms;           // static counts, ascending
  std::vector<double> static_ms;    // per count
  double default_ms = 0, adaptive_ms = 0, pinned_ms = 0;
  // The finalists' pass (--finalists): the fastest statics, the default and the adaptive re-timed
  // together; final_ms per count of final_comms.
  std::vector<int> final_comms;
  std::vector<double> final_ms;
  double final_default_ms = 0, final_adaptive_ms = 0;
  int adaptive_comm = 0, settled_after = 0;
  std::string path, state;          // the adaptive split's counts while converging; its state after
  std::string error;
  bool done = false;
};

double median(std::vector<float> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// A fused op behind one interface: launch, and the split state where it has one.
struct Impl {
  std::string name;
  int comm = 0;
  std::function<mkernel::Status()> launch;
  std::function<mkernel::StatusOr<rt::SplitState>()> state;
};

// Converges the adaptive op (launch by launch, reading its state), then times every implementation
// in rounds. Returns false with row->error set on a failure (rank 0) or quietly (others).
bool converge_and_time(uint32_t rank, const Args& args, cudaStream_t stream, const fused_test::RankSync& sync,
                       rt::Communicator& comm, std::vector<Impl>& impls, Impl& adaptive, Row* row) {
  std::string path;
  int settled_after = 0;
  for (int l = 1; l <= args.converge; ++l) {
    const mkernel::Status s = adaptive.launch();
    (void)cudaStreamSynchronize(stream);
    auto st = adaptive.state();
    if (!s.ok() || !st.ok() || !comm.check().ok()) {
      if (rank == 0)
        row->error = "adaptive launch " + std::to_string(l) + ": " + s.to_string() + " " + comm.check().to_string();
      return false;
    }
    path += (path.empty() ? "" : " ") + std::to_string(st.value().last_comm_blocks);
    trace_launch(row->shape, "", l, rank, st.value());
    if (settled_after == 0 && st.value().settled) settled_after = l;
  }
  progress(rank, row->shape + ": converged over " + std::to_string(args.converge) + " launches");
  sync();
  cudaEvent_t e0, e1;
  (void)cudaEventCreate(&e0);
  (void)cudaEventCreate(&e1);
  const int per = std::max(1, args.iters / std::max(1, args.rounds));
  // Rounds taking turns between `which` (indices into impls; impls.size(): the adaptive op);
  // medians into ms[k] for which[k].
  auto timed_rounds = [&](const std::vector<size_t>& which, const char* tag, std::vector<double>* ms) -> bool {
    std::vector<std::vector<float>> times(which.size());
    for (int rd = 0; rd < args.rounds; ++rd)
      for (size_t k = 0; k < which.size(); ++k) {
        const size_t i = which[k];
        Impl& im = i < impls.size() ? impls[i] : adaptive;
        sync();
        for (int it = 0; it < per + (rd == 0 ? 2 : 0); ++it) {  // two untimed warm-ups in the first round
          (void)cudaEventRecord(e0, stream);
          const mkernel::Status s = im.launch();
          (void)cudaEventRecord(e1, stream);
          (void)cudaEventSynchronize(e1);
          if (!s.ok()) {
            if (rank == 0) row->error = im.name + ": " + s.to_string();
            return false;
          }
          float t = 0;
          (void)cudaEventElapsedTime(&t, e0, e1);
          if (rd > 0 || it >= 2) times[k].push_back(t);
          if (i == impls.size() && g_trace != nullptr) {  // the adaptive op while timed: does it move?
            auto st = adaptive.state();
            if (st.ok()) trace_launch(row->shape, tag, static_cast<int>(times[k].size()), rank, st.value());
          }
        }
      }
    ms->clear();
    for (auto& t : times) ms->push_back(median(t));
    return true;
  };
  std::vector<size_t> all;
  for (size_t i = 0; i <= impls.size(); ++i) all.push_back(i);
  std::vector<double> ms;
  bool ok = timed_rounds(all, "timed ", &ms);
  // The finalists: the fastest of many noisy medians is biased low (the winner's curse), so the
  // fastest statics are timed again beside the default and the adaptive, in rounds of their own.
  // Every rank must run the same set: rank 0's choice, shared through a barrier.
  static std::vector<size_t> g_final;
  if (ok && args.finalists > 0) {
    if (rank == 0) {
      std::vector<size_t> st;
      for (size_t i = 0; i < impls.size(); ++i)
        if (impls[i].name.rfind("mkernel_static_", 0) == 0) st.push_back(i);
      std::sort(st.begin(), st.end(), [&](size_t x, size_t y) { return ms[x] < ms[y]; });
      st.resize(std::min(st.size(), static_cast<size_t>(args.finalists)));
      for (size_t i = 0; i < impls.size(); ++i)
        if (impls[i].name == "mkernel_default") st.push_back(i);
      st.push_back(impls.size());
      g_final = st;
    }
    sync();
    const std::vector<size_t> fin = g_final;
    sync();
    std::vector<double> fms;
    ok = timed_rounds(fin, "final ", &fms);
    if (ok && rank == 0)
      for (size_t k = 0; k < fin.size(); ++k) {
        if (fin[k] == impls.size()) row->final_adaptive_ms = fms[k];
        else if (impls[fin[k]].name == "mkernel_default") row->final_default_ms = fms[k];
        else row->final_comms.push_back(impls[fin[k]].comm), row->final_ms.push_back(fms[k]);
      }
  }
  (void)cudaEventDestroy(e0);
  (void)cudaEventDestroy(e1);
  if (!ok) return false;
  if (!comm.check().ok()) {
    if (rank == 0) row->error = comm.check().to_string();
    return false;
  }
  if (rank != 0) return true;
  for (size_t i = 0; i < impls.size(); ++i) {
    if (impls[i].name == "mkernel_default") {
      row->default_ms = ms[i];
    } else if (impls[i].name == "mkernel_adaptive_pinned") {
      row->pinned_ms = ms[i];
    } else {
      row->comms.push_back(impls[i].comm);
      row->static_ms.push_back(ms[i]);
    }
  }
  row->adaptive_ms = ms[impls.size()];
  auto st = adaptive.state();
  row->adaptive_comm = st.ok() ? st.value().last_comm_blocks : -1;
  row->state = st.ok() ? st.value().text : st.status().to_string();
  row->settled_after = settled_after;
  row->path = path;
  return true;
}

// The SMs a rank may use: all of its GPU, or its share when ranks share GPU 0.
int grid_share(const fused_test::Cluster& cluster) {
  const uint32_t R = cluster.topology().world();
  return cluster.shared_gpu() ? static_cast<int>(132 / R) : 0;
}

// One kernel and shape, whatever the op: the adaptive plan, a static plan per count on the same
// grid, the outputs checked, then converge_and_time. `make(adaptive, comm, compute)` makes a plan
// (comm < 0: the op's default split); `check(i)` after launch i of the check pass (0: the default
// split's, the reference) says what is wrong ("" when right); `before` runs before each of those
// launches (poisoning the output).
template <class Op>
struct Sweep {
  std::function<mkernel::StatusOr<std::unique_ptr<Op>>(bool adaptive, int comm, int compute)> make;
  std::function<mkernel::Status(Op&)> launch;
  std::function<void()> before;
  std::function<std::string(size_t i)> check;
  size_t max_statics = 0;  // 0: every candidate
};

template <class Op>
bool run_sweep(uint32_t rank, const Args& args, rt::Communicator& comm, cudaStream_t stream,
               const fused_test::RankSync& sync, const Sweep<Op>& sw, Row* row) {
  auto made = sw.make(true, -1, 0);
  if (!made.ok()) {
    if (rank == 0) row->error = "adaptive plan: " + made.status().to_string();
    return false;
  }
  std::unique_ptr<Op> aop = std::move(made.value());
  auto st0 = aop->split_state();
  if (!st0.ok()) {
    if (rank == 0) row->error = st0.status().to_string();
    return false;
  }
  const int grid = st0.value().grid_blocks, def = st0.value().comm_blocks;
  const std::vector<int>& cand = st0.value().candidates;
  std::vector<int> counts;
  const size_t n = sw.max_statics != 0 ? std::min(sw.max_statics, cand.size()) : cand.size();
  for (size_t i = 0; i < n; ++i) {  // n of them spread over the candidates, both ends kept
    const int c = cand[n == cand.size() || n < 2 ? i : i * (cand.size() - 1) / (n - 1)];
    if (std::find(counts.begin(), counts.end(), c) == counts.end()) counts.push_back(c);
  }
  if (std::find(counts.begin(), counts.end(), def) == counts.end()) counts.push_back(def);
  std::sort(counts.begin(), counts.end());
  std::vector<std::unique_ptr<Op>> ops;
  std::vector<Impl> impls;
  auto add_static = [&](int comm_blocks, const std::string& name) -> bool {
    auto m = sw.make(false, comm_blocks, grid - comm_blocks);
    if (!m.ok()) {
      if (rank == 0) row->error = name + ": " + m.status().to_string();
      return false;
    }
    ops.push_back(std::move(m.value()));
    Op* op = ops.back().get();
    impls.push_back({name, comm_blocks, [op, &sw] { return sw.launch(*op); }, nullptr});
    return true;
  };
  if (!add_static(def, "mkernel_default")) return false;
  // The adaptive instantiation held at the default split (pinned below, once every rank has made
  // every plan: pinning copies to the device, which must not wait on a rank's agreement launch).
  Op* pinned_op = nullptr;
  {
    auto m = sw.make(true, -1, 0);
    if (!m.ok()) {
      if (rank == 0) row->error = "mkernel_adaptive_pinned: " + m.status().to_string();
      return false;
    }
    ops.push_back(std::move(m.value()));
    pinned_op = ops.back().get();
    impls.push_back({"mkernel_adaptive_pinned", def, [pinned_op, &sw] { return sw.launch(*pinned_op); }, nullptr});
  }
  for (int cnt : counts)
    if (!add_static(cnt, "mkernel_static_" + std::to_string(cnt))) return false;
  Impl adaptive{"mkernel_adaptive", def, [&] { return sw.launch(*aop); }, [&] { return aop->split_state(); }};
  sync();
  if (const mkernel::Status ps = pinned_op->pin_split(def); !ps.ok()) {
    if (rank == 0) row->error = "mkernel_adaptive_pinned: " + ps.to_string();
    return false;
  }
  progress(rank, row->shape + ": " + std::to_string(impls.size() + 1) + " plans made");
  bool good = true;
  for (size_t i = 0; i <= impls.size() && good; ++i) {
    Impl& im = i < impls.size() ? impls[i] : adaptive;
    sync();
    if (sw.before) sw.before();
    const mkernel::Status ls = im.launch();
    (void)cudaStreamSynchronize(stream);
    const std::string wrong = ls.ok() ? sw.check(i) : "";
    if (!ls.ok() || !wrong.empty() || !comm.check().ok()) {
      if (rank == 0) row->error = im.name + ": " + wrong + (wrong.empty() ? "" : "; ") + ls.to_string() + "; " +
                                  comm.check().to_string();
      good = false;
    }
  }
  progress(rank, row->shape + (good ? ": outputs checked" : ": a check failed"));
  const bool ok = good && converge_and_time(rank, args, stream, sync, comm, impls, adaptive, row);
  progress(rank, row->shape + (ok ? ": converged and timed" : ": failed"));
  if (rank == 0) {
    row->grid = grid;
    row->default_comm = def;
  }
  sync();  // nobody frees (a device-wide synchronisation) while another rank's kernel runs
  return ok;
}

bool run_ag(uint32_t rank, const Args& args, const fused_test::Cluster& cluster, rt::Communicator& comm,
            cudaStream_t stream, const fused_test::RankSync& sync, const std::array<int64_t, 3>& shape, Row* row) {
  const uint32_t W = cluster.topology().world();
  const int64_t M = shape[0], N = shape[1], K = shape[2];
  const uint64_t m_local = M / W, n_local = N / W;
  __nv_bfloat16 *a, *w, *c, *g, *c_ref;
  if (cudaMalloc(&a, m_local * K * 2) || cudaMalloc(&w, n_local * K * 2) || cudaMalloc(&c, M * n_local * 2) ||
      cudaMalloc(&g, M * K * 2) || cudaMalloc(&c_ref, M * n_local * 2)) {
    if (rank == 0) row->error = "cudaMalloc failed";
    return false;
  }
  gemm_test::fill_random(a, m_local * K, 1000 + rank, 1.0f, stream);
  gemm_test::fill_random(w, n_local * K, 2000 + rank, 1.0f, stream);
  (void)cudaStreamSynchronize(stream);
  sync();
  const int share = grid_share(cluster);
  std::vector<float> want;
  cublasHandle_t blas;
  cublasCreate(&blas);
  cublasSetStream(blas, stream);
  Sweep<rt::AllGatherGemm> sw;
  sw.make = [&](bool adaptive, int comm_blocks, int compute) {
    rt::AllGatherGemmConfig cfg;
    cfg.adaptive_split = adaptive;
    if (comm_blocks >= 0) {
      cfg.comm_blocks = comm_blocks;
      cfg.gemm_blocks = compute;
    } else if (share != 0) {  // ranks sharing a GPU: each its part of the SMs
      cfg.comm_blocks = 4;
      cfg.gemm_blocks = share - cfg.comm_blocks;
    }
    return rt::AllGatherGemm::create(comm, m_local, n_local, K, cfg, stream);
  };
  sw.launch = [&](rt::AllGatherGemm& op) { return op.launch(a, w, c, nullptr, stream); };
  sw.max_statics = args.max_statics;
  sw.before = [&] { gemm_test::poison(c, M * n_local, stream); };
  // The reference first: the gathered A from an op's gathered output, cuBLAS on it.
  {
    auto ref_op = sw.make(false, -1, 0);
    if (!ref_op.ok()) {
      if (rank == 0) row->error = "reference plan: " + ref_op.status().to_string();
      return false;
    }
    sync();
    const mkernel::Status s = ref_op.value()->launch(a, w, c, g, stream);
    const float alpha = 1.f, beta = 0.f;
    cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n_local), static_cast<int>(M), static_cast<int>(K),
                 &alpha, w, CUDA_R_16BF, static_cast<int>(K), g, CUDA_R_16BF, static_cast<int>(K), &beta, c_ref,
                 CUDA_R_16BF, static_cast<int>(n_local), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    (void)cudaStreamSynchronize(stream);
    if (!s.ok() || !comm.check().ok()) {
      if (rank == 0) row->error = "reference launch: " + s.to_string() + "; " + comm.check().to_string();
      return false;
    }
    want = gemm_test::to_host_float(c_ref, M * n_local);
    sync();
  }
  sw.check = [&](size_t) -> std::string {
    const double e = gemm_test::compare(gemm_test::to_host_float(c, M * n_local), want).rel_fro;
    return e < 1e-2 ? "" : "rel err vs cuBLAS on the gathered A " + std::to_string(e);
  };
  const bool ok = run_sweep(rank, args, comm, stream, sync, sw, row);
  cublasDestroy(blas);
  for (void* p : {static_cast<void*>(a), static_cast<void*>(w), static_cast<void*>(c), static_cast<void*>(g),
                  static_cast<void*>(c_ref)})
    (void)cudaFree(p);
  return ok;
}

bool run_ring(uint32_t rank, const Args& args, const fused_test::Cluster& cluster, rt::Communicator& comm,
              cudaStream_t stream, const fused_test::RankSync& sync, uint64_t S, const std::string& mask, Row* row) {
  const uint32_t R = cluster.topology().world();
  rt::RingAttentionShape sh;
  sh.heads_q = args.heads;
  sh.heads_kv = args.heads;
  sh.head_dim = args.dim;
  sh.s_local = S / R;
  sh.placement = mask == "full" ? rt::RingPlacement::kNonCausal : rt::RingPlacement::kCausalZigzag;
  const uint64_t q_elems = uint64_t{sh.heads_q} * sh.s_local * sh.head_dim;
  const uint64_t lse_elems = uint64_t{sh.heads_q} * sh.s_local;
  __nv_bfloat16 *q, *k, *v, *o;
  float* lse;
  if (cudaMalloc(&q, q_elems * 2) || cudaMalloc(&k, q_elems * 2) || cudaMalloc(&v, q_elems * 2) ||
      cudaMalloc(&o, q_elems * 2) || cudaMalloc(&lse, lse_elems * 4)) {
    if (rank == 0) row->error = "cudaMalloc failed";
    return false;
  }
  attn_test::fill_random(q, q_elems, 11 + rank, 1.0f, stream);
  attn_test::fill_random(k, q_elems, 23 + rank, 1.0f, stream);
  attn_test::fill_random(v, q_elems, 37 + rank, 1.0f, stream);
  (void)cudaStreamSynchronize(stream);
  sync();
  const int share = grid_share(cluster);
  std::vector<uint16_t> o_ref, o_now(q_elems);
  std::vector<float> l_ref, l_now(lse_elems);
  Sweep<rt::RingAttention> sw;
  sw.make = [&](bool adaptive, int comm_blocks, int compute) {
    rt::RingAttentionConfig cfg;
    cfg.adaptive_split = adaptive;
    if (comm_blocks >= 0) {
      cfg.comm_blocks = comm_blocks;
      cfg.attn_blocks = compute;
    } else if (share != 0) {
      cfg.comm_blocks = 2;
      cfg.attn_blocks = share - cfg.comm_blocks;
    }
    return rt::RingAttention::create(comm, sh, cfg, stream);
  };
  sw.launch = [&](rt::RingAttention& op) { return op.launch(q, k, v, o, lse, stream); };
  sw.max_statics = args.max_statics;
  // Every split gives the default split's O and lse, bit for bit.
  sw.check = [&](size_t i) -> std::string {
    (void)cudaMemcpy(o_now.data(), o, q_elems * 2, cudaMemcpyDeviceToHost);
    (void)cudaMemcpy(l_now.data(), lse, lse_elems * 4, cudaMemcpyDeviceToHost);
    if (i == 0) {
      o_ref = o_now;
      l_ref = l_now;
      size_t bad = 0;
      for (float x : l_ref) bad += !std::isfinite(x);
      return bad == 0 ? "" : std::to_string(bad) + " non-finite lse values at the default split";
    }
    const bool same = o_now == o_ref && std::memcmp(l_now.data(), l_ref.data(), lse_elems * 4) == 0;
    return same ? "" : "O or lse differ from the default split's";
  };
  const bool ok = run_sweep(rank, args, comm, stream, sync, sw, row);
  for (void* p : {static_cast<void*>(q), static_cast<void*>(k), static_cast<void*>(v), static_cast<void*>(o),
                  static_cast<void*>(lse)})
    (void)cudaFree(p);
  return ok;
}

bool run_moe(uint32_t rank, const Args& args, const fused_test::Cluster& cluster, rt::Communicator& comm,
             cudaStream_t stream, const fused_test::RankSync& sync, uint32_t T, const std::string& routing, Row* row) {
  const uint32_t R = cluster.topology().world();
  const uint32_t H = args.moe_hidden, N = args.moe_out, E = args.moe_experts, k = args.moe_top_k, epr = E / R;
  __nv_bfloat16 *x, *w, *out;
  int32_t* ch;
  float* sc;
  if (cudaMalloc(&x, 2ull * T * H) || cudaMalloc(&w, 2ull * epr * N * H) || cudaMalloc(&out, 2ull * T * N) ||
      cudaMalloc(&ch, 4ull * T * k) || cudaMalloc(&sc, 4ull * T * k)) {
    if (rank == 0) row->error = "cudaMalloc failed";
    return false;
  }
  gemm_test::fill_random(x, uint64_t{T} * H, 100 + rank, 1.0f, stream);
  gemm_test::fill_random(w, uint64_t{epr} * N * H, 900 + rank, 0.05f, stream);
  const auto choices = mkernel::kernels::moe_make_routing(
      routing == "zipf" ? mkernel::kernels::MoeRouteKind::kZipf : mkernel::kernels::MoeRouteKind::kUniform, T, E, k, R,
      rank, 4242 + T);
  std::vector<float> scores(size_t{T} * k);
  for (size_t i = 0; i < scores.size(); ++i) scores[i] = 0.05f + 0.2f * static_cast<float>((i * 2654435761u) % 1000) / 1000.0f;
  (void)cudaMemcpy(ch, choices.data(), choices.size() * 4, cudaMemcpyHostToDevice);
  (void)cudaMemcpy(sc, scores.data(), scores.size() * 4, cudaMemcpyHostToDevice);
  (void)cudaStreamSynchronize(stream);
  sync();
  const int share = grid_share(cluster);
  std::vector<uint16_t> ref, now(size_t{T} * N);
  Sweep<rt::MoeDispatchCombine> sw;
  sw.make = [&](bool adaptive, int comm_blocks, int compute) {
    rt::MoeConfig cfg;
    cfg.fused = true;
    cfg.adaptive_split = adaptive;
    if (share != 0) cfg.cluster_m = 1;
    if (comm_blocks >= 0) {
      cfg.blocks = comm_blocks;
      cfg.gemm_blocks = compute;
    } else if (share != 0) {
      cfg.blocks = 8;
      cfg.gemm_blocks = share - cfg.blocks;
    }
    return rt::MoeDispatchCombine::create(comm, T, H, N, E, k, cfg, stream);
  };
  sw.launch = [&](rt::MoeDispatchCombine& op) { return op.forward(x, ch, sc, w, out, stream); };
  sw.before = [&] { gemm_test::poison(out, uint64_t{T} * N, stream); };
  // Every split gives the default split's output, bit for bit.
  sw.check = [&](size_t i) -> std::string {
    (void)cudaMemcpy(now.data(), out, now.size() * 2, cudaMemcpyDeviceToHost);
    if (i == 0) {
      ref = now;
      return "";
    }
    return now == ref ? "" : "the output differs from the default split's";
  };
  // Each plan holds its own expert rows and outputs (rows_capacity x (H + N) x 2 bytes, over a
  // GiB at T = 4096 with the default capacity): at most 12 static counts.
  sw.max_statics = args.max_statics != 0 ? std::min<size_t>(args.max_statics, 12) : 12;
  const bool ok = run_sweep(rank, args, comm, stream, sync, sw, row);
  for (void* p : {static_cast<void*>(x), static_cast<void*>(w), static_cast<void*>(out), static_cast<void*>(ch),
                  static_cast<void*>(sc)})
    (void)cudaFree(p);
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // a run cut off by a timeout keeps what it printed
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--kernels") args.kernels = mkt::split_commas(next());
    else if (a == "--world") args.world = static_cast<uint32_t>(std::atoi(next().c_str()));
    else if (a == "--nodes") args.nodes = true;
    else if (a == "--provider") args.provider = next();
    else if (a == "--shapes") {
      for (const std::string& s : mkt::split_commas(next())) {
        std::array<int64_t, 3> sh{};
        if (std::sscanf(s.c_str(), "%ldx%ldx%ld", &sh[0], &sh[1], &sh[2]) != 3) {
          std::printf("split_bench: --shapes: \"%s\" is not MxNxK\n", s.c_str());
          return 2;
        }
        args.shapes.push_back(sh);
      }
    } else if (a == "--seqs") {
      args.seqs.clear();
      for (const auto& s : mkt::split_commas(next())) args.seqs.push_back(std::stoull(s));
    } else if (a == "--masks") args.masks = mkt::split_commas(next());
    else if (a == "--heads") args.heads = static_cast<uint32_t>(std::atoi(next().c_str()));
    else if (a == "--dim") args.dim = static_cast<uint32_t>(std::atoi(next().c_str()));
    else if (a == "--tokens") {
      args.tokens.clear();
      for (const auto& t : mkt::split_commas(next())) args.tokens.push_back(static_cast<uint32_t>(std::stoul(t)));
    } else if (a == "--moe-model") {
      const auto v = mkt::split_commas(next());
      if (v.size() != 4) {
        std::printf("split_bench: --moe-model wants hidden,out_hidden,experts,top_k\n");
        return 2;
      }
      args.moe_hidden = static_cast<uint32_t>(std::stoul(v[0]));
      args.moe_out = static_cast<uint32_t>(std::stoul(v[1]));
      args.moe_experts = static_cast<uint32_t>(std::stoul(v[2]));
      args.moe_top_k = static_cast<uint32_t>(std::stoul(v[3]));
    } else if (a == "--routing") args.routings = mkt::split_commas(next());
    else if (a == "--iters") args.iters = std::atoi(next().c_str());
    else if (a == "--rounds") args.rounds = std::atoi(next().c_str());
    else if (a == "--converge") args.converge = std::atoi(next().c_str());
    else if (a == "--finalists") args.finalists = std::atoi(next().c_str());
    else if (a == "--max-statics") args.max_statics = static_cast<size_t>(std::atoi(next().c_str()));
    else if (a == "--trace") args.trace = next();
    else if (a == "--jsonl") args.jsonl = next();
    else if (a == "--commit") args.commit = next();
    else if (a == "--machine") args.machine = next();
    else {
      std::printf("split_bench: unknown argument \"%s\" (see the top of bench/fused/split_bench.cu)\n", a.c_str());
      return 2;
    }
  }
  for (const std::string& m : args.masks)
    if (m != "full" && m != "causal") {
      std::printf("split_bench: --masks: \"%s\" is neither full nor causal\n", m.c_str());
      return 2;
    }
  if (!args.trace.empty() && (g_trace = std::fopen(args.trace.c_str(), "a")) == nullptr) {
    std::printf("split_bench: --trace: cannot open \"%s\" for appending: %s\n", args.trace.c_str(), std::strerror(errno));
    return 2;
  }
  ::setenv("CUDA_MODULE_LOADING", "EAGER", 1);  // no module load while a rank's kernel waits for another
  ::setenv("NCCL_NVLS_ENABLE", "0", 1);
  mkt::require_gpus_or_skip("split_bench", 1);
  int gpus = 0;
  (void)cudaGetDeviceCount(&gpus);
  const uint32_t R = args.world != 0 ? args.world : static_cast<uint32_t>(std::max(2, gpus));
  if (R < 2) {
    std::printf("split_bench: --world %u: a split needs at least two ranks\n", R);
    return 2;
  }
  if (args.shapes.empty()) args.shapes = {{4096, 8192, 8192}, {8192, 8192, 8192}, {16384, 14336, 4096}};
  fused_test::Topology topo{args.nodes ? R : 1, args.nodes ? 1 : R, args.provider};
  fused_test::Cluster cluster(topo, "splitbench");
  if (!cluster.start()) return 1;
  progress(0, "daemons started");
  if (cluster.shared_gpu())
    std::printf("note: %u ranks share GPU 0, %d SMs each: timings compare the splits, not a deployment\n", R,
                132 / static_cast<int>(R));

  std::vector<Row> rows;
  uint64_t nvl = 1 << 20, net = 0;
  uint32_t moe_flags = 0;
  for (const std::string& kname : args.kernels) {
    if (kname == "ag_gemm") {
      for (const auto& s : args.shapes) {
        if (s[0] % R != 0 || s[1] % (8 * R) != 0 || s[2] % 8 != 0) {
          std::printf("split_bench: shape %ldx%ldx%ld does not split over %u ranks\n", s[0], s[1], s[2], R);
          return 2;
        }
        Row r;
        r.kernel = "ag_gemm";
        r.shape = std::to_string(s[0]) + "x" + std::to_string(s[1]) + "x" + std::to_string(s[2]);
        rows.push_back(r);
        nvl = std::max(nvl, rt::all_gather_gemm_nvlink_bytes(R, s[0] / R, s[2]));
        if (args.nodes) net = std::max(net, rt::all_gather_gemm_network_bytes(R, s[0] / R, s[2]));
      }
    } else if (kname == "ring") {
      for (uint64_t S : args.seqs)
        for (const std::string& m : args.masks) {
          if (S % (2ull * R) != 0) {
            std::printf("split_bench: S = %llu is not a multiple of 2 x world\n", static_cast<unsigned long long>(S));
            return 2;
          }
          Row r;
          r.kernel = "ring_attention";
          r.shape = "S=" + std::to_string(S) + " H=" + std::to_string(args.heads) + " D=" + std::to_string(args.dim) +
                    " " + m;
          rows.push_back(r);
          rt::RingAttentionShape sh;
          sh.heads_q = sh.heads_kv = args.heads;
          sh.head_dim = args.dim;
          sh.s_local = S / R;
          nvl = std::max(nvl, rt::ring_attention_nvlink_bytes(topo.nodes, topo.gpus, sh));
          if (args.nodes) net = std::max(net, rt::ring_attention_network_bytes(topo.nodes, sh));
        }
    } else if (kname == "moe") {
      if (args.moe_experts % R != 0) {
        std::printf("split_bench: --moe-model: %u experts do not split over %u ranks\n", args.moe_experts, R);
        return 2;
      }
      for (uint32_t T : args.tokens)
        for (const std::string& rt_kind : args.routings) {
          if (rt_kind != "uniform" && rt_kind != "zipf") {
            std::printf("split_bench: --routing: \"%s\" is neither uniform nor zipf\n", rt_kind.c_str());
            return 2;
          }
          Row r;
          r.kernel = "moe_fused";
          r.shape = "T=" + std::to_string(T) + " H=" + std::to_string(args.moe_hidden) + " N=" +
                    std::to_string(args.moe_out) + " E=" + std::to_string(args.moe_experts) + " k=" +
                    std::to_string(args.moe_top_k) + " " + rt_kind;
          rows.push_back(r);
          rt::MoeConfig mc;
          mc.fused = true;
          nvl = std::max(nvl, rt::moe_nvlink_bytes(topo.nodes, topo.gpus, T, args.moe_hidden, args.moe_out,
                                                   args.moe_experts, args.moe_top_k, mc));
          if (args.nodes)
            net = std::max(net, rt::moe_network_bytes(topo.nodes, topo.gpus, T, args.moe_hidden, args.moe_out,
                                                      args.moe_experts, args.moe_top_k, mc));
          moe_flags = std::max(moe_flags, rt::moe_fused_flags(topo.nodes, topo.gpus, T, args.moe_experts, args.moe_top_k, mc) + 64);
        }
    } else {
      std::printf("split_bench: --kernels: \"%s\" is not ag_gemm, ring or moe\n", kname.c_str());
      return 2;
    }
  }
  rt::Options o;
  o.nvlink_bytes = nvl;
  o.network_workspace_bytes = net;
  o.fused_flags = std::max<uint32_t>({4096u, rt::ring_attention_fused_flags(topo.nodes, topo.gpus), moe_flags});
  o.device_wait_timeout_ns = 20'000'000'000ull;
  o.rendezvous_timeout = std::chrono::milliseconds(120000);

  const int failed = fused_test::run_ranks_in_threads(
      cluster, o, {4096},
      [&](uint32_t rank, rt::Communicator& comm, cudaStream_t stream, const fused_test::RankSync& sync) {
        progress(rank, "communicators made");
        size_t ri = 0;
        for (const std::string& kname : args.kernels) {
          if (kname == "ag_gemm") {
            for (const auto& s : args.shapes) {
              Row* row = &rows[ri++];
              if (!run_ag(rank, args, cluster, comm, stream, sync, s, row)) return 1;
              if (rank == 0) row->done = true;
            }
          } else if (kname == "ring") {
            for (uint64_t S : args.seqs)
              for (const std::string& m : args.masks) {
                Row* row = &rows[ri++];
                if (!run_ring(rank, args, cluster, comm, stream, sync, S, m, row)) return 1;
                if (rank == 0) row->done = true;
              }
          } else {
            for (uint32_t T : args.tokens)
              for (const std::string& rk : args.routings) {
                Row* row = &rows[ri++];
                if (!run_moe(rank, args, cluster, comm, stream, sync, T, rk, row)) return 1;
                if (rank == 0) row->done = true;
              }
          }
        }
        return 0;
      });
  for (const Row& r : rows)
    if (!r.error.empty()) std::printf("split_bench: %s %s: %s\n", r.kernel.c_str(), r.shape.c_str(), r.error.c_str());
  if (failed != 0) {
    std::printf("split_bench: %d rank(s) failed (the causes are above)\n", failed);
    return 1;
  }

  char date[16];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y-%m-%d", std::gmtime(&now));
  FILE* jl = args.jsonl.empty() ? nullptr : std::fopen(args.jsonl.c_str(), "a");
  const std::string path_name = args.nodes ? "proxies over " + args.provider + " (host-staged)" : "nvlink";
  std::printf("\nsplit_bench: world %u, %s, %s, commit %s%s\n", R, path_name.c_str(), args.machine.c_str(),
              args.commit.c_str(), cluster.shared_gpu() ? ", ranks share GPU 0" : "");
  std::printf("%-15s %-26s %5s %12s %16s %18s %9s %9s\n", "kernel", "shape", "grid", "default ms", "best static ms",
              "adaptive ms (comm)", "vs best", "vs def");
  std::vector<double> vs_best, vs_def;
  for (const Row& r : rows) {
    if (!r.done) continue;
    size_t b = 0;
    for (size_t i = 1; i < r.static_ms.size(); ++i)
      if (r.static_ms[i] < r.static_ms[b]) b = i;
    const double sweep_best = r.static_ms.empty() ? 0 : r.static_ms[b];
    const int sweep_best_comm = r.comms.empty() ? 0 : r.comms[b];
    // With finalists the comparison is theirs (the same rounds for all three); else the sweep's.
    const bool fin = !r.final_ms.empty();
    size_t fb = 0;
    for (size_t i = 1; i < r.final_ms.size(); ++i)
      if (r.final_ms[i] < r.final_ms[fb]) fb = i;
    const double best = fin ? r.final_ms[fb] : sweep_best;
    const int best_comm = fin ? r.final_comms[fb] : sweep_best_comm;
    const double def_ms = fin ? r.final_default_ms : r.default_ms;
    const double ad_ms = fin ? r.final_adaptive_ms : r.adaptive_ms;
    char best_s[32], ad_s[32];
    std::snprintf(best_s, sizeof(best_s), "%.4f (%d)", best, best_comm);
    std::snprintf(ad_s, sizeof(ad_s), "%.4f (%d)", ad_ms, r.adaptive_comm);
    std::printf("%-15s %-26s %5d %7.4f (%d) %16s %18s %9.3f %9.3f\n", r.kernel.c_str(), r.shape.c_str(), r.grid,
                def_ms, r.default_comm, best_s, ad_s, best / ad_ms, def_ms / ad_ms);
    std::printf("    settled after %d launches; splits while converging: %s\n    %s\n", r.settled_after,
                r.path.c_str(), r.state.c_str());
    std::string sweep;
    for (size_t i = 0; i < r.comms.size(); ++i) {
      char t[48];
      std::snprintf(t, sizeof(t), " %d:%.4f", r.comms[i], r.static_ms[i]);
      sweep += t;
    }
    std::printf("    sweep: default %.4f, adaptive %.4f, statics%s\n", r.default_ms, r.adaptive_ms, sweep.c_str());
    if (fin) {
      std::string f;
      for (size_t i = 0; i < r.final_comms.size(); ++i) {
        char t[48];
        std::snprintf(t, sizeof(t), " %d:%.4f", r.final_comms[i], r.final_ms[i]);
        f += t;
      }
      std::printf("    finalists re-timed: default %.4f, adaptive %.4f, statics%s (sweep's best %.4f at %d)\n", def_ms,
                  ad_ms, f.c_str(), sweep_best, sweep_best_comm);
    }
    std::printf("    adaptive pinned at the default split: %.4f ms (%.3f of the default)\n", r.pinned_ms,
                r.pinned_ms > 0 ? r.default_ms / r.pinned_ms : 0.0);
    vs_best.push_back(best / ad_ms);
    vs_def.push_back(def_ms / ad_ms);
    if (jl == nullptr) continue;
    auto line = [&](const std::string& impl, double ms, const std::string& config) {
      std::fprintf(jl,
                   "{\"benchmark\": \"adaptive_split\", \"shape\": \"%s %s\", \"world\": %u, \"nodes\": %u, \"path\": "
                   "\"%s\", \"impl\": \"%s\", \"median_ms\": %.4f, \"iters\": %d, \"grid\": %d, \"config\": \"%s\", "
                   "\"machine\": \"%s\", \"commit\": \"%s\", \"date\": \"%s\"%s}\n",
                   r.kernel.c_str(), r.shape.c_str(), R, args.nodes ? R : 1, path_name.c_str(), impl.c_str(), ms,
                   args.iters, r.grid, config.c_str(), args.machine.c_str(), args.commit.c_str(), date,
                   cluster.shared_gpu() ? ", \"note\": \"ranks share one GPU\"" : "");
    };
    for (size_t i = 0; i < r.comms.size(); ++i)
      line("mkernel_static_" + std::to_string(r.comms[i]), r.static_ms[i], "comm " + std::to_string(r.comms[i]));
    const std::string how = fin ? ", finalists re-timed (" + std::to_string(r.final_ms.size()) + " fastest statics)" : "";
    line("mkernel_best_static", best, "comm " + std::to_string(best_comm) + how);
    line("mkernel_default", def_ms, "comm " + std::to_string(r.default_comm) + how);
    line("mkernel_adaptive_pinned", r.pinned_ms, "comm " + std::to_string(r.default_comm) + ", pinned");
    line("mkernel_adaptive", ad_ms,
         "comm " + std::to_string(r.adaptive_comm) + ", settled after " + std::to_string(r.settled_after) + " launches" +
             how);
  }
  if (jl != nullptr) std::fclose(jl);
  if (g_trace != nullptr) std::fclose(g_trace);
  double gd = 0, worst = 1e9;
  for (double x : vs_best) worst = std::min(worst, x);
  for (double x : vs_def) gd += std::log(x);
  if (!vs_best.empty())
    std::printf("adaptive / best static: worst %.3f (goal >= 0.97); over the default: geometric mean %.3fx (goal >= 1.1)\n",
                worst, std::exp(gd / vs_def.size()));
  return 0;
}
