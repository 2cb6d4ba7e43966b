// moe_fused.cu: the fused MoE kernel, dispatch + grouped GEMM + combine in one launch: the
// persistent GEMM engine with grouped traits, its extra blocks running the dispatch and combine
// stages (moe_comm.cuh) as its role. The GEMM blocks wait for the row layout before reading the
// offsets (GemmParams::grouped_offsets_ready) and for each 128-row band of expert rows before
// loading it; the combine waits for the tiles of each token's rows (tile flags with the launch
// number). Host side: MoePlan (moe.cu).
#include "fused/moe/moe.h"
#include "fused/moe/moe_combine.cuh"
#include "gemm/sm90_bf16_gemm.cuh"
#include "gemm/sm90_bf16_grouped_gemm_instance.cuh"

namespace mkernel::kernels {

namespace {

// The role of the GEMM launch's extra blocks (sm90_bf16_gemm.cuh, the role contract). Per-launch
// pointers: role_ptrs[0] x, [1] choices, [2] scores, [3] out. kAdaptive: the instantiation for
// plans with an adaptive split (MoeSetup::adaptive_split; its measures cost registers).
template <bool kAdaptive>
struct MoeFusedRole {
  static constexpr bool kHasBlockExit = true;
  static constexpr bool kAdaptiveSplit = kAdaptive;

  __device__ static void run(const GemmParams& p, uint32_t role_block, uint32_t num_role_blocks) {
    using namespace moe_detail;
    const auto& a = *static_cast<const MoeKernelArgs*>(p.role_args);
    WaitContext w = wait_context(a.comm);
    w.long_wait_shift = kMoeLongWaitShift;  // wait.cuh note 6
    const Ctx x{a, a.comm, launch_number(a.comm), previous_fused_launch(a.comm), w};
    extern __shared__ uint8_t moe_role_smem[];  // the block's shared memory is the role's
    auto* route_smem =
        reinterpret_cast<uint32_t*>((reinterpret_cast<uintptr_t>(moe_role_smem) + 127) & ~uintptr_t{127});
    const MoeDispatchPtrs dp{p.role_ptrs[0],
                             static_cast<const int32_t*>(p.role_ptrs[1]),
                             static_cast<const float*>(p.role_ptrs[2]),
                             a.x_expert,
                             a.expert_offsets,
                             nullptr,
                             nullptr,
                             nullptr};
    if (!dispatch_stages(x, dp, route_smem, role_block, num_role_blocks)) return;
    if (threadIdx.x == 0) MK_TRACE_MARK(1);
    const MoeCombinePtrs cp{a.y_expert, const_cast<void*>(p.role_ptrs[3])};
    (void)combine_stages(x, cp, role_block, num_role_blocks);
    if (threadIdx.x == 0) MK_TRACE_MARK(2);
  }

  // Thread 0 of every block, GEMM or role, after its work: the last one ends the launch.
  __device__ static void block_exit(const GemmParams& p) {
    // Phase trace (common/phase_trace.cuh, diagnostic builds): GEMM blocks 0 start, 1 offsets
    // read, 2 first tile, 3 last load issued, 4 last epilogue, 5 producer's waits (us), 6 tiles;
    // role blocks 0 start, 1 dispatch done, 2 combine done, 3 routed, 4 laid out, 5 dispatch
    // items done, 6 expanded; 7 exit; block 0's steps (moe_comm.cuh): 12 routing block done,
    // 13 positions inverted, 14 routed flag raised, 8 count records in, 9 sizes per expert,
    // 10 scanned, 11 m blocks written.
    MK_TRACE_MARK(7);
    moe_detail::end_launch(*static_cast<const MoeKernelArgs*>(p.role_args), kAdaptive ? p.split : nullptr);
  }
};

template <int kBlockN, int kClusterM>
constexpr bool fits_routing() {
  return GroupedGemmTraits<kBlockN, kClusterM>::kSmemBytes >= 160 * 1024 + 128;
}
static_assert(fits_routing<128, 1>() && fits_routing<256, 2>(), "the routing block's counters need 160 KiB");
static_assert(GroupedGemmTraits<256, 1>::kThreads == kMoeFusedThreads, "role blocks have the GEMM's threads");

}  // namespace

namespace {
template <class Role>
GemmResult launch_moe_role(const GemmPlan& engine, cudaStream_t stream) {
  const bool c2 = engine.config.cluster_m == 2;
  if (engine.config.block_n == 256)
    return c2 ? launch_sm90_bf16_gemm<GroupedGemmTraits<256, 2>, Role>(engine, stream)
              : launch_sm90_bf16_gemm<GroupedGemmTraits<256, 1>, Role>(engine, stream);
  return c2 ? launch_sm90_bf16_gemm<GroupedGemmTraits<128, 2>, Role>(engine, stream)
            : launch_sm90_bf16_gemm<GroupedGemmTraits<128, 1>, Role>(engine, stream);
}
}  // namespace

#if defined(MKERNEL_PHASE_TRACE)
// The phase trace of the last fused launch (diagnostic builds; moe_bench calls it when linked).
extern "C" void mkernel_moe_phase_trace_print() {
  phase_trace::print((1u << 5) | (1u << 6), 0u, "gemm", "role");
}
#endif

GemmResult moe_fused_launch(const GemmPlan& engine, cudaStream_t stream) {
  return engine.params.split != nullptr ? launch_moe_role<MoeFusedRole<true>>(engine, stream)
                                        : launch_moe_role<MoeFusedRole<false>>(engine, stream);
}

}  // namespace mkernel::kernels
