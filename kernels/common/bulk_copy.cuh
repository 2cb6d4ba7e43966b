// bulk_copy.cuh: large device-to-device copies by one thread through the copy engine of its SM
// (TMA 1-D bulk copies), for communication blocks that must move many bytes with few SMs.
//
// Design notes
//  1. Why: a block copying with ordinary 16-byte loads and stores keeps blockDim x unroll x 16
//     bytes in flight (48 KiB for 384 threads), about 30 GB/s per SM measured on an H200 for a
//     device-local copy; a fused kernel that gives few SMs to communication needs several times
//     that. One thread issuing bulk copies keeps kStages x kStageBytes in flight (192 KiB).
//  2. Pipeline: global -> shared (bulk load completing on the stage's mbarrier), shared ->
//     global (bulk store, its own async group). kStages - 1 loads run ahead; a stage is loaded
//     again only once the store that last read it has finished reading (wait_group.read).
//  3. Completion: copy() returns once every store of the call has completed (wait_group 0), then
//     orders the async proxy's writes before the caller's generic-proxy flag store
//     (fence.proxy.async), so "copy, then raise a flag" publishes the data like plain stores do.
//  4. Destinations may be this GPU's memory or a peer GPU's mapped over NVLink. Mapped host
//     memory (the host-staged network workspace) is copied with ordinary loads and stores
//     (comm.cuh block_copy) instead.
//  5. Only the thread that made the BulkCopier uses it; shared memory: kSmemBytes from `base`.
#pragma once

#include <cstdint>

#include "common/ptx.cuh"
#include "common/wait.cuh"
#include "mkernel/protocol/sync.cuh"

namespace mkernel::kernels {

struct BulkCopier {
  static constexpr uint32_t kStages = 12;
  static constexpr uint32_t kStageBytes = 16 * 1024;
  static constexpr uint32_t kSmemBytes = kStages * kStageBytes + kStages * 8;

  uint8_t* buf = nullptr;   // kStages x kStageBytes, 128-byte aligned
  uint64_t* bars = nullptr; // kStages mbarriers
  uint32_t phases = 0;      // parity to wait for, per stage

#if defined(__CUDACC__)
  // `base`: kSmemBytes of this block's shared memory, 1024-byte aligned.
  __device__ void init(uint8_t* base) {
    buf = base;
    bars = reinterpret_cast<uint64_t*>(base + kStages * kStageBytes);
    for (uint32_t s = 0; s < kStages; ++s) ptx::mbar_init(&bars[s], 1);
    ptx::fence_mbar_init();
    phases = 0;
  }

  // Copies `bytes` (a multiple of 16; both pointers 16-byte aligned). False when a stage did
  // not arrive within timeout_ns (a broken copy, reported by the caller).
  __device__ bool copy(void* dst, const void* src, uint64_t bytes, uint64_t timeout_ns) {
    auto* d = static_cast<uint8_t*>(dst);
    const auto* s = static_cast<const uint8_t*>(src);
    const uint64_t n = (bytes + kStageBytes - 1) / kStageBytes;
    auto piece = [&](uint64_t i) {
      return static_cast<uint32_t>(i + 1 < n ? kStageBytes : bytes - (n - 1) * kStageBytes);
    };
    auto load = [&](uint64_t i) {
      const uint32_t st = static_cast<uint32_t>(i % kStages);
      ptx::mbar_arrive_expect_tx(&bars[st], piece(i));
      ptx::bulk_load_1d(buf + st * kStageBytes, s + i * kStageBytes, piece(i), &bars[st]);
    };
    for (uint64_t i = 0; i + 1 < kStages && i < n; ++i) load(i);
    bool ok = true;
    for (uint64_t i = 0; i < n; ++i) {
      const uint32_t st = static_cast<uint32_t>(i % kStages);
      if (!mbar_wait_bounded(&bars[st], (phases >> st) & 1u, timeout_ns)) {
        ok = false;
        break;
      }
      phases ^= 1u << st;
      ptx::bulk_store_1d(d + i * kStageBytes, buf + st * kStageBytes, piece(i));
      ptx::bulk_commit_group();
      if (i + kStages - 1 < n) {
        ptx::bulk_wait_group_read<1>();  // the store of stage (i - 1) % kStages has read it
        load(i + kStages - 1);
      }
    }
    ptx::bulk_wait_group_all();
    sync::fence_proxy_async_global();
    return ok;
  }
#endif
};

}  // namespace mkernel::kernels
