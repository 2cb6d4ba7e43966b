// metrics.h: the Prometheus exporter of mkerneld (off by default).
//
// 1. Nothing is mirrored: on every scrape collect_metrics() reads DaemonControl's stats(),
//    health(), status(), refusals() and usage() and builds the metric families from them, so the
//    counters served are exactly the daemon's counters at that moment.
// 2. Names: `mkerneld_` prefix, base units (seconds, bytes), `_total` on counters. Labels come
//    only from small fixed sets: gpu (a configured proxy index), nic (a configured NIC name),
//    outcome (ok, error, rejected), reason (the daemon's fixed set of refusal reasons).
//    docs/operations.md lists every metric.
// 3. The HTTP side is the daemon's own small server (http_server.h): concurrent scrapes, idle
//    connections closed after a bound, one thread; the text format is metrics_text.h's.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "control.h"
#include "http_server.h"
#include "metrics_text.h"
#include "mkernel/common/status.h"

namespace mkernel::daemon {

// The metric families for one snapshot (what a scrape serves).
std::vector<MetricFamily> collect_metrics(const DaemonControl& control);

struct MetricsOptions {
  // "host:port" for /metrics, e.g. "127.0.0.1:9464"; port 0 picks a free port (see port()).
  std::string listen = "127.0.0.1:9464";
  // A connection that has not sent its request (or taken the response) by then is closed.
  std::chrono::milliseconds idle_timeout{5000};
  size_t max_connections = 64;
};

class MetricsExporter {
 public:
  // Binds and starts serving; fails with kUnavailable when the address cannot be bound.
  // `control` must outlive the exporter; scrapes only read it, and an accept that found no
  // descriptor is counted there (DaemonControl::count_out_of_descriptors).
  static StatusOr<std::unique_ptr<MetricsExporter>> start(DaemonControl& control,
                                                          const MetricsOptions& options);
  ~MetricsExporter();
  MetricsExporter(const MetricsExporter&) = delete;
  MetricsExporter& operator=(const MetricsExporter&) = delete;

  // The TCP port actually listened on.
  int port() const;
  // Connections closed for staying idle (http_server.h note 2).
  uint64_t idle_closed() const;
  // Stops serving (waits for running scrapes). Idempotent.
  void stop();

  class Impl;

 private:
  explicit MetricsExporter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace mkernel::daemon
