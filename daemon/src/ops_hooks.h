// ops_hooks.h: starts and stops mkerneld's operations services (gRPC admin and health,
// Prometheus metrics, systemd notification and watchdog) around the daemon core.
#pragma once

#include <memory>

#include "control.h"
#include "mkernel/config/config.h"

namespace mkernel::daemon {

class OpsServices {
 public:
  virtual ~OpsServices() = default;
  virtual void notify_ready() = 0;      // READY=1 (also after a reload)
  virtual void notify_reloading() = 0;  // RELOADING=1
  virtual void notify_stopping() = 0;   // STOPPING=1
  virtual void stop() = 0;              // idempotent
};

StatusOr<std::unique_ptr<OpsServices>> start_ops(DaemonControl& control,
                                                 const config::DaemonConfig& config);

}  // namespace mkernel::daemon
