// ops_test.cc: the admin gRPC service and the health service of AdminServer, through real
// gRPC stubs over a Unix socket, against a FakeControl.
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <chrono>
#include <thread>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "admin_server.h"
#include "mkernel/proto/admin.grpc.pb.h"
#include "mkernel/proto/health.grpc.pb.h"
#include "ops_fake_control.h"

namespace mkernel::daemon {
namespace {

namespace pb = ::mkernel::admin::v1;
using HealthResponse = ::grpc::health::v1::HealthCheckResponse;
using testing::FakeControl;
using testing::TempDir;
using Clock = std::chrono::steady_clock;

class AdminServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(dir_.path.empty());
    AdminOptions opt;
    opt.runtime_dir = dir_.path;
    auto server = AdminServer::start(control_, opt);
    ASSERT_TRUE(server.ok()) << server.status().to_string();
    server_ = std::move(server).value();
    socket_ = dir_.path + "/" + kDefaultAdminSocketName;
    auto channel = grpc::CreateChannel("unix:" + socket_, grpc::InsecureChannelCredentials());
    admin_ = pb::Admin::NewStub(channel);
    health_ = ::grpc::health::v1::Health::NewStub(channel);
  }

  static void deadline(grpc::ClientContext* ctx) {
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  }

  HealthResponse::ServingStatus check(const std::string& service) {
    grpc::ClientContext ctx;
    deadline(&ctx);
    ::grpc::health::v1::HealthCheckRequest req;
    req.set_service(service);
    HealthResponse resp;
    grpc::Status s = health_->Check(&ctx, req, &resp);
    if (s.error_code() == grpc::StatusCode::NOT_FOUND) return HealthResponse::SERVICE_UNKNOWN;
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp.status();
  }

