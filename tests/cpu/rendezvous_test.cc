// Communicator rendezvous through a real gRPC peer service on a Unix socket: the whole table to
// every rank, missing ranks named within the bound, wrong tokens and sizes refused, ids reused;
// the gRPC <-> Status mapping.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "grpc_status.h"
#include "rendezvous.h"

namespace md = mkernel::daemon;
namespace pb = mkernel::peer::v1;
using namespace std::chrono_literals;
using mkernel::StatusCode;

namespace {

class RendezvousTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/mkernel-rdv-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    service_ = std::make_unique<md::RendezvousService>(md::RendezvousOptions{5000ms, 4, 1024});
    grpc::ServerBuilder b;
    b.AddListeningPort("unix:" + dir_ + "/peer.sock", grpc::InsecureServerCredentials());
    b.RegisterService(service_.get());
    server_ = b.BuildAndStart();
    ASSERT_TRUE(server_);
    channel_ = grpc::CreateChannel("unix:" + dir_ + "/peer.sock", grpc::InsecureChannelCredentials());
  }
  void TearDown() override {
    server_->Shutdown(std::chrono::system_clock::now() + 1s);
    std::filesystem::remove_all(dir_);
  }
  pb::JoinRequest req(const std::string& comm, uint32_t size, uint32_t rank, const std::string& token = "s3cret") {
    pb::JoinRequest r;
    r.set_communicator(comm);
    r.set_size(size);
    r.set_rank(rank);
    r.set_token(token);
    r.set_node("node" + std::to_string(rank));
    r.set_endpoint("EP-" + std::to_string(rank) + "-KEY0xDEADBEEF");
    auto* reg = r.add_regions();
    reg->set_region_id(rank);
    reg->set_bytes(4096);
    reg->set_blob("RKEY-" + std::to_string(rank));
    return r;
  }
  std::string dir_;
  std::unique_ptr<md::RendezvousService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
};

}  // namespace

TEST_F(RendezvousTest, EveryRankGetsTheWholeTable) {
  constexpr uint32_t kSize = 8;
  std::vector<mkernel::StatusOr<pb::JoinReply>> got(kSize, mkernel::Status(StatusCode::kInternal, "unset"));
  std::vector<std::thread> ts;
  for (uint32_t r = 0; r < kSize; ++r)
    ts.emplace_back([&, r] { got[r] = md::rendezvous_join(channel_, req("job1", kSize, r), 5s); });
  for (auto& t : ts) t.join();
  for (uint32_t r = 0; r < kSize; ++r) {
    ASSERT_TRUE(got[r].ok()) << got[r].status().to_string();
    ASSERT_EQ(got[r]->ranks_size(), static_cast<int>(kSize));
    for (uint32_t k = 0; k < kSize; ++k) {
      EXPECT_EQ(got[r]->ranks(static_cast<int>(k)).rank(), k);
      EXPECT_EQ(got[r]->ranks(static_cast<int>(k)).endpoint(), "EP-" + std::to_string(k) + "-KEY0xDEADBEEF");
      EXPECT_EQ(got[r]->ranks(static_cast<int>(k)).regions(0).blob(), "RKEY-" + std::to_string(k));
    }
  }
  EXPECT_EQ(service_->pending(), 0u) << "a finished communicator leaves nothing behind";
  // The same id can form again (a restarted job).
  std::thread a([&] { got[0] = md::rendezvous_join(channel_, req("job1", 2, 0), 5s); });
  got[1] = md::rendezvous_join(channel_, req("job1", 2, 1), 5s);
  a.join();
  EXPECT_TRUE(got[0].ok() && got[1].ok());
}

