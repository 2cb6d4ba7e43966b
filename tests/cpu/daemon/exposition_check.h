// exposition_check.h: a strict checker of the Prometheus text exposition format (0.0.4), for
// tests, and promtool where it is installed.
//
// check_exposition() returns every problem it finds ("" when none), one per line with the line
// number. It holds the text to what `promtool check metrics` and Prometheus's parser accept and
// a little more:
//  - `# HELP name text` and `# TYPE name type` (counter, gauge, histogram, summary, untyped), at
//    most once per family, TYPE before the family's first sample; other `#` lines are comments;
//  - samples `name{label="value",...} value [timestamp]`: metric and label names by the format's
//    grammar, label values with only `\\`, `\"` and `\n` escapes, no repeated label;
//  - values as Go's ParseFloat reads them, the special ones spelled `NaN`, `+Inf`, `-Inf` (also
//    `Inf`): `Nan`, `nan`, `inf` are refused;
//  - a family's samples together (not interleaved with another family's); counters' samples
//    named `<name>` (or `<name>_total`), histograms' `_bucket` (with `le`), `_sum`, `_count`;
//    buckets cumulative, the `+Inf` bucket present and equal to `_count`.
#pragma once

#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace mkernel::daemon::testing {

inline bool metric_name_ok(const std::string& n) {
  if (n.empty() || !(std::isalpha(static_cast<unsigned char>(n[0])) || n[0] == '_' || n[0] == ':')) return false;
  for (char c : n)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == ':')) return false;
  return true;
}

inline bool label_name_ok(const std::string& n) {
  if (n.empty() || !(std::isalpha(static_cast<unsigned char>(n[0])) || n[0] == '_')) return false;
  for (char c : n)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  return true;
}

