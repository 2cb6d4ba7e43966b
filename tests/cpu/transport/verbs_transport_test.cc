// verbs_transport_test.cc: the libibverbs RC transport against a recording fake (no RDMA NIC
// exists where these tests run), plus the real libibverbs on this machine, where
// ibv_get_device_list finds nothing.
#include "verbs_transport.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "verbs_fake_api.h"
#include "verbs_wire.h"

namespace mkernel::daemon::net {
namespace {

namespace wire = verbs_wire;
using testing::FakeVerbsApi;

// Values that stand for secrets: none of them may appear in any error message.
constexpr uint64_t kPeerSignalAddr = 0x7f3a00001000ull;
constexpr uint32_t kPeerSignalRkey = 0x7a11ce55u;
constexpr uint32_t kPeerSignalSlots = 32;
constexpr uint64_t kPeerDataAddr = 0x7f3b00000000ull;
constexpr uint64_t kPeerDataBytes = 1u << 20;
constexpr uint32_t kPeerDataRkey = 0x0badc0deu;
constexpr uint32_t kPeerQpn = 0x4242;
constexpr uint32_t kPeerPsn = 0xabcde;
constexpr uint16_t kPeerLid = 0x22;
constexpr uint32_t kFirstQpn = 0x100;       // the fake's first queue pair
constexpr uint32_t kStagingLkey = 0x1000;   // the fake's first registration: signal staging

wire::Address peer_address(uint32_t rank, uint32_t num_ranks, uint32_t for_rank,
                           uint8_t link_layer = IBV_LINK_LAYER_INFINIBAND) {
  wire::Address a;
  a.link_layer = link_layer;
  a.mtu = IBV_MTU_2048;
  a.lid = kPeerLid;
  a.rank = rank;
  a.num_ranks = num_ranks;
  for (size_t i = 0; i < a.gid.size(); ++i) a.gid[i] = static_cast<uint8_t>(0xb0 + i);
  a.gid[0] = 0xfe;
  for (size_t i = 1; i < 8; ++i) a.gid[i] = static_cast<uint8_t>(0xa0 + i);  // same subnet
  a.signal_addr = kPeerSignalAddr;
  a.signal_rkey = kPeerSignalRkey;
  a.signal_slots = kPeerSignalSlots;
  a.qps.resize(num_ranks);
  a.qps[for_rank] = {kPeerQpn, kPeerPsn};
  return a;
}

Blob peer_region() { return wire::encode_region({kPeerDataAddr, kPeerDataBytes, kPeerDataRkey}); }

VerbsOptions small_options() {
  VerbsOptions o;
  o.rank = 0;
  o.num_ranks = 2;
  o.max_outstanding_wr = 8;
  o.signal_every = 4;
  return o;
}

// A transport connected to rank 1, with a local source region and the peer's data region.
struct Harness {
  std::shared_ptr<FakeVerbsApi> fake = std::make_shared<FakeVerbsApi>();
  std::unique_ptr<Transport> t;
  std::vector<uint8_t> src = std::vector<uint8_t>(4096, 0x5a);
  uint64_t src_id = 0;
  uint32_t peer = 0;
  uint64_t remote = 0;

  void open(const VerbsOptions& o = small_options()) {
    auto r = open_verbs(o, fake);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    t = std::move(r).value();
    RegisterRequest req;
    req.addr = src.data();
    req.length = src.size();
    auto reg = t->register_memory(req);
    ASSERT_TRUE(reg.ok()) << reg.status().to_string();
    src_id = reg->local_id;
    ASSERT_TRUE(t->local_address().ok());
    auto p = t->add_peer(wire::encode_address(peer_address(1, o.num_ranks, o.rank)));
    ASSERT_TRUE(p.ok()) << p.status().to_string();
    peer = p.value();
    auto rr = t->import_region(peer, peer_region());
    ASSERT_TRUE(rr.ok()) << rr.status().to_string();
    remote = rr.value();
  }
  WriteOp write(uint64_t cookie, uint64_t length, uint64_t local_off = 0,
                uint64_t remote_off = 0) const {
    WriteOp w;
    w.cookie = cookie;
    w.peer = peer;
    w.local_region = src_id;
    w.local_offset = local_off;
    w.remote_region = remote;
    w.remote_offset = remote_off;
    w.length = length;
    return w;
  }
  std::vector<Completion> poll() {
    std::vector<Completion> c;
    std::vector<Arrival> a;
    t->poll(&c, &a);
    EXPECT_TRUE(a.empty());
    return c;
  }
};

// Every rendering of the secret values that an error message could carry.
std::vector<std::string> secret_needles(const Harness& h) {
  std::vector<std::string> out;
  auto add = [&](uint64_t v) {
    char hex[32];
    std::snprintf(hex, sizeof(hex), "%llx", static_cast<unsigned long long>(v));
    out.push_back(hex);
    out.push_back(std::to_string(v));
  };
  for (uint64_t v : {uint64_t{kPeerSignalAddr}, uint64_t{kPeerSignalRkey}, uint64_t{kPeerDataAddr},
                     uint64_t{kPeerDataRkey}, uint64_t{kPeerQpn}, uint64_t{kPeerPsn}})
    add(v);
  for (const auto& r : h.fake->regs) add(r.rkey);
  add(reinterpret_cast<uintptr_t>(h.src.data()));
  return out;
}

void expect_no_secrets(const Harness& h, const std::string& message) {
  for (const std::string& needle : secret_needles(h))
    EXPECT_EQ(message.find(needle), std::string::npos)
        << "message leaks \"" << needle << "\": " << message;
}

// ---- opening ----------------------------------------------------------------------------------

TEST(VerbsOpen, RealLibibverbsOnThisMachineSaysNoRdmaDevice) {
  auto api = real_verbs_api();
  int n = 0;
  ibv_device** list = api->get_device_list(&n);
  if (list != nullptr) api->free_device_list(list);
  if (list != nullptr && n > 0) GTEST_SKIP() << "an RDMA device is present; this test is for hosts without one";
  auto r = open_verbs(VerbsOptions{});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(r.status().message(), kNoRdmaDeviceMessage);
}

TEST(VerbsOpen, NoDeviceIsUnavailableWithThePlainMessage) {
  auto fake = std::make_shared<FakeVerbsApi>();
  fake->device_names.clear();
  auto r = open_verbs(VerbsOptions{}, fake);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(r.status().message(),
            "no RDMA device: ibv_get_device_list found none (this kernel has no RDMA support or "
            "no NIC is present)");
  EXPECT_EQ(fake->calls, std::vector<std::string>{"get_device_list"});
}

TEST(VerbsOpen, PicksTheFirstDeviceWithAnActivePortAndClosesTheOthers) {
  auto fake = std::make_shared<FakeVerbsApi>();
  fake->device_names = {"mlx5_0", "mlx5_1"};
  fake->port_states = {IBV_PORT_DOWN, IBV_PORT_ACTIVE};
  auto r = open_verbs(VerbsOptions{}, fake);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r.value()->capabilities().provider, "verbs:mlx5_1");
  const std::vector<std::string> head(fake->calls.begin(), fake->calls.begin() + 8);
  EXPECT_EQ(head, (std::vector<std::string>{"get_device_list", "get_device_name#mlx5_0",
                                            "open_device#mlx5_0", "query_port#1",
                                            "close_device#mlx5_0", "get_device_name#mlx5_1",
                                            "open_device#mlx5_1", "query_port#1"}));
}

TEST(VerbsOpen, NoActivePortAndUnknownDeviceAreClearErrors) {
  auto fake = std::make_shared<FakeVerbsApi>();
  fake->port_states = {IBV_PORT_DOWN};
  auto r = open_verbs(VerbsOptions{}, fake);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(r.status().message().find("mlx5_0 port 1 DOWN"), std::string::npos)
      << r.status().message();

  VerbsOptions named;
  named.device = "mlx5_9";
  auto n = open_verbs(named, std::make_shared<FakeVerbsApi>());
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().code(), StatusCode::kNotFound);
  EXPECT_NE(n.status().message().find("present: mlx5_0"), std::string::npos);
}

