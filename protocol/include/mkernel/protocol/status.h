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

// Codes of the ring header's `error` word (ring.h note 6): why the ring stopped. The daemon
// writes 1..4; the runtime writes kRingErrDaemonGone when it finds the daemon gone (a dead
// daemon cannot mark its rings), so GPU waits end at once. `error_detail` and `error_pos` say
// more, as noted per code.
enum RingErrorCode : uint32_t {
  kRingErrNone = 0,
  kRingErrRejected = 1,        // detail = protocol::RejectReason of the command at error_pos
  kRingErrTransport = 2,       // detail = StatusCode of the failed command at error_pos
  kRingErrSessionEnded = 3,    // detail = StatusCode of the reason the session ended
  kRingErrDaemonStopping = 4,  // the daemon is shutting down
  kRingErrDaemonGone = 5,      // written by the runtime: the daemon connection was lost
  kNumRingErrorCodes = 6,
};

MK_HOST_DEVICE constexpr const char* ring_error_name(uint32_t e) {
  switch (e) {
    case kRingErrNone: return "none";
    case kRingErrRejected: return "the daemon rejected a command";
    case kRingErrTransport: return "a transfer failed in the transport";
    case kRingErrSessionEnded: return "the daemon ended the session";
    case kRingErrDaemonStopping: return "the daemon is stopping";
    case kRingErrDaemonGone: return "the daemon went away";
    default: return "unknown ring error";
  }
}

}  // namespace mkernel::protocol
