// admin_acceptor_test.cc: the admin and health service after the process ran out of
// descriptors. gRPC's own listener (1.51) stopped accepting for good after one EMFILE; the
// daemon's acceptor (admin_acceptor.h) closes the connection it cannot serve and serves again
// once descriptors are free.
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>

#include <gtest/gtest.h>

#include "admin_server.h"
#include "ops_fake_control.h"

namespace mkernel::daemon {
namespace {

using namespace std::chrono_literals;
using testing::Exhaustion;
using testing::FakeControl;
using testing::run_command;
using testing::TempDir;

TEST(AdminAcceptor, ServesAgainOnceDescriptorsAreFree) {
  FakeControl control;
  TempDir dir;
  AdminOptions opt;
  opt.runtime_dir = dir.path;
  auto server = AdminServer::start(control, opt);
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  const std::string sock = dir.path + "/admin.sock";
  const std::string health = std::string(MKERNELDCTL_PATH) + " --socket " + sock + " --timeout 2 health";
  ASSERT_EQ(run_command(health).exit_code, 0);

  Exhaustion ex;
  ASSERT_TRUE(ex.fill(1));  // one descriptor left: the client's socket below takes it
  // A connection arrives while the server has no descriptor to accept it with: it is closed
  // at once (not left in the backlog until the client times out), several times over.
  for (int round = 0; round < 3; ++round) {
    const int c = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(c, 0) << std::strerror(errno);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, sock.c_str(), sizeof(addr.sun_path) - 1);
    ASSERT_EQ(::connect(c, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << std::strerror(errno);
    timeval tv{3, 0};
    ::setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    const auto t0 = std::chrono::steady_clock::now();
    char b;
    const ssize_t n = ::recv(c, &b, 1, 0);
    EXPECT_LE(n, 0) << "closed by the server";
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s) << "not left waiting in the backlog";
    ::close(c);
  }
  ex.release();
  // The connections it could not take were reported to the daemon, which counts them as refusal
  // out_of_descriptors (at least one: a descriptor freed meanwhile elsewhere in this process,
  // by an earlier test's threads say, lets a round's connection be accepted).
  EXPECT_GE(control.out_of_descriptors(), 1u);
  EXPECT_NE(control.last_shortage().find("admin and health service: no descriptor"), std::string::npos)
      << control.last_shortage();
  // Descriptors are free again: the same server answers, within a second or so.
  int code = -1;
  const auto t1 = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - t1 < 5s && (code = run_command(health).exit_code) != 0)
    std::this_thread::sleep_for(100ms);
  EXPECT_EQ(code, 0) << "admin and health serve again after the shortage";
  server.value()->stop();
}

}  // namespace
}  // namespace mkernel::daemon
