// config.h: mkerneld's configuration: the plain struct the daemon runs with, the loader that
// turns a YAML file into it, and the rules for reloading it.
//
// Design notes
//  1. The YAML schema mirrors the struct one to one (docs/config.md lists every key). The struct
//     holds data only: nothing here looks at the machine. Choices the daemon resolves at start
//     from the topology ("all" GPUs, transport "auto", CPU affinity "auto") stay symbolic.
//  2. The whole file is validated at load and every problem is reported, not just the first. An
//     error names the key (dotted path, list items as `gpus.ids[2]`), the bad value and what was
//     expected, and points at the line and column of the value. A config is returned only when
//     there is no error at all, so a daemon never runs with a half-applied file.
//  3. Unknown keys are errors: a misspelt key silently falling back to its default is the worst
//     kind of config bug. The nearest known key is suggested.
//  4. Nothing in this library throws across its API, exits or aborts; yaml-cpp's exceptions are
//     caught inside and become errors.
//  5. Reload: a field is either hot (applied to a running daemon) or needs a restart.
//     restart_required_changes() names the restart fields that differ; hot_reloaded() builds the
//     config a daemon should run with after a reload that keeps its restart fields.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace mkernel::config {

// ---- enums ----------------------------------------------------------------------------------

// Which GPUs get a proxy.
enum class GpuSelect : uint8_t {
  kAll,        // every GPU the daemon finds; with none, `fallback_host_slots` host-only slots
  kList,       // exactly the GPU ids in `ids`
  kHostSlots,  // no GPU: `host_slots` proxies served by host threads (development, CI)
};

enum class PollMode : uint8_t {
  kSpin,    // busy-poll all the time: lowest latency, one core per proxy
  kHybrid,  // busy-poll for `spin` after the last command, then poll every `sleep`
};

enum class TransportKind : uint8_t {
  kAuto,    // chosen per GPU at start from the topology (see docs/config.md)
  kVerbs,   // libibverbs, InfiniBand/RoCE RC queue pairs
  kFabric,  // libfabric RDM endpoints (efa, tcp;ofi_rxm, shm, ...)
};

// How a fabric transport carries a signal's 64-bit value (daemon/transport/fabric_transport.h,
// SignalValuePath; docs/transports.md "Signals and CQ data").
enum class SignalValue : uint8_t {
  kAuto,     // cq_data where the provider's CQ data has 8 bytes, message where less (EFA)
  kCqData,   // packed into the write's remote CQ data: one operation, 40 or 12 value bits
  kMessage,  // the whole value in a message after the data's delivery-complete completion
};

enum class CpuAffinityMode : uint8_t {
  kAuto,  // the CPUs of the NUMA node nearest the GPU (and its NIC)
  kNone,  // no pinning: the scheduler decides
  kList,  // exactly the CPUs in `cpus`
};

enum class LogLevel : uint8_t { kTrace, kDebug, kInfo, kWarn, kError };
enum class LogFormat : uint8_t { kText, kJson };

enum class ListenKind : uint8_t { kUnix, kTcp };

// ---- the struct -----------------------------------------------------------------------------

struct NodeConfig {
  std::string name;                         // "" = the host name
  std::string runtime_dir = "/run/mkerneld";  // absolute; sockets live here
  bool operator==(const NodeConfig&) const = default;
};

struct GpuSelection {
  GpuSelect select = GpuSelect::kAll;
  std::vector<uint32_t> ids;         // kList only: distinct GPU ids
  uint32_t host_slots = 1;           // kHostSlots only: number of host-only proxies
  uint32_t fallback_host_slots = 1;  // kAll only: host-only proxies when no GPU is found;
                                     // 0 = refuse to start without a GPU
  bool operator==(const GpuSelection&) const = default;
};

struct CpuAffinity {
  CpuAffinityMode mode = CpuAffinityMode::kAuto;
  std::vector<uint32_t> cpus;  // kList only: sorted, distinct CPU ids
  bool operator==(const CpuAffinity&) const = default;
};

struct PollConfig {
  PollMode mode = PollMode::kHybrid;
  std::chrono::microseconds spin{1000};  // kHybrid: busy-poll this long after the last command
  std::chrono::microseconds sleep{20};   // kHybrid: then poll this often
  bool operator==(const PollConfig&) const = default;
};

struct BatchConfig {
  // Most commands a proxy takes from one ring before it looks at the next one; also the most
  // work requests it hands the NIC in one post.
  uint32_t max_commands = 64;
  bool operator==(const BatchConfig&) const = default;
};

