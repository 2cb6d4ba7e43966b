// ring_exchange: the complete example of docs/api.md. Every rank sends one tile per block to the
// next rank through mkerneld and checks the tile it gets from the previous one, for a few
// launches, with no host synchronisation between them.
//
//   rank 0:  MKERNEL_SOCKET=/run/mkerneld/mkerneld.sock ./ring_exchange --make-id > id.txt
//   rank r:  ./ring_exchange RANK WORLD "$(cat id.txt)" [CUDA_DEVICE]
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "mkernel/runtime/runtime.h"

namespace rt = mkernel::rt;

constexpr uint32_t kTiles = 32, kTileBytes = 16384;

__global__ void ring_step(rt::DeviceComm c, unsigned long long* wrong) {
  const uint32_t tile = blockIdx.x, next = (c.rank + 1) % c.world_size;
  const uint32_t prev = (c.rank + c.world_size - 1) % c.world_size;
  const uint64_t launch = rt::launch_number(c);
  __shared__ bool ok;
  // The next rank acknowledged last launch's tile: its slot (and our source tile) are free.
  if (threadIdx.x == 0) ok = launch <= 1 || rt::wait_flag(c, kTiles + tile, launch - 1, tile);
  __syncthreads();
  if (!ok) return;
  uint32_t* mine = reinterpret_cast<uint32_t*>(c.buffers[0] + uint64_t{tile} * kTileBytes);
  for (uint32_t i = threadIdx.x; i < kTileBytes / 4; i += blockDim.x) mine[i] = c.rank * 1000003u + tile * 131u + i + launch;
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0) {
    ok = rt::put_signal(c, next, 0, uint64_t{tile} * kTileBytes, 1, uint64_t{tile} * kTileBytes, kTileBytes, tile, tile) &&
         rt::wait_flag(c, tile, launch, tile);
  }
  __syncthreads();
  if (!ok) return;
  const uint32_t* got = reinterpret_cast<const uint32_t*>(c.buffers[1] + uint64_t{tile} * kTileBytes);
  for (uint32_t i = threadIdx.x; i < kTileBytes / 4; i += blockDim.x)
    if (__ldcv(got + i) != prev * 1000003u + tile * 131u + i + launch) atomicAdd(wrong, 1ull);
  __syncthreads();
  if (threadIdx.x == 0) rt::signal(c, prev, kTiles + tile, tile);  // acknowledge to the sender
}

int main(int argc, char** argv) {
  rt::Options options;  // socket from MKERNEL_SOCKET or /run/mkerneld/mkerneld.sock
  if (argc == 2 && std::string(argv[1]) == "--make-id") {
    auto id = rt::get_unique_id(options);
    if (!id.ok()) return std::fprintf(stderr, "%s\n", id.status().to_string().c_str()), 1;
    std::printf("%s\n", rt::to_string(id.value()).c_str());
    return 0;
  }
  if (argc < 4) return std::fprintf(stderr, "usage: %s --make-id | RANK WORLD ID [CUDA_DEVICE]\n", argv[0]), 2;
  const uint32_t rank = std::atoi(argv[1]), world = std::atoi(argv[2]);
  auto id = rt::unique_id_from_string(argv[3]);
  if (!id.ok()) return std::fprintf(stderr, "%s\n", id.status().to_string().c_str()), 2;
  options.cuda_device = argc > 4 ? std::atoi(argv[4]) : 0;
  options.proxy = options.cuda_device;

  auto comm = rt::Communicator::create(rank, world, id.value(), {kTiles * kTileBytes, kTiles * kTileBytes}, options);
  if (!comm.ok()) return std::fprintf(stderr, "rank %u: %s\n", rank, comm.status().to_string().c_str()), 1;
  unsigned long long* wrong = nullptr;
  cudaMalloc(&wrong, sizeof(*wrong));
  cudaMemset(wrong, 0, sizeof(*wrong));
  for (int launch = 0; launch < 10; ++launch) {
    if (auto s = comm.value()->begin_launch(nullptr); !s.ok()) return std::fprintf(stderr, "%s\n", s.to_string().c_str()), 1;
    ring_step<<<kTiles, 256>>>(comm.value()->device(), wrong);
  }
  cudaDeviceSynchronize();
  unsigned long long h = 0;
  cudaMemcpy(&h, wrong, sizeof(h), cudaMemcpyDeviceToHost);
  const mkernel::Status st = comm.value()->check();  // waits that expired, a daemon that went away
  std::printf("rank %u: %llu wrong words, %s (transport %s, staging %s)\n", rank, h, st.to_string().c_str(),
              comm.value()->transport().c_str(), rt::staging_name(comm.value()->staging()));
  return h == 0 && st.ok() ? 0 : 1;
}
