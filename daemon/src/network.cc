#include "network.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <spdlog/spdlog.h>

#include <cstring>

#include <grpcpp/grpcpp.h>

#include "grpc_status.h"
#include "mkernel/proto/peer.grpc.pb.h"
#include "session.h"

#if defined(MKERNEL_HAVE_FABRIC)
#include "fabric_transport.h"
#endif
#if defined(MKERNEL_HAVE_VERBS)
#include "verbs_transport.h"
#endif

namespace mkernel::daemon {

namespace pb = mkernel::peer::v1;
using namespace std::chrono_literals;

namespace {

// The interface whose IPv4/IPv6 address is `host` (a literal address); else the first
// non-loopback interface that is up with an address; else "lo".
std::string tcp_interface_for(const std::string& host) {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return "";
  std::string match, first_up;
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || (a->ifa_flags & IFF_UP) == 0) continue;
    const int fam = a->ifa_addr->sa_family;
    if (fam != AF_INET && fam != AF_INET6) continue;
    char text[INET6_ADDRSTRLEN] = {};
    const void* src = fam == AF_INET ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr)
                                     : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(a->ifa_addr)->sin6_addr);
    ::inet_ntop(fam, src, text, sizeof(text));
    if (!host.empty() && host == text && match.empty()) match = a->ifa_name;
    if ((a->ifa_flags & IFF_LOOPBACK) == 0 && fam == AF_INET && first_up.empty()) first_up = a->ifa_name;
  }
  ::freeifaddrs(list);
  if (!match.empty()) return match;
  if (!first_up.empty()) return first_up;
  return "lo";
}

}  // namespace

std::string TransportChoice::describe() const {
  if (kind == config::TransportKind::kVerbs)
    return "verbs " + (domain.empty() ? std::string("(first device)") : domain);
  return "fabric " + provider + (domain.empty() ? "" : " (domain " + domain + ")");
}

std::string TransportProbe::summary() const {
  if (!status.ok()) return "no network transport: " + status.message();
  const net::Capabilities& c = capabilities;
  return choice.describe() + ": " + c.provider + " " + c.version + "; remote write " +
         (c.remote_write ? "yes" : "no") + ", GPU memory by dmabuf " + (c.dmabuf ? "yes" : "no") +
         (c.needs_host_staging ? " (GPU data is staged through host memory)" : "") +
         ", ordered writes " + (c.ordered_writes ? "yes" : "no") + ", CQ data " +
         std::to_string(c.cq_data_bytes) + " bytes, " + std::to_string(c.max_inflight) +
         " writes in flight";
}

std::string TransportProbe::gpu_memory_reason() const {
  if (!status.ok()) return "no network transport: " + status.message();
  if (capabilities.dmabuf) return "";
  return choice.describe() + ": " +
         (capabilities.dmabuf_reason.empty() ? capabilities.provider + " cannot register GPU memory"
                                             : capabilities.dmabuf_reason);
}

std::string peer_target(const std::string& address) {
  if (address.rfind("tcp:", 0) == 0) return address.substr(4);
  return address;
}

std::string target_host(const std::string& target) {
  if (target.rfind("unix:", 0) == 0) return "";
  if (!target.empty() && target[0] == '[') {
    const size_t close = target.find(']');
    return close == std::string::npos ? "" : target.substr(1, close - 1);
  }
  const size_t colon = target.rfind(':');
  return colon == std::string::npos ? target : target.substr(0, colon);
}

