// control.h: what the daemon core offers to its operations surface (the gRPC admin and health
// services, the Prometheus exporter, systemd notification). The operations code only reads
// snapshots and calls these methods; it never reaches into proxies or sessions.
//
// Contract for every method: thread-safe, callable from any thread at any time after the
// daemon started serving; never blocks on a proxy's polling loop; returns within milliseconds.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "mkernel/common/status.h"

namespace mkernel::daemon {

// Command latency, from the moment a proxy takes a record off a ring to its completion.
// Bucket i counts completions with latency < 2^i ns (the last bucket takes everything above).
inline constexpr size_t kLatencyBuckets = 32;

enum class Outcome : uint8_t { kOk = 0, kError = 1, kRejected = 2 };
inline constexpr size_t kNumOutcomes = 3;
inline constexpr const char* kOutcomeNames[kNumOutcomes] = {"ok", "error", "rejected"};

struct ProxyStats {
  uint32_t gpu = 0;                 // the proxy's GPU index (or host slot)
  std::string name;                 // "gpu0" or "host0"
  std::string transport;            // "loopback", "fabric:tcp;ofi_rxm", "verbs:mlx5_0", ...
  std::string nic;                  // NIC name, or "" when none
  uint64_t consumed = 0;            // records taken = ok + error + rejected (+ in flight)
  std::array<uint64_t, kNumOutcomes> by_outcome{};
  uint64_t in_flight = 0;           // posted, not yet completed
  uint64_t bytes = 0;               // payload bytes of completed-ok writes
  uint64_t errors = 0;              // transport errors reported to sessions
  uint64_t ring_occupancy = 0;      // records waiting in this proxy's rings now
  uint64_t ring_capacity = 0;       // slots in this proxy's rings
  uint32_t sessions = 0;
  uint32_t rings = 0;
  std::array<uint64_t, kLatencyBuckets> latency_ns_log2{};
  double seconds_since_heartbeat = 0;  // how long ago the polling thread last checked in
  bool alive = false;                  // checked in within the health bound
};

struct ClientInfo {
  uint64_t session_id = 0;
  int32_t pid = 0;
  uint32_t uid = 0;
  uint32_t gid = 0;
  std::string name;
  std::string communicator;
  uint32_t rank = 0;
  uint32_t world_size = 0;
  uint32_t gpu = 0;
  uint32_t rings = 0;
  uint32_t regions = 0;
  uint64_t registered_bytes = 0;
  uint64_t commands = 0;       // consumed from this client's rings
  double connected_seconds = 0;
};

// How many times clients were refused, by reason (refusals.h: the kinds of refusal that are not
// a limit, then one per limit, named by its config key). Every reason is listed, zeros too.
struct RefusalCount {
  std::string reason;
  uint64_t count = 0;
};

// What clients hold against the node's limits, and what the process uses.
struct ResourceUsage {
  uint64_t sessions = 0;            // connections with a session (from accept)
  uint64_t max_sessions = 0;        // clients.max_sessions
  uint64_t client_descriptors = 0;  // descriptors held for clients
  uint64_t descriptor_budget = 0;   // their budget: clients.max_descriptors, or less (limit)
  uint64_t open_descriptors = 0;    // the whole process's open descriptors
  uint64_t descriptor_limit = 0;    // the process's RLIMIT_NOFILE
  uint64_t shared_memory = 0;       // bytes of rings, host regions and flags made for clients
  uint64_t max_shared_memory = 0;   // clients.max_shared_memory
  uint64_t rings = 0;
  uint64_t regions = 0;
  uint64_t resident_bytes = 0;      // the process's resident memory (VmRSS)
};

struct DaemonStatus {
  std::string node_name;
  std::string version;          // mkernel version
  uint32_t protocol_version = 0;
  uint64_t epoch = 0;
  int32_t pid = 0;
  double uptime_seconds = 0;
  bool draining = false;
  std::string config_source;    // file path, or "built-in default"
  uint64_t config_generation = 0;  // +1 on every applied reload
  std::string runtime_dir;
  std::string client_socket;
  uint32_t sessions = 0;
  std::vector<std::string> proxies;  // names
  std::vector<RefusalCount> refusals;
  ResourceUsage usage;
};

// Health as the grpc.health.v1 service reports it: one entry per service name.
struct HealthEntry {
  std::string service;  // "" (whole server), "mkerneld.gpu<N>", "mkerneld.nic.<name>"
  bool serving = false;
  std::string reason;   // why not serving, for logs and mkerneldctl
};

struct ReloadResult {
  Status status;                               // ok when applied
  bool applied = false;
  std::vector<std::string> needs_restart;      // changed fields that take effect on restart only
  std::vector<std::string> applied_changes;    // fields applied now
};

class DaemonControl {
 public:
  virtual ~DaemonControl() = default;

  virtual DaemonStatus status() const = 0;
  virtual std::vector<ProxyStats> stats() const = 0;
  virtual std::vector<ClientInfo> clients() const = 0;
  // Refusals by reason, and what clients hold against the node's limits (also in status()).
  virtual std::vector<RefusalCount> refusals() const = 0;
  virtual ResourceUsage usage() const = 0;
  // Whole server first, then each GPU, then each NIC. A drain, or a proxy that has not checked
  // in within its bound, makes the affected entries (and the whole server) NOT_SERVING.
  virtual std::vector<HealthEntry> health() const = 0;

  // Drain: refuse new sessions; existing ones keep running. Idempotent.
  virtual Status drain() = 0;
  virtual Status undrain() = 0;
  // Reload from `path` (empty: the file the daemon was started with). The whole file is
  // validated first; on any error the running config is kept.
  virtual ReloadResult reload(const std::string& path) = 0;

  // Test hook (only when started with --enable-test-hooks; otherwise kFailedPrecondition):
  // make proxy `gpu`'s polling thread stop checking in for `duration`.
  virtual Status stall_proxy(uint32_t gpu, std::chrono::milliseconds duration) = 0;

  // For the systemd watchdog: true while every proxy thread checked in within its bound.
  virtual bool all_proxies_alive() const = 0;

  // The admin and health service or the metrics endpoint had no descriptor to accept a
  // connection with (it was answered and closed, spare_fd.h): counted with the client socket's
  // as refusal out_of_descriptors, and logged at most a few times a second. `why` names the
  // endpoint and the error.
  virtual void count_out_of_descriptors(const Status& why) = 0;
};

}  // namespace mkernel::daemon
