// mkerneldctl: the operator's command line for one mkerneld, over its gRPC admin socket.
//
// Exit codes (also in --help): 0 ok / healthy, 1 unhealthy or refused, 2 unreachable,
// 3 usage error.
#include <sys/stat.h>

#include <grpcpp/grpcpp.h>
#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "latency_histogram.h"
#include "log_text.h"
#include "mkernel/proto/admin.grpc.pb.h"
#include "mkernel/proto/health.grpc.pb.h"

namespace {

namespace pb = ::mkernel::admin::v1;
using HealthResponse = ::grpc::health::v1::HealthCheckResponse;

constexpr int kExitOk = 0;
constexpr int kExitUnhealthy = 1;
constexpr int kExitUnreachable = 2;
constexpr int kExitUsage = 3;

constexpr const char* kDefaultRuntimeDir = "/run/mkerneld";
// Admin socket names looked for in the runtime directory, in this order: the operations
// default, then the name the config's built-in default uses (grpc.listen: unix:admin.sock).
constexpr const char* kAdminSocketNames[] = {"admin.sock"};

struct Options {
  std::string format = "text";
  double timeout_s = 5.0;
  std::string runtime_dir = kDefaultRuntimeDir;
  std::string socket;
  std::string address;
  std::string tls_ca, tls_cert, tls_key;
  std::string reload_path;
  std::vector<std::string> services;
  uint32_t stall_gpu = 0;
  uint32_t stall_ms = 0;
};

// ---- connection ---------------------------------------------------------------------------

std::string target_uri(const Options& o) {
  if (!o.address.empty()) return o.address;
  if (!o.socket.empty()) return "unix:" + o.socket;
  for (const char* name : kAdminSocketNames) {
    const std::string path = o.runtime_dir + "/" + name;
    struct stat st {};
    if (stat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) return "unix:" + path;
  }
  return "unix:" + o.runtime_dir + "/" + kAdminSocketNames[0];
}

bool read_file(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream ss;
  ss << in.rdbuf();
  *out = ss.str();
  return true;
}

class Client {
 public:
  Client(const Options& o, std::shared_ptr<grpc::Channel> channel)
      : options_(o),
        uri_(target_uri(o)),
        admin_(pb::Admin::NewStub(channel)),
        health_(::grpc::health::v1::Health::NewStub(channel)) {}

  template <class Fn>
  grpc::Status call(Fn&& fn) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::microseconds(static_cast<int64_t>(options_.timeout_s * 1e6)));
    return fn(&ctx);
  }

  pb::Admin::Stub& admin() { return *admin_; }
  ::grpc::health::v1::Health::Stub& health() { return *health_; }
  const std::string& uri() const { return uri_; }

 private:
  const Options& options_;
  std::string uri_;
  std::unique_ptr<pb::Admin::Stub> admin_;
  std::unique_ptr<::grpc::health::v1::Health::Stub> health_;
};

bool unreachable(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::UNAVAILABLE ||
         s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
}

// Prints why an RPC failed and returns the exit code for it.
int rpc_failed(const Client& c, const char* what, const grpc::Status& s) {
  if (unreachable(s)) {
    std::cerr << "mkerneldctl: cannot reach mkerneld at " << c.uri() << ": "
              << s.error_message() << "\n";
    return kExitUnreachable;
  }
  std::cerr << "mkerneldctl: " << what << " failed: " << s.error_message() << " (gRPC code "
            << static_cast<int>(s.error_code()) << ")\n";
  return kExitUnhealthy;
}

// ---- formatting ---------------------------------------------------------------------------

std::string to_json(const google::protobuf::Message& m) {
  google::protobuf::util::JsonPrintOptions opt;
  opt.add_whitespace = true;
  opt.always_print_primitive_fields = true;
  opt.preserve_proto_field_names = true;
  std::string out;
  auto st = google::protobuf::util::MessageToJsonString(m, &out, opt);
  if (!st.ok()) return "{}\n";
  return out;
}

std::string json_escape(const std::string& s) {
  std::string out;
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (ch) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += ch;
        }
    }
  }
  return out;
}

