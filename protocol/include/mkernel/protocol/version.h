// version.h: the wire-format version of everything under protocol/.
//
// Bump kProtocolVersion whenever the command record, the ring header or the meaning of any field
// changes. A ring whose header carries another version is refused by both sides.
#pragma once

#include <cstdint>

namespace mkernel::protocol {

inline constexpr uint32_t kProtocolVersion = 1;

}  // namespace mkernel::protocol
