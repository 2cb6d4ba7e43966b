// mkerneld as a real process, with host threads playing the GPU: data and counts end to end,
// clients killed mid-work, hostile clients beside healthy ones, a daemon restart, drain and
// stalled-proxy health, reload of a bad config, and --check-config.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <atomic>
#include <fstream>
#include <random>

#include "daemon_harness.h"
#include "mkernel/protocol/ring_host.h"
#include "mkernel/proto/session.pb.h"
#include "mkernel/protocol/session_client.h"

namespace mp = mkernel::protocol;
namespace pb = mkernel::admin::v1;
using namespace std::chrono_literals;
using mkt::DaemonProcess;

namespace {

struct Peer {
  std::unique_ptr<mp::SessionClient> client;
  mp::ClientRing* ring = nullptr;
  mp::ClientRegion* region = nullptr;
  mp::ClientFlags* flags = nullptr;
};

Peer join(const DaemonProcess& d, const std::string& comm, uint32_t rank, uint32_t world,
          uint64_t region_bytes = 1 << 20) {
  Peer p;
  mp::SessionClient::Options o;
  o.socket_path = d.client_socket();
  o.client_name = comm + "-r" + std::to_string(rank);
  o.communicator = comm;
  o.rank = rank;
  o.world_size = world;
  auto c = mp::SessionClient::connect(o);
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  if (!c.ok()) return p;
  p.client = std::move(c.value());
  auto r = p.client->create_ring(10);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  auto g = p.client->create_region(region_bytes, true);
  EXPECT_TRUE(g.ok()) << g.status().to_string();
  auto f = p.client->create_flags(256);
  EXPECT_TRUE(f.ok()) << f.status().to_string();
  if (r.ok()) p.ring = r.value();
  if (g.ok()) p.region = g.value();
  if (f.ok()) p.flags = f.value();
  return p;
}

bool wait_completed(const mp::ClientRing& ring, uint64_t n, std::chrono::milliseconds bound) {
  const auto deadline = std::chrono::steady_clock::now() + bound;
  while (std::atomic_ref<uint64_t>(ring.view.header->completed).load(std::memory_order_acquire) < n) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(50us);
  }
  return true;
}

pb::Stats get_stats(const DaemonProcess& d) {
  pb::Stats s;
  auto c = mkt::ctx();
  EXPECT_TRUE(d.admin()->GetStats(c.get(), pb::GetStatsRequest(), &s).ok());
  return s;
}

size_t num_clients(const DaemonProcess& d) {
  pb::ClientList l;
  auto c = mkt::ctx();
  EXPECT_TRUE(d.admin()->ListClients(c.get(), pb::ListClientsRequest(), &l).ok());
  return static_cast<size_t>(l.clients_size());
}

class DaemonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = mkt::temp_dir(::testing::UnitTest::GetInstance()->current_test_info()->name());
    daemon_ = std::make_unique<DaemonProcess>(dir_);
  }
  void TearDown() override {
    daemon_.reset();
    if (!HasFailure()) std::filesystem::remove_all(dir_);
    else std::fprintf(stderr, "daemon log kept in %s/mkerneld.log\n", dir_.c_str());
  }
  std::string dir_;
  std::unique_ptr<DaemonProcess> daemon_;
};

}  // namespace

