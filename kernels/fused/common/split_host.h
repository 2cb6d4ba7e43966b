// split_host.h: host side of the adaptive split (common/split_control.h, split_policy.h): a
// plan's SplitControl in device memory, made, pinned and read back. Header-only host code for the
// fused ops' launchers (ag_gemm.cu, ring_attn.cu); errors come back as text ("" = none) for each
// op to wrap in its own result type.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "common/split_control.h"

namespace mkernel::kernels {

// What a plan knows when it makes its SplitControl.
struct SplitSetup {
  bool adaptive = false;  // false: the split stays at start_comm (the words are still read and measured)
  uint32_t grid = 0;      // blocks of every launch
  uint32_t unit = 1;      // blocks per cluster
  uint32_t units = 0;     // pieces of compute work (cluster tiles, attention units)
  uint32_t start_comm = 0;  // the plan's default split
  uint32_t min_comm = 1, max_comm = 0;  // the range the policy may use
};

// A plan's split, read back (SplitControl).
struct SplitReport {
  bool adaptive = false;
  uint32_t next_comm = 0, pinned = 0, last_comm = 0, grid = 0;
  uint32_t launches = 0, failed_launches = 0, moves = 0;
  uint32_t phase = kSplitExplore;
  float last_us = 0, last_wait_us = 0, last_compute_done_us = 0, last_comm_done_us = 0;
  struct Candidate {
    uint32_t comm = 0;
    float time_us = 0;  // the lowest launch time measured at it
    uint32_t samples = 0;
  };
  std::vector<Candidate> candidates;
  uint32_t best = 0;  // index into candidates (valid once one has samples)

  // One line: "adaptive settled comm=6 (next 6) last 812.3 us, compute waited 3.1 us, launches 14, moves 5;
  // 2:1090.2 4:840.1 6*:811.9 ..."
  std::string describe() const {
    char head[256];
    std::snprintf(head, sizeof(head),
                  "%s %s comm=%u (next %u%s) last %.1f us, compute waited %.1f us, launches %u%s, moves %u",
                  adaptive ? "adaptive" : "static",
                  phase == kSplitSettled ? "settled" : phase == kSplitRefine ? "refining" : "exploring", last_comm,
                  next_comm, pinned != 0 ? ", pinned" : "", last_us, last_wait_us, launches,
                  failed_launches != 0 ? (" (" + std::to_string(failed_launches) + " failed)").c_str() : "", moves);
    std::string s = head;
    if (!adaptive) return s;
    s += ";";
    for (size_t i = 0; i < candidates.size(); ++i) {
      const Candidate& c = candidates[i];
      s += " " + std::to_string(c.comm) + (i == best && c.samples != 0 ? "*" : "");
      if (c.samples != 0) {
        char t[32];
        std::snprintf(t, sizeof(t), ":%.1f", c.time_us);
        s += t;
      }
    }
    return s;
  }
};

// Candidates and policy (split_policy.h), then the state into new device memory at *out.
inline std::string split_control_create(const SplitSetup& s, SplitControl** out) {
  *out = nullptr;
  SplitControl h;
  h.grid = s.grid;
  h.unit = s.unit == 0 ? 1 : s.unit;
  h.next_comm = split_clamp_comm(s.start_comm, h.grid, h.unit);
  if (h.next_comm == 0)
    return "the adaptive split needs a grid of at least two clusters (grid " + std::to_string(s.grid) + ", clusters of " +
           std::to_string(h.unit) + ")";
  if (s.adaptive) {
    uint16_t cand[kSplitMaxCandidates];
    const uint32_t max_comm = s.max_comm != 0 ? s.max_comm : s.grid / 4;
    const uint32_t n = split_candidates(s.units, h.grid, h.unit, s.min_comm, max_comm, cand);
    if (n == 0)
      return "the adaptive split has no candidate between " + std::to_string(s.min_comm) + " and " +
             std::to_string(max_comm) + " communication blocks of " + std::to_string(s.grid);
    split_policy_init(h.policy, cand, n, h.next_comm);
    h.next_comm = split_policy_comm(h.policy);
    h.adaptive = 1;
  }
  void* p = nullptr;
  if (cudaError_t e = cudaMalloc(&p, sizeof(SplitControl)); e != cudaSuccess)
    return std::string("cudaMalloc (adaptive split state): ") + cudaGetErrorString(e);
  if (cudaError_t e = cudaMemcpy(p, &h, sizeof(h), cudaMemcpyHostToDevice); e != cudaSuccess) {
    (void)cudaFree(p);
    return std::string("cudaMemcpy (adaptive split state): ") + cudaGetErrorString(e);
  }
  *out = static_cast<SplitControl*>(p);
  return {};
}

// Pins the split to `comm` communication blocks (0: unpinned). Synchronous, between launches:
// call with no launch of the plan in flight (e.g. after synchronising its stream).
inline std::string split_control_pin(SplitControl* dev, uint32_t comm, uint32_t grid, uint32_t unit) {
  if (comm != 0 && split_clamp_comm(comm, grid, unit) != comm)
    return "pin: " + std::to_string(comm) + " communication blocks is not a whole number of clusters of " +
           std::to_string(unit) + " leaving at least one cluster of the " + std::to_string(grid) + " blocks to compute";
  if (cudaError_t e = cudaMemcpy(&dev->pinned, &comm, sizeof(comm), cudaMemcpyHostToDevice); e != cudaSuccess)
    return std::string("cudaMemcpy (pinning the split): ") + cudaGetErrorString(e);
  return {};
}

// Reads the state back (synchronous: call once the launches of interest finished).
inline std::string split_control_read(const SplitControl* dev, SplitReport* r) {
  SplitControl h;
  if (cudaError_t e = cudaMemcpy(&h, dev, sizeof(h), cudaMemcpyDeviceToHost); e != cudaSuccess)
    return std::string("cudaMemcpy (reading the split state): ") + cudaGetErrorString(e);
  *r = SplitReport{};
  r->adaptive = h.adaptive != 0;
  r->next_comm = h.pinned != 0 ? h.pinned : h.next_comm;
  r->pinned = h.pinned;
  r->last_comm = h.last_comm;
  r->grid = h.grid;
  r->launches = h.launches;
  r->failed_launches = h.failed_launches;
  r->moves = h.policy.moves;
  r->phase = h.adaptive != 0 ? h.policy.phase : static_cast<uint32_t>(kSplitSettled);
  r->last_us = h.last_us;
  r->last_wait_us = h.last_wait_us;
  r->last_compute_done_us = h.last_compute_done_us;
  r->last_comm_done_us = h.last_comm_done_us;
  r->best = h.policy.best;
  for (uint32_t i = 0; i < h.policy.n && i < kSplitMaxCandidates; ++i)
    r->candidates.push_back({h.policy.comm[i], h.policy.time_us[i], h.policy.samples[i]});
  return {};
}

}  // namespace mkernel::kernels