TEST_F(RendezvousTest, MissingRanksAreNamedWithinTheBound) {
  std::vector<mkernel::StatusOr<pb::JoinReply>> got(3, mkernel::Status(StatusCode::kInternal, "unset"));
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> ts;
  for (uint32_t r : {0u, 1u, 3u})
    ts.emplace_back([&, r] { got[r == 3 ? 2 : r] = md::rendezvous_join(channel_, req("job2", 4, r), 400ms); });
  for (auto& t : ts) t.join();
  const auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_LT(waited, 3s);
  for (auto& g : got) {
    ASSERT_FALSE(g.ok());
    EXPECT_EQ(g.status().code(), StatusCode::kDeadlineExceeded);
    EXPECT_NE(g.status().message().find("ranks 2 of 4 did not join"), std::string::npos) << g.status().to_string();
    EXPECT_EQ(g.status().message().find("DEADBEEF"), std::string::npos) << "no secrets in errors";
  }
  const auto deadline = std::chrono::steady_clock::now() + 2s;
  while (service_->pending() != 0 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(service_->pending(), 0u);
}

TEST_F(RendezvousTest, StrangersAndMismatchesAreRefused) {
  std::thread first([&] { (void)md::rendezvous_join(channel_, req("job3", 2, 0), 1500ms); });
  std::this_thread::sleep_for(100ms);
  auto bad_token = md::rendezvous_join(channel_, req("job3", 2, 1, "guess"), 1s);
  EXPECT_EQ(bad_token.status().code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(bad_token.status().message().find("s3cret"), std::string::npos);
  auto bad_size = md::rendezvous_join(channel_, req("job3", 3, 1), 1s);
  EXPECT_EQ(bad_size.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad_size.status().message().find("size: 3; communicator \"job3\" has 2"), std::string::npos);
  auto other = req("job3", 2, 0);
  other.set_endpoint("somewhere-else");
  auto dup = md::rendezvous_join(channel_, other, 1s);
  EXPECT_EQ(dup.status().code(), StatusCode::kAlreadyExists);
  auto bad_rank = md::rendezvous_join(channel_, req("job3", 2, 2), 1s);
  EXPECT_EQ(bad_rank.status().code(), StatusCode::kInvalidArgument);
  auto no_token = md::rendezvous_join(channel_, req("job4", 2, 0, ""), 1s);
  EXPECT_EQ(no_token.status().code(), StatusCode::kPermissionDenied);
  first.join();
}

// A stranger that comes before rank 0 cannot claim the id: it waits under its own token, is
// refused the moment rank 0 joins with the communicator's token, and the real ranks form.
TEST_F(RendezvousTest, AStrangerFirstIsRefusedWhenRankZeroComes) {
  mkernel::StatusOr<pb::JoinReply> stranger = mkernel::Status(StatusCode::kInternal, "unset");
  mkernel::StatusOr<pb::JoinReply> r1 = mkernel::Status(StatusCode::kInternal, "unset");
  std::chrono::steady_clock::duration stranger_waited{};
  std::thread s([&] {
    const auto t0 = std::chrono::steady_clock::now();
    stranger = md::rendezvous_join(channel_, req("job5", 2, 1, "not-the-token"), 4s);
    stranger_waited = std::chrono::steady_clock::now() - t0;
  });
  std::this_thread::sleep_for(300ms);
  std::thread one([&] { r1 = md::rendezvous_join(channel_, req("job5", 2, 1), 4s); });
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(service_->pending(), 1u) << "both tokens wait under one communicator id";
  const auto t0 = std::chrono::steady_clock::now();
  auto r0 = md::rendezvous_join(channel_, req("job5", 2, 0), 4s);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
  s.join();
  one.join();
  ASSERT_TRUE(r0.ok()) << r0.status().to_string();
  ASSERT_TRUE(r1.ok()) << r1.status().to_string();
  EXPECT_EQ(r0->ranks(1).endpoint(), "EP-1-KEY0xDEADBEEF");
  ASSERT_FALSE(stranger.ok());
  EXPECT_EQ(stranger.status().code(), StatusCode::kPermissionDenied) << stranger.status().to_string();
  EXPECT_EQ(stranger.status().message().find("s3cret"), std::string::npos);
  EXPECT_LT(stranger_waited, 3s) << "refused when rank 0 came, not at its own deadline";
  EXPECT_EQ(service_->pending(), 0u);
  // Once rank 0 is in, a wrong token is refused on arrival.
  std::thread again([&] { r0 = md::rendezvous_join(channel_, req("job6", 2, 0), 1500ms); });
  std::this_thread::sleep_for(200ms);
  const auto t1 = std::chrono::steady_clock::now();
  auto late = md::rendezvous_join(channel_, req("job6", 2, 1, "not-the-token"), 1s);
  EXPECT_EQ(late.status().code(), StatusCode::kPermissionDenied);
  EXPECT_LT(std::chrono::steady_clock::now() - t1, 500ms);
  again.join();
}

// Tokens waiting for rank 0 are bounded per id, like ids are.
TEST_F(RendezvousTest, AtMostEightTokensWaitForRankZero) {
  std::vector<std::thread> ts;
  for (int i = 0; i < 8; ++i)
    ts.emplace_back([&, i] { (void)md::rendezvous_join(channel_, req("crowd", 4, 1, "token-" + std::to_string(i)), 800ms); });
  std::this_thread::sleep_for(300ms);
  auto refused = md::rendezvous_join(channel_, req("crowd", 4, 2, "token-9"), 500ms);
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted) << refused.status().to_string();
  EXPECT_NE(refused.status().message().find("8 different tokens"), std::string::npos) << refused.status().to_string();
  for (auto& t : ts) t.join();
  EXPECT_EQ(service_->pending(), 0u);
}

// A stranger retrying with wrong tokens is refused every time, fast, and the root keeps nothing.
TEST_F(RendezvousTest, RepeatedWrongTokensAreRefusedAndLeaveNothing) {
  std::thread owner([&] { (void)md::rendezvous_join(channel_, req("job7", 2, 0), 2s); });
  std::this_thread::sleep_for(200ms);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 50; ++i) {
    auto bad = md::rendezvous_join(channel_, req("job7", 2, 1, "guess-" + std::to_string(i)), 1s);
    ASSERT_EQ(bad.status().code(), StatusCode::kPermissionDenied) << bad.status().to_string();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1500ms);
  auto good = md::rendezvous_join(channel_, req("job7", 2, 1), 2s);
  EXPECT_TRUE(good.ok()) << good.status().to_string();
  owner.join();
  EXPECT_EQ(service_->pending(), 0u);
}