TEST_F(DaemonTest, BytesArriveIntactAndCountsReconcile) {
  ASSERT_TRUE(daemon_->start());
  constexpr uint64_t kRegion = 16 << 20;
  Peer a = join(*daemon_, "data", 0, 2, kRegion);
  Peer b = join(*daemon_, "data", 1, 2, kRegion);
  ASSERT_TRUE(a.ring && b.region && b.flags);
  std::mt19937_64 rng(7);
  auto* src = static_cast<uint8_t*>(a.region->data());
  for (uint64_t i = 0; i < kRegion; ++i) src[i] = static_cast<uint8_t>(rng());
  // Disjoint destination ranges of random sizes from 4 bytes to 4 MiB, each with its own flag.
  struct Piece { uint64_t src_off, dst_off, size; uint32_t flag; };
  std::vector<Piece> pieces;
  uint64_t dst = 0;
  for (uint32_t f = 0; f < 200 && dst < kRegion; ++f) {
    const uint64_t size = f % 50 == 0 ? (4 << 20) - 3 : 4 + rng() % (64 << 10);
    if (dst + size > kRegion) break;
    pieces.push_back({rng() % (kRegion - size), dst, size, f});
    dst += size + rng() % 64;
  }
  mp::HostRingProducer producer(a.ring->view, a.client->epoch());
  for (const Piece& p : pieces)
    ASSERT_EQ(producer.push(mp::make_write_signal(1, static_cast<uint16_t>(a.region->id), p.src_off,
                                                  static_cast<uint16_t>(b.region->id), p.dst_off, p.size,
                                                  p.flag, 1000 + p.flag),
                            5s),
              mp::kRingOk);
  ASSERT_TRUE(wait_completed(*a.ring, pieces.size(), 10s));
  const auto* d = static_cast<const uint8_t*>(b.region->data());
  for (const Piece& p : pieces) {
    ASSERT_EQ(std::memcmp(d + p.dst_off, src + p.src_off, p.size), 0) << "piece of " << p.size << " bytes";
    EXPECT_EQ(std::atomic_ref<uint64_t>(b.flags->flags()[p.flag]).load(), 1000u + p.flag);
  }
  EXPECT_EQ(a.ring->view.header->error, 0u);
  const pb::Stats s = get_stats(*daemon_);
  ASSERT_EQ(s.proxies_size(), 1);
  const auto& px = s.proxies(0);
  EXPECT_EQ(px.consumed(), pieces.size());
  EXPECT_EQ(px.consumed(), px.commands().ok() + px.commands().error() + px.commands().rejected());
  EXPECT_EQ(px.commands().ok(), pieces.size());
  uint64_t total = 0;
  for (const Piece& p : pieces) total += p.size;
  EXPECT_EQ(px.bytes(), total);
  EXPECT_EQ(num_clients(*daemon_), 2u);
}

TEST_F(DaemonTest, KilledClientsLeaveNothingBehind) {
  ASSERT_TRUE(daemon_->start());
  const std::string fd_dir = "/proc/" + std::to_string(daemon_->pid()) + "/fd";
  const std::string maps = "/proc/" + std::to_string(daemon_->pid()) + "/maps";
  // Warm up once so lazily created threads and mappings exist before the baseline.
  {
    Peer p = join(*daemon_, "warm", 0, 1);
    p.client->close();
  }
  std::this_thread::sleep_for(200ms);
  const size_t fds0 = mkt::count_dir_entries(fd_dir);
  const size_t maps0 = mkt::count_matching_lines(maps, "memfd:mkernel-");
  std::mt19937 rng(3);
  for (int i = 0; i < 100; ++i) {
    const pid_t pid = mkt::spawn({MKERNEL_DEMO_CLIENT_PATH, "--socket", daemon_->client_socket(),
                                  "--commands", "200000", "--rate-commands", "100000000"},
                                 dir_ + "/clients.log");
    std::this_thread::sleep_for(std::chrono::milliseconds(10 + rng() % 120));
    ::kill(pid, SIGKILL);
    ASSERT_GE(mkt::wait_pid(pid, 10s), 0);
  }
  // Everything returns to where it started, within a bound.
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  size_t fds = 0, mapped = 0, clients = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    fds = mkt::count_dir_entries(fd_dir);
    mapped = mkt::count_matching_lines(maps, "memfd:mkernel-");
    clients = num_clients(*daemon_);
    if (fds <= fds0 && mapped <= maps0 && clients == 0) break;
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_LE(fds, fds0) << "open descriptors of mkerneld";
  EXPECT_LE(mapped, maps0) << "ring, region and flag mappings of mkerneld";
  EXPECT_EQ(maps0, 0u);
  EXPECT_EQ(clients, 0u);
  const pb::Stats s = get_stats(*daemon_);
  const auto& px = s.proxies(0);
  EXPECT_GT(px.consumed(), 0u) << "the killed clients did push commands";
  EXPECT_EQ(px.consumed(), px.commands().ok() + px.commands().error() + px.commands().rejected());
  // And the daemon still serves.
  Peer p = join(*daemon_, "after", 0, 1);
  EXPECT_TRUE(p.client && p.client->ping().ok());
}

