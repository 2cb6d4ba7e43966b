// ag_trace.h: what AllGather+GEMM records with AgGemmConfig::trace (a diagnostic: where a launch's
// time goes), and its report. Host and device.
//
// One array of u64 %globaltimer stamps (nanoseconds), rewritten by every launch; 0 = not reached:
//   [kAgTraceStart]        role block 0 began
//   [kAgTraceGatesOpen]    copy-engine pushes: role block 0 opened the copy streams' gates
//   [kAgTraceStepsDone]    role block 0 finished its part of every step
//   [kAgTraceEnd]          the launch's last block left
//   then per step i of the blocks' plan (ag_trace_step(i) + ...):
//     kAgTraceWaitFrom     block 0 began waiting for the step's inputs
//     kAgTraceInputsReady  ... they were there
//     kAgTraceSliceDone    block 0 copied its slice
//     kAgTracePublished    the last block's slice was done; the step's flag or put follows
//   then per piece p = shard * chunks + chunk (ag_trace_arrival): when role block 0 first saw the
//   chunk in the gathered buffer (its own rows: 0). Role block 0 looks after its steps, so a
//   stamp no earlier than kAgTraceStepsDone means "already there" (the copy-engine gates and the
//   gathered-output copies look in piece order, so a late piece also delays the later stamps).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fused/ag_gemm/ag_gemm_plan.h"

namespace mkernel::kernels {

inline constexpr uint32_t kAgTraceStart = 0;
inline constexpr uint32_t kAgTraceGatesOpen = 1;
inline constexpr uint32_t kAgTraceStepsDone = 2;
inline constexpr uint32_t kAgTraceEnd = 3;
inline constexpr uint32_t kAgTraceHeader = 4;
inline constexpr uint32_t kAgTraceWaitFrom = 0;
inline constexpr uint32_t kAgTraceInputsReady = 1;
inline constexpr uint32_t kAgTraceSliceDone = 2;
inline constexpr uint32_t kAgTracePublished = 3;
inline constexpr uint32_t kAgTracePerStep = 4;

MK_KERNEL_HD constexpr uint32_t ag_trace_step(uint32_t step) { return kAgTraceHeader + step * kAgTracePerStep; }
MK_KERNEL_HD constexpr uint32_t ag_trace_arrival(uint32_t num_steps, uint32_t piece) {
  return kAgTraceHeader + num_steps * kAgTracePerStep + piece;
}
inline uint32_t ag_trace_words(uint32_t num_steps, uint32_t pieces) { return ag_trace_arrival(num_steps, pieces); }

// A text table of one launch's stamps, in microseconds from kAgTraceStart: the header times, one
// line per step (kind, shard, chunk, peer or node, bytes, and its four stamps), then the
// arrivals per shard. `steps` are the blocks' steps the kernel ran (ag_block_steps).
std::string ag_trace_report(const AgGeometry& g, const std::vector<AgStep>& steps, const std::vector<uint64_t>& stamps);

}  // namespace mkernel::kernels
