// systemd_notify.h: mkerneld's side of systemd's notification protocol (Type=notify).
//
// 1. Every call is a no-op returning ok when NOTIFY_SOCKET is unset (started by hand, by a test,
//    or under a supervisor other than systemd).
// 2. Built without libsystemd (MKERNEL_HAVE_LIBSYSTEMD undefined), every call does nothing; the
//    first call under a NOTIFY_SOCKET logs once that notifications are not sent.
// 3. Reload: reloading() then, once the new config is applied or refused, ready() again.
// 4. The watchdog is pinged only while every proxy thread checks in (DaemonControl::
//    all_proxies_alive), so a stuck proxy gets the daemon restarted by systemd.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>

#include "control.h"
#include "mkernel/common/status.h"

namespace mkernel::daemon::systemd {

// True when the process was started with a notification socket.
bool notify_socket_set();
// True when built with libsystemd.
bool available();

Status ready(std::string_view status_text);  // READY=1 + STATUS=
Status reloading();                          // RELOADING=1
Status stopping();                           // STOPPING=1
Status status(std::string_view text);        // STATUS=
Status watchdog_ping();                      // WATCHDOG=1

// The watchdog interval systemd asks for (WatchdogSec=), or nothing when the watchdog is off or
// not meant for this process.
std::optional<std::chrono::microseconds> watchdog_interval();

// Owns one thread that sends WATCHDOG=1 every interval / 2 while control.all_proxies_alive();
// a withheld ping is logged (once per stall, with the proxies that are not alive).
class WatchdogPinger {
 public:
  static StatusOr<std::unique_ptr<WatchdogPinger>> start(const DaemonControl& control,
                                                         std::chrono::microseconds interval);
  ~WatchdogPinger();
  WatchdogPinger(const WatchdogPinger&) = delete;
  WatchdogPinger& operator=(const WatchdogPinger&) = delete;

  void stop();  // idempotent; returns within one ping period
  uint64_t pings_sent() const;
  uint64_t pings_withheld() const;

 private:
  WatchdogPinger(const DaemonControl& control, std::chrono::microseconds period);
  void run();

  const DaemonControl& control_;
  const std::chrono::microseconds period_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  uint64_t sent_ = 0;
  uint64_t withheld_ = 0;
  std::thread thread_;
};

}  // namespace mkernel::daemon::systemd