TEST_F(DaemonTest, HostileClientsEndAloneAndHealthyOnesNeverNotice) {
  ASSERT_TRUE(daemon_->start());
  Peer a = join(*daemon_, "good", 0, 2);
  Peer b = join(*daemon_, "good", 1, 2);
  ASSERT_TRUE(a.ring && b.region);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> pushed{0};
  std::thread healthy;
  struct Joiner {
    std::atomic<bool>& stop;
    std::thread& t;
    ~Joiner() {
      stop = true;
      if (t.joinable()) t.join();
    }
  } joiner{stop, healthy};
  healthy = std::thread([&] {
    mp::HostRingProducer producer(a.ring->view, a.client->epoch());
    for (uint64_t i = 0; !stop.load(); ++i) {
      if (producer.push(mp::make_write_signal(1, static_cast<uint16_t>(a.region->id), (i * 64) % 4096,
                                              static_cast<uint16_t>(b.region->id), (i * 64) % 4096, 64,
                                              0, i + 1),
                        5s) != mp::kRingOk)
        return;
      pushed.fetch_add(1);
      if (i % 64 == 0) std::this_thread::sleep_for(100us);
    }
  });

  auto expect_ended = [&](Peer& h, const char* what, const char* reason_part) {
    mkernel::Status s;
    const auto deadline = std::chrono::steady_clock::now() + 5s;
    while (std::chrono::steady_clock::now() < deadline && (s = h.client->check_alive(50ms)).ok()) {
    }
    EXPECT_FALSE(s.ok()) << what << ": session not ended";
    EXPECT_NE(s.message().find(reason_part), std::string::npos) << what << ": " << s.to_string();
    EXPECT_NE(std::atomic_ref<uint32_t>(h.ring->view.header->error).load(), 0u) << what;
  };

  {  // Garbage record with a valid commit word.
    Peer h = join(*daemon_, "bad1", 0, 1);
    mp::CommandRecord& slot = h.ring->view.slots[0];
    std::memset(&slot, 0x5A, offsetof(mp::CommandRecord, commit));
    std::atomic_ref<uint32_t>(slot.commit).store(mp::commit_word(0, h.ring->view.capacity_log2),
                                                 std::memory_order_release);
    expect_ended(h, "garbage", "rejected: unknown op");
  }
  {  // A region id it does not own.
    Peer h = join(*daemon_, "bad2", 0, 1);
    mp::HostRingProducer p(h.ring->view, h.client->epoch());
    ASSERT_EQ(p.push(mp::make_write(0, 7, 0, 0, 0, 64), 1s), mp::kRingOk);
    expect_ended(h, "foreign region", "rejected: region id out of range");
  }
  {  // A write past the end of its own region.
    Peer h = join(*daemon_, "bad3", 0, 1);
    mp::HostRingProducer p(h.ring->view, h.client->epoch());
    ASSERT_EQ(p.push(mp::make_write(0, static_cast<uint16_t>(h.region->id), (1 << 20) - 8,
                                    static_cast<uint16_t>(h.region->id), 0, 64), 1s),
              mp::kRingOk);
    expect_ended(h, "out of bounds", "rejected: offset out of range");
  }
  {  // Head far beyond capacity, and an attempt to shrink the ring it was handed.
    Peer h = join(*daemon_, "bad4", 0, 1);
    h.ring->view.header->head = ~uint64_t{0} - 5;
    EXPECT_NE(::ftruncate(h.ring->mapping.fd(), 4096), 0) << "a sealed ring cannot shrink";
    EXPECT_EQ(errno, EPERM);
    EXPECT_NE(::ftruncate(h.region->mapping.fd(), 0), 0) << "a sealed region cannot shrink";
    // The daemon never steers by `head`: a record committed at the consumer's position is still
    // taken and carried out, and the occupancy it reports stays within the ring.
    mp::CommandRecord& slot = h.ring->view.slots[0];
    mp::encode_payload(mp::make_fence(), slot);
    std::atomic_ref<uint32_t>(slot.commit).store(mp::commit_word(0, h.ring->view.capacity_log2),
                                                 std::memory_order_release);
    EXPECT_TRUE(wait_completed(*h.ring, 1, 5s));
    EXPECT_TRUE(h.client->ping().ok());
    std::this_thread::sleep_for(20ms);
    const pb::Stats st = get_stats(*daemon_);
    EXPECT_LE(st.proxies(0).ring_occupancy(), st.proxies(0).ring_capacity());
  }
  {  // A descriptor sent to the daemon, which never takes any.
    Peer h = join(*daemon_, "bad5", 0, 1);
    mkernel::session::v1::Request req;
    req.set_request_id(99);
    req.mutable_ping();
    ASSERT_TRUE(mp::send_message(h.client->socket_fd(), req, {h.region->mapping.fd()}, 1s).ok());
    mkernel::Status s;
    const auto deadline = std::chrono::steady_clock::now() + 5s;
    while (std::chrono::steady_clock::now() < deadline && (s = h.client->check_alive(50ms)).ok()) {
    }
    EXPECT_NE(s.message().find("1 descriptor(s) attached; only ShareHandle and ImportRegion may carry one"), std::string::npos)
        << s.to_string();
  }
  std::this_thread::sleep_for(100ms);
  stop = true;
  healthy.join();
  EXPECT_GT(pushed.load(), 0u);
  EXPECT_TRUE(wait_completed(*a.ring, pushed.load(), 10s));
  EXPECT_EQ(std::atomic_ref<uint32_t>(a.ring->view.header->error).load(), 0u) << "healthy ring saw an error";
  EXPECT_TRUE(a.client->check_alive(10ms).ok());
  EXPECT_TRUE(b.client->ping().ok());
  const pb::Stats s = get_stats(*daemon_);
  EXPECT_EQ(s.proxies(0).consumed(), s.proxies(0).commands().ok() + s.proxies(0).commands().error() +
                                         s.proxies(0).commands().rejected());
  EXPECT_EQ(s.proxies(0).commands().rejected(), 3u);
}

