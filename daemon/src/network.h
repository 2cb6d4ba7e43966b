// network.h: how a session reaches ranks served by other daemons: the network transport it
// gets when it connects its communicator, the rendezvous that fills in its routes, and the
// probe that reports at start which transport a proxy would use.
//
// Design notes
//  1. One transport per connected session. A session is one rank of one communicator, so this
//     gives every communicator its own domain / protection domain and memory-region scope
//     (net_transport.h note 4) without any sharing between communicators.
//  2. Connecting happens on a worker thread the daemon owns (never on the event loop, never on
//     a proxy): open the transport, register every region of the session (remote write access
//     only on regions created remote_writable), exchange endpoints and region descriptors
//     through the root daemon's peer service, add every peer and import its regions. The
//     result is handed to the session once complete; from then on only the session's proxy
//     thread touches the transport.
//  3. Routes: a rank served by this daemon (its rendezvous entry carries our epoch) is reached
//     inside the daemon (the session's loopback endpoint, loopback_transport.h) unless the
//     session asked for the network for local ranks too, or GPU memory is involved
//     (route_through_network); every other rank through the network transport. The routes keep
//     each peer region's size and each peer's flag count, so a command whose destination is
//     out of range is rejected before anything is posted.
//  4. Secrets: endpoint blobs and region descriptors only travel inside JoinRequest/Reply and
//     into the transport; nothing here logs them. Errors name ranks and region ids.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "mkernel/common/status.h"
#include "mkernel/config/config.h"
#include "net_transport.h"

namespace grpc {
class ClientContext;
}

namespace mkernel::daemon {

class Session;

// What the transport of a proxy resolves to (config kind/provider/nic after "auto").
struct TransportChoice {
  config::TransportKind kind = config::TransportKind::kFabric;  // never kAuto
  std::string provider;  // fabric: "tcp;ofi_rxm", "shm", "efa"; verbs: ""
  std::string domain;    // fabric domain / verbs device; "" = the library's first
  config::SignalValue signal_value = config::SignalValue::kAuto;  // fabric: how signal values travel
  uint64_t write_piece_bytes = config::kAutoWritePieceBytes;       // fabric: writes in pieces
  std::string describe() const;  // "fabric tcp;ofi_rxm (domain lo)", "verbs mlx5_0"
};

// What a probe found: the transport a proxy would open, or why none is available.
struct TransportProbe {
  Status status;                 // not ok: no network transport on this proxy
  TransportChoice choice;
  net::Capabilities capabilities;
  std::string summary() const;   // one line for the start-up log and the admin status
  // Whether the transport registers GPU memory (dmabuf); gpu_memory_reason says why not.
  bool gpu_memory() const { return status.ok() && capabilities.dmabuf; }
  std::string gpu_memory_reason() const;
};

// Resolves "auto" choices: kind (verbs when an RDMA device exists and verbs is built in, else
// fabric), provider (efa when libfabric offers it, else tcp;ofi_rxm) and the tcp interface
// (the one holding `advertise_host`'s address, else the first non-loopback interface that is
// up, else lo). Opens and closes a transport to find out what it can do.
TransportProbe probe_transport(const config::TransportConfig& config, const std::string& advertise_host);

struct OpenOptions {
  uint32_t rank = 0;
  uint32_t world_size = 1;
  std::chrono::milliseconds command_timeout{30000};
};
StatusOr<std::unique_ptr<net::Transport>> open_transport(const TransportChoice& choice,
                                                         const OpenOptions& options);

// A destination rank as the session's routes know it.
struct RankRoute {
  uint32_t rank = 0;
  std::string node;
  bool network = false;               // through the transport (else inside this daemon)
  uint32_t peer = 0;                  // transport peer index (network only)
  std::vector<uint64_t> region_ids;   // imported ids, by the rank's region id (network only)
  std::vector<uint64_t> region_bytes; // sizes, by the rank's region id
  uint32_t flags = 0;                 // the rank's flag count
  uint32_t gpu_regions = 0;           // of its regions, how many are GPU memory
};

// A connected session's network side. Owned by the Session; the transport is driven only by
// the session's proxy once published.
struct SessionNetwork {
  std::unique_ptr<net::Transport> transport;
  std::vector<uint64_t> local_regions;  // registration id by this session's region id
  std::vector<RankRoute> ranks;         // by rank, world_size entries
  std::string description;              // "fabric tcp;ofi_rxm 1.17.0"
};

// Lets the daemon cancel a rendezvous in progress (stop, session gone).
class JoinCancel {
 public:
  void cancel();
  bool cancelled() const { return cancelled_.load(std::memory_order_acquire); }
  // The worker registers the gRPC call in flight (nullptr when none).
  void set_context(grpc::ClientContext* ctx);

 private:
  std::mutex mu_;
  grpc::ClientContext* ctx_ = nullptr;
  std::atomic<bool> cancelled_{false};
};

struct ConnectRequest {
  std::string root;        // gRPC target of the root daemon's peer service
  std::string token;
  std::chrono::milliseconds timeout{120000};
  bool network_for_local = false;
  std::string node;        // our node name
  uint64_t instance = 0;   // our epoch
  TransportChoice choice;
  Status transport_status;  // not ok: no network transport here (only in-daemon ranks work)
  OpenOptions open;
};

// Whether a command to a rank goes through the network transport (design note 3): a rank on
// another daemon always; a rank on this daemon when the session asked for the network for local
// ranks, or when either side has GPU-memory regions (only the NIC reaches those); the session's
// own rank only when it asked for the network and the transport can address itself (verbs
// cannot: its own rank is reached in the daemon, and GPU memory there is refused with a reason).
struct RouteFacts {
  bool self = false;             // the destination is this session's own rank
  bool same_daemon = false;      // its rendezvous entry carries our epoch
  bool network_for_local = false;
  bool mine_gpu = false;         // this session has GPU-memory regions
  bool theirs_gpu = false;       // the destination has GPU-memory regions
  bool self_peer = false;        // the transport's Capabilities::self_peer (false without one)
};
bool route_through_network(const RouteFacts& f);

// What registering one of a session's regions gave (design note 2), by region id.
struct RegisteredRegion {
  uint64_t bytes = 0;
  bool gpu = false;          // GPU memory, registered through its dmabuf
  uint64_t local_id = 0;     // the transport's id (when there is a transport)
  net::Blob descriptor;      // for peers; empty unless remote-writable
};
// Registers every region of `session` with `t` (host memory by address, GPU memory by dmabuf
// with the GPU address as the NIC's address), remote write only on remote-writable ones. With
// no transport, only sizes and kinds are filled in.
StatusOr<std::vector<RegisteredRegion>> register_regions(const Session& session, net::Transport* t);

// Runs on a worker thread (design note 2). `session` must stay alive (the caller holds it); its
// regions and flags must not change meanwhile (the daemon refuses new ones once a connect is
// under way).
StatusOr<std::unique_ptr<SessionNetwork>> connect_session(const Session& session,
                                                          const ConnectRequest& request,
                                                          JoinCancel& cancel);

// "unix:/abs" stays; "tcp:host:port" becomes "host:port"; anything else is returned unchanged.
std::string peer_target(const std::string& address);
// The host part of a "host:port" / "[v6]:port" target; "" for unix targets.
std::string target_host(const std::string& target);

}  // namespace mkernel::daemon
