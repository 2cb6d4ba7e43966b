// session.h: one client process's session with mkerneld and the memory the daemon made for it.
//
// Design notes
//  1. Ownership: the daemon's event loop creates a Session and shares it with the proxy of the
//     session's GPU and with the communicator table; the last holder to let go unmaps and closes
//     everything (RAII members, declared in creation order).
//  2. Rings, regions and flags are created by the event loop while the proxy reads them. Each
//     table has a fixed capacity set at hello (the client's quota) and a published count
//     (release on append, acquire on read); entries are never removed while the session lives.
//     No lock is taken on the command path.
//  3. A session ends once (first reason wins): the client closed or died, it sent something
//     malformed, a command of it was rejected or failed, or the daemon is stopping.
//  4. Everything here may be read by more than one thread (the event loop, the session's proxy,
//     peers' proxies, the control implementation). State that only the event loop touches (the
//     client's refusal, handshake deadline, shared handles, connect progress, farewell) is not
//     here: it is the event loop's ClientState (client_state.h).
#pragma once

#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "mkernel/common/status.h"
#include "mkernel/protocol/ring_host.h"
#include "mkernel/protocol/session_wire.h"
#include "mkernel/protocol/shm.h"
#include "loopback_transport.h"
#include "network.h"

namespace mkernel::daemon {

// A region commands read from and write into: host memory the daemon made (a sealed memfd
// both sides map), or GPU memory the client allocated and handed over as a dmabuf descriptor
// (ImportRegion). The daemon never maps GPU memory: only the NIC reaches it, through the
// session's transport, so data() is nullptr for it.
struct Region {
  protocol::SharedMapping mapping;
  uint64_t bytes = 0;
  bool remote_writable = false;
  // GPU memory only.
  protocol::UniqueFd dmabuf;
  uint64_t dmabuf_offset = 0;
  uint64_t gpu_address = 0;  // device virtual address: the NIC's iova for the region
  int32_t cuda_device = -1;
  std::string exporter;      // the dmabuf's exporting driver
  bool gpu() const { return dmabuf.valid(); }
  uint8_t* data() const { return static_cast<uint8_t*>(mapping.data()); }
};

struct GpuRegionSpec {
  uint64_t bytes = 0;
  bool remote_writable = false;
  protocol::UniqueFd dmabuf;  // checked by inspect_dmabuf (dmabuf.h) before it gets here
  uint64_t dmabuf_offset = 0;
  uint64_t gpu_address = 0;
  int32_t cuda_device = -1;
  std::string exporter;
};

struct SessionRing {
  uint32_t id = 0;
  protocol::SharedMapping mapping;
  protocol::RingView view;
};

struct SessionQuota {
  uint32_t max_rings = 0;
  uint32_t max_regions = 0;
  uint64_t max_registered_bytes = 0;
  uint32_t max_inflight = 0;
  uint32_t max_ring_capacity_log2 = 0;
  uint32_t max_flags = 0;
};

class Session {
 public:
  Session(uint64_t id, protocol::UniqueFd sock, const ucred& creds, const SessionQuota& quota);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  uint64_t id() const { return id_; }
  int socket_fd() const { return sock_.get(); }
  const ucred& creds() const { return creds_; }
  const SessionQuota& quota() const { return quota_; }

  // Set once by the event loop when the hello arrives, before the proxy sees the session.
  struct Identity {
    std::string name;
    std::string communicator;
    uint32_t rank = 0;
    uint32_t world_size = 1;
    uint32_t gpu = 0;
  };
  // identity() may be read by other threads once has_hello() is true (mark_hello publishes it).
  void set_identity(Identity id) { identity_ = std::move(id); }
  const Identity& identity() const { return identity_; }
  bool has_hello() const { return hello_done_.load(std::memory_order_acquire); }
  void mark_hello() { hello_done_.store(true, std::memory_order_release); }

  // ---- tables (event loop appends; proxy reads) ----
  StatusOr<const SessionRing*> add_ring(uint32_t capacity_log2, uint64_t epoch);
  StatusOr<const Region*> add_region(uint64_t bytes, bool remote_writable);
  // GPU memory handed over by the client; counts against the same quotas as host regions.
  StatusOr<const Region*> add_gpu_region(GpuRegionSpec spec);
  Status add_flags(uint32_t count);

