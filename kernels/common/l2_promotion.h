// l2_promotion.h: the L2 promotion of a TMA tensor map (how many bytes a load that misses in L2
// fills there) as the GEMM's and the attention core's configurations name it: 0 (none: the
// 128-byte lines the box touches), 64, 128 or 256 bytes, and -1 for the caller's default.
// docs/kernels.md section 7, "The load path", has what each measured.
#pragma once

#include <cuda.h>

namespace mkernel::kernels {

// What a configuration's error message says it accepts.
inline constexpr const char* kL2PromotionExpected = "expected -1, 0, 64, 128 or 256 bytes";

inline constexpr bool l2_promotion_valid(int bytes) {
  return bytes == -1 || bytes == 0 || bytes == 64 || bytes == 128 || bytes == 256;
}

// The tensor map's enum for a resolved byte count (0, 64, 128 or 256).
inline CUtensorMapL2promotion tensor_map_l2_promotion(int bytes) {
  return bytes == 0    ? CU_TENSOR_MAP_L2_PROMOTION_NONE
         : bytes == 64  ? CU_TENSOR_MAP_L2_PROMOTION_L2_64B
         : bytes == 128 ? CU_TENSOR_MAP_L2_PROMOTION_L2_128B
                        : CU_TENSOR_MAP_L2_PROMOTION_L2_256B;
}

}  // namespace mkernel::kernels