StatusOr<std::unique_ptr<net::Transport>> open_transport(const TransportChoice& choice,
                                                         const OpenOptions& options) {
  if (choice.kind == config::TransportKind::kVerbs) {
#if defined(MKERNEL_HAVE_VERBS)
    net::VerbsOptions vo;
    vo.device = choice.domain;
    vo.rank = options.rank;
    vo.num_ranks = options.world_size;
    return net::open_verbs(vo);
#else
    (void)options;
    return Status(StatusCode::kFailedPrecondition,
                  "transport.kind: verbs, but this mkerneld was built without libibverbs "
                  "(MKERNEL_WITH_VERBS=OFF)");
#endif
  }
#if defined(MKERNEL_HAVE_FABRIC)
  net::FabricOptions fo;
  fo.provider = choice.provider;
  fo.domain = choice.domain;
  fo.av_size = std::max<uint32_t>(16, options.world_size);
  fo.completion_timeout_ms = static_cast<uint32_t>(std::max<int64_t>(1, options.command_timeout.count()));
  fo.write_piece_bytes =
      choice.write_piece_bytes == config::kAutoWritePieceBytes ? net::kAutoWritePiece : choice.write_piece_bytes;
  switch (choice.signal_value) {
    case config::SignalValue::kCqData:
      fo.signal_value = net::SignalValuePath::kCqData;
      break;
    case config::SignalValue::kMessage:
      fo.signal_value = net::SignalValuePath::kMessage;
      break;
    case config::SignalValue::kAuto:
      fo.signal_value = net::SignalValuePath::kAuto;
      break;
  }
  return net::open_fabric(fo);
#else
  return Status(StatusCode::kFailedPrecondition,
                "transport.kind: fabric, but this mkerneld was built without libfabric "
                "(MKERNEL_WITH_FABRIC=OFF)");
#endif
}

TransportProbe probe_transport(const config::TransportConfig& cfg, const std::string& advertise_host) {
  TransportProbe p;
  std::string verbs_reason;
  const bool want_verbs = cfg.kind == config::TransportKind::kVerbs;
  if (want_verbs || cfg.kind == config::TransportKind::kAuto) {
    TransportChoice c;
    c.kind = config::TransportKind::kVerbs;
    c.domain = cfg.nic == "auto" ? "" : cfg.nic;
    auto t = open_transport(c, OpenOptions{});
    if (t.ok()) {
      p.choice = c;
      p.capabilities = t.value()->capabilities();
      return p;
    }
    verbs_reason = t.status().message();
    if (want_verbs) {
      p.choice = c;
      p.status = t.status();
      return p;
    }
  }
  TransportChoice c;
  c.kind = config::TransportKind::kFabric;
  c.signal_value = cfg.signal_value;
  c.write_piece_bytes = cfg.write_piece_bytes;
  std::vector<std::string> providers;
  if (cfg.provider != "auto") providers.push_back(cfg.provider);
  else providers = {"efa", "tcp;ofi_rxm"};
  Status last;
  for (const std::string& prov : providers) {
    c.provider = prov;
    if (prov == "shm") c.domain = "";
    else if (cfg.nic != "auto") c.domain = cfg.nic;
    else if (prov.rfind("tcp", 0) == 0) c.domain = tcp_interface_for(advertise_host);
    else c.domain = "";
    auto t = open_transport(c, OpenOptions{});
    if (t.ok()) {
      p.choice = c;
      p.capabilities = t.value()->capabilities();
      if (!verbs_reason.empty()) spdlog::info("verbs not used: {}", verbs_reason);
      return p;
    }
    last = t.status();
  }
  p.choice = c;
  p.status = verbs_reason.empty() ? last
                                  : Status(last.code(), last.message() + "; verbs: " + verbs_reason);
  return p;
}

void JoinCancel::cancel() {
  std::lock_guard<std::mutex> lock(mu_);
  cancelled_.store(true, std::memory_order_release);
  if (ctx_ != nullptr) ctx_->TryCancel();
}

void JoinCancel::set_context(grpc::ClientContext* ctx) {
  std::lock_guard<std::mutex> lock(mu_);
  ctx_ = ctx;
  if (ctx_ != nullptr && cancelled_.load(std::memory_order_acquire)) ctx_->TryCancel();
}

bool route_through_network(const RouteFacts& f) {
  if (!f.same_daemon) return true;
  if (f.self) return f.network_for_local && f.self_peer;
  // GPU memory is reached only by the NIC (the daemon never maps it).
  return f.network_for_local || f.mine_gpu || f.theirs_gpu;
}

