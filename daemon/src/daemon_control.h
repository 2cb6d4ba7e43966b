// daemon_control.h: the daemon core's side of the operations surface (control.h): status,
// statistics, clients and health read from DaemonState; drain, reload and the stall test hook
// act on it. Every member keeps control.h's contract: thread-safe, never waits on a proxy's
// polling loop or on the event loop, returns within milliseconds.
#pragma once

#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include "control.h"
#include "daemon_state.h"
#include "peering.h"

namespace mkernel::daemon {

class Control final : public DaemonControl {
 public:
  // `peers`: the peer service, told a new bound on forming communicators at reload.
  Control(DaemonState& state, PeerService& peers);

  DaemonStatus status() const override;
  std::vector<ProxyStats> stats() const override;
  std::vector<ClientInfo> clients() const override;
  std::vector<RefusalCount> refusals() const override;
  ResourceUsage usage() const override;
  std::vector<HealthEntry> health() const override;
  Status drain() override;
  Status undrain() override;
  ReloadResult reload(const std::string& path) override;
  Status stall_proxy(uint32_t gpu, std::chrono::milliseconds duration) override;
  bool all_proxies_alive() const override;
  void count_out_of_descriptors(const Status& why) override;

  // A proxy is alive while its thread checked in within this bound (health answers within a
  // second of a stall).
  static constexpr std::chrono::milliseconds kProxyAliveBound{500};

 private:
  bool proxy_alive(const Proxy& p) const { return p.since_heartbeat() < kProxyAliveBound; }

  DaemonState& state_;
  PeerService& peers_;
  std::mutex reload_mu_;  // one reload at a time (SIGHUP and the admin service may overlap)
};

}  // namespace mkernel::daemon
