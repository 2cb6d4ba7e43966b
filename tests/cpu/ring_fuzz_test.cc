// The ring consumer fuzz target driven by a seeded generator, so it runs in every CI build
// (libFuzzer runs the same target under clang: tests/cpu/fuzz).
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "mkernel/protocol/ring_host.h"
#include "ring_fuzz_target.h"

TEST(RingFuzz, RandomBytesNeverBreakTheConsumer) {
  std::mt19937_64 rng(0x6d6b65726e656cull);  // fixed seed: a failure reproduces
  std::vector<uint8_t> input;
  RingFuzzCounts counts;
  for (int iter = 0; iter < 20000; ++iter) {
    input.resize(rng() % 6000);
    for (auto& b : input) b = static_cast<uint8_t>(rng());
    const std::string problem = mkernel_ring_fuzz_one(input.data(), input.size(), &counts);
    ASSERT_EQ(problem, "") << "iteration " << iter << ", input of " << input.size() << " bytes";
  }
  EXPECT_GT(counts.rejected, 10000u) << "random records reach the decoder";
}

TEST(RingFuzz, MostlyValidRecordsExerciseTheAcceptPath) {
  // Inputs built from valid records with single-field corruption: both paths are reached.
  namespace mp = mkernel::protocol;
  std::mt19937_64 rng(42);
  RingFuzzCounts counts;
  for (int iter = 0; iter < 2000; ++iter) {
    std::vector<uint8_t> input;
    input.push_back(5);                                   // 64 slots
    input.resize(1 + sizeof(mp::RingHeader), 0);          // a clean header
    const uint32_t limits[4] = {16, 8, 64, 1u << 20};
    const auto* lb = reinterpret_cast<const uint8_t*>(limits);
    input.insert(input.end(), lb, lb + sizeof(limits));
    input.push_back(3);                                   // tail batch
    for (int s = 0; s < 64; ++s) {
      mp::CommandRecord r{};
      mp::encode_payload(mp::make_write_signal(static_cast<uint32_t>(rng() % 16), 1, rng() % 4096,
                                               2, rng() % 4096, 1 + rng() % 4096,
                                               static_cast<uint32_t>(rng() % 64), 1 + rng() % 9),
                         r);
      if (rng() % 4 == 0) reinterpret_cast<uint8_t*>(&r)[rng() % 60] ^= static_cast<uint8_t>(1 + rng() % 255);
      input.push_back(1);  // commit it
      const auto* rb = reinterpret_cast<const uint8_t*>(&r);
      input.insert(input.end(), rb, rb + sizeof(r));
    }
    ASSERT_EQ(mkernel_ring_fuzz_one(input.data(), input.size(), &counts), "")
        << "iteration " << iter;
  }
  // About three in four records are left valid, the rest carry one corrupted byte.
  EXPECT_GT(counts.accepted, 2000u * 64 / 2);
  EXPECT_GT(counts.rejected, 2000u * 64 / 20);
}
