// comm.cuh: the device contract: what a kernel sees of a communicator (DeviceComm) and every
// call it makes on it: ring push, put + signal, signal, NVLink stores and signals, the bounded
// flag waits, the launch number and the error report. The runtime fills a DeviceComm
// (mkernel/runtime/runtime.h) and re-exports these names as mkernel::rt::*; the fused kernels
// and the GEMM engine include this header directly, without the runtime's host code.
//
// Design notes
//  1. DeviceComm is plain data, passed by value as a kernel parameter (or copied into device
//     memory by a fused op's plan). Everything it points to stays valid while the Communicator
//     lives.
//  2. Launch numbers: Communicator::begin_launch enqueues a one-thread kernel that raises the
//     launch counter in device memory; every kernel of that launch reads it with
//     launch_number(). Flags are raised to the launch number of the launch that signalled, so
//     they only grow: no reset between launches, no host synchronisation, and a CUDA graph
//     that captured begin_launch and the kernels gets a new number on every replay.
//  3. Errors: every call that can fail returns false and records the first error of the
//     communicator in its status word (status.h), with the caller's `where` tag. The first
//     report of a rank also raises the abort word of every NVLink peer, so their waits end at
//     once with kDevicePeerFailed instead of at their timeout. Nothing traps.
//  4. The NVLink buffer of each rank (Options::nvlink_bytes) is laid out as
//       [data: nvl_bytes][user flags: nvl_num_flags x u64][system words: kNvlSystemWords x u64]
//       [fused-op flags: nvl_fused_flags x u64]
//     User flags are the application's (nvl_signal / nvl_wait); the fused ops own the fused-op
//     flags, so neither can raise the other's. `nvl` is a device array of world_size pointers
//     (rank r's buffer as mapped here, null where r is not on this node): any number of ranks
//     per NVLink domain.
#pragma once

#include <cstdint>

#include "common/status.h"
#include "common/wait.cuh"
#include "mkernel/protocol/command.h"
#include "mkernel/protocol/ring.h"
#include "mkernel/protocol/ring_device.cuh"
#include "mkernel/protocol/sync.cuh"

