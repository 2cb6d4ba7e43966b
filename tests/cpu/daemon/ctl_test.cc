// ctl_test.cc: the built mkerneldctl binary (and the Python health check) against an
// AdminServer over a FakeControl: exit codes, text and JSON output.
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

#include "admin_server.h"
#include "mkernel/proto/admin.pb.h"
#include "ops_fake_control.h"

#ifndef MKERNELDCTL_PATH
#error "MKERNELDCTL_PATH must name the built mkerneldctl"
#endif
#ifndef MKERNEL_TEST_PYTHON
#define MKERNEL_TEST_PYTHON ""
#endif
#ifndef MKERNEL_HEALTH_CHECK_PY
#define MKERNEL_HEALTH_CHECK_PY ""
#endif

namespace mkernel::daemon {
namespace {

using testing::FakeControl;
using testing::run_command;
using testing::RunResult;
using testing::TempDir;

class CtlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(dir_.path.empty());
    AdminOptions opt;
    opt.runtime_dir = dir_.path;
    auto server = AdminServer::start(control_, opt);
    ASSERT_TRUE(server.ok()) << server.status().to_string();
    server_ = std::move(server).value();
  }

  RunResult ctl(const std::string& args) {
    return run_command(std::string(MKERNELDCTL_PATH) + " --timeout 3 --runtime-dir " +
                       dir_.path + " " + args);
  }

  TempDir dir_;
  FakeControl control_;
  std::unique_ptr<AdminServer> server_;
};

TEST_F(CtlTest, HealthyIsZero) {
  RunResult r = ctl("health");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("mkerneld.gpu1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("mkerneld.nic.nic0"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("NOT_SERVING"), std::string::npos) << r.out;
}

TEST_F(CtlTest, DrainedIsOneAndUndrainRestores) {
  RunResult d = ctl("drain");
  EXPECT_EQ(d.exit_code, 0) << d.out;
  EXPECT_TRUE(control_.draining());
  RunResult h = ctl("health");
  EXPECT_EQ(h.exit_code, 1) << h.out;
  EXPECT_NE(h.out.find("NOT_SERVING"), std::string::npos) << h.out;
  EXPECT_NE(h.out.find("draining"), std::string::npos) << h.out;
  EXPECT_EQ(ctl("status").exit_code, 1);
  EXPECT_EQ(ctl("undrain").exit_code, 0);
  EXPECT_EQ(ctl("health").exit_code, 0);
}

TEST_F(CtlTest, StalledGpuIsOneForThatServiceOnly) {
  ASSERT_TRUE(control_.stall_proxy(1, std::chrono::seconds(30)).ok());
  server_->refresh_health();
  EXPECT_EQ(ctl("health --service mkerneld.gpu0").exit_code, 0);
  EXPECT_EQ(ctl("health --service mkerneld.gpu1").exit_code, 1);
  EXPECT_EQ(ctl("health").exit_code, 1);
  // An unknown service is not healthy either.
  EXPECT_EQ(ctl("health --service mkerneld.gpu9").exit_code, 1);
}

TEST_F(CtlTest, NoServerIsTwo) {
  RunResult r = run_command(std::string(MKERNELDCTL_PATH) + " --timeout 2 --runtime-dir " +
                            dir_.path + "/absent health");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  // A socket file nobody listens on behaves the same.
  server_->stop();
  EXPECT_EQ(ctl("status").exit_code, 2);
}

TEST_F(CtlTest, BadArgumentsAreThree) {
  EXPECT_EQ(ctl("").exit_code, 3);
  EXPECT_EQ(ctl("frobnicate").exit_code, 3);
  EXPECT_EQ(ctl("--format yaml status").exit_code, 3);
  EXPECT_EQ(ctl("--timeout -1 status").exit_code, 3);
  EXPECT_EQ(ctl("--socket /x status").exit_code, 3);  // --socket excludes --runtime-dir
  RunResult help = run_command(std::string(MKERNELDCTL_PATH) + " --help");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.out.find("unreachable"), std::string::npos) << help.out;
}

TEST_F(CtlTest, StatsTextHasOneRowPerGpuWithPercentiles) {
  RunResult r = ctl("stats");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("P50"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("gpu0"), std::string::npos);
  EXPECT_NE(r.out.find("gpu1"), std::string::npos);
  EXPECT_NE(r.out.find("5/1024"), std::string::npos) << r.out;
  // p50 of the fake histogram lies in [512 ns, 1024 ns), p99 in [8 us, 16 us].
  EXPECT_NE(r.out.find("ns"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("us"), std::string::npos) << r.out;
}

TEST_F(CtlTest, JsonParsesWithStableFieldNames) {
  RunResult r = ctl("--format json stats");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("\"ring_occupancy\""), std::string::npos) << r.out;
  ::mkernel::admin::v1::Stats stats;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(r.out, &stats).ok()) << r.out;
  ASSERT_EQ(stats.proxies_size(), 2);
  EXPECT_EQ(stats.proxies(1).commands().ok(), 11u);

  RunResult s = ctl("status --format json");  // options after the command work too
  ASSERT_EQ(s.exit_code, 0) << s.out;
  ::mkernel::admin::v1::DaemonStatus status;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(s.out, &status).ok()) << s.out;
  EXPECT_EQ(status.node_name(), "node-a");

  RunResult h = ctl("--format json health");
  ASSERT_EQ(h.exit_code, 0) << h.out;
  EXPECT_NE(h.out.find("\"healthy\": true"), std::string::npos) << h.out;

  RunResult c = ctl("--format json clients");
  ASSERT_EQ(c.exit_code, 0) << c.out;
  EXPECT_NE(c.out.find("\"communicator\": \"comm-1\""), std::string::npos) << c.out;
}

