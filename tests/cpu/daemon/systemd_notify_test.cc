// systemd_notify_test.cc: sd_notify wrappers and the watchdog pinger, against a datagram socket
// standing in for systemd's NOTIFY_SOCKET.
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include <gtest/gtest.h>

#include "ops_fake_control.h"
#include "systemd_notify.h"

namespace mkernel::daemon::systemd {
namespace {

using mkernel::daemon::testing::FakeControl;
using mkernel::daemon::testing::TempDir;

class NotifySocket {
 public:
  explicit NotifySocket(const std::string& path) : path_(path) {
    fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    path.copy(addr.sun_path, path.size());
    bound_ = fd_ >= 0 && bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    setenv("NOTIFY_SOCKET", path.c_str(), 1);
  }
  ~NotifySocket() {
    unsetenv("NOTIFY_SOCKET");
    if (fd_ >= 0) close(fd_);
  }
  bool bound() const { return bound_; }
  // The next datagram, or "" after `timeout`.
  std::string receive(std::chrono::milliseconds timeout) {
    timeval tv{static_cast<time_t>(timeout.count() / 1000),
               static_cast<suseconds_t>(timeout.count() % 1000 * 1000)};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    char buf[512];
    ssize_t n = recv(fd_, buf, sizeof(buf), 0);
    return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
  }
  void flush() {
    while (!receive(std::chrono::milliseconds(1)).empty()) {
    }
  }

 private:
  std::string path_;
  int fd_ = -1;
  bool bound_ = false;
};

TEST(SystemdNotify, NoOpWithoutNotifySocket) {
  unsetenv("NOTIFY_SOCKET");
  EXPECT_FALSE(notify_socket_set());
  EXPECT_TRUE(ready("serving").ok());
  EXPECT_TRUE(reloading().ok());
  EXPECT_TRUE(stopping().ok());
  EXPECT_TRUE(status("x").ok());
  EXPECT_TRUE(watchdog_ping().ok());
}

TEST(SystemdNotify, MessagesReachTheSocket) {
  if (!available()) GTEST_SKIP() << "built without libsystemd";
  TempDir dir;
  NotifySocket sock(dir.path + "/notify");
  ASSERT_TRUE(sock.bound());
  ASSERT_TRUE(ready("2 proxies up").ok());
  EXPECT_EQ(sock.receive(std::chrono::seconds(1)), "READY=1\nSTATUS=2 proxies up");
  ASSERT_TRUE(reloading().ok());
  EXPECT_EQ(sock.receive(std::chrono::seconds(1)), "RELOADING=1");
  ASSERT_TRUE(stopping().ok());
  EXPECT_EQ(sock.receive(std::chrono::seconds(1)), "STOPPING=1");
}

TEST(SystemdNotify, WatchdogIntervalFromEnvironment) {
  if (!available()) GTEST_SKIP() << "built without libsystemd";
  unsetenv("WATCHDOG_USEC");
  unsetenv("WATCHDOG_PID");
  EXPECT_FALSE(watchdog_interval().has_value());
  setenv("WATCHDOG_USEC", "200000", 1);
  setenv("WATCHDOG_PID", std::to_string(getpid()).c_str(), 1);
  auto iv = watchdog_interval();
  ASSERT_TRUE(iv.has_value());
  EXPECT_EQ(iv->count(), 200000);
  // Meant for another process: not ours.
  setenv("WATCHDOG_PID", "1", 1);
  EXPECT_FALSE(watchdog_interval().has_value());
  unsetenv("WATCHDOG_USEC");
  unsetenv("WATCHDOG_PID");
}

TEST(WatchdogPinger, PingsOnlyWhileEveryProxyIsAlive) {
  if (!available()) GTEST_SKIP() << "built without libsystemd";
  TempDir dir;
  NotifySocket sock(dir.path + "/notify");
  ASSERT_TRUE(sock.bound());
  FakeControl control;
  auto pinger = WatchdogPinger::start(control, std::chrono::milliseconds(100));
  ASSERT_TRUE(pinger.ok()) << pinger.status().to_string();
  EXPECT_EQ(sock.receive(std::chrono::seconds(1)), "WATCHDOG=1");

  ASSERT_TRUE(control.stall_proxy(0, std::chrono::milliseconds(600)).ok());
  // Give the pinger one period to see the stall, then no ping may arrive during it.
  std::this_thread::sleep_for(std::chrono::milliseconds(60));
  sock.flush();
  EXPECT_EQ(sock.receive(std::chrono::milliseconds(400)), "");
  EXPECT_GT(pinger.value()->pings_withheld(), 0u);
  // The proxy checks in again: pings resume.
  EXPECT_EQ(sock.receive(std::chrono::seconds(1)), "WATCHDOG=1");
  const auto t0 = std::chrono::steady_clock::now();
  pinger.value()->stop();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(200));
  EXPECT_GT(pinger.value()->pings_sent(), 1u);
}

TEST(WatchdogPinger, RejectsTinyIntervals) {
  FakeControl control;
  auto p = WatchdogPinger::start(control, std::chrono::microseconds(10));
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace mkernel::daemon::systemd
