// metrics.h: the Prometheus exporter of mkerneld (off by default).
//
// 1. Nothing is mirrored: on every scrape a Collectable reads DaemonControl::stats(),
//    health() and status() and builds the metric families from them, so the counters served are
//    exactly the daemon's counters at that moment.
// 2. Names: `mkerneld_` prefix, base units (seconds, bytes), `_total` on counters. Labels come
//    only from small fixed sets: gpu (a configured proxy index), nic (a configured NIC name),
//    outcome (ok, error, rejected). docs/operations.md lists every metric.
// 3. The HTTP side is prometheus-cpp's Exposer (civetweb) serving /metrics on one address.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "control.h"
#include "mkernel/common/status.h"

namespace prometheus {
struct MetricFamily;
}

namespace mkernel::daemon {

// The metric families for one snapshot (also what a scrape serves, minus the exposer's own).
std::vector<prometheus::MetricFamily> collect_metrics(const DaemonControl& control);

struct MetricsOptions {
  // "host:port" for /metrics, e.g. "127.0.0.1:9464"; port 0 picks a free port (see port()).
  std::string listen = "127.0.0.1:9464";
  size_t http_threads = 2;
};

class MetricsExporter {
 public:
  // Binds and starts serving; fails with kUnavailable when the address cannot be bound.
  // `control` must outlive the exporter.
  static StatusOr<std::unique_ptr<MetricsExporter>> start(const DaemonControl& control,
                                                          const MetricsOptions& options);
  ~MetricsExporter();
  MetricsExporter(const MetricsExporter&) = delete;
  MetricsExporter& operator=(const MetricsExporter&) = delete;

  // The TCP port actually listened on.
  int port() const;
  // Stops serving (waits for running scrapes). Idempotent.
  void stop();

  class Impl;

 private:
  explicit MetricsExporter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace mkernel::daemon
