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
#include <utility>
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
  kOutOfDescriptors,    // the process itself ran out of descriptors (accepting a client, an admin
                        // or a metrics connection; memfd)
  kInvalidRequest,      // a setup request refused for its fields; the session goes on
  // Limits, by config key.
  kMaxPerGpu,
  kMaxSessions,
  kMaxDescriptors,
  kMaxSharedMemory,
  kMaxNetworks,
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
  kUidNetworks,
  kProcessSessions,
  kProcessSessionsPerGpu,
  kProcessRings,
  kProcessRegions,
  kProcessSharedMemory,
  kProcessDescriptors,
  kProcessNetworks,
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

// A budget of log lines per second for one kind of line; lines over it are counted, and the
// next line allowed says how many were left out. Thread-safe.
class LogRateLimiter {
 public:
  explicit LogRateLimiter(int per_second) : per_second_(per_second) {}
  // Whether a line may be logged now. When it may, `suppressed` receives how many were left
  // out since the last one.
  bool allow(uint64_t* suppressed);

 private:
  const int per_second_;
  std::mutex mu_;
  std::chrono::steady_clock::time_point start_{};
  int lines_ = 0;
  uint64_t suppressed_ = 0;
};

// " (and N more ... not logged)" for a count of left-out lines; "" for none.
std::string suppressed_note(uint64_t suppressed, std::string_view what);

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
  std::array<LogRateLimiter, kNumRefusals> limiters_ = make_limiters(std::make_index_sequence<kNumRefusals>());

  template <size_t... I>
  static std::array<LogRateLimiter, kNumRefusals> make_limiters(std::index_sequence<I...>) {
    return {(static_cast<void>(I), LogRateLimiter(kLinesPerSecond))...};
  }
};

}  // namespace mkernel::daemon