StatusOr<std::vector<RegisteredRegion>> register_regions(const Session& session, net::Transport* t) {
  std::vector<RegisteredRegion> out;
  const uint32_t nregions = session.num_regions();
  for (uint32_t r = 0; r < nregions; ++r) {
    const Region* region = session.region(r);
    RegisteredRegion& o = out.emplace_back();
    o.bytes = region->bytes;
    o.gpu = region->gpu();
    if (t == nullptr) continue;
    net::RegisterRequest rr;
    if (region->gpu()) {
      rr.kind = net::MemoryKind::kDmabuf;
      rr.addr = reinterpret_cast<void*>(static_cast<uintptr_t>(region->gpu_address));
      rr.dmabuf_fd = region->dmabuf.get();
      rr.dmabuf_offset = region->dmabuf_offset;
      rr.cuda_device = region->cuda_device;
    } else {
      rr.kind = net::MemoryKind::kHost;
      rr.addr = region->data();
    }
    rr.length = region->bytes;
    rr.remote_writable = region->remote_writable;
    auto reg = t->register_memory(rr);
    if (!reg.ok())
      return reg.status().with_context("registering region " + std::to_string(r) +
                                       (region->gpu() ? " (GPU memory, dmabuf from " + region->exporter + ")" : ""));
    o.local_id = reg.value().local_id;
    if (region->remote_writable) o.descriptor = std::move(reg.value().descriptor);
  }
  return out;
}

