// gpu_memory_test.cc: GPU-memory regions in the daemon, without a GPU or a NIC: what it checks
// about a dmabuf descriptor (fdinfo), the session's accounting of such regions, and how they are
// registered with a transport (ibv_reg_dmabuf_mr on the recording verbs fake, with the GPU
// address as the NIC's address) next to host regions.
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <string>

#include "dmabuf.h"
#include "network.h"
#include "session.h"
#include "verbs_fake_api.h"
#include "verbs_transport.h"

namespace mkernel::daemon {
namespace {

namespace mp = mkernel::protocol;

constexpr uint64_t kGpuAddress = 0x7e0000200000ull;

std::shared_ptr<Session> make_session(uint64_t max_bytes = 8 << 20) {
  int sv[2];
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv), 0);
  ::close(sv[1]);
  SessionQuota q;
  q.max_rings = 1;
  q.max_regions = 4;
  q.max_registered_bytes = max_bytes;
  q.max_inflight = 64;
  q.max_ring_capacity_log2 = 12;
  q.max_flags = 64;
  auto s = std::make_shared<Session>(1, mp::UniqueFd(sv[0]), ucred{}, q);
  s->set_identity({"t", "c", 0, 2, 0});
  s->mark_hello();
  return s;
}

// A descriptor that stands in for a dmabuf where the daemon does not look inside it.
mp::UniqueFd stand_in_fd() { return mp::UniqueFd(::memfd_create("stand-in-dmabuf", MFD_CLOEXEC)); }

GpuRegionSpec gpu_spec(uint64_t bytes, bool writable) {
  GpuRegionSpec g;
  g.bytes = bytes;
  g.remote_writable = writable;
  g.dmabuf = stand_in_fd();
  g.dmabuf_offset = 0;
  g.gpu_address = kGpuAddress;
  g.cuda_device = 3;
  g.exporter = "nvidia";
  return g;
}

TEST(DmabufFdinfo, ReadsExporterAndSize) {
  const std::string text = "pos:\t0\nflags:\t02000002\nmnt_id:\t15\nino:\t4242\nsize:\t2097152\ncount:\t1\n"
                           "exp_name:\tnvidia\nname:\t\n";
  auto info = parse_dmabuf_fdinfo(text, "fd 7");
  ASSERT_TRUE(info.ok()) << info.status().to_string();
  EXPECT_EQ(info->exporter, "nvidia");
  EXPECT_EQ(info->size, 2097152u);
}

TEST(DmabufFdinfo, SomethingElseIsNamedAndRefused) {
  // A memfd's fdinfo: no exp_name.
  auto r = parse_dmabuf_fdinfo("pos:\t0\nflags:\t02000002\nmnt_id:\t1\nino:\t9\n", "the descriptor (/memfd:x)");
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("the descriptor (/memfd:x) is not a dmabuf"), std::string::npos)
      << r.status().message();
  EXPECT_NE(r.status().message().find("cuMemGetHandleForAddressRange"), std::string::npos);
  // A dmabuf that reports no usable size.
  for (const char* bad : {"exp_name:\tnvidia\n", "exp_name:\tnvidia\nsize:\t0\n", "exp_name:\tnvidia\nsize:\t12x\n",
                          "exp_name:\tnvidia\nsize:\t-4096\n"}) {
    auto b = parse_dmabuf_fdinfo(bad, "fd 9");
    EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(b.status().message().find("fd 9"), std::string::npos) << b.status().message();
  }
  // The key must be the whole field name ("exp_name_x" is not exp_name).
  EXPECT_FALSE(parse_dmabuf_fdinfo("exp_name_x:\tnvidia\nsize:\t4096\n", "fd").ok());
}

TEST(DmabufFdinfo, RealDescriptorsThatAreNotDmabufsAreRefusedByName) {
  mp::UniqueFd memfd(::memfd_create("not-a-dmabuf", MFD_CLOEXEC));
  ASSERT_TRUE(memfd.valid());
  auto r = inspect_dmabuf(memfd.get());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("/memfd:not-a-dmabuf"), std::string::npos) << r.status().message();
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  mp::UniqueFd a(sv[0]), b(sv[1]);
  auto s = inspect_dmabuf(a.get());
  EXPECT_NE(s.status().message().find("socket:"), std::string::npos) << s.status().message();
  EXPECT_EQ(inspect_dmabuf(-1).status().code(), StatusCode::kInvalidArgument);
}

