// config.cc: the built-in config, the YAML writer, the reload rules and the daemon's helpers.
#include <algorithm>
#include <string>
#include <vector>

#include "mkernel/config/config.h"
#include "text.h"

namespace mkernel::config {
namespace {

using detail::quoted;

// ---- writer -----------------------------------------------------------------------------

class Writer {
 public:
  // `key: value` at the current depth; `value` must already be valid YAML.
  void line(std::string_view key, const std::string& value) {
    indent();
    out_ += key;
    out_ += ": ";
    out_ += value;
    out_ += '\n';
  }
  void open(std::string_view key) {
    indent();
    out_ += key;
    out_ += ":\n";
    ++depth_;
  }
  void close() { --depth_; }
  // The first key of a list item: `- key: value`; the item's other keys follow one level in.
  void item(std::string_view key, const std::string& value) {
    indent();
    out_ += "- ";
    out_ += key;
    out_ += ": ";
    out_ += value;
    out_ += '\n';
    ++depth_;
  }
  void comment(std::string_view text) {
    out_ += "# ";
    out_ += text;
    out_ += '\n';
  }
  std::string take() { return std::move(out_); }

 private:
  void indent() { out_.append(static_cast<size_t>(depth_) * 2, ' '); }
  std::string out_;
  int depth_ = 0;
};

std::string flow_list(const std::vector<uint32_t>& items) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) {
    if (i != 0) out += ", ";
    out += std::to_string(items[i]);
  }
  return out + "]";
}

std::string affinity_text(const CpuAffinity& a) {
  switch (a.mode) {
    case CpuAffinityMode::kAuto: return "auto";
    case CpuAffinityMode::kNone: return "none";
    case CpuAffinityMode::kList: return quoted(detail::format_cpu_list(a.cpus));
  }
  return "auto";
}

void write_poll(Writer& w, const PollConfig& p) {
  w.open("poll");
  w.line("mode", std::string(to_string(p.mode)));
  w.line("spin_us", std::to_string(p.spin.count()));
  w.line("sleep_us", std::to_string(p.sleep.count()));
  w.close();
}

void write_batch(Writer& w, const BatchConfig& b) {
  w.open("batch");
  w.line("max_commands", std::to_string(b.max_commands));
  w.close();
}

void write_transport(Writer& w, const TransportConfig& t) {
  w.open("transport");
  w.line("kind", std::string(to_string(t.kind)));
  w.line("provider", quoted(t.provider));
  w.line("nic", quoted(t.nic));
  w.line("signal_value", std::string(to_string(t.signal_value)));
  w.line("write_piece_bytes",
         t.write_piece_bytes == kAutoWritePieceBytes ? std::string("auto") : std::to_string(t.write_piece_bytes));
  w.close();
}

void write_share(Writer& w, std::string_view key, const ShareQuota& q) {
  w.open(key);
  w.line("sessions", std::to_string(q.sessions));
  w.line("sessions_per_gpu", std::to_string(q.sessions_per_gpu));
  w.line("rings", std::to_string(q.rings));
  w.line("regions", std::to_string(q.regions));
  w.line("shared_memory", detail::format_bytes(q.shared_memory));
  w.line("descriptors", std::to_string(q.descriptors));
  w.line("networks", std::to_string(q.networks));
  w.close();
}

// `["unix:admin.sock", "tcp:[::]:50051"]`
std::string listen_list(const std::vector<ListenAddress>& addresses) {
  std::string out = "[";
  for (size_t i = 0; i < addresses.size(); ++i) {
    if (i != 0) out += ", ";
    out += quoted(to_string(addresses[i]));
  }
  return out + "]";
}

// ---- reload -----------------------------------------------------------------------------

const GpuOverride* find_override(const DaemonConfig& c, uint32_t gpu) {
  for (const GpuOverride& o : c.overrides) {
    if (o.gpu == gpu) return &o;
  }
  return nullptr;
}

// GPUs with an override in either config, in order of first appearance.
std::vector<uint32_t> override_gpus(const DaemonConfig& a, const DaemonConfig& b) {
  std::vector<uint32_t> gpus;
  for (const auto* c : {&a, &b}) {
    for (const GpuOverride& o : c->overrides) {
      if (std::find(gpus.begin(), gpus.end(), o.gpu) == gpus.end()) gpus.push_back(o.gpu);
    }
  }
  return gpus;
}

}  // namespace

DaemonConfig default_config() { return DaemonConfig{}; }

