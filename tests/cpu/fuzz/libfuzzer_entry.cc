// libFuzzer entry point for the ring consumer (built with clang and -fsanitize=fuzzer).
#include <cstdio>
#include <cstdlib>

#include "ring_fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string problem = mkernel_ring_fuzz_one(data, size);
  if (!problem.empty()) {
    std::fprintf(stderr, "ring invariant broken: %s\n", problem.c_str());
    std::abort();  // test harness: libFuzzer records the input that got here
  }
  return 0;
}
