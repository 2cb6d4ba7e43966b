// status.h: result codes shared by host and device code of the ring protocol.
//
// These values cross the host/device boundary (a kernel's status word, the ring's error words),
// so they are fixed numbers: append, never renumber.
#pragma once

#include <cstdint>

#include "mkernel/protocol/compat.h"

namespace mkernel::protocol {

enum RingStatus : uint32_t {
  kRingOk = 0,
  // A producer waited for free space past its bound; the slot it claimed is reported in the
  // ring's client error word so the consumer knows why the ring stopped.
  kRingTimeout = 1,
  // The consumer (the daemon) set the ring's error word: the session has failed.
  kRingConsumerError = 2,
  // The daemon epoch in the header differs from the one the producer was started with: the
  // daemon restarted and this ring is dead.
  kRingEpochChanged = 3,
  // A producer call was made with an argument outside its contract (batch larger than the
  // ring, a command that does not encode).
  kRingInvalidArgument = 4,
  kNumRingStatus = 5,
};

MK_HOST_DEVICE constexpr const char* ring_status_name(uint32_t s) {
  switch (s) {
    case kRingOk: return "ok";
    case kRingTimeout: return "timeout waiting for ring space";
    case kRingConsumerError: return "consumer reported an error";
    case kRingEpochChanged: return "daemon epoch changed";
    case kRingInvalidArgument: return "invalid argument";
    default: return "unknown ring status";
  }
}

}  // namespace mkernel::protocol
