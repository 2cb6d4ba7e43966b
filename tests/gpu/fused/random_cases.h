// random_cases.h: seeded shape draws for the fused-op GPU tests' random families. Each test keeps
// its hand-picked cases and adds a few drawn from the run's printed seed (MKERNEL_TEST_SEED
// replays them; MKERNEL_TEST_RANDOM_CASES sets how many, 0 for none), so every run also checks
// shapes nobody chose: row counts of any value, widths and depths of any multiple of 8, rank
// layouts from 1 x 2 to 2 x 2.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "fused_harness.h"

namespace fused_test {

class ShapeDraw {
 public:
  explicit ShapeDraw(uint64_t seed) : s_(seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull) {}

  uint64_t next() {  // splitmix64
    uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0); }
  // Any integer in [lo, hi], log-uniformly (small and large values equally likely per octave).
  uint32_t log_uniform(uint32_t lo, uint32_t hi) {
    const double v = std::exp(std::log(double(lo)) + uniform() * (std::log(double(hi) + 1) - std::log(double(lo))));
    const uint32_t x = static_cast<uint32_t>(v);
    return x < lo ? lo : x > hi ? hi : x;
  }
  // A multiple of `step` in [lo, hi] (lo and hi multiples of step), log-uniformly.
  uint32_t log_uniform_multiple(uint32_t lo, uint32_t hi, uint32_t step) {
    return log_uniform(lo / step, hi / step) * step;
  }
  uint32_t below(uint32_t n) { return static_cast<uint32_t>(next() % n); }
  bool coin(double p = 0.5) { return uniform() < p; }
  template <class T>
  const T& pick(const std::vector<T>& v) {
    return v[below(static_cast<uint32_t>(v.size()))];
  }

 private:
  uint64_t s_;
};

// How many random cases a test adds (MKERNEL_TEST_RANDOM_CASES, else `fallback`).
inline uint32_t random_case_count(uint32_t fallback) {
  const char* e = std::getenv("MKERNEL_TEST_RANDOM_CASES");
  return e ? static_cast<uint32_t>(std::strtoul(e, nullptr, 10)) : fallback;
}

// A rank layout the emulated cluster can hold on one GPU: one node of 2-4 ranks, two nodes of
// one or two (ranks of different nodes talk through the proxies over libfabric shm).
inline Topology random_topology(ShapeDraw& d) {
  static const std::vector<Topology> layouts = {{1, 2, "shm"}, {1, 3, "shm"}, {1, 4, "shm"}, {2, 1, "shm"},
                                                {2, 2, "shm"}};
  return d.pick(layouts);
}

// The cases a run keeps: all of them, or those an environment variable lists by index ("0,9"),
// for quick reruns of one case.
template <class Case>
std::vector<Case> select_cases(const std::vector<Case>& all, const char* env_name) {
  const char* only = std::getenv(env_name);
  if (only == nullptr || all.empty()) return all;
  std::vector<Case> some;
  for (const char* p = only; *p;) {
    some.push_back(all[std::strtoul(p, nullptr, 10) % all.size()]);
    while (*p && *p != ',') ++p;
    if (*p == ',') ++p;
  }
  return some;
}

}  // namespace fused_test