// Go's strconv.ParseFloat forms, and the exposition format's special spellings.
inline bool parse_value(const std::string& v, double* out) {
  if (v == "NaN") {
    *out = __builtin_nan("");
    return true;
  }
  if (v == "+Inf" || v == "Inf") {
    *out = __builtin_inf();
    return true;
  }
  if (v == "-Inf") {
    *out = -__builtin_inf();
    return true;
  }
  if (v.empty()) return false;
  for (char c : v)
    if (!(std::isdigit(static_cast<unsigned char>(c)) || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-'))
      return false;  // refuses "Nan", "nan", "inf", hex
  char* end = nullptr;
  errno = 0;
  *out = std::strtod(v.c_str(), &end);
  return end == v.c_str() + v.size() && errno != ERANGE;
}

inline std::string check_exposition(const std::string& text) {
  std::ostringstream problems;
  std::map<std::string, std::string> types;  // family -> type
  std::set<std::string> helped, finished;
  std::string current;                        // the family whose samples are being read
  struct Histogram {
    double last_bucket = -1;
    double inf_bucket = -1;
    double count = -1;
  };
  std::map<std::string, Histogram> histograms;  // family + labels without le
  std::istringstream in(text);
  std::string line;
  int n = 0;
  auto bad = [&](const std::string& what) { problems << "line " << n << ": " << what << ": " << line << "\n"; };
  if (!text.empty() && text.back() != '\n') problems << "the text does not end with a newline\n";
  while (std::getline(in, line)) {
    ++n;
    if (line.empty()) continue;
    if (line[0] == '#') {
      std::istringstream f(line.substr(1));
      std::string kind, name;
      f >> kind >> name;
      if (kind != "HELP" && kind != "TYPE") continue;
      if (!metric_name_ok(name)) bad("bad metric name in " + kind);
      if (kind == "HELP") {
        if (!helped.insert(name).second) bad("second HELP");
        const size_t at = line.find(name) + name.size();
        for (size_t i = at; i < line.size(); ++i) {
          if (line[i] != '\\') continue;
          if (i + 1 >= line.size() || (line[i + 1] != '\\' && line[i + 1] != 'n')) bad("bad escape in HELP");
          ++i;  // the escaped character
        }
      } else {
        std::string type, extra;
        f >> type >> extra;
        static const std::set<std::string> kTypes{"counter", "gauge", "histogram", "summary", "untyped"};
        if (!kTypes.count(type) || !extra.empty()) bad("bad TYPE");
        if (types.count(name)) bad("second TYPE");
        if (finished.count(name) || current == name) bad("TYPE after the family's samples");
        types[name] = type;
      }
      continue;
    }
    // name{labels} value [timestamp]
    size_t i = 0;
    while (i < line.size() && line[i] != '{' && line[i] != ' ') ++i;
    const std::string name = line.substr(0, i);
    if (!metric_name_ok(name)) {
      bad("bad metric name");
      continue;
    }
    std::map<std::string, std::string> labels;
    std::string key_no_le;
    if (i < line.size() && line[i] == '{') {
      ++i;
      while (i < line.size() && line[i] != '}') {
        size_t eq = line.find('=', i);
        if (eq == std::string::npos) break;
        const std::string lname = line.substr(i, eq - i);
        if (!label_name_ok(lname)) bad("bad label name");
        if (eq + 1 >= line.size() || line[eq + 1] != '"') {
          bad("label value not quoted");
          break;
        }
        std::string value;
        size_t j = eq + 2;
        for (; j < line.size() && line[j] != '"'; ++j) {
          if (line[j] == '\\') {
            if (j + 1 >= line.size() || (line[j + 1] != '\\' && line[j + 1] != '"' && line[j + 1] != 'n'))
              bad("bad escape in a label value");
            value += line[++j];
          } else {
            value += line[j];
          }
        }
        if (j >= line.size()) {
          bad("unterminated label value");
          break;
        }
        if (!labels.emplace(lname, value).second) bad("repeated label");
        if (lname != "le") key_no_le += lname + "=" + value + ",";
        i = j + 1;
        if (i < line.size() && line[i] == ',') ++i;
      }
      if (i >= line.size() || line[i] != '}') {
        bad("unterminated labels");
        continue;
      }
      ++i;
    }
    if (i >= line.size() || line[i] != ' ') {
      bad("no value");
      continue;
    }
    std::istringstream rest(line.substr(i + 1));
    std::string value_text, ts, extra;
    rest >> value_text >> ts >> extra;
    double value = 0;
    if (!parse_value(value_text, &value)) bad("bad value \"" + value_text + "\"");
    if (!extra.empty()) bad("trailing text");
    // Which family: the name itself, or the name less a histogram/counter suffix.
    std::string family = name;
    for (const char* suffix : {"_bucket", "_sum", "_count", "_total"}) {
      const std::string s(suffix);
      if (!types.count(family) && name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0 &&
          types.count(name.substr(0, name.size() - s.size())))
        family = name.substr(0, name.size() - s.size());
    }
    if (family != current) {
      if (finished.count(family)) bad("samples of family " + family + " are not together");
      if (!current.empty()) finished.insert(current);
      current = family;
    }
    const std::string type = types.count(family) ? types[family] : "untyped";
    if (type == "histogram") {
      Histogram& h = histograms[family + "{" + key_no_le + "}"];
      if (name == family + "_bucket") {
        if (!labels.count("le")) bad("bucket without le");
        double le = 0;
        if (!parse_value(labels["le"], &le)) bad("bad le");
        if (value < h.last_bucket) bad("buckets not cumulative");
        h.last_bucket = value;
        if (labels["le"] == "+Inf") h.inf_bucket = value;
      } else if (name == family + "_count") {
        h.count = value;
      } else if (name != family + "_sum") {
        bad("not a histogram sample");
      }
    } else if (type == "counter") {
      if (value < 0) bad("negative counter");
    }
  }
  for (const auto& [key, h] : histograms) {
    if (h.inf_bucket < 0) problems << key << ": no +Inf bucket\n";
    else if (h.inf_bucket != h.count) problems << key << ": +Inf bucket differs from _count\n";
  }
  return problems.str();
}

// `promtool check metrics` on `text`: {ran, output}; ran is false when promtool is not installed.
inline std::pair<bool, std::string> promtool_check(const std::string& text) {
  if (std::system("command -v promtool >/dev/null 2>&1") != 0) return {false, ""};
  char path[] = "/tmp/mkmetrics-XXXXXX";
  const int fd = ::mkstemp(path);
  if (fd < 0) return {false, ""};
  FILE* f = ::fdopen(fd, "w");
  std::fwrite(text.data(), 1, text.size(), f);
  std::fclose(f);
  const std::string cmd = std::string("promtool check metrics < ") + path + " 2>&1; echo \"exit=$?\"";
  std::string out;
  if (FILE* p = ::popen(cmd.c_str(), "r")) {
    char buf[4096];
    size_t got;
    while ((got = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, got);
    ::pclose(p);
  }
  std::remove(path);
  return {true, out};
}

}  // namespace mkernel::daemon::testing
