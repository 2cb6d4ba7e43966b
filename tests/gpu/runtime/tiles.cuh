// The tile exchange kernel of the runtime GPU tests.
#pragma once

#include "mkernel/runtime/device.cuh"
#include "runtime_gpu_util.h"

namespace mkt {

namespace rt = mkernel::rt;

constexpr uint32_t kTiles = 64;
constexpr uint32_t kTileBytes = 64 * 1024;

// Block b waits until `dst` acknowledged tile b of the previous launch (flag kTiles + b, so the
// tile it is about to overwrite there, and its own source tile, are free), writes tile b of
// buffer 0, sends it to tile b of buffer 1 on rank `dst` with flag b, waits for flag b (raised by
// whoever sends to this rank), checks the tile received from `src` and acknowledges it to `src`.
static __global__ void exchange_tiles(rt::DeviceComm c, uint32_t dst, uint32_t src, unsigned long long* wrong,
                                      unsigned long long* failed) {
  const uint32_t tile = blockIdx.x;
  const uint64_t launch = rt::launch_number(c);
  __shared__ bool ok;
  if (threadIdx.x == 0) {
    ok = launch <= 1 || rt::wait_flag(c, kTiles + tile, launch - 1, tile);
    if (!ok) atomicAdd(failed, 1ull);
  }
  __syncthreads();
  if (!ok) return;
  uint32_t* out = reinterpret_cast<uint32_t*>(c.buffers[0] + uint64_t{tile} * kTileBytes);
  for (uint32_t i = threadIdx.x; i < kTileBytes / 4; i += blockDim.x) out[i] = mkt::tile_word(c.rank, tile, launch, i);
  __threadfence_system();
  __syncthreads();
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
  __syncthreads();
  if (threadIdx.x == 0 && !rt::signal(c, src, kTiles + tile, tile)) atomicAdd(failed, 1ull);
}

}  // namespace mkt

namespace mkt {

// NVLink: block b stores tile b straight into rank `other`'s NVLink buffer and raises its flag b;
// then waits for flag b of its own buffer, checks the tile `other` stored here and acks it (flag
// kTiles + b on `other`), which the next launch waits for before overwriting.
static __global__ void nvl_exchange_tiles(rt::DeviceComm c, uint32_t other, unsigned long long* wrong,
                                          unsigned long long* failed) {
  const uint32_t tile = blockIdx.x;
  const uint64_t launch = rt::launch_number(c);
  __shared__ bool ok;
  if (threadIdx.x == 0) {
    ok = launch <= 1 || rt::nvl_wait(c, kTiles + tile, launch - 1, tile);
    if (!ok) atomicAdd(failed, 1ull);
  }
  __syncthreads();
  if (!ok) return;
  uint32_t* out = reinterpret_cast<uint32_t*>(c.nvl[other] + uint64_t{tile} * kTileBytes);
  for (uint32_t i = threadIdx.x; i < kTileBytes / 4; i += blockDim.x) out[i] = tile_word(c.rank, tile, launch, i);
  __syncthreads();
  if (threadIdx.x == 0) {
    ok = rt::nvl_signal(c, other, tile, tile) && rt::nvl_wait(c, tile, launch, tile);
    if (!ok) atomicAdd(failed, 1ull);
  }
  __syncthreads();
  if (!ok) return;
  const uint32_t* in = reinterpret_cast<const uint32_t*>(c.nvl[c.rank] + uint64_t{tile} * kTileBytes);
  unsigned long long bad = 0;
  for (uint32_t i = threadIdx.x; i < kTileBytes / 4; i += blockDim.x)
    bad += __ldcg(in + i) != tile_word(other, tile, launch, i);
  if (bad) atomicAdd(wrong, bad);
  __syncthreads();
  if (threadIdx.x == 0 && !rt::nvl_signal(c, other, kTiles + tile, tile)) atomicAdd(failed, 1ull);
}

}  // namespace mkt