std::string fmt_double(double v, int precision) {
  std::ostringstream ss;
  ss.setf(std::ios::fixed);
  ss.precision(precision);
  ss << v;
  return ss.str();
}

std::string fmt_bytes(uint64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(b);
  size_t u = 0;
  while (v >= 1024 && u + 1 < std::size(units)) {
    v /= 1024;
    ++u;
  }
  return u == 0 ? std::to_string(b) + " B" : fmt_double(v, 1) + " " + units[u];
}

std::string fmt_latency(double ns) {
  if (ns < 0) return "-";
  if (ns < 1e3) return fmt_double(ns, 0) + "ns";
  if (ns < 1e6) return fmt_double(ns / 1e3, 1) + "us";
  if (ns < 1e9) return fmt_double(ns / 1e6, 2) + "ms";
  return fmt_double(ns / 1e9, 2) + "s";
}

std::string fmt_duration(double s) {
  auto total = static_cast<uint64_t>(s);
  const uint64_t d = total / 86400, h = total / 3600 % 24, m = total / 60 % 60, sec = total % 60;
  char buf[64];
  if (d > 0) {
    std::snprintf(buf, sizeof(buf), "%llud %02lluh %02llum", static_cast<unsigned long long>(d),
                  static_cast<unsigned long long>(h), static_cast<unsigned long long>(m));
  } else if (h > 0) {
    std::snprintf(buf, sizeof(buf), "%lluh %02llum %02llus", static_cast<unsigned long long>(h),
                  static_cast<unsigned long long>(m), static_cast<unsigned long long>(sec));
  } else if (m > 0) {
    std::snprintf(buf, sizeof(buf), "%llum %02llus", static_cast<unsigned long long>(m),
                  static_cast<unsigned long long>(sec));
  } else {
    std::snprintf(buf, sizeof(buf), "%.1fs", s);
  }
  return buf;
}

// A text table: the header, then rows; numeric columns right-aligned.
class Table {
 public:
  Table(std::vector<std::string> header, std::vector<bool> right)
      : right_(std::move(right)) {
    rows_.push_back(std::move(header));
  }
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  void print(std::ostream& os) const {
    std::vector<size_t> width(rows_[0].size(), 0);
    for (const auto& r : rows_) {
      for (size_t i = 0; i < r.size() && i < width.size(); ++i) width[i] = std::max(width[i], r[i].size());
    }
    for (const auto& r : rows_) {
      std::string line;
      for (size_t i = 0; i < r.size() && i < width.size(); ++i) {
        const std::string pad(width[i] - r[i].size(), ' ');
        if (i > 0) line += "  ";
        line += (i < right_.size() && right_[i]) ? pad + r[i] : r[i] + pad;
      }
      while (!line.empty() && line.back() == ' ') line.pop_back();
      os << line << "\n";
    }
  }

 private:
  std::vector<bool> right_;
  std::vector<std::vector<std::string>> rows_;
};

std::string service_label(const std::string& s) { return s.empty() ? "(server)" : s; }

// "used / limit" with the limit left out when it is 0 (not reported).
std::string of(uint64_t used, uint64_t limit, bool bytes = false) {
  const auto f = [bytes](uint64_t v) { return bytes ? fmt_bytes(v) : std::to_string(v); };
  return limit == 0 ? f(used) : f(used) + " / " + f(limit);
}

// What clients hold against the node's limits, as `status` and `stats` print it.
void add_usage(Table& t, const pb::ResourceUsage& u) {
  t.add({"client sessions", of(u.sessions(), u.max_sessions())});
  t.add({"client descriptors", of(u.client_descriptors(), u.descriptor_budget()) + " (process: " +
                                   std::to_string(u.open_descriptors()) + " open, limit " +
                                   std::to_string(u.descriptor_limit()) + ")"});
  t.add({"shared memory", of(u.shared_memory(), u.max_shared_memory(), true) + " (" + std::to_string(u.rings()) +
                              " rings, " + std::to_string(u.regions()) + " regions)"});
  t.add({"resident memory", fmt_bytes(u.resident_bytes())});
}

