// net_transport.h: the one contract between a proxy and whatever carries its commands: the
// in-daemon loopback (daemon/src/loopback_transport.h), libfabric (fabric_transport.h),
// ibverbs (verbs_transport.h) and the fault-injecting wrapper tests put around any of them
// (fault_transport.h).
//
// Design notes
//  1. Threading: a transport object is one endpoint, driven by one thread at a time. Whoever
//     sets it up (a connect worker) may call any member until it hands the object over; after
//     that only the proxy thread of the session that owns it calls it. No member may be called
//     concurrently with another on the same object. Each member states how long it may block;
//     post_write and poll never block. Data path members (post_write, poll, async_error) are
//     also the only ones the proxy calls while writes are in flight; the rest say whether they
//     may be.
//  2. Ownership: the transport owns every resource it creates (domain or protection domain,
//     endpoints or queue pairs, completion queues, registrations) and releases them in reverse
//     creation order in its destructor, which may be called with writes in flight (they are
//     abandoned: no Completion comes for them). Memory passed to register_memory stays the
//     caller's and must stay mapped until deregister_memory returned ok or the transport is
//     destroyed.
//  3. Secrets: endpoint blobs and region descriptors carry addresses and memory keys. They are
//     opaque bytes to everyone but the transport; nobody logs, exports as metrics or returns
//     them over gRPC. Errors name regions and peers by local id or rank, never by key or
//     address.
//  4. Isolation: each Transport instance is one communicator's: its own domain / protection
//     domain and memory-region scope. Remote write access is granted only on registrations
//     made with `remote_writable`; a write whose destination is not writable, belongs to
//     another peer or is out of bounds is refused by post_write before anything moves.
//  5. Addressing (Capabilities::addressing). Network transports name peers by the index
//     add_peer returned and destination regions by the id import_region returned; the blobs
//     travel through the rendezvous. The loopback has nothing to exchange: every rank it can
//     reach uses the same daemon, so it names peers by rank and regions by the owner's region
//     id, and the endpoint set-up members answer kFailedPrecondition.
//  6. Signals: a WriteOp may carry a signal (flag index, value) that must not be seen before
//     the data. How it reaches the peer is Capabilities::signals:
//       kArrivals      the receiving transport reports an Arrival from poll(); the receiving
//                      proxy raises the flag (the only place daemon code raises a flag). fabric
//                      sends it as remote CQ data, or as a message after the data's completion
//                      where the CQ data is too small for the value (EFA's SRD does not order
//                      writes; fabric_transport.h note 3); the loopback hands it to the
//                      destination session's endpoint. Arrivals of one flag may come out of
//                      order; the receiver never lowers a flag.
//       kSignalRegion  the writer's NIC writes the value into the receiver's signal region
//                      after the data (verbs: RC orders the two writes). The receiver names its
//                      flag array with set_signal_region before it publishes its address.
//  7. Failures reach the caller on three paths, nothing is dropped silently:
//       now:    post_write refuses (the op was not started, no Completion will come);
//               kUnavailable means "queue full: poll and retry", every other code is final;
//       later:  exactly one Completion per accepted op, carrying the provider's reason when it
//               failed (a transport whose provider may lose a write reports kDeadlineExceeded
//               for it within its own bound);
//       always: async_error(): the endpoint as a whole failed (its completion queue, the
//               receives that bring peers' signals). From then on every later post fails and
//               every op in flight completes with an error; the owner ends the communicator's
//               session with that reason.
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

// Note 5.
enum class Addressing : uint8_t {
  kEndpoints = 0,  // peers from add_peer, destination regions from import_region
  kRanks = 1,      // peers are ranks, regions are the owner's region ids (loopback)
};

// Note 6.
enum class SignalDelivery : uint8_t {
  kNone = 0,          // the transport carries no signals (post_write refuses a WriteOp with one)
  kArrivals = 1,      // the receiver's poll() reports an Arrival; its proxy raises the flag
  kSignalRegion = 2,  // the writer's NIC writes the flag into the receiver's signal region
};

// What a transport can do. Fixed once the transport is open: capabilities() returns the same
// object for the transport's whole life, may be called from any state (also with writes in
// flight), never blocks and never fails.
struct Capabilities {
  std::string provider;          // "loopback", "tcp;ofi_rxm", "shm", "efa", "verbs:mlx5_0", "fault(...)"
  std::string version;           // library / provider version
  Addressing addressing = Addressing::kEndpoints;
  SignalDelivery signals = SignalDelivery::kNone;
  bool remote_write = false;     // RMA writes into registered memory
  bool ordered_writes = false;   // writes to one peer land in post order, so a later signal-only
                                 // op never overtakes an earlier write (RC, the loopback)
  bool self_peer = false;        // add_peer takes this endpoint's own address (a rank writing to
                                 // itself through the NIC); RC queue pairs here do not
  bool dmabuf = false;           // can register GPU memory through a dmabuf descriptor
  std::string dmabuf_reason;     // when it cannot, why (for operators and clients)
  bool needs_host_staging = false;  // GPU data must be staged through pinned host memory
  uint32_t cq_data_bytes = 0;    // size of remote CQ data (fabric), 0 when none
  uint32_t max_inflight = 0;     // ops in flight the transport accepts before kUnavailable
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
  uint64_t local_id = 0;  // names the registration in WriteOp::local_region; never 0
  Blob descriptor;        // what a peer imports to write into it; secret (note 3)
};

