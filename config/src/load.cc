// load.cc: YAML text -> DaemonConfig, with every problem reported (see config.h, notes 2-4).
//
// Design notes
//  1. Each map of the file is read through a Section, built from the schema table: building it
//     reports unknown and repeated keys at once, so the field readers only look keys up.
//  2. A field that fails keeps its default and its path is remembered as bad; the checks that
//     relate several fields (TLS for TCP listeners, overrides against the GPU selection) skip
//     any field already reported, so one mistake gives one error.
//  3. Errors carry the position of the value (of the key when the value is empty: yaml-cpp
//     places an empty value on the next line) and are sorted into file order at the end.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <exception>
#include <map>
#include <set>
#include <sstream>
#include <utility>

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include "mkernel/config/config.h"
#include "schema.h"
#include "text.h"

namespace mkernel::config {
namespace {

using detail::quoted;

constexpr size_t kMaxFileBytes = size_t{16} << 20;
constexpr size_t kMaxValueChars = 80;

struct Pos {
  int line = 0;  // 1-based, 0 = none
  int column = 0;
};

Pos pos_of(const YAML::Mark& mark) {
  if (mark.is_null() || mark.line < 0) return {};
  return {mark.line + 1, mark.column + 1};
}

// A value short enough for one line of a message.
std::string shorten(std::string text) {
  if (text.size() > kMaxValueChars) text = text.substr(0, kMaxValueChars - 3) + "...";
  return text;
}

// The value as the operator wrote it; lists and maps in flow style, on one line.
std::string render(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Scalar:
      return node.Scalar();
    case YAML::NodeType::Sequence:
    case YAML::NodeType::Map: {
      // A node keeps the style it was written in; a copy set to flow prints on one line (the
      // emitter writes everything inside a flow collection in flow style).
      YAML::Node copy = YAML::Clone(node);
      copy.SetStyle(YAML::EmitterStyle::Flow);
      YAML::Emitter out;
      out << copy;
      return out.good() ? std::string(out.c_str()) : std::string("?");
    }
    default:
      return {};  // null, undefined
  }
}

// One key/value pair of a map.
struct Entry {
  std::string path;  // dotted path of this key
  YAML::Node value;
  Pos key_pos;
  Pos value_pos;  // the key's position when the value is empty
};

class Ctx {
 public:
  explicit Ctx(std::string source) : source_(std::move(source)) {}

  void add(Pos pos, std::string key, std::string value, std::string expected,
           std::string message_body) {
    ConfigError e;
    e.source = source_;
    e.line = pos.line;
    e.column = pos.column;
    e.key = std::move(key);
    e.value = std::move(value);
    e.expected = std::move(expected);
    e.message = location(pos) + ": " + message_body;
    bad_.insert(e.key);
    errors_.push_back(std::move(e));
  }

  // `key: value "v" is invalid; expected ...`
  void invalid(Pos pos, const std::string& key, const std::string& value,
               const std::string& expected) {
    std::string shown = shorten(value);
    std::string body = key.empty() ? std::string() : key + ": ";
    body += "value " + quoted(shown) + " is invalid; expected " + expected;
    add(pos, key, std::move(shown), expected, std::move(body));
  }
  void invalid(const Entry& e, const std::string& expected) {
    invalid(e.value_pos, e.path, render(e.value), expected);
  }

  bool bad(const std::string& key) const { return bad_.count(key) != 0; }
  // True when `key` or anything below it was reported.
  bool bad_under(const std::string& key) const {
    auto it = bad_.lower_bound(key);
    return it != bad_.end() && it->compare(0, key.size(), key) == 0;
  }

  std::string location(Pos pos) const {
    if (pos.line == 0) return source_;
    return source_ + ":" + std::to_string(pos.line) + ":" + std::to_string(pos.column);
  }

  std::vector<ConfigError> take_errors() {
    std::stable_sort(errors_.begin(), errors_.end(), [](const ConfigError& a,
                                                        const ConfigError& b) {
      const int la = a.line == 0 ? INT_MAX : a.line;
      const int lb = b.line == 0 ? INT_MAX : b.line;
      return la != lb ? la < lb : a.column < b.column;
    });
    return std::move(errors_);
  }