TEST(GpuRegions, CountAgainstTheSessionQuotas) {
  auto s = make_session(4 << 20);
  auto host = s->add_region(4096, true);
  ASSERT_TRUE(host.ok()) << host.status().to_string();
  EXPECT_FALSE(host.value()->gpu());
  auto gpu = s->add_gpu_region(gpu_spec(2 << 20, true));
  ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
  EXPECT_TRUE(gpu.value()->gpu());
  EXPECT_EQ(gpu.value()->data(), nullptr);  // never mapped by the daemon
  EXPECT_EQ(gpu.value()->bytes, uint64_t{2} << 20);
  EXPECT_EQ(s->num_regions(), 2u);
  EXPECT_EQ(s->num_gpu_regions(), 1u);
  EXPECT_EQ(s->registered_bytes(), 4096u + (2u << 20));
  auto over = s->add_gpu_region(gpu_spec(2 << 20, true));  // 4 KiB + 4 MiB > 4 MiB
  EXPECT_EQ(over.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(over.status().message().find("clients.quota.registered_bytes"), std::string::npos);
  EXPECT_EQ(s->add_gpu_region(gpu_spec(0, true)).status().code(), StatusCode::kInvalidArgument);
  GpuRegionSpec no_fd = gpu_spec(4096, true);
  no_fd.dmabuf.reset();
  EXPECT_EQ(s->add_gpu_region(std::move(no_fd)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s->num_regions(), 2u);  // refusals add nothing
}

struct VerbsHarness {
  std::shared_ptr<net::testing::FakeVerbsApi> fake = std::make_shared<net::testing::FakeVerbsApi>();
  std::unique_ptr<net::Transport> t;
  void open() {
    net::VerbsOptions o;
    o.rank = 0;
    o.num_ranks = 2;
    o.max_outstanding_wr = 8;
    o.signal_every = 4;
    auto r = net::open_verbs(o, fake);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    t = std::move(r).value();
  }
};

TEST(GpuRegions, RegisteredThroughDmabufWithTheGpuAddressBesideHostRegions) {
  VerbsHarness h;
  ASSERT_NO_FATAL_FAILURE(h.open());
  ASSERT_TRUE(h.t->capabilities().dmabuf);
  auto s = make_session();
  auto host = s->add_region(8192, true);
  ASSERT_TRUE(host.ok());
  GpuRegionSpec writable = gpu_spec(1 << 20, true);
  writable.dmabuf_offset = 2 << 20;  // the region starts 2 MiB into its dmabuf
  const int writable_fd = writable.dmabuf.get();
  ASSERT_TRUE(s->add_gpu_region(std::move(writable)).ok());
  GpuRegionSpec source_only = gpu_spec(4096, false);
  source_only.gpu_address = kGpuAddress + (8 << 20);
  const int source_fd = source_only.dmabuf.get();
  ASSERT_TRUE(s->add_gpu_region(std::move(source_only)).ok());

  const size_t before = h.fake->regs.size();  // the transport's own (signal staging)
  auto regs = register_regions(*s, h.t.get());
  ASSERT_TRUE(regs.ok()) << regs.status().to_string();
  ASSERT_EQ(regs->size(), 3u);
  ASSERT_EQ(h.fake->regs.size(), before + 3);
  const auto& hr = h.fake->regs[before];
  EXPECT_FALSE(hr.dmabuf);
  EXPECT_EQ(hr.addr, host.value()->data());
  EXPECT_EQ(hr.length, 8192u);
  const auto& gw = h.fake->regs[before + 1];
  EXPECT_TRUE(gw.dmabuf);
  EXPECT_EQ(gw.fd, writable_fd);
  EXPECT_EQ(gw.offset, uint64_t{2} << 20);
  EXPECT_EQ(gw.length, size_t{1} << 20);
  EXPECT_EQ(gw.iova, kGpuAddress);
  EXPECT_EQ(gw.access, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);  // read: the writers' flush
  const auto& gs = h.fake->regs[before + 2];
  EXPECT_TRUE(gs.dmabuf);
  EXPECT_EQ(gs.fd, source_fd);
  EXPECT_EQ(gs.iova, kGpuAddress + (8 << 20));
  EXPECT_EQ(gs.access, IBV_ACCESS_LOCAL_WRITE);  // peers may not write where it was not allowed
  EXPECT_FALSE(regs.value()[0].gpu);
  EXPECT_TRUE(regs.value()[1].gpu);
  EXPECT_TRUE(regs.value()[2].gpu);
  EXPECT_FALSE(regs.value()[1].descriptor.empty());
  EXPECT_TRUE(regs.value()[2].descriptor.empty());
  EXPECT_EQ(regs.value()[1].bytes, uint64_t{1} << 20);

  // Without a transport: kinds and sizes only, nothing registered.
  auto bare = register_regions(*s, nullptr);
  ASSERT_TRUE(bare.ok());
  EXPECT_EQ(bare->size(), 3u);
  EXPECT_TRUE(bare.value()[1].gpu);
  EXPECT_EQ(h.fake->regs.size(), before + 3);
}

TEST(GpuRegions, ARefusedRegistrationNamesTheRegionAndTheExporter) {
  VerbsHarness h;
  ASSERT_NO_FATAL_FAILURE(h.open());
  auto s = make_session();
  ASSERT_TRUE(s->add_region(4096, true).ok());
  ASSERT_TRUE(s->add_gpu_region(gpu_spec(1 << 20, true)).ok());
  h.fake->fail_reg_errno = EOPNOTSUPP;  // a NIC without dmabuf support
  auto r = register_regions(*s, h.t.get());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDeviceError);
  // The host region failed first here (the fake refuses everything): names region 0.
  EXPECT_NE(r.status().message().find("registering region 0"), std::string::npos) << r.status().message();
  h.fake->fail_reg_errno = 0;
  auto s2 = make_session();
  ASSERT_TRUE(s2->add_gpu_region(gpu_spec(1 << 20, true)).ok());
  h.fake->fail_reg_errno = EOPNOTSUPP;
  auto r2 = register_regions(*s2, h.t.get());
  ASSERT_FALSE(r2.ok());
  EXPECT_NE(r2.status().message().find("registering region 0 (GPU memory, dmabuf from nvidia)"), std::string::npos)
      << r2.status().message();
  EXPECT_NE(r2.status().message().find("ibv_reg_dmabuf_mr"), std::string::npos) << r2.status().message();
  EXPECT_EQ(r2.status().message().find("7e0000200000"), std::string::npos);  // no addresses in errors
}

TEST(GpuRegions, RoutesSendGpuMemoryThroughTheNetworkExceptToTheRankItself) {
  RouteFacts f;
  f.same_daemon = true;
  EXPECT_FALSE(route_through_network(f)) << "same daemon, host memory: inside the daemon";
  f.same_daemon = false;
  EXPECT_TRUE(route_through_network(f)) << "another daemon";
  f.same_daemon = true;
  f.theirs_gpu = true;
  EXPECT_TRUE(route_through_network(f)) << "the peer's GPU memory";
  f.theirs_gpu = false;
  f.mine_gpu = true;
  EXPECT_TRUE(route_through_network(f)) << "our GPU memory";
  f = RouteFacts{};
  f.network_for_local = true;
  EXPECT_TRUE(route_through_network(f)) << "asked for the network";
  // The rank itself: through the network only when asked and the transport can address itself.
  f = RouteFacts{};
  f.self = true;
  f.same_daemon = true;
  f.mine_gpu = f.theirs_gpu = true;
  EXPECT_FALSE(route_through_network(f)) << "verbs-like: no queue pair to itself";
  f.network_for_local = true;
  EXPECT_FALSE(route_through_network(f)) << "asked, but the transport cannot address itself";
  f.self_peer = true;
  EXPECT_TRUE(route_through_network(f)) << "fabric-like: asked and able";
  f.network_for_local = false;
  EXPECT_FALSE(route_through_network(f)) << "able, not asked";
}

TEST(GpuRegions, VerbsCannotAddressItself) {
  VerbsHarness h;
  ASSERT_NO_FATAL_FAILURE(h.open());
  EXPECT_FALSE(h.t->capabilities().self_peer);
}

}  // namespace
}  // namespace mkernel::daemon
