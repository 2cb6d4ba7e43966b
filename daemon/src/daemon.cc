#include "daemon.h"

#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <cerrno>
#include <thread>

#include "mkernel/protocol/version.h"
#include "topology.h"

namespace mkernel::daemon {

using namespace std::chrono_literals;

namespace {

Status make_dirs(const std::string& dir, mode_t mode) {
  std::string cur;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = dir.find('/', pos + 1);
    cur = dir.substr(0, pos);
    if (cur.empty()) continue;
    if (::mkdir(cur.c_str(), mode) != 0 && errno != EEXIST) return errno_status("creating runtime directory " + cur, errno);
  }
  return Status::Ok();
}

// The soft descriptor limit raised to the hard one (what a shell or a unit without LimitNOFILE
// gives is often far below what the hard limit allows); returns the limit in force.
uint64_t raise_descriptor_limit() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return 0;
  if (rl.rlim_cur < rl.rlim_max) {
    rlimit raised = rl;
    raised.rlim_cur = rl.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) rl = raised;
  }
  return rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : static_cast<uint64_t>(rl.rlim_cur);
}

}  // namespace

Daemon::Daemon(DaemonOptions options)
    : state_(std::move(options)), connects_([this] { loop_.wake(); }), loop_(state_, connects_), control_(state_, peers_) {}

Daemon::~Daemon() { stop(); }

Status Daemon::start() {
  const config::DaemonConfig cfg = state_.config();
  state_.set_descriptor_limit(raise_descriptor_limit());
  {
    const LedgerLimits limits = state_.limits();
    if (limits.descriptor_budget < cfg.clients.max_descriptors)
      spdlog::warn("descriptors: the process may open {} (RLIMIT_NOFILE); {} are kept for admin, health, metrics "
                   "and peers, so clients get {} instead of clients.max_descriptors {}. Give mkerneld a limit "
                   "of at least {} (LimitNOFILE= in its unit)",
                   state_.descriptor_limit(), config::reserved_descriptors(state_.descriptor_limit()),
                   limits.descriptor_budget,
                   cfg.clients.max_descriptors, uint64_t{cfg.clients.max_descriptors} + config::kReservedDescriptors);
    else
      spdlog::info("descriptors: limit {}, {} for clients (clients.max_descriptors), {} kept for admin, health, "
                   "metrics and peers",
                   state_.descriptor_limit(), limits.descriptor_budget,
                   config::reserved_descriptors(state_.descriptor_limit()));
  }
  state_.runtime_dir = cfg.node.runtime_dir;
  MK_RETURN_IF_ERROR(make_dirs(state_.runtime_dir, 0750));
  MK_RETURN_IF_ERROR(loop_.open());
  MK_RETURN_IF_ERROR(peers_.start(cfg));
  state_.peer_address = peers_.address();
  MK_RETURN_IF_ERROR(start_proxies());
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  for (auto& p : state_.proxies) {
    while (!p->started()) {
      if (std::chrono::steady_clock::now() > deadline)
        return Status(StatusCode::kDeadlineExceeded, "proxy " + p->options().name + " did not start within 5 s");
      std::this_thread::sleep_for(1ms);
    }
  }
  loop_.start();
  spdlog::info("mkerneld serving {} proxies on {} (epoch {}, protocol v{})", state_.proxies.size(), state_.socket_path,
               state_.epoch, protocol::kProtocolVersion);
  return Status::Ok();
}