TEST(VerbsOpen, OptionsAreValidatedWithFieldNames) {
  VerbsOptions o;
  o.signal_every = 0;
  Status s = validate(o);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("signal_every: 0"), std::string::npos);
  o = VerbsOptions{};
  o.max_outstanding_wr = 1;
  EXPECT_NE(validate(o).message().find("max_outstanding_wr: 1"), std::string::npos);
  o = VerbsOptions{};
  o.rank = 4;
  o.num_ranks = 4;
  EXPECT_NE(validate(o).message().find("rank: 4"), std::string::npos);
  EXPECT_TRUE(validate(VerbsOptions{}).ok());
}

TEST(VerbsOpen, CapabilitiesSayOrderedWritesAndNoArrivals) {
  Harness h;
  h.open();
  const Capabilities& c = h.t->capabilities();
  EXPECT_EQ(c.provider, "verbs:mlx5_0");
  EXPECT_EQ(c.version, "firmware 16.35.1012");
  EXPECT_TRUE(c.remote_write);
  EXPECT_TRUE(c.ordered_writes);
  EXPECT_EQ(c.signals, SignalDelivery::kSignalRegion);
  EXPECT_EQ(c.addressing, Addressing::kEndpoints);
  EXPECT_TRUE(c.dmabuf);
  EXPECT_FALSE(c.needs_host_staging);
  EXPECT_EQ(c.max_inflight, 4u);  // 8 work requests, two per write with a signal
}

// ---- the recorded sequence on connect ---------------------------------------------------------