 private:
  std::string source_;
  std::vector<ConfigError> errors_;
  std::set<std::string> bad_;
};

// ---- unknown keys -----------------------------------------------------------------------

std::string join(std::string_view prefix, std::string_view key) {
  if (prefix.empty()) return std::string(key);
  return std::string(prefix) + "." + std::string(key);
}

std::string last_component(std::string_view path) {
  const size_t dot = path.rfind('.');
  return std::string(dot == std::string_view::npos ? path : path.substr(dot + 1));
}

// Every key and section name as a dotted pattern ("clients.quota", "overrides[].gpu").
const std::vector<std::string>& all_patterns() {
  static const std::vector<std::string> patterns = [] {
    std::vector<std::string> out;
    for (const detail::SectionSchema& s : detail::sections()) {
      for (const std::string_view key : s.keys) out.push_back(join(s.pattern, key));
    }
    return out;
  }();
  return patterns;
}

// The suggestion for unknown key `typed` in the map at `pattern` (actual path `path`): the
// nearest key of that map; failing that, the one key elsewhere whose name is nearest, shown
// with this map's path where it lies below it. Empty when nothing is close.
std::string suggest(const detail::SectionSchema& schema, const std::string& path,
                    const std::string& typed) {
  const size_t limit = detail::suggestion_threshold(typed);
  std::string best;
  size_t best_distance = limit + 1;
  for (const std::string_view key : schema.keys) {
    const size_t d = detail::edit_distance(typed, key);
    if (d < best_distance) {
      best_distance = d;
      best = join(path, key);
    }
  }
  if (!best.empty()) return best;

  std::vector<std::string> found;
  for (const std::string& candidate : all_patterns()) {
    const size_t d = detail::edit_distance(typed, last_component(candidate));
    if (d < best_distance) {
      best_distance = d;
      found.clear();
    }
    if (d == best_distance && d <= limit) found.push_back(candidate);
  }
  // Prefer keys below the map being read, then take the answer only if it is unambiguous.
  const std::string own = schema.pattern.empty() ? "" : std::string(schema.pattern) + ".";
  std::vector<std::string> below;
  for (const std::string& f : found) {
    if (!own.empty() && f.compare(0, own.size(), own) == 0) below.push_back(f);
  }
  if (!below.empty()) found = below;
  if (found.size() != 1) return {};
  std::string chosen = found.front();
  if (!own.empty() && chosen.compare(0, own.size(), own) == 0) {
    chosen = path + "." + chosen.substr(own.size());
  }
  return chosen;
}

std::string list_keys(const detail::SectionSchema& schema) {
  std::string out;
  for (const std::string_view key : schema.keys) {
    if (!out.empty()) out += ", ";
    out += quoted(key);
  }
  return out;
}

// ---- sections ---------------------------------------------------------------------------

// The keys of one map of the file, checked against its schema.
class Section {
 public:
  // `node` may be absent (the section was not written): every lookup then finds nothing.
  // `pattern` names the schema, `path` is where the map is ("overrides[2].poll").
  Section(Ctx& ctx, const YAML::Node* node, Pos pos, std::string_view pattern, std::string path,
          std::string_view expected_map = "a map")
      : ctx_(ctx), path_(std::move(path)) {
    const detail::SectionSchema* schema = detail::find_section(pattern);
    if (node == nullptr || !node->IsDefined() || node->IsNull()) return;
    if (!node->IsMap()) {
      ctx_.invalid(pos, path_, render(*node), std::string(expected_map));
      return;
    }
    for (auto it = node->begin(); it != node->end(); ++it) {
      // Copies: the iterator's `->` returns a temporary, references into it would dangle.
      const YAML::Node key_node = it->first;
      const YAML::Node value = it->second;
      const Pos key_pos = pos_of(key_node.Mark());
      const std::string name = key_node.IsScalar() ? key_node.Scalar() : render(key_node);
      const std::string key_path = join(path_, name);
      const bool known = key_node.IsScalar() &&
                         std::find(schema->keys.begin(), schema->keys.end(), name) !=
                             schema->keys.end();
      if (!known) {
        const std::string suggestion = suggest(*schema, path_, name);
        if (!suggestion.empty()) {
          ctx_.add(key_pos, key_path, name, "a known key such as " + quoted(suggestion),
                   "unknown key " + quoted(key_path) + "; did you mean " + quoted(suggestion) +
                       "?");
        } else {
          ctx_.add(key_pos, key_path, name, "one of " + list_keys(*schema),
                   "unknown key " + quoted(key_path) + "; expected one of " +
                       list_keys(*schema));
        }
        continue;
      }
      if (auto seen = entries_.find(name); seen != entries_.end()) {
        ctx_.add(key_pos, key_path, name, "each key once",
                 "duplicate key " + quoted(key_path) + " (first given at line " +
                     std::to_string(seen->second.key_pos.line) + ")");
        continue;
      }
      const Pos value_pos = value.IsNull() ? key_pos : pos_of(value.Mark());
      entries_.emplace(name, Entry{key_path, value, key_pos, value_pos});
    }
  }

  const Entry* get(std::string_view key) const {
    auto it = entries_.find(std::string(key));
    return it == entries_.end() ? nullptr : &it->second;
  }
  bool has(std::string_view key) const { return get(key) != nullptr; }
  const std::string& path() const { return path_; }
  std::string child(std::string_view key) const { return join(path_, key); }
  Ctx& ctx() const { return ctx_; }

  // A nested map: its node, position and path, for constructing the child Section.
  Section sub(std::string_view key, std::string_view pattern) const {
    const Entry* e = get(key);
    if (e == nullptr) return Section(ctx_, nullptr, {}, pattern, child(key));
    return Section(ctx_, &e->value, e->value_pos, pattern, e->path);
  }

