// AllGather+GEMM (its pushes by the blocks, then by the copy engines) and GEMM+ReduceScatter,
// each with a peer process killed mid-launch: two ranks as two processes on one mkerneld (one
// node; on two GPUs when there are two, else both on GPU 0). Both plan the op; rank 0 launches;
// rank 1 is killed before it sends its rows. Rank 0's kernel must end within the documented
// bound (Options::device_wait_timeout_ns, here 2 s, plus the time the last wait had started
// before) and Communicator::check() must name the rank, the step and the cause; with copy-engine
// pushes its copy stream must end too (the kernel opened its gate), or the stream would hang.
// With two GPUs a first launch by both ranks must succeed (the ranks' kernels run side by side;
// on one shared GPU two processes' kernels only take turns, so that part needs two GPUs).
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <cstdio>
#include <string>
#include <thread>

#include "mkernel/runtime/ops.h"
#include "mkernel/runtime/runtime.h"
#include "runtime_gpu_util.h"

namespace rt = mkernel::rt;

namespace {

constexpr uint64_t kBoundNs = 2'000'000'000ull;
constexpr uint32_t kMLocal = 256, kN = 256, kK = 512;

bool write_byte(int fd, char c) { return ::write(fd, &c, 1) == 1; }
bool read_byte(int fd, char* c, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    const ssize_t n = ::read(fd, c, 1);
    if (n == 1) return true;
    if (n == 0) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

enum class Op { kAllGatherGemm, kAllGatherGemmCopyEngine, kGemmReduceScatter };

const char* op_name(Op which) {
  switch (which) {
    case Op::kAllGatherGemm: return "all_gather_gemm";
    case Op::kAllGatherGemmCopyEngine: return "all_gather_gemm, copy-engine pushes";
    case Op::kGemmReduceScatter: return "gemm_reduce_scatter";
  }
  return "?";
}

// The op under test behind one launch call (A [M, k] for GEMM+ReduceScatter, its rows otherwise).
struct AnyOp {
  std::unique_ptr<rt::AllGatherGemm> ag;
  std::unique_ptr<rt::GemmReduceScatter> rs;
  mkernel::Status launch(const void* a, const void* w, void* c, cudaStream_t s) {
    return ag ? ag->launch(a, w, c, nullptr, s) : rs->launch(a, w, c, s);
  }
};

// Rank main: 0 on success. to_parent gets 'r' when planned (and, for rank 0, 'l' once launched).
int rank_main(Op which, uint32_t rank, int device, const rt::UniqueId& id, const std::string& socket, int to_parent,
              int from_parent, bool both_launch_first) {
  if (cudaSetDevice(device) != cudaSuccess) return 2;
  rt::Options o;
  o.socket_path = socket;
  o.cuda_device = device;
  o.nvlink_bytes = std::max(rt::all_gather_gemm_nvlink_bytes(2, kMLocal, kK),
                            rt::gemm_reduce_scatter_nvlink_bytes(1, 2, kMLocal, kN));
  o.device_wait_timeout_ns = kBoundNs;
  auto comm = rt::Communicator::create(rank, 2, id, {4096}, o);
  if (!comm.ok()) {
    std::printf("FAIL rank %u create: %s\n", rank, comm.status().to_string().c_str());
    return 3;
  }
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  AnyOp op;
  mkernel::Status planned;
  if (which != Op::kGemmReduceScatter) {
    rt::AllGatherGemmConfig cfg;
    cfg.copy_engine_pushes = which == Op::kAllGatherGemmCopyEngine;
    auto made = rt::AllGatherGemm::create(*comm.value(), kMLocal, kN, kK, cfg, stream);
    planned = made.status();
    if (made.ok()) op.ag = std::move(made.value());
  } else {
    auto made = rt::GemmReduceScatter::create(*comm.value(), kMLocal, kN, kK, {}, stream);
    planned = made.status();
    if (made.ok()) op.rs = std::move(made.value());
  }
  if (!planned.ok()) {
    std::printf("FAIL rank %u plan: %s\n", rank, planned.to_string().c_str());
    return 4;
  }
  __nv_bfloat16 *a = nullptr, *w = nullptr, *c = nullptr;
  cudaMalloc(&a, sizeof(__nv_bfloat16) * 2 * kMLocal * kK);
  cudaMalloc(&w, sizeof(__nv_bfloat16) * kN * kK);
  cudaMalloc(&c, sizeof(__nv_bfloat16) * 2 * kMLocal * kN);
  cudaMemset(a, 0x3c, sizeof(__nv_bfloat16) * 2 * kMLocal * kK);
  cudaMemset(w, 0x3c, sizeof(__nv_bfloat16) * kN * kK);
  if (both_launch_first) {
    const mkernel::Status s = op.launch(a, w, c, stream);
    cudaStreamSynchronize(stream);
    const mkernel::Status chk = comm.value()->check();
    if (!s.ok() || !chk.ok()) {
      std::printf("FAIL rank %u first launch: %s / %s\n", rank, s.to_string().c_str(), chk.to_string().c_str());
      return 5;
    }
  }
  write_byte(to_parent, 'r');
  if (rank == 1) {
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));  // until killed
  }
  char go = 0;
  if (!read_byte(from_parent, &go, 60000)) return 6;
  const auto t0 = std::chrono::steady_clock::now();
  const mkernel::Status s = op.launch(a, w, c, stream);
  write_byte(to_parent, 'l');
  const cudaError_t sync = cudaStreamSynchronize(stream);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const mkernel::Status why = comm.value()->check();
  int fails = 0;
  auto expect = [&](bool ok, const std::string& what) {
    if (!ok) {
      std::printf("FAIL rank 0: %s\n", what.c_str());
      ++fails;
    }
  };
  expect(s.ok(), "the launch itself should be accepted: " + s.to_string());
  expect(sync == cudaSuccess, std::string("the stream should end cleanly (no trap): ") + cudaGetErrorString(sync));
  expect(!why.ok(), "check() should report the failure");
  expect(why.message().find("rank 0") != std::string::npos, "check() names the rank: " + why.to_string());
  expect(why.message().find("a wait expired") != std::string::npos, "check() names the cause: " + why.to_string());
  expect(why.message().find("launch") != std::string::npos, "check() names the launch: " + why.to_string());
  expect(ms < (kBoundNs / 1e6) * 2 + 1000, "ended " + std::to_string(ms) + " ms after the launch; bound " +
                                               std::to_string(kBoundNs / 1000000) + " ms per wait");
  std::printf("rank 0 (%s): peer killed mid-launch; the kernel ended %.0f ms after the launch (bound %llu ms); check(): %s\n",
              op_name(which), ms,
              static_cast<unsigned long long>(kBoundNs / 1000000), why.to_string().c_str());
  // The communicator stays failed: the next launch's waits end at once.
  return fails;
}

}  // namespace

