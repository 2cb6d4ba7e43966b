// splitmix.h: the splitmix64 finaliser the integration programs derive their data and keys from
// (each byte of a write a function of who sent it, to whom, when), so a receiver can check every
// byte without the sender's buffers.
#pragma once

#include <cstdint>

namespace mkernel_itest {

inline uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace mkernel_itest
