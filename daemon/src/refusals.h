// refusals.h: every refusal the daemon gives a client, counted by reason and logged without
// letting a client flood the log.
//
// Design notes
//  1. The reasons are a fixed set (Refusal): the kinds of refusal that are not a limit, then one
//     per limit, named by its config key, so `mkerneldctl stats`, `status` and the
//     `mkerneld_refusals_total{reason=...}` metric speak the operator's words. A fixed set keeps
//     the metric's label values bounded whatever clients do.
//  2. record() counts (an atomic per reason, any thread) and logs one line naming the client
//     (pid, uid) and the reason, with client-supplied text escaped (log_text.h). Lines are
//     rate-limited per reason: at most kLinesPerSecond a second; the next line that gets through
//     says how many were left out meanwhile. So a client sending a million malformed frames
//     costs the log a few lines a second, and the counters still count every one.
#pragma once

#include <sys/types.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "mkernel/common/status.h"

namespace mkernel::daemon {

enum class Refusal : uint8_t {
  // Not a limit.
  kMalformed,           // a frame, length, body or descriptor count the protocol does not allow
  kHelloRefused,        // version, GPU, rank, world size or communicator not acceptable
  kCredentials,         // not in client_socket.allowed_uids / allowed_gids
  kDraining,            // the daemon accepts no new sessions
  kHandshakeTimeout,    // no hello within timeouts.handshake_ms
  kReplyQueueOverflow,  // the client stopped reading its replies (clients.max_queued_replies)
  kOutOfDescriptors,    // the process itself ran out of descriptors (accept, memfd)
  kInvalidRequest,      // a setup request refused for its fields; the session goes on
  // Limits, by config key.
  kMaxPerGpu,
  kMaxSessions,
  kMaxDescriptors,
  kMaxSharedMemory,
  kQuotaRings,
  kQuotaRegions,
  kQuotaRegisteredBytes,
  kQuotaHandles,
  kRingCapacity,
  kUidSessions,
  kUidSessionsPerGpu,
  kUidRings,
  kUidRegions,
  kUidSharedMemory,
  kUidDescriptors,
  kUidConnects,
  kProcessSessions,
  kProcessSessionsPerGpu,
  kProcessRings,
  kProcessRegions,
  kProcessSharedMemory,
  kProcessDescriptors,
  kCount
};
inline constexpr size_t kNumRefusals = static_cast<size_t>(Refusal::kCount);

// "malformed", ..., "clients.per_uid.sessions", ...
std::string_view refusal_name(Refusal r);

// A refusal decided somewhere below the event loop: what the client is told and why.
struct Denial {
  Refusal reason;
  Status status;
};

class Refusals {
 public:
  static constexpr int kLinesPerSecond = 5;

  // Counts the refusal and logs it (rate-limited, note 2). `status` is what the client is told.
  void record(Refusal reason, pid_t pid, uid_t uid, const Status& status);
  // Counts without a client to name (a connection refused before its credentials were read).
  void record_anonymous(Refusal reason, const Status& status);

  uint64_t count(Refusal reason) const {
    return counts_[static_cast<size_t>(reason)].load(std::memory_order_relaxed);
  }
  // Every reason with its count, in enum order (zeros included).
  std::vector<std::pair<std::string, uint64_t>> all() const;

 private:
  void log(Refusal reason, const std::string& line);

  std::array<std::atomic<uint64_t>, kNumRefusals> counts_{};
  struct Window {
    std::chrono::steady_clock::time_point start{};
    int lines = 0;
    uint64_t suppressed = 0;
  };
  std::mutex mu_;
  std::array<Window, kNumRefusals> windows_{};  // guarded by mu_
};

}  // namespace mkernel::daemon
