// metrics.cc: metric families built from DaemonControl snapshots at scrape time.
#include "metrics.h"

#include <exception>
#include <limits>
#include <mutex>
#include <utility>

#include <prometheus/collectable.h>
#include <prometheus/exposer.h>
#include <prometheus/metric_family.h>
#include <spdlog/spdlog.h>

#include "latency_histogram.h"

namespace mkernel::daemon {

namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

constexpr std::string_view kNicPrefix = "mkerneld.nic.";

MetricFamily family(std::string name, std::string help, MetricType type) {
  MetricFamily f;
  f.name = std::move(name);
  f.help = std::move(help);
  f.type = type;
  return f;
}

ClientMetric gauge(double value, std::vector<ClientMetric::Label> labels = {}) {
  ClientMetric m;
  m.label = std::move(labels);
  m.gauge.value = value;
  return m;
}

ClientMetric counter(uint64_t value, std::vector<ClientMetric::Label> labels = {}) {
  ClientMetric m;
  m.label = std::move(labels);
  m.counter.value = static_cast<double>(value);
  return m;
}

double d(uint64_t v) { return static_cast<double>(v); }

class StatsCollectable final : public prometheus::Collectable {
 public:
  explicit StatsCollectable(const DaemonControl& control) : control_(control) {}
  std::vector<MetricFamily> Collect() const override { return collect_metrics(control_); }

 private:
  const DaemonControl& control_;
};

}  // namespace

std::vector<MetricFamily> collect_metrics(const DaemonControl& control) {
  const DaemonStatus status = control.status();
  const std::vector<ProxyStats> stats = control.stats();
  const std::vector<HealthEntry> health = control.health();

  auto up = family("mkerneld_up", "1 while mkerneld answers scrapes", MetricType::Gauge);
  up.metric.push_back(gauge(1));
  auto serving = family("mkerneld_serving",
                        "1 when the whole server is SERVING (not draining, every proxy alive)",
                        MetricType::Gauge);
  auto draining = family("mkerneld_draining", "1 while mkerneld refuses new sessions",
                         MetricType::Gauge);
  draining.metric.push_back(gauge(status.draining ? 1 : 0));
  auto uptime = family("mkerneld_uptime_seconds", "Seconds since mkerneld started",
                       MetricType::Gauge);
  uptime.metric.push_back(gauge(status.uptime_seconds));
  auto generation = family("mkerneld_config_generation",
                           "Applied configurations since start (0 = the startup config)",
                           MetricType::Gauge);
  generation.metric.push_back(gauge(d(status.config_generation)));
  auto sessions = family("mkerneld_sessions", "Client sessions connected now", MetricType::Gauge);
  sessions.metric.push_back(gauge(status.sessions));
  auto nic_up = family("mkerneld_nic_up", "1 when the NIC's health entry is SERVING",
                       MetricType::Gauge);
  for (const auto& h : health) {
    if (h.service.empty()) serving.metric.push_back(gauge(h.serving ? 1 : 0));
    if (h.service.compare(0, kNicPrefix.size(), kNicPrefix) == 0) {
      nic_up.metric.push_back(
          gauge(h.serving ? 1 : 0, {{"nic", h.service.substr(kNicPrefix.size())}}));
    }
  }

  auto proxy_up = family("mkerneld_proxy_up",
                         "1 while the proxy's polling thread checks in within its bound",
                         MetricType::Gauge);
  auto heartbeat = family("mkerneld_proxy_heartbeat_age_seconds",
                          "Seconds since the proxy's polling thread last checked in",
                          MetricType::Gauge);
  auto proxy_sessions = family("mkerneld_proxy_sessions", "Client sessions bound to the proxy",
                               MetricType::Gauge);
  auto rings = family("mkerneld_rings", "Command rings the proxy polls", MetricType::Gauge);
  auto consumed = family("mkerneld_commands_consumed_total",
                         "Commands taken off the rings (= ok + error + rejected + in flight)",
                         MetricType::Counter);
  auto commands = family("mkerneld_commands_total", "Finished commands by outcome",
                         MetricType::Counter);
  auto in_flight = family("mkerneld_commands_in_flight",
                          "Commands posted to the transport and not yet completed",
                          MetricType::Gauge);
  auto bytes = family("mkerneld_bytes_total", "Payload bytes of writes completed ok",
                      MetricType::Counter);
  auto errors = family("mkerneld_errors_total", "Transport errors reported to sessions",
                       MetricType::Counter);
  auto occupancy = family("mkerneld_ring_occupancy",
                          "Commands waiting in the proxy's rings now", MetricType::Gauge);
  auto capacity = family("mkerneld_ring_capacity", "Command slots in the proxy's rings",
                         MetricType::Gauge);
  auto latency = family("mkerneld_command_latency_seconds",
                        "Command latency from ring to completion (power-of-two buckets; "
                        "_sum estimated from bucket midpoints)",
                        MetricType::Histogram);

  for (const auto& p : stats) {
    const std::vector<ClientMetric::Label> gpu{{"gpu", std::to_string(p.gpu)}};
    proxy_up.metric.push_back(gauge(p.alive ? 1 : 0, gpu));
    heartbeat.metric.push_back(gauge(p.seconds_since_heartbeat, gpu));
    proxy_sessions.metric.push_back(gauge(p.sessions, gpu));
    rings.metric.push_back(gauge(p.rings, gpu));
    consumed.metric.push_back(counter(p.consumed, gpu));
    for (size_t o = 0; o < kNumOutcomes; ++o) {
      auto labels = gpu;
      labels.push_back({"outcome", kOutcomeNames[o]});
      commands.metric.push_back(counter(p.by_outcome[o], std::move(labels)));
    }
    in_flight.metric.push_back(gauge(d(p.in_flight), gpu));
    bytes.metric.push_back(counter(p.bytes, gpu));
    errors.metric.push_back(counter(p.errors, gpu));
    occupancy.metric.push_back(gauge(d(p.ring_occupancy), gpu));
    capacity.metric.push_back(gauge(d(p.ring_capacity), gpu));

    ClientMetric h;
    h.label = gpu;
    uint64_t cumulative = 0;
    for (size_t i = 0; i < kLatencyBuckets; ++i) {
      cumulative += p.latency_ns_log2[i];
      ClientMetric::Bucket b;
      b.cumulative_count = cumulative;
      b.upper_bound = i + 1 == kLatencyBuckets ? std::numeric_limits<double>::infinity()
                                               : latency_bucket_upper_ns(i) * 1e-9;
      h.histogram.bucket.push_back(b);
    }
    h.histogram.sample_count = cumulative;
    h.histogram.sample_sum = latency_sum_estimate_ns(p.latency_ns_log2) * 1e-9;
    latency.metric.push_back(std::move(h));
  }

  std::vector<MetricFamily> out;
  for (auto* f : {&up, &serving, &draining, &uptime, &generation, &sessions, &nic_up, &proxy_up,
                  &heartbeat, &proxy_sessions, &rings, &consumed, &commands, &in_flight, &bytes,
                  &errors, &occupancy, &capacity, &latency}) {
    if (!f->metric.empty()) out.push_back(std::move(*f));
  }
  return out;
}