struct ProxyConfig {
  CpuAffinity cpu_affinity;
  PollConfig poll;
  BatchConfig batch;
  bool operator==(const ProxyConfig&) const = default;
};

inline constexpr uint64_t kAutoWritePieceBytes = ~uint64_t{0};  // TransportConfig::write_piece_bytes "auto"
inline constexpr uint64_t kMinWritePieceBytes = 4096;
inline constexpr uint64_t kMaxWritePieceBytes = uint64_t{1} << 30;

struct TransportConfig {
  TransportKind kind = TransportKind::kAuto;
  std::string provider = "auto";  // libfabric provider ("efa", "tcp;ofi_rxm", "shm") or "auto";
                                  // always "auto" when kind is kVerbs
  std::string nic = "auto";       // device name ("mlx5_0", "rdmap79s0", "eth0") or "auto"
  SignalValue signal_value = SignalValue::kAuto;  // fabric only; always kAuto when kind is kVerbs
  // fabric only: writes longer than this go to the provider in pieces of this size, one at a time
  // and in post order (docs/transports.md); kAutoWritePieceBytes = the provider's default (1 MiB
  // for shm, whole writes for the others), 0 = whole writes. Always auto when kind is kVerbs.
  uint64_t write_piece_bytes = kAutoWritePieceBytes;
  bool operator==(const TransportConfig&) const = default;
};

// Settings for one GPU (or host slot) that differ from the node-wide ones. Each present part is
// complete: keys not written in the file were filled in from the node-wide section.
struct GpuOverride {
  uint32_t gpu = 0;
  std::optional<CpuAffinity> cpu_affinity;
  std::optional<PollConfig> poll;
  std::optional<BatchConfig> batch;
  std::optional<TransportConfig> transport;
  bool operator==(const GpuOverride&) const = default;
};

struct RingConfig {
  uint32_t capacity = 4096;  // slots per command ring; a power of two in 2..2^20
  // The largest ring a client may ask for (a power of two, at least `capacity`): ring memory is
  // the client's command slots (64 bytes each) plus a 512-byte header.
  uint32_t max_capacity = 65536;
  bool operator==(const RingConfig&) const = default;
};

// What one client session may hold.
struct ClientQuota {
  uint32_t rings = 16;                             // command rings one session may hold
  uint32_t regions = 256;                          // regions (host or GPU memory) of one session
  uint64_t registered_bytes = uint64_t{256} << 30;  // memory one session may register
  uint32_t inflight_commands = 4096;               // commands of one session taken, not done
  bool operator==(const ClientQuota&) const = default;
};

// What the sessions of one user (uid), or of one client process (pid), may hold together, so
// that one client cannot take the slots, descriptors or memory the others need.
struct ShareQuota {
  uint32_t sessions = 0;          // connections, counted from accept (before the hello)
  uint32_t sessions_per_gpu = 0;  // sessions bound to one GPU
  uint32_t rings = 0;
  uint32_t regions = 0;
  uint64_t shared_memory = 0;     // memory the daemon makes for them: rings, host regions, flags
  uint32_t descriptors = 0;       // descriptors the daemon holds for them (see docs/operations.md)
  uint32_t networks = 0;          // sessions with a network endpoint (connected across daemons)
  bool operator==(const ShareQuota&) const = default;
};

struct ClientsConfig {
  uint32_t max_per_gpu = 64;                               // sessions bound to one GPU at a time
  uint32_t max_sessions = 1024;                            // sessions on the node, from accept
  uint32_t max_descriptors = 8192;                         // descriptors held for all clients
  uint64_t max_shared_memory = uint64_t{256} << 30;        // shared memory made for all clients
  uint32_t max_queued_replies = 64;                        // replies waiting for one slow reader
  // Sessions with a network endpoint on the node: an endpoint holds what its provider allocates
  // (about 67 MiB with libfabric's tcp;ofi_rxm), so they are counted apart.
  uint32_t max_networks = 64;
  ClientQuota quota;                                       // one session
  ShareQuota per_uid{256, 32, 1024, 8192, uint64_t{128} << 30, 4096, 32};
  ShareQuota per_process{64, 16, 256, 2048, uint64_t{64} << 30, 1024, 8};
  bool operator==(const ClientsConfig&) const = default;
};

