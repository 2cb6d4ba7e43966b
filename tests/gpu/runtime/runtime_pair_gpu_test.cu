// Two GPUs as two nodes: two mkerneld processes (one per GPU), two application processes
// (rank 0 on GPU 0, rank 1 on GPU 1), each with its own daemon. A kernel on each GPU sends
// tiles to the other through the proxies and the network transport while it waits on the flags
// of the tiles coming the other way, and checks every word: both directions at once, several
// launches. The provider is the first argument (shm or "tcp;ofi_rxm").
#include <cuda_runtime.h>
#include <sys/wait.h>

#include <cstdio>
#include <string>

#include "mkernel/runtime/runtime.h"
#include "runtime_gpu_util.h"
#include "tiles.cuh"

namespace rt = mkernel::rt;

namespace {

int run_rank(uint32_t rank, const rt::UniqueId& id, const std::string& socket, int launches) {
  rt::Options o;
  o.socket_path = socket;
  o.cuda_device = static_cast<int>(rank);
  o.proxy = static_cast<int32_t>(rank);
  o.device_wait_timeout_ns = 5000000000ull;
  auto made = rt::Communicator::create(rank, 2, id, {uint64_t{mkt::kTiles} * mkt::kTileBytes,
                                                     uint64_t{mkt::kTiles} * mkt::kTileBytes}, o);
  if (!made.ok()) {
    std::printf("FAIL rank %u: create: %s\n", rank, made.status().to_string().c_str());
    return 1;
  }
  rt::Communicator& comm = *made.value();
  const uint32_t other = 1 - rank;
  if (!comm.through_network(other)) {
    std::printf("FAIL rank %u: rank %u should be reached through the network\n", rank, other);
    return 1;
  }
  unsigned long long *wrong = nullptr, *failed = nullptr;
  cudaMalloc(&wrong, 8);
  cudaMalloc(&failed, 8);
  cudaMemset(wrong, 0, 8);
  cudaMemset(failed, 0, 8);
  for (int l = 0; l < launches; ++l) {
    if (!comm.begin_launch(nullptr).ok()) return 1;
    mkt::exchange_tiles<<<mkt::kTiles, 256>>>(comm.device(), other, other, wrong, failed);
  }
  const cudaError_t e = cudaDeviceSynchronize();
  unsigned long long h_wrong = 0, h_failed = 0;
  cudaMemcpy(&h_wrong, wrong, 8, cudaMemcpyDeviceToHost);
  cudaMemcpy(&h_failed, failed, 8, cudaMemcpyDeviceToHost);
  const mkernel::Status st = comm.check();
  bool flags_ok = true;
  for (uint32_t t = 0; t < mkt::kTiles; ++t) flags_ok &= comm.host_flags()[t] == static_cast<uint64_t>(launches);
  std::printf("rank %u (GPU %u, %s, staging %s): %d launches x %u tiles of %u KiB to rank %u and back: %llu wrong "
              "words, %llu failed blocks, flags %s, check: %s\n",
              rank, rank, comm.transport().c_str(), rt::staging_name(comm.staging()), launches, mkt::kTiles,
              mkt::kTileBytes / 1024, other, h_wrong, h_failed, flags_ok ? "exact" : "WRONG", st.to_string().c_str());
  return e == cudaSuccess && h_wrong == 0 && h_failed == 0 && flags_ok && st.ok() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string provider = argc > 1 ? argv[1] : "shm";
  // No CUDA call before the fork: count GPUs through the driver.
  if (mkt::driver_gpu_count() < 2) {
    std::printf("SKIPPED runtime_pair_gpu_test: needs 2 GPUs, the driver lists %d\n", mkt::driver_gpu_count());
    return 77;
  }
  mkt::Daemon a(mkt::temp_dir("pair-a"), mkt::daemon_yaml(provider, "0"));
  mkt::Daemon b(mkt::temp_dir("pair-b"), mkt::daemon_yaml(provider, "1"));
  if (!a.start() || !b.start()) return 1;
  rt::Options o;
  o.socket_path = a.socket();
  o.proxy = 0;
  auto id = rt::get_unique_id(o);
  if (!id.ok()) {
    std::printf("FAIL get_unique_id: %s\n", id.status().to_string().c_str());
    return 1;
  }
  const int failures = mkt::run_ranks(
      2, [&](uint32_t r) { return run_rank(r, id.value(), r == 0 ? a.socket() : b.socket(), 5); });
  if (failures == 0) std::printf("PASS runtime_pair_gpu_test (%s)\n", provider.c_str());
  return failures == 0 ? 0 : 1;
}