 private:
  Ctx& ctx_;
  std::string path_;
  std::map<std::string, Entry> entries_;
};

// ---- field readers ----------------------------------------------------------------------
// Each returns true when the key was present and valid (and `out` was set).

std::string range_text(uint64_t lo, uint64_t hi) {
  return "an integer in " + std::to_string(lo) + ".." + std::to_string(hi);
}

// The text of a scalar value; null counts as "". Lists and maps are reported.
std::optional<std::string> scalar(const Section& s, const Entry& e, const std::string& expected) {
  if (e.value.IsScalar()) return e.value.Scalar();
  if (e.value.IsNull()) return std::string();
  s.ctx().invalid(e, expected);
  return std::nullopt;
}

template <typename T>
bool read_uint(const Section& s, std::string_view key, uint64_t lo, uint64_t hi, T& out) {
  const Entry* e = s.get(key);
  if (e == nullptr) return false;
  const std::string expected = range_text(lo, hi);
  const auto text = scalar(s, *e, expected);
  if (!text) return false;
  const auto v = detail::parse_uint(*text);
  if (!v || *v < lo || *v > hi) {
    s.ctx().invalid(*e, expected);
    return false;
  }
  out = static_cast<T>(*v);
  return true;
}

template <typename Rep, typename Period>
bool read_duration(const Section& s, std::string_view key, uint64_t lo, uint64_t hi,
                   std::chrono::duration<Rep, Period>& out) {
  Rep count = out.count();
  if (!read_uint(s, key, lo, hi, count)) return false;
  out = std::chrono::duration<Rep, Period>(count);
  return true;
}

bool read_pow2(const Section& s, std::string_view key, uint64_t lo, uint64_t hi, uint32_t& out) {
  const Entry* e = s.get(key);
  if (e == nullptr) return false;
  const std::string expected =
      "a power of two in " + std::to_string(lo) + ".." + std::to_string(hi);
  const auto text = scalar(s, *e, expected);
  if (!text) return false;
  const auto v = detail::parse_uint(*text);
  if (!v || *v < lo || *v > hi || (*v & (*v - 1)) != 0) {
    s.ctx().invalid(*e, expected);
    return false;
  }
  out = static_cast<uint32_t>(*v);
  return true;
}

bool read_bytes(const Section& s, std::string_view key, uint64_t lo, uint64_t hi, uint64_t& out) {
  const Entry* e = s.get(key);
  if (e == nullptr) return false;
  const std::string expected = "a size in " + detail::format_bytes(lo) + ".." +
                               detail::format_bytes(hi) +
                               ", in bytes or with a suffix KiB, MiB, GiB, TiB or PiB";
  const auto text = scalar(s, *e, expected);
  if (!text) return false;
  const auto v = detail::parse_bytes(*text);
  if (!v || *v < lo || *v > hi) {
    s.ctx().invalid(*e, expected);
    return false;
  }
  out = *v;
  return true;
}

bool read_bool(const Section& s, std::string_view key, bool& out) {
  const Entry* e = s.get(key);
  if (e == nullptr) return false;
  const std::string expected = "true or false";
  const auto text = scalar(s, *e, expected);
  if (!text) return false;
  if (*text == "true" || *text == "True" || *text == "TRUE") {
    out = true;
  } else if (*text == "false" || *text == "False" || *text == "FALSE") {
    out = false;
  } else {
    s.ctx().invalid(*e, expected);
    return false;
  }
  return true;
}

template <typename E>
std::string enum_expected(detail::EnumNames<E> names) {
  std::string out = "one of ";
  bool first = true;
  for (const auto& [name, value] : names) {
    if (!first) out += ", ";
    first = false;
    out += quoted(name);
  }
  return out;
}

template <typename E>
bool read_enum(const Section& s, std::string_view key, detail::EnumNames<E> names, E& out) {
  const Entry* e = s.get(key);
  if (e == nullptr) return false;
  const std::string expected = enum_expected(names);
  const auto text = scalar(s, *e, expected);
  if (!text) return false;
  for (const auto& [name, value] : names) {
    if (*text == name) {
      out = value;
      return true;
    }
  }
  s.ctx().invalid(*e, expected);
  return false;
}

// A string checked by `valid`.
template <typename Pred>
bool read_string(const Section& s, std::string_view key, const std::string& expected, Pred valid,
                 std::string& out) {
  const Entry* e = s.get(key);
  if (e == nullptr) return false;
  const auto text = scalar(s, *e, expected);
  if (!text) return false;
  if (!valid(*text)) {
    s.ctx().invalid(*e, expected);
    return false;
  }
  out = *text;
  return true;
}

// A list of integers in lo..hi without repeats; null is the empty list. Items are reported
// as `key[i]`.
bool read_uint_list(Ctx& ctx, const Entry& e, uint64_t lo, uint64_t hi,
                    const std::string& list_expected, const std::string& item_name,
                    std::vector<uint32_t>& out) {
  if (e.value.IsNull()) {
    out.clear();
    return true;
  }
  if (!e.value.IsSequence()) {
    ctx.invalid(e, list_expected);
    return false;
  }
  std::vector<uint32_t> items;
  bool ok = true;
  size_t idx = 0;
  const std::string expected = item_name + " in " + std::to_string(lo) + ".." + std::to_string(hi);
  for (const YAML::Node& item : e.value) {
    const std::string item_path = e.path + "[" + std::to_string(idx++) + "]";
    const Pos item_pos = pos_of(item.Mark());
    const auto v = item.IsScalar() ? detail::parse_uint(item.Scalar()) : std::nullopt;
    if (!v || *v < lo || *v > hi) {
      ctx.invalid(item_pos, item_path, render(item), expected);
      ok = false;
      continue;
    }
    const auto id = static_cast<uint32_t>(*v);
    if (std::find(items.begin(), items.end(), id) != items.end()) {
      ctx.invalid(item_pos, item_path, render(item), item_name + " not already listed");
      ok = false;
      continue;
    }
    items.push_back(id);
  }
  if (ok) out = std::move(items);
  return ok;
}

bool read_uint_list(const Section& s, std::string_view key, uint64_t lo, uint64_t hi,
                    const std::string& list_expected, const std::string& item_name,
                    std::vector<uint32_t>& out) {
  const Entry* e = s.get(key);
  if (e == nullptr) return false;
  return read_uint_list(s.ctx(), *e, lo, hi, list_expected, item_name, out);
}

bool read_mode(const Section& s, std::string_view key, uint32_t& out) {
  const Entry* e = s.get(key);
  if (e == nullptr) return false;
  const std::string expected = "an octal mode like \"0660\" (at most \"0777\")";
  const auto text = scalar(s, *e, expected);
  if (!text) return false;
  const auto mode = detail::parse_mode(*text);
  if (!mode) {
    s.ctx().invalid(*e, expected);
    return false;
  }
  out = *mode;
  return true;
}

// ---- value checks -----------------------------------------------------------------------

bool is_word_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '-';
}

bool is_node_name(const std::string& text) {
  if (text.size() > detail::kMaxNameBytes) return false;
  return std::all_of(text.begin(), text.end(), [](char c) { return is_word_char(c) || c == '.'; });
}

bool is_absolute_path(const std::string& text) {
  return !text.empty() && text.front() == '/' && text.size() < PATH_MAX &&
         text.find('\0') == std::string::npos;
}

// "" (the daemon's group), a numeric gid or a POSIX group name.
bool is_group(const std::string& text) {
  if (text.empty()) return true;
  if (const auto gid = detail::parse_uint(text)) return *gid <= detail::kMaxId;
  if (text.size() > 32) return false;
  const char first = text.front();
  if (!((first >= 'a' && first <= 'z') || (first >= 'A' && first <= 'Z') || first == '_')) {
    return false;
  }
  return std::all_of(text.begin(), text.end(), [](char c) { return is_word_char(c) || c == '.'; });
}

bool is_provider(const std::string& text) {
  if (text.empty() || text.size() > detail::kMaxNameBytes) return false;
  return std::all_of(text.begin(), text.end(), [](char c) { return is_word_char(c) || c == ';'; });
}

bool is_nic(const std::string& text) {
  if (text.empty() || text.size() > detail::kMaxNameBytes) return false;
  return std::all_of(text.begin(), text.end(),
                     [](char c) { return is_word_char(c) || c == '.' || c == ':'; });
}

const char* const kGroupExpected = "a group name or a numeric gid, or \"\" for the daemon's group";

// ---- sections of the file ---------------------------------------------------------------

void read_node(const Section& s, NodeConfig& out) {
  read_string(s, "name",
              "a name of letters, digits, \".\", \"_\" and \"-\" (at most 64), or \"\" for the "
              "host name",
              is_node_name, out.name);
  read_string(s, "runtime_dir", "an absolute path", is_absolute_path, out.runtime_dir);
}

