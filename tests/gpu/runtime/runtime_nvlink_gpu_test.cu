// Two H200s in one node with one mkerneld: two processes (rank 0 on GPU 0, rank 1 on GPU 1)
// each allocate an NVLink buffer (CUDA VMM); the daemon brokers the handles, so each maps the
// other's. Kernels store tiles straight into the peer's buffer over NVLink and raise its flag;
// the peer's kernel waits on the flag and checks every word. Both directions at once, several
// launches, no reset.
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
  o.nvlink_bytes = uint64_t{mkt::kTiles} * mkt::kTileBytes;
  auto made = rt::Communicator::create(rank, 2, id, {4096}, o);
  if (!made.ok()) {
    std::printf("FAIL rank %u: create: %s\n", rank, made.status().to_string().c_str());
    return 1;
  }
  rt::Communicator& comm = *made.value();
  const uint32_t other = 1 - rank;
  if (comm.through_network(other) || !comm.nvlink_mapped(other)) {
    std::printf("FAIL rank %u: rank %u should be on this daemon with its NVLink buffer mapped\n", rank, other);
    return 1;
  }
  unsigned long long *wrong = nullptr, *failed = nullptr;
  cudaMalloc(&wrong, 8);
  cudaMalloc(&failed, 8);
  cudaMemset(wrong, 0, 8);
  cudaMemset(failed, 0, 8);
  for (int l = 0; l < launches; ++l) {
    if (!comm.begin_launch(nullptr).ok()) return 1;
    mkt::nvl_exchange_tiles<<<mkt::kTiles, 256>>>(comm.device(), other, wrong, failed);
  }
  const cudaError_t e = cudaDeviceSynchronize();
  unsigned long long h_wrong = 0, h_failed = 0;
  cudaMemcpy(&h_wrong, wrong, 8, cudaMemcpyDeviceToHost);
  cudaMemcpy(&h_failed, failed, 8, cudaMemcpyDeviceToHost);
  const mkernel::Status st = comm.check();
  std::printf("rank %u (GPU %u): %d launches x %u tiles of %u KiB stored into rank %u's buffer over NVLink and "
              "received back: %llu wrong words, %llu failed blocks, cuda: %s, check: %s\n",
              rank, rank, launches, mkt::kTiles, mkt::kTileBytes / 1024, other, h_wrong, h_failed,
              cudaGetErrorString(e), st.to_string().c_str());
  std::fflush(stdout);
  // Stay until the peer is done with our buffer: a last barrier through the daemon's rendezvous
  // is not needed; the peer's final acks arrived before our last launch finished, and its last
  // stores into our buffer too. Our exit unmaps nothing of the peer's.
  return e == cudaSuccess && h_wrong == 0 && h_failed == 0 && st.ok() ? 0 : 1;
}

}  // namespace

int main() {
  if (mkt::driver_gpu_count() < 2) {
    std::printf("SKIPPED runtime_nvlink_gpu_test: needs 2 GPUs, the driver lists %d\n", mkt::driver_gpu_count());
    return 77;
  }
  mkt::Daemon d(mkt::temp_dir("nvlink"), mkt::daemon_yaml("shm", "0, 1"));
  if (!d.start()) return 1;
  rt::Options o;
  o.socket_path = d.socket();
  auto id = rt::get_unique_id(o);
  if (!id.ok()) {
    std::printf("FAIL get_unique_id: %s\n", id.status().to_string().c_str());
    return 1;
  }
  const int failures = mkt::run_ranks(2, [&](uint32_t r) { return run_rank(r, id.value(), d.socket(), 6); });
  if (failures == 0) std::printf("PASS runtime_nvlink_gpu_test\n");
  return failures == 0 ? 0 : 1;
}