TEST(VerbsConnect, CallSequenceAndQueuePairTransitionsMatchTheRecording) {
  Harness h;
  VerbsOptions o = small_options();
  o.num_ranks = 3;  // queue pairs for ranks 1 and 2
  h.open(o);
  const std::vector<std::string> expected = {
      // open: device, port, protection domain, signal staging, completion queue
      "get_device_list", "get_device_name#mlx5_0", "open_device#mlx5_0", "query_port#1",
      "query_device", "query_gid#0", "alloc_pd", "reg_mr#4096", "create_cq#16",
      "free_device_list",
      // register_memory (the source region)
      "reg_mr#4097",
      // local_address: one RC queue pair per other rank, each RESET->INIT
      "create_qp#256", "modify_qp#256", "create_qp#257", "modify_qp#257",
      // add_peer(rank 1): INIT->RTR->RTS
      "modify_qp#256", "modify_qp#256"};
  EXPECT_EQ(h.fake->calls, expected);

  const ibv_qp_init_attr& init = h.fake->last_qp_init;
  EXPECT_EQ(init.qp_type, IBV_QPT_RC);
  EXPECT_EQ(init.sq_sig_all, 0);
  EXPECT_EQ(init.cap.max_send_wr, 8u);
  EXPECT_EQ(init.cap.max_send_sge, 1u);

  ASSERT_EQ(h.fake->modifies.size(), 4u);
  const auto& to_init = h.fake->modifies[0];
  EXPECT_EQ(to_init.attr.qp_state, IBV_QPS_INIT);
  EXPECT_EQ(to_init.mask, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
  EXPECT_EQ(to_init.attr.port_num, 1);
  EXPECT_EQ(to_init.attr.pkey_index, 0);
  // Remote read for the flush reads into GPU memory; regions grant it only where it is needed.
  EXPECT_EQ(to_init.attr.qp_access_flags, static_cast<unsigned>(IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ));

  const auto& rtr = h.fake->modifies[2];
  EXPECT_EQ(rtr.qp_num, kFirstQpn);
  EXPECT_EQ(rtr.attr.qp_state, IBV_QPS_RTR);
  EXPECT_EQ(rtr.mask, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                          IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
  EXPECT_EQ(rtr.attr.dest_qp_num, kPeerQpn);
  EXPECT_EQ(rtr.attr.rq_psn, kPeerPsn);
  EXPECT_EQ(rtr.attr.path_mtu, IBV_MTU_2048);  // the smaller of 4096 (ours) and 2048 (peer's)
  EXPECT_EQ(rtr.attr.max_dest_rd_atomic, 1);
  EXPECT_EQ(rtr.attr.min_rnr_timer, 12);
  EXPECT_EQ(rtr.attr.ah_attr.dlid, kPeerLid);
  EXPECT_EQ(rtr.attr.ah_attr.port_num, 1);
  EXPECT_EQ(rtr.attr.ah_attr.is_global, 0);  // InfiniBand, same subnet: LID routing

  const auto& rts = h.fake->modifies[3];
  EXPECT_EQ(rts.attr.qp_state, IBV_QPS_RTS);
  EXPECT_EQ(rts.mask, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                          IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
  EXPECT_EQ(rts.attr.timeout, 14);
  EXPECT_EQ(rts.attr.retry_cnt, 7);
  EXPECT_EQ(rts.attr.rnr_retry, 7);
  EXPECT_EQ(rts.attr.max_rd_atomic, 1);

  // The address we published: our queue pair for rank 1 and the PSN RTS used.
  auto mine = wire::decode_address(h.t->local_address().value());
  ASSERT_TRUE(mine.ok());
  EXPECT_EQ(mine->rank, 0u);
  EXPECT_EQ(mine->num_ranks, 3u);
  EXPECT_EQ(mine->lid, 0x11);
  EXPECT_EQ(mine->qps[0].qpn, 0u);
  EXPECT_EQ(mine->qps[1].qpn, kFirstQpn);
  EXPECT_EQ(mine->qps[2].qpn, kFirstQpn + 1);
  EXPECT_EQ(mine->qps[1].psn, rts.attr.sq_psn);
  EXPECT_LE(rts.attr.sq_psn, 0xffffffu);
  EXPECT_EQ(mine->signal_slots, 0u);
}

TEST(VerbsConnect, RoceRoutesByGid) {
  Harness h;
  h.fake->link_layer = IBV_LINK_LAYER_ETHERNET;
  VerbsOptions o = small_options();
  o.gid_index = 3;
  auto r = open_verbs(o, h.fake);
  ASSERT_TRUE(r.ok());
  h.t = std::move(r).value();
  ASSERT_TRUE(h.t->local_address().ok());
  wire::Address peer = peer_address(1, 2, 0, IBV_LINK_LAYER_ETHERNET);
  ASSERT_TRUE(h.t->add_peer(wire::encode_address(peer)).ok());
  const auto& rtr = h.fake->modifies[1];
  EXPECT_EQ(rtr.attr.ah_attr.is_global, 1);
  EXPECT_EQ(rtr.attr.ah_attr.grh.sgid_index, 3);
  EXPECT_EQ(rtr.attr.ah_attr.grh.hop_limit, 64);
  EXPECT_EQ(0, std::memcmp(rtr.attr.ah_attr.grh.dgid.raw, peer.gid.data(), 16));
}

TEST(VerbsConnect, BadPeerAddressesAreRejected) {
  Harness h;
  h.open();
  // Already connected.
  auto again = h.t->add_peer(wire::encode_address(peer_address(1, 2, 0)));
  EXPECT_EQ(again.status().code(), StatusCode::kAlreadyExists);
  // Our own rank, another communicator size, a truncated blob, a foreign blob.
  EXPECT_EQ(h.t->add_peer(wire::encode_address(peer_address(0, 2, 1))).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(h.t->add_peer(wire::encode_address(peer_address(1, 3, 0))).status().code(),
            StatusCode::kInvalidArgument);
  Blob cut = wire::encode_address(peer_address(1, 2, 0));
  cut.resize(cut.size() - 1);
  Status s = h.t->add_peer(cut).status();
  EXPECT_EQ(s.code(), StatusCode::kProtocolError);
  expect_no_secrets(h, s.message());
  Blob junk(60, 0x42);
  EXPECT_EQ(h.t->add_peer(junk).status().code(), StatusCode::kProtocolError);
}

TEST(VerbsConnect, FailedTransitionLeavesThePeerUnusable) {
  Harness h;
  h.fake->fail_modify_at = 1;  // the first INIT->RTR (index 0 is RESET->INIT)
  h.fake->fail_modify_errno = EINVAL;
  auto r = open_verbs(small_options(), h.fake);
  ASSERT_TRUE(r.ok());
  h.t = std::move(r).value();
  ASSERT_TRUE(h.t->local_address().ok());
  auto p = h.t->add_peer(wire::encode_address(peer_address(1, 2, 0)));
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kDeviceError);
  EXPECT_NE(p.status().message().find("INIT->RTR"), std::string::npos);
  expect_no_secrets(h, p.status().message());
  auto again = h.t->add_peer(wire::encode_address(peer_address(1, 2, 0)));
  EXPECT_EQ(again.status().code(), StatusCode::kFailedPrecondition);
}

// ---- memory registration ----------------------------------------------------------------------

TEST(VerbsMemory, RemoteWriteOnlyWhenRemoteWritableAndNeverRelaxedOrdering) {
  Harness h;
  h.open();
  std::vector<uint8_t> buf(256);
  RegisterRequest req;
  req.addr = buf.data();
  req.length = buf.size();
  req.remote_writable = false;
  auto closed = h.t->register_memory(req);
  ASSERT_TRUE(closed.ok());
  EXPECT_TRUE(closed->descriptor.empty()) << "a region peers may not write exports no key";
  req.remote_writable = true;
  auto open = h.t->register_memory(req);
  ASSERT_TRUE(open.ok());
  auto desc = wire::decode_region(open->descriptor);
  ASSERT_TRUE(desc.ok());
  EXPECT_EQ(desc->addr, reinterpret_cast<uintptr_t>(buf.data()));
  EXPECT_EQ(desc->length, buf.size());
  EXPECT_EQ(desc->rkey, h.fake->regs.back().rkey);

  for (const auto& r : h.fake->regs) EXPECT_EQ(r.access & IBV_ACCESS_RELAXED_ORDERING, 0);
  const auto& regs = h.fake->regs;
  ASSERT_EQ(regs.size(), 4u);  // staging, harness source, closed, open
  EXPECT_EQ(regs[0].access, IBV_ACCESS_LOCAL_WRITE);
  EXPECT_EQ(regs[1].access, IBV_ACCESS_LOCAL_WRITE);
  EXPECT_EQ(regs[2].access, IBV_ACCESS_LOCAL_WRITE);
  EXPECT_EQ(regs[3].access, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
}

TEST(VerbsMemory, GpuMemoryGoesThroughDmabufWithTheGpuAddressAsIova) {
  Harness h;
  h.open();
  RegisterRequest req;
  req.kind = MemoryKind::kDmabuf;
  req.addr = reinterpret_cast<void*>(uintptr_t{0x7e0000200000});
  req.length = 1 << 21;
  req.dmabuf_fd = 37;
  req.dmabuf_offset = 4096;
  req.remote_writable = true;
  auto reg = h.t->register_memory(req);
  ASSERT_TRUE(reg.ok()) << reg.status().to_string();
  const auto& r = h.fake->regs.back();
  EXPECT_TRUE(r.dmabuf);
  EXPECT_EQ(r.fd, 37);
  EXPECT_EQ(r.offset, 4096u);
  EXPECT_EQ(r.length, size_t{1} << 21);
  EXPECT_EQ(r.iova, 0x7e0000200000u);
  // Remote read too: writers flush with a read before raising the flag (verbs_transport.h note 3).
  EXPECT_EQ(r.access, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
  auto desc = wire::decode_region(reg.value().descriptor);
  ASSERT_TRUE(desc.ok());
  EXPECT_TRUE(desc->gpu_memory);
  EXPECT_EQ(desc->addr, 0x7e0000200000u);
  req.remote_writable = false;  // a source only: nobody reads or writes it remotely
  ASSERT_TRUE(h.t->register_memory(req).ok());
  EXPECT_EQ(h.fake->regs.back().access, IBV_ACCESS_LOCAL_WRITE);
  req.remote_writable = true;

  req.dmabuf_fd = -1;
  EXPECT_EQ(h.t->register_memory(req).status().code(), StatusCode::kInvalidArgument);
  h.fake->fail_reg_errno = EFAULT;
  req.dmabuf_fd = 37;
  auto failed = h.t->register_memory(req);
  EXPECT_EQ(failed.status().code(), StatusCode::kDeviceError);
  EXPECT_NE(failed.status().message().find("ibv_reg_dmabuf_mr"), std::string::npos);
  EXPECT_EQ(failed.status().message().find("7e0000200000"), std::string::npos);
}

TEST(VerbsMemory, SignalRegionIsPublishedInTheAddress) {
  auto fake = std::make_shared<FakeVerbsApi>();
  auto r = open_verbs(small_options(), fake);
  ASSERT_TRUE(r.ok());
  auto t = std::move(r).value();
  Transport* v = t.get();  // the signal region goes through the interface (no cast)
  EXPECT_EQ(v->capabilities().signals, SignalDelivery::kSignalRegion);
  alignas(8) uint64_t flags[16] = {};
  RegisterRequest req;
  req.addr = flags;
  req.length = sizeof(flags);
  auto closed = t->register_memory(req);
  ASSERT_TRUE(closed.ok());
  EXPECT_EQ(v->set_signal_region(closed->local_id).code(), StatusCode::kInvalidArgument);
  req.remote_writable = true;
  auto reg = t->register_memory(req);
  ASSERT_TRUE(reg.ok());
  ASSERT_TRUE(v->set_signal_region(reg->local_id).ok());
  auto addr = wire::decode_address(t->local_address().value());
  ASSERT_TRUE(addr.ok());
  EXPECT_EQ(addr->signal_addr, reinterpret_cast<uintptr_t>(flags));
  EXPECT_EQ(addr->signal_slots, 16u);
  EXPECT_EQ(addr->signal_rkey, fake->regs.back().rkey);
  EXPECT_EQ(v->set_signal_region(reg->local_id).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(t->deregister_memory(reg->local_id).code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(t->deregister_memory(closed->local_id).ok());
  EXPECT_EQ(t->deregister_memory(closed->local_id).code(), StatusCode::kNotFound);
}

// ---- work requests ----------------------------------------------------------------------------

TEST(VerbsPost, DataWriteThenInlineSignalWriteInOnePost) {
  Harness h;
  h.open();
  WriteOp w = h.write(7, 1000, 16, 64);
  w.has_signal = true;
  w.signal_idx = 5;
  w.signal_value = 0x1122334455667788ull;
  ASSERT_TRUE(h.t->post_write(w).ok());
  ASSERT_EQ(h.fake->posts.size(), 1u);
  const auto& chain = h.fake->posts[0];
  ASSERT_EQ(chain.size(), 2u);

  const auto& data = chain[0];
  EXPECT_EQ(data.qp_num, kFirstQpn);
  EXPECT_EQ(data.opcode, IBV_WR_RDMA_WRITE);
  ASSERT_EQ(data.sges.size(), 1u);
  EXPECT_EQ(data.sges[0].addr, reinterpret_cast<uintptr_t>(h.src.data()) + 16);
  EXPECT_EQ(data.sges[0].length, 1000u);
  EXPECT_EQ(data.sges[0].lkey, h.fake->regs[1].lkey);
  EXPECT_EQ(data.remote_addr, kPeerDataAddr + 64);
  EXPECT_EQ(data.rkey, kPeerDataRkey);
  EXPECT_EQ(data.send_flags, 0u) << "the signal write behind it is signalled";

  const auto& flag = chain[1];
  EXPECT_EQ(flag.opcode, IBV_WR_RDMA_WRITE);
  ASSERT_EQ(flag.sges.size(), 1u);
  EXPECT_EQ(flag.sges[0].length, 8u);
  EXPECT_EQ(flag.payload, 0x1122334455667788ull);
  EXPECT_EQ(flag.remote_addr, kPeerSignalAddr + 5 * 8);
  EXPECT_EQ(flag.rkey, kPeerSignalRkey);
  EXPECT_EQ(flag.send_flags, unsigned{IBV_SEND_SIGNALED | IBV_SEND_INLINE});
  EXPECT_GT(flag.wr_id, data.wr_id);

  h.fake->complete(kFirstQpn, flag.wr_id);
  auto done = h.poll();
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].cookie, 7u);
  EXPECT_TRUE(done[0].status.ok());
}

// Into GPU memory, a signal waits for a flush read of the data (verbs_transport.h note 3): data
// write, 8-byte read of the data's last bytes into the staging sink, fenced flag write. Host
// memory and unsignalled writes go as before; a short write reads what it wrote.
TEST(VerbsPost, SignalAfterDataIntoGpuMemoryIsFencedBehindAFlushRead) {
  Harness h;
  h.open();
  constexpr uint64_t kGpuAddr = 0x7e0000400000ull;
  constexpr uint32_t kGpuRkey = 0x600dfeedu;
  auto gpu = h.t->import_region(h.peer, wire::encode_region({kGpuAddr, 1 << 20, kGpuRkey, true}));
  ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
  WriteOp w = h.write(9, 1000, 0, 4096);
  w.remote_region = gpu.value();
  w.has_signal = true;
  w.signal_idx = 2;
  w.signal_value = 77;
  ASSERT_TRUE(h.t->post_write(w).ok());
  ASSERT_EQ(h.fake->posts.size(), 1u);
  const auto& chain = h.fake->posts[0];
  ASSERT_EQ(chain.size(), 3u);
  EXPECT_EQ(chain[0].opcode, IBV_WR_RDMA_WRITE);
  EXPECT_EQ(chain[0].remote_addr, kGpuAddr + 4096);
  EXPECT_EQ(chain[0].rkey, kGpuRkey);
  EXPECT_EQ(chain[0].send_flags, 0u);
  const auto& read = chain[1];
  EXPECT_EQ(read.opcode, IBV_WR_RDMA_READ);
  EXPECT_EQ(read.remote_addr, kGpuAddr + 4096 + 1000 - 8);
  EXPECT_EQ(read.rkey, kGpuRkey);
  ASSERT_EQ(read.sges.size(), 1u);
  EXPECT_EQ(read.sges[0].length, 8u);
  EXPECT_EQ(read.sges[0].lkey, kStagingLkey);
  EXPECT_EQ(read.send_flags, 0u);
  const auto& flag = chain[2];
  EXPECT_EQ(flag.opcode, IBV_WR_RDMA_WRITE);
  EXPECT_EQ(flag.remote_addr, kPeerSignalAddr + 2 * 8);
  EXPECT_EQ(flag.payload, 77u);
  EXPECT_NE(flag.send_flags & IBV_SEND_FENCE, 0u) << "the flag waits for the read's response";
  EXPECT_NE(flag.send_flags & IBV_SEND_SIGNALED, 0u);
  EXPECT_NE(flag.sges[0].addr, read.sges[0].addr) << "the read never lands on a flag value";
  h.fake->complete(kFirstQpn, flag.wr_id);
  auto done = h.poll();
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].cookie, 9u);
  EXPECT_TRUE(done[0].status.ok());

  // Three bytes: the read reads those three.
  WriteOp small = h.write(10, 3, 0, 0);
  small.remote_region = gpu.value();
  small.has_signal = true;
  ASSERT_TRUE(h.t->post_write(small).ok());
  ASSERT_EQ(h.fake->posts.back().size(), 3u);
  EXPECT_EQ(h.fake->posts.back()[1].sges[0].length, 3u);
  EXPECT_EQ(h.fake->posts.back()[1].remote_addr, kGpuAddr);
  // No signal: no flush. Host memory with a signal: no flush, no fence.
  WriteOp plain = h.write(11, 64);
  plain.remote_region = gpu.value();
  ASSERT_TRUE(h.t->post_write(plain).ok());
  EXPECT_EQ(h.fake->posts.back().size(), 1u);
  WriteOp host = h.write(12, 64);
  host.has_signal = true;
  ASSERT_TRUE(h.t->post_write(host).ok());
  ASSERT_EQ(h.fake->posts.back().size(), 2u);
  EXPECT_EQ(h.fake->posts.back()[1].send_flags & IBV_SEND_FENCE, 0u);
  for (const auto& post : h.fake->posts)
    for (const auto& wr : post) EXPECT_EQ(wr.opcode == IBV_WR_RDMA_READ, wr.rkey == kGpuRkey && post.size() == 3 && &wr == &post[1]);
}

// Reads in flight per queue pair (the flushes): the device's limits, at most 16; the responder
// side is published, the initiator side is the smaller of its own and the peer's. A device or
// peer that reports none gets 1.
TEST(VerbsConnect, ReadDepthFollowsTheDeviceAndThePeer) {
  Harness h;
  h.fake->max_qp_rd_atom = 64;
  h.fake->max_qp_init_rd_atom = 8;
  VerbsOptions o = small_options();
  auto r = open_verbs(o, h.fake);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  h.t = std::move(r).value();
  auto addr = h.t->local_address();
  ASSERT_TRUE(addr.ok());
  auto mine = wire::decode_address(addr.value());
  ASSERT_TRUE(mine.ok());
  EXPECT_EQ(mine->rd_atomic, 16) << "published responder depth: the device's 64, at most 16";
  wire::Address peer = peer_address(1, o.num_ranks, o.rank);
  peer.rd_atomic = 4;
  ASSERT_TRUE(h.t->add_peer(wire::encode_address(peer)).ok());
  const size_t n = h.fake->modifies.size();
  ASSERT_GE(n, 2u);
  EXPECT_EQ(h.fake->modifies[n - 2].attr.max_dest_rd_atomic, 16);
  EXPECT_EQ(h.fake->modifies[n - 1].attr.max_rd_atomic, 4) << "the peer answers 4 at once";

  Harness old;  // a device that reports nothing, a peer that publishes nothing
  old.open();
  const size_t m = old.fake->modifies.size();
  EXPECT_EQ(old.fake->modifies[m - 2].attr.max_dest_rd_atomic, 1);
  EXPECT_EQ(old.fake->modifies[m - 1].attr.max_rd_atomic, 1);
}

TEST(VerbsPost, FlushReadsCountAgainstTheOutstandingBound) {
  Harness h;
  VerbsOptions o = small_options();
  o.max_outstanding_wr = 4;
  o.signal_every = 2;
  h.open(o);
  auto gpu = h.t->import_region(h.peer, wire::encode_region({0x7e0000400000ull, 1 << 20, 0x1234567u, true}));
  ASSERT_TRUE(gpu.ok());
  WriteOp w = h.write(1, 256);
  w.remote_region = gpu.value();
  w.has_signal = true;
  ASSERT_TRUE(h.t->post_write(w).ok());  // 3 of 4
  w.cookie = 2;
  EXPECT_EQ(h.t->post_write(w).code(), StatusCode::kUnavailable);  // 3 more would be 6
  h.fake->complete(kFirstQpn, h.fake->posts[0][2].wr_id);
  ASSERT_EQ(h.poll().size(), 1u);
  EXPECT_TRUE(h.t->post_write(w).ok());
}

TEST(VerbsWire, RegionDescriptorCarriesTheGpuMemoryFlag) {
  auto host = wire::decode_region(wire::encode_region({1, 2, 3, false}));
  auto gpu = wire::decode_region(wire::encode_region({1, 2, 3, true}));
  ASSERT_TRUE(host.ok() && gpu.ok());
  EXPECT_FALSE(host->gpu_memory);
  EXPECT_TRUE(gpu->gpu_memory);
  Blob odd = wire::encode_region({1, 2, 3, false});
  odd[6] = 0x02;  // a flag this build does not know
  auto bad = wire::decode_region(odd);
  EXPECT_EQ(bad.status().code(), StatusCode::kProtocolError);
  EXPECT_NE(bad.status().message().find("unknown flags 2"), std::string::npos) << bad.status().message();
}

TEST(VerbsPost, SignalWithoutInlineUsesTheRegisteredStagingSlot) {
  Harness h;
  h.fake->granted_inline = 0;
  h.open();
  WriteOp w = h.write(1, 0);  // signal only
  w.has_signal = true;
  w.signal_idx = 31;
  w.signal_value = 99;
  ASSERT_TRUE(h.t->post_write(w).ok());
  ASSERT_EQ(h.fake->posts.size(), 1u);
  ASSERT_EQ(h.fake->posts[0].size(), 1u);
  const auto& flag = h.fake->posts[0][0];
  EXPECT_EQ(flag.send_flags, unsigned{IBV_SEND_SIGNALED});
  EXPECT_EQ(flag.sges[0].lkey, kStagingLkey);
  EXPECT_EQ(flag.payload, 99u);
  EXPECT_EQ(flag.remote_addr, kPeerSignalAddr + 31 * 8);

  w.signal_idx = kPeerSignalSlots;  // one past the end
  Status s = h.t->post_write(w);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  expect_no_secrets(h, s.message());
}

TEST(VerbsPost, SignalledEveryNthWorkRequest) {
  Harness h;
  h.open();  // signal_every 4, bound 8
  for (uint64_t i = 0; i < 8; ++i) {
    Status s = h.t->post_write(h.write(i, 64));
    ASSERT_TRUE(s.ok()) << i << ": " << s.to_string();
  }
  const auto wrs = h.fake->all_wrs();
  ASSERT_EQ(wrs.size(), 8u);
  for (size_t i = 0; i < wrs.size(); ++i)
    EXPECT_EQ(wrs[i].send_flags, (i % 4 == 3) ? unsigned{IBV_SEND_SIGNALED} : 0u) << i;
}

TEST(VerbsPost, OutstandingBoundReturnsUnavailableUntilCompletionsRetireWork) {
  Harness h;
  h.open();  // bound 8
  for (uint64_t i = 0; i < 8; ++i) ASSERT_TRUE(h.t->post_write(h.write(i, 64)).ok());
  Status full = h.t->post_write(h.write(8, 64));
  EXPECT_EQ(full.code(), StatusCode::kUnavailable);
  EXPECT_NE(full.message().find("8 of 8"), std::string::npos) << full.message();
  EXPECT_EQ(h.fake->all_wrs().size(), 8u) << "nothing posted past the bound";

  // The 4th work request is signalled: its completion retires the first four.
  const auto wrs = h.fake->all_wrs();
  h.fake->complete(kFirstQpn, wrs[3].wr_id);
  auto done = h.poll();
  ASSERT_EQ(done.size(), 4u);
  for (uint64_t i = 0; i < 4; ++i) {
    EXPECT_EQ(done[i].cookie, i);
    EXPECT_TRUE(done[i].status.ok());
  }
  // Room for a write with a signal (two work requests) again.
  WriteOp w = h.write(9, 64);
  w.has_signal = true;
  EXPECT_TRUE(h.t->post_write(w).ok());
  WriteOp w2 = h.write(10, 64);
  w2.has_signal = true;
  EXPECT_TRUE(h.t->post_write(w2).ok());
  EXPECT_EQ(h.t->post_write(h.write(11, 64)).code(), StatusCode::kUnavailable);
}

TEST(VerbsPost, UnsignalledTailGetsAZeroLengthSignalledWriteSoItCompletes) {
  Harness h;
  h.open();
  ASSERT_TRUE(h.t->post_write(h.write(1, 64)).ok());
  ASSERT_TRUE(h.t->post_write(h.write(2, 64, 0, 128)).ok());
  EXPECT_TRUE(h.poll().empty());
  auto wrs = h.fake->all_wrs();
  ASSERT_EQ(wrs.size(), 3u);
  const auto& flush = wrs[2];
  EXPECT_EQ(flush.send_flags, unsigned{IBV_SEND_SIGNALED});
  EXPECT_TRUE(flush.sges.empty());
  EXPECT_EQ(flush.remote_addr, kPeerDataAddr + 128);
  EXPECT_EQ(flush.rkey, kPeerDataRkey);
  EXPECT_TRUE(h.poll().empty()) << "one flush in flight is enough";
  EXPECT_EQ(h.fake->all_wrs().size(), 3u);
  h.fake->complete(kFirstQpn, flush.wr_id);
  auto done = h.poll();
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(done[0].cookie, 1u);
  EXPECT_EQ(done[1].cookie, 2u);
  EXPECT_EQ(h.fake->all_wrs().size(), 3u) << "nothing left to flush";
}

TEST(VerbsPost, InvalidWritesAreRejectedBeforePosting) {
  Harness h;
  h.open();
  std::vector<Status> errors;
  errors.push_back(h.t->post_write(h.write(1, 0)));                       // nothing to do
  errors.push_back(h.t->post_write(h.write(1, 4097)));                    // past local region
  errors.push_back(h.t->post_write(h.write(1, 64, 0, kPeerDataBytes)));   // past remote region
  WriteOp bad_peer = h.write(1, 64);
  bad_peer.peer = 5;
  errors.push_back(h.t->post_write(bad_peer));
  WriteOp bad_region = h.write(1, 64);
  bad_region.remote_region = 77;
  errors.push_back(h.t->post_write(bad_region));
  WriteOp bad_local = h.write(1, 64);
  bad_local.local_region = 77;
  errors.push_back(h.t->post_write(bad_local));
  for (const Status& s : errors) {
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.code(), StatusCode::kUnavailable) << s.message();
    expect_no_secrets(h, s.message());
  }
  EXPECT_TRUE(h.fake->posts.empty());
}

TEST(VerbsPost, RegionOfAnotherPeerIsRejected) {
  Harness h;
  VerbsOptions o = small_options();
  o.num_ranks = 3;
  h.open(o);
  ASSERT_TRUE(h.t->add_peer(wire::encode_address(peer_address(2, 3, 0))).ok());
  auto other = h.t->import_region(2, peer_region());
  ASSERT_TRUE(other.ok());
  WriteOp w = h.write(1, 64);
  w.remote_region = other.value();  // peer 2's region, posted to peer 1
  Status s = h.t->post_write(w);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("belongs to peer 2, not peer 1"), std::string::npos) << s.message();
  EXPECT_TRUE(h.fake->posts.empty());
}

TEST(VerbsPost, PostSendFailures) {
  Harness h;
  h.open();
  h.fake->fail_post_errno = ENOMEM;
  Status full = h.t->post_write(h.write(1, 64));
  EXPECT_EQ(full.code(), StatusCode::kUnavailable);
  h.fake->fail_post_errno = EINVAL;
  Status bad = h.t->post_write(h.write(2, 64));
  EXPECT_EQ(bad.code(), StatusCode::kDeviceError);
  expect_no_secrets(h, bad.message());

  // The data write is posted, its signal write is not: the write is accepted and its
  // Completion carries the error once the data write is retired.
  h.fake->fail_post_errno = EINVAL;
  h.fake->fail_post_index = 1;
  WriteOp w = h.write(3, 64);
  w.has_signal = true;
  ASSERT_TRUE(h.t->post_write(w).ok());
  ASSERT_EQ(h.fake->posts.size(), 1u);
  ASSERT_EQ(h.fake->posts[0].size(), 1u);
  auto done = h.poll();  // posts a flush for the unsignalled data write
  EXPECT_TRUE(done.empty());
  const auto wrs = h.fake->all_wrs();
  ASSERT_EQ(wrs.size(), 2u);
  h.fake->complete(kFirstQpn, wrs[1].wr_id);
  done = h.poll();
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].cookie, 3u);
  EXPECT_EQ(done[0].status.code(), StatusCode::kDeviceError);
  EXPECT_NE(done[0].status.message().find("signal write"), std::string::npos);
}