std::string to_yaml(const DaemonConfig& c) {
  Writer w;
  w.comment("mkerneld configuration; every key is described in docs/config.md.");

  w.open("node");
  w.line("name", quoted(c.node.name));
  w.line("runtime_dir", quoted(c.node.runtime_dir));
  w.close();

  w.open("gpus");
  w.line("select", std::string(to_string(c.gpus.select)));
  switch (c.gpus.select) {
    case GpuSelect::kAll: w.line("fallback_host_slots", std::to_string(c.gpus.fallback_host_slots));
      break;
    case GpuSelect::kList: w.line("ids", flow_list(c.gpus.ids)); break;
    case GpuSelect::kHostSlots: w.line("host_slots", std::to_string(c.gpus.host_slots)); break;
  }
  w.close();

  w.open("proxy");
  w.line("cpu_affinity", affinity_text(c.proxy.cpu_affinity));
  write_poll(w, c.proxy.poll);
  write_batch(w, c.proxy.batch);
  w.close();

  write_transport(w, c.transport);

  if (c.overrides.empty()) {
    w.line("overrides", "[]");
  } else {
    w.open("overrides");
    for (const GpuOverride& o : c.overrides) {
      w.item("gpu", std::to_string(o.gpu));
      if (o.cpu_affinity) w.line("cpu_affinity", affinity_text(*o.cpu_affinity));
      if (o.poll) write_poll(w, *o.poll);
      if (o.batch) write_batch(w, *o.batch);
      if (o.transport) write_transport(w, *o.transport);
      w.close();
    }
    w.close();
  }

  w.open("rings");
  w.line("capacity", std::to_string(c.rings.capacity));
  w.line("max_capacity", std::to_string(c.rings.max_capacity));
  w.close();

  w.open("clients");
  w.line("max_per_gpu", std::to_string(c.clients.max_per_gpu));
  w.line("max_sessions", std::to_string(c.clients.max_sessions));
  w.line("max_descriptors", std::to_string(c.clients.max_descriptors));
  w.line("max_shared_memory", detail::format_bytes(c.clients.max_shared_memory));
  w.line("max_queued_replies", std::to_string(c.clients.max_queued_replies));
  w.line("max_networks", std::to_string(c.clients.max_networks));
  w.open("quota");
  w.line("rings", std::to_string(c.clients.quota.rings));
  w.line("regions", std::to_string(c.clients.quota.regions));
  w.line("registered_bytes", detail::format_bytes(c.clients.quota.registered_bytes));
  w.line("inflight_commands", std::to_string(c.clients.quota.inflight_commands));
  w.close();
  write_share(w, "per_uid", c.clients.per_uid);
  write_share(w, "per_process", c.clients.per_process);
  w.close();

  w.open("timeouts");
  w.line("handshake_ms", std::to_string(c.timeouts.handshake.count()));
  w.line("rendezvous_ms", std::to_string(c.timeouts.rendezvous.count()));
  w.line("connect_ms", std::to_string(c.timeouts.connect.count()));
  w.line("command_ms", std::to_string(c.timeouts.command.count()));
  w.line("drain_ms", std::to_string(c.timeouts.drain.count()));
  w.close();

  w.open("client_socket");
  w.line("path", quoted(c.client_socket.path));
  w.line("group", quoted(c.client_socket.group));
  w.line("mode", quoted(detail::format_mode(c.client_socket.mode)));
  w.line("allowed_uids", flow_list(c.client_socket.allowed_uids));
  w.line("allowed_gids", flow_list(c.client_socket.allowed_gids));
  w.close();

  w.open("grpc");
  w.line("listen", listen_list(c.grpc.listen));
  w.line("socket_group", quoted(c.grpc.socket_group));
  w.line("socket_mode", quoted(detail::format_mode(c.grpc.socket_mode)));
  w.open("tls");
  w.line("cert", quoted(c.grpc.tls.cert));
  w.line("key", quoted(c.grpc.tls.key));
  w.line("client_ca", quoted(c.grpc.tls.client_ca));
  w.close();
  w.close();

  w.open("peer");
  w.line("listen", listen_list(c.peer.listen));
  w.line("advertise", quoted(c.peer.advertise));
  w.line("max_forming", std::to_string(c.peer.max_forming));
  w.close();

  w.open("logging");
  w.line("level", std::string(to_string(c.logging.level)));
  w.line("format", std::string(to_string(c.logging.format)));
  w.close();

  w.open("metrics");
  w.line("enabled", c.metrics.enabled ? "true" : "false");
  w.line("listen", quoted(detail::format_host_port(c.metrics.host, c.metrics.port)));
  w.close();
  return w.take();
}

