// runtime.h: libmkernel, what an application links: a communicator over the local mkerneld,
// its buffers mapped for the GPU, and the device view kernels use (device.cuh).
//
// Design notes
//  1. A Communicator is one rank: one session with the local daemon (on the proxy of its GPU),
//     one command ring, `buffers` regions of the same sizes on every rank (symmetric), one flag
//     array. Everything the daemon hands over (memfd segments) is registered with CUDA as mapped
//     pinned memory, so kernels push commands and read and write buffers and flags directly.
//  2. Where buffers live, decided per transport capability before any buffer exists: when the
//     daemon says its transport registers GPU memory (verbs; libfabric 1.20+ efa/verbs with
//     FI_HMEM) and the GPU exports dmabuf, buffers are GPUDirect-RDMA-capable VMM allocations in
//     GPU memory, handed to the daemon as dmabuf descriptors, and the NIC reads and writes them
//     directly (Staging::kGpuMemory). Otherwise (Debian's libfabric: no CUDA support, no
//     FI_MR_DMABUF) they live in pinned host memory that kernels read and write over PCIe
//     (Staging::kHostPinned). staging() and staging_reason() say which and why; Options::
//     gpu_memory forces either. The ring and the flags always stay in host memory.
//  3. Bootstrap: rank 0 makes a UniqueId (get_unique_id: a fresh communicator id, a random
//     secret token, and its daemon's peer address as the root) and hands it to the other ranks
//     by any means (MPI, torch.distributed, a file); or every rank calls create_from_env with
//     the usual launcher variables. create() returns once every rank joined, within the bound.
//  4. Errors: every host call returns a Status. Device-side errors (bounded waits that expired,
//     pushes refused) land in a status word that check() turns into a Status; so does a
//     daemon that ended the session or went away. A monitor thread watches the daemon
//     connection and marks the ring when the daemon is gone, so GPU waits end at once rather
//     than at their timeout.
//  5. Nothing here calls exit or abort; the destructor says goodbye and unregisters everything.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "mkernel/common/status.h"
#include "mkernel/runtime/device.cuh"

namespace mkernel::protocol {
class SessionClient;
}