// ---- completions ------------------------------------------------------------------------------

TEST(VerbsCompletion, EveryWorkCompletionErrorNamesItsStatus) {
  for (int raw = IBV_WC_LOC_LEN_ERR; raw <= IBV_WC_TM_RNDV_INCOMPLETE; ++raw) {
    const auto status = static_cast<ibv_wc_status>(raw);
    SCOPED_TRACE(wc_status_name(status));
    Harness h;
    h.open();
    WriteOp w = h.write(41, 64);
    w.has_signal = true;
    w.signal_value = 3;
    ASSERT_TRUE(h.t->post_write(w).ok());
    ASSERT_TRUE(h.t->post_write(h.write(42, 64)).ok());  // queued behind the failure
    const auto wrs = h.fake->all_wrs();
    ASSERT_EQ(wrs.size(), 3u);
    h.fake->complete(kFirstQpn, wrs[0].wr_id, status, 0x81);
    h.fake->complete(kFirstQpn, wrs[1].wr_id, IBV_WC_WR_FLUSH_ERR);  // ignored: already failed
    auto done = h.poll();
    ASSERT_EQ(done.size(), 2u);
    EXPECT_EQ(done[0].cookie, 41u);
    EXPECT_EQ(done[0].status.code(), wc_status_code(status));
    EXPECT_NE(done[0].status.code(), StatusCode::kOk);
    const std::string& m = done[0].status.message();
    EXPECT_NE(m.find(wc_status_name(status)), std::string::npos) << m;
    EXPECT_NE(m.find(ibv_wc_status_str(status)), std::string::npos) << m;
    EXPECT_NE(m.find("peer 1"), std::string::npos) << m;
    EXPECT_NE(m.find("vendor error 0x81"), std::string::npos) << m;
    expect_no_secrets(h, m);
    EXPECT_EQ(done[1].cookie, 42u);
    EXPECT_FALSE(done[1].status.ok());
    EXPECT_NE(done[1].status.message().find("not executed"), std::string::npos);
    expect_no_secrets(h, done[1].status.message());
    // The queue pair is in the error state: later writes to that peer fail at once.
    Status later = h.t->post_write(h.write(43, 64));
    EXPECT_EQ(later.code(), StatusCode::kFailedPrecondition);
    EXPECT_TRUE(h.poll().empty());
  }
}

