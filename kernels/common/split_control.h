// split_control.h: the adaptive split's state in device memory, one per plan of a fused op
// (the policy: split_policy.h; the device side: split_control.cuh). Plain data.
//
// Design notes
//  1. Every block of a launch reads the split at its start (SplitControl::next_comm, or pinned);
//     nothing writes it during the launch, so all blocks see the same value. The last block to
//     leave, once every block counted itself out, measures the launch, runs the policy and writes
//     the next launch's split; stream order carries it to the next launch (and graph replays,
//     whose kernel parameters point here too).
//  2. The per-launch sums (SplitAccum) are kept with atomics by the blocks as they go and put
//     back to their empty values by that last block, so they are empty at every launch's start.
//  3. A launch whose status word holds an error is not measured (its times say nothing about the
//     split) and counts in failed_launches.
#pragma once

#include <cstdint>

#include "common/split_policy.h"

namespace mkernel::kernels {

inline constexpr unsigned long long kSplitNoStart = ~0ull;

struct SplitAccum {
  unsigned long long start = kSplitNoStart;  // earliest block start (%globaltimer ns)
  unsigned long long compute_done = 0;       // latest compute block done
  unsigned long long comm_done = 0;          // latest communication block done
  unsigned long long compute_wait = 0;       // compute blocks' waits for data, summed (ns)
};

struct SplitControl {
  uint32_t adaptive = 0;      // 1: the policy moves the split; 0: next_comm stays
  uint32_t next_comm = 0;     // communication blocks of the next launch
  uint32_t pinned = 0;        // non-zero: this many, whatever the policy says (it then measures nothing)
  uint32_t grid = 0;          // blocks of every launch of the plan
  uint32_t unit = 1;          // blocks per cluster: both roles come in whole clusters
  uint32_t last_comm = 0;     // communication blocks of the last finished launch
  uint32_t launches = 0;      // finished launches
  uint32_t failed_launches = 0;
  float last_us = 0;          // the last launch's time (first block in to last block out)
  float last_wait_us = 0;     // its compute blocks' average wait for data
  float last_compute_done_us = 0, last_comm_done_us = 0;
  SplitAccum acc;
  SplitPolicy policy;
};

// Communication blocks a launch runs with: pinned, else next_comm; kept to whole clusters and
// within [unit, grid - unit] whatever the words hold (split_clamp_comm).
MKERNEL_HOST_DEVICE inline uint32_t split_clamp_comm(uint32_t comm, uint32_t grid, uint32_t unit) {
  if (unit == 0) unit = 1;
  if (grid < 2 * unit) return 0;
  comm -= comm % unit;
  if (comm < unit) comm = unit;
  if (comm > grid - unit) comm = grid - unit;
  return comm;
}

// The end of a launch (note 1-3) as arithmetic on the state, host and device: the launch's
// measures from the sums (times in ns of %globaltimer, `now` the last block's), the record of the
// last launch, the policy's step unless the split is pinned, fixed or the launch failed, and the
// sums emptied for the next launch. split_launch_end (split_control.cuh) reads the sums and runs it.
MKERNEL_HOST_DEVICE inline void split_control_end(SplitControl& c, const SplitAccum& a, uint64_t now, bool failed) {
  const uint32_t comm = split_clamp_comm(c.pinned != 0 ? c.pinned : c.next_comm, c.grid, c.unit);
  const uint32_t compute_blocks = c.grid > comm ? c.grid - comm : 1;
  SplitSample m;
  if (a.start != kSplitNoStart && now > a.start) {
    m.launch_us = static_cast<float>(now - a.start) * 1e-3f;
    m.compute_done_us = a.compute_done > a.start ? static_cast<float>(a.compute_done - a.start) * 1e-3f : 0.0f;
    m.comm_done_us = a.comm_done > a.start ? static_cast<float>(a.comm_done - a.start) * 1e-3f : 0.0f;
    m.compute_wait_us = static_cast<float>(a.compute_wait) * 1e-3f / static_cast<float>(compute_blocks);
  }
  c.last_comm = comm;
  c.last_us = m.launch_us;
  c.last_wait_us = m.compute_wait_us;
  c.last_compute_done_us = m.compute_done_us;
  c.last_comm_done_us = m.comm_done_us;
  ++c.launches;
  if (failed) {
    ++c.failed_launches;
  } else if (c.adaptive != 0 && c.pinned == 0) {
    c.next_comm = split_policy_step(c.policy, m);
  }
  c.acc = SplitAccum{};
}

}  // namespace mkernel::kernels