// Refusals by reason; only those that happened, or "none".
std::string refusal_text(const google::protobuf::RepeatedPtrField<pb::RefusalCount>& refusals) {
  std::string out;
  for (const auto& r : refusals)
    if (r.count() > 0) out += (out.empty() ? "" : ", ") + r.reason() + " " + std::to_string(r.count());
  return out.empty() ? "none" : out;
}

const char* status_name(HealthResponse::ServingStatus s) {
  switch (s) {
    case HealthResponse::SERVING: return "SERVING";
    case HealthResponse::NOT_SERVING: return "NOT_SERVING";
    case HealthResponse::SERVICE_UNKNOWN: return "SERVICE_UNKNOWN";
    default: return "UNKNOWN";
  }
}

// ---- commands -----------------------------------------------------------------------------

int cmd_status(Client& c, const Options& o) {
  pb::DaemonStatus st;
  auto s = c.call([&](grpc::ClientContext* ctx) {
    return c.admin().GetStatus(ctx, pb::GetStatusRequest{}, &st);
  });
  if (!s.ok()) return rpc_failed(c, "GetStatus", s);
  bool healthy = true;
  for (const auto& h : st.health()) healthy = healthy && h.serving();
  if (o.format == "json") {
    std::cout << to_json(st);
    return healthy ? kExitOk : kExitUnhealthy;
  }
  std::string proxies;
  for (const auto& p : st.proxies()) proxies += (proxies.empty() ? "" : ", ") + p;
  char epoch[32];
  std::snprintf(epoch, sizeof(epoch), "0x%016llx", static_cast<unsigned long long>(st.epoch()));
  Table t({"", ""}, {false, false});
  t.add({"node", st.node_name()});
  t.add({"version", st.version() + " (protocol " + std::to_string(st.protocol_version()) + ")"});
  t.add({"pid", std::to_string(st.pid())});
  t.add({"epoch", epoch});
  t.add({"uptime", fmt_duration(st.uptime_seconds())});
  t.add({"state", st.draining() ? "draining (new sessions refused)" : "accepting sessions"});
  t.add({"config", st.config_source() + " (generation " +
                       std::to_string(st.config_generation()) + ")"});
  t.add({"runtime dir", st.runtime_dir()});
  t.add({"client socket", st.client_socket()});
  t.add({"sessions", std::to_string(st.sessions())});
  add_usage(t, st.usage());
  t.add({"refusals", refusal_text(st.refusals())});
  t.add({"proxies", proxies.empty() ? "-" : proxies});
  t.add({"health", healthy ? "SERVING" : "NOT_SERVING"});
  std::ostringstream body;
  t.print(body);
  // Drop the empty header line.
  std::string text = body.str();
  std::cout << text.substr(text.find('\n') + 1);
  for (const auto& h : st.health()) {
    std::cout << "  " << service_label(h.service()) << ": "
              << (h.serving() ? "SERVING" : "NOT_SERVING")
              << (h.reason().empty() ? "" : " (" + h.reason() + ")") << "\n";
  }
  return healthy ? kExitOk : kExitUnhealthy;
}

int cmd_stats(Client& c, const Options& o) {
  pb::Stats st;
  auto s = c.call([&](grpc::ClientContext* ctx) {
    return c.admin().GetStats(ctx, pb::GetStatsRequest{}, &st);
  });
  if (!s.ok()) return rpc_failed(c, "GetStats", s);
  if (o.format == "json") {
    std::cout << to_json(st);
    return kExitOk;
  }
  Table t({"PROXY", "TRANSPORT", "NIC", "ALIVE", "SESS", "RINGS", "OCCUPANCY", "CONSUMED", "OK",
           "ERROR", "REJECTED", "IN-FLIGHT", "BYTES", "XPORT-ERR", "P50", "P99"},
          {false, false, false, false, true, true, true, true, true, true, true, true, true, true,
           true, true});
  for (const auto& p : st.proxies()) {
    std::vector<uint64_t> buckets(p.latency_ns_log2().begin(), p.latency_ns_log2().end());
    t.add({p.name().empty() ? "gpu" + std::to_string(p.gpu()) : p.name(),
           p.transport().empty() ? "-" : p.transport(), p.nic().empty() ? "-" : p.nic(),
           p.alive() ? "yes" : "NO (" + fmt_double(p.seconds_since_heartbeat(), 1) + "s)",
           std::to_string(p.sessions()), std::to_string(p.rings()),
           std::to_string(p.ring_occupancy()) + "/" + std::to_string(p.ring_capacity()),
           std::to_string(p.consumed()), std::to_string(p.commands().ok()),
           std::to_string(p.commands().error()), std::to_string(p.commands().rejected()),
           std::to_string(p.in_flight()), fmt_bytes(p.bytes()), std::to_string(p.errors()),
           fmt_latency(mkernel::daemon::latency_quantile_ns(buckets, 0.50)),
           fmt_latency(mkernel::daemon::latency_quantile_ns(buckets, 0.99))});
  }
  t.print(std::cout);
  // What clients hold, and every refusal by reason.
  std::cout << "\n";
  Table u({"", ""}, {false, false});
  add_usage(u, st.usage());
  std::ostringstream usage;
  u.print(usage);
  const std::string text = usage.str();
  std::cout << text.substr(text.find('\n') + 1) << "\n";
  Table r({"REFUSED", "COUNT"}, {false, true});
  for (const auto& e : st.refusals()) r.add({e.reason(), std::to_string(e.count())});
  r.print(std::cout);
  return kExitOk;
}

