#include "metrics_text.h"

#include <cmath>
#include <cstdio>

namespace mkernel::daemon {

namespace {

const char* type_name(MetricType t) {
  switch (t) {
    case MetricType::kGauge: return "gauge";
    case MetricType::kCounter: return "counter";
    case MetricType::kHistogram: return "histogram";
  }
  return "untyped";
}

void append_escaped(std::string& out, std::string_view text, bool quotes) {
  for (const char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (quotes && c == '"') {
      out += "\\\"";
    } else {
      out += c;
    }
  }
}

}  // namespace

std::string format_metric_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  // Integers that a double holds exactly are written as integers: counters read naturally.
  if (v == std::floor(v) && std::fabs(v) < 9007199254740992.0) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.0f", v);
    return buf;
  }
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  // The shortest form that reads back the same double.
  for (int digits = 1; digits < 17; ++digits) {
    char shorter[40];
    std::snprintf(shorter, sizeof(shorter), "%.*g", digits, v);
    if (std::strtod(shorter, nullptr) == v) return shorter;
  }
  return buf;
}

std::string to_text(const std::vector<MetricFamily>& families) {
  std::string out;
  out.reserve(families.size() * 256);
  for (const MetricFamily& f : families) {
    out += "# HELP ";
    out += f.name;
    out += ' ';
    append_escaped(out, f.help, false);
    out += "\n# TYPE ";
    out += f.name;
    out += ' ';
    out += type_name(f.type);
    out += '\n';
    for (const MetricSample& s : f.samples) {
      out += f.name;
      out += s.suffix;
      if (!s.labels.empty()) {
        out += '{';
        for (size_t i = 0; i < s.labels.size(); ++i) {
          if (i != 0) out += ',';
          out += s.labels[i].first;
          out += "=\"";
          append_escaped(out, s.labels[i].second, true);
          out += '"';
        }
        out += '}';
      }
      out += ' ';
      out += format_metric_value(s.value);
      out += '\n';
    }
  }
  return out;
}

}  // namespace mkernel::daemon