TEST_F(DaemonTest, ClientNoticesADaemonRestartWithinOneSecond) {
  ASSERT_TRUE(daemon_->start());
  Peer a = join(*daemon_, "restart", 0, 1);
  ASSERT_TRUE(a.client);
  const uint64_t epoch = a.client->epoch();
  const auto t0 = std::chrono::steady_clock::now();
  daemon_->kill9();
  mkernel::Status s;
  while (std::chrono::steady_clock::now() - t0 < 5s && (s = a.client->check_alive(10ms)).ok()) {
  }
  const auto noticed = std::chrono::steady_clock::now() - t0;
  EXPECT_FALSE(s.ok());
  EXPECT_LT(noticed, 1s) << "stated bound: a client notices a dead daemon within 1 s";
  ASSERT_TRUE(daemon_->start());
  Peer again = join(*daemon_, "restart", 0, 1);
  ASSERT_TRUE(again.client);
  EXPECT_NE(again.client->epoch(), epoch);
  EXPECT_NE(again.ring->view.header->epoch, epoch);
}

// GPU memory handles between ranks of one communicator on one daemon: shared descriptors reach
// the same communicator only, a missing one is named, and ShareHandle without a descriptor ends
// the session. (A memfd stands in for cuMemExportToShareableHandle's descriptor.)
TEST_F(DaemonTest, HandlesAreBrokeredWithinACommunicatorOnly) {
  ASSERT_TRUE(daemon_->start());
  Peer r0 = join(*daemon_, "nvl", 0, 2), r1 = join(*daemon_, "nvl", 1, 2), other = join(*daemon_, "other", 1, 2);
  ASSERT_TRUE(r0.client && r1.client && other.client);
  const int fd = ::memfd_create("handle", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  const char text[] = "gpu memory stand-in";
  ASSERT_EQ(::write(fd, text, sizeof(text)), static_cast<ssize_t>(sizeof(text)));
  ASSERT_TRUE(r0.client->share_handle("buf0", fd).ok());
  ::close(fd);  // the daemon holds its own copy

  auto got = r1.client->fetch_handle(0, "buf0");
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  char back[sizeof(text)] = {};
  EXPECT_EQ(::pread(got.value().get(), back, sizeof(back), 0), static_cast<ssize_t>(sizeof(back)));
  EXPECT_STREQ(back, text);

  auto missing = r1.client->fetch_handle(0, "buf1");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("has not shared a handle \"buf1\""), std::string::npos)
      << missing.status().to_string();
  auto stranger = other.client->fetch_handle(0, "buf0");
  ASSERT_FALSE(stranger.ok());
  EXPECT_EQ(stranger.status().code(), mkernel::StatusCode::kNotFound) << stranger.status().to_string();
  auto bad_key = r0.client->share_handle("", r0.region->mapping.fd());
  EXPECT_NE(bad_key.message().find("key: 0 bytes; expected 1..128"), std::string::npos) << bad_key.to_string();

  // ShareHandle with no descriptor is malformed: the session ends with that reason.
  mkernel::session::v1::Request req;
  req.set_request_id(77);
  req.mutable_share_handle()->set_key("nofd");
  ASSERT_TRUE(mp::send_message(r0.client->socket_fd(), req, {}, 1s).ok());
  mkernel::Status s;
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (std::chrono::steady_clock::now() < deadline && (s = r0.client->check_alive(50ms)).ok()) {
  }
  EXPECT_NE(s.message().find("ShareHandle carries exactly one"), std::string::npos) << s.to_string();
  // Its handles went with it.
  std::this_thread::sleep_for(100ms);
  EXPECT_FALSE(r1.client->fetch_handle(0, "buf0").ok());
}