void read_gpus(Ctx& ctx, const Section& top, GpuSelection& out) {
  const Entry* e = top.get("gpus");
  if (e == nullptr || e->value.IsNull()) return;
  const std::string forms = "\"all\", a list of GPU ids or a map";
  // Short forms: `gpus: all` and `gpus: [0, 1]`.
  if (e->value.IsScalar()) {
    if (e->value.Scalar() == "all") {
      out.select = GpuSelect::kAll;
    } else {
      ctx.invalid(*e, forms);
    }
    return;
  }
  if (e->value.IsSequence()) {
    std::vector<uint32_t> ids;
    if (!read_uint_list(ctx, *e, 0, detail::kMaxGpuId, forms, "a GPU id", ids)) return;
    if (ids.empty()) {
      ctx.invalid(*e, "at least one GPU id");
      return;
    }
    out.select = GpuSelect::kList;
    out.ids = std::move(ids);
    return;
  }
  const Section s(ctx, &e->value, e->value_pos, "gpus", "gpus", forms);
  const bool select_ok =
      read_enum(s, "select", detail::gpu_select_names(), out.select) || !s.has("select");
  const bool ids_ok =
      read_uint_list(s, "ids", 0, detail::kMaxGpuId, "a list of GPU ids", "a GPU id", out.ids);
  read_uint(s, "host_slots", 1, detail::kMaxHostSlots, out.host_slots);
  read_uint(s, "fallback_host_slots", 0, detail::kMaxHostSlots, out.fallback_host_slots);
  if (!select_ok) return;

  // Each mode has its own keys; a key of another mode is most likely a forgotten `select`.
  const std::string mode = quoted(to_string(out.select));
  const Entry* ids = s.get("ids");
  if (out.select == GpuSelect::kList) {
    if (ids == nullptr || (ids_ok && out.ids.empty())) {
      const Pos p = ids != nullptr ? ids->value_pos : s.get("select")->value_pos;
      ctx.invalid(p, "gpus.ids", ids != nullptr ? render(ids->value) : "",
                  "at least one GPU id when gpus.select is \"list\"");
    }
  } else if (ids != nullptr && ids->value.size() != 0) {
    ctx.invalid(*ids, "no ids unless gpus.select is \"list\" (it is " + mode + ")");
  }
  if (const Entry* h = s.get("host_slots"); h != nullptr && out.select != GpuSelect::kHostSlots) {
    ctx.invalid(*h, "no host_slots unless gpus.select is \"host_slots\" (it is " + mode + ")");
  }
  if (const Entry* f = s.get("fallback_host_slots");
      f != nullptr && out.select != GpuSelect::kAll) {
    ctx.invalid(*f, "no fallback_host_slots unless gpus.select is \"all\" (it is " + mode + ")");
  }
  // Keys of other modes keep their defaults, so equal selections compare equal.
  const GpuSelection defaults;
  if (out.select != GpuSelect::kList) out.ids.clear();
  if (out.select != GpuSelect::kHostSlots) out.host_slots = defaults.host_slots;
  if (out.select != GpuSelect::kAll) out.fallback_host_slots = defaults.fallback_host_slots;
}

bool read_cpu_affinity(const Section& s, std::string_view key, CpuAffinity& out) {
  const Entry* e = s.get(key);
  if (e == nullptr) return false;
  const std::string expected = "\"auto\", \"none\" or a CPU list like \"0-7,16-23\" (CPUs 0.." +
                               std::to_string(detail::kMaxCpuId) + ")";
  const auto text = scalar(s, *e, expected);
  if (!text) return false;
  if (*text == "auto") {
    out = CpuAffinity{CpuAffinityMode::kAuto, {}};
  } else if (*text == "none") {
    out = CpuAffinity{CpuAffinityMode::kNone, {}};
  } else if (auto cpus = detail::parse_cpu_list(*text, detail::kMaxCpuId)) {
    out = CpuAffinity{CpuAffinityMode::kList, std::move(*cpus)};
  } else {
    s.ctx().invalid(*e, expected);
    return false;
  }
  return true;
}

void read_poll(const Section& s, PollConfig& out) {
  read_enum(s, "mode", detail::poll_mode_names(), out.mode);
  read_duration(s, "spin_us", detail::kMinPollSpinUs, detail::kMaxPollSpinUs, out.spin);
  read_duration(s, "sleep_us", detail::kMinPollSleepUs, detail::kMaxPollSleepUs, out.sleep);
}

void read_batch(const Section& s, BatchConfig& out) {
  read_uint(s, "max_commands", 1, detail::kMaxBatchCommands, out.max_commands);
}

// `out` starts with the values that keys left out take (the built-in defaults, or the node-wide
// section for an override). A provider taken over that way is dropped when the kind is verbs;
// one written next to kind "verbs" is an error.
void read_transport(const Section& s, TransportConfig& out) {
  const bool kind_ok = read_enum(s, "kind", detail::transport_kind_names(), out.kind) ||
                       !s.has("kind");
  const bool provider_given = read_string(
      s, "provider",
      "\"auto\" or a libfabric provider name like \"efa\", \"tcp;ofi_rxm\" or \"shm\"",
      is_provider, out.provider);
  read_string(s, "nic",
              "\"auto\" or a device name like \"mlx5_0\" (letters, digits, \"_\", \"-\", \".\" "
              "and \":\"; at most 64)",
              is_nic, out.nic);
  const bool signal_value_given =
      read_enum(s, "signal_value", detail::signal_value_names(), out.signal_value);
  bool pieces_given = false;
  if (const Entry* e = s.get("write_piece_bytes"); e != nullptr) {
    pieces_given = true;
    const std::string expected = "\"auto\", 0 (whole writes) or a size in " +
                                 detail::format_bytes(kMinWritePieceBytes) + ".." +
                                 detail::format_bytes(kMaxWritePieceBytes) +
                                 ", in bytes or with a suffix KiB, MiB or GiB";
    if (const auto text = scalar(s, *e, expected)) {
      if (*text == "auto") {
        out.write_piece_bytes = kAutoWritePieceBytes;
      } else if (const auto v = detail::parse_bytes(*text);
                 v && (*v == 0 || (*v >= kMinWritePieceBytes && *v <= kMaxWritePieceBytes))) {
        out.write_piece_bytes = *v;
      } else {
        s.ctx().invalid(*e, expected);
      }
    }
  }
  if (out.kind == TransportKind::kVerbs && out.provider != "auto") {
    if (provider_given && kind_ok) {
      s.ctx().invalid(*s.get("provider"), "\"auto\" when " + s.child("kind") + " is \"verbs\"");
    }
    out.provider = "auto";
  }
  // verbs writes the whole value into the peer's signal region: the choice is fabric's alone.
  if (out.kind == TransportKind::kVerbs && out.signal_value != SignalValue::kAuto) {
    if (signal_value_given && kind_ok) {
      s.ctx().invalid(*s.get("signal_value"), "\"auto\" when " + s.child("kind") + " is \"verbs\"");
    }
    out.signal_value = SignalValue::kAuto;
  }
  if (out.kind == TransportKind::kVerbs && out.write_piece_bytes != kAutoWritePieceBytes) {
    if (pieces_given && kind_ok) {
      s.ctx().invalid(*s.get("write_piece_bytes"), "\"auto\" when " + s.child("kind") + " is \"verbs\"");
    }
    out.write_piece_bytes = kAutoWritePieceBytes;
  }
}