int run_op(Op which) {
  const bool two_gpus = mkt::driver_gpu_count() >= 2;
  mkt::Daemon d(mkt::temp_dir("agkill"), mkt::daemon_yaml("shm", two_gpus ? "0, 1" : "0"));
  if (!d.start()) return 1;
  rt::Options o;
  o.socket_path = d.socket();
  o.proxy = 0;
  auto id = rt::get_unique_id(o);
  if (!id.ok()) {
    std::printf("FAIL get_unique_id: %s\n", id.status().to_string().c_str());
    return 1;
  }
  int up[2][2], down[2];
  if (::pipe(up[0]) != 0 || ::pipe(up[1]) != 0 || ::pipe(down) != 0) return 1;
  pid_t kids[2];
  for (uint32_t r = 0; r < 2; ++r) {
    kids[r] = ::fork();
    if (kids[r] == 0) {
      const int rc = rank_main(which, r, two_gpus ? static_cast<int>(r) : 0, id.value(), d.socket(), up[r][1], down[0],
                               two_gpus);
      std::fflush(stdout);
      ::_exit(rc);
    }
  }
  int failures = 0;
  char c = 0;
  const bool ready = read_byte(up[0][0], &c, 120000) && c == 'r' && read_byte(up[1][0], &c, 120000) && c == 'r';
  if (!ready) {
    std::printf("FAIL the ranks did not plan the op\n");
    ++failures;
  } else {
    write_byte(down[1], 'g');
    if (read_byte(up[0][0], &c, 30000) && c == 'l') {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));  // rank 0's kernel is waiting
      ::kill(kids[1], SIGKILL);
    } else {
      std::printf("FAIL rank 0 did not launch\n");
      ++failures;
    }
  }
  ::kill(kids[1], SIGKILL);
  int st = 0;
  ::waitpid(kids[1], &st, 0);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (::waitpid(kids[0], &st, WNOHANG) != kids[0]) {
    if (std::chrono::steady_clock::now() > deadline) {
      std::printf("FAIL rank 0 did not finish within 60 s (a hang)\n");
      ::kill(kids[0], SIGKILL);
      ::waitpid(kids[0], &st, 0);
      st = 1 << 8;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0)) ++failures;
  return failures;
}

int main() {
  if (mkt::driver_gpu_count() < 1) {
    std::printf("SKIPPED ag_gemm_kill_gpu_test: needs a CUDA GPU, found none\n");
    return 77;
  }
  const int failures =
      run_op(Op::kAllGatherGemm) + run_op(Op::kAllGatherGemmCopyEngine) + run_op(Op::kGemmReduceScatter);
  if (failures == 0) std::printf("PASS ag_gemm_kill_gpu_test\n");
  return failures == 0 ? 0 : 1;
}
