// The adaptive split's policy (kernels/common/split_policy.h) against modelled fused kernels:
// the candidates it considers, where it settles beside the best static split (every count, not
// only its candidates), how fast, whether it stays there under noise, and whether it finds the
// new best when the link changes under it. The model is a persistent kernel whose compute blocks
// run their own rows' tiles first and the others' as the communication blocks deliver them
// (AllGather+GEMM's shape of work); its parameters are drawn over compute- and link-bound cases.
// Late peers (a share of launches held back by a rank that started late) run beside plain noise.
// SPLIT_TRACE=1 prints every modelled launch of `drive`.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "common/split_control.h"
#include "common/split_policy.h"
#include "common/tile_scheduler.cuh"

namespace mk = mkernel::kernels;

namespace {

// A modelled fused launch with c communication blocks out of `grid`.
struct Model {
  uint32_t grid = 132;
  uint32_t unit = 1;           // blocks per cluster
  uint32_t tiles = 1024;       // compute units
  double own_share = 0.5;      // share of the tiles that need no data (the rank's own rows)
  double tile_us = 9.0;        // one tile on one cluster
  double bytes_mb = 64;        // what the communication blocks move
  double per_block_gbs = 20;   // one block's rate
  double link_gbs = 150;       // the link's
  double overhead_us = 15;

