// split_policy.h: the adaptive split of a persistent fused kernel's blocks between its compute
// role (GEMM tiles, attention units) and its communication role. Plain arithmetic on plain data,
// host and device: the kernel's last block runs split_policy_step after every launch (device
// memory, common/split_control.h), the CPU tests run the same function against modelled kernels.
//
// Design notes
//  1. What moves. A fused kernel's grid is fixed by its plan (one block per SM that fits); the
//     split is where the boundary between the roles lies, read by every block at the start of a
//     launch. Moving it never changes results: the compute role's decomposition (tiles, k splits,
//     attention units) is fixed by the plan and only which block takes which piece changes, and
//     the communication role moves bytes (every block a slice of every step). The split moves
//     between launches, at the boundary where every tile of one launch is done and none of the
//     next has started.
//  2. Candidates. The compute role's time goes in waves (ceil(units / compute blocks)), so among
//     the counts that give the compute role the same number of waves the one with the most
//     communication blocks is, to first order, at least as good as the others: the largest count
//     of each wave plateau within [min_comm, max_comm] (whole clusters) is a candidate. Where the
//     data gates the compute, a count inside a plateau can still win (a modelled case lost 4%
//     to the plateau's end), so counts spread evenly over the rest of the range join them,
//     kSplitMaxCandidates in all, ascending; with more plateaus than that, the plateaus are
//     thinned evenly, both ends kept.
//  3. What is measured, per launch (common/split_control.cuh): the launch's time (first block in
//     to last block out), when the compute role and the communication role finished, and the
//     time the compute role spent waiting for data (readiness flags), averaged over its blocks.
//     From these a direction: the compute role waited for data more than kSplitWaitHigh of the
//     launch, or the communication ran on that long after the compute finished: communication
//     is the bottleneck, give it more blocks (+1); the communication
//     blocks sat idle at the end for more than kSplitIdleHigh of the launch while compute hardly
//     waited (under kSplitWaitLow): give compute more blocks (-1); else stay (0).
//     Late peers. A collective launch cannot end before its last rank started: a rank that
//     starts late (its host launched later, its previous kernel ran longer) lengthens every
//     other rank's launch, and that time shows as the compute role waiting for data. Measured on
//     one H200 with two ranks, a third to a half of the launches were so delayed, by 1-4 times
//     the launch's own time. A delay only ever adds, so the policy reads each candidate by its
//     fastest launch: its time is the lowest launch time measured at it, and the direction comes
//     from the fastest launch of a dwell, whose wait is the kernel's own.
//  4. Policy. A hill climb over the candidates guided by the direction and checked by the
//     launch times: a candidate is judged after kSplitDwell launches at it; the step starts at a
//     quarter of the candidates and halves on every reversal and every move that made the
//     launch slower (which also returns to the best one measured, kSplitTolerance). When the
//     direction says stay, or points off the list, or to a candidate measured already at a step
//     of one, it refines by the times alone: the unmeasured neighbours of that candidate and of
//     the best one are tried (the last direction's side first), and it settles on the best once
//     none is left: a local minimum of the measured times. (Noise can still hide a narrow dip
//     in a flat stretch of the list from a local search: one modelled kernel of 300 settled at
//     0.96 of its best static split; the CPU test prints such cases.) It
//     settles on the best measured after kSplitExploreLaunches launches whatever happens, so it
//     always ends. The first launch of a plan is not measured (cold caches, first touch).
//  5. Settled, it holds the split and watches windows of kSplitReopenLaunches launches: the
//     fastest launch of the first window is the reference, and when the fastest of each of
//     kSplitReopenWindows windows in a row is off it by more than kSplitDrift (either way: the
//     machine, the link or the neighbours changed; a late peer delays some launches, not all of
//     them) it forgets every measurement and explores again from where it is, with a step of an
//     eighth of the candidates. The reference is a window's fastest, not the candidate's lowest
//     time while exploring: that one is the luckiest of its launches, and on a path whose launch
//     times spread by several percent either way (the emulated network: host proxies) windows
//     fell short of it often enough to reopen the search again and again (modelled: 6%
//     launch-to-launch noise settled on splits down to 0.24 of the best; split_policy_test).
//  6. State. SplitPolicy holds all of it (a few hundred bytes per plan): the candidates, per
//     candidate its time and sample count, the current and best index, direction, step, dwell,
//     phase, counters, the fastest launch of the current dwell (or settled, of the window) and
//     the settled reference. It lives in the plan's
//     device memory, so it carries over from one launch (or graph replay) to the next; a new
//     plan starts from the plan's default split. Each rank has its own: ranks may settle on
//     different splits (the results do not depend on it; note 1).
#pragma once