TEST_F(CtlTest, ReloadAppliedIsZeroRefusedIsOne) {
  RunResult ok = ctl("reload /etc/mkernel/good.yaml");
  EXPECT_EQ(ok.exit_code, 0) << ok.out;
  EXPECT_NE(ok.out.find("rings.capacity_log2"), std::string::npos) << ok.out;
  RunResult bad = ctl("reload /etc/mkernel/bad.yaml");
  EXPECT_EQ(bad.exit_code, 1) << bad.out;
  EXPECT_NE(bad.out.find("refused"), std::string::npos) << bad.out;
}

TEST_F(CtlTest, StatusAndClientsText) {
  RunResult s = ctl("status");
  EXPECT_EQ(s.exit_code, 0) << s.out;
  EXPECT_NE(s.out.find("node-a"), std::string::npos) << s.out;
  RunResult c = ctl("clients");
  EXPECT_EQ(c.exit_code, 0) << c.out;
  EXPECT_NE(c.out.find("trainer"), std::string::npos) << c.out;
  EXPECT_NE(c.out.find("1/4"), std::string::npos) << c.out;
}

// Refusals by reason and what clients hold: `status` lists the refusals that happened, `stats`
// every reason, and JSON carries both.
TEST_F(CtlTest, RefusalsAndUsageInStatusAndStats) {
  RunResult quiet = ctl("status");
  ASSERT_EQ(quiet.exit_code, 0) << quiet.out;
  EXPECT_NE(quiet.out.find("refusals            none\n"), std::string::npos) << quiet.out;
  control_.set_refusals("malformed", 7);
  control_.set_refusals("clients.per_uid.sessions", 3);
  RunResult s = ctl("status");
  ASSERT_EQ(s.exit_code, 0) << s.out;
  EXPECT_NE(s.out.find("malformed 7, clients.per_uid.sessions 3"), std::string::npos) << s.out;
  EXPECT_EQ(s.out.find("hello_refused"), std::string::npos) << "only those that happened: " << s.out;
  EXPECT_NE(s.out.find("2 / 1024"), std::string::npos) << "client sessions against the limit: " << s.out;
  EXPECT_NE(s.out.find("5 / 8192"), std::string::npos) << "client descriptors against the budget: " << s.out;
  RunResult t = ctl("stats");
  ASSERT_EQ(t.exit_code, 0) << t.out;
  EXPECT_NE(t.out.find("REFUSED"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("hello_refused"), std::string::npos) << "every reason, zeros too: " << t.out;
  EXPECT_NE(t.out.find("clients.per_uid.sessions"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("limit 9216"), std::string::npos) << "the process's descriptor limit: " << t.out;
  RunResult j = ctl("--format json stats");
  ASSERT_EQ(j.exit_code, 0) << j.out;
  ::mkernel::admin::v1::Stats stats;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(j.out, &stats).ok()) << j.out;
  uint64_t malformed = 0;
  for (const auto& r : stats.refusals())
    if (r.reason() == "malformed") malformed = r.count();
  EXPECT_EQ(malformed, 7u) << j.out;
  EXPECT_EQ(stats.usage().descriptor_budget(), 8192u) << j.out;
}

// A daemon whose config names the admin socket admin.sock (the config's default) is found
// through --runtime-dir as well.
TEST(CtlSocketNames, ConfigDefaultNameIsFound) {
  TempDir dir;
  FakeControl control;
  AdminOptions opt;
  opt.listen = {"unix:" + dir.path + "/admin.sock"};
  auto server = AdminServer::start(control, opt);
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  RunResult r = run_command(std::string(MKERNELDCTL_PATH) + " --timeout 3 --runtime-dir " +
                            dir.path + " health");
  EXPECT_EQ(r.exit_code, 0) << r.out;
}

// The independent client: grpcio's reference health stub.
TEST_F(CtlTest, PythonHealthCheck) {
  const std::string python = MKERNEL_TEST_PYTHON;
  if (python.empty()) {
    GTEST_SKIP() << "no Python with grpcio and grpcio-health-checking (set MKERNEL_TEST_PYTHON)";
  }
  const std::string base = python + " " + MKERNEL_HEALTH_CHECK_PY + " --timeout 3 ";
  RunResult healthy = run_command(base + "--runtime-dir " + dir_.path);
  EXPECT_EQ(healthy.exit_code, 0) << healthy.out;
  EXPECT_NE(healthy.out.find("mkerneld.gpu1\tSERVING"), std::string::npos) << healthy.out;

  ASSERT_TRUE(control_.stall_proxy(1, std::chrono::seconds(30)).ok());
  server_->refresh_health();
  EXPECT_EQ(run_command(base + "--runtime-dir " + dir_.path + " --service mkerneld.gpu0").exit_code,
            0);
  EXPECT_EQ(run_command(base + "--runtime-dir " + dir_.path + " --service mkerneld.gpu1").exit_code,
            1);
  EXPECT_EQ(run_command(base + "--runtime-dir " + dir_.path).exit_code, 1);
  EXPECT_EQ(run_command(base + "--runtime-dir " + dir_.path + "/absent").exit_code, 2);
}

}  // namespace
}  // namespace mkernel::daemon