// Descriptors the daemon keeps for itself, outside every client budget: the admin, health,
// metrics and peer listeners and their connections, gRPC's and the transports' own, the
// config file on reload. The process needs RLIMIT_NOFILE >= clients.max_descriptors + this.
inline constexpr uint32_t kReservedDescriptors = 1024;
// The reserve under a descriptor limit: kReservedDescriptors, or a quarter of a limit below
// 4 * kReservedDescriptors (so a small limit still leaves clients three quarters).
inline constexpr uint64_t reserved_descriptors(uint64_t limit) {
  return limit / 4 < kReservedDescriptors ? limit / 4 : kReservedDescriptors;
}

struct TimeoutConfig {
  std::chrono::milliseconds handshake{5000};     // a new client's hello on the socket
  std::chrono::milliseconds rendezvous{120000};  // exchanging endpoints with peer daemons
  std::chrono::milliseconds connect{30000};      // one transport connection to a peer
  std::chrono::milliseconds command{30000};      // one posted command to complete
  std::chrono::milliseconds drain{30000};        // in-flight work to finish on drain/stop
  bool operator==(const TimeoutConfig&) const = default;
};

struct ClientSocketConfig {
  std::string path = "mkerneld.sock";  // absolute, or relative to node.runtime_dir
  std::string group;                   // "" = the daemon's group; a name or a numeric gid
  uint32_t mode = 0660;                // permission bits of the socket file
  // Credential allow list checked on every connection (SO_PEERCRED). Both empty: anyone the
  // socket's permissions let in. Otherwise the peer's uid must be in allowed_uids or its gid in
  // allowed_gids.
  std::vector<uint32_t> allowed_uids;
  std::vector<uint32_t> allowed_gids;
  bool operator==(const ClientSocketConfig&) const = default;
};

struct ListenAddress {
  ListenKind kind = ListenKind::kUnix;
  std::string path;  // kUnix: absolute, or relative to node.runtime_dir
  std::string host;  // kTcp: host name, IPv4 address or IPv6 address (without brackets)
  uint16_t port = 0;  // kTcp
  bool operator==(const ListenAddress&) const = default;
};

struct TlsConfig {
  std::string cert;       // PEM certificate chain (absolute path); needed for TCP listeners
  std::string key;        // PEM private key (absolute path); needed for TCP listeners
  std::string client_ca;  // optional: require client certificates signed by this CA
  bool operator==(const TlsConfig&) const = default;
};

struct GrpcConfig {
  std::vector<ListenAddress> listen{ListenAddress{ListenKind::kUnix, "admin.sock", "", 0}};
  std::string socket_group;  // group of unix: sockets; "" = the daemon's group
  uint32_t socket_mode = 0600;
  TlsConfig tls;
  bool operator==(const GrpcConfig&) const = default;
};

// The peer service: rendezvous between the daemons of different nodes (protocol/proto/
// peer.proto). Every call carries its communicator's secret token, so TCP is allowed without
// TLS here; keep TCP listeners on the cluster's private network.
struct PeerConfig {
  std::vector<ListenAddress> listen{ListenAddress{ListenKind::kUnix, "peer.sock", "", 0}};
  std::string advertise;        // "" = first listen entry; else "unix:PATH" or "tcp:HOST:PORT"
  uint32_t max_forming = 1024;  // communicators whose rendezvous is in progress here at once
  bool operator==(const PeerConfig&) const = default;
};

struct LoggingConfig {
  LogLevel level = LogLevel::kInfo;
  LogFormat format = LogFormat::kText;
  bool operator==(const LoggingConfig&) const = default;
};

struct MetricsConfig {
  bool enabled = false;
  std::string host = "127.0.0.1";  // Prometheus text format over HTTP at /metrics
  uint16_t port = 9464;
  bool operator==(const MetricsConfig&) const = default;
};

struct DaemonConfig {
  NodeConfig node;
  GpuSelection gpus;
  ProxyConfig proxy;          // node-wide proxy settings
  TransportConfig transport;  // node-wide transport settings
  std::vector<GpuOverride> overrides;
  RingConfig rings;
  ClientsConfig clients;
  TimeoutConfig timeouts;
  ClientSocketConfig client_socket;
  GrpcConfig grpc;
  PeerConfig peer;
  LoggingConfig logging;
  MetricsConfig metrics;
  bool operator==(const DaemonConfig&) const = default;
};

// The built-in config, used when mkerneld starts without a file. It starts and serves on a
// machine with no GPU (one host-only slot) and no RDMA device (transport "auto" falls back to
// libfabric's tcp provider). Equal to loading an empty file.
DaemonConfig default_config();

// ---- loading --------------------------------------------------------------------------------