int cmd_clients(Client& c, const Options& o) {
  pb::ClientList list;
  auto s = c.call([&](grpc::ClientContext* ctx) {
    return c.admin().ListClients(ctx, pb::ListClientsRequest{}, &list);
  });
  if (!s.ok()) return rpc_failed(c, "ListClients", s);
  if (o.format == "json") {
    std::cout << to_json(list);
    return kExitOk;
  }
  if (list.clients().empty()) {
    std::cout << "no clients connected\n";
    return kExitOk;
  }
  Table t({"SESSION", "PID", "UID", "NAME", "COMMUNICATOR", "RANK", "GPU", "RINGS", "REGIONS",
           "REGISTERED", "COMMANDS", "CONNECTED"},
          {true, true, true, false, false, true, true, true, true, true, true, true});
  for (const auto& cl : list.clients()) {
    // Names are the clients' own text: escaped, so they cannot draw on the operator's terminal.
    t.add({std::to_string(cl.session_id()), std::to_string(cl.pid()), std::to_string(cl.uid()),
           cl.name().empty() ? "-" : mkernel::daemon::printable(cl.name(), 64),
           cl.communicator().empty() ? "-" : mkernel::daemon::printable(cl.communicator(), 64),
           std::to_string(cl.rank()) + "/" + std::to_string(cl.world_size()),
           std::to_string(cl.gpu()), std::to_string(cl.rings()), std::to_string(cl.regions()),
           fmt_bytes(cl.registered_bytes()), std::to_string(cl.commands()),
           fmt_duration(cl.connected_seconds())});
  }
  t.print(std::cout);
  return kExitOk;
}

int cmd_health(Client& c, const Options& o) {
  struct Row {
    std::string service;
    HealthResponse::ServingStatus status = HealthResponse::UNKNOWN;
    std::string reason;
  };
  std::vector<Row> rows;
  if (o.services.empty()) {
    // The service names (and the reasons the health protocol cannot carry) come from the
    // admin service; the verdicts from the health service itself.
    pb::DaemonStatus st;
    auto s = c.call([&](grpc::ClientContext* ctx) {
      return c.admin().GetStatus(ctx, pb::GetStatusRequest{}, &st);
    });
    if (unreachable(s)) return rpc_failed(c, "GetStatus", s);
    if (s.ok()) {
      for (const auto& h : st.health()) rows.push_back({h.service(), {}, h.reason()});
    }
    if (rows.empty()) rows.push_back({"", {}, ""});
  } else {
    for (const auto& name : o.services) rows.push_back({name, {}, ""});
  }
  bool healthy = true;
  for (auto& r : rows) {
    ::grpc::health::v1::HealthCheckRequest req;
    req.set_service(r.service);
    HealthResponse resp;
    auto s = c.call([&](grpc::ClientContext* ctx) { return c.health().Check(ctx, req, &resp); });
    if (unreachable(s)) return rpc_failed(c, "Health.Check", s);
    if (s.error_code() == grpc::StatusCode::NOT_FOUND) {
      r.status = HealthResponse::SERVICE_UNKNOWN;
      r.reason = "no such health service";
    } else if (!s.ok()) {
      return rpc_failed(c, "Health.Check", s);
    } else {
      r.status = resp.status();
      if (r.status == HealthResponse::SERVING) r.reason.clear();
    }
    healthy = healthy && r.status == HealthResponse::SERVING;
  }
  if (o.format == "json") {
    std::cout << "{\n  \"healthy\": " << (healthy ? "true" : "false") << ",\n  \"services\": [";
    for (size_t i = 0; i < rows.size(); ++i) {
      std::cout << (i ? "," : "") << "\n    {\"service\": \"" << json_escape(rows[i].service)
                << "\", \"status\": \"" << status_name(rows[i].status) << "\", \"reason\": \""
                << json_escape(rows[i].reason) << "\"}";
    }
    std::cout << "\n  ]\n}\n";
  } else {
    Table t({"SERVICE", "STATUS", "REASON"}, {false, false, false});
    for (const auto& r : rows) t.add({service_label(r.service), status_name(r.status), r.reason});
    t.print(std::cout);
  }
  return healthy ? kExitOk : kExitUnhealthy;
}