// ---- the exporter -------------------------------------------------------------------------

class MetricsExporter::Impl {
 public:
  std::shared_ptr<StatsCollectable> collectable;
  std::unique_ptr<prometheus::Exposer> exposer;
  int port = 0;
  std::mutex mu;
};

MetricsExporter::MetricsExporter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
MetricsExporter::~MetricsExporter() { stop(); }

StatusOr<std::unique_ptr<MetricsExporter>> MetricsExporter::start(const DaemonControl& control,
                                                                  const MetricsOptions& options) {
  if (options.listen.empty() || options.listen.find(':') == std::string::npos) {
    return Status(StatusCode::kInvalidArgument,
                  "metrics listen: '" + options.listen + "'; expected host:port");
  }
  auto impl = std::make_unique<Impl>();
  impl->collectable = std::make_shared<StatsCollectable>(control);
  try {
    impl->exposer = std::make_unique<prometheus::Exposer>(options.listen, options.http_threads);
  } catch (const std::exception& e) {
    return Status(StatusCode::kUnavailable,
                  "metrics: cannot listen on " + options.listen + ": " + e.what());
  }
  impl->exposer->RegisterCollectable(impl->collectable);
  const std::vector<int> ports = impl->exposer->GetListeningPorts();
  impl->port = ports.empty() ? 0 : ports.front();
  spdlog::info("metrics: Prometheus exporter on {} (port {}) at /metrics", options.listen,
               impl->port);
  return std::unique_ptr<MetricsExporter>(new MetricsExporter(std::move(impl)));
}

int MetricsExporter::port() const { return impl_->port; }

void MetricsExporter::stop() {
  if (!impl_) return;
  std::lock_guard lock(impl_->mu);
  impl_->exposer.reset();  // civetweb stops and joins its threads
}

}  // namespace mkernel::daemon
