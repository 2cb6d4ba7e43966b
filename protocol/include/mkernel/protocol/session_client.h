// session_client.h: the client side of a session with the local mkerneld: hello, rings, regions
// and flags handed over as sealed shared memory, liveness. Used by libmkernel, by host-thread
// clients (tests, the demo) and by anything else that talks to the daemon.
//
// Every call is bounded by Options::timeout. A daemon that ends the session sends SessionEnded
// first; any call after that returns kFailedPrecondition with the daemon's reason.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mkernel/common/status.h"
#include "mkernel/protocol/ring_host.h"
#include "mkernel/protocol/session_wire.h"
#include "mkernel/protocol/shm.h"

namespace mkernel::session::v1 {
class Request;
class Reply;
}  // namespace mkernel::session::v1

namespace mkernel::protocol {

struct ClientRing {
  uint32_t id = 0;
  SharedMapping mapping;
  RingView view;
};

struct ClientRegion {
  uint32_t id = 0;
  SharedMapping mapping;      // host regions (create_region); empty for GPU memory
  uint64_t gpu_address = 0;   // GPU-memory regions (import_region): the device address
  uint64_t gpu_bytes = 0;
  bool gpu() const { return gpu_address != 0; }
  void* data() const { return mapping.data(); }
  size_t size() const { return gpu() ? gpu_bytes : mapping.size(); }
};

// A GPU-memory region for import_region: the allocation's dmabuf descriptor and where the
// region lies in it.
struct GpuRegionSpec {
  uint64_t bytes = 0;
  bool remote_writable = true;
  int dmabuf_fd = -1;          // this process keeps its own copy
  uint64_t dmabuf_offset = 0;
  uint64_t gpu_address = 0;    // device virtual address of the region's first byte
  int32_t cuda_device = 0;
};

struct ClientFlags {
  uint32_t count = 0;
  SharedMapping mapping;
  uint64_t* flags() const { return static_cast<uint64_t*>(mapping.data()); }
};

struct SessionLimits {
  uint32_t max_rings = 0;
  uint64_t max_registered_bytes = 0;
  uint32_t max_commands_in_flight = 0;
  uint32_t max_ring_capacity_log2 = 0;
  uint32_t max_flags = 0;
};

struct ConnectOptions {
  std::string root;   // rank 0's daemon peer address (its SessionClient::peer_address()); "" = ours
  std::string token;  // per-communicator secret, 16..256 bytes, the same on every rank
  std::chrono::milliseconds timeout{0};  // rendezvous bound; 0 = the daemon's default
  bool network_for_local = false;        // route ranks on this daemon through the network too
};

struct RankRoute {
  uint32_t rank = 0;
  std::string node;
  bool network = false;
  uint32_t regions = 0;
  uint32_t flags = 0;
  uint32_t gpu_regions = 0;  // of its regions, how many are GPU memory
};

struct ConnectInfo {
  std::vector<RankRoute> ranks;  // by rank
  std::string transport;
  bool gpu_memory = false;        // the transport can register GPU memory (dmabuf)
  std::string gpu_memory_reason;  // why not, when it cannot
};

class SessionClient {
 public:
  struct Options {
    std::string socket_path;
    std::string client_name = "client";
    int32_t gpu = 0;
    std::string communicator = "default";
    uint32_t rank = 0;
    uint32_t world_size = 1;
    std::chrono::milliseconds timeout{5000};
  };

  static StatusOr<std::unique_ptr<SessionClient>> connect(const Options& options);
  ~SessionClient();

  StatusOr<ClientRing*> create_ring(uint32_t capacity_log2);
  StatusOr<ClientRegion*> create_region(uint64_t bytes, bool remote_writable);
  // Hands the daemon a GPU-memory region (its dmabuf descriptor) for the NIC to reach directly;
  // only where gpu_memory() is true. Refused with the daemon's reason otherwise.
  StatusOr<ClientRegion*> import_region(const GpuRegionSpec& spec);
  StatusOr<ClientFlags*> create_flags(uint32_t count);
  // Joins the communicator across daemons (after every region and the flags were created; the
  // daemon refuses new regions afterwards). Waits for the rendezvous: up to options.timeout, or
  // the daemon's default plus this client's own timeout when that is 0.
  StatusOr<ConnectInfo> connect_communicator(const ConnectOptions& options);
  // Hands the daemon a descriptor (a GPU memory handle) for ranks of this communicator on the
  // same daemon; this process keeps its own copy of `fd`.
  Status share_handle(const std::string& key, int fd);
  // The descriptor rank `rank` shared under `key`; kNotFound when it has not (yet).
  StatusOr<UniqueFd> fetch_handle(uint32_t rank, const std::string& key);
  // Round trip to the daemon; also fails if the daemon's epoch differs from the session's.
  Status ping();
  // Waits up to `wait` for the daemon to say something unasked (SessionEnded) or close the
  // socket. Ok when neither happened.
  Status check_alive(std::chrono::milliseconds wait);
  // Says goodbye and closes the socket; the daemon frees everything.
  void close();

  uint64_t session_id() const { return session_id_; }
  uint64_t epoch() const { return epoch_; }
  uint32_t proxy() const { return proxy_; }
  const SessionLimits& limits() const { return limits_; }
  // The daemon's peer address (what rank 0 hands the other ranks as the root) and node name.
  const std::string& peer_address() const { return peer_address_; }
  const std::string& node() const { return node_; }
  // Whether the proxy's network transport registers GPU memory (import_region); when not, why.
  bool gpu_memory() const { return gpu_memory_; }
  const std::string& gpu_memory_reason() const { return gpu_memory_reason_; }
  int socket_fd() const { return sock_.get(); }

 private:
  SessionClient() = default;
  Status call(const session::v1::Request& req, int expected_fds, session::v1::Reply* reply,
              std::vector<UniqueFd>* fds);
  Status call_for(const session::v1::Request& req, int expected_fds, session::v1::Reply* reply,
                  std::vector<UniqueFd>* fds, std::chrono::milliseconds timeout,
                  const std::vector<int>& send_fds = {});

  Options options_;
  UniqueFd sock_;
  uint64_t next_request_ = 1;
  uint64_t session_id_ = 0;
  uint64_t epoch_ = 0;
  uint32_t proxy_ = 0;
  SessionLimits limits_;
  std::string peer_address_;
  std::string node_;
  bool gpu_memory_ = false;
  std::string gpu_memory_reason_;
  Status ended_;
  std::vector<std::unique_ptr<ClientRing>> rings_;
  std::vector<std::unique_ptr<ClientRegion>> regions_;
  std::vector<std::unique_ptr<ClientFlags>> flags_;
};

}  // namespace mkernel::protocol