void read_overrides(Ctx& ctx, const Section& top, const DaemonConfig& base,
                    std::vector<GpuOverride>& out) {
  const Entry* e = top.get("overrides");
  if (e == nullptr || e->value.IsNull()) return;
  if (!e->value.IsSequence()) {
    ctx.invalid(*e, "a list of maps, one per GPU");
    return;
  }
  const std::string gpu_expected = "a GPU id in 0.." + std::to_string(detail::kMaxGpuId);
  size_t idx = 0;
  for (const YAML::Node& item : e->value) {
    const std::string path = "overrides[" + std::to_string(idx++) + "]";
    const Pos item_pos = pos_of(item.Mark());
    if (!item.IsMap()) {
      ctx.invalid(item_pos, path, render(item), "a map with a \"gpu\" key");
      continue;
    }
    const Section s(ctx, &item, item_pos, "overrides[]", path);
    GpuOverride o;
    if (!s.has("gpu")) {
      ctx.add(item_pos, path + ".gpu", "", gpu_expected,
              path + ".gpu: missing; expected " + gpu_expected);
    }
    const bool gpu_ok = read_uint(s, "gpu", 0, detail::kMaxGpuId, o.gpu);
    if (s.has("cpu_affinity")) {
      CpuAffinity a;
      if (read_cpu_affinity(s, "cpu_affinity", a)) o.cpu_affinity = std::move(a);
    }
    if (s.has("poll")) {
      PollConfig p = base.proxy.poll;
      read_poll(s.sub("poll", "overrides[].poll"), p);
      o.poll = p;
    }
    if (s.has("batch")) {
      BatchConfig b = base.proxy.batch;
      read_batch(s.sub("batch", "overrides[].batch"), b);
      o.batch = b;
    }
    if (s.has("transport")) {
      TransportConfig t = base.transport;
      read_transport(s.sub("transport", "overrides[].transport"), t);
      o.transport = std::move(t);
    }
    if (!gpu_ok) continue;

    // The GPU must be one the selection can give a proxy, with one override entry only.
    const Entry& g = *s.get("gpu");
    const GpuSelection& sel = base.gpus;
    if (!ctx.bad_under("gpus")) {
      if (sel.select == GpuSelect::kList &&
          std::find(sel.ids.begin(), sel.ids.end(), o.gpu) == sel.ids.end()) {
        std::string ids;
        for (const uint32_t id : sel.ids) ids += (ids.empty() ? "" : ", ") + std::to_string(id);
        ctx.invalid(g, "one of gpus.ids (" + ids + ")");
        continue;
      }
      if (sel.select == GpuSelect::kHostSlots && o.gpu >= sel.host_slots) {
        ctx.invalid(g, "a host slot in 0.." + std::to_string(sel.host_slots - 1) +
                           " (gpus.host_slots is " + std::to_string(sel.host_slots) + ")");
        continue;
      }
    }
    if (std::any_of(out.begin(), out.end(), [&](const GpuOverride& x) { return x.gpu == o.gpu; })) {
      ctx.invalid(g, "a GPU without an earlier override entry");
      continue;
    }
    out.push_back(std::move(o));
  }
}

// One grpc.listen or peer.listen item as written, with its place in the file.
struct ListenItem {
  std::string path;
  std::string text;
  Pos pos;
  ListenAddress address;
};

std::vector<ListenItem> read_listen(Ctx& ctx, const Section& s, std::vector<ListenAddress>& out) {
  const Entry* e = s.get("listen");
  if (e == nullptr) return {};
  const std::string expected = "\"unix:PATH\" or \"tcp:HOST:PORT\"";
  if (!e->value.IsSequence() && !e->value.IsNull()) {
    ctx.invalid(*e, "a list of addresses, each " + expected);
    return {};
  }
  std::vector<ListenItem> items;
  bool ok = true;
  size_t idx = 0;
  for (const YAML::Node& item : e->value) {
    const std::string path = e->path + "[" + std::to_string(idx++) + "]";
    const Pos pos = pos_of(item.Mark());
    const auto address = item.IsScalar() ? detail::parse_listen(item.Scalar()) : std::nullopt;
    if (!address) {
      ctx.invalid(pos, path, render(item), expected);
      ok = false;
      continue;
    }
    items.push_back(ListenItem{path, item.Scalar(), pos, *address});
  }
  if (!ok) return {};
  if (items.empty()) {
    ctx.invalid(*e, "at least one address");
    return {};
  }
  out.clear();
  for (const ListenItem& item : items) out.push_back(item.address);
  return items;
}

void read_tls(Ctx& ctx, const Section& grpc, const Section& tls, TlsConfig& out) {
  const std::string expected = "an absolute path, or \"\" for none";
  const auto path_ok = [](const std::string& t) { return t.empty() || is_absolute_path(t); };
  read_string(tls, "cert", expected, path_ok, out.cert);
  read_string(tls, "key", expected, path_ok, out.key);
  read_string(tls, "client_ca", expected, path_ok, out.client_ca);
  if (ctx.bad_under("grpc.tls")) return;
  // Certificate and key come as a pair; a client CA only makes sense with them.
  const auto pos_of_key = [&](std::string_view key) {
    if (const Entry* x = tls.get(key)) return x->value_pos;
    const Entry* t = grpc.get("tls");
    return t != nullptr ? t->value_pos : Pos{};
  };
  if (out.cert.empty() != out.key.empty()) {
    const bool key_missing = out.key.empty();
    const std::string missing = key_missing ? "key" : "cert";
    ctx.invalid(pos_of_key(missing), "grpc.tls." + missing, "",
                std::string(key_missing ? "a key file path when grpc.tls.cert is set"
                                        : "a certificate file path when grpc.tls.key is set"));
  } else if (out.cert.empty() && !out.client_ca.empty()) {
    ctx.invalid(pos_of_key("client_ca"), "grpc.tls.client_ca", out.client_ca,
                "\"\" unless grpc.tls.cert and grpc.tls.key are set");
  }
}

