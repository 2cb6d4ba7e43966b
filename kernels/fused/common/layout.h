// layout.h: where the ranks of a fused op are: `nodes` nodes of `gpus` GPUs each, ranks numbered
// node-major (rank = node * gpus + local), as launchers number them. Host and device code.
//
// Inside a node, ranks reach each other over NVLink; between nodes only rail peers talk (GPU g of
// one node with GPU g of another), through the proxies, so each byte crosses the network once
// per node and is then spread over NVLink.
#pragma once

#include <cstdint>

#include "common/status.h"

namespace mkernel::kernels {

struct FusedLayout {
  uint32_t nodes = 1;
  uint32_t gpus = 1;  // per node

  MK_KERNEL_HD constexpr uint32_t world() const { return nodes * gpus; }
  MK_KERNEL_HD constexpr uint32_t node_of(uint32_t rank) const { return rank / gpus; }
  MK_KERNEL_HD constexpr uint32_t local_of(uint32_t rank) const { return rank % gpus; }
  MK_KERNEL_HD constexpr uint32_t rank_of(uint32_t node, uint32_t local) const { return node * gpus + local; }
  // The rank's rail peer on `node`: the GPU with the same local index there.
  MK_KERNEL_HD constexpr uint32_t rail_peer(uint32_t rank, uint32_t node) const { return rank_of(node, local_of(rank)); }
  // Orders that hand each rank first what it needs first. A GEMM over gathered rows starts with
  // its own rows and continues with the next ranks' (r + 1, r + 2, ... wrapping), so a rank
  // sends to r - 1 first (the peer that wants its rows next) and receives from the next node
  // first.
  // The i-th other rank of rank's node, i = 1 .. gpus-1: rank - 1, rank - 2, ... wrapping.
  MK_KERNEL_HD constexpr uint32_t node_peer(uint32_t rank, uint32_t i) const {
    return rank_of(node_of(rank), (local_of(rank) + gpus - i % gpus) % gpus);
  }
  // The i-th node a rank sends to, i = 1 .. nodes-1: node - 1, node - 2, ... wrapping.
  MK_KERNEL_HD constexpr uint32_t send_node(uint32_t node, uint32_t i) const { return (node + nodes - i % nodes) % nodes; }
  // The i-th node a rank receives from, i = 1 .. nodes-1: node + 1, node + 2, ... wrapping.
  MK_KERNEL_HD constexpr uint32_t recv_node(uint32_t node, uint32_t i) const { return (node + i) % nodes; }

  // Flags every fused op shares, at places that depend on the layout only, so a launch may
  // follow a launch of another op or of another shape on the same communicator
  // (launch_state.cuh note 1):
  //   NVLink fused-op flags [0, world): done(p), node peer p finished its previous fused launch
  //     (so its NVLink buffer may be written again);
  //   the flag array's fused-op flags [0, nodes): slot_free(n), node n's rail peer finished its
  //     previous fused launch (so its network workspace may be written again).
  // Each op's own flags follow them (nvl_op_flags / net_op_flags).
  MK_KERNEL_HD constexpr uint32_t done_flag(uint32_t peer) const { return peer; }
  MK_KERNEL_HD constexpr uint32_t slot_free_flag(uint32_t node) const { return node; }
  MK_KERNEL_HD constexpr uint32_t nvl_op_flags() const { return world(); }
  MK_KERNEL_HD constexpr uint32_t net_op_flags() const { return nodes; }
};

}  // namespace mkernel::kernels
