// One fuzz input -> one hostile ring: header and slots taken from the input bytes, then drained
// by a RingConsumer. Returns "" when every invariant held, else what broke.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

struct RingFuzzCounts {
  uint64_t accepted = 0;
  uint64_t rejected = 0;
};

// `counts`, when given, accumulates how many records took each path.
std::string mkernel_ring_fuzz_one(const uint8_t* data, size_t size,
                                  RingFuzzCounts* counts = nullptr);