struct WriteOp {
  uint64_t cookie = 0;          // echoed in the Completion; the caller keeps them unique in flight
  uint32_t peer = 0;            // add_peer's index (kEndpoints) or the rank (kRanks)
  uint64_t local_region = 0;    // Registration::local_id (kEndpoints) or region id (kRanks)
  uint64_t local_offset = 0;
  uint64_t remote_region = 0;   // import_region's id (kEndpoints) or the peer's region id (kRanks)
  uint64_t remote_offset = 0;
  uint64_t length = 0;          // may be 0 for a signal-only op (regions are then ignored)
  bool has_signal = false;
  uint32_t signal_idx = 0;
  uint64_t signal_value = 0;
};

struct Completion {
  uint64_t cookie = 0;
  Status status;  // ok: the data is in the destination's memory; else the provider's reason.
                  // With kArrivals the flag is raised by the receiving side after it polled,
                  // which may come after this Completion.
};

// Arrival::peer when the provider does not name the sender (libfabric 2.1's tcp;ofi_rxm reports
// no usable source address for writes with remote CQ data, FI_SOURCE granted or not). Nothing
// on the command path depends on it: the flag index and value are what the proxy acts on.
inline constexpr uint32_t kUnknownPeer = UINT32_MAX;

// A signal that arrived from a peer (SignalDelivery::kArrivals).
struct Arrival {
  uint32_t peer = 0;  // add_peer's index or rank of the sender, or kUnknownPeer
  uint32_t signal_idx = 0;
  uint64_t signal_value = 0;
};

class Transport {
 public:
  // Releases everything (note 2). Writes in flight are abandoned; registrations go with it.
  virtual ~Transport() = default;

  // Note on Capabilities. Any state, any time, never blocks.
  virtual const Capabilities& capabilities() const = 0;

  // ---- endpoint set-up (kEndpoints; kRanks answers kFailedPrecondition) ----

  // This endpoint's address for peers (opaque, secret). Does not block. May be called more than
  // once (same bytes each time), also while writes are in flight; transports that publish
  // set-up state in it (the signal region) freeze that state at the first call.
  virtual StatusOr<Blob> local_address() = 0;
  // Imports a peer's address; returns the peer index WriteOps use. May block for connection
  // set-up up to the transport's connect timeout. Refuses a malformed or foreign blob
  // (kProtocolError / kInvalidArgument) and a peer added twice. May be called while writes to
  // other peers are in flight.
  virtual StatusOr<uint32_t> add_peer(std::span<const uint8_t> address) = 0;

  // Registers memory with the NIC; blocks for the registration only. Host memory by address,
  // GPU memory by dmabuf (Capabilities::dmabuf; otherwise kFailedPrecondition with
  // dmabuf_reason). The descriptor grants remote write only with `remote_writable` (note 4);
  // it is empty otherwise. May be called while writes are in flight.
  virtual StatusOr<Registration> register_memory(const RegisterRequest& request) = 0;
  // Withdraws a registration; blocks for the deregistration only. The rule is the same for
  // every transport:
  //  - kNotFound for an id that is not registered (or was withdrawn);
  //  - kFailedPrecondition, changing nothing, while writes in flight read from it (the NIC may
  //    still be reading), including a write reported timed out whose context the provider has
  //    not returned yet; poll until their Completions came back, then call again;
  //  - kFailedPrecondition for the signal region, which lives as long as the transport;
  //  - peers may be writing into it: that is allowed; their writes fail at their end (an error
  //    Completion, or their own bound) and nothing lands here once this returned ok.
  // After ok the caller may unmap the memory.
  virtual Status deregister_memory(uint64_t local_id) = 0;
  // Imports a peer's region descriptor; returns the id WriteOp::remote_region names. Does not
  // block. kNotFound for a peer not added, kProtocolError for a malformed descriptor. May be
  // called while writes are in flight.
  virtual StatusOr<uint64_t> import_region(uint32_t peer, std::span<const uint8_t> descriptor) = 0;
  // Names registration `local_id` (remote_writable, a whole number of 8-byte slots) as the
  // region peers write signals into: signal i lands in its slot i (note 6). Only transports
  // with SignalDelivery::kSignalRegion take one (others: kFailedPrecondition); it must come
  // before the first local_address(), which publishes it (so before any peer, and before any
  // write), and the region cannot be deregistered afterwards. Does not block.
  virtual Status set_signal_region(uint64_t local_id) = 0;

  // ---- data path (the proxy thread; any time, also with writes in flight) ----

  // Starts a write (and its signal). Never blocks. Either refuses now (note 7: kUnavailable =
  // queue full, poll and retry; anything else final for this op) or accepts, and then exactly
  // one Completion for `op.cookie` comes from a later poll(). The source memory must not change
  // until then; the destination is checked before anything moves (note 4).
  virtual Status post_write(const WriteOp& op) = 0;
  // Drives progress (manual progress: nothing moves between calls for transports that need
  // it): appends finished ops to `completions` and peers' signals to `arrivals` (either may be
  // nullptr to leave them for a later call), and returns how many entries it appended in all.
  // Never blocks; bounded work per call. Completions come in any order.
  virtual size_t poll(std::vector<Completion>* completions, std::vector<Arrival>* arrivals) = 0;
  // Ok while the endpoint works; otherwise the first error that broke it as a whole (note 7),
  // kept for good. Never blocks; cheap enough to call after every poll().
  virtual const Status& async_error() const = 0;
};

}  // namespace mkernel::daemon::net
