// Framing of setup messages: length prefix, descriptor counts, truncated control data, bounded
// receives; sealed segments; the body limit, sends that never wait, connecting through a full
// backlog and a refusal read after the daemon closed.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <thread>

#include "mkernel/proto/session.pb.h"
#include "mkernel/protocol/ring_host.h"
#include "mkernel/protocol/session_client.h"
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

// ---- limits and never waiting -------------------------------------------------------------------

// The documented limit is 65,536 bytes of body: one byte more is refused, naming both.
TEST(SessionWire, BodyOneByteOverTheLimitIsRefused) {
  Pair p;
  // A hello whose client name makes the body exactly `bytes` long, framed by hand (the sender
  // refuses to frame more than the limit).
  const auto packet = [](size_t bytes) {
    pb::Request r;
    for (size_t name = bytes - 16; name <= bytes; ++name) {
      r.mutable_hello()->set_client_name(std::string(name, 'n'));
      if (r.ByteSizeLong() == bytes) break;
    }
    EXPECT_EQ(r.ByteSizeLong(), bytes);
    const std::string body = r.SerializeAsString();
    std::string s(4, '\0');
    for (int i = 0; i < 4; ++i) s[static_cast<size_t>(i)] = static_cast<char>((body.size() >> (8 * i)) & 0xFF);
    return s + body;
  };
  for (const size_t bytes : {mp::kMaxMessageBytes, mp::kMaxMessageBytes + 1}) {
    const std::string s = packet(bytes);
    ASSERT_EQ(::send(p.a.get(), s.data(), s.size(), 0), static_cast<ssize_t>(s.size()));
    pb::Request got;
    const mkernel::Status st = mp::recv_message(p.b.get(), &got, 0, nullptr, 1s);
    if (bytes == mp::kMaxMessageBytes) {
      EXPECT_TRUE(st.ok()) << st.to_string();
    } else {
      EXPECT_EQ(st.code(), StatusCode::kProtocolError);
      EXPECT_EQ(st.message(), "message body of 65537 bytes; expected at most 65536");
    }
  }
}

// try_send_packet never waits: it says "full" instead.
TEST(SessionWire, TrySendSaysFullInsteadOfWaiting) {
  Pair p;
  std::string packet;
  ASSERT_TRUE(mp::frame_message(ping(1), &packet).ok());
  const auto t0 = std::chrono::steady_clock::now();
  int sent = 0;
  for (;; ++sent) {
    auto r = mp::try_send_packet(p.a.get(), packet, {});
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    if (!r.value()) break;
    ASSERT_LT(sent, 1000000) << "the socket never filled";
  }
  EXPECT_GT(sent, 0);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
  p.b.reset();
  auto closed = mp::try_send_packet(p.a.get(), packet, {});
  EXPECT_EQ(closed.status().code(), StatusCode::kUnavailable);
}

namespace {

// A SOCK_SEQPACKET listener at a fresh path, with a backlog of `backlog`.
struct Listener {
  std::string dir, path;
  mp::UniqueFd fd;
  explicit Listener(int backlog) {
    char tmpl[] = "/tmp/mkwire-XXXXXX";
    dir = ::mkdtemp(tmpl);
    path = dir + "/s.sock";
    fd = mp::UniqueFd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    EXPECT_EQ(::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(::listen(fd.get(), backlog), 0);
  }
  ~Listener() {
    ::unlink(path.c_str());
    ::rmdir(dir.c_str());
  }
};

}  // namespace

// A full listen backlog answers connect() with EAGAIN: the client retries within its bound and
// gets in once the daemon accepts; it fails with a clear message when the bound expires.
TEST(SessionWire, ConnectRetriesAFullBacklogWithinItsBound) {
  Listener l(0);
  // Fill the backlog: connections nobody accepts.
  std::vector<mp::UniqueFd> queued;
  for (int i = 0; i < 8; ++i) {
    mp::UniqueFd c(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, l.path.c_str(), sizeof(addr.sun_path) - 1);
    if (::connect(c.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      ASSERT_EQ(errno, EAGAIN) << std::strerror(errno);
      break;
    }
    queued.push_back(std::move(c));
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto refused = mp::connect_unix(l.path, 300ms);
  const auto took = std::chrono::steady_clock::now() - t0;
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(refused.status().message().find("listen backlog stayed full for 300 ms"), std::string::npos)
      << refused.status().to_string();
  EXPECT_GE(took, 290ms);
  EXPECT_LT(took, 1500ms);

  // The daemon accepts after 200 ms: the retrying client gets in.
  std::thread acceptor([&] {
    std::this_thread::sleep_for(200ms);
    for (size_t i = 0; i <= queued.size(); ++i) mp::UniqueFd(::accept4(l.fd.get(), nullptr, nullptr, SOCK_CLOEXEC));
  });
  auto in = mp::connect_unix(l.path, 3000ms);
  acceptor.join();
  EXPECT_TRUE(in.ok()) << in.status().to_string();
}

// A daemon that refuses a connection answers at once and closes; the client's hello then finds
// the socket closed, and reports the daemon's answer, not "peer closed".
TEST(SessionWire, ClientReportsARefusalSentBeforeItsHello) {
  Listener l(16);
  mkernel::Status result;
  std::thread client([&] {
    mp::SessionClient::Options o;
    o.socket_path = l.path;
    o.timeout = 2s;
    auto c = mp::SessionClient::connect(o);
    result = c.ok() ? mkernel::Status::Ok() : c.status();
  });
  {
    mp::UniqueFd c(::accept4(l.fd.get(), nullptr, nullptr, SOCK_CLOEXEC));
    pb::Reply refusal;
    refusal.mutable_error()->set_code(static_cast<uint32_t>(StatusCode::kResourceExhausted));
    refusal.mutable_error()->set_message("sessions: uid 1000 already holds 256; at most 256 (clients.per_uid.sessions)");
    EXPECT_TRUE(mp::send_message(c.get(), refusal, {}, 1s).ok());
  }  // closed, whether or not the hello was read
  client.join();
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.code(), StatusCode::kResourceExhausted) << result.to_string();
  EXPECT_NE(result.message().find("(clients.per_uid.sessions)"), std::string::npos) << result.to_string();
}

// Creating a ring on a fresh segment writes its header only: its cost and the memory it makes
// resident do not grow with its capacity (a 2^20-slot ring used to write 64 MiB at creation).
TEST(SharedSegment, AFreshRingTouchesOnlyItsHeader) {
  const uint32_t log2 = 20;
  auto seg = mp::create_sealed_segment("ring-test", mp::ring_segment_bytes(log2));
  ASSERT_TRUE(seg.ok()) << seg.status().to_string();
  mp::RingView view;
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(mp::init_ring_on_zeroed(seg->data(), seg->size(), log2, 7, 99, &view), "");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5ms);
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> resident((seg->size() + page - 1) / page);
  ASSERT_EQ(::mincore(seg->data(), seg->size(), resident.data()), 0);
  size_t pages = 0;
  for (unsigned char r : resident) pages += r & 1;
  EXPECT_LE(pages, 1u) << "resident pages of a fresh 64 MiB ring";
  mp::RingView attached;
  ASSERT_EQ(mp::attach_ring(seg->data(), seg->size(), &attached), "");
  EXPECT_EQ(attached.capacity_log2, log2);
  EXPECT_EQ(attached.header->epoch, 99u);
  EXPECT_EQ(attached.slots[12345].commit, 0u) << "the kernel's zeros are the empty slots";
}