#include <cstdint>

#ifndef MKERNEL_HOST_DEVICE
#if defined(__CUDACC__)
#define MKERNEL_HOST_DEVICE __host__ __device__
#else
#define MKERNEL_HOST_DEVICE
#endif
#endif

namespace mkernel::kernels {

inline constexpr uint32_t kSplitMaxCandidates = 32;
inline constexpr uint32_t kSplitDwell = 2;          // launches at a candidate before judging it, at least...
inline constexpr float kSplitAgree = 0.04f;         // ...until its two fastest agree this closely...
inline constexpr uint32_t kSplitMaxDwell = 6;       // ...or this many
inline constexpr float kSplitTolerance = 0.02f;     // slower than the best by more: a worse candidate
inline constexpr float kSplitWaitHigh = 0.03f;      // compute waited this share of the launch: +1
inline constexpr float kSplitWaitLow = 0.015f;      // compute waited under this share: may go -1
inline constexpr float kSplitIdleHigh = 0.08f;      // communication idle this share at the end: -1
inline constexpr float kSplitDrift = 0.08f;         // settled: the fastest launch of a window this far off...
inline constexpr uint32_t kSplitReopenLaunches = 8; // ...over a window of this many launches...
inline constexpr uint32_t kSplitReopenWindows = 2;  // ...in this many windows in a row: explore again
inline constexpr uint32_t kSplitExploreLaunches = 96;

enum SplitPhase : uint32_t {
  kSplitExplore = 0,  // guided by the direction
  kSplitSettled = 1,
  kSplitRefine = 2,   // by the times alone, around the best candidate
};

// One launch's measurements (note 3), in microseconds from the launch's start.
struct SplitSample {
  float launch_us = 0;        // first block in to last block out
  float compute_done_us = 0;  // the last compute block done
  float comm_done_us = 0;     // the last communication block done
  float compute_wait_us = 0;  // waiting for data, averaged over the compute blocks
};

struct SplitPolicy {
  uint32_t n = 0;                             // candidates
  uint16_t comm[kSplitMaxCandidates] = {};    // communication blocks, ascending
  float time_us[kSplitMaxCandidates] = {};    // the lowest launch time measured at it (note 3)
  uint16_t samples[kSplitMaxCandidates] = {}; // launches measured (saturating)
  uint32_t cur = 0;                           // the candidate of the next launch
  uint32_t best = 0;                          // the fastest measured (valid once measured)
  uint32_t anchor = 0;                        // refining: where the direction ran out
  int32_t dir = 0;                            // the last move's direction
  uint32_t stride = 1;                        // the step, in candidates
  uint32_t dwell = 0;                         // launches measured at cur since it was chosen
  uint32_t phase = kSplitExplore;
  uint32_t launches = 0;                      // launches seen by this policy
  uint32_t explored = 0;                      // launches since exploring began
  uint32_t window = 0;                        // settled: launches in the current window
  uint32_t moves = 0;                         // moves made (for reports)
  // The fastest launch of the current dwell (settled: of the window; its time only), for the
  // direction: its time, its compute wait, the communication's idle time at its end and its run
  // past the compute's end.
  float fast_launch = 0, fast_wait = 0, fast_idle = 0, fast_tail = 0;
  float second_launch = 0;  // the dwell's second fastest launch
  uint32_t rechecked = 0;   // candidates measured a second time (bit i: candidate i)
  float settled_ref = 0;    // settled: the fastest launch of the first window (0: not yet)
  uint32_t drifted = 0;     // settled: windows in a row whose fastest launch was off settled_ref
};

// Note 2 (host code, at plan time). units: pieces of compute work (cluster tiles, attention units) spread over the compute
// blocks; grid: blocks of the launch; unit: blocks per cluster (compute and communication blocks
// both come in whole clusters); [min_comm, max_comm]: the communication blocks allowed. Writes at
// most kSplitMaxCandidates counts into out, ascending; returns how many (0 when none fits).
inline uint32_t split_candidates(uint32_t units, uint32_t grid, uint32_t unit, uint32_t min_comm,
                                                     uint32_t max_comm, uint16_t* out) {
  if (unit == 0 || grid <= unit) return 0;
  min_comm = (min_comm + unit - 1) / unit * unit;
  if (min_comm == 0) min_comm = unit;
  if (max_comm > grid - unit) max_comm = grid - unit;
  max_comm -= max_comm % unit;
  if (min_comm > max_comm) return 0;
  if (units == 0) units = 1;
  // Largest count of each plateau of waves(c) = ceil(units / ((grid - c) / unit)), descending.
  uint16_t all[512];
  uint32_t count = 0;
  uint32_t prev_waves = 0;
  for (uint32_t c = max_comm + unit; c > min_comm;) {
    c -= unit;
    const uint32_t clusters = (grid - c) / unit;
    const uint32_t waves = (units + clusters - 1) / clusters;
    if (count == 0 || waves != prev_waves) {
      if (count < 512) all[count++] = static_cast<uint16_t>(c);
      prev_waves = waves;
    }
  }
  // The plateaus' counts (thinned evenly when there are more than kSplitMaxCandidates, both
  // ends kept), then counts spread evenly over the range up to kSplitMaxCandidates in all: inside
  // a plateau, fewer communication blocks can still win where the data gates the compute.
  bool pick[512] = {};
  uint32_t n = 0;
  const uint32_t plateaus = count < kSplitMaxCandidates ? count : kSplitMaxCandidates;
  for (uint32_t i = 0; i < plateaus; ++i) {
    const uint32_t j = plateaus == count ? i : static_cast<uint32_t>((uint64_t{i} * (count - 1)) / (kSplitMaxCandidates - 1));
    pick[(all[j] - min_comm) / unit] = true;
    ++n;
  }
  uint32_t counts = (max_comm - min_comm) / unit + 1;  // every count in the range
  if (counts > 512) counts = 512;
  // The counts not picked yet, `free` of them spread evenly (both ends of what is left kept).
  const uint32_t free = kSplitMaxCandidates > n ? kSplitMaxCandidates - n : 0;
  uint16_t rest[512];
  uint32_t left = 0;
  for (uint32_t k = 0; k < counts; ++k)
    if (!pick[k]) rest[left++] = static_cast<uint16_t>(k);
  if (left <= free) {
    for (uint32_t i = 0; i < left; ++i) pick[rest[i]] = true;
  } else if (free == 1) {
    pick[rest[left / 2]] = true;
  } else {
    for (uint32_t i = 0; i < free; ++i) pick[rest[(uint64_t{i} * (left - 1)) / (free - 1)]] = true;
  }
  n = 0;
  for (uint32_t k = 0; k < counts && k < 512; ++k)
    if (pick[k]) out[n++] = static_cast<uint16_t>(min_comm + k * unit);
  return n;
}

// Sets up a policy over `n` candidates starting at the one nearest to `start_comm` blocks.
MKERNEL_HOST_DEVICE inline void split_policy_init(SplitPolicy& s, const uint16_t* comm, uint32_t n,
                                                  uint32_t start_comm) {
  s = SplitPolicy{};
  if (n > kSplitMaxCandidates) n = kSplitMaxCandidates;
  s.n = n;
  uint32_t nearest = 0, gap = 0xFFFFFFFFu;
  for (uint32_t i = 0; i < n; ++i) {
    s.comm[i] = comm[i];
    const uint32_t d = comm[i] > start_comm ? comm[i] - start_comm : start_comm - comm[i];
    if (d < gap) gap = d, nearest = i;
  }
  s.cur = s.best = nearest;
  s.stride = n >= 8 ? n / 4 : 1;
  s.phase = n <= 1 ? kSplitSettled : kSplitExplore;
}

// Communication blocks of the next launch.
MKERNEL_HOST_DEVICE inline uint32_t split_policy_comm(const SplitPolicy& s) { return s.n == 0 ? 0 : s.comm[s.cur]; }

namespace split_detail {

MKERNEL_HOST_DEVICE inline void settle(SplitPolicy& s);
MKERNEL_HOST_DEVICE inline void move_to(SplitPolicy& s, uint32_t next, int32_t dir);
MKERNEL_HOST_DEVICE inline bool measured(const SplitPolicy& s, uint32_t i);

// Refining (note 4): the unmeasured neighbours of the candidate where the direction ran out (the
// anchor; the last direction's side first), then of the best candidate; once none is left the
// best is a local minimum of the measured times.
MKERNEL_HOST_DEVICE inline void refine(SplitPolicy& s) {
  if (s.phase != kSplitRefine) s.anchor = s.cur;
  s.phase = kSplitRefine;
  const uint32_t around[2] = {s.anchor, s.best};
  for (uint32_t a : around) {
    const bool has_lo = a > 0 && !measured(s, a - 1), has_hi = a + 1 < s.n && !measured(s, a + 1);
    if (!has_lo && !has_hi) continue;
    const bool up = has_hi && (!has_lo || s.dir >= 0);
    move_to(s, up ? a + 1 : a - 1, up ? 1 : -1);
    return;
  }
  settle(s);
}

MKERNEL_HOST_DEVICE inline void settle(SplitPolicy& s) {
  s.phase = kSplitSettled;
  s.cur = s.best;
  s.window = 0;
  s.settled_ref = 0;
  s.drifted = 0;
  s.dwell = 0;
  s.fast_launch = s.fast_wait = s.fast_idle = s.fast_tail = 0;
}

MKERNEL_HOST_DEVICE inline void move_to(SplitPolicy& s, uint32_t next, int32_t dir) {
  s.cur = next;
  s.dir = dir;
  s.dwell = 0;
  s.fast_launch = s.fast_wait = s.fast_idle = s.fast_tail = 0;
  ++s.moves;
}

MKERNEL_HOST_DEVICE inline bool measured(const SplitPolicy& s, uint32_t i) { return s.samples[i] >= kSplitDwell; }

MKERNEL_HOST_DEVICE inline void find_best(SplitPolicy& s) {
  bool any = false;
  for (uint32_t i = 0; i < s.n; ++i) {
    if (s.samples[i] == 0) continue;
    if (!any || s.time_us[i] < s.time_us[s.best]) s.best = i;
    any = true;
  }
}

}  // namespace split_detail

// The direction of note 3 from one launch (its time, compute wait, communication idle at the
// end, communication still running after the compute finished).
MKERNEL_HOST_DEVICE inline int32_t split_direction(float launch, float wait, float idle, float tail) {
  if (launch <= 0) return 0;
  const float w = wait / launch, i = idle / launch;
  if (w > kSplitWaitHigh || tail / launch > kSplitWaitHigh) return 1;
  if (w < kSplitWaitLow && i > kSplitIdleHigh) return -1;
  return 0;
}

// One launch measured (note 4 and 5); updates the policy and returns the communication blocks of
// the next launch.
MKERNEL_HOST_DEVICE inline uint32_t split_policy_step(SplitPolicy& s, const SplitSample& m) {
  using namespace split_detail;
  if (s.n == 0) return 0;
  ++s.launches;
  if (s.launches == 1 || !(m.launch_us > 0)) return s.comm[s.cur];  // the first launch is not measured
  const uint32_t c = s.cur;
  if (s.phase == kSplitSettled) {
    // Note 5: the settled candidate's time is frozen; a window whose fastest launch is off it
    // reopens the search.
    if (s.time_us[c] <= 0) {
      s.time_us[c] = m.launch_us;
      if (s.samples[c] < 0xFFFF) ++s.samples[c];
    }
    if (s.window == 0 || m.launch_us < s.fast_launch) s.fast_launch = m.launch_us;
    if (++s.window < kSplitReopenLaunches) return s.comm[s.cur];
    s.window = 0;
    if (!(s.settled_ref > 0)) {  // the first window sets the reference
      s.settled_ref = s.fast_launch;
      return s.comm[s.cur];
    }
    const float off = (s.fast_launch - s.settled_ref) / s.settled_ref;
    s.drifted = (off > kSplitDrift || off < -kSplitDrift) ? s.drifted + 1 : 0;
    if (s.drifted >= kSplitReopenWindows && s.n > 1) {
      for (uint32_t i = 0; i < s.n; ++i) s.time_us[i] = 0, s.samples[i] = 0;
      s.rechecked = 0;
      s.phase = kSplitExplore;
      s.best = c;
      s.stride = s.n >= 16 ? s.n / 8 : 1;
      s.dir = 0;
      s.explored = 0;
      s.dwell = 0;
      s.fast_launch = s.fast_wait = s.fast_idle = s.fast_tail = 0;
    }
    return s.comm[s.cur];
  }
  // Exploring: record (note 3: the lowest time; the dwell's fastest launch for the direction).
  if (s.samples[c] == 0 || m.launch_us < s.time_us[c]) s.time_us[c] = m.launch_us;
  if (s.samples[c] < 0xFFFF) ++s.samples[c];
  if (s.dwell == 0 || m.launch_us < s.fast_launch) {
    s.second_launch = s.dwell == 0 ? 0 : s.fast_launch;
    s.fast_launch = m.launch_us;
    s.fast_wait = m.compute_wait_us;
    const float idle = m.launch_us - m.comm_done_us;
    s.fast_idle = idle > 0 ? idle : 0;
    const float tail = m.comm_done_us - m.compute_done_us;
    s.fast_tail = tail > 0 ? tail : 0;
  } else if (s.dwell == 1 || m.launch_us < s.second_launch) {
    s.second_launch = m.launch_us;
  }
  ++s.dwell;
  ++s.explored;
  find_best(s);
  if (s.explored >= kSplitExploreLaunches) {
    settle(s);
    return s.comm[s.cur];
  }
  // Judged once its two fastest launches agree (a late peer seldom delays two by the same), or
  // after kSplitMaxDwell launches.
  if (s.dwell < kSplitDwell) return s.comm[c];
  if (s.dwell < kSplitMaxDwell && s.second_launch > s.fast_launch * (1.0f + kSplitAgree)) return s.comm[c];
  if (s.phase == kSplitRefine) {
    refine(s);  // around the best so far (which may now be this one)
    return s.comm[s.cur];
  }
  // A move that made things slower: back to the best, smaller steps.
  if (c != s.best && s.time_us[c] > s.time_us[s.best] * (1.0f + kSplitTolerance)) {
    s.stride = s.stride > 1 ? s.stride / 2 : 1;
    move_to(s, s.best, c > s.best ? -1 : 1);
    return s.comm[s.cur];
  }
  const int32_t d = split_direction(s.fast_launch, s.fast_wait, s.fast_idle, s.fast_tail);
  if (d == 0) {
    refine(s);
    return s.comm[s.cur];
  }
  if (s.dir != 0 && d != s.dir) s.stride = s.stride > 1 ? s.stride / 2 : 1;  // a reversal
  const int32_t target = static_cast<int32_t>(c) + d * static_cast<int32_t>(s.stride);
  const int32_t last = static_cast<int32_t>(s.n) - 1;
  const uint32_t next = static_cast<uint32_t>(target < 0 ? 0 : target > last ? last : target);
  if (next == c) {  // at the end of the list in the wanted direction
    refine(s);
    return s.comm[s.cur];
  }
  // The next one known already at the smallest step: nothing more to learn here, unless it was
  // judged slower in one dwell only while the direction points to it from its neighbour: a dwell
  // whose launches were all held back by late peers looks slower than it is (note 3), so it is
  // measured once more.
  if (measured(s, next) && s.stride == 1 && (s.rechecked >> next & 1u) == 0 &&
      s.time_us[next] > s.time_us[s.best] * (1.0f + kSplitTolerance)) {
    s.rechecked |= 1u << next;
    move_to(s, next, d);
    return s.comm[s.cur];
  }
  if (measured(s, next) && (s.stride == 1 || s.time_us[next] > s.time_us[s.best] * (1.0f + kSplitTolerance))) {
    if (s.stride == 1) {
      refine(s);
      return s.comm[s.cur];
    }
    s.stride /= 2;
    return s.comm[s.cur];
  }
  move_to(s, next, d);
  return s.comm[s.cur];
}

}  // namespace mkernel::kernels
