// op_common.h: what every fused op of the runtime shares before its kernel-level plan: the
// layout from the communicator, the device check, the pointer checks, and kernel errors as
// Status.
#pragma once

#include <cuda_runtime.h>

#include <initializer_list>
#include <string>

#include "fused/common/layout.h"
#include "fused/common/split_host.h"
#include "gemm/sm90_bf16_gemm.h"
#include "mkernel/runtime/ops.h"
#include "mkernel/runtime/runtime.h"

namespace mkernel::rt::ops_detail {

namespace mk = mkernel::kernels;

// Nodes x GPUs from where the daemons put the ranks (ops.h note 2).
inline StatusOr<mk::FusedLayout> layout_of(const Communicator& comm) {
  const uint32_t R = comm.size(), nodes = comm.num_nodes();
  if (nodes == 0 || R % nodes != 0)
    return Status(StatusCode::kFailedPrecondition, "the communicator's " + std::to_string(R) + " ranks are on " +
                                                       std::to_string(nodes) +
                                                       " nodes; fused ops need the same number of GPUs on every node");
  const mk::FusedLayout l{nodes, R / nodes};
  for (uint32_t r = 0; r < R; ++r) {
    if (comm.node_of(r) != l.node_of(r))
      return Status(StatusCode::kFailedPrecondition,
                    "rank " + std::to_string(r) + " is on node " + std::to_string(comm.node_of(r)) + ", expected node " +
                        std::to_string(l.node_of(r)) + ": fused ops need ranks numbered node-major (" +
                        std::to_string(l.gpus) + " consecutive ranks per node)");
  }
  // Ranks that share a node name must share this daemon (NVLink), and those that do not, not.
  for (uint32_t r = 0; r < R; ++r) {
    if (r == comm.rank()) continue;
    const bool same_node = comm.node_of(r) == comm.node_of(comm.rank());
    if (same_node == comm.through_network(r))
      return Status(StatusCode::kFailedPrecondition,
                    "rank " + std::to_string(r) + (same_node ? " reports this node's name but is reached through the "
                                                               "network (two daemons with one node name? give each "
                                                               "daemon its own node.name; or network_for_local is set)"
                                                             : " is on another node but on this daemon"));
  }
  for (uint32_t i = 1; i < l.gpus; ++i) {
    const uint32_t p = l.node_peer(comm.rank(), i);
    if (!comm.nvlink_mapped(p))
      return Status(StatusCode::kFailedPrecondition,
                    "rank " + std::to_string(p) + " is on this node but its NVLink buffer is not mapped here "
                    "(Options::nvlink_bytes must be set on every rank)");
  }
  if (!comm.nvlink_mapped(comm.rank()))
    return Status(StatusCode::kFailedPrecondition,
                  "fused ops keep their workspace in the NVLink buffer: set Options::nvlink_bytes (see "
                  "all_gather_gemm_nvlink_bytes)");
  return l;
}

inline Status from_gemm(const mk::GemmResult& r, const std::string& what) {
  if (r.ok()) return Status::Ok();
  StatusCode code = StatusCode::kInvalidArgument;
  switch (r.code) {
    case mk::GemmError::kWorkspaceTooSmall: code = StatusCode::kResourceExhausted; break;
    case mk::GemmError::kUnsupportedDevice: code = StatusCode::kFailedPrecondition; break;
    case mk::GemmError::kCudaError: code = StatusCode::kDeviceError; break;
    default: break;
  }
  return Status(code, what + ": " + r.message);
}

// A plan's split as the public API reports it (ops.h SplitState).
inline SplitState to_split_state(const mk::SplitReport& r) {
  SplitState s;
  s.adaptive = r.adaptive;
  s.settled = r.phase == mk::kSplitSettled;
  s.pinned = r.pinned != 0;
  s.comm_blocks = static_cast<int>(r.next_comm);
  s.last_comm_blocks = static_cast<int>(r.last_comm);
  s.launches = r.launches;
  s.last_us = r.last_us;
  s.last_wait_us = r.last_wait_us;
  s.last_compute_done_us = r.last_compute_done_us;
  s.last_comm_done_us = r.last_comm_done_us;
  s.grid_blocks = static_cast<int>(r.grid);
  for (const auto& c : r.candidates) s.candidates.push_back(static_cast<int>(c.comm));
  s.text = r.describe();
  return s;
}

// The current device is the communicator's and a Hopper GPU.
inline Status check_device(const Communicator& comm, const std::string& what) {
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev))
    return Status(StatusCode::kDeviceError, what + ": cannot read the current device's compute capability");
  if (dev != comm.cuda_device())
    return Status(StatusCode::kFailedPrecondition, what + ": the current CUDA device is " + std::to_string(dev) +
                                                       ", the communicator's is " + std::to_string(comm.cuda_device()));
  if (major != 9 || minor != 0)
    return Status(StatusCode::kFailedPrecondition, what + ": needs a Hopper GPU (compute capability 9.0, sm_90a); "
                                                          "device " + std::to_string(dev) + " is " +
                                                          std::to_string(major) + "." + std::to_string(minor));
  return Status::Ok();
}

struct PointerArg {
  const char* name;
  const void* p;
  bool optional;
};

// Each pointer is 16-byte aligned device memory of the communicator's GPU (null where optional).
inline Status check_pointers(const Communicator& comm, const std::string& what, std::initializer_list<PointerArg> ptrs) {
  for (const auto& p : ptrs) {
    if (p.p == nullptr && p.optional) continue;
    if (p.p == nullptr || reinterpret_cast<uintptr_t>(p.p) % 16 != 0)
      return Status(StatusCode::kInvalidArgument, what + ": pointer " + p.name + " is " +
                                                      (p.p == nullptr ? "null" : "not 16-byte aligned") +
                                                      "; expected 16-byte aligned device memory");
    cudaPointerAttributes attr{};
    if (cudaPointerGetAttributes(&attr, p.p) != cudaSuccess || attr.type != cudaMemoryTypeDevice ||
        attr.device != comm.cuda_device()) {
      (void)cudaGetLastError();
      return Status(StatusCode::kInvalidArgument, what + ": pointer " + p.name +
                                                      " is not device memory of this rank's GPU (device " +
                                                      std::to_string(comm.cuda_device()) + ")");
    }
  }
  return Status::Ok();
}

}  // namespace mkernel::rt::ops_detail