void read_client_socket(const Section& s, ClientSocketConfig& out) {
  read_string(s, "path", "a socket path (absolute, or relative to node.runtime_dir)",
              [](const std::string& t) {
                return !t.empty() && t.back() != '/' && t.find('\0') == std::string::npos;
              },
              out.path);
  read_string(s, "group", kGroupExpected, is_group, out.group);
  read_mode(s, "mode", out.mode);
  read_uint_list(s, "allowed_uids", 0, detail::kMaxId, "a list of numeric uids", "a uid",
                 out.allowed_uids);
  read_uint_list(s, "allowed_gids", 0, detail::kMaxId, "a list of numeric gids", "a gid",
                 out.allowed_gids);
}

void read_metrics(const Section& s, MetricsConfig& out) {
  read_bool(s, "enabled", out.enabled);
  const Entry* e = s.get("listen");
  if (e == nullptr) return;
  const std::string expected = "\"HOST:PORT\" (an IPv6 host in brackets), port 1..65535";
  const auto text = scalar(s, *e, expected);
  if (!text) return;
  const auto hp = detail::parse_host_port(*text);
  if (!hp) {
    s.ctx().invalid(*e, expected);
    return;
  }
  out.host = hp->host;
  out.port = hp->port;
}

// rings.capacity (the default ring) may not exceed rings.max_capacity (the largest a client
// may ask for).
void read_rings(const Section& s, RingConfig& out) {
  const bool capacity_ok = read_pow2(s, "capacity", detail::kMinRingCapacity,
                                     detail::kMaxRingCapacity, out.capacity) ||
                           !s.has("capacity");
  const bool max_ok = read_pow2(s, "max_capacity", detail::kMinRingCapacity,
                                detail::kMaxRingCapacity, out.max_capacity) ||
                      !s.has("max_capacity");
  if (!capacity_ok || !max_ok || out.capacity <= out.max_capacity) return;
  const Entry* e = s.has("max_capacity") ? s.get("max_capacity") : s.get("capacity");
  s.ctx().invalid(*e, e->path == "rings.max_capacity"
                          ? "a power of two of at least rings.capacity (" +
                                std::to_string(out.capacity) + ")"
                          : "a power of two of at most rings.max_capacity (" +
                                std::to_string(out.max_capacity) + ")");
}

// clients.per_uid and clients.per_process: the same keys, each with its own defaults.
void read_share(const Section& s, ShareQuota& out) {
  read_uint(s, "sessions", 1, detail::kMaxSessions, out.sessions);
  read_uint(s, "sessions_per_gpu", 1, detail::kMaxClientsPerGpu, out.sessions_per_gpu);
  read_uint(s, "rings", 1, detail::kMaxShareRings, out.rings);
  read_uint(s, "regions", 1, detail::kMaxShareRegions, out.regions);
  read_bytes(s, "shared_memory", detail::kMinQuotaBytes, detail::kMaxQuotaBytes,
             out.shared_memory);
  read_uint(s, "descriptors", 1, detail::kMaxDescriptors, out.descriptors);
  read_uint(s, "networks", 1, detail::kMaxSessions, out.networks);
}

void read_clients(const Section& s, ClientsConfig& out) {
  read_uint(s, "max_per_gpu", 1, detail::kMaxClientsPerGpu, out.max_per_gpu);
  read_uint(s, "max_sessions", 1, detail::kMaxSessions, out.max_sessions);
  read_uint(s, "max_descriptors", detail::kMinDescriptors, detail::kMaxDescriptors,
            out.max_descriptors);
  read_bytes(s, "max_shared_memory", detail::kMinQuotaBytes, detail::kMaxQuotaBytes,
             out.max_shared_memory);
  read_uint(s, "max_queued_replies", 1, detail::kMaxQueuedReplies, out.max_queued_replies);
  read_uint(s, "max_networks", 1, detail::kMaxSessions, out.max_networks);
  const Section quota = s.sub("quota", "clients.quota");
  read_uint(quota, "rings", 1, detail::kMaxQuotaRings, out.quota.rings);
  read_uint(quota, "regions", 1, detail::kMaxQuotaRegions, out.quota.regions);
  read_bytes(quota, "registered_bytes", detail::kMinQuotaBytes, detail::kMaxQuotaBytes,
             out.quota.registered_bytes);
  read_uint(quota, "inflight_commands", 1, detail::kMaxQuotaInflight,
            out.quota.inflight_commands);
  read_share(s.sub("per_uid", "clients.per_uid"), out.per_uid);
  read_share(s.sub("per_process", "clients.per_process"), out.per_process);
}

void read_peer(const Section& s, PeerConfig& out) {
  read_string(s, "advertise",
              "\"unix:PATH\" or \"tcp:HOST:PORT\", or \"\" for the first peer.listen address",
              [](const std::string& t) { return t.empty() || detail::parse_listen(t).has_value(); },
              out.advertise);
  read_uint(s, "max_forming", 1, detail::kMaxPeerForming, out.max_forming);
}

std::string too_long(const std::string& full) {
  return "a path of at most " + std::to_string(kMaxSocketPathBytes) +
         " bytes once joined to node.runtime_dir (it would be " + std::to_string(full.size()) +
         ")";
}

// Two listeners clash when these are equal: the socket's full path, or TCP host and port.
std::string listen_id(const DaemonConfig& c, const ListenAddress& a) {
  return a.kind == ListenKind::kUnix ? "unix:" + runtime_path(c, a.path)
                                     : "tcp:" + detail::format_host_port(a.host, a.port);
}

// The listeners of one service to check: those read from the file or, when `key` was not
// written, the defaults, placed at node.runtime_dir (their unix paths depend on it).
std::vector<ListenItem> listeners_to_check(const Ctx& ctx, const Section& node,
                                           const std::string& key,
                                           const std::vector<ListenItem>& read,
                                           const std::vector<ListenAddress>& addresses) {
  if (!read.empty() || ctx.bad_under(key)) return read;
  const Entry* dir = node.get("runtime_dir");
  std::vector<ListenItem> items;
  for (size_t i = 0; i < addresses.size(); ++i) {
    items.push_back(ListenItem{key + "[" + std::to_string(i) + "]", to_string(addresses[i]),
                               dir != nullptr ? dir->value_pos : Pos{}, addresses[i]});
  }
  return items;
}