Status Daemon::start_proxies() {
  const config::DaemonConfig cfg = state_.config();
  // Which proxies: GPUs found (or listed), else host-only slots.
  std::vector<std::pair<uint32_t, bool>> slots;  // (index, is_gpu)
  const std::vector<std::string> gpu_pci = list_nvidia_gpus();
  const uint32_t found = static_cast<uint32_t>(gpu_pci.size());
  switch (cfg.gpus.select) {
    case config::GpuSelect::kAll:
      if (found > 0) {
        for (uint32_t i = 0; i < found; ++i) slots.emplace_back(i, true);
      } else {
        spdlog::info("no NVIDIA GPU found (/proc/driver/nvidia/gpus); serving {} host-only slot(s)",
                     cfg.gpus.fallback_host_slots);
        for (uint32_t i = 0; i < cfg.gpus.fallback_host_slots; ++i) slots.emplace_back(i, false);
      }
      break;
    case config::GpuSelect::kList:
      for (uint32_t id : cfg.gpus.ids) {
        if (id >= found)
          spdlog::warn("gpus.ids lists GPU {} but the driver shows {} GPU(s); its proxy serves "
                       "host clients only", id, found);
        slots.emplace_back(id, id < found);
      }
      break;
    case config::GpuSelect::kHostSlots:
      for (uint32_t i = 0; i < cfg.gpus.host_slots; ++i) slots.emplace_back(i, false);
      break;
  }
  // The NIC each GPU would use (nearest in the PCI tree, or as configured).
  {
    const Topology topo;
    const auto nearest = topo.nearest_nics(gpu_pci);
    for (size_t i = 0; i < nearest.size(); ++i) {
      const config::ProxySettings ps = config::proxy_settings(cfg, static_cast<uint32_t>(i));
      if (ps.transport.nic != "auto")
        spdlog::info("gpu{}: NIC {} (configured)", i, ps.transport.nic);
      else
        spdlog::info("gpu{}: nearest NIC {} ({})", i, nearest[i].nic.empty() ? "none" : nearest[i].nic,
                     nearest[i].reason);
    }
  }
  for (const auto& [index, is_gpu] : slots) {
    const config::ProxySettings ps = config::proxy_settings(cfg, index);
    // Ranks on this daemon are reached by the loopback; ranks on other daemons through the
    // network transport the probe finds (what it found is logged once per proxy).
    TransportProbe probe = probe_transport(ps.transport, target_host(state_.peer_address));
    spdlog::info("{}{}: communicators spanning daemons use {}", is_gpu ? "gpu" : "host", index, probe.summary());
    if (!probe.status.ok())
      spdlog::warn("{}{}: only communicators whose ranks all use this daemon can connect", is_gpu ? "gpu" : "host",
                   index);
    ProxyOptions po;
    po.index = index;
    po.name = (is_gpu ? "gpu" : "host") + std::to_string(index);
    if (ps.cpu_affinity.mode == config::CpuAffinityMode::kList) {
      po.cpus = ps.cpu_affinity.cpus;
    } else if (ps.cpu_affinity.mode == config::CpuAffinityMode::kAuto && is_gpu) {
      // The CPUs of the GPU's NUMA node, from the PCI topology.
      po.cpus = cpus_near_pci_device(gpu_pci[index]);
      spdlog::info("proxy gpu{}: GPU at {}; pinned to the {} CPU(s) of its NUMA node", index, gpu_pci[index],
                   po.cpus.size());
    }
    po.spin = ps.poll.mode == config::PollMode::kSpin;
    po.spin_for = ps.poll.spin;
    po.sleep_for = ps.poll.sleep;
    po.batch = ps.batch.max_commands;
    po.command_timeout = cfg.timeouts.command;
    if (probe.status.ok()) {
      po.network = (probe.choice.kind == config::TransportKind::kVerbs ? "verbs:" : "fabric:") +
                   probe.capabilities.provider;
      po.nic = probe.choice.domain;
    }
    state_.probes.push_back(std::move(probe));
    auto proxy = std::make_unique<Proxy>(std::move(po), [this](uint64_t id) { loop_.session_ended_by_proxy(id); });
    MK_RETURN_IF_ERROR(proxy->start());
    state_.proxies.push_back(std::move(proxy));
  }
  return Status::Ok();
}

void Daemon::stop() {
  if (stopped_.exchange(true)) return;
  // Rendezvous in progress ends first (joins waiting at this root are cancelled, ours too).
  peers_.shutdown(std::chrono::system_clock::now() + 2s);
  connects_.cancel(0);
  // The event loop ends every session (clients are told) and closes the client socket.
  loop_.stop();
  connects_.join_all();
  peers_.stop();
  // Every session has ended; now the proxies.
  for (auto& p : state_.proxies) p->stop();
  state_.proxies.clear();
}

}  // namespace mkernel::daemon
