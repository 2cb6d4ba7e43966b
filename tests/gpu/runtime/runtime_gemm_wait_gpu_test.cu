// One GPU, one mkerneld: the GEMM engine shares the communicator's device contract. A GEMM
// whose readiness flags never come waits (bounded) with the communicator's wait context; the
// daemon is killed; the GEMM ends as soon as the runtime marks the ring (well inside the wait
// bound), and Communicator::check() names the rank, the GEMM step and the cause.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "gemm/sm90_bf16_gemm.h"
#include "mkernel/runtime/runtime.h"
#include "runtime_gpu_util.h"

namespace rt = mkernel::rt;
namespace mk = mkernel::kernels;

int main() {
  mkt::require_gpus_or_skip("runtime_gemm_wait_gpu_test", 1);
  mkt::Daemon d(mkt::temp_dir("gemmwait"), mkt::daemon_yaml("shm", "0"));
  if (!d.start()) return 1;

  constexpr uint64_t kBound = 3'000'000'000ull;  // the documented wait bound of this communicator
  rt::Options o;
  o.socket_path = d.socket();
  o.cuda_device = 0;
  o.device_wait_timeout_ns = kBound;
  o.nvlink_bytes = 1 << 20;
  auto id = rt::get_unique_id(o);
  MKT_CHECK(id.ok(), "get_unique_id: %s", id.status().to_string().c_str());
  if (!id.ok()) return 1;
  auto made = rt::Communicator::create(0, 1, id.value(), {4096}, o);
  MKT_CHECK(made.ok(), "create: %s", made.status().to_string().c_str());
  if (!made.ok()) return 1;
  rt::Communicator& comm = *made.value();

  const int m = 1024, n = 1024, k = 1024;
  __nv_bfloat16 *a = nullptr, *w = nullptr, *out = nullptr;
  CUDA_OK(cudaMalloc(&a, sizeof(__nv_bfloat16) * m * k));
  CUDA_OK(cudaMalloc(&w, sizeof(__nv_bfloat16) * n * k));
  CUDA_OK(cudaMalloc(&out, sizeof(__nv_bfloat16) * m * n));
  CUDA_OK(cudaMemset(a, 0, sizeof(__nv_bfloat16) * m * k));
  CUDA_OK(cudaMemset(w, 0, sizeof(__nv_bfloat16) * n * k));
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));

  mk::GemmArgs args;
  args.a = a;
  args.w = w;
  args.d = out;
  args.m = m;
  args.n = n;
  args.k = k;
  args.config.num_splits = 1;
  args.hooks.ready_flags = comm.device().flags;  // flags nobody raises to this value
  args.hooks.ready_value = ~0ull >> 1;
  args.hooks.ready_rows_per_flag = 128;
  args.wait = comm.wait_context();
  MKT_CHECK(args.wait.timeout_ns == kBound, "wait_context carries the communicator's bound");

  MKT_CHECK(comm.begin_launch(stream).ok(), "begin_launch");
  const mk::GemmResult r = mk::gemm_bf16_tn(args, stream);
  MKT_CHECK(r.ok(), "gemm launch: %s", r.message.c_str());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  MKT_CHECK(cudaStreamQuery(stream) == cudaErrorNotReady, "the GEMM should still be waiting for its rows");
  const auto t0 = std::chrono::steady_clock::now();
  d.kill(SIGKILL);
  CUDA_OK(cudaStreamSynchronize(stream));
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const mkernel::Status why = comm.check();
  MKT_CHECK(!why.ok(), "check() after the kill should report the failure");
  MKT_CHECK(why.message().find("daemon went away") != std::string::npos, "cause named: %s", why.to_string().c_str());
  MKT_CHECK(why.message().find("GEMM waiting for input rows") != std::string::npos, "step named: %s",
            why.to_string().c_str());
  MKT_CHECK(why.message().find("rank 0") != std::string::npos, "rank named: %s", why.to_string().c_str());
  // The runtime's monitor polls the daemon connection every 100 ms; the GEMM's waits look at
  // the ring's error word every few microseconds: far inside the 3 s bound.
  MKT_CHECK(ms < 1000, "the GEMM ended %.0f ms after the kill; expected well under the %llu ms bound", ms,
            static_cast<unsigned long long>(kBound / 1000000));
  std::printf("daemon killed while the GEMM waited for rows: it ended %.0f ms later; check(): %s\n", ms,
              why.to_string().c_str());

  CUDA_OK(cudaStreamDestroy(stream));
  cudaFree(a);
  cudaFree(w);
  cudaFree(out);
  if (mkt::failures == 0) std::printf("PASS runtime_gemm_wait_gpu_test\n");
  return mkt::failures == 0 ? 0 : 1;
}
