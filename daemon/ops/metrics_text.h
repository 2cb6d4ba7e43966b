// metrics_text.h: metric families and the Prometheus text exposition format (version 0.0.4)
// they are served in.
//
// 1. A family is a name, its help text, its type and its samples; a sample is the family's name
//    plus a suffix (`_bucket`, `_sum`, `_count` for histograms), labels and a value.
// 2. to_text() writes `# HELP` and `# TYPE` once per family, then its samples. Help text escapes
//    `\` and newline; label values escape `\`, `"` and newline, so no value can break a line.
// 3. Values: integers below 2^53 as integers, other finite values with the digits needed to
//    read back the same double, and the special values spelled as the format wants them: `NaN`,
//    `+Inf`, `-Inf`. `promtool check metrics` accepts the output; tests/cpu/daemon checks it
//    with a strict parser and with promtool where it is installed.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace mkernel::daemon {

enum class MetricType { kGauge, kCounter, kHistogram };

struct MetricSample {
  std::string suffix;                                       // "" or "_bucket", "_sum", "_count"
  std::vector<std::pair<std::string, std::string>> labels;  // in order
  double value = 0;
};

struct MetricFamily {
  std::string name;
  std::string help;
  MetricType type = MetricType::kGauge;
  std::vector<MetricSample> samples;
};

// Note 3.
std::string format_metric_value(double value);
// The whole exposition (note 2).
std::string to_text(const std::vector<MetricFamily>& families);

}  // namespace mkernel::daemon