namespace mkernel::rt {

// Opaque bootstrap handle, made by rank 0 and copied to every rank (plain bytes).
struct UniqueId {
  std::array<char, 1024> bytes{};
};
std::string to_string(const UniqueId& id);                  // printable, for env variables and files
StatusOr<UniqueId> unique_id_from_string(const std::string& text);

enum class Staging : uint8_t {
  kHostPinned,  // buffers in pinned host memory, mapped into the GPU (note 2)
  kGpuMemory,   // buffers in GPU memory, registered with the NIC through dmabuf (note 2)
};
const char* staging_name(Staging s);

// Whether buffers may, must or must not be GPU memory the NIC reaches (note 2).
enum class GpuMemory : uint8_t {
  kAuto,     // GPU memory where the transport and the GPU allow it, else host staging
  kRequire,  // GPU memory or create() fails, saying why not
  kOff,      // always host staging
};
// "auto", "require", "off" (what MKERNEL_GPU_MEMORY takes).
StatusOr<GpuMemory> gpu_memory_from_string(const std::string& text);

struct Options {
  std::string socket_path = "/run/mkerneld/mkerneld.sock";  // MKERNEL_SOCKET overrides it
  int cuda_device = -1;          // -1: the current device
  int32_t proxy = -1;            // the daemon proxy (GPU index) to use; -1: cuda_device
  std::string client_name = "libmkernel";
  std::chrono::milliseconds timeout{5000};               // each request to the daemon
  std::chrono::milliseconds rendezvous_timeout{60000};   // create(): all ranks joining
  uint64_t device_wait_timeout_ns = 2000000000ull;       // bound on every device-side wait
  uint32_t ring_capacity_log2 = 12;
  uint32_t num_flags = 1024;
  bool network_for_local = false;  // reach ranks on this daemon through the network too
  // Bytes of this rank's NVLink buffer (device memory, CUDA VMM), 0 for none. Ranks on this
  // node (the same daemon) map each other's through handles the daemon brokers; kernels store
  // into peers' buffers directly (DeviceComm::nvl, nvl_signal, nvl_wait). The fused ops keep
  // their symmetric workspace here (e.g. the gathered activation of all_gather_gemm), so size
  // it with the ops' workspace functions (ops.h).
  uint64_t nvlink_bytes = 0;
  // NVLink flags for application kernels (nvl_signal / nvl_wait indices 0..nvlink_flags-1).
  uint32_t nvlink_flags = 512;
  // Flags reserved for the fused ops, in the NVLink buffer and after the num_flags flags of the
  // flag array; disjoint from the application's (comm.cuh note 4). GEMM+ReduceScatter and
  // GEMM+AllReduce flag every tile (about world x M x n / 32768 for large shapes): 65536 covers
  // M x n up to about 2^30 on two ranks; the plan names what it needs when it is short.
  uint32_t fused_flags = 65536;
  // Bytes of a buffer reserved for the fused ops' transfers between nodes (the rail peers'
  // shards or partial sums arrive here), 0 for none; it follows the application's buffers.
  uint64_t network_workspace_bytes = 0;
  // Where buffers live (note 2); MKERNEL_GPU_MEMORY=auto|require|off overrides it.
  GpuMemory gpu_memory = GpuMemory::kAuto;
};

// Rank 0: a new communicator id and token, with the local daemon's peer address as the root.
StatusOr<UniqueId> get_unique_id(const Options& options);

class Communicator {
 public:
  // Joins `size` ranks. `buffer_bytes[i]` is the size of buffer i (the same list on every rank).
  static StatusOr<std::unique_ptr<Communicator>> create(uint32_t rank, uint32_t size, const UniqueId& id,
                                                        const std::vector<uint64_t>& buffer_bytes,
                                                        const Options& options);
  // The launcher's environment: RANK, WORLD_SIZE, LOCAL_RANK (the CUDA device), MASTER_ADDR and
  // MASTER_PORT (name the communicator), MKERNEL_TOKEN (the secret, 16..256 bytes) and
  // MKERNEL_PEER_PORT (the root daemon's peer port on MASTER_ADDR, default 7100).
  static StatusOr<std::unique_ptr<Communicator>> create_from_env(const std::vector<uint64_t>& buffer_bytes,
                                                                 Options options);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  // Enqueues the start of a launch on `stream` (note 2 of device.cuh); capturable.
  Status begin_launch(cudaStream_t stream);
  // The view kernels take (valid while this Communicator lives).
  const DeviceComm& device() const { return device_; }
  // The bounded-wait context of this communicator for kernels that take one by value, e.g. a
  // GEMM waiting on readiness flags (GemmArgs::wait): its errors land in this communicator's
  // status word and its waits end when the ring is stopped or a peer failed.
  kernels::WaitContext wait_context() const;
  // Host pointer of buffer i (the same memory the kernels see); nullptr when buffers are GPU
  // memory (staging() == kGpuMemory): use device_buffer and cudaMemcpy then.
  void* host_buffer(uint32_t i) const;
  // Device pointer of buffer i, whatever the staging (DeviceComm::buffers[i]).
  void* device_buffer(uint32_t i) const;
  uint64_t buffer_bytes(uint32_t i) const;
  // Host view of the flags (read with acquire).
  const uint64_t* host_flags() const;

  // Errors reported since creation: device status word, ring error word, session ended or
  // daemon gone. Ok when none. Does not block.
  Status check() const;
  // The launch counter as the host last saw it (synchronises nothing).
  uint64_t launches_begun() const { return launches_; }