// GPU-memory regions (ImportRegion) where the transport cannot take them (tcp and shm never do):
// the hello says so and why; the descriptor is checked first (a memfd is named and refused),
// then the fields, then the transport; refusals add nothing and the session carries on; an
// ImportRegion without its descriptor ends the session. (Real dmabufs are exported on the GPU
// machine: tests/gpu/runtime/runtime_dmabuf_gpu_test.)
TEST_F(DaemonTest, GpuMemoryRegionsAreCheckedAndRefusedWhereTheTransportCannotTakeThem) {
  ASSERT_TRUE(daemon_->start());
  Peer p = join(*daemon_, "gpumem", 0, 1);
  ASSERT_TRUE(p.client);
  EXPECT_FALSE(p.client->gpu_memory());
  std::string why = p.client->gpu_memory_reason();
  std::transform(why.begin(), why.end(), why.begin(), [](unsigned char c) { return std::tolower(c); });
  // The transport's own words (tcp, shm: no dmabuf), or why there is no network transport at all
  // (a build without libfabric and libibverbs).
  EXPECT_TRUE(why.find("dmabuf") != std::string::npos || why.find("no network transport") != std::string::npos)
      << p.client->gpu_memory_reason();
  std::printf("[gpu memory] %s\n", p.client->gpu_memory_reason().c_str());

  mp::UniqueFd memfd(::memfd_create("not-a-dmabuf", MFD_CLOEXEC));
  ASSERT_TRUE(memfd.valid());
  ASSERT_EQ(::ftruncate(memfd.get(), 1 << 21), 0);
  mp::GpuRegionSpec spec;
  spec.bytes = 1 << 20;
  spec.dmabuf_fd = memfd.get();
  spec.gpu_address = 0x7e0000200000ull;
  spec.cuda_device = 0;
  auto refused = p.client->import_region(spec);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), mkernel::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("/memfd:not-a-dmabuf"), std::string::npos) << refused.status().to_string();
  EXPECT_NE(refused.status().message().find("is not a dmabuf"), std::string::npos) << refused.status().to_string();

  // Fields the daemon checks itself (a raw client skips SessionClient's own checks).
  auto raw = [&](uint64_t bytes, uint64_t address, int32_t device) {
    mkernel::session::v1::Request req;
    req.set_request_id(500 + bytes);
    auto* r = req.mutable_import_region();
    r->set_bytes(bytes);
    r->set_gpu_address(address);
    r->set_cuda_device(device);
    EXPECT_TRUE(mp::send_message(p.client->socket_fd(), req, {memfd.get()}, 1s).ok());
    mkernel::session::v1::Reply reply;
    std::vector<mp::UniqueFd> fds;
    EXPECT_TRUE(mp::recv_message_any_fds(p.client->socket_fd(), &reply, &fds, 2s).ok());
    EXPECT_EQ(reply.request_id(), req.request_id());
    return reply.has_error() ? reply.error().message() : std::string("accepted");
  };
  EXPECT_NE(raw(0, 0x7e0000200000ull, 0).find("import_region bytes: 0"), std::string::npos);
  EXPECT_NE(raw(4096, 0, 0).find("import_region gpu_address: 0"), std::string::npos);
  EXPECT_NE(raw(4096, ~0ull - 100, 0).find("import_region gpu_address"), std::string::npos);
  EXPECT_NE(raw(4096, 0x7e0000200000ull, -1).find("import_region cuda_device: -1"), std::string::npos);

  // Nothing was added; the session goes on with host regions.
  auto host = p.client->create_region(4096, true);
  ASSERT_TRUE(host.ok()) << host.status().to_string();
  EXPECT_EQ(host.value()->id, 1u);
  EXPECT_TRUE(p.client->ping().ok());

  // ImportRegion without its descriptor is malformed: the session ends with that reason.
  mkernel::session::v1::Request req;
  req.set_request_id(88);
  req.mutable_import_region()->set_bytes(4096);
  ASSERT_TRUE(mp::send_message(p.client->socket_fd(), req, {}, 1s).ok());
  mkernel::Status s;
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (std::chrono::steady_clock::now() < deadline && (s = p.client->check_alive(50ms)).ok()) {
  }
  EXPECT_NE(s.message().find("ImportRegion carries exactly one (the dmabuf)"), std::string::npos) << s.to_string();
}