StatusOr<std::unique_ptr<SessionNetwork>> connect_session(const Session& session,
                                                          const ConnectRequest& req,
                                                          JoinCancel& cancel) {
  const Session::Identity& id = session.identity();
  auto net = std::make_unique<SessionNetwork>();
  OpenOptions oo = req.open;
  oo.rank = id.rank;
  oo.world_size = id.world_size;
  const bool have_transport = req.transport_status.ok();
  if (have_transport) {
    MK_ASSIGN_OR_RETURN(net->transport, open_transport(req.choice, oo));
    const net::Capabilities& caps = net->transport->capabilities();
    net->description = req.choice.kind == config::TransportKind::kVerbs
                           ? "verbs " + caps.provider + " " + caps.version
                           : "fabric " + caps.provider + " " + caps.version;
  } else {
    net->description = "in-daemon only (no network transport)";
  }
  net::Transport* t = net->transport.get();

  pb::JoinRequest join;
  join.set_communicator(id.communicator);
  join.set_size(id.world_size);
  join.set_rank(id.rank);
  join.set_token(req.token);
  join.set_node(req.node);
  join.set_instance(req.instance);
  join.set_flags(session.num_flags());

  // Every region: the source side needs local registration, destinations remote write access.
  if (t == nullptr && session.num_gpu_regions() > 0)
    return Status(StatusCode::kFailedPrecondition,
                  "the session has GPU-memory regions, but this daemon has no network transport to reach "
                  "them: " + req.transport_status.message());
  MK_ASSIGN_OR_RETURN(std::vector<RegisteredRegion> registered, register_regions(session, t));
  for (uint32_t r = 0; r < registered.size(); ++r) {
    pb::RegionDescriptor* d = join.add_regions();
    d->set_region_id(r);
    d->set_bytes(registered[r].bytes);
    d->set_device_memory(registered[r].gpu);
    if (t == nullptr) continue;
    net->local_regions.push_back(registered[r].local_id);
    d->set_blob(registered[r].descriptor.data(), registered[r].descriptor.size());
  }
  const bool mine_gpu = session.num_gpu_regions() > 0;
  // A transport whose peers' NICs write flags themselves (verbs) needs the flag array as its
  // signal region, named before its address is published (net_transport.h note 6).
  if (t != nullptr && t->capabilities().signals == net::SignalDelivery::kSignalRegion && session.num_flags() > 0) {
    net::RegisterRequest rr;
    rr.addr = session.flags();
    rr.length = size_t{session.num_flags()} * sizeof(uint64_t);
    rr.remote_writable = true;
    MK_ASSIGN_OR_RETURN(net::Registration reg, t->register_memory(rr));
    MK_RETURN_IF_ERROR(t->set_signal_region(reg.local_id));
  }
  if (t != nullptr) {
    MK_ASSIGN_OR_RETURN(net::Blob endpoint, t->local_address());
    join.set_endpoint(endpoint.data(), endpoint.size());
  }

  if (cancel.cancelled()) return Status(StatusCode::kUnavailable, "connect cancelled");
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 1);
  auto channel = grpc::CreateCustomChannel(req.root, grpc::InsecureChannelCredentials(), args);
  auto stub = pb::Peer::NewStub(channel);
  pb::JoinReply reply;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + req.timeout);
    ctx.set_wait_for_ready(true);  // the root may start a moment after us
    cancel.set_context(&ctx);
    const grpc::Status s = stub->Join(&ctx, join, &reply);
    cancel.set_context(nullptr);
    if (!s.ok()) return from_grpc(s, "rendezvous").with_context("root " + req.root);
  }
  if (reply.ranks_size() != static_cast<int>(id.world_size))
    return Status(StatusCode::kProtocolError, "rendezvous table has " + std::to_string(reply.ranks_size()) +
                                                  " ranks; expected " + std::to_string(id.world_size));

  net->ranks.resize(id.world_size);
  for (const pb::RankEntry& e : reply.ranks()) {
    if (e.rank() >= id.world_size)
      return Status(StatusCode::kProtocolError, "rendezvous table names rank " + std::to_string(e.rank()));
    RankRoute& route = net->ranks[e.rank()];
    route.rank = e.rank();
    route.node = e.node();
    route.flags = e.flags();
    for (int i = 0; i < e.regions_size(); ++i) {
      if (e.regions(i).region_id() != static_cast<uint32_t>(i))
        return Status(StatusCode::kProtocolError,
                      "rank " + std::to_string(e.rank()) + " lists region " +
                          std::to_string(e.regions(i).region_id()) + " at position " + std::to_string(i));
      route.region_bytes.push_back(e.regions(i).bytes());
      route.gpu_regions += e.regions(i).device_memory() ? 1 : 0;
    }
    RouteFacts facts;
    facts.self = e.rank() == id.rank;
    facts.same_daemon = e.instance() == req.instance;
    facts.network_for_local = req.network_for_local;
    facts.mine_gpu = mine_gpu;
    facts.theirs_gpu = route.gpu_regions > 0;
    facts.self_peer = t != nullptr && t->capabilities().self_peer;
    route.network = route_through_network(facts);
    if (!route.network) continue;
    if (t == nullptr)
      return Status(StatusCode::kUnavailable,
                    "rank " + std::to_string(e.rank()) +
                        (e.instance() != req.instance ? " uses the daemon on node \"" + e.node() + "\""
                                                      : " has GPU-memory regions") +
                        ", but this daemon has no network transport: " + req.transport_status.message());
    auto peer = t->add_peer(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(e.endpoint().data()),
                                                    e.endpoint().size()));
    if (!peer.ok())
      return peer.status().with_context("adding rank " + std::to_string(e.rank()) + " on " + e.node());
    route.peer = peer.value();
    for (const pb::RegionDescriptor& d : e.regions()) {
      if (d.blob().empty()) {  // not remote-writable: no peer may write into it
        route.region_ids.push_back(UINT64_MAX);
        continue;
      }
      auto imported = t->import_region(
          route.peer, std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(d.blob().data()), d.blob().size()));
      if (!imported.ok())
        return imported.status().with_context("importing region " + std::to_string(d.region_id()) +
                                              " of rank " + std::to_string(e.rank()));
      route.region_ids.push_back(imported.value());
    }
  }
  return net;
}

}  // namespace mkernel::daemon