  // The descriptors of what add_ring, add_region and add_flags made, for the reply that hands
  // them to the client; the mappings stay. Event loop only (the proxy never reads them), once
  // each: the daemon holds no descriptor for host memory after that.
  protocol::UniqueFd release_ring_fd(uint32_t id) { return rings_[id]->mapping.release_fd(); }
  protocol::UniqueFd release_region_fd(uint32_t id) { return regions_[id]->mapping.release_fd(); }
  protocol::UniqueFd release_flags_fd() { return flags_mapping_.release_fd(); }

  uint32_t num_rings() const { return num_rings_.load(std::memory_order_acquire); }
  const SessionRing* ring(uint32_t i) const { return rings_[i].get(); }
  // nullptr when `id` does not name a region of this session.
  const Region* region(uint32_t id) const {
    return id < num_regions_.load(std::memory_order_acquire) ? regions_[id].get() : nullptr;
  }
  uint32_t num_regions() const { return num_regions_.load(std::memory_order_acquire); }
  uint32_t num_gpu_regions() const { return num_gpu_regions_.load(std::memory_order_acquire); }
  // The flag array (nullptr before create_flags) and its length.
  uint64_t* flags() const { return flags_ptr_.load(std::memory_order_acquire); }
  uint32_t num_flags() const { return num_flags_.load(std::memory_order_acquire); }
  // Bytes of the flag array's segment (whole pages); 0 before add_flags.
  uint64_t flags_bytes() const { return flags() != nullptr ? flags_mapping_.size() : 0; }
  uint64_t registered_bytes() const { return registered_bytes_.load(std::memory_order_relaxed); }

  // ---- transports ----
  // The in-daemon endpoint (loopback_transport.h): driven by the session's proxy, handed
  // signals by peers' proxies.
  LoopbackTransport& loopback() { return loopback_; }
  // The network side (multi-daemon communicators).
  // Set once by the event loop when the session's communicator connected; read by the proxy.
  void set_network(std::unique_ptr<SessionNetwork> n) {
    network_owner_ = std::move(n);
    network_.store(network_owner_.get(), std::memory_order_release);
  }
  SessionNetwork* network() const { return network_.load(std::memory_order_acquire); }

  // ---- ending ----
  // Returns true for the call that ended it. Stores the reason and, when `ring_code` is not 0,
  // writes it into every ring's error word so producers stop waiting.
  bool end(Status reason, uint32_t ring_code, uint32_t ring_detail, uint64_t ring_pos);
  bool ended() const { return ended_.load(std::memory_order_acquire); }
  Status end_reason() const;

  // ---- counters (proxy writes, anyone reads) ----
  std::atomic<uint64_t> commands{0};
  const std::chrono::steady_clock::time_point connected_at = std::chrono::steady_clock::now();

 private:
  Status check_region_quota(uint64_t bytes, uint64_t counted) const;

  const uint64_t id_;
  protocol::UniqueFd sock_;
  const ucred creds_;
  const SessionQuota quota_;
  Identity identity_;
  std::atomic<bool> hello_done_{false};

  std::vector<std::unique_ptr<SessionRing>> rings_;   // sized to quota at construction
  std::vector<std::unique_ptr<Region>> regions_;      // sized to quota at construction
  std::atomic<uint32_t> num_rings_{0};
  std::atomic<uint32_t> num_regions_{0};
  std::atomic<uint32_t> num_gpu_regions_{0};
  protocol::SharedMapping flags_mapping_;
  std::atomic<uint64_t*> flags_ptr_{nullptr};
  std::atomic<uint32_t> num_flags_{0};
  std::atomic<uint64_t> registered_bytes_{0};

  // Declared after the mappings: the transports (and their registrations of them) go first.
  LoopbackTransport loopback_{*this};
  std::unique_ptr<SessionNetwork> network_owner_;
  std::atomic<SessionNetwork*> network_{nullptr};

  std::atomic<bool> ended_{false};
  mutable std::mutex end_mu_;
  Status end_reason_;
};

// Ring error codes the daemon writes into a ring's error word: defined once, in protocol/.
using protocol::RingErrorCode;
using protocol::kRingErrRejected;
using protocol::kRingErrTransport;
using protocol::kRingErrSessionEnded;
using protocol::kRingErrDaemonStopping;

}  // namespace mkernel::daemon