  double comm_us(uint32_t c) const {
    const double rate = std::min(c * per_block_gbs, link_gbs);  // GB/s = kB/us
    return bytes_mb * 1000.0 / rate;
  }
  // Launch time, when the communication finished, and the compute blocks' average wait. The
  // engine's static schedule: cluster j takes tiles j, j + G, j + 2G, ... in order; the first
  // own_share of the tiles need no data, remote tile r (of `rest`) can start once the share
  // (r + 1) / rest of the data arrived (the communication moves it at a steady rate).
  mk::SplitSample run(uint32_t c) const {
    const uint32_t clusters = (grid - c) / unit;
    const uint32_t own = static_cast<uint32_t>(tiles * own_share);
    const uint32_t rest = tiles - own;
    const double tc = comm_us(c);
    double done = 0, wait = 0;
    for (uint32_t j = 0; j < clusters; ++j) {
      double t = 0;
      for (uint32_t i = j; i < tiles; i += clusters) {
        const double need = i < own ? 0.0 : tc * double(i - own + 1) / rest;
        if (need > t) wait += need - t, t = need;
        t += tile_us;
      }
      done = std::max(done, t);
    }
    mk::SplitSample s;
    s.compute_done_us = static_cast<float>(done);
    s.comm_done_us = static_cast<float>(tc);
    s.compute_wait_us = static_cast<float>(wait / clusters);
    s.launch_us = static_cast<float>(std::max(done, tc) + overhead_us);
    return s;
  }
  double time(uint32_t c) const { return run(c).launch_us; }
};

std::vector<uint16_t> candidates(const Model& m, uint32_t min_comm, uint32_t max_comm) {
  uint16_t out[mk::kSplitMaxCandidates];
  const uint32_t n = mk::split_candidates(m.tiles, m.grid, m.unit, min_comm, max_comm, out);
  return std::vector<uint16_t>(out, out + n);
}

// The best static split over every count in [lo, hi] (whole clusters), by the noise-free model.
double best_static(const Model& m, uint32_t lo, uint32_t hi, uint32_t* at = nullptr) {
  double best = 1e30;
  for (uint32_t c = lo; c <= hi; ++c) {
    if ((m.grid - c) % m.unit != 0 || c % m.unit != 0) continue;
    const double t = m.time(c);
    if (t < best) best = t, at != nullptr ? (*at = c) : 0u;
  }
  return best;
}

struct Drive {
  uint32_t settled_at = 0;  // launch at which it settled (0: never)
  uint32_t comm = 0;        // where it ended
  uint32_t changes_after_settling = 0;
};

// A peer that starts late by d (its host launched later, its previous kernel ran longer) holds
// this rank's whole launch back: the compute waits for the peer's data, the communication for
// the peer's free slots, and the launch ends d later.
void delay(mk::SplitSample& x, double d) {
  x.launch_us = static_cast<float>(x.launch_us + d);
  x.compute_done_us = static_cast<float>(x.compute_done_us + d);
  x.comm_done_us = static_cast<float>(x.comm_done_us + d);
  x.compute_wait_us = static_cast<float>(x.compute_wait_us + 0.8 * d);
}

// Late peers as measured on one H200 with two ranks (split_policy.h note 3): a share `late` of
// the launches held back by 0.5 to 3 times the launch's own time.
struct Late {
  double share = 0;
  double operator()(double launch_us, std::mt19937& rng) const {
    std::uniform_real_distribution<double> u01(0.0, 1.0);
    if (share <= 0 || u01(rng) >= share) return 0;
    return launch_us * (0.5 + 2.5 * u01(rng));
  }
};

Drive drive(mk::SplitPolicy& s, const Model& m, uint32_t launches, double noise, std::mt19937& rng, Late late = {}) {
  std::normal_distribution<double> n01(0.0, 1.0);
  Drive r;
  uint32_t comm = mk::split_policy_comm(s);
  for (uint32_t i = 1; i <= launches; ++i) {
    mk::SplitSample x = m.run(comm);
    const double f = 1.0 + noise * n01(rng);
    x.launch_us = static_cast<float>(x.launch_us * f);
    x.compute_done_us = static_cast<float>(x.compute_done_us * f);
    x.comm_done_us = static_cast<float>(x.comm_done_us * f);
    const double d = late(x.launch_us, rng);
    delay(x, d);
    if (std::getenv("SPLIT_TRACE") != nullptr)
      std::printf("  launch %u comm %u: %.0f us (late %.0f) wait %.0f -> phase %u next %u best %u\n", i, comm, x.launch_us, d,
                  x.compute_wait_us, s.phase, mk::split_policy_comm(s), s.comm[s.best]);
    const uint32_t next = mk::split_policy_step(s, x);
    if (s.phase == mk::kSplitSettled && r.settled_at == 0) r.settled_at = i;
    if (r.settled_at != 0 && next != comm && i > r.settled_at) ++r.changes_after_settling;
    comm = next;
  }
  r.comm = comm;
  return r;
}

TEST(SplitPolicy, CandidatesHoldTheLargestCountOfEveryWavePlateau) {
  // 1024 tiles over 132 - c blocks, c in [1, 32]: 7 plateaus of 8 to 10 waves... and counts
  // spread over the rest of the range, 32 in all.
  uint16_t out[mk::kSplitMaxCandidates];
  const uint32_t n = mk::split_candidates(1024, 132, 1, 1, 32, out);
  ASSERT_EQ(n, 32u);
  for (uint32_t i = 0; i < n; ++i) {
    EXPECT_GE(out[i], 1u);
    EXPECT_LE(out[i], 32u);
    if (i > 0) {
      EXPECT_GT(out[i], out[i - 1]);
    }
  }
  auto waves = [](uint32_t c) { return (1024u + (132u - c) - 1) / (132u - c); };
  for (uint32_t c = 1; c <= 32; ++c) {
    const bool largest = c == 32 || waves(c + 1) > waves(c);
    if (largest) {
      EXPECT_NE(std::find(out, out + n, uint16_t(c)), out + n) << "c " << c;
    }
  }
  // 1024 / 8 waves = 128 blocks: c = 4 is the largest count of the 8-wave plateau.
  EXPECT_NE(std::find(out, out + n, uint16_t{4}), out + n);
  // A range wider than the cap: the plateaus' largest counts first, the rest spread.
  const uint32_t m = mk::split_candidates(1024, 132, 1, 1, 60, out);
  ASSERT_EQ(m, 32u);
  for (uint32_t c = 1; c <= 60; ++c) {
    const bool largest = c == 60 || (1024u + (131u - c)) / (131u - c) > (1024u + (132u - c) - 1) / (132u - c);
    if (largest) {
      EXPECT_NE(std::find(out, out + m, uint16_t(c)), out + m) << "c " << c;
    }
  }
}

TEST(SplitPolicy, CandidatesRespectClustersBoundsAndTheCap) {
  uint16_t out[mk::kSplitMaxCandidates];
  // Clusters of 2: even counts only, grid - c even.
  uint32_t n = mk::split_candidates(5000, 132, 2, 1, 40, out);
  ASSERT_EQ(n, 20u);  // every even count of [2, 40]
  for (uint32_t i = 0; i < n; ++i) EXPECT_EQ(out[i], 2 * (i + 1));
  // Many waves: every count is its own plateau; the list is thinned to the cap, ends kept.
  n = mk::split_candidates(100000, 132, 1, 1, 64, out);
  EXPECT_EQ(n, mk::kSplitMaxCandidates);
  EXPECT_EQ(out[0], 1u);
  EXPECT_EQ(out[n - 1], 64u);
  for (uint32_t i = 1; i < n; ++i) EXPECT_GT(out[i], out[i - 1]);
  // Few tiles: one wave whatever the split; every count of the range (the data may gate).
  n = mk::split_candidates(40, 132, 1, 1, 12, out);
  ASSERT_EQ(n, 12u);
  EXPECT_EQ(out[11], 12u);
  // Nothing fits.
  EXPECT_EQ(mk::split_candidates(100, 2, 2, 1, 8, out), 0u);
  EXPECT_EQ(mk::split_candidates(100, 132, 1, 20, 10, out), 0u);
  // max_comm beyond the grid is clipped so one cluster computes.
  n = mk::split_candidates(100000, 8, 1, 1, 100, out);
  ASSERT_EQ(n, 7u);
  EXPECT_EQ(out[n - 1], 7u);
}

TEST(SplitPolicy, OneCandidateIsSettledFromTheStart) {
  mk::SplitPolicy s;
  const uint16_t c[1] = {6};
  mk::split_policy_init(s, c, 1, 10);
  EXPECT_EQ(s.phase, mk::kSplitSettled);
  EXPECT_EQ(mk::split_policy_comm(s), 6u);
  Model m;
  std::mt19937 rng(1);
  const Drive r = drive(s, m, 50, 0.02, rng);
  EXPECT_EQ(r.comm, 6u);
}

TEST(SplitPolicy, TheFirstLaunchIsNotMeasured) {
  mk::SplitPolicy s;
  const uint16_t c[3] = {2, 4, 8};
  mk::split_policy_init(s, c, 3, 4);
  mk::SplitSample x;
  x.launch_us = 1e6f;  // a cold first launch
  mk::split_policy_step(s, x);
  EXPECT_EQ(s.samples[1], 0u);
}

// The cases: a compute-bound GEMM on a fast link, a link-bound one (the emulated network path:
// a few blocks saturate it), a trade-off where the link never saturates, and one with clusters.
std::vector<std::pair<std::string, Model>> cases() {
  std::vector<std::pair<std::string, Model>> v;
  Model m;
  v.push_back({"compute-bound nvlink", m});
  m = Model{};
  m.tiles = 512, m.bytes_mb = 64, m.link_gbs = 3, m.per_block_gbs = 1.2;
  v.push_back({"link-bound network", m});
  m = Model{};
  m.tiles = 768, m.bytes_mb = 96, m.link_gbs = 1e9, m.per_block_gbs = 15;
  v.push_back({"trade-off", m});
  m = Model{};
  m.unit = 2, m.tiles = 2048, m.tile_us = 6, m.bytes_mb = 128;
  v.push_back({"clusters of 2", m});
  m = Model{};
  m.tiles = 128, m.tile_us = 20, m.bytes_mb = 8, m.own_share = 0.125;
  v.push_back({"one wave, 8 ranks", m});
  return v;
}

// The five modelled kernels x 20 noise seeds, `late` holding some launches back (note 3): each
// run settles within the explore bound at 0.97 of the best static split or better. Returns how
// many runs moved after settling.
int modelled_kernels(Late late) {
  int moved = 0;
  for (const auto& [name, m] : cases()) {
    const uint32_t lo = m.unit, hi = 40;
    const auto cand = candidates(m, lo, hi);
    EXPECT_FALSE(cand.empty()) << name;
    if (cand.empty()) return 100;
    uint32_t best_c = 0;
    const double best = best_static(m, lo, hi, &best_c);
    for (uint32_t seed = 1; seed <= 20; ++seed) {
      std::mt19937 rng(seed);
      mk::SplitPolicy s;
      mk::split_policy_init(s, cand.data(), static_cast<uint32_t>(cand.size()), 10);
      const Drive r = drive(s, m, 400, 0.015, rng, late);
      EXPECT_NE(r.settled_at, 0u) << name << " seed " << seed;
      EXPECT_LE(r.settled_at, mk::kSplitExploreLaunches + 1) << name;
      EXPECT_EQ(s.phase, mk::kSplitSettled) << name << " seed " << seed;
      moved += r.changes_after_settling != 0;
      const double got = m.time(r.comm);
      EXPECT_GE(best / got, 0.97) << name << " seed " << seed << ": settled at " << r.comm << " (" << got
                                  << " us), the best static split is " << best_c << " (" << best << " us)";
    }
  }
  return moved;
}

TEST(SplitPolicy, SettlesNearTheBestStaticSplitOnModelledKernels) { EXPECT_EQ(modelled_kernels(Late{}), 0); }

// With 40% of the launches held back by a late peer the policy reads candidates by their fastest
// launches, so it settles as near the best as without.
TEST(SplitPolicy, LatePeersDoNotMoveWhereItSettles) {
  const int moved = modelled_kernels(Late{0.4});
  std::printf("late peers: %d of 100 runs moved after settling\n", moved);
  EXPECT_LE(moved, 5);  // eight late launches in a row (0.4^8 a window) reopen, by design
}

// 300 random modelled kernels; `late` holds some launches back (note 3), `noise` spreads every
// launch's time (one standard deviation, relative). Returns how many settled below 0.97 of their
// best static split (the worst ratio into *worst_out); the geometric mean must be 0.99 or more.
int random_models(Late late, double noise = 0.015, double* worst_out = nullptr) {
  std::mt19937 rng(20261205);
  std::uniform_real_distribution<double> u01(0.0, 1.0);
  auto logu = [&](double lo, double hi) { return lo * std::pow(hi / lo, u01(rng)); };
  int worse = 0;
  double worst = 1.0;
  std::vector<double> ratios, speedup_over_default;
  std::vector<uint32_t> settle_launches;
  for (int trial = 0; trial < 300; ++trial) {
    Model m;
    m.unit = u01(rng) < 0.3 ? 2 : 1;
    m.tiles = static_cast<uint32_t>(logu(64, 8192));
    m.tile_us = logu(3, 30);
    m.own_share = u01(rng) < 0.5 ? 0.5 : 1.0 / (2 + static_cast<int>(u01(rng) * 7));
    m.bytes_mb = logu(4, 512);
    m.per_block_gbs = logu(1, 40);
    m.link_gbs = u01(rng) < 0.3 ? logu(2, 20) : logu(100, 400);
    const uint32_t lo = m.unit, hi = 40;
    const auto cand = candidates(m, lo, hi);
    EXPECT_FALSE(cand.empty());
    if (cand.empty()) return 300;
    const double best = best_static(m, lo, hi);
    mk::SplitPolicy s;
    mk::split_policy_init(s, cand.data(), static_cast<uint32_t>(cand.size()), 10);
    std::mt19937 noise_rng(trial);
    const Drive r = drive(s, m, 300, noise, noise_rng, late);
    EXPECT_NE(r.settled_at, 0u);
    if (r.settled_at == 0) return 300;
    const double ratio = best / m.time(r.comm);
    settle_launches.push_back(r.settled_at);
    ratios.push_back(ratio);
    const uint32_t def = 10 - 10 % m.unit;
    speedup_over_default.push_back(m.time(def) / m.time(r.comm));
    worst = std::min(worst, ratio);
    if (ratio < 0.97) {
      ++worse;
      std::printf("below 0.97: tiles %u tile %.1f us own %.2f %.0f MB block %.1f GB/s link %.0f GB/s unit %u: "
                  "settled at %u (%.0f us), best %.0f us\n",
                  m.tiles, m.tile_us, m.own_share, m.bytes_mb, m.per_block_gbs, m.link_gbs, m.unit, r.comm,
                  m.time(r.comm), best);
    }
  }
  double geo = 0, geo_def = 0;
  for (double x : ratios) geo += std::log(x);
  for (double x : speedup_over_default) geo_def += std::log(x);
  geo = std::exp(geo / static_cast<double>(ratios.size()));
  geo_def = std::exp(geo_def / static_cast<double>(speedup_over_default.size()));
  std::sort(settle_launches.begin(), settle_launches.end());
  std::printf("300 modelled kernels%s, %.1f%% noise: adaptive / best static geo mean %.4f, worst %.4f, %d below 0.97; "
              "over the split of 10: geo mean %.3fx; settled after %u launches (median), %u (90th pct), %u (max)\n",
              late.share > 0 ? " with late peers" : "", 100 * noise, geo, worst, worse, geo_def, settle_launches[150],
              settle_launches[270], settle_launches.back());
  EXPECT_GE(geo, 0.99);
  if (worst_out != nullptr) *worst_out = worst;
  return worse;
}

TEST(SplitPolicy, RandomModelsSettleWithin3PercentOfTheBestStatic) {
  EXPECT_LE(random_models(Late{}), 3);  // a few local minima of the wave-quantised model may trap a hill climb
}

// With 40% of the launches held back: 6 of 300 below 0.97 when this was written (2 without late
// peers; 69 with the policy that averaged its launches, geometric mean 0.968 against 0.998).
TEST(SplitPolicy, RandomModelsWithLatePeersSettleWithin3PercentOfTheBestStatic) {
  EXPECT_LE(random_models(Late{0.4}), 8);
}

// A path whose launch times spread by 6% either way (the emulated network's host proxies): the
// settled split is watched against a window's fastest launch, not the luckiest launch of the
// search, so noise does not reopen the search again and again. When the reference was the
// search's lowest time, this case had 20 below 0.97 and settled as low as 0.24 of the best (the
// search reopened and ended wherever it was); now 15, the worst 0.92.
TEST(SplitPolicy, RandomModelsOnANoisyPathStayNearTheBest) {
  double worst = 0;
  EXPECT_LE(random_models(Late{}, 0.06, &worst), 20);
  EXPECT_GE(worst, 0.85);
}

TEST(SplitPolicy, ReopensWhenTheLinkChanges) {
  Model m;
  m.tiles = 768, m.bytes_mb = 24, m.link_gbs = 1e9, m.per_block_gbs = 40;
  const auto cand = candidates(m, 1, 40);
  mk::SplitPolicy s;
  mk::split_policy_init(s, cand.data(), static_cast<uint32_t>(cand.size()), 10);
  std::mt19937 rng(7);
  Drive r = drive(s, m, 120, 0.01, rng);
  ASSERT_EQ(s.phase, mk::kSplitSettled);
  const uint32_t before = r.comm;
  EXPECT_GE(best_static(m, 1, 40) / m.time(before), 0.97) << "settled at " << before;
  // Each block's pushes get four times slower (a busier link): more blocks pay now.
  m.per_block_gbs = 10;
  r = drive(s, m, 200, 0.01, rng);
  EXPECT_EQ(s.phase, mk::kSplitSettled);
  EXPECT_GT(r.comm, before);
  EXPECT_GE(best_static(m, 1, 40) / m.time(r.comm), 0.97) << "settled at " << r.comm;
}

TEST(SplitPolicy, NoiseAloneDoesNotReopen) {
  Model m;
  const auto cand = candidates(m, 1, 40);
  mk::SplitPolicy s;
  mk::split_policy_init(s, cand.data(), static_cast<uint32_t>(cand.size()), 10);
  std::mt19937 rng(11);
  const Drive r = drive(s, m, 2000, 0.02, rng);
  EXPECT_EQ(r.changes_after_settling, 0u);
}

// Two ranks, each with its own policy (ranks settle independently, split_policy.h note 6), coupled
// the way AllGather+GEMM couples them: a rank's compute waits for the data its peer's
// communication blocks push, and a launch ends on both ranks only when both are done (the next
// launch's pushes wait for the peer's done flag). Each rank's signals thus speak of the other's
// split; the pair must still settle, near the best split both could share.
// `late`: a share of the launches where one rank (either) starts late and holds the other back.
// Returns how many of the 100 pairs settled below 0.97 of the best split both could share.
int coupled_ranks(Late late) {
  std::mt19937 rng(5);
  std::normal_distribution<double> n01(0.0, 1.0);
  int trials = 0, worse = 0, settled = 0;
  double worst = 1.0;
  std::uniform_real_distribution<double> u01(0.0, 1.0);
  auto logu = [&](double lo, double hi) { return lo * std::pow(hi / lo, u01(rng)); };
  for (int trial = 0; trial < 100; ++trial) {
    Model m;
    m.tiles = static_cast<uint32_t>(logu(128, 4096));
    m.tile_us = logu(3, 20);
    m.bytes_mb = logu(4, 256);
    m.per_block_gbs = logu(2, 40);
    m.link_gbs = u01(rng) < 0.3 ? logu(3, 20) : logu(100, 400);
    const auto cand = candidates(m, 1, 40);
    mk::SplitPolicy p[2];
    for (auto& x : p) mk::split_policy_init(x, cand.data(), static_cast<uint32_t>(cand.size()), 10);
    uint32_t c[2] = {mk::split_policy_comm(p[0]), mk::split_policy_comm(p[1])};
    // Rank r's own launch with its split and its peer's communication.
    auto run = [&](uint32_t mine, uint32_t peer) {
      mk::SplitSample s = m.run(mine);
      // The peer's pushes gate this rank's compute: Model::run with this rank's compute blocks
      // and the data arriving in the peer's communication time.
      const double tc = m.comm_us(peer);
      Model y = m;
      y.bytes_mb = tc * std::min(mine * m.per_block_gbs, m.link_gbs) / 1000.0;
      const mk::SplitSample gated = y.run(mine);
      s.compute_done_us = gated.compute_done_us;
      s.compute_wait_us = gated.compute_wait_us;
      s.comm_done_us = static_cast<float>(m.comm_us(mine));
      return s;
    };
    for (int l = 0; l < 200; ++l) {
      mk::SplitSample s[2] = {run(c[0], c[1]), run(c[1], c[0])};
      const float end = std::max(std::max(s[0].compute_done_us, s[0].comm_done_us),
                                 std::max(s[1].compute_done_us, s[1].comm_done_us)) + static_cast<float>(m.overhead_us);
      const double d = late(end, rng);
      const int slow = u01(rng) < 0.5 ? 0 : 1;
      for (int r = 0; r < 2; ++r) {
        s[r].launch_us = static_cast<float>(end * (1.0 + 0.01 * n01(rng)));
        if (r != slow) delay(s[r], d);  // the early rank waits for the late one
        c[r] = mk::split_policy_step(p[r], s[r]);
      }
    }
    ++trials;
    settled += p[0].phase == mk::kSplitSettled && p[1].phase == mk::kSplitSettled;
    auto pair_time = [&](uint32_t a, uint32_t b) {
      const mk::SplitSample x = run(a, b), y = run(b, a);
      return static_cast<double>(std::max(std::max(x.compute_done_us, x.comm_done_us),
                                          std::max(y.compute_done_us, y.comm_done_us))) +
             m.overhead_us;
    };
    double best = 1e30;
    for (uint32_t k = 1; k <= 40; ++k) best = std::min(best, pair_time(k, k));
    const double ratio = best / pair_time(c[0], c[1]);
    worst = std::min(worst, ratio);
    if (ratio < 0.97) {
      ++worse;
      std::printf("coupled ranks below 0.97: tiles %u tile %.1f us %.0f MB block %.1f GB/s link %.0f GB/s: "
                  "settled at %u / %u, %.3f of the best shared split\n",
                  m.tiles, m.tile_us, m.bytes_mb, m.per_block_gbs, m.link_gbs, c[0], c[1], ratio);
    }
  }
  std::printf("%d coupled pairs%s: worst %.4f of the best shared static split, %d below 0.97, %d settled at the end\n",
              trials, late.share > 0 ? " with late peers" : "", worst, worse, settled);
  EXPECT_GE(settled, late.share > 0 ? 95 : 100);  // late peers may hold a reopened pair in its search
  return worse;
}

TEST(SplitPolicy, TwoCoupledRanksSettleTogether) { EXPECT_LE(coupled_ranks(Late{}), 5); }

TEST(SplitPolicy, TwoCoupledRanksWithLatePeersSettleTogether) { EXPECT_LE(coupled_ranks(Late{0.4}), 5); }


// The end of a launch as the last block runs it (split_control_end): the measures from the sums,
// the record, the policy's step only when adaptive, unpinned and not failed, the sums emptied.
mk::SplitControl make_control(bool adaptive) {
  mk::SplitControl c;
  c.grid = 132;
  c.unit = 1;
  c.next_comm = 10;
  if (adaptive) {
    const uint16_t cand[4] = {4, 10, 16, 24};
    mk::split_policy_init(c.policy, cand, 4, 10);
    c.adaptive = 1;
  }
  return c;
}

mk::SplitAccum sums(uint64_t start, uint64_t compute_done, uint64_t comm_done, uint64_t wait_sum) {
  mk::SplitAccum a;
  a.start = start;
  a.compute_done = compute_done;
  a.comm_done = comm_done;
  a.compute_wait = wait_sum;
  return a;
}

TEST(SplitControl, MeasuresTheLaunchFromTheSums) {
  mk::SplitControl c = make_control(true);
  // 800 us launch; compute done at 700 us, communication at 300 us; 122 compute blocks waited
  // 12.2 ms in all: 100 us each.
  mk::split_control_end(c, sums(1'000'000, 1'700'000, 1'300'000, 12'200'000), 1'800'000, false);
  EXPECT_EQ(c.launches, 1u);
  EXPECT_EQ(c.last_comm, 10u);
  EXPECT_NEAR(c.last_us, 800.0, 1e-3);
  EXPECT_NEAR(c.last_compute_done_us, 700.0, 1e-3);
  EXPECT_NEAR(c.last_comm_done_us, 300.0, 1e-3);
  EXPECT_NEAR(c.last_wait_us, 100.0, 1e-3);
  EXPECT_EQ(c.policy.launches, 1u);  // the policy saw it (and, being the first, did not measure it)
  EXPECT_EQ(c.acc.start, mk::kSplitNoStart);
  EXPECT_EQ(c.acc.compute_done, 0u);
  EXPECT_EQ(c.acc.comm_done, 0u);
  EXPECT_EQ(c.acc.compute_wait, 0u);
}

TEST(SplitControl, PinnedFailedAndStaticLaunchesDoNotMoveThePolicy) {
  mk::SplitControl c = make_control(true);
  c.pinned = 24;
  mk::split_control_end(c, sums(0, 10'000, 5'000, 0), 20'000, false);
  EXPECT_EQ(c.last_comm, 24u);
  EXPECT_EQ(c.next_comm, 10u);
  EXPECT_EQ(c.policy.launches, 0u);
  c.pinned = 0;
  mk::split_control_end(c, sums(0, 10'000, 5'000, 0), 20'000, true);
  EXPECT_EQ(c.failed_launches, 1u);
  EXPECT_EQ(c.launches, 2u);
  EXPECT_EQ(c.policy.launches, 0u);
  mk::SplitControl s = make_control(false);
  for (int i = 0; i < 10; ++i) mk::split_control_end(s, sums(0, 10'000, 5'000, 0), 20'000, false);
  EXPECT_EQ(s.next_comm, 10u);
  EXPECT_EQ(s.launches, 10u);
}

TEST(SplitControl, WordsOutOfRangeAreClampedToWholeClusters) {
  EXPECT_EQ(mk::split_clamp_comm(0, 132, 1), 1u);
  EXPECT_EQ(mk::split_clamp_comm(500, 132, 1), 131u);
  EXPECT_EQ(mk::split_clamp_comm(7, 132, 2), 6u);
  EXPECT_EQ(mk::split_clamp_comm(1, 132, 2), 2u);
  EXPECT_EQ(mk::split_clamp_comm(200, 132, 2), 130u);
  EXPECT_EQ(mk::split_clamp_comm(3, 2, 2), 0u);  // no room for both roles
  mk::SplitControl c = make_control(false);
  c.next_comm = 999;
  mk::split_control_end(c, sums(0, 1, 1, 0), 2, false);
  EXPECT_EQ(c.last_comm, 131u);
}

// The whole loop as the kernel runs it: the modelled kernel's times become the sums in ns, the
// last block's arithmetic chooses the next split; it settles where the policy alone does.
TEST(SplitControl, TheLoopSettlesOnModelledLaunches) {
  Model m;
  m.tiles = 768, m.bytes_mb = 24, m.link_gbs = 1e9, m.per_block_gbs = 40;
  const auto cand = candidates(m, 1, 40);
  mk::SplitControl c;
  c.grid = m.grid;
  c.unit = m.unit;
  mk::split_policy_init(c.policy, cand.data(), static_cast<uint32_t>(cand.size()), 10);
  c.next_comm = mk::split_policy_comm(c.policy);
  c.adaptive = 1;
  uint64_t t = 1'000'000'000;
  for (int l = 0; l < 120; ++l) {
    const uint32_t comm = mk::split_clamp_comm(c.next_comm, c.grid, c.unit);
    const mk::SplitSample x = m.run(comm);
    const uint32_t compute_blocks = c.grid - comm;
    const mk::SplitAccum a =
        sums(t, t + static_cast<uint64_t>(x.compute_done_us * 1000), t + static_cast<uint64_t>(x.comm_done_us * 1000),
             static_cast<uint64_t>(x.compute_wait_us * 1000) * compute_blocks);
    mk::split_control_end(c, a, t + static_cast<uint64_t>(x.launch_us * 1000), false);
    t += 10'000'000;
  }
  EXPECT_EQ(c.policy.phase, mk::kSplitSettled);
  EXPECT_GE(best_static(m, 1, 40) / m.time(c.next_comm), 0.97) << "settled at " << c.next_comm;
  EXPECT_EQ(c.launches, 120u);
}

// Moving the split changes which cluster takes which piece of the compute role, never the pieces:
// the tile scheduler's work items (tile, k range, unit) over all clusters are the same set for
// every cluster count (data-parallel tiles, split-K and stream-K regions alike), so with the
// deterministic fix-up (slots summed in unit order) every count gives the same bits.
TEST(SplitPolicy, TheComputeDecompositionDoesNotDependOnTheSplit) {
  struct Item {
    uint32_t tile, k0, k1, unit;
    bool operator<(const Item& o) const {
      return std::tie(tile, k0, k1, unit) < std::tie(o.tile, o.k0, o.k1, o.unit);
    }
    bool operator==(const Item& o) const { return !(*this < o) && !(o < *this); }
  };
  struct Shape {
    uint32_t m_blocks, n_blocks, k_blocks, dp_tiles, sk_units, sk_per_tile;
  };
  const Shape shapes[] = {{64, 16, 64, 1024, 0, 0},  {3, 5, 40, 0, 45, 3},  {7, 9, 33, 52, 11, 0},
                          {1, 17, 128, 0, 68, 4},    {32, 8, 10, 200, 56, 0}};
  for (const Shape& sh : shapes) {
    std::vector<Item> ref;
    for (uint32_t clusters : {132u, 131u, 128u, 120u, 101u, 64u, 7u, 1u}) {
      mk::TileScheduler<1, 1> sched{sh.m_blocks, sh.n_blocks, sh.sk_per_tile != 0 ? sh.sk_per_tile : 1, mk::kRasterAlongN, 8, 0};
      sched.num_k_blocks = sh.k_blocks;
      sched.dp_tiles = sh.dp_tiles;
      sched.sk_units = sh.sk_units;
      sched.sk_per_tile = sh.sk_per_tile;
      std::vector<Item> items;
      for (uint32_t c = 0; c < clusters; ++c) {
        mk::WorkCursor cur = sched.begin(c);
        mk::WorkItem it;
        while (sched.next(cur, clusters, it)) items.push_back({it.tile, it.k_begin, it.k_end, it.unit});
      }
      std::sort(items.begin(), items.end());
      if (ref.empty()) {
        ref = items;
        ASSERT_FALSE(ref.empty());
      } else {
        EXPECT_TRUE(items == ref) << "clusters " << clusters << " changed the work items";
      }
    }
  }
}

}  // namespace
