// latency_histogram.h: reading the daemon's log2 latency histogram (control.h: bucket i counts
// completions with latency < 2^i ns, the last bucket everything above). Header-only, so that
// mkerneldctl can use it without linking the daemon's operations library.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>

namespace mkernel::daemon {

// Bounds of bucket i in nanoseconds: [lower, upper). Bucket 0 is [0, 1).
inline double latency_bucket_lower_ns(size_t i) { return i == 0 ? 0.0 : std::ldexp(1.0, static_cast<int>(i) - 1); }
inline double latency_bucket_upper_ns(size_t i) { return std::ldexp(1.0, static_cast<int>(i)); }

inline uint64_t latency_count(std::span<const uint64_t> buckets) {
  uint64_t n = 0;
  for (uint64_t b : buckets) n += b;
  return n;
}

// The q-quantile (0 < q <= 1) in nanoseconds, interpolated geometrically inside its bucket
// (latencies spread evenly on a log scale within a power of two). Returns a negative value
// when the histogram is empty. The last bucket has no upper bound: its lower bound is returned.
inline double latency_quantile_ns(std::span<const uint64_t> buckets, double q) {
  const uint64_t total = latency_count(buckets);
  if (total == 0 || buckets.empty()) return -1.0;
  const double rank = q * static_cast<double>(total);
  double below = 0;
  for (size_t i = 0; i < buckets.size(); ++i) {
    const double in = static_cast<double>(buckets[i]);
    if (in > 0 && below + in >= rank) {
      const double lo = latency_bucket_lower_ns(i);
      if (i + 1 == buckets.size()) return lo;
      const double hi = latency_bucket_upper_ns(i);
      const double frac = std::fmin(1.0, std::fmax(0.0, (rank - below) / in));
      if (lo <= 0) return hi * frac;
      return lo * std::pow(hi / lo, frac);
    }
    below += in;
  }
  return latency_bucket_lower_ns(buckets.size() - 1);
}

// An estimate of the sum of all latencies in nanoseconds (bucket midpoints on a log scale:
// lower * sqrt(2)); the daemon keeps counts per bucket only.
inline double latency_sum_estimate_ns(std::span<const uint64_t> buckets) {
  double sum = 0;
  for (size_t i = 0; i < buckets.size(); ++i) {
    const double mid = i == 0 ? 0.5 : latency_bucket_lower_ns(i) * std::sqrt(2.0);
    sum += mid * static_cast<double>(buckets[i]);
  }
  return sum;
}

}  // namespace mkernel::daemon
