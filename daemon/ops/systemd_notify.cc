// systemd_notify.cc: sd_notify wrappers and the watchdog pinger.
#include "systemd_notify.h"

#include <pthread.h>

#include <atomic>
#include <cstdlib>
#include <string>

#include <spdlog/spdlog.h>

#ifdef MKERNEL_HAVE_LIBSYSTEMD
#include <systemd/sd-daemon.h>
#endif

namespace mkernel::daemon::systemd {

namespace {

Status send(const std::string& message) {
  if (!notify_socket_set()) return Status::Ok();
#ifdef MKERNEL_HAVE_LIBSYSTEMD
  int rc = sd_notify(0, message.c_str());
  if (rc < 0) return errno_status("sd_notify(" + message + ")", -rc);
  return Status::Ok();
#else
  static std::atomic<bool> said{false};
  if (!said.exchange(true)) {
    spdlog::warn("systemd: NOTIFY_SOCKET is set but mkerneld was built without libsystemd; "
                 "readiness and watchdog notifications are not sent");
  }
  (void)message;
  return Status::Ok();
#endif
}

}  // namespace

bool notify_socket_set() {
  const char* s = std::getenv("NOTIFY_SOCKET");
  return s != nullptr && s[0] != '\0';
}

bool available() {
#ifdef MKERNEL_HAVE_LIBSYSTEMD
  return true;
#else
  return false;
#endif
}

Status ready(std::string_view status_text) {
  return send("READY=1\nSTATUS=" + std::string(status_text));
}
Status reloading() { return send("RELOADING=1"); }
Status stopping() { return send("STOPPING=1"); }
Status status(std::string_view text) { return send("STATUS=" + std::string(text)); }
Status watchdog_ping() { return send("WATCHDOG=1"); }

std::optional<std::chrono::microseconds> watchdog_interval() {
#ifdef MKERNEL_HAVE_LIBSYSTEMD
  uint64_t usec = 0;
  if (sd_watchdog_enabled(0, &usec) > 0 && usec > 0) {
    return std::chrono::microseconds(static_cast<int64_t>(usec));
  }
#endif
  return std::nullopt;
}

// ---- the pinger ---------------------------------------------------------------------------

WatchdogPinger::WatchdogPinger(const DaemonControl& control, std::chrono::microseconds period)
    : control_(control), period_(period) {}

StatusOr<std::unique_ptr<WatchdogPinger>> WatchdogPinger::start(
    const DaemonControl& control, std::chrono::microseconds interval) {
  if (interval < std::chrono::milliseconds(2)) {
    return Status(StatusCode::kInvalidArgument,
                  "watchdog interval: " + std::to_string(interval.count()) +
                      " us; expected at least 2000 us");
  }
  std::unique_ptr<WatchdogPinger> p(new WatchdogPinger(control, interval / 2));
  p->thread_ = std::thread([raw = p.get()] { raw->run(); });
  pthread_setname_np(p->thread_.native_handle(), "mk-watchdog");
  spdlog::info("systemd: watchdog every {} ms while every proxy is alive",
               std::chrono::duration_cast<std::chrono::milliseconds>(interval / 2).count());
  return p;
}

WatchdogPinger::~WatchdogPinger() { stop(); }

void WatchdogPinger::stop() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

uint64_t WatchdogPinger::pings_sent() const {
  std::lock_guard lock(mu_);
  return sent_;
}

uint64_t WatchdogPinger::pings_withheld() const {
  std::lock_guard lock(mu_);
  return withheld_;
}

void WatchdogPinger::run() {
  bool withholding = false;
  std::unique_lock lock(mu_);
  while (!stop_) {
    lock.unlock();
    const bool alive = control_.all_proxies_alive();
    bool sent = false;
    if (alive) {
      Status s = watchdog_ping();
      sent = s.ok();
      if (!s.ok()) spdlog::warn("systemd: watchdog ping failed: {}", s.to_string());
      if (withholding) spdlog::info("systemd: every proxy alive again; watchdog pings resume");
      withholding = false;
    } else if (!withholding) {
      std::string stalled;
      for (const auto& p : control_.stats()) {
        if (!p.alive) {
          stalled += (stalled.empty() ? "" : ", ") + p.name + " (last check-in " +
                     std::to_string(p.seconds_since_heartbeat) + " s ago)";
        }
      }
      spdlog::error("systemd: withholding watchdog pings: proxy not alive: {}",
                    stalled.empty() ? "unknown" : stalled);
      withholding = true;
    }
    lock.lock();
    if (sent) {
      ++sent_;
    } else if (!alive) {
      ++withheld_;
    }
    cv_.wait_for(lock, period_, [this] { return stop_; });
  }
}

}  // namespace mkernel::daemon::systemd
