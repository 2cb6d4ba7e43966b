// The tile exchange kernel of the runtime GPU tests.
#pragma once

#include "mkernel/runtime/device.cuh"
#include "runtime_gpu_util.h"

namespace mkt {

namespace rt = mkernel::rt;

constexpr uint32_t kTiles = 64;
constexpr uint32_t kTileBytes = 64 * 1024;

// Block b writes tile b of buffer 0, sends it to tile b of buffer 1 on rank `dst` with flag b,
// waits for flag b (its own rank's, raised by whoever sends to it) and checks the tile received
// from `src`.
static __global__ void exchange_tiles(rt::DeviceComm c, uint32_t dst, uint32_t src, unsigned long long* wrong,
                               unsigned long long* failed) {
  const uint32_t tile = blockIdx.x;
  const uint64_t launch = rt::launch_number(c);
  uint32_t* out = reinterpret_cast<uint32_t*>(c.buffers[0] + uint64_t{tile} * kTileBytes);
  for (uint32_t i = threadIdx.x; i < kTileBytes / 4; i += blockDim.x) out[i] = mkt::tile_word(c.rank, tile, launch, i);
  __threadfence_system();
  __syncthreads();
  __shared__ bool ok;
  if (threadIdx.x == 0) {
    ok = rt::put_signal(c, dst, 0, uint64_t{tile} * kTileBytes, 1, uint64_t{tile} * kTileBytes, kTileBytes, tile, tile);
    if (ok) ok = rt::wait_flag(c, tile, launch, tile);
    if (!ok) atomicAdd(failed, 1ull);
  }
  __syncthreads();
  if (!ok) return;
  const uint32_t* in = reinterpret_cast<const uint32_t*>(c.buffers[1] + uint64_t{tile} * kTileBytes);
  unsigned long long bad = 0;
  for (uint32_t i = threadIdx.x; i < kTileBytes / 4; i += blockDim.x)
    bad += __ldcv(in + i) != mkt::tile_word(src, tile, launch, i);
  if (bad) atomicAdd(wrong, bad);
}

}  // namespace mkt
