// net_transport.h: the contract between a proxy and a network transport (libfabric, ibverbs,
// the fault-injecting wrapper used by tests).
//
// Design notes
//  1. Threading: a transport object is owned and driven by exactly one proxy thread. No method
//     may be called concurrently; none blocks longer than the bound its comment states. The
//     proxy keeps calling poll() (manual progress) whenever anything is in flight or peers may
//     write to it.
//  2. Ownership: the transport owns every NIC resource it creates (domain or protection domain,
//     endpoints or queue pairs, completion queues, registrations) and releases them in reverse
//     creation order in its destructor. Memory passed to register_memory stays the caller's and
//     must outlive the registration.
//  3. Secrets: endpoint blobs and region descriptors carry addresses and memory keys. They are
//     opaque bytes to everyone but the transport; nobody logs, exports as metrics or returns
//     them over gRPC. Errors name regions by local id, never by key or address.
//  4. Isolation: each Transport instance is one communicator's: its own domain / protection
//     domain and memory-region scope. Remote write access is granted only on registrations
//     made with `remote_writable`.
//  5. Signals: WriteOp may carry a signal (flag index, value). How it reaches the peer is the
//     transport's business: verbs writes the flag after the data on the same RC queue pair
//     (ordered); fabric sends the data as a write with remote CQ data and the *receiving*
//     transport reports an Arrival from its completion queue, on which the receiving proxy
//     raises the flag (EFA's SRD does not order writes). A transport that reports arrivals sets
//     Capabilities::reports_arrivals.
//  6. Failures: every post either returns an error now or later yields exactly one Completion
//     for its cookie, with the provider's reason in the Status when it failed. kUnavailable from
//     post_write means "queue full, poll and retry" (libfabric's -FI_EAGAIN, a full send queue);
//     every other error is final for that write.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "mkernel/common/status.h"

namespace mkernel::daemon::net {

using Blob = std::vector<uint8_t>;

struct Capabilities {
  std::string provider;          // "tcp;ofi_rxm", "shm", "efa", "verbs:mlx5_0", "fault(...)"
  std::string version;           // library / provider version
  bool remote_write = false;     // RMA writes into registered memory
  bool reports_arrivals = false; // see note 5
  bool ordered_writes = false;   // a flag written after data never overtakes it (RC)
  bool self_peer = false;        // add_peer takes this endpoint's own address (a rank writing to
                                 // itself through the NIC); RC queue pairs here do not
  bool dmabuf = false;           // can register GPU memory through a dmabuf descriptor
  std::string dmabuf_reason;     // when it cannot, why (for operators and clients)
  bool needs_host_staging = false;  // GPU data must be staged through pinned host memory
  uint32_t cq_data_bytes = 0;    // size of remote CQ data (fabric), 0 when none
  uint32_t max_inflight = 0;     // writes in flight the transport accepts before kUnavailable
};

enum class MemoryKind : uint8_t { kHost = 0, kDmabuf = 1 };

struct RegisterRequest {
  MemoryKind kind = MemoryKind::kHost;
  void* addr = nullptr;          // kHost: the mapping; kDmabuf: the GPU virtual address
  size_t length = 0;
  int dmabuf_fd = -1;            // kDmabuf only; the caller keeps ownership
  uint64_t dmabuf_offset = 0;
  bool remote_writable = false;  // may peers write into it (note 4)
  int32_t cuda_device = -1;      // kDmabuf only: the CUDA device that owns the memory
};

struct Registration {
  uint64_t local_id = 0;  // names the registration in WriteOp::local_region
  Blob descriptor;        // what a peer imports to write into it; secret (note 3)
};

struct WriteOp {
  uint64_t cookie = 0;          // echoed in the Completion
  uint32_t peer = 0;            // from add_peer
  uint64_t local_region = 0;    // Registration::local_id
  uint64_t local_offset = 0;
  uint64_t remote_region = 0;   // from import_region
  uint64_t remote_offset = 0;
  uint64_t length = 0;          // may be 0 for a signal-only op
  bool has_signal = false;
  uint32_t signal_idx = 0;
  uint64_t signal_value = 0;
};

struct Completion {
  uint64_t cookie = 0;
  Status status;  // ok: the data (and signal) were delivered; else the provider's reason
};

// A signal that arrived from a peer (transports with reports_arrivals).
// Arrival::peer when the provider does not name the sender (libfabric 2.1's tcp;ofi_rxm reports
// no usable source address for writes with remote CQ data, FI_SOURCE granted or not). Nothing
// on the command path depends on it: the flag index and value are what the proxy acts on.
inline constexpr uint32_t kUnknownPeer = UINT32_MAX;

struct Arrival {
  uint32_t peer = 0;  // add_peer's index of the sender, or kUnknownPeer
  uint32_t signal_idx = 0;
  uint64_t signal_value = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;

  virtual const Capabilities& capabilities() const = 0;

  // This endpoint's address for peers (opaque, secret). Does not block.
  virtual StatusOr<Blob> local_address() = 0;
  // Imports a peer's address; returns the peer index WriteOps use. May block for connection
  // setup up to the transport's connect timeout.
  virtual StatusOr<uint32_t> add_peer(std::span<const uint8_t> address) = 0;

  // Registers memory with the NIC (blocks for the registration only).
  virtual StatusOr<Registration> register_memory(const RegisterRequest& request) = 0;
  virtual Status deregister_memory(uint64_t local_id) = 0;
  // Imports a peer's region descriptor; returns the id WriteOp::remote_region names.
  virtual StatusOr<uint64_t> import_region(uint32_t peer, std::span<const uint8_t> descriptor) = 0;

  // Starts a write (and its signal). Never blocks: kUnavailable when queues are full (note 6).
  virtual Status post_write(const WriteOp& op) = 0;
  // Drives progress: appends finished writes to `completions` and arrived signals to
  // `arrivals`; returns how many entries it appended in all. Never blocks.
  virtual size_t poll(std::vector<Completion>* completions, std::vector<Arrival>* arrivals) = 0;
};

}  // namespace mkernel::daemon::net
