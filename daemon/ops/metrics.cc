// metrics.cc: metric families built from DaemonControl snapshots at scrape time.
#include "metrics.h"

#include <limits>
#include <mutex>
#include <utility>

#include <spdlog/spdlog.h>

#include "latency_histogram.h"

namespace mkernel::daemon {

namespace {

constexpr std::string_view kNicPrefix = "mkerneld.nic.";

using Labels = std::vector<std::pair<std::string, std::string>>;

MetricFamily family(std::string name, std::string help, MetricType type) {
  MetricFamily f;
  f.name = std::move(name);
  f.help = std::move(help);
  f.type = type;
  return f;
}

void add(MetricFamily& f, double value, Labels labels = {}, std::string suffix = "") {
  f.samples.push_back(MetricSample{std::move(suffix), std::move(labels), value});
}

double d(uint64_t v) { return static_cast<double>(v); }

}  // namespace

std::vector<MetricFamily> collect_metrics(const DaemonControl& control) {
  const DaemonStatus status = control.status();
  const std::vector<ProxyStats> stats = control.stats();
  const std::vector<HealthEntry> health = control.health();

  auto up = family("mkerneld_up", "1 while mkerneld answers scrapes", MetricType::kGauge);
  add(up, 1);
  auto serving = family("mkerneld_serving",
                        "1 when the whole server is SERVING (not draining, every proxy alive)", MetricType::kGauge);
  auto draining = family("mkerneld_draining", "1 while mkerneld refuses new sessions", MetricType::kGauge);
  add(draining, status.draining ? 1 : 0);
  auto uptime = family("mkerneld_uptime_seconds", "Seconds since mkerneld started", MetricType::kGauge);
  add(uptime, status.uptime_seconds);
  auto generation = family("mkerneld_config_generation", "Applied configurations since start (0 = the startup config)",
                           MetricType::kGauge);
  add(generation, d(status.config_generation));
  auto sessions = family("mkerneld_sessions", "Client sessions connected now", MetricType::kGauge);
  add(sessions, status.sessions);
  auto nic_up = family("mkerneld_nic_up", "1 when the NIC's health entry is SERVING", MetricType::kGauge);
  for (const auto& h : health) {
    if (h.service.empty()) add(serving, h.serving ? 1 : 0);
    if (h.service.compare(0, kNicPrefix.size(), kNicPrefix) == 0)
      add(nic_up, h.serving ? 1 : 0, {{"nic", h.service.substr(kNicPrefix.size())}});
  }

  // Refusals and what clients hold against the node's limits.
  auto refusals = family("mkerneld_refusals_total",
                         "Clients refused, by reason (a kind of refusal, or the config key of the limit)",
                         MetricType::kCounter);
  for (const auto& r : status.refusals) add(refusals, d(r.count), {{"reason", r.reason}});
  const ResourceUsage& u = status.usage;
  auto client_fds = family("mkerneld_client_descriptors", "Descriptors held for clients", MetricType::kGauge);
  add(client_fds, d(u.client_descriptors));
  auto fd_budget = family("mkerneld_client_descriptor_budget",
                          "Descriptors clients may hold together (clients.max_descriptors, or less)",
                          MetricType::kGauge);
  add(fd_budget, d(u.descriptor_budget));
  auto open_fds = family("mkerneld_open_descriptors", "Descriptors the process has open", MetricType::kGauge);
  add(open_fds, d(u.open_descriptors));
  auto fd_limit = family("mkerneld_descriptor_limit", "The process's descriptor limit (RLIMIT_NOFILE)",
                         MetricType::kGauge);
  add(fd_limit, u.descriptor_limit >= (uint64_t{1} << 53) ? std::numeric_limits<double>::infinity()
                                                          : d(u.descriptor_limit));
  auto shm = family("mkerneld_shared_memory_bytes", "Shared memory made for clients (rings, host regions, flags)",
                    MetricType::kGauge);
  add(shm, d(u.shared_memory));
  auto shm_limit = family("mkerneld_shared_memory_limit_bytes", "clients.max_shared_memory", MetricType::kGauge);
  add(shm_limit, d(u.max_shared_memory));
  auto resident = family("mkerneld_resident_memory_bytes", "The process's resident memory", MetricType::kGauge);
  add(resident, d(u.resident_bytes));

  auto proxy_up = family("mkerneld_proxy_up", "1 while the proxy's polling thread checks in within its bound",
                         MetricType::kGauge);
  auto heartbeat = family("mkerneld_proxy_heartbeat_age_seconds",
                          "Seconds since the proxy's polling thread last checked in", MetricType::kGauge);
  auto proxy_sessions = family("mkerneld_proxy_sessions", "Client sessions bound to the proxy", MetricType::kGauge);
  auto rings = family("mkerneld_rings", "Command rings the proxy polls", MetricType::kGauge);
  auto consumed = family("mkerneld_commands_consumed_total",
                         "Commands taken off the rings (= ok + error + rejected + in flight)", MetricType::kCounter);
  auto commands = family("mkerneld_commands_total", "Finished commands by outcome", MetricType::kCounter);
  auto in_flight = family("mkerneld_commands_in_flight", "Commands posted to the transport and not yet completed",
                          MetricType::kGauge);
  auto bytes = family("mkerneld_bytes_total", "Payload bytes of writes completed ok", MetricType::kCounter);
  auto errors = family("mkerneld_errors_total", "Transport errors reported to sessions", MetricType::kCounter);
  auto occupancy = family("mkerneld_ring_occupancy", "Commands waiting in the proxy's rings now", MetricType::kGauge);
  auto capacity = family("mkerneld_ring_capacity", "Command slots in the proxy's rings", MetricType::kGauge);
  auto latency = family("mkerneld_command_latency_seconds",
                        "Command latency from ring to completion (power-of-two buckets; _sum estimated from bucket "
                        "midpoints)",
                        MetricType::kHistogram);

  for (const auto& p : stats) {
    const Labels gpu{{"gpu", std::to_string(p.gpu)}};
    add(proxy_up, p.alive ? 1 : 0, gpu);
    add(heartbeat, p.seconds_since_heartbeat, gpu);
    add(proxy_sessions, p.sessions, gpu);
    add(rings, p.rings, gpu);
    add(consumed, d(p.consumed), gpu);
    for (size_t o = 0; o < kNumOutcomes; ++o) {
      Labels labels = gpu;
      labels.emplace_back("outcome", kOutcomeNames[o]);
      add(commands, d(p.by_outcome[o]), std::move(labels));
    }
    add(in_flight, d(p.in_flight), gpu);
    add(bytes, d(p.bytes), gpu);
    add(errors, d(p.errors), gpu);
    add(occupancy, d(p.ring_occupancy), gpu);
    add(capacity, d(p.ring_capacity), gpu);

    uint64_t cumulative = 0;
    for (size_t i = 0; i < kLatencyBuckets; ++i) {
      cumulative += p.latency_ns_log2[i];
      Labels labels = gpu;
      labels.emplace_back("le", i + 1 == kLatencyBuckets ? "+Inf"
                                                         : format_metric_value(latency_bucket_upper_ns(i) * 1e-9));
      add(latency, d(cumulative), std::move(labels), "_bucket");
    }
    add(latency, latency_sum_estimate_ns(p.latency_ns_log2) * 1e-9, gpu, "_sum");
    add(latency, d(cumulative), gpu, "_count");
  }

  std::vector<MetricFamily> out;
  for (auto* f : {&up, &serving, &draining, &uptime, &generation, &sessions, &nic_up, &refusals, &client_fds,
                  &fd_budget, &open_fds, &fd_limit, &shm, &shm_limit, &resident, &proxy_up, &heartbeat,
                  &proxy_sessions, &rings, &consumed, &commands, &in_flight, &bytes, &errors, &occupancy, &capacity,
                  &latency}) {
    if (!f->samples.empty()) out.push_back(std::move(*f));
  }
  return out;
}

// ---- the exporter -------------------------------------------------------------------------

class MetricsExporter::Impl {
 public:
  std::unique_ptr<HttpServer> server;
  std::mutex mu;
};

MetricsExporter::MetricsExporter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
MetricsExporter::~MetricsExporter() { stop(); }

StatusOr<std::unique_ptr<MetricsExporter>> MetricsExporter::start(DaemonControl& control,
                                                                  const MetricsOptions& options) {
  HttpServerOptions ho;
  ho.listen = options.listen;
  ho.idle_timeout = options.idle_timeout;
  ho.max_connections = options.max_connections;
  ho.on_out_of_descriptors = [&control](const Status& why) { control.count_out_of_descriptors(why); };
  auto impl = std::make_unique<Impl>();
  MK_ASSIGN_OR_RETURN(impl->server,
                      HttpServer::start(ho, [&control] { return to_text(collect_metrics(control)); }));
  spdlog::info("metrics: Prometheus text format on {} (port {}) at /metrics", options.listen, impl->server->port());
  return std::unique_ptr<MetricsExporter>(new MetricsExporter(std::move(impl)));
}

int MetricsExporter::port() const { return impl_->server ? impl_->server->port() : 0; }

uint64_t MetricsExporter::idle_closed() const { return impl_->server ? impl_->server->idle_closed() : 0; }

void MetricsExporter::stop() {
  if (!impl_) return;
  std::lock_guard lock(impl_->mu);
  if (impl_->server) impl_->server->stop();
}

}  // namespace mkernel::daemon
