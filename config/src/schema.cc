// schema.cc: the key table of the config file (see schema.h and docs/config.md).
#include "schema.h"

#include <array>
#include <string>

namespace mkernel::config::detail {
namespace {

using namespace std::string_view_literals;

constexpr std::array kTopKeys{"node"sv,          "gpus"sv,  "proxy"sv,   "transport"sv,
                              "overrides"sv,     "rings"sv, "clients"sv, "timeouts"sv,
                              "client_socket"sv, "grpc"sv,  "peer"sv,    "logging"sv,
                              "metrics"sv};
constexpr std::array kNodeKeys{"name"sv, "runtime_dir"sv};
constexpr std::array kGpusKeys{"select"sv, "ids"sv, "host_slots"sv, "fallback_host_slots"sv};
constexpr std::array kProxyKeys{"cpu_affinity"sv, "poll"sv, "batch"sv};
constexpr std::array kPollKeys{"mode"sv, "spin_us"sv, "sleep_us"sv};
constexpr std::array kBatchKeys{"max_commands"sv};
constexpr std::array kTransportKeys{"kind"sv, "provider"sv, "nic"sv, "signal_value"sv, "write_piece_bytes"sv};
constexpr std::array kOverrideKeys{"gpu"sv, "cpu_affinity"sv, "poll"sv, "batch"sv,
                                   "transport"sv};
constexpr std::array kRingsKeys{"capacity"sv, "max_capacity"sv};
constexpr std::array kClientsKeys{"max_per_gpu"sv,        "max_sessions"sv,       "max_descriptors"sv,
                                  "max_shared_memory"sv,  "max_queued_replies"sv, "max_networks"sv,
                                  "quota"sv,              "per_uid"sv,            "per_process"sv};
constexpr std::array kQuotaKeys{"rings"sv, "regions"sv, "registered_bytes"sv,
                                "inflight_commands"sv};
constexpr std::array kShareKeys{"sessions"sv,      "sessions_per_gpu"sv, "rings"sv,   "regions"sv,
                                "shared_memory"sv, "descriptors"sv,      "networks"sv};
constexpr std::array kTimeoutKeys{"handshake_ms"sv, "rendezvous_ms"sv, "connect_ms"sv,
                                  "command_ms"sv, "drain_ms"sv};
constexpr std::array kClientSocketKeys{"path"sv, "group"sv, "mode"sv, "allowed_uids"sv,
                                       "allowed_gids"sv};
constexpr std::array kGrpcKeys{"listen"sv, "socket_group"sv, "socket_mode"sv, "tls"sv};
constexpr std::array kTlsKeys{"cert"sv, "key"sv, "client_ca"sv};
constexpr std::array kPeerKeys{"listen"sv, "advertise"sv, "max_forming"sv};
constexpr std::array kLoggingKeys{"level"sv, "format"sv};
constexpr std::array kMetricsKeys{"enabled"sv, "listen"sv};

const std::array kSections{
    SectionSchema{""sv, kTopKeys},
    SectionSchema{"node"sv, kNodeKeys},
    SectionSchema{"gpus"sv, kGpusKeys},
    SectionSchema{"proxy"sv, kProxyKeys},
    SectionSchema{"proxy.poll"sv, kPollKeys},
    SectionSchema{"proxy.batch"sv, kBatchKeys},
    SectionSchema{"transport"sv, kTransportKeys},
    SectionSchema{"overrides[]"sv, kOverrideKeys},
    SectionSchema{"overrides[].poll"sv, kPollKeys},
    SectionSchema{"overrides[].batch"sv, kBatchKeys},
    SectionSchema{"overrides[].transport"sv, kTransportKeys},
    SectionSchema{"rings"sv, kRingsKeys},
    SectionSchema{"clients"sv, kClientsKeys},
    SectionSchema{"clients.quota"sv, kQuotaKeys},
    SectionSchema{"clients.per_uid"sv, kShareKeys},
    SectionSchema{"clients.per_process"sv, kShareKeys},
    SectionSchema{"timeouts"sv, kTimeoutKeys},
    SectionSchema{"client_socket"sv, kClientSocketKeys},
    SectionSchema{"grpc"sv, kGrpcKeys},
    SectionSchema{"grpc.tls"sv, kTlsKeys},
    SectionSchema{"peer"sv, kPeerKeys},
    SectionSchema{"logging"sv, kLoggingKeys},
    SectionSchema{"metrics"sv, kMetricsKeys},
};

constexpr std::array<std::pair<std::string_view, GpuSelect>, 3> kGpuSelect{{
    {"all", GpuSelect::kAll}, {"list", GpuSelect::kList}, {"host_slots", GpuSelect::kHostSlots}}};
constexpr std::array<std::pair<std::string_view, PollMode>, 2> kPollMode{{
    {"spin", PollMode::kSpin}, {"hybrid", PollMode::kHybrid}}};
constexpr std::array<std::pair<std::string_view, TransportKind>, 3> kTransportKind{{
    {"auto", TransportKind::kAuto}, {"verbs", TransportKind::kVerbs},
    {"fabric", TransportKind::kFabric}}};
constexpr std::array<std::pair<std::string_view, SignalValue>, 3> kSignalValue{{
    {"auto", SignalValue::kAuto}, {"cq_data", SignalValue::kCqData}, {"message", SignalValue::kMessage}}};
constexpr std::array<std::pair<std::string_view, LogLevel>, 5> kLogLevel{{
    {"trace", LogLevel::kTrace}, {"debug", LogLevel::kDebug}, {"info", LogLevel::kInfo},
    {"warn", LogLevel::kWarn}, {"error", LogLevel::kError}}};
constexpr std::array<std::pair<std::string_view, LogFormat>, 2> kLogFormat{{
    {"text", LogFormat::kText}, {"json", LogFormat::kJson}}};

void collect_keys(std::string_view pattern, std::vector<std::string>& out) {
  const SectionSchema* section = find_section(pattern);
  for (const std::string_view key : section->keys) {
    const std::string path = pattern.empty() ? std::string(key) : std::string(pattern) + "." +
                                                                      std::string(key);
    if (find_section(path) != nullptr) {
      collect_keys(path, out);
    } else if (find_section(path + "[]") != nullptr) {
      collect_keys(path + "[]", out);
    } else {
      out.push_back(path);
    }
  }
}

template <typename E, size_t N>
std::string_view name_of(const std::array<std::pair<std::string_view, E>, N>& table, E v) {
  for (const auto& [name, value] : table) {
    if (value == v) return name;
  }
  return "?";
}

}  // namespace

std::span<const SectionSchema> sections() { return kSections; }

const SectionSchema* find_section(std::string_view pattern) {
  for (const SectionSchema& s : kSections) {
    if (s.pattern == pattern) return &s;
  }
  return nullptr;
}

EnumNames<GpuSelect> gpu_select_names() { return kGpuSelect; }
EnumNames<PollMode> poll_mode_names() { return kPollMode; }
EnumNames<TransportKind> transport_kind_names() { return kTransportKind; }
EnumNames<SignalValue> signal_value_names() { return kSignalValue; }
EnumNames<LogLevel> log_level_names() { return kLogLevel; }
EnumNames<LogFormat> log_format_names() { return kLogFormat; }

}  // namespace mkernel::config::detail

namespace mkernel::config {

const std::vector<std::string>& known_keys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> out;
    detail::collect_keys("", out);
    return out;
  }();
  return keys;
}

std::string_view to_string(GpuSelect v) { return detail::name_of(detail::kGpuSelect, v); }
std::string_view to_string(PollMode v) { return detail::name_of(detail::kPollMode, v); }
std::string_view to_string(TransportKind v) { return detail::name_of(detail::kTransportKind, v); }
std::string_view to_string(SignalValue v) { return detail::name_of(detail::kSignalValue, v); }
std::string_view to_string(LogLevel v) { return detail::name_of(detail::kLogLevel, v); }
std::string_view to_string(LogFormat v) { return detail::name_of(detail::kLogFormat, v); }

}  // namespace mkernel::config
