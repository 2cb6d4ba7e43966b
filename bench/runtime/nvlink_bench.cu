// nvlink_bench: bandwidth of kernel stores into a peer GPU's NVLink buffer (libmkernel: CUDA VMM
// buffer of another process, handle brokered by mkerneld), beside cudaMemcpyPeer of the same
// size between the same two GPUs, in the same run. Two processes, one daemon.
#include <cuda_runtime.h>
#include <sys/mman.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "mkernel/runtime/runtime.h"
#include "runtime_gpu_util.h"

namespace rt = mkernel::rt;

namespace {

constexpr uint64_t kMaxBytes = 256ull << 20;
const uint64_t kSizes[] = {4ull << 20, 64ull << 20, 256ull << 20};
constexpr int kReps = 20;

__global__ void store(uint4* dst, uint64_t n16, uint32_t seed) {
  const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
  for (uint64_t i = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n16; i += stride)
    dst[i] = make_uint4(seed, static_cast<uint32_t>(i), static_cast<uint32_t>(i >> 32), seed ^ 0x5bd1e995u);
}

__global__ void done_signal(rt::DeviceComm c, uint32_t other) {
  if (threadIdx.x == 0) rt::nvl_signal(c, other, 0);
}
__global__ void wait_done(rt::DeviceComm c) {
  if (threadIdx.x == 0) rt::nvl_wait(c, 0, 1);
}

struct Shared {
  double ours[3], peer[3];  // GB/s (median of kReps)
  int ok;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int run_rank(uint32_t rank, const rt::UniqueId& id, const std::string& socket, Shared* sh) {
  rt::Options o;
  o.socket_path = socket;
  o.cuda_device = static_cast<int>(rank);
  o.proxy = static_cast<int32_t>(rank);
  o.nvlink_bytes = kMaxBytes;
  o.device_wait_timeout_ns = 60000000000ull;
  auto made = rt::Communicator::create(rank, 2, id, {4096}, o);
  if (!made.ok()) {
    std::printf("rank %u: %s\n", rank, made.status().to_string().c_str());
    return 1;
  }
  rt::Communicator& comm = *made.value();
  if (rank == 1) {  // keep the buffer mapped until rank 0 is done
    if (!comm.begin_launch(nullptr).ok()) return 1;
    wait_done<<<1, 32>>>(comm.device());
    return cudaDeviceSynchronize() == cudaSuccess && comm.check().ok() ? 0 : 1;
  }
  if (!comm.begin_launch(nullptr).ok()) return 1;
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  void* src = nullptr;
  void* dst1 = nullptr;
  cudaMalloc(&src, kMaxBytes);
  cudaSetDevice(1);
  cudaMalloc(&dst1, kMaxBytes);
  cudaSetDevice(0);
  // The baseline at its best: peer access on, so the copy goes straight over NVLink.
  if (cudaDeviceEnablePeerAccess(1, 0) != cudaSuccess) {
    std::printf("rank 0: cudaDeviceEnablePeerAccess(1) failed: %s\n", cudaGetErrorString(cudaGetLastError()));
    return 1;
  }
  for (int s = 0; s < 3; ++s) {
    const uint64_t bytes = kSizes[s];
    std::vector<double> ours, peer;
    for (int r = 0; r < kReps + 3; ++r) {
      cudaEventRecord(e0);
      store<<<sms * 4, 512>>>(reinterpret_cast<uint4*>(comm.nvlink_buffer(1)), bytes / 16, r);
      cudaEventRecord(e1);
      cudaEventSynchronize(e1);
      float ms = 0;
      cudaEventElapsedTime(&ms, e0, e1);
      if (r >= 3) ours.push_back(bytes / (ms * 1e6));
      cudaEventRecord(e0);
      cudaMemcpyPeerAsync(dst1, 1, src, 0, bytes);
      cudaEventRecord(e1);
      cudaEventSynchronize(e1);
      cudaEventElapsedTime(&ms, e0, e1);
      if (r >= 3) peer.push_back(bytes / (ms * 1e6));
    }
    sh->ours[s] = median(ours);
    sh->peer[s] = median(peer);
  }
  done_signal<<<1, 32>>>(comm.device(), 1);
  const bool ok = cudaDeviceSynchronize() == cudaSuccess && comm.check().ok();
  return ok ? 0 : 1;
}

}  // namespace

int main() {
  if (mkt::driver_gpu_count() < 2) {
    std::printf("nvlink_bench: needs 2 GPUs, the driver lists %d\n", mkt::driver_gpu_count());
    return 77;
  }
  auto* sh = static_cast<Shared*>(::mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  mkt::Daemon d(mkt::temp_dir("nvlbench"), mkt::daemon_yaml("shm", "0, 1"));
  if (!d.start()) return 1;
  rt::Options o;
  o.socket_path = d.socket();
  auto id = rt::get_unique_id(o);
  if (!id.ok()) return 1;
  if (mkt::run_ranks(2, [&](uint32_t r) { return run_rank(r, id.value(), d.socket(), sh); }) != 0) return 1;
  for (int s = 0; s < 3; ++s)
    std::printf("{\"bench\":\"nvlink_store\",\"bytes\":%llu,\"kernel_store_gbps\":%.1f,\"memcpy_peer_gbps\":%.1f,"
                "\"ratio\":%.3f}\n",
                static_cast<unsigned long long>(kSizes[s]), sh->ours[s], sh->peer[s], sh->ours[s] / sh->peer[s]);
  return 0;
}