std::vector<std::string> restart_required_changes(const DaemonConfig& a, const DaemonConfig& b) {
  std::vector<std::string> out;
  const auto check = [&out](bool differs, const char* name) {
    if (differs) out.emplace_back(name);
  };
  check(a.node.name != b.node.name, "node.name");
  check(a.node.runtime_dir != b.node.runtime_dir, "node.runtime_dir");
  check(a.gpus.select != b.gpus.select, "gpus.select");
  check(a.gpus.ids != b.gpus.ids, "gpus.ids");
  check(a.gpus.host_slots != b.gpus.host_slots, "gpus.host_slots");
  check(a.gpus.fallback_host_slots != b.gpus.fallback_host_slots, "gpus.fallback_host_slots");
  check(a.proxy.cpu_affinity != b.proxy.cpu_affinity, "proxy.cpu_affinity");
  check(a.transport.kind != b.transport.kind, "transport.kind");
  check(a.transport.provider != b.transport.provider, "transport.provider");
  check(a.transport.nic != b.transport.nic, "transport.nic");
  check(a.transport.signal_value != b.transport.signal_value, "transport.signal_value");
  check(a.transport.write_piece_bytes != b.transport.write_piece_bytes, "transport.write_piece_bytes");
  for (const uint32_t gpu : override_gpus(a, b)) {
    const GpuOverride* oa = find_override(a, gpu);
    const GpuOverride* ob = find_override(b, gpu);
    const auto affinity = [](const GpuOverride* o) {
      return o != nullptr ? o->cpu_affinity : std::nullopt;
    };
    const auto transport = [](const GpuOverride* o) {
      return o != nullptr ? o->transport : std::nullopt;
    };
    const std::string prefix = "overrides[gpu=" + std::to_string(gpu) + "].";
    if (affinity(oa) != affinity(ob)) out.push_back(prefix + "cpu_affinity");
    if (transport(oa) != transport(ob)) out.push_back(prefix + "transport");
  }
  check(a.rings.capacity != b.rings.capacity, "rings.capacity");
  check(a.client_socket.path != b.client_socket.path, "client_socket.path");
  check(a.client_socket.group != b.client_socket.group, "client_socket.group");
  check(a.client_socket.mode != b.client_socket.mode, "client_socket.mode");
  check(a.grpc.listen != b.grpc.listen, "grpc.listen");
  check(a.grpc.socket_group != b.grpc.socket_group, "grpc.socket_group");
  check(a.grpc.socket_mode != b.grpc.socket_mode, "grpc.socket_mode");
  check(a.grpc.tls.cert != b.grpc.tls.cert, "grpc.tls.cert");
  check(a.grpc.tls.key != b.grpc.tls.key, "grpc.tls.key");
  check(a.grpc.tls.client_ca != b.grpc.tls.client_ca, "grpc.tls.client_ca");
  check(a.peer.listen != b.peer.listen, "peer.listen");
  check(a.peer.advertise != b.peer.advertise, "peer.advertise");
  check(a.metrics.enabled != b.metrics.enabled, "metrics.enabled");
  check(a.metrics.host != b.metrics.host || a.metrics.port != b.metrics.port, "metrics.listen");
  return out;
}

DaemonConfig hot_reloaded(const DaemonConfig& running, const DaemonConfig& loaded) {
  DaemonConfig out = running;
  out.proxy.poll = loaded.proxy.poll;
  out.proxy.batch = loaded.proxy.batch;
  out.clients = loaded.clients;
  out.rings.max_capacity = loaded.rings.max_capacity;  // a limit on new requests: hot
  out.timeouts = loaded.timeouts;
  out.client_socket.allowed_uids = loaded.client_socket.allowed_uids;
  out.client_socket.allowed_gids = loaded.client_socket.allowed_gids;
  out.peer.max_forming = loaded.peer.max_forming;
  out.logging = loaded.logging;

  // Per GPU: polling and batching from `loaded`, affinity and transport from `running`.
  out.overrides.clear();
  for (const uint32_t gpu : override_gpus(running, loaded)) {
    const GpuOverride* r = find_override(running, gpu);
    const GpuOverride* l = find_override(loaded, gpu);
    GpuOverride o;
    o.gpu = gpu;
    if (r != nullptr) {
      o.cpu_affinity = r->cpu_affinity;
      o.transport = r->transport;
    }
    if (l != nullptr) {
      o.poll = l->poll;
      o.batch = l->batch;
    }
    const bool empty = !o.cpu_affinity && !o.transport && !o.poll && !o.batch;
    if (r != nullptr || !empty) out.overrides.push_back(std::move(o));
  }
  return out;
}

ProxySettings proxy_settings(const DaemonConfig& c, uint32_t gpu) {
  ProxySettings s{c.proxy.cpu_affinity, c.proxy.poll, c.proxy.batch, c.transport};
  if (const GpuOverride* o = find_override(c, gpu)) {
    if (o->cpu_affinity) s.cpu_affinity = *o->cpu_affinity;
    if (o->poll) s.poll = *o->poll;
    if (o->batch) s.batch = *o->batch;
    if (o->transport) s.transport = *o->transport;
  }
  return s;
}

std::string runtime_path(const DaemonConfig& c, const std::string& path) {
  return detail::join_path(c.node.runtime_dir, path);
}

std::string client_socket_path(const DaemonConfig& c) {
  return runtime_path(c, c.client_socket.path);
}

std::string grpc_uri(const DaemonConfig& c, const ListenAddress& a) {
  if (a.kind == ListenKind::kUnix) return "unix:" + runtime_path(c, a.path);
  return detail::format_host_port(a.host, a.port);
}

std::string peer_advertise_target(const DaemonConfig& c) {
  if (c.peer.advertise.empty()) {
    return c.peer.listen.empty() ? std::string() : grpc_uri(c, c.peer.listen.front());
  }
  const std::optional<ListenAddress> a = detail::parse_listen(c.peer.advertise);
  return a ? grpc_uri(c, *a) : std::string();
}

std::string to_string(const ListenAddress& a) {
  if (a.kind == ListenKind::kUnix) return "unix:" + a.path;
  return "tcp:" + detail::format_host_port(a.host, a.port);
}

}  // namespace mkernel::config