TEST_F(DaemonTest, DrainTurnsHealthNotServingWithinASecond) {
  ASSERT_TRUE(daemon_->start());
  auto health = daemon_->health();
  EXPECT_EQ(mkt::health_of(*health, ""), 1);
  EXPECT_EQ(mkt::health_of(*health, "mkerneld.gpu0"), 1);
  pb::DrainReply dr;
  auto c = mkt::ctx();
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(daemon_->admin()->Drain(c.get(), pb::DrainRequest(), &dr).ok());
  while (mkt::health_of(*health, "") != 2 && std::chrono::steady_clock::now() - t0 < 3s)
    std::this_thread::sleep_for(10ms);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s);
  EXPECT_EQ(mkt::health_of(*health, "mkerneld.gpu0"), 2);
  mp::SessionClient::Options o;
  o.socket_path = daemon_->client_socket();
  auto refused = mp::SessionClient::connect(o);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("draining"), std::string::npos) << refused.status().to_string();
  auto c2 = mkt::ctx();
  ASSERT_TRUE(daemon_->admin()->Undrain(c2.get(), pb::UndrainRequest(), &dr).ok());
  const auto t1 = std::chrono::steady_clock::now();
  while (mkt::health_of(*health, "") != 1 && std::chrono::steady_clock::now() - t1 < 3s)
    std::this_thread::sleep_for(10ms);
  EXPECT_EQ(mkt::health_of(*health, ""), 1);
}

TEST_F(DaemonTest, StalledProxyTurnsItsGpuNotServingWithinASecond) {
  ASSERT_TRUE(daemon_->start({"--enable-test-hooks"}));
  auto health = daemon_->health();
  ASSERT_EQ(mkt::health_of(*health, "mkerneld.gpu0"), 1);
  pb::StallProxyRequest req;
  req.set_gpu(0);
  req.set_duration_ms(3000);
  pb::StallProxyReply rep;
  auto c = mkt::ctx();
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(daemon_->admin()->StallProxy(c.get(), req, &rep).ok());
  while (mkt::health_of(*health, "mkerneld.gpu0") != 2 && std::chrono::steady_clock::now() - t0 < 3s)
    std::this_thread::sleep_for(10ms);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s);
  EXPECT_EQ(mkt::health_of(*health, ""), 2);
  const auto [code, out] = mkt::run_capture({MKERNELDCTL_PATH, "--socket", daemon_->dir() + "/admin.sock", "health"});
  EXPECT_EQ(code, 1) << out;
  // It recovers when the proxy checks in again.
  while (mkt::health_of(*health, "mkerneld.gpu0") != 1 && std::chrono::steady_clock::now() - t0 < 10s)
    std::this_thread::sleep_for(20ms);
  EXPECT_EQ(mkt::health_of(*health, "mkerneld.gpu0"), 1);
}