  uint32_t rank() const { return rank_; }
  uint32_t size() const { return size_; }
  Staging staging() const { return staging_; }
  // Why this staging: the transport and GPU that allowed GPU memory, or what did not.
  const std::string& staging_reason() const { return staging_reason_; }
  const std::string& transport() const { return transport_; }
  // Whether rank r is reached through the network transport (else inside the daemon).
  bool through_network(uint32_t r) const { return r < network_.size() && network_[r]; }
  // Whether rank r's NVLink buffer is mapped here (DeviceComm::nvl[r]), and where (the device
  // address of its data, nullptr when it is not mapped).
  bool nvlink_mapped(uint32_t r) const { return nvlink_buffer(r) != nullptr; }
  void* nvlink_buffer(uint32_t r) const { return r < nvl_ptrs_.size() ? nvl_ptrs_[r] : nullptr; }
  // Nodes, by the node name each rank's daemon reports (config node.name, default the host
  // name): node_of(r) numbers them in order of their lowest rank (rank 0's node is 0). Ranks on
  // one daemon share a node; two daemons on one host are two nodes only if named apart.
  uint32_t node_of(uint32_t r) const { return r < node_of_.size() ? node_of_[r] : 0; }
  uint32_t num_nodes() const { return num_nodes_; }
  // The buffer reserved for the fused ops between nodes (Options::network_workspace_bytes), or
  // kNoBuffer.
  uint32_t network_workspace() const { return network_workspace_; }
  static constexpr uint32_t kNoBuffer = kernels::kNoBuffer;
  // The stream-ordered device memory the fused ops keep their launch bookkeeping in is
  // DeviceComm::fused_state; one fused op at a time per communicator (stream order).
  int cuda_device() const;
  // The bound of collective setup steps (create(), the fused ops' agreement).
  std::chrono::milliseconds rendezvous_timeout() const { return rendezvous_timeout_; }
  // The sequence number of the fused ops' next agreement between the ranks (which of the two
  // agreement banks it uses: kernels/common/comm.cuh); every rank agrees in the same order.
  uint64_t next_agreement() { return agreements_++; }
  // Memory the agreement exchanges its table through, agreement_scratch_words 32-bit words each,
  // allocated with the communicator: device memory for its kernel, pinned host memory for the
  // copies. Not allocated per agreement, and never pageable: ranks that share a GPU in one
  // process share its context, where a copy to or from pageable memory may wait for another
  // stream's copy, which waits behind that rank's agreement kernel, which waits for this rank's
  // words (and a stream-ordered allocation may make this stream wait for another stream's
  // queued free likewise). Either would hold this rank's words back until the other gives up.
  uint32_t* agreement_scratch() const { return agreement_scratch_; }
  uint32_t* agreement_host_scratch() const { return agreement_host_; }
  static size_t agreement_scratch_words(uint32_t size) {
    return size_t{kernels::kAgreeWords} * (size + 1) + 3 * size_t{size} + 1;
  }
  // Plans the one-call fused ops keep per shape (ops.h), owned by and dropped with the
  // communicator.
  std::shared_ptr<void>& op_slot(const std::string& key) { return op_cache_[key]; }

 private:
  Communicator() = default;
  Status setup_buffers(const std::vector<uint64_t>& buffer_bytes, GpuMemory mode);
  Status setup_nvlink(const Options& options);
  Status map_nvlink_peers(const Options& options);
  Status setup(uint32_t rank, uint32_t size, const UniqueId& id, const std::vector<uint64_t>& buffer_bytes,
               const Options& options);
  void monitor();

  struct Impl;
  std::unique_ptr<Impl> impl_;
  DeviceComm device_{};
  uint32_t rank_ = 0, size_ = 1;
  uint64_t launches_ = 0;
  uint64_t agreements_ = 0;
  uint32_t* agreement_scratch_ = nullptr;  // owned by Impl
  uint32_t* agreement_host_ = nullptr;     // owned by Impl (pinned)
  std::string transport_;
  Staging staging_ = Staging::kHostPinned;
  std::string staging_reason_;
  std::vector<bool> network_;
  std::vector<void*> nvl_ptrs_;  // host copy of DeviceComm::nvl
  std::vector<uint32_t> node_of_;
  uint32_t num_nodes_ = 1;
  uint32_t network_workspace_ = kNoBuffer;
  std::chrono::milliseconds rendezvous_timeout_{60000};
  std::map<std::string, std::shared_ptr<void>> op_cache_;
  std::thread monitor_;
  std::atomic<bool> stop_{false};
};

}  // namespace mkernel::rt
