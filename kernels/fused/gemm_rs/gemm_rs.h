// gemm_rs.h: host side of the fused GEMM+ReduceScatter kernel (device code: gemm_rs.cuh; the
// plan: gemm_rs_plan.h). Applications use the runtime's entry points (mkernel/runtime/ops.h),
// which add the communicator's checks and the agreement between ranks.
//
//   rank r:  C_r [m_local, n] = rows r * m_local ... of  sum over q of  A_q [M, k] * W_q [n, k]^T
//            (A_q, W_q: rank q's operands; k is each rank's share of the reduction dimension)
//   AllReduce: C [M, n] = sum over q of A_q * W_q^T on every rank (the same bits everywhere).
//
// Workspace (on the communicator, the same on every rank): the NVLink buffer holds the staged
// partials of the node peers (gemm_rs_nvl_bytes) and its fused-op flags; between nodes the network
// workspace holds a receive and a send slot per node, and the flag array the arrivals.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>

#include "common/comm.cuh"
#include "fused/gemm_rs/gemm_rs_plan.h"
#include "gemm/sm90_bf16_gemm.h"

namespace mkernel::kernels {

struct GemmRsRoleArgs;  // gemm_rs.cuh

struct GemmRsConfig {
  int gemm_blocks = 0;  // 0: every SM
  int block_n = 0;      // 128 or 256; 0: the engine's choice for the shape (the same on every rank:
                        // the staged tiles' layout depends on it, so ranks must agree on it)
  int cluster_m = 0;    // 1 or 2; 0: the engine's choice
  // The kernel's launch overlaps the end of the launch's begin_launch kernel (programmatic
  // dependent launch; every block waits for it before touching memory). Off by default: built
  // and compiled, not yet run on a GPU (docs/kernels.md section 11, "Launch overhead").
  bool programmatic_launch = false;
};

struct GemmRsSetup {
  DeviceComm comm;
  WaitContext wait;
  FusedLayout layout;      // layout.world() == comm.world_size
  uint32_t m_local = 0;    // rows of C_r (M = world * m_local)
  uint32_t n = 0;          // multiple of 8
  uint32_t k = 0;          // this rank's share of the reduction dimension, multiple of 8
  bool all_reduce = false; // GEMM+AllReduce: C is [M, n] on every rank (plan note 7)
  uint32_t m_rows = 0;     // M when the bands are uneven (RsGeometry::m_rows; then m_local is unused)
  GemmRsConfig config;
};

class GemmRsPlan {
 public:
  static GemmResult create(const GemmRsSetup& setup, std::unique_ptr<GemmRsPlan>* out);
  ~GemmRsPlan();
  GemmRsPlan(const GemmRsPlan&) = delete;
  GemmRsPlan& operator=(const GemmRsPlan&) = delete;

  // Enqueues one launch on `stream` (the caller enqueued begin_launch first): a [M, k], w [n, k],
  // c [m_local, n] ([M, n] for AllReduce), bf16, packed, 16-byte aligned. Asynchronous; device-side errors land in the
  // communicator's status word.
  GemmResult launch(const void* a, const void* w, void* c, cudaStream_t stream);

  const RsGeometry& geometry() const { return geo_; }
  const RsOrder& order() const { return order_; }
  const GemmPlan& gemm() const { return gemm_; }
  std::string describe() const;

 private:
  GemmRsPlan() = default;
  GemmRsSetup setup_;
  RsGeometry geo_;
  RsOrder order_;
  GemmPlan gemm_;
  GemmRsRoleArgs* role_args_ = nullptr;
  void* split_workspace_ = nullptr;
};

}  // namespace mkernel::kernels
