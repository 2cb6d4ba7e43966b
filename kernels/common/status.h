// status.h: the device status word, the one error vocabulary of everything that runs on the GPU
// (the GEMM engine, the communication calls, the fused kernels), shared by host and device code.
//
// Design notes
//  1. A kernel never traps. When something fails (a bounded wait expires, the command ring is
//     marked in error, a push is refused, an argument is out of range) the thread records one
//     error in the status word and returns; its block and then the launch wind down through
//     their own bounded waits. The first error written wins (atomicCAS on `code`); later ones are
//     dropped, so the word names the cause rather than its consequences.
//  2. The word lives where the host can read it at any time (mapped pinned memory for a
//     communicator; any device or mapped word for a bare GEMM). The host turns it into a
//     message with describe_device_status().
//  3. `where` says at which step the error happened: the top byte is a DeviceStep, the rest an
//     index the step defines (an m block, a shard chunk, a peer). Device calls made by
//     application kernels pass their own tag with a zero top byte.
//  4. Values cross the host/device boundary: append, never renumber.
#pragma once

#include <cstdint>
#include <string>

#include "mkernel/protocol/status.h"

#if defined(__CUDACC__)
#define MK_KERNEL_HD __host__ __device__
#else
#define MK_KERNEL_HD
#endif

namespace mkernel::kernels {

// Codes of DeviceStatus::code.
enum DeviceError : uint32_t {
  kDeviceOk = 0,
  kDevicePushFailed = 1,       // detail: protocol::RingStatus of the refused push
  kDeviceWaitTimeout = 2,      // detail: the flag index waited on (the step says which array)
  kDeviceRingError = 3,        // detail: protocol::RingErrorCode found in the ring's error word
  kDeviceBadArgument = 4,      // detail: DeviceArgument
  kDevicePipelineTimeout = 5,  // detail: the stage; a shared-memory pipeline barrier of a block
                               //   did not complete (a broken launch, not slow data)
  kDevicePeerFailed = 6,       // detail: the rank whose kernel failed first and said so
  kDeviceMoeRouting = 7,       // detail: MoeRouteCode (fused/moe/moe_route.cuh): a bad expert in a
                               //   token's choices, or routing over the MoE's capacity
  kNumDeviceErrors = 8,
};

// DeviceStatus::detail of kDeviceBadArgument.
enum DeviceArgument : uint32_t {
  kArgRank = 1,
  kArgBuffer = 2,
  kArgRange = 3,
  kArgFlag = 4,
  kArgGroupOffsets = 5,  // a grouped GEMM's offsets decrease or pass the rows' capacity
};

// The top byte of DeviceStatus::where (note 3).
enum DeviceStep : uint32_t {
  kStepCaller = 0,         // an application's own tag
  kStepGemmReady = 1,      // GEMM producer waiting for input rows; index: m block
  kStepGemmPipeline = 2,   // GEMM shared-memory pipeline; index: block
  kStepPeerFree = 3,       // waiting until a peer finished reading its workspace; index: peer rank
  kStepShardArrival = 4,   // waiting for a shard chunk; index: shard * 65536 + chunk
  kStepNetworkSend = 5,    // pushing a shard chunk to a rail peer; index: peer rank
  kStepNetworkArrival = 6, // waiting for a shard chunk from the network; index: node * 65536 + chunk
  kStepForward = 7,        // spreading a shard received from the network; index: shard
  kStepPartialTile = 8,    // waiting for a node peer's partial tile; index: peer rank * 2^32 + tile
  kStepNodeSum = 9,        // waiting for another node's sum of a tile; index: node * 2^32 + tile
  kStepAttnPipeline = 10,  // attention core's shared-memory pipeline; index: block
  kStepGroupOffsets = 11,  // grouped GEMM reading its groups' offsets; index: the first bad group
  kStepGroupReady = 12,    // grouped GEMM waiting for the rows of a group; index: group
  kStepMoeRoute = 13,      // MoE routing; index: the token, rank, node or row count it names
  kStepMoeCounts = 14,     // waiting for a rank's MoE count record; index: rank
  kStepMoeTokens = 15,     // waiting for MoE tokens; index: rank * 65536 + chunk
  kStepMoeNetwork = 16,    // waiting for MoE tokens or counts from the network; index: node * 65536 + chunk
  kStepMoePartial = 17,    // waiting for MoE partials of a node peer; index: local * 2^32 + node * 65536 + chunk
  kStepMoeNodeSum = 18,    // waiting for another node's MoE partials; index: node * 65536 + chunk
  kStepMoeLayout = 19,     // waiting for the MoE row layout or a source's expansion; index: source
  kStepRingKV = 20,        // ring attention waiting for the K/V chunk of a step; index: step * 65536 + source rank
  kStepRingSlotFree = 21,  // ring attention waiting until a rank's slot is free; index: rank * 65536 + step
  kStepRingCopy = 22,      // ring attention copying a K/V chunk (bulk copy pipeline); index: rank * 65536 + step
  kNumDeviceSteps = 23,
};

MK_KERNEL_HD constexpr uint64_t where_tag(uint32_t step, uint64_t index) {
  return (uint64_t{step} << 56) | (index & ((uint64_t{1} << 56) - 1));
}

// In memory the host can read at any time (note 2).
struct alignas(32) DeviceStatus {
  uint32_t code;    // DeviceError
  uint32_t detail;  // per code
  uint64_t launch;  // launch number of the kernel that reported (0 when it has none)
  uint64_t where;   // note 3
  uint64_t rank;    // rank of the reporting communicator (0 for a bare GEMM)
};
static_assert(sizeof(DeviceStatus) == 32);

MK_KERNEL_HD constexpr const char* device_error_name(uint32_t code) {
  switch (code) {
    case kDeviceOk: return "ok";
    case kDevicePushFailed: return "a command push failed";
    case kDeviceWaitTimeout: return "a wait expired";
    case kDeviceRingError: return "the command ring was stopped";
    case kDeviceBadArgument: return "a device call had an argument out of range";
    case kDevicePipelineTimeout: return "a shared-memory pipeline barrier did not complete";
    case kDevicePeerFailed: return "a peer rank's kernel failed";
    case kDeviceMoeRouting: return "the MoE routing names a bad expert or exceeds the MoE's capacity";
    default: return "unknown device error";
  }
}

MK_KERNEL_HD constexpr const char* device_step_name(uint32_t step) {
  switch (step) {
    case kStepCaller: return "tag";
    case kStepGemmReady: return "GEMM waiting for input rows of m block";
    case kStepGemmPipeline: return "GEMM pipeline of block";
    case kStepPeerFree: return "waiting until this peer finished its previous launch: rank";
    case kStepShardArrival: return "waiting for shard*65536+chunk";
    case kStepNetworkSend: return "sending to rail peer rank";
    case kStepNetworkArrival: return "waiting for network node*65536+chunk";
    case kStepForward: return "forwarding shard";
    case kStepPartialTile: return "waiting for the partial tile of rank*2^32+tile";
    case kStepNodeSum: return "waiting for the node sum of node*2^32+tile";
    case kStepAttnPipeline: return "attention pipeline of block";
    case kStepGroupOffsets: return "grouped GEMM offsets of group";
    case kStepGroupReady: return "grouped GEMM waiting for the rows of group";
    case kStepMoeRoute: return "MoE routing: token, rank, node or rows";
    case kStepMoeCounts: return "waiting for the MoE count record of rank";
    case kStepMoeTokens: return "waiting for MoE tokens rank*65536+chunk";
    case kStepMoeNetwork: return "waiting for MoE network arrivals node*65536+chunk";
    case kStepMoePartial: return "waiting for MoE partials local*2^32+node*65536+chunk";
    case kStepMoeNodeSum: return "waiting for another node's MoE partials node*65536+chunk";
    case kStepMoeLayout: return "waiting for the MoE row layout or the expansion of source";
    case kStepRingKV: return "ring attention waiting for the K/V chunk of step*65536+source rank";
    case kStepRingSlotFree: return "ring attention waiting until the K/V slot is free: rank*65536+step";
    case kStepRingCopy: return "ring attention copying a K/V chunk into rank*65536+step";
    default: return "step";
  }
}

MK_KERNEL_HD constexpr const char* device_argument_name(uint32_t a) {
  switch (a) {
    case kArgRank: return "rank";
    case kArgBuffer: return "buffer";
    case kArgRange: return "range";
    case kArgFlag: return "flag";
    case kArgGroupOffsets: return "group offsets (decreasing, or past the capacity of rows)";
    default: return "argument";
  }
}

// Host only. "rank 1, launch 7, GEMM waiting for input rows of m block 12: a wait expired (flag 3, after
// 2000 ms)". timeout_ns is the bound the waits had (for the message only).
inline std::string describe_device_status(const DeviceStatus& s, uint64_t timeout_ns) {
  if (s.code == kDeviceOk) return "ok";
  const uint32_t step = static_cast<uint32_t>(s.where >> 56);
  const uint64_t index = s.where & ((uint64_t{1} << 56) - 1);
  std::string out = "rank " + std::to_string(s.rank) + ", launch " + std::to_string(s.launch) + ", " +
                    device_step_name(step) + " " + std::to_string(index) + ": " + device_error_name(s.code);
  switch (s.code) {
    case kDevicePushFailed: out += std::string(" (") + protocol::ring_status_name(s.detail) + ")"; break;
    case kDeviceWaitTimeout:
      out += " (flag " + std::to_string(s.detail) + ", after " + std::to_string(timeout_ns / 1000000) + " ms)";
      break;
    case kDeviceRingError: out += std::string(" (") + protocol::ring_error_name(s.detail) + ")"; break;
    case kDeviceBadArgument: out += std::string(" (") + device_argument_name(s.detail) + ")"; break;
    case kDevicePipelineTimeout: out += " (stage " + std::to_string(s.detail) + ")"; break;
    case kDevicePeerFailed: out += " (rank " + std::to_string(s.detail) + " failed first)"; break;
    case kDeviceMoeRouting:
      out += s.detail == 1   ? " (an expert outside -1 .. experts-1, or chosen twice, in that token's choices)"
             : s.detail == 2 ? " (more tokens to that rank than recv_tokens_per_source)"
             : s.detail == 3 ? " (more tokens to that node than recv_tokens_per_source)"
             : s.detail == 4 ? " (more expert rows on that rank than expert_rows_capacity)"
                             : " (routing)";
      break;
    default: break;
  }
  return out;
}

}  // namespace mkernel::kernels