struct ConfigError {
  std::string source;    // file name or the source_name given to load_config_string
  int line = 0;          // 1-based; 0 = no position (the file could not be read, ...)
  int column = 0;        // 1-based; 0 with line 0
  std::string key;       // dotted path: "clients.quota.rings", "gpus.ids[2]"; "" = document
  std::string value;     // the bad value as written (flow YAML for lists and maps)
  std::string expected;  // what would have been accepted
  // The whole message, for example:
  //   mkerneld.yaml:12:13: rings.capacity: value "1000" is invalid; expected a power of two in
  //   2..1048576
  //   mkerneld.yaml:4:3: unknown key "rings.capcity"; did you mean "rings.capacity"?
  std::string message;
};

struct LoadResult {
  std::optional<DaemonConfig> config;  // set if and only if `errors` is empty
  std::vector<ConfigError> errors;     // in file order

  bool ok() const { return config.has_value(); }
  std::string error_text() const;  // every message, one per line
};

// Reads and validates a YAML file. Errors are prefixed with `path` as given. An empty file (or
// one holding only comments) gives default_config().
LoadResult load_config_file(const std::string& path);

// The same for text already in memory; `source_name` prefixes every message.
LoadResult load_config_string(std::string_view yaml, std::string_view source_name);

// Every key the loader accepts, as dotted paths in schema order; the keys of list items are
// written `overrides[].gpu`.
const std::vector<std::string>& known_keys();

// ---- writing --------------------------------------------------------------------------------

// YAML that loads back into an equal config (for `mkerneld --print-default-config`). Keys that do
// not apply are left out (gpus.ids unless select is "list", and so on), so a config holding
// values the loader would refuse there does not survive the trip.
std::string to_yaml(const DaemonConfig& config);

// ---- reload ---------------------------------------------------------------------------------

// Dotted names of the fields that differ between `old_config` and `new_config` and need a
// restart to take effect (runtime directory, sockets, gRPC and peer listeners, the advertised
// peer address, GPU selection, transport, CPU affinity, ring capacity, metrics endpoint; per GPU
// as `overrides[gpu=1].transport`).
// Empty: the new config can be applied to a running daemon as a whole.
std::vector<std::string> restart_required_changes(const DaemonConfig& old_config,
                                                  const DaemonConfig& new_config);

// The config a running daemon continues with after reloading `loaded`: the hot fields (logging,
// quotas, client limits, allow lists, timeouts, polling, batching, peer.max_forming) from
// `loaded`, everything that needs a restart from `running`. restart_required_changes(running,
// result) is empty.
DaemonConfig hot_reloaded(const DaemonConfig& running, const DaemonConfig& loaded);

// ---- helpers for the daemon -----------------------------------------------------------------

// Settings of the proxy serving `gpu` (a GPU id or a host slot index): the node-wide ones with
// that GPU's override applied.
struct ProxySettings {
  CpuAffinity cpu_affinity;
  PollConfig poll;
  BatchConfig batch;
  TransportConfig transport;
  bool operator==(const ProxySettings&) const = default;
};
ProxySettings proxy_settings(const DaemonConfig& config, uint32_t gpu);

// `path` if absolute, otherwise joined to node.runtime_dir.
std::string runtime_path(const DaemonConfig& config, const std::string& path);

// The client socket's full path.
std::string client_socket_path(const DaemonConfig& config);

// A listen address (of grpc.listen or peer.listen) as a gRPC server URI:
// "unix:/run/mkerneld/admin.sock", "0.0.0.0:50051", "[::1]:50051".
std::string grpc_uri(const DaemonConfig& config, const ListenAddress& address);

// The address peers dial, as a gRPC target: "unix:/abs/path" or "host:port" ("[v6]:port").
// peer.advertise if set, otherwise the first peer.listen entry; unix paths are resolved against
// node.runtime_dir. "" only for a config the loader would refuse (no peer.listen entry, or a
// peer.advertise that does not parse).
std::string peer_advertise_target(const DaemonConfig& config);

// A listen address as written in the file: "unix:admin.sock", "tcp:[::]:50051".
std::string to_string(const ListenAddress& address);

std::string_view to_string(GpuSelect v);
std::string_view to_string(PollMode v);
std::string_view to_string(TransportKind v);
std::string_view to_string(SignalValue v);
std::string_view to_string(LogLevel v);
std::string_view to_string(LogFormat v);

// Longest path a Unix socket can have (sun_path holds 108 bytes with the terminating NUL).
inline constexpr size_t kMaxSocketPathBytes = 107;

}  // namespace mkernel::config