  // Polls until `service` reports `want`; returns how long that took (or the bound, 3 s).
  std::chrono::milliseconds wait_for(const std::string& service,
                                     HealthResponse::ServingStatus want) {
    const auto start = Clock::now();
    const auto bound = start + std::chrono::seconds(3);
    while (Clock::now() < bound) {
      if (check(service) == want) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
  }

  TempDir dir_;
  FakeControl control_;
  std::unique_ptr<AdminServer> server_;
  std::string socket_;
  std::unique_ptr<pb::Admin::Stub> admin_;
  std::unique_ptr<::grpc::health::v1::Health::Stub> health_;
};

TEST_F(AdminServerTest, GetStatusMirrorsControl) {
  grpc::ClientContext ctx;
  deadline(&ctx);
  pb::DaemonStatus st;
  ASSERT_TRUE(admin_->GetStatus(&ctx, pb::GetStatusRequest{}, &st).ok());
  EXPECT_EQ(st.node_name(), "node-a");
  EXPECT_EQ(st.version(), "0.1.0");
  EXPECT_EQ(st.epoch(), 0xabcdefu);
  EXPECT_EQ(st.pid(), 4242);
  EXPECT_FALSE(st.draining());
  EXPECT_EQ(st.config_source(), "built-in default");
  ASSERT_EQ(st.proxies_size(), 2);
  EXPECT_EQ(st.proxies(1), "gpu1");
  ASSERT_EQ(st.health_size(), 5);  // "", gpu0, gpu1, nic0, nic1
  EXPECT_EQ(st.health(0).service(), "");
  EXPECT_TRUE(st.health(0).serving());
  EXPECT_EQ(st.health(4).service(), "mkerneld.nic.nic1");
}

TEST_F(AdminServerTest, GetStatsMirrorsControl) {
  grpc::ClientContext ctx;
  deadline(&ctx);
  pb::Stats st;
  ASSERT_TRUE(admin_->GetStats(&ctx, pb::GetStatsRequest{}, &st).ok());
  ASSERT_EQ(st.proxies_size(), 2);
  const auto& p = st.proxies(1);
  EXPECT_EQ(p.gpu(), 1u);
  EXPECT_EQ(p.name(), "gpu1");
  EXPECT_EQ(p.transport(), "loopback");
  EXPECT_EQ(p.nic(), "nic1");
  EXPECT_EQ(p.commands().ok(), 11u);
  EXPECT_EQ(p.commands().error(), 2u);
  EXPECT_EQ(p.commands().rejected(), 1u);
  EXPECT_EQ(p.in_flight(), 3u);
  EXPECT_EQ(p.consumed(), 17u);
  EXPECT_EQ(p.bytes(), 8192u);
  EXPECT_EQ(p.ring_occupancy(), 5u);
  EXPECT_EQ(p.ring_capacity(), 1024u);
  ASSERT_EQ(p.latency_ns_log2_size(), static_cast<int>(kLatencyBuckets));
  EXPECT_EQ(p.latency_ns_log2(10), 6u);
  EXPECT_EQ(p.latency_ns_log2(14), 4u);
  EXPECT_TRUE(p.alive());
}

TEST_F(AdminServerTest, ListClients) {
  grpc::ClientContext ctx;
  deadline(&ctx);
  pb::ClientList list;
  ASSERT_TRUE(admin_->ListClients(&ctx, pb::ListClientsRequest{}, &list).ok());
  ASSERT_EQ(list.clients_size(), 1);
  EXPECT_EQ(list.clients(0).session_id(), 7u);
  EXPECT_EQ(list.clients(0).name(), "trainer");
  EXPECT_EQ(list.clients(0).world_size(), 4u);
  EXPECT_EQ(list.clients(0).registered_bytes(), 1u << 20);
}

TEST_F(AdminServerTest, DrainAndUndrainFlipHealthAtOnce) {
  {
    grpc::ClientContext ctx;
    deadline(&ctx);
    pb::DrainReply reply;
    ASSERT_TRUE(admin_->Drain(&ctx, pb::DrainRequest{}, &reply).ok());
    EXPECT_TRUE(reply.draining());
  }
  // Drain publishes from the RPC itself, before the next poll.
  EXPECT_EQ(check(""), HealthResponse::NOT_SERVING);
  EXPECT_EQ(check("mkerneld.gpu0"), HealthResponse::NOT_SERVING);
  {
    grpc::ClientContext ctx;
    deadline(&ctx);
    pb::DrainReply reply;
    ASSERT_TRUE(admin_->Undrain(&ctx, pb::UndrainRequest{}, &reply).ok());
    EXPECT_FALSE(reply.draining());
  }
  EXPECT_EQ(check(""), HealthResponse::SERVING);
  EXPECT_EQ(check("mkerneld.gpu1"), HealthResponse::SERVING);
}

TEST_F(AdminServerTest, ReloadAppliedAndRefused) {
  {
    grpc::ClientContext ctx;
    deadline(&ctx);
    pb::ReloadRequest req;
    req.set_path("/etc/mkernel/good.yaml");
    pb::ReloadReply reply;
    ASSERT_TRUE(admin_->Reload(&ctx, req, &reply).ok());
    EXPECT_TRUE(reply.applied());
    EXPECT_EQ(reply.error(), "");
    ASSERT_EQ(reply.applied_changes_size(), 1);
    EXPECT_EQ(reply.applied_changes(0), "logging.level");
    ASSERT_EQ(reply.needs_restart_size(), 1);
    EXPECT_EQ(reply.needs_restart(0), "rings.capacity_log2");
    EXPECT_EQ(reply.config_generation(), 1u);
  }
  {
    grpc::ClientContext ctx;
    deadline(&ctx);
    pb::ReloadRequest req;
    req.set_path("/etc/mkernel/bad.yaml");
    pb::ReloadReply reply;
    ASSERT_TRUE(admin_->Reload(&ctx, req, &reply).ok());
    EXPECT_FALSE(reply.applied());
    EXPECT_NE(reply.error().find("rings.capacity_log2: 40"), std::string::npos) << reply.error();
    EXPECT_EQ(reply.config_generation(), 1u);
  }
}

TEST_F(AdminServerTest, StallProxyErrorsMapToGrpcCodes) {
  grpc::ClientContext ctx;
  deadline(&ctx);
  pb::StallProxyRequest req;
  req.set_gpu(9);
  req.set_duration_ms(10);
  pb::StallProxyReply reply;
  grpc::Status s = admin_->StallProxy(&ctx, req, &reply);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(s.error_message().find("no proxy 9"), std::string::npos);
}

TEST_F(AdminServerTest, HealthNamesServerGpusAndNics) {
  EXPECT_EQ(check(""), HealthResponse::SERVING);
  EXPECT_EQ(check("mkerneld.gpu0"), HealthResponse::SERVING);
  EXPECT_EQ(check("mkerneld.gpu1"), HealthResponse::SERVING);
  EXPECT_EQ(check("mkerneld.nic.nic0"), HealthResponse::SERVING);
  EXPECT_EQ(check("mkerneld.gpu7"), HealthResponse::SERVICE_UNKNOWN);
}

// The daemon drains on its own (SIGTERM, config): the poller must notice within a second.
TEST_F(AdminServerTest, DrainSeenByPollerWithinOneSecond) {
  ASSERT_TRUE(control_.drain().ok());
  const auto took = wait_for("", HealthResponse::NOT_SERVING);
  EXPECT_LT(took.count(), 1000) << "whole server NOT_SERVING after " << took.count() << " ms";
  EXPECT_EQ(check("mkerneld.gpu0"), HealthResponse::NOT_SERVING);
  EXPECT_EQ(check("mkerneld.gpu1"), HealthResponse::NOT_SERVING);
  std::printf("drain -> NOT_SERVING in %lld ms\n", static_cast<long long>(took.count()));
}

TEST_F(AdminServerTest, StalledProxyFlipsOnlyItsGpuAndTheServer) {
  {
    grpc::ClientContext ctx;
    deadline(&ctx);
    pb::StallProxyRequest req;
    req.set_gpu(1);
    req.set_duration_ms(1500);
    pb::StallProxyReply reply;
    ASSERT_TRUE(admin_->StallProxy(&ctx, req, &reply).ok());
  }
  const auto took = wait_for("mkerneld.gpu1", HealthResponse::NOT_SERVING);
  EXPECT_LT(took.count(), 1000) << "gpu1 NOT_SERVING after " << took.count() << " ms";
  EXPECT_EQ(check(""), HealthResponse::NOT_SERVING);
  EXPECT_EQ(check("mkerneld.gpu0"), HealthResponse::SERVING);
  EXPECT_EQ(check("mkerneld.nic.nic1"), HealthResponse::SERVING);
  // The stall ends: both come back.
  const auto back = wait_for("mkerneld.gpu1", HealthResponse::SERVING);
  EXPECT_LT(back.count(), 2500);
  EXPECT_EQ(check(""), HealthResponse::SERVING);
}

TEST_F(AdminServerTest, SocketModeIs0660ByDefault) {
  struct stat st {};
  ASSERT_EQ(stat(socket_.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0660u);
}

TEST_F(AdminServerTest, StopRemovesSocketAndIsIdempotent) {
  server_->stop();
  server_->stop();
  struct stat st {};
  EXPECT_NE(stat(socket_.c_str(), &st), 0);
}

TEST_F(AdminServerTest, SecondServerOnLiveSocketIsRefused) {
  AdminOptions opt;
  opt.runtime_dir = dir_.path;
  auto second = AdminServer::start(control_, opt);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kAlreadyExists) << second.status().to_string();
  // The first one still answers.
  EXPECT_EQ(check(""), HealthResponse::SERVING);
}

TEST(AdminServerOptions, ConfigurableModeAndStaleSocketReplaced) {
  TempDir dir;
  const std::string path = dir.path + "/admin.sock";
  // A socket file whose server is gone, as a killed daemon leaves it.
  {
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    path.copy(addr.sun_path, path.size());
    ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    close(fd);
  }
  FakeControl control;
  AdminOptions opt;
  opt.listen = {"unix:" + path};
  opt.socket_mode = 0600;
  auto server = AdminServer::start(control, opt);
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  ASSERT_EQ(server.value()->addresses().size(), 1u);
  EXPECT_EQ(server.value()->addresses()[0], "unix:" + path);
}

TEST(AdminServerOptions, TcpWithoutTlsIsRefused) {
  FakeControl control;
  AdminOptions opt;
  opt.listen = {"127.0.0.1:0"};
  auto server = AdminServer::start(control, opt);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(server.status().message().find("TLS"), std::string::npos)
      << server.status().to_string();
}

TEST(AdminServerOptions, RegularFileAtSocketPathIsNotReplaced) {
  TempDir dir;
  const std::string path = dir.path + "/admin.sock";
  FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  FakeControl control;
  AdminOptions opt;
  opt.listen = {"unix:" + path};
  auto server = AdminServer::start(control, opt);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), StatusCode::kAlreadyExists);
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
}

TEST(AdminServerOptions, MissingDirectoryFailsWithoutHanging) {
  FakeControl control;
  AdminOptions opt;
  opt.runtime_dir = "/tmp/mkops-no-such-dir/x";
  auto server = AdminServer::start(control, opt);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), StatusCode::kUnavailable) << server.status().to_string();
}

}  // namespace
}  // namespace mkernel::daemon
