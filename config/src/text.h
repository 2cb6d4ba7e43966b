// text.h: parsing and printing of the scalar forms the config file uses (sizes, modes, CPU
// lists, addresses) and the string helpers behind error messages. Internal to mkernel_config.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "mkernel/config/config.h"

namespace mkernel::config::detail {

// Optimal string alignment distance (Levenshtein plus transposition of neighbours), the measure
// behind "did you mean". Case and '-' versus '_' are not counted as differences.
size_t edit_distance(std::string_view a, std::string_view b);

// Largest distance at which `candidate` is still offered as a suggestion for `typed`.
size_t suggestion_threshold(std::string_view typed);

// `text` in double quotes with '"', '\' and control characters escaped; usable both in a message
// and as a YAML double-quoted scalar.
std::string quoted(std::string_view text);

// A plain decimal integer: digits only, no sign, no spaces, no overflow.
std::optional<uint64_t> parse_uint(std::string_view text);

// A byte size: decimal digits with an optional IEC suffix (KiB, MiB, GiB, TiB, PiB), optionally
// separated by one space: "4096", "512MiB", "64 GiB".
std::optional<uint64_t> parse_bytes(std::string_view text);
// The shortest exact form: "256GiB", "1536MiB", "1000".
std::string format_bytes(uint64_t bytes);

// A Unix permission mode as three or four octal digits ("660", "0660"), at most 0777.
std::optional<uint32_t> parse_mode(std::string_view text);
std::string format_mode(uint32_t mode);  // always four digits: "0660"

// A CPU list in the kernel's cpuset form: "0-7,16-23,31". Returns the sorted distinct CPUs, or
// nothing when the text is malformed, a range runs backwards or a CPU exceeds `max_cpu`.
std::optional<std::vector<uint32_t>> parse_cpu_list(std::string_view text, uint32_t max_cpu);
std::string format_cpu_list(const std::vector<uint32_t>& cpus);

// "HOST:PORT" with HOST a DNS name, an IPv4 address or a bracketed IPv6 address; port 1..65535.
struct HostPort {
  std::string host;  // without brackets
  uint16_t port = 0;
};
std::optional<HostPort> parse_host_port(std::string_view text);
std::string format_host_port(const std::string& host, uint16_t port);

// "unix:PATH" or "tcp:HOST:PORT".
std::optional<ListenAddress> parse_listen(std::string_view text);

// True for a host that means "every interface": 0.0.0.0, or the IPv6 unspecified address in
// any spelling ("::", "0::0", "0:0:0:0:0:0:0:0"). A listener may bind it; no peer can dial it.
bool is_wildcard_host(std::string_view host);

// `path` if absolute, otherwise `dir` + "/" + `path`.
std::string join_path(const std::string& dir, const std::string& path);

}  // namespace mkernel::config::detail