// Checks across sections, on fields read without error: socket path lengths; gRPC and peer
// listeners against each other, the client socket and TLS.
void check_sockets(Ctx& ctx, const Section& node, const Section& sock,
                   const std::vector<ListenItem>& grpc_listen,
                   const std::vector<ListenItem>& peer_listen, const DaemonConfig& c) {
  if (ctx.bad("node.runtime_dir")) return;
  const std::string client_path = client_socket_path(c);
  const bool client_ok = !ctx.bad("client_socket.path");
  if (client_ok && client_path.size() > kMaxSocketPathBytes) {
    const Entry* p = sock.get("path");
    const Entry* dir = node.get("runtime_dir");
    const Pos pos = p != nullptr ? p->value_pos : dir != nullptr ? dir->value_pos : Pos{};
    ctx.invalid(pos, "client_socket.path", c.client_socket.path, too_long(client_path));
  }
  // Within one service: no repeats; a unix socket fits sun_path and is not the client socket.
  // False when the item was reported.
  const auto check_item = [&](const ListenItem& item, std::vector<std::string>& seen) {
    const std::string id = listen_id(c, item.address);
    if (std::find(seen.begin(), seen.end(), id) != seen.end()) {
      ctx.invalid(item.pos, item.path, item.text, "an address not already listed");
      return false;
    }
    seen.push_back(id);
    if (item.address.kind == ListenKind::kTcp) return true;
    const std::string full = runtime_path(c, item.address.path);
    if (full.size() > kMaxSocketPathBytes) {
      ctx.invalid(item.pos, item.path, item.text, too_long(full));
      return false;
    }
    if (client_ok && full == client_path) {
      ctx.invalid(item.pos, item.path, item.text,
                  "a socket other than the client socket (" + client_path + ")");
      return false;
    }
    return true;
  };

  // The admin service serves TCP only with TLS.
  const bool have_tls = !c.grpc.tls.cert.empty() && !c.grpc.tls.key.empty();
  const bool tls_ok = !ctx.bad_under("grpc.tls");
  std::vector<std::string> grpc_ids;
  std::vector<std::pair<std::string, const ListenItem*>> grpc_taken;  // id, first item
  const std::vector<ListenItem> grpc =
      listeners_to_check(ctx, node, "grpc.listen", grpc_listen, c.grpc.listen);
  for (const ListenItem& item : grpc) {
    const std::string id = listen_id(c, item.address);
    if (std::none_of(grpc_taken.begin(), grpc_taken.end(),
                     [&](const auto& taken) { return taken.first == id; })) {
      grpc_taken.emplace_back(id, &item);
    }
    if (!check_item(item, grpc_ids)) continue;
    if (item.address.kind == ListenKind::kTcp && !have_tls && tls_ok) {
      ctx.invalid(item.pos, item.path, item.text,
                  "a \"unix:\" address unless grpc.tls.cert and grpc.tls.key are set");
    }
  }

  // The peer service serves TCP without TLS (its calls carry the communicator's token), on
  // addresses of its own.
  std::vector<std::string> peer_ids;
  for (const ListenItem& item :
       listeners_to_check(ctx, node, "peer.listen", peer_listen, c.peer.listen)) {
    if (!check_item(item, peer_ids)) continue;
    const std::string id = listen_id(c, item.address);
    for (const auto& [grpc_id, grpc_item] : grpc_taken) {
      if (grpc_id != id) continue;
      const std::string where = item.address.kind == ListenKind::kUnix
                                    ? "a socket other than " + grpc_item->path + " (" +
                                          runtime_path(c, item.address.path) + ")"
                                    : "an address other than " + grpc_item->path + " (" +
                                          grpc_item->text + ")";
      ctx.invalid(item.pos, item.path, item.text, where);
      break;
    }
  }
}

// peer.advertise is what other nodes dial: a wildcard host cannot be dialed, so one must be
// given when the first listener is on one.
void check_peer_advertise(Ctx& ctx, const Section& peer, const std::vector<ListenItem>& listen,
                          const DaemonConfig& c) {
  if (ctx.bad("peer.advertise")) return;
  const Entry* advertise = peer.get("advertise");
  if (!c.peer.advertise.empty()) {
    const std::optional<ListenAddress> a = detail::parse_listen(c.peer.advertise);
    if (!a) return;  // reported when read
    if (a->kind == ListenKind::kTcp && detail::is_wildcard_host(a->host)) {
      ctx.invalid(*advertise,
                  "an address other nodes can dial, not a wildcard host (0.0.0.0 or ::)");
    } else if (a->kind == ListenKind::kUnix && !ctx.bad("node.runtime_dir")) {
      const std::string full = runtime_path(c, a->path);
      if (full.size() > kMaxSocketPathBytes) ctx.invalid(*advertise, too_long(full));
    }
    return;
  }
  if (ctx.bad_under("peer.listen") || c.peer.listen.empty()) return;
  const ListenAddress& first = c.peer.listen.front();
  if (first.kind != ListenKind::kTcp || !detail::is_wildcard_host(first.host)) return;
  const Pos pos = advertise != nullptr ? advertise->value_pos
                  : !listen.empty()    ? listen.front().pos
                                       : Pos{};
  ctx.invalid(pos, "peer.advertise", "",
              "\"tcp:HOST:PORT\" with this node's address on the cluster network, because "
              "peer.listen[0] (" + quoted(to_string(first)) +
                  ") is a wildcard address other nodes cannot dial");
}

// Where each of the first three documents of `text` starts.
//
// NOTES: yaml-cpp (0.7, 0.8) does not consume a ',' where a block node should start: it reports
// an empty document there and, asked for the next one, another empty document at the same
// place, forever (YAML::LoadAll then never returns and eats memory; YAML::Load returns the empty
// document, which would silently replace the whole file with the defaults). Two documents that
// start at the same offset therefore mean the parser is stuck. At most three are read, so this
// always ends. Fixed upstream after 0.8.0 (jbeder/yaml-cpp#1318, #1319).
std::vector<YAML::Mark> document_starts(const std::string& text) {
  class Starts : public YAML::EventHandler {
   public:
    void OnDocumentStart(const YAML::Mark& mark) override { marks.push_back(mark); }
    void OnDocumentEnd() override {}
    void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
    void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
    void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  const std::string&) override {}
    void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                         YAML::EmitterStyle::value) override {}
    void OnSequenceEnd() override {}
    void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                    YAML::EmitterStyle::value) override {}
    void OnMapEnd() override {}
    std::vector<YAML::Mark> marks;
  };
  std::istringstream in(text);
  YAML::Parser parser(in);
  Starts starts;
  while (starts.marks.size() < 3 && parser.HandleNextDocument(starts)) {
  }
  return std::move(starts.marks);
}

LoadResult finish(Ctx& ctx, DaemonConfig config) {
  LoadResult result;
  result.errors = ctx.take_errors();
  if (result.errors.empty()) result.config = std::move(config);
  return result;
}