int cmd_drain(Client& c, const Options& o, bool drain) {
  pb::DrainReply reply;
  auto s = c.call([&](grpc::ClientContext* ctx) {
    return drain ? c.admin().Drain(ctx, pb::DrainRequest{}, &reply)
                 : c.admin().Undrain(ctx, pb::UndrainRequest{}, &reply);
  });
  if (!s.ok()) return rpc_failed(c, drain ? "Drain" : "Undrain", s);
  if (o.format == "json") {
    std::cout << to_json(reply);
  } else {
    std::cout << (reply.draining() ? "draining: new sessions are refused, existing ones keep "
                                     "running\n"
                                   : "accepting new sessions\n");
  }
  return kExitOk;
}

int cmd_reload(Client& c, const Options& o) {
  pb::ReloadRequest req;
  req.set_path(o.reload_path);
  pb::ReloadReply reply;
  auto s = c.call([&](grpc::ClientContext* ctx) { return c.admin().Reload(ctx, req, &reply); });
  if (!s.ok()) return rpc_failed(c, "Reload", s);
  if (o.format == "json") {
    std::cout << to_json(reply);
  } else if (reply.applied()) {
    std::cout << "reload applied (config generation " << reply.config_generation() << ")\n";
    auto list = [](const auto& fields) {
      std::string out;
      for (const auto& f : fields) out += (out.empty() ? "" : ", ") + f;
      return out.empty() ? std::string("none") : out;
    };
    std::cout << "  applied now:   " << list(reply.applied_changes()) << "\n";
    std::cout << "  needs restart: " << list(reply.needs_restart()) << "\n";
  } else {
    std::cout << "reload refused, the running config is kept: " << reply.error() << "\n";
  }
  return reply.applied() ? kExitOk : kExitUnhealthy;
}