TEST_F(RendezvousTest, AtMostMaxPendingCommunicatorsForm) {
  std::vector<std::thread> ts;
  for (int i = 0; i < 4; ++i)
    ts.emplace_back([&, i] { (void)md::rendezvous_join(channel_, req("pend" + std::to_string(i), 2, 0), 800ms); });
  std::this_thread::sleep_for(200ms);
  auto refused = md::rendezvous_join(channel_, req("pend-extra", 2, 0), 500ms);
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted) << refused.status().to_string();
  for (auto& t : ts) t.join();
}

// The one gRPC <-> Status mapping (grpc_status.h): both directions, CANCELLED included.
TEST(GrpcStatus, MapsEveryCodeBothWays) {
  using G = grpc::StatusCode;
  EXPECT_EQ(md::from_grpc_code(G::CANCELLED), StatusCode::kUnavailable) << "a cancelled join may be tried again";
  EXPECT_EQ(md::from_grpc_code(G::UNAVAILABLE), StatusCode::kUnavailable);
  EXPECT_EQ(md::from_grpc_code(G::DEADLINE_EXCEEDED), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(md::from_grpc_code(G::PERMISSION_DENIED), StatusCode::kPermissionDenied);
  EXPECT_EQ(md::from_grpc_code(G::INVALID_ARGUMENT), StatusCode::kInvalidArgument);
  EXPECT_EQ(md::from_grpc_code(G::ALREADY_EXISTS), StatusCode::kAlreadyExists);
  EXPECT_EQ(md::from_grpc_code(G::RESOURCE_EXHAUSTED), StatusCode::kResourceExhausted);
  EXPECT_EQ(md::from_grpc_code(G::NOT_FOUND), StatusCode::kNotFound);
  EXPECT_EQ(md::from_grpc_code(G::FAILED_PRECONDITION), StatusCode::kFailedPrecondition);
  EXPECT_EQ(md::from_grpc_code(G::UNKNOWN), StatusCode::kUnavailable);
  const mkernel::Status joined = md::from_grpc(grpc::Status(G::PERMISSION_DENIED, "token refused"), "rendezvous");
  EXPECT_EQ(joined.code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(joined.message(), "rendezvous: token refused");
  EXPECT_EQ(joined.file(), "rendezvous_test.cc") << "made where the result was read";
  EXPECT_TRUE(md::from_grpc(grpc::Status::OK, "rendezvous").ok());
  // Every Status code goes out as a gRPC code that comes back as itself, except the three
  // that gRPC has no word for (kIoError, kDeviceError -> INTERNAL -> kInternal; kProtocolError
  // -> INVALID_ARGUMENT).
  for (int c = 1; c <= static_cast<int>(StatusCode::kInternal); ++c) {
    const auto code = static_cast<StatusCode>(c);
    const StatusCode back = md::from_grpc_code(md::to_grpc_code(code));
    if (code == StatusCode::kIoError || code == StatusCode::kDeviceError)
      EXPECT_EQ(back, StatusCode::kInternal) << mkernel::status_code_name(code);
    else if (code == StatusCode::kProtocolError)
      EXPECT_EQ(back, StatusCode::kInvalidArgument);
    else
      EXPECT_EQ(back, code) << mkernel::status_code_name(code);
  }
  const grpc::Status out = md::to_grpc(mkernel::Status(StatusCode::kNotFound, "gpu: 9 has no proxy"));
  EXPECT_EQ(out.error_code(), G::NOT_FOUND);
  EXPECT_EQ(out.error_message().rfind("not found: gpu: 9 has no proxy (at rendezvous_test.cc:", 0), 0u)
      << out.error_message();
  EXPECT_TRUE(md::to_grpc(mkernel::Status::Ok()).ok());
}
