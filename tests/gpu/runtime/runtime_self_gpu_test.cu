// One GPU, one mkerneld with libfabric's shm provider: a kernel sends tiles to its own rank
// through the proxy and the network transport (network_for_local), waits on the flags and
// checks every word; repeated launches with growing launch numbers and no reset; the same
// launch captured in a CUDA graph and replayed; and the daemon killed while a kernel waits (the
// kernel ends within its bound and the application gets the error).
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include "mkernel/runtime/runtime.h"
#include "runtime_gpu_util.h"
#include "tiles.cuh"

namespace rt = mkernel::rt;
using mkt::kTiles;
using mkt::kTileBytes;
using mkt::exchange_tiles;

namespace {

// Waits for a flag nobody raises.
__global__ void wait_forever(rt::DeviceComm c, unsigned long long* failed) {
  if (threadIdx.x == 0 && !rt::wait_flag(c, c.num_flags - 1, ~0ull >> 1, 999)) atomicAdd(failed, 1ull);
}

}  // namespace

int main() {
  mkt::require_gpus_or_skip("runtime_self_gpu_test", 1);
  mkt::Daemon d(mkt::temp_dir("self"), mkt::daemon_yaml("shm", "0"));
  if (!d.start()) return 1;

  rt::Options o;
  o.socket_path = d.socket();
  o.cuda_device = 0;
  o.network_for_local = true;
  o.device_wait_timeout_ns = 3000000000ull;
  auto id = rt::get_unique_id(o);
  MKT_CHECK(id.ok(), "get_unique_id: %s", id.status().to_string().c_str());
  if (!id.ok()) return 1;
  auto made = rt::Communicator::create(0, 1, id.value(), {uint64_t{kTiles} * kTileBytes, uint64_t{kTiles} * kTileBytes}, o);
  MKT_CHECK(made.ok(), "create: %s", made.status().to_string().c_str());
  if (!made.ok()) return 1;
  rt::Communicator& comm = *made.value();
  MKT_CHECK(comm.through_network(0), "rank 0 should be reached through the network transport");
  std::printf("communicator: transport \"%s\", staging %s (%s)\n", comm.transport().c_str(),
              rt::staging_name(comm.staging()), comm.staging_reason().c_str());
  MKT_CHECK(!comm.staging_reason().empty(), "the staging decision names its reason");
  MKT_CHECK(comm.transport().find("shm") != std::string::npos, "transport %s", comm.transport().c_str());

  unsigned long long *wrong = nullptr, *failed = nullptr;
  CUDA_OK(cudaMalloc(&wrong, sizeof(*wrong)));
  CUDA_OK(cudaMalloc(&failed, sizeof(*failed)));
  CUDA_OK(cudaMemset(wrong, 0, sizeof(*wrong)));
  CUDA_OK(cudaMemset(failed, 0, sizeof(*failed)));
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));

  // Repeated launches, no reset, no host work in between.
  constexpr int kLaunches = 6;
  for (int l = 0; l < kLaunches; ++l) {
    MKT_CHECK(comm.begin_launch(stream).ok(), "begin_launch");
    exchange_tiles<<<kTiles, 256, 0, stream>>>(comm.device(), 0, 0, wrong, failed);
  }
  CUDA_OK(cudaStreamSynchronize(stream));
  unsigned long long h_wrong = 0, h_failed = 0;
  CUDA_OK(cudaMemcpy(&h_wrong, wrong, sizeof(h_wrong), cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(&h_failed, failed, sizeof(h_failed), cudaMemcpyDeviceToHost));
  MKT_CHECK(h_wrong == 0 && h_failed == 0, "launches: %llu wrong words, %llu failed blocks", h_wrong, h_failed);
  MKT_CHECK(comm.check().ok(), "check: %s", comm.check().to_string().c_str());
  for (uint32_t t = 0; t < kTiles; ++t)
    MKT_CHECK(__atomic_load_n(&comm.host_flags()[t], __ATOMIC_ACQUIRE) == kLaunches, "flag %u = %llu", t,
          static_cast<unsigned long long>(comm.host_flags()[t]));
  std::printf("%d launches x %u tiles of %u KiB through mkerneld: every word and flag exact\n", kLaunches, kTiles,
              kTileBytes / 1024);

  // The same launch in a CUDA graph, replayed: each replay gets a new launch number.
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  MKT_CHECK(comm.begin_launch(stream).ok(), "begin_launch in capture");
  exchange_tiles<<<kTiles, 256, 0, stream>>>(comm.device(), 0, 0, wrong, failed);
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  constexpr int kReplays = 4;
  for (int r = 0; r < kReplays; ++r) CUDA_OK(cudaGraphLaunch(exec, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  CUDA_OK(cudaMemcpy(&h_wrong, wrong, sizeof(h_wrong), cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(&h_failed, failed, sizeof(h_failed), cudaMemcpyDeviceToHost));
  MKT_CHECK(h_wrong == 0 && h_failed == 0, "graph: %llu wrong words, %llu failed blocks", h_wrong, h_failed);
  for (uint32_t t = 0; t < kTiles; ++t)
    MKT_CHECK(comm.host_flags()[t] == kLaunches + kReplays, "flag %u = %llu after replays", t,
          static_cast<unsigned long long>(comm.host_flags()[t]));
  std::printf("CUDA graph replayed %d times: flags at %d, every word exact\n", kReplays, kLaunches + kReplays);

  // The daemon dies while a kernel waits: the wait ends (well before its 3 s bound, since the
  // runtime marks the ring) and check() names the cause.
  CUDA_OK(cudaMemset(failed, 0, sizeof(*failed)));
  MKT_CHECK(comm.begin_launch(stream).ok(), "begin_launch");
  wait_forever<<<1, 32, 0, stream>>>(comm.device(), failed);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto t0 = std::chrono::steady_clock::now();
  d.kill(SIGKILL);
  CUDA_OK(cudaStreamSynchronize(stream));
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  CUDA_OK(cudaMemcpy(&h_failed, failed, sizeof(h_failed), cudaMemcpyDeviceToHost));
  const mkernel::Status why = comm.check();
  MKT_CHECK(h_failed == 1, "the waiting kernel should have failed its wait");
  MKT_CHECK(!why.ok() && why.message().find("daemon") != std::string::npos, "check after kill: %s", why.to_string().c_str());
  MKT_CHECK(ms < 3000 + 1000, "the kernel ended %.0f ms after the kill; bound 3 s + 1 s", ms);
  std::printf("daemon killed: the waiting kernel ended %.0f ms later; check(): %s\n", ms, why.to_string().c_str());

  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(graph));
  CUDA_OK(cudaStreamDestroy(stream));
  if (mkt::failures == 0) std::printf("PASS runtime_self_gpu_test\n");
  return mkt::failures == 0 ? 0 : 1;
}
