#include "refusals.h"

#include <spdlog/spdlog.h>

#include "log_text.h"

namespace mkernel::daemon {

namespace {

constexpr std::array<std::string_view, kNumRefusals> kNames{
    "malformed",
    "hello_refused",
    "credentials",
    "draining",
    "handshake_timeout",
    "reply_queue_overflow",
    "out_of_descriptors",
    "invalid_request",
    "clients.max_per_gpu",
    "clients.max_sessions",
    "clients.max_descriptors",
    "clients.max_shared_memory",
    "clients.max_networks",
    "clients.quota.rings",
    "clients.quota.regions",
    "clients.quota.registered_bytes",
    "handles_per_session",
    "rings.max_capacity",
    "clients.per_uid.sessions",
    "clients.per_uid.sessions_per_gpu",
    "clients.per_uid.rings",
    "clients.per_uid.regions",
    "clients.per_uid.shared_memory",
    "clients.per_uid.descriptors",
    "connects_per_uid",
    "clients.per_uid.networks",
    "clients.per_process.sessions",
    "clients.per_process.sessions_per_gpu",
    "clients.per_process.rings",
    "clients.per_process.regions",
    "clients.per_process.shared_memory",
    "clients.per_process.descriptors",
    "clients.per_process.networks",
};
static_assert(!kNames[kNumRefusals - 1].empty(), "a name for every Refusal");

}  // namespace

std::string_view refusal_name(Refusal r) {
  const auto i = static_cast<size_t>(r);
  return i < kNames.size() ? kNames[i] : "?";
}

void Refusals::record(Refusal reason, pid_t pid, uid_t uid, const Status& status) {
  counts_[static_cast<size_t>(reason)].fetch_add(1, std::memory_order_relaxed);
  log(reason, "refused client pid " + std::to_string(pid) + " uid " + std::to_string(uid) + " (" +
                  std::string(refusal_name(reason)) + "): " + printable(status.message(), 512));
}

void Refusals::record_anonymous(Refusal reason, const Status& status) {
  counts_[static_cast<size_t>(reason)].fetch_add(1, std::memory_order_relaxed);
  log(reason, "refused a client (" + std::string(refusal_name(reason)) + "): " + printable(status.message(), 512));
}

bool LogRateLimiter::allow(uint64_t* suppressed) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto now = std::chrono::steady_clock::now();
  if (now - start_ >= std::chrono::seconds(1)) {
    start_ = now;
    lines_ = 0;
  }
  if (lines_ >= per_second_) {
    ++suppressed_;
    return false;
  }
  ++lines_;
  *suppressed = suppressed_;
  suppressed_ = 0;
  return true;
}

std::string suppressed_note(uint64_t suppressed, std::string_view what) {
  if (suppressed == 0) return {};
  return " (and " + std::to_string(suppressed) + " more " + std::string(what) + " not logged)";
}

void Refusals::log(Refusal reason, const std::string& line) {
  uint64_t suppressed = 0;
  if (!limiters_[static_cast<size_t>(reason)].allow(&suppressed)) return;
  spdlog::warn("{}{}", line, suppressed_note(suppressed, "refusal(s) of this kind"));
}

std::vector<std::pair<std::string, uint64_t>> Refusals::all() const {
  std::vector<std::pair<std::string, uint64_t>> out;
  out.reserve(kNumRefusals);
  for (size_t i = 0; i < kNumRefusals; ++i)
    out.emplace_back(std::string(kNames[i]), counts_[i].load(std::memory_order_relaxed));
  return out;
}

}  // namespace mkernel::daemon