TEST(VerbsCompletion, StatusCodesByKind) {
  EXPECT_EQ(wc_status_code(IBV_WC_RETRY_EXC_ERR), StatusCode::kUnavailable);
  EXPECT_EQ(wc_status_code(IBV_WC_RNR_RETRY_EXC_ERR), StatusCode::kUnavailable);
  EXPECT_EQ(wc_status_code(IBV_WC_REM_ACCESS_ERR), StatusCode::kPermissionDenied);
  EXPECT_EQ(wc_status_code(IBV_WC_LOC_PROT_ERR), StatusCode::kPermissionDenied);
  EXPECT_EQ(wc_status_code(IBV_WC_WR_FLUSH_ERR), StatusCode::kFailedPrecondition);
  EXPECT_EQ(wc_status_code(IBV_WC_LOC_LEN_ERR), StatusCode::kDeviceError);
  EXPECT_EQ(wc_status_code(IBV_WC_FATAL_ERR), StatusCode::kDeviceError);
  EXPECT_STREQ(wc_status_name(IBV_WC_REM_ACCESS_ERR), "IBV_WC_REM_ACCESS_ERR");
}

TEST(VerbsCompletion, BrokenCompletionQueueFailsEverythingInFlight) {
  Harness h;
  h.open();
  ASSERT_TRUE(h.t->post_write(h.write(1, 64)).ok());
  ASSERT_TRUE(h.t->post_write(h.write(2, 64)).ok());
  EXPECT_TRUE(h.t->async_error().ok());
  h.fake->poll_error = -5;
  auto done = h.poll();
  ASSERT_EQ(done.size(), 2u);
  for (const auto& c : done) EXPECT_EQ(c.status.code(), StatusCode::kDeviceError);
  EXPECT_EQ(h.t->post_write(h.write(3, 64)).code(), StatusCode::kDeviceError);
  // The endpoint as a whole: the asynchronous error path (net_transport.h note 7).
  EXPECT_EQ(h.t->async_error().code(), StatusCode::kDeviceError);
  EXPECT_NE(h.t->async_error().message().find("ibv_poll_cq failed"), std::string::npos);
}

