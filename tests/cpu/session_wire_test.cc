// Framing of setup messages: length prefix, descriptor counts, truncated control data, bounded
// receives; sealed segments.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "mkernel/proto/session.pb.h"
#include "mkernel/protocol/session_wire.h"
#include "mkernel/protocol/shm.h"

namespace mp = mkernel::protocol;
namespace pb = mkernel::session::v1;
using namespace std::chrono_literals;
using mkernel::StatusCode;

namespace {

struct Pair {
  mp::UniqueFd a, b;
  Pair() {
    int sv[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
    a = mp::UniqueFd(sv[0]);
    b = mp::UniqueFd(sv[1]);
  }
};

pb::Request ping(uint64_t id) {
  pb::Request r;
  r.set_request_id(id);
  r.mutable_ping();
  return r;
}

int open_fds() {
  int n = 0;
  for (int fd = 0; fd < 1024; ++fd) n += ::fcntl(fd, F_GETFD) != -1;
  return n;
}

}  // namespace

TEST(SessionWire, RoundTripWithAndWithoutDescriptors) {
  Pair p;
  ASSERT_TRUE(mp::send_message(p.a.get(), ping(7), {}, 1s).ok());
  pb::Request got;
  ASSERT_TRUE(mp::recv_message(p.b.get(), &got, 0, nullptr, 1s).ok());
  EXPECT_EQ(got.request_id(), 7u);
  EXPECT_TRUE(got.has_ping());

  auto seg = mp::create_sealed_segment("wire-test", 100);
  ASSERT_TRUE(seg.ok()) << seg.status().to_string();
  std::memcpy(seg->data(), "hello", 6);
  ASSERT_TRUE(mp::send_message(p.a.get(), ping(8), {seg->fd()}, 1s).ok());
  std::vector<mp::UniqueFd> fds;
  ASSERT_TRUE(mp::recv_message(p.b.get(), &got, 1, &fds, 1s).ok());
  ASSERT_EQ(fds.size(), 1u);
  auto mapped = mp::map_segment(std::move(fds[0]), 0, true);
  ASSERT_TRUE(mapped.ok()) << mapped.status().to_string();
  EXPECT_EQ(mapped->size(), 4096u) << "size comes from the descriptor, rounded to a page";
  EXPECT_STREQ(static_cast<const char*>(mapped->data()), "hello");
}

TEST(SessionWire, WrongDescriptorCountIsRefusedAndNothingLeaks) {
  Pair p;
  auto seg = mp::create_sealed_segment("wire-test", 4096);
  ASSERT_TRUE(seg.ok());
  const int before = open_fds();
  ASSERT_TRUE(mp::send_message(p.a.get(), ping(1), {seg->fd(), seg->fd()}, 1s).ok());
  pb::Request got;
  const mkernel::Status s = mp::recv_message(p.b.get(), &got, 1, nullptr, 1s);
  EXPECT_EQ(s.code(), StatusCode::kProtocolError);
  EXPECT_EQ(s.message(), "file descriptors: 2 attached; expected 1");
  EXPECT_EQ(open_fds(), before) << "received descriptors were closed";
  ASSERT_TRUE(mp::send_message(p.a.get(), ping(2), {seg->fd()}, 1s).ok());
  EXPECT_EQ(mp::recv_message(p.b.get(), &got, 0, nullptr, 1s).message(),
            "file descriptors: 1 attached; expected 0");
  EXPECT_EQ(open_fds(), before);
}

TEST(SessionWire, TruncatedControlDataIsRefused) {
  Pair p;
  auto seg = mp::create_sealed_segment("wire-test", 4096);
  ASSERT_TRUE(seg.ok());
  // Eight descriptors: more than the receiver's control buffer (kMaxFdsPerMessage) holds.
  std::string body;
  ping(3).SerializeToString(&body);
  std::string frame(4, '\0');
  frame[0] = static_cast<char>(body.size());
  frame += body;
  int fds[8];
  for (int& f : fds) f = seg->fd();
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(fds))] = {};
  iovec iov{frame.data(), frame.size()};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = control;
  mh.msg_controllen = sizeof(control);
  cmsghdr* c = CMSG_FIRSTHDR(&mh);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(fds));
  std::memcpy(CMSG_DATA(c), fds, sizeof(fds));
  const int before = open_fds();
  ASSERT_EQ(::sendmsg(p.a.get(), &mh, 0), static_cast<ssize_t>(frame.size()));
  pb::Request got;
  const mkernel::Status s = mp::recv_message(p.b.get(), &got, 1, nullptr, 1s);
  EXPECT_EQ(s.code(), StatusCode::kProtocolError);
  EXPECT_NE(s.message().find("ancillary data truncated"), std::string::npos) << s.to_string();
  EXPECT_EQ(open_fds(), before);
}

TEST(SessionWire, BadLengthPrefixAndGarbageBodyAreRefused) {
  Pair p;
  const char frame[] = {10, 0, 0, 0, 1, 2, 3};
  ASSERT_EQ(::send(p.a.get(), frame, sizeof(frame), 0), static_cast<ssize_t>(sizeof(frame)));
  pb::Request got;
  EXPECT_EQ(mp::recv_message(p.b.get(), &got, 0, nullptr, 1s).message(),
            "length prefix: 10; expected 3 (the packet's payload size)");
  const char garbage[] = {3, 0, 0, 0, '\xff', '\xff', '\xff'};
  ASSERT_EQ(::send(p.a.get(), garbage, sizeof(garbage), 0), static_cast<ssize_t>(sizeof(garbage)));
  EXPECT_NE(mp::recv_message(p.b.get(), &got, 0, nullptr, 1s).message().find("does not parse"),
            std::string::npos);
  const char tiny[] = {1, 0};
  ASSERT_EQ(::send(p.a.get(), tiny, sizeof(tiny), 0), 2);
  EXPECT_EQ(mp::recv_message(p.b.get(), &got, 0, nullptr, 1s).message(),
            "message of 2 bytes; expected a 4-byte length first");
}

TEST(SessionWire, ReceiveIsBoundedAndSeesPeerClose) {
  Pair p;
  pb::Request got;
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(mp::recv_message(p.b.get(), &got, 0, nullptr, 50ms).code(), StatusCode::kDeadlineExceeded);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
  p.a.reset();
  EXPECT_EQ(mp::recv_message(p.b.get(), &got, 0, nullptr, 1s).code(), StatusCode::kUnavailable);
}

TEST(SessionWire, ConnectNamesTheMissingSocket) {
  auto r = mp::connect_unix("/tmp/no-such-dir/mkerneld.sock", 100ms);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(r.status().message().find("/tmp/no-such-dir/mkerneld.sock"), std::string::npos);
}

TEST(SharedSegment, SealedAgainstShrinkAndGrow) {
  auto seg = mp::create_sealed_segment("seal-test", 5000);
  ASSERT_TRUE(seg.ok());
  EXPECT_EQ(seg->size(), 8192u);
  EXPECT_NE(::ftruncate(seg->fd(), 0), 0);
  EXPECT_NE(::ftruncate(seg->fd(), 1 << 20), 0);
  EXPECT_NE(::fcntl(seg->fd(), F_ADD_SEALS, F_SEAL_WRITE), 0) << "the seals themselves are sealed";
  // An unsealed memfd is refused where seals are required.
  mp::UniqueFd plain(::memfd_create("plain", MFD_CLOEXEC));
  ASSERT_EQ(::ftruncate(plain.get(), 4096), 0);
  auto m = mp::map_segment(std::move(plain), 0, true);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().message(), "received segment is not sealed against shrinking");
}
