// schema.h: the keys each map of the config file may hold, in one table, so the loader, the
// unknown-key suggestions and known_keys() cannot disagree. Internal to mkernel_config.
#pragma once

#include <span>
#include <string_view>
#include <utility>

#include "mkernel/config/config.h"

namespace mkernel::config::detail {

// One map of the file. `pattern` is its dotted path with list items written as `[]`
// ("overrides[].transport"); the top level is "".
struct SectionSchema {
  std::string_view pattern;
  std::span<const std::string_view> keys;
};

std::span<const SectionSchema> sections();
// The schema of the map at `pattern`; nullptr if there is none.
const SectionSchema* find_section(std::string_view pattern);

// Spellings of the enum values in the file, in the order they are listed to the operator.
template <typename E>
using EnumNames = std::span<const std::pair<std::string_view, E>>;
EnumNames<GpuSelect> gpu_select_names();
EnumNames<PollMode> poll_mode_names();
EnumNames<TransportKind> transport_kind_names();
EnumNames<SignalValue> signal_value_names();
EnumNames<LogLevel> log_level_names();
EnumNames<LogFormat> log_format_names();

// Limits. NOTES: the ring limits repeat protocol/ring.h (kMinCapacityLog2, kMaxCapacityLog2);
// config stays free of the protocol library, so a test there pins them together.
inline constexpr uint32_t kMaxGpuId = 255;
inline constexpr uint32_t kMaxHostSlots = 64;
inline constexpr uint32_t kMaxCpuId = 4095;
inline constexpr uint64_t kMinPollSpinUs = 0;
inline constexpr uint64_t kMaxPollSpinUs = 10'000'000;
inline constexpr uint64_t kMinPollSleepUs = 1;
inline constexpr uint64_t kMaxPollSleepUs = 1'000'000;
inline constexpr uint64_t kMaxBatchCommands = 4096;
inline constexpr uint64_t kMinRingCapacity = 2;
inline constexpr uint64_t kMaxRingCapacity = uint64_t{1} << 20;
inline constexpr uint64_t kMaxClientsPerGpu = 4096;
inline constexpr uint64_t kMaxQuotaRings = 1024;
inline constexpr uint64_t kMinQuotaBytes = uint64_t{1} << 20;  // 1 MiB
inline constexpr uint64_t kMaxQuotaBytes = uint64_t{1} << 50;  // 1 PiB
inline constexpr uint64_t kMaxQuotaInflight = uint64_t{1} << 24;
inline constexpr uint64_t kMaxQuotaRegions = 65536;
inline constexpr uint64_t kMaxSessions = 65536;
inline constexpr uint64_t kMinDescriptors = 16;
inline constexpr uint64_t kMaxDescriptors = 1 << 20;
inline constexpr uint64_t kMaxQueuedReplies = 4096;
inline constexpr uint64_t kMaxShareRings = 1 << 20;
inline constexpr uint64_t kMaxShareRegions = 1 << 20;
inline constexpr uint64_t kMinTimeoutMs = 1;
inline constexpr uint64_t kMaxTimeoutMs = 3'600'000;  // one hour
inline constexpr uint64_t kMaxId = 4'294'967'294;     // uid/gid; (uid_t)-1 means "none"
inline constexpr uint64_t kMaxPeerForming = 1'000'000;
inline constexpr size_t kMaxNameBytes = 64;

}  // namespace mkernel::config::detail