namespace mkernel::kernels {

inline constexpr uint32_t kMaxBuffers = 16;
// System words of an NVLink buffer (note 4).
inline constexpr uint32_t kNvlSystemWords = 8;
inline constexpr uint32_t kNvlWordPeerAbort = 0;  // rank + 1 of the first peer that failed
// Words of DeviceComm::fused_state (fused/common/launch_state.cuh says what each holds).
inline constexpr uint32_t kFusedStateWords = 8;
// Words 2 and 3 of it are the host gate of every wait of the communicator's kernels
// (wait.cuh note 8): when the next look at the host words is due, and the failure mark.
inline constexpr uint32_t kWaitHostDue = 2;
inline constexpr uint32_t kWaitFailedMark = 3;
// The fused-op flags of the flag array start with an agreement area: two banks of kAgreeWords
// flags per rank, where every rank leaves the description of the op it is about to plan (the
// runtime's agreement, runtime/src/ops/agree.cu); the ops' own flags follow it
// (fused_flag_index). Consecutive agreements alternate between the banks: a rank that finished
// one agreement may already write its words for the next one before a slower rank has read its
// words for this one, and with one bank it overwrote them (the slower rank then read the next
// op's description as this one's). The area's place depends on num_flags only, so ranks that
// differ in anything else still agree far enough to say so.
inline constexpr uint32_t kAgreeWords = 12;
inline constexpr uint32_t kAgreeBanks = 2;
// The value a rank leaves in word `word` of its slot for the agreement with sequence number `seq`
// (0, 1, 2, ... in the order every rank creates its ops; Communicator::next_agreement), and the
// floor the readers wait for. A flag of the area is reused every kAgreeBanks-th agreement, so its
// values grow by kAgreeBanks << 32 plus the change of the word: under 2^35, whatever ran in
// between. Across nodes the fabric transport carries a signal's value in 8-byte CQ data as its
// low 40 bits, rebuilt from the last value it saw for the flag (the first one as it is): steps
// must stay under 2^40 and first values below it (daemon/transport/fabric_transport.h). The
// launch number, which these values carried before, grows with every launch of the
// communicator: an agreement after its 256th launch sent a first value of 2^40 or more (the
// reader rebuilt the low bits and waited until its timeout, "rank q did not take part"), and two
// agreements 256 launches apart were a step the sender refused.
MK_KERNEL_HD constexpr uint64_t agree_flag_value(uint64_t seq, uint32_t word) { return ((seq + 1) << 32) | word; }
MK_KERNEL_HD constexpr uint64_t agree_flag_floor(uint64_t seq) { return (seq + 1) << 32; }
inline constexpr uint32_t kNoBuffer = 0xFFFFFFFFu;

// Byte offsets inside an NVLink buffer (note 4); host and device.
struct NvlLayout {
  uint64_t data_bytes = 0;
  uint32_t user_flags = 0;
  uint32_t fused_flags = 0;
  MK_KERNEL_HD constexpr uint64_t user_flags_offset() const { return data_bytes; }
  MK_KERNEL_HD constexpr uint64_t system_offset() const { return data_bytes + uint64_t{user_flags} * 8; }
  MK_KERNEL_HD constexpr uint64_t fused_flags_offset() const { return system_offset() + uint64_t{kNvlSystemWords} * 8; }
  MK_KERNEL_HD constexpr uint64_t total_bytes() const { return fused_flags_offset() + uint64_t{fused_flags} * 8; }
};

struct DeviceComm {
  protocol::RingProducerView ring;
  uint64_t* flags = nullptr;            // device address of the flag array (mapped host memory)
  uint32_t num_flags = 0;               // the application's; num_fused_flags follow them
  uint32_t num_fused_flags = 0;         // the fused ops' (raised by the proxy on arrivals)
  uint32_t rank = 0;
  uint32_t world_size = 1;
  uint32_t num_buffers = 0;
  uint8_t* buffers[kMaxBuffers] = {};   // device addresses of this rank's buffers
  uint64_t buffer_bytes[kMaxBuffers] = {};
  uint32_t network_workspace = kNoBuffer;  // the buffer the fused ops use between nodes
  const unsigned long long* launch_counter = nullptr;  // device memory (note 2)
  DeviceStatus* status = nullptr;       // device address (mapped host memory)
  uint64_t wait_timeout_ns = 2000000000ull;
  // NVLink (note 4): null when the communicator has no NVLink buffers.
  uint8_t* const* nvl = nullptr;
  uint64_t nvl_bytes = 0;
  uint32_t nvl_num_flags = 0;
  uint32_t nvl_fused_flags = 0;
  // Device memory of the fused ops (fused/common.cuh): launch bookkeeping, zero at creation.
  unsigned long long* fused_state = nullptr;
};

#if defined(__CUDACC__)

__device__ __forceinline__ NvlLayout nvl_layout(const DeviceComm& c) {
  return NvlLayout{c.nvl_bytes, c.nvl_num_flags, c.nvl_fused_flags};
}

// Rank r's NVLink buffer as mapped here, or null.
__device__ __forceinline__ uint8_t* nvl_ptr(const DeviceComm& c, uint32_t r) {
  return (c.nvl != nullptr && r < c.world_size) ? c.nvl[r] : nullptr;
}

__device__ __forceinline__ uint64_t* nvl_flag(const DeviceComm& c, uint32_t rank, uint32_t idx) {
  return reinterpret_cast<uint64_t*>(nvl_ptr(c, rank) + nvl_layout(c).user_flags_offset()) + idx;
}
__device__ __forceinline__ uint64_t* nvl_system_word(const DeviceComm& c, uint32_t rank, uint32_t w) {
  return reinterpret_cast<uint64_t*>(nvl_ptr(c, rank) + nvl_layout(c).system_offset()) + w;
}
__device__ __forceinline__ uint64_t* nvl_fused_flag(const DeviceComm& c, uint32_t rank, uint32_t idx) {
  return reinterpret_cast<uint64_t*>(nvl_ptr(c, rank) + nvl_layout(c).fused_flags_offset()) + idx;
}

// Index in the flag array (for commands and waits) of the fused ops' flag `idx`, past the
// agreement area, and of word `word` of rank `rank`'s agreement slot.
// Flags of the agreement area (both banks), before the fused ops' own.
MK_KERNEL_HD inline uint32_t agree_area_flags(const DeviceComm& c) { return c.world_size * kAgreeWords * kAgreeBanks; }
MK_KERNEL_HD inline uint32_t fused_flag_index(const DeviceComm& c, uint32_t idx) {
  return c.num_flags + agree_area_flags(c) + idx;
}
MK_KERNEL_HD inline uint32_t agree_flag_index(const DeviceComm& c, uint32_t bank, uint32_t rank, uint32_t word) {
  return c.num_flags + (bank * c.world_size + rank) * kAgreeWords + word;
}

__device__ __forceinline__ uint64_t launch_number(const DeviceComm& c) {
  return sync::ld_acquire_gpu(c.launch_counter);
}

// The bounded-wait context of this communicator (wait.cuh).
__device__ __forceinline__ WaitContext wait_context(const DeviceComm& c) {
  WaitContext w;
  w.status = c.status;
  w.ring_error = c.ring.header != nullptr ? &c.ring.header->error : nullptr;
  w.peer_abort = nvl_ptr(c, c.rank) != nullptr ? nvl_system_word(c, c.rank, kNvlWordPeerAbort) : nullptr;
  w.launch_counter = c.launch_counter;
  w.timeout_ns = c.wait_timeout_ns;
  w.rank = c.rank;
  if (c.fused_state != nullptr) {  // wait.cuh note 8
    w.host_gate = c.fused_state + kWaitHostDue;
    w.failed = c.fused_state + kWaitFailedMark;
  }
  return w;
}

// Tells every NVLink peer that this rank failed (note 3). Idempotent.
__device__ __forceinline__ void abort_peers(const DeviceComm& c) {
  if (c.nvl == nullptr) return;
  for (uint32_t r = 0; r < c.world_size; ++r) {
    if (r == c.rank || c.nvl[r] == nullptr) continue;
    sync::red_max_release_sys(nvl_system_word(c, r, kNvlWordPeerAbort), uint64_t{c.rank} + 1);
  }
}

// Records the first error of the communicator (note 3); later ones are dropped.
__device__ __forceinline__ void report(const DeviceComm& c, uint32_t code, uint32_t detail, uint64_t where) {
  // A peer's failure is not this rank's to announce again.
  if (report(wait_context(c), code, detail, where) && code != kDevicePeerFailed) abort_peers(c);
}

// Pushes one command into the ring. One thread. False (and the status word set) when refused.
__device__ __forceinline__ bool push(const DeviceComm& c, const protocol::Command& cmd, uint64_t where) {
  const uint32_t s = protocol::ring_push(c.ring, cmd);
  if (s != protocol::kRingOk) return report(c, kDevicePushFailed, s, where), false;
  return true;
}

// Pushes "write `bytes` from my buffer src_buf at src_off into rank dst's buffer dst_buf at
// dst_off, then raise its flag `flag` to this launch's number". One thread.
__device__ __forceinline__ bool put_signal(const DeviceComm& c, uint32_t dst, uint32_t src_buf, uint64_t src_off,
                                           uint32_t dst_buf, uint64_t dst_off, uint64_t bytes, uint32_t flag,
                                           uint64_t where = 0) {
  if (dst >= c.world_size) return report(c, kDeviceBadArgument, kArgRank, where), false;
  if (src_buf >= c.num_buffers || dst_buf >= c.num_buffers) return report(c, kDeviceBadArgument, kArgBuffer, where), false;
  if (src_off > c.buffer_bytes[src_buf] || bytes > c.buffer_bytes[src_buf] - src_off ||
      dst_off > c.buffer_bytes[dst_buf] || bytes > c.buffer_bytes[dst_buf] - dst_off)
    return report(c, kDeviceBadArgument, kArgRange, where), false;
  return push(c,
              protocol::make_write_signal(dst, static_cast<uint16_t>(src_buf), src_off, static_cast<uint16_t>(dst_buf),
                                          dst_off, bytes, flag, launch_number(c), where),
              where);
}

// Raises rank dst's flag to this launch's number after every earlier write of this ring to it.
__device__ __forceinline__ bool signal(const DeviceComm& c, uint32_t dst, uint32_t flag, uint64_t where = 0) {
  if (dst >= c.world_size) return report(c, kDeviceBadArgument, kArgRank, where), false;
  return push(c, protocol::make_signal(dst, flag, launch_number(c), where), where);
}

// Waits until my flag `flag` reached `value` (wait.cuh). One thread; the caller spreads the
// result to its block (e.g. __syncthreads).
__device__ __forceinline__ bool wait_flag(const DeviceComm& c, uint32_t flag, uint64_t value, uint64_t where = 0) {
  if (flag >= c.num_flags) return report(c, kDeviceBadArgument, kArgFlag, where), false;
  return wait_geq(&c.flags[flag], value, wait_context(c), flag, where);
}

// ---- NVLink: plain stores into a peer's buffer, a release of its flag ---------------------------

// After this thread's (and, with a __syncthreads before, its block's) stores into rank's
// buffer: raises rank's NVLink user flag `idx` to this launch's number.
__device__ __forceinline__ bool nvl_signal(const DeviceComm& c, uint32_t rank, uint32_t idx, uint64_t where = 0) {
  if (nvl_ptr(c, rank) == nullptr) return report(c, kDeviceBadArgument, kArgRank, where), false;
  if (idx >= c.nvl_num_flags) return report(c, kDeviceBadArgument, kArgFlag, where), false;
  sync::fence_acq_rel_sys();
  sync::st_relaxed_sys(nvl_flag(c, rank, idx), launch_number(c));
  return true;
}

// Waits until this rank's NVLink user flag `idx` reached `value`.
__device__ __forceinline__ bool nvl_wait(const DeviceComm& c, uint32_t idx, uint64_t value, uint64_t where = 0) {
  if (nvl_ptr(c, c.rank) == nullptr || idx >= c.nvl_num_flags) return report(c, kDeviceBadArgument, kArgFlag, where), false;
  return wait_geq(nvl_flag(c, c.rank, idx), value, wait_context(c), idx, where);
}

// How block_copy reads its source. Stream: data this launch did not write (evict-first, may use
// L1). L2: data another block of this launch wrote and flagged (bypasses the SM's L1, which is
// not coherent). Volatile: memory another agent (the host, the NIC) wrote and flagged, e.g.
// mapped pinned host memory (fetched again on every access).
enum class LoadPolicy : uint8_t { kStream, kL2, kVolatile };

template <LoadPolicy kPolicy>
__device__ __forceinline__ uint4 load16(const uint4* p) {
  if constexpr (kPolicy == LoadPolicy::kStream) return __ldcs(p);
  else if constexpr (kPolicy == LoadPolicy::kL2) return __ldcg(p);
  else return __ldcv(p);
}

// Every thread of the block calls this: copies `bytes` (a multiple of 16, both pointers 16-byte
// aligned) from src to dst with 16-byte accesses, kUnroll loads in flight per thread before the
// stores (a block keeps blockDim x kUnroll x 16 bytes in flight). dst may be a peer's NVLink
// buffer, src local, a peer's or mapped host memory.
template <LoadPolicy kPolicy = LoadPolicy::kStream>
__device__ __forceinline__ void block_copy(void* dst, const void* src, uint64_t bytes) {
  constexpr uint32_t kUnroll = 8;
  auto* d = static_cast<uint4*>(dst);
  const auto* s = static_cast<const uint4*>(src);
  const uint64_t n = bytes / 16;
  const uint64_t stride = uint64_t{blockDim.x} * kUnroll;
  uint64_t i = threadIdx.x;
  for (; i + (kUnroll - 1) * blockDim.x < n; i += stride) {
    uint4 v[kUnroll];
#pragma unroll
    for (uint32_t u = 0; u < kUnroll; ++u) v[u] = load16<kPolicy>(s + i + u * blockDim.x);
#pragma unroll
    for (uint32_t u = 0; u < kUnroll; ++u) d[i + u * blockDim.x] = v[u];
  }
  for (; i < n; i += blockDim.x) d[i] = load16<kPolicy>(s + i);
}

// Every thread of the block calls this: stores `bytes` from src into rank's NVLink buffer at
// dst_off, then one thread raises rank's NVLink user flag `idx`. Returns the same on every thread.
__device__ __forceinline__ bool nvl_put_signal(const DeviceComm& c, uint32_t rank, uint64_t dst_off, const void* src,
                                               uint64_t bytes, uint32_t idx, uint64_t where = 0) {
  __shared__ bool ok;
  uint8_t* dst = nvl_ptr(c, rank);
  const bool args_ok = dst != nullptr && dst_off <= c.nvl_bytes && bytes <= c.nvl_bytes - dst_off && bytes % 16 == 0;
  if (args_ok) block_copy(dst + dst_off, src, bytes);
  __syncthreads();
  if (threadIdx.x == 0) {
    ok = args_ok ? nvl_signal(c, rank, idx, where) : (report(c, kDeviceBadArgument, kArgRange, where), false);
  }
  __syncthreads();
  return ok;
}

#endif  // __CUDACC__

}  // namespace mkernel::kernels
