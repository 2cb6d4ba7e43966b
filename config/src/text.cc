// text.cc: scalar forms of the config file and message helpers (see text.h).
#include "text.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <limits>

namespace mkernel::config::detail {
namespace {

char fold(char c) {
  if (c >= 'A' && c <= 'Z') return static_cast<char>(c - 'A' + 'a');
  if (c == '-') return '_';
  return c;
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }

bool is_host_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || is_digit(c) || c == '.' || c == '-' ||
         c == '_';
}

bool is_ipv6_char(char c) {
  return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F') || c == ':' || c == '.';
}

struct Unit {
  std::string_view suffix;
  unsigned shift;
};
// Largest first, so format_bytes picks the biggest exact unit.
constexpr std::array<Unit, 5> kUnits{{
    {"PiB", 50}, {"TiB", 40}, {"GiB", 30}, {"MiB", 20}, {"KiB", 10}}};

}  // namespace

size_t edit_distance(std::string_view a, std::string_view b) {
  // Three rows of the classic dynamic programme: row i-2 is needed for transpositions.
  const size_t n = b.size();
  std::vector<size_t> prev2(n + 1), prev(n + 1), cur(n + 1);
  for (size_t j = 0; j <= n; ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= n; ++j) {
      const bool same = fold(a[i - 1]) == fold(b[j - 1]);
      size_t best = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (same ? 0 : 1)});
      if (i > 1 && j > 1 && fold(a[i - 1]) == fold(b[j - 2]) && fold(a[i - 2]) == fold(b[j - 1])) {
        best = std::min(best, prev2[j - 2] + 1);
      }
      cur[j] = best;
    }
    std::swap(prev2, prev);
    std::swap(prev, cur);
  }
  return prev[n];
}

size_t suggestion_threshold(std::string_view typed) {
  if (typed.size() <= 3) return 1;
  if (typed.size() <= 8) return 2;
  return 3;
}

std::string quoted(std::string_view text) {
  std::string out;
  out.reserve(text.size() + 2);
  out += '"';
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (u < 0x20 || u == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02X", static_cast<unsigned>(u));
      out += buf;
    } else {
      out += c;
    }
  }
  out += '"';
  return out;
}

std::optional<uint64_t> parse_uint(std::string_view text) {
  if (text.empty() || text.size() > 20) return std::nullopt;
  uint64_t value = 0;
  for (const char c : text) {
    if (!is_digit(c)) return std::nullopt;
    const auto digit = static_cast<uint64_t>(c - '0');
    if (value > (std::numeric_limits<uint64_t>::max() - digit) / 10) return std::nullopt;
    value = value * 10 + digit;
  }
  return value;
}

std::optional<uint64_t> parse_bytes(std::string_view text) {
  size_t digits = 0;
  while (digits < text.size() && is_digit(text[digits])) ++digits;
  const auto number = parse_uint(text.substr(0, digits));
  if (!number) return std::nullopt;
  std::string_view suffix = text.substr(digits);
  if (suffix.empty()) return number;
  if (suffix.front() == ' ') suffix.remove_prefix(1);
  for (const Unit& unit : kUnits) {
    if (suffix == unit.suffix) {
      if (*number > (std::numeric_limits<uint64_t>::max() >> unit.shift)) return std::nullopt;
      return *number << unit.shift;
    }
  }
  return std::nullopt;
}

std::string format_bytes(uint64_t bytes) {
  if (bytes != 0) {
    for (const Unit& unit : kUnits) {
      const uint64_t mask = (uint64_t{1} << unit.shift) - 1;
      if ((bytes & mask) == 0) {
        return std::to_string(bytes >> unit.shift) + std::string(unit.suffix);
      }
    }
  }
  return std::to_string(bytes);
}

std::optional<uint32_t> parse_mode(std::string_view text) {
  if (text.size() == 4) {
    if (text.front() != '0') return std::nullopt;
    text.remove_prefix(1);
  }
  if (text.size() != 3) return std::nullopt;
  uint32_t mode = 0;
  for (const char c : text) {
    if (c < '0' || c > '7') return std::nullopt;
    mode = mode * 8 + static_cast<uint32_t>(c - '0');
  }
  return mode;
}

std::string format_mode(uint32_t mode) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%04o", mode & 07777u);
  return buf;
}

std::optional<std::vector<uint32_t>> parse_cpu_list(std::string_view text, uint32_t max_cpu) {
  std::vector<uint32_t> cpus;
  if (text.empty()) return std::nullopt;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t comma = std::min(text.find(',', pos), text.size());
    const std::string_view item = text.substr(pos, comma - pos);
    const size_t dash = item.find('-');
    const auto first = parse_uint(item.substr(0, dash));
    const auto last = dash == std::string_view::npos ? first : parse_uint(item.substr(dash + 1));
    if (!first || !last || *first > *last || *last > max_cpu) return std::nullopt;
    for (uint64_t cpu = *first; cpu <= *last; ++cpu) cpus.push_back(static_cast<uint32_t>(cpu));
    pos = comma + 1;
  }
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

std::string format_cpu_list(const std::vector<uint32_t>& cpus) {
  std::string out;
  size_t i = 0;
  while (i < cpus.size()) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(cpus[i]);
    if (j > i) out += '-' + std::to_string(cpus[j]);
    i = j + 1;
  }
  return out;
}

std::optional<HostPort> parse_host_port(std::string_view text) {
  const size_t colon = text.rfind(':');
  if (colon == std::string_view::npos) return std::nullopt;
  std::string_view host = text.substr(0, colon);
  const auto port = parse_uint(text.substr(colon + 1));
  if (!port || *port == 0 || *port > 65535) return std::nullopt;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
    if (host.empty() || host.find(':') == std::string_view::npos ||
        !std::all_of(host.begin(), host.end(), is_ipv6_char)) {
      return std::nullopt;
    }
  } else if (host.empty() || host.size() > 253 ||
             !std::all_of(host.begin(), host.end(), is_host_char)) {
    return std::nullopt;
  }
  return HostPort{std::string(host), static_cast<uint16_t>(*port)};
}

std::string format_host_port(const std::string& host, uint16_t port) {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

std::optional<ListenAddress> parse_listen(std::string_view text) {
  constexpr std::string_view kUnix = "unix:";
  constexpr std::string_view kTcp = "tcp:";
  if (text.substr(0, kUnix.size()) == kUnix) {
    const std::string_view path = text.substr(kUnix.size());
    if (path.empty() || path.find('\0') != std::string_view::npos) return std::nullopt;
    return ListenAddress{ListenKind::kUnix, std::string(path), "", 0};
  }
  if (text.substr(0, kTcp.size()) == kTcp) {
    const auto hp = parse_host_port(text.substr(kTcp.size()));
    if (!hp) return std::nullopt;
    return ListenAddress{ListenKind::kTcp, "", hp->host, hp->port};
  }
  return std::nullopt;
}

bool is_wildcard_host(std::string_view host) {
  if (host == "0.0.0.0") return true;
  // An IPv6 address written with zeros and colons only is all zero bits.
  return host.find(':') != std::string_view::npos &&
         std::all_of(host.begin(), host.end(), [](char c) { return c == '0' || c == ':'; });
}

std::string join_path(const std::string& dir, const std::string& path) {
  if (!path.empty() && path.front() == '/') return path;
  if (!dir.empty() && dir.back() == '/') return dir + path;
  return dir + "/" + path;
}

}  // namespace mkernel::config::detail