// systemd's side of Type=notify and WatchdogSec, played by a datagram socket of the test.
TEST_F(DaemonTest, NotifiesReadyAndWithholdsWatchdogPingsWhileAProxyIsStalled) {
  const std::string path = dir_ + "/notify.sock";
  mp::UniqueFd sock(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(::bind(sock.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  // Pings every 100 ms (half the interval).
  ASSERT_TRUE(daemon_->start({"--enable-test-hooks"}, {"NOTIFY_SOCKET=" + path, "WATCHDOG_USEC=200000"}));
  struct Seen { bool ready = false; int pings = 0; };
  auto listen_for = [&](std::chrono::milliseconds d) {
    Seen seen;
    const auto end = std::chrono::steady_clock::now() + d;
    while (std::chrono::steady_clock::now() < end) {
      pollfd p{sock.get(), POLLIN, 0};
      if (::poll(&p, 1, 10) <= 0) continue;
      char buf[4096];
      const ssize_t n = ::recv(sock.get(), buf, sizeof(buf) - 1, 0);
      if (n <= 0) continue;
      const std::string msg(buf, static_cast<size_t>(n));
      if (msg.find("READY=1") != std::string::npos) seen.ready = true;
      if (msg.find("WATCHDOG=1") != std::string::npos) ++seen.pings;
    }
    return seen;
  };
  const Seen before = listen_for(600ms);
  EXPECT_TRUE(before.ready) << "READY=1 once every proxy runs";
  EXPECT_GE(before.pings, 3) << "pings while every proxy checks in";
  pb::StallProxyRequest req;
  req.set_gpu(0);
  req.set_duration_ms(1500);
  pb::StallProxyReply rep;
  auto c = mkt::ctx();
  ASSERT_TRUE(daemon_->admin()->StallProxy(c.get(), req, &rep).ok());
  listen_for(600ms);  // the stall is noticed within the proxy-alive bound (500 ms)
  const Seen stalled = listen_for(700ms);
  EXPECT_EQ(stalled.pings, 0) << "no watchdog ping while a proxy has stopped checking in";
  listen_for(500ms);
  const Seen after = listen_for(600ms);
  EXPECT_GE(after.pings, 3) << "pings resume once the proxy checks in again";
}

TEST_F(DaemonTest, StallHookIsRefusedWithoutTestHooks) {
  ASSERT_TRUE(daemon_->start());
  pb::StallProxyRequest req;
  req.set_duration_ms(100);
  pb::StallProxyReply rep;
  auto c = mkt::ctx();
  const grpc::Status s = daemon_->admin()->StallProxy(c.get(), req, &rep);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.error_message().find("--enable-test-hooks"), std::string::npos) << s.error_message();
}

TEST_F(DaemonTest, HealthAgreesAcrossMkerneldctlAndPythonGrpc) {
  ASSERT_TRUE(daemon_->start());
  const std::string sock = daemon_->dir() + "/admin.sock";
  auto [code, out] = mkt::run_capture({MKERNELDCTL_PATH, "--socket", sock, "health"});
  EXPECT_EQ(code, 0) << out;
  const bool have_python = std::filesystem::exists(MKERNEL_TEST_PYTHON);
  if (have_python) {
    auto [pcode, pout] = mkt::run_capture({MKERNEL_TEST_PYTHON, HEALTH_CHECK_PY, "--socket", sock});
    EXPECT_EQ(pcode, 0) << pout;
  }
  pb::DrainReply dr;
  auto c = mkt::ctx();
  ASSERT_TRUE(daemon_->admin()->Drain(c.get(), pb::DrainRequest(), &dr).ok());
  std::this_thread::sleep_for(400ms);
  std::tie(code, out) = mkt::run_capture({MKERNELDCTL_PATH, "--socket", sock, "health"});
  EXPECT_EQ(code, 1) << out;
  if (have_python) {
    auto [pcode, pout] = mkt::run_capture({MKERNEL_TEST_PYTHON, HEALTH_CHECK_PY, "--socket", sock});
    EXPECT_EQ(pcode, 1) << pout;
  }
  daemon_->stop();
  std::tie(code, out) = mkt::run_capture({MKERNELDCTL_PATH, "--socket", sock, "--timeout", "1", "health"});
  EXPECT_EQ(code, 2) << out;
  if (!have_python) GTEST_SKIP() << "Python grpcio not installed at " << MKERNEL_TEST_PYTHON
                                 << " (scripts/install-deps.sh installs it); mkerneldctl checked";
}

// logging.format json: every line is one JSON object, whatever a message carries (a client name
// with quotes, a backslash and a tab appears in the session lines).
TEST_F(DaemonTest, JsonLogLinesParseWhateverMessagesHold) {
  const std::string cfg = dir_ + "/json.yaml";
  std::ofstream(cfg) << "gpus: {select: host_slots, host_slots: 1}\nlogging: {format: json}\n";
  ASSERT_TRUE(daemon_->start({"--config", cfg}));
  {
    mp::SessionClient::Options o;
    o.socket_path = daemon_->client_socket();
    o.client_name = "say \"hi\" \\ then\ttab";
    o.communicator = "json";
    auto c = mp::SessionClient::connect(o);
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    c.value()->close();
  }
  std::this_thread::sleep_for(200ms);
  daemon_->stop();
  // Escaped twice: for the log (log_text.h), then for JSON.
  EXPECT_GE(mkt::count_matching_lines(daemon_->log_path(), R"(say \\\"hi\\\" \\\\ then\\ttab)"), 1u)
      << "the client name, escaped, in " << daemon_->log_path();
  const auto [code, out] = mkt::run_capture(
      {"/usr/bin/python3", "-c",
       "import json,sys\nn=0\nfor l in open(sys.argv[1]):\n    json.loads(l); n+=1\nprint('parsed', n)",
       daemon_->log_path()});
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("parsed"), std::string::npos) << out;
}

TEST_F(DaemonTest, InvalidReloadKeepsTheRunningConfigAndTheDaemonServing) {
  const std::string cfg = dir_ + "/mkerneld.yaml";
  { std::ofstream(cfg) << "logging:\n  level: info\n"; }
  ASSERT_TRUE(daemon_->start({"--config", cfg}));
  Peer a = join(*daemon_, "reload", 0, 1);
  ASSERT_TRUE(a.client);
  { std::ofstream(cfg) << "logging:\n  levle: debug\nrings:\n  capacity: 1000\n"; }
  ::kill(daemon_->pid(), SIGHUP);
  std::this_thread::sleep_for(300ms);
  EXPECT_TRUE(a.client->ping().ok()) << "daemon keeps serving after a refused reload";
  pb::DaemonStatus st;
  auto c = mkt::ctx();
  ASSERT_TRUE(daemon_->admin()->GetStatus(c.get(), pb::GetStatusRequest(), &st).ok());
  EXPECT_EQ(st.config_generation(), 0u);
  pb::ReloadRequest rq;
  pb::ReloadReply rr;
  auto c2 = mkt::ctx();
  daemon_->admin()->Reload(c2.get(), rq, &rr);
  EXPECT_FALSE(rr.applied());
  EXPECT_NE(rr.error().find("levle"), std::string::npos) << rr.error();
  EXPECT_NE(rr.error().find("capacity"), std::string::npos) << rr.error();
  { std::ofstream(cfg) << "logging:\n  level: debug\nrings:\n  capacity: 8192\n"; }
  auto c3 = mkt::ctx();
  ASSERT_TRUE(daemon_->admin()->Reload(c3.get(), rq, &rr).ok());
  EXPECT_TRUE(rr.applied()) << rr.error();
  EXPECT_EQ(rr.config_generation(), 1u);
  ASSERT_EQ(rr.needs_restart_size(), 1);
  EXPECT_EQ(rr.needs_restart(0), "rings.capacity");
  EXPECT_TRUE(a.client->ping().ok());
}

TEST(DaemonCli, CheckConfigGivesTheVerdict) {
  const std::string dir = mkt::temp_dir("checkcfg");
  { std::ofstream(dir + "/good.yaml") << "rings:\n  capacity: 8192\n"; }
  { std::ofstream(dir + "/bad.yaml") << "rings:\n  capacity: 1000\n"; }
  auto [ok_code, ok_out] = mkt::run_capture({MKERNELD_PATH, "--check-config", dir + "/good.yaml"});
  EXPECT_EQ(ok_code, 0) << ok_out;
  EXPECT_NE(ok_out.find("good.yaml: ok"), std::string::npos) << ok_out;
  auto [bad_code, bad_out] = mkt::run_capture({MKERNELD_PATH, "--check-config", dir + "/bad.yaml"});
  EXPECT_EQ(bad_code, 1) << bad_out;
  EXPECT_NE(bad_out.find("rings.capacity"), std::string::npos) << bad_out;
  EXPECT_NE(bad_out.find("1000"), std::string::npos) << bad_out;
  std::filesystem::remove_all(dir);
}

// A client can have sessions made and rejected by the proxy thousands of times a second; the
// proxy's line for each is limited to 100 a second (proxy.h note 8), the rest counted in the
// next line, so the log cannot be flooded this way.
TEST_F(DaemonTest, SessionsAProxyEndsAreLoggedAtMostAHundredASecond) {
  ASSERT_TRUE(daemon_->start());
  // A session whose ring carries garbage with a valid commit word, until the proxy ended it.
  const auto rejected = [&](const std::string& comm) {
    Peer h = join(*daemon_, comm, 0, 1, 4096);
    if (!h.ring) return false;
    mp::CommandRecord& slot = h.ring->view.slots[0];
    std::memset(&slot, 0x5A, offsetof(mp::CommandRecord, commit));
    std::atomic_ref<uint32_t>(slot.commit).store(mp::commit_word(0, h.ring->view.capacity_log2),
                                                 std::memory_order_release);
    const auto deadline = std::chrono::steady_clock::now() + 2s;
    while (std::chrono::steady_clock::now() < deadline && h.client->check_alive(20ms).ok()) {
    }
    return true;
  };
  std::atomic<int> ended{0};
  std::vector<std::thread> churners;
  const auto t0 = std::chrono::steady_clock::now();
  for (int k = 0; k < 2; ++k)
    churners.emplace_back([&, k] {
      for (int i = 0; std::chrono::steady_clock::now() - t0 < 2s; ++i) {
        if (!rejected("churn" + std::to_string(k) + "-" + std::to_string(i))) return;
        ++ended;
      }
    });
  for (auto& t : churners) t.join();
  const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - t0).count();
  // One more, a second later: its line says how many of the last second's were left out.
  std::this_thread::sleep_for(1100ms);
  ASSERT_TRUE(rejected("last")) << "the daemon still serves";
  const size_t lines = mkt::count_matching_lines(daemon_->log_path(), ") ended: ");
  std::printf("[proxy-ended sessions] %d in %lld s, %zu lines\n", ended.load() + 1, static_cast<long long>(seconds),
              lines);
  EXPECT_GT(ended.load(), 0);
  EXPECT_LE(lines, static_cast<size_t>(100 * (seconds + 2))) << ended.load() << " sessions ended";
  if (static_cast<size_t>(ended.load()) + 1 > lines) {
    EXPECT_GE(mkt::count_matching_lines(daemon_->log_path(), "ended sessions not logged"), 1u);
  }
}