TEST(VerbsCompletion, CompletionsWaitWhenPollHasNowhereToPutThem) {
  Harness h;
  h.open();
  WriteOp w = h.write(1, 64);
  w.has_signal = true;
  ASSERT_TRUE(h.t->post_write(w).ok());
  h.fake->complete(kFirstQpn, h.fake->all_wrs().back().wr_id);
  EXPECT_EQ(h.t->poll(nullptr, nullptr), 0u);
  ASSERT_EQ(h.poll().size(), 1u) << "kept for the next call that takes completions";
}

TEST(VerbsCompletion, RegionWithWritesInFlightCannotBeDeregistered) {
  Harness h;
  h.open();
  WriteOp w = h.write(1, 64);
  w.has_signal = true;
  ASSERT_TRUE(h.t->post_write(w).ok());
  EXPECT_EQ(h.t->deregister_memory(h.src_id).code(), StatusCode::kFailedPrecondition);
  h.fake->complete(kFirstQpn, h.fake->all_wrs().back().wr_id);
  ASSERT_EQ(h.poll().size(), 1u);
  EXPECT_TRUE(h.t->deregister_memory(h.src_id).ok());
}

// ---- teardown ---------------------------------------------------------------------------------

TEST(VerbsTeardown, ResourcesAreReleasedInReverseLifetimeOrder) {
  Harness h;
  auto r = open_verbs([] {
    VerbsOptions o = small_options();
    o.num_ranks = 3;
    return o;
  }(), h.fake);
  ASSERT_TRUE(r.ok());
  h.t = std::move(r).value();
  RegisterRequest req;
  req.addr = h.src.data();
  req.length = 1024;
  ASSERT_TRUE(h.t->register_memory(req).ok());  // lkey 4097
  ASSERT_TRUE(h.t->register_memory(req).ok());  // lkey 4098
  ASSERT_TRUE(h.t->local_address().ok());       // queue pairs 256, 257
  const size_t created = h.fake->calls.size();
  h.t.reset();
  const std::vector<std::string> released(h.fake->calls.begin() + static_cast<long>(created),
                                          h.fake->calls.end());
  EXPECT_EQ(released, (std::vector<std::string>{"destroy_qp#257", "destroy_qp#256", "destroy_cq",
                                                "dereg_mr#4098", "dereg_mr#4097",
                                                "dereg_mr#4096", "dealloc_pd",
                                                "close_device#mlx5_0"}));
}

TEST(VerbsTeardown, FailedOpenReleasesWhatItCreated) {
  auto fake = std::make_shared<FakeVerbsApi>();
  fake->fail_reg_errno = ENOMEM;  // the staging registration fails
  auto r = open_verbs(small_options(), fake);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDeviceError);
  const std::vector<std::string> tail(fake->calls.end() - 3, fake->calls.end());
  EXPECT_EQ(tail, (std::vector<std::string>{"free_device_list", "dealloc_pd",
                                            "close_device#mlx5_0"}));
}

}  // namespace
}  // namespace mkernel::daemon::net