LoadResult load(std::string_view yaml, std::string source) {
  Ctx ctx(std::move(source));
  DaemonConfig c = default_config();
  const std::string text(yaml);
  YAML::Node doc;
  try {
    const std::vector<YAML::Mark> starts = document_starts(text);
    for (size_t i = 1; i < starts.size(); ++i) {
      if (starts[i].pos == starts[i - 1].pos) {
        // The scanner is stuck (see document_starts); say where.
        const auto at = static_cast<size_t>(starts[i].pos);
        const std::string what = at < text.size() ? quoted(text.substr(at, 1)) : "end of file";
        ctx.add(pos_of(starts[i]), "", "", "valid YAML", "invalid YAML: unexpected " + what);
        return finish(ctx, std::move(c));
      }
    }
    if (starts.size() > 1) {
      ctx.add(pos_of(starts[1]), "", "", "one YAML document",
              "invalid YAML: a second document; expected one document per file");
    }
    doc = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    ctx.add(pos_of(e.mark), "", "", "valid YAML", "invalid YAML: " + e.msg);
    return finish(ctx, std::move(c));
  }
  if (!doc.IsDefined() || doc.IsNull()) return finish(ctx, std::move(c));

  const Section top(ctx, &doc, pos_of(doc.Mark()), "", "",
                    "a map of sections like \"node\", \"gpus\" and \"logging\"");
  const Section node = top.sub("node", "node");
  read_node(node, c.node);
  read_gpus(ctx, top, c.gpus);

  const Section proxy = top.sub("proxy", "proxy");
  read_cpu_affinity(proxy, "cpu_affinity", c.proxy.cpu_affinity);
  read_poll(proxy.sub("poll", "proxy.poll"), c.proxy.poll);
  read_batch(proxy.sub("batch", "proxy.batch"), c.proxy.batch);
  read_transport(top.sub("transport", "transport"), c.transport);
  read_overrides(ctx, top, c, c.overrides);

  read_rings(top.sub("rings", "rings"), c.rings);
  read_clients(top.sub("clients", "clients"), c.clients);

  const Section timeouts = top.sub("timeouts", "timeouts");
  TimeoutConfig& t = c.timeouts;
  read_duration(timeouts, "handshake_ms", detail::kMinTimeoutMs, detail::kMaxTimeoutMs,
                t.handshake);
  read_duration(timeouts, "rendezvous_ms", detail::kMinTimeoutMs, detail::kMaxTimeoutMs,
                t.rendezvous);
  read_duration(timeouts, "connect_ms", detail::kMinTimeoutMs, detail::kMaxTimeoutMs, t.connect);
  read_duration(timeouts, "command_ms", detail::kMinTimeoutMs, detail::kMaxTimeoutMs, t.command);
  read_duration(timeouts, "drain_ms", detail::kMinTimeoutMs, detail::kMaxTimeoutMs, t.drain);

  const Section sock = top.sub("client_socket", "client_socket");
  read_client_socket(sock, c.client_socket);

  const Section grpc = top.sub("grpc", "grpc");
  const std::vector<ListenItem> grpc_listen = read_listen(ctx, grpc, c.grpc.listen);
  read_string(grpc, "socket_group", kGroupExpected, is_group, c.grpc.socket_group);
  read_mode(grpc, "socket_mode", c.grpc.socket_mode);
  read_tls(ctx, grpc, grpc.sub("tls", "grpc.tls"), c.grpc.tls);

  const Section peer = top.sub("peer", "peer");
  const std::vector<ListenItem> peer_listen = read_listen(ctx, peer, c.peer.listen);
  read_peer(peer, c.peer);

  const Section logging = top.sub("logging", "logging");
  read_enum(logging, "level", detail::log_level_names(), c.logging.level);
  read_enum(logging, "format", detail::log_format_names(), c.logging.format);
  read_metrics(top.sub("metrics", "metrics"), c.metrics);

  check_sockets(ctx, node, sock, grpc_listen, peer_listen, c);
  check_peer_advertise(ctx, peer, peer_listen, c);
  return finish(ctx, std::move(c));
}

LoadResult single_error(const std::string& source, const std::string& what) {
  ConfigError e;
  e.source = source;
  e.expected = "a readable YAML file";
  e.message = source + ": " + what;
  LoadResult r;
  r.errors.push_back(std::move(e));
  return r;
}

}  // namespace

std::string LoadResult::error_text() const {
  std::string out;
  for (const ConfigError& e : errors) {
    out += e.message;
    out += '\n';
  }
  return out;
}

LoadResult load_config_string(std::string_view yaml, std::string_view source_name) {
  const std::string source(source_name);
  try {
    return load(yaml, source);
  } catch (const std::exception& e) {
    return single_error(source, std::string("internal error while reading the config: ") +
                                    e.what());
  } catch (...) {
    return single_error(source, "internal error while reading the config");
  }
}

LoadResult load_config_file(const std::string& path) {
  try {
    // O_NONBLOCK: opening a FIFO (or a device) must not wait for a writer; anything that is not
    // a regular file is refused below, before it is read.
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) return single_error(path, std::string("cannot open: ") + std::strerror(errno));
    std::string text;
    struct stat st {};
    std::string failure;
    if (::fstat(fd, &st) != 0) {
      failure = std::string("cannot stat: ") + std::strerror(errno);
    } else if (!S_ISREG(st.st_mode)) {
      failure = std::string("not a regular file (") +
                (S_ISFIFO(st.st_mode)   ? "a FIFO"
                 : S_ISDIR(st.st_mode)  ? "a directory"
                 : S_ISSOCK(st.st_mode) ? "a socket"
                 : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device"
                                                              : "not a file") +
                "); expected a YAML file";
    } else {
      char buf[65536];
      while (failure.empty()) {
        const ssize_t n = ::read(fd, buf, sizeof(buf));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
          failure = std::string("cannot read: ") + std::strerror(errno);
        } else if (n == 0) {
          break;
        } else if (text.size() + static_cast<size_t>(n) > kMaxFileBytes) {
          failure = "larger than " + detail::format_bytes(kMaxFileBytes) +
                    "; expected a config file";
        } else {
          text.append(buf, static_cast<size_t>(n));
        }
      }
    }
    ::close(fd);
    if (!failure.empty()) return single_error(path, failure);
    return load_config_string(text, path);
  } catch (const std::exception& e) {
    return single_error(path, std::string("internal error while reading the config: ") +
                                  e.what());
  }
}

}  // namespace mkernel::config
