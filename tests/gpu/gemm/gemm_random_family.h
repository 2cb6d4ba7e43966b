// gemm_random_family.h: the seeded random family of GEMM shapes (issue 13), shared by the
// benchmark (gemm_bench --random SEED), the GPU test (a smaller family) and the CPU model
// evaluation (gemm_schedule_test --model). Plain C++.
//
// M drawn log-uniformly in [1, 32768] (any integer), N and K multiples of 8 drawn log-uniformly
// in [256, 32768]. splitmix64 draws, so a seed names the same shapes on every machine and
// compiler.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace gemm_test {

struct RandomShape {
  int m, n, k;
};

class RandomFamily {
 public:
  explicit RandomFamily(uint64_t seed) : x_(seed) {}

  RandomShape next() {
    const int m = std::max(1, std::min(32768, static_cast<int>(std::lround(log_uniform(1, 32768)))));
    const int n = std::max(256, std::min(32768, static_cast<int>(std::lround(log_uniform(256, 32768) / 8)) * 8));
    const int k = std::max(256, std::min(32768, static_cast<int>(std::lround(log_uniform(256, 32768) / 8)) * 8));
    return {m, n, k};
  }

 private:
  uint64_t next_u64() {
    uint64_t z = (x_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }
  double log_uniform(double lo, double hi) { return std::exp(std::log(lo) + uniform() * (std::log(hi) - std::log(lo))); }
  uint64_t x_;
};

// The first `count` shapes of the family of `seed`.
inline std::vector<RandomShape> random_family(uint64_t seed, int count) {
  RandomFamily f(seed);
  std::vector<RandomShape> v;
  for (int i = 0; i < count; ++i) v.push_back(f.next());
  return v;
}

// The first `count` shapes of the family of `seed` with m * n * k <= max_mnk and m * n <= max_mn
// (the GPU test's smaller family: the same distribution, without the shapes whose fp32
// reference GEMM and host-side comparison would take seconds).
inline std::vector<RandomShape> random_family_capped(uint64_t seed, int count, double max_mnk, double max_mn) {
  RandomFamily f(seed);
  std::vector<RandomShape> v;
  while (static_cast<int>(v.size()) < count) {
    const RandomShape s = f.next();
    if (static_cast<double>(s.m) * s.n * s.k <= max_mnk && static_cast<double>(s.m) * s.n <= max_mn) v.push_back(s);
  }
  return v;
}

}  // namespace gemm_test