int cmd_stall(Client& c, const Options& o) {
  pb::StallProxyRequest req;
  req.set_gpu(o.stall_gpu);
  req.set_duration_ms(o.stall_ms);
  pb::StallProxyReply reply;
  auto s = c.call([&](grpc::ClientContext* ctx) { return c.admin().StallProxy(ctx, req, &reply); });
  if (!s.ok()) return rpc_failed(c, "StallProxy", s);
  if (o.format == "json") {
    std::cout << "{}\n";
  } else {
    std::cout << "proxy " << o.stall_gpu << " stalled for " << o.stall_ms << " ms\n";
  }
  return kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"mkerneldctl: inspect and steer the local mkerneld over its admin socket"};
  app.require_subcommand(1, 1);
  app.fallthrough();
  app.footer(
      "Exit codes:\n"
      "  0  ok: the command succeeded (health/status: every entry SERVING)\n"
      "  1  unhealthy or refused: a health entry is NOT_SERVING or unknown, a reload was\n"
      "     refused, or the daemon answered with an error\n"
      "  2  unreachable: no daemon at the socket/address, or no answer within --timeout\n"
      "  3  usage error\n"
      "\n"
      "Examples:\n"
      "  mkerneldctl health\n"
      "  mkerneldctl --runtime-dir /tmp/mk1 stats\n"
      "  mkerneldctl --format json status\n"
      "  mkerneldctl reload /etc/mkernel/mkerneld.yaml");
  app.add_option("--format", o.format, "Output format")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
  app.add_option("--timeout", o.timeout_s, "Deadline of each call, in seconds")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  auto* rd = app.add_option("--runtime-dir", o.runtime_dir,
                            "mkerneld's runtime directory; the admin socket is "
                            "DIR/admin.sock")
                 ->capture_default_str();
  auto* sock = app.add_option("--socket", o.socket, "Path of the admin Unix socket");
  auto* addr = app.add_option("--address", o.address,
                              "gRPC target: unix:PATH, or HOST:PORT (TLS; see --tls-ca)");
  rd->excludes(sock)->excludes(addr);
  sock->excludes(addr);
  app.add_option("--tls-ca", o.tls_ca, "PEM CA bundle to verify a TCP daemon (default: system)")
      ->check(CLI::ExistingFile);
  app.add_option("--tls-cert", o.tls_cert, "PEM client certificate for a TCP daemon")
      ->check(CLI::ExistingFile);
  app.add_option("--tls-key", o.tls_key, "PEM client key for a TCP daemon")
      ->check(CLI::ExistingFile);

  auto* status = app.add_subcommand("status", "Daemon identity, state, config and health");
  auto* stats = app.add_subcommand("stats", "Per-proxy counters, ring occupancy and latency");
  auto* clients = app.add_subcommand("clients", "Connected client sessions");
  auto* health = app.add_subcommand(
      "health", "grpc.health.v1 status of the server, every GPU and every NIC");
  health->add_option("--service", o.services,
                     "Check only these health services (\"\" = whole server, mkerneld.gpu0, ...)");
  auto* drain = app.add_subcommand("drain", "Refuse new sessions; existing ones keep running");
  auto* undrain = app.add_subcommand("undrain", "Accept new sessions again");
  auto* reload = app.add_subcommand(
      "reload", "Validate and apply a config file (default: the file mkerneld started with)");
  reload->add_option("PATH", o.reload_path, "Config file to load");
  auto* stall = app.add_subcommand(
      "stall-proxy", "Test hook (mkerneld --enable-test-hooks): stop a proxy checking in");
  stall->add_option("GPU", o.stall_gpu, "Proxy index")->required();
  stall->add_option("MILLISECONDS", o.stall_ms, "Stall duration")->required();
  stall->group("Test hooks");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return kExitUsage;
  }

  std::shared_ptr<grpc::ChannelCredentials> creds;
  const std::string uri = target_uri(o);
  if (uri.rfind("unix:", 0) == 0) {
    creds = grpc::InsecureChannelCredentials();
  } else {
    grpc::SslCredentialsOptions ssl;
    if ((!o.tls_ca.empty() && !read_file(o.tls_ca, &ssl.pem_root_certs)) ||
        (!o.tls_cert.empty() && !read_file(o.tls_cert, &ssl.pem_cert_chain)) ||
        (!o.tls_key.empty() && !read_file(o.tls_key, &ssl.pem_private_key))) {
      std::cerr << "mkerneldctl: cannot read a TLS file\n";
      return kExitUsage;
    }
    creds = grpc::SslCredentials(ssl);
  }
  grpc::ChannelArguments args;
  // One connection attempt per call: an absent daemon is reported at once, not retried.
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  Client client(o, grpc::CreateCustomChannel(uri, creds, args));

  if (status->parsed()) return cmd_status(client, o);
  if (stats->parsed()) return cmd_stats(client, o);
  if (clients->parsed()) return cmd_clients(client, o);
  if (health->parsed()) return cmd_health(client, o);
  if (drain->parsed()) return cmd_drain(client, o, true);
  if (undrain->parsed()) return cmd_drain(client, o, false);
  if (reload->parsed()) return cmd_reload(client, o);
  if (stall->parsed()) return cmd_stall(client, o);
  std::cerr << "mkerneldctl: no command given; see --help\n";
  return kExitUsage;
}
