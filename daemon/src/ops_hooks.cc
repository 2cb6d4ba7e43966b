#include "ops_hooks.h"

#include <spdlog/spdlog.h>

#include "admin_server.h"
#include "metrics.h"
#include "systemd_notify.h"

namespace mkernel::daemon {

namespace {

class Services final : public OpsServices {
 public:
  std::unique_ptr<AdminServer> admin;
  std::unique_ptr<MetricsExporter> metrics;
  std::unique_ptr<systemd::WatchdogPinger> watchdog;
  std::string ready_text;

  ~Services() override { stop(); }
  void notify_ready() override { (void)systemd::ready(ready_text); }
  void notify_reloading() override { (void)systemd::reloading(); }
  void notify_stopping() override { (void)systemd::stopping(); }
  void stop() override {
    if (watchdog) watchdog->stop();
    if (metrics) metrics->stop();
    if (admin) admin->stop();
  }
};

std::string listen_uri(const config::ListenAddress& a, const std::string& runtime_dir) {
  if (a.kind == config::ListenKind::kUnix)
    return "unix:" + (!a.path.empty() && a.path[0] == '/' ? a.path : runtime_dir + "/" + a.path);
  const bool v6 = a.host.find(':') != std::string::npos;
  return (v6 ? "[" + a.host + "]" : a.host) + ":" + std::to_string(a.port);
}

}  // namespace

StatusOr<std::unique_ptr<OpsServices>> start_ops(DaemonControl& control,
                                                 const config::DaemonConfig& config) {
  auto s = std::make_unique<Services>();
  AdminOptions ao;
  ao.runtime_dir = config.node.runtime_dir;
  for (const auto& a : config.grpc.listen) ao.listen.push_back(listen_uri(a, config.node.runtime_dir));
  ao.socket_mode = config.grpc.socket_mode;
  ao.socket_group = config.grpc.socket_group;
  ao.tls_cert_path = config.grpc.tls.cert;
  ao.tls_key_path = config.grpc.tls.key;
  ao.tls_client_ca_path = config.grpc.tls.client_ca;
  MK_ASSIGN_OR_RETURN(s->admin, AdminServer::start(control, ao));
  std::string where;
  for (const auto& a : s->admin->addresses()) where += (where.empty() ? "" : ", ") + a;
  spdlog::info("admin and health services on {}", where);
  if (config.metrics.enabled) {
    MetricsOptions mo;
    mo.listen = config.metrics.host + ":" + std::to_string(config.metrics.port);
    MK_ASSIGN_OR_RETURN(s->metrics, MetricsExporter::start(control, mo));
    spdlog::info("Prometheus metrics on http://{}:{}/metrics", config.metrics.host, s->metrics->port());
  }
  if (auto interval = systemd::watchdog_interval(); interval.has_value()) {
    MK_ASSIGN_OR_RETURN(s->watchdog, systemd::WatchdogPinger::start(control, *interval));
  }
  s->ready_text = "serving; admin on " + where;
  return std::unique_ptr<OpsServices>(std::move(s));
}

}  // namespace mkernel::daemon
