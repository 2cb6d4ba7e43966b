// config_test.cc: mkerneld's config loader, writer and reload rules.
//
// The table of bad configs is the operator's view of the loader: each row is a file and the exact
// text `mkerneld --check-config` prints for it. Change a message here first, then the code.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include "mkernel/config/config.h"
#include "mkernel/protocol/ring.h"
#include "text.h"

namespace mkernel::config {
namespace {

using namespace std::chrono_literals;

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// All messages of a result, one per line, without the final newline.
std::string messages(const LoadResult& r) {
  std::string text = r.error_text();
  if (!text.empty()) text.pop_back();
  return text;
}

DaemonConfig load_ok(const std::string& yaml) {
  const LoadResult r = load_config_string(yaml, "test.yaml");
  EXPECT_TRUE(r.ok()) << r.error_text();
  EXPECT_EQ(r.ok(), r.errors.empty());
  return r.config.value_or(DaemonConfig{});
}

// ---- the table of bad configs ---------------------------------------------------------------

struct BadConfig {
  const char* name;
  const char* yaml;
  const char* expected;  // every message, one per line, in file order
};

const BadConfig kBadConfigs[] = {
    // -- YAML itself ----------------------------------------------------------------------
    {"syntax_error", "rings:\n  capacity: [1, 2\nlogging: {}\n",
     "mkerneld.yaml:3:8: invalid YAML: end of sequence flow not found"},
    {"second_document", "rings: {}\n---\nlogging: {}\n",
     "mkerneld.yaml:2:1: invalid YAML: a second document; expected one document per file"},
    // Where a document should start, yaml-cpp hangs on a ',' (LoadAll) or returns an empty
    // document (Load), which would replace the whole file by the defaults. Name the place.
    {"stray_comma_before_first_key", "# mkerneld\n, logging:\n  level: debug\n",
     "mkerneld.yaml:2:1: invalid YAML: unexpected \",\""},
    {"stray_comma_after_top_level_list", "- 0\n, 1\n",
     "mkerneld.yaml:2:1: invalid YAML: unexpected \",\""},
    {"stray_comma_in_map", "gpus:\n  - 0\n, 1\n",
     "mkerneld.yaml:3:1: invalid YAML: end of map not found"},
    {"document_not_a_map", "just words\n",
     "mkerneld.yaml:1:1: value \"just words\" is invalid; expected a map of sections like "
     "\"node\", \"gpus\" and \"logging\""},
    {"section_not_a_map", "rings: [1, 2]\n",
     "mkerneld.yaml:1:8: rings: value \"[1, 2]\" is invalid; expected a map"},
    {"duplicate_key", "logging:\n  level: info\n  level: debug\n",
     "mkerneld.yaml:3:3: duplicate key \"logging.level\" (first given at line 2)"},

    // -- unknown keys ---------------------------------------------------------------------
    {"unknown_key_typo", "rings:\n  capcity: 4096\n",
     "mkerneld.yaml:2:3: unknown key \"rings.capcity\"; did you mean \"rings.capacity\"?"},
    {"unknown_key_transposed", "rign:\n  capacity: 4096\n",
     "mkerneld.yaml:1:1: unknown key \"rign\"; did you mean \"rings\"?"},
    {"unknown_key_case", "logging:\n  Level: info\n",
     "mkerneld.yaml:2:3: unknown key \"logging.Level\"; did you mean \"logging.level\"?"},
    {"unknown_key_wrong_level", "level: debug\n",
     "mkerneld.yaml:1:1: unknown key \"level\"; did you mean \"logging.level\"?"},
    {"unknown_key_wrong_level_in_override", "overrides:\n  - gpu: 0\n    max_commands: 8\n",
     "mkerneld.yaml:3:5: unknown key \"overrides[0].max_commands\"; did you mean "
     "\"overrides[0].batch.max_commands\"?"},
    {"unknown_key_nothing_close", "metrics:\n  prometheus: true\n",
     "mkerneld.yaml:2:3: unknown key \"metrics.prometheus\"; expected one of \"enabled\", "
     "\"listen\""},

    // -- node -----------------------------------------------------------------------------
    {"runtime_dir_relative", "node:\n  runtime_dir: run/mkernel\n",
     "mkerneld.yaml:2:16: node.runtime_dir: value \"run/mkernel\" is invalid; expected an "
     "absolute path"},
    {"node_name_with_space", "node:\n  name: gpu node 7\n",
     "mkerneld.yaml:2:9: node.name: value \"gpu node 7\" is invalid; expected a name of letters, "
     "digits, \".\", \"_\" and \"-\" (at most 64), or \"\" for the host name"},

    // -- gpus -----------------------------------------------------------------------------
    {"gpus_bad_word", "gpus: every\n",
     "mkerneld.yaml:1:7: gpus: value \"every\" is invalid; expected \"all\", a list of GPU ids "
     "or a map"},
    {"gpus_short_list_out_of_range", "gpus: [0, 256]\n",
     "mkerneld.yaml:1:11: gpus[1]: value \"256\" is invalid; expected a GPU id in 0..255"},
    {"gpus_select_unknown", "gpus:\n  select: some\n",
     "mkerneld.yaml:2:11: gpus.select: value \"some\" is invalid; expected one of \"all\", "
     "\"list\", \"host_slots\""},
    {"gpus_list_without_ids", "gpus:\n  select: list\n",
     "mkerneld.yaml:2:11: gpus.ids: value \"\" is invalid; expected at least one GPU id when "
     "gpus.select is \"list\""},
    {"gpus_duplicate_id", "gpus:\n  select: list\n  ids: [0, 1, 1]\n",
     "mkerneld.yaml:3:15: gpus.ids[2]: value \"1\" is invalid; expected a GPU id not already "
     "listed"},
    {"gpus_ids_without_select", "gpus:\n  ids: [0, 1]\n",
     "mkerneld.yaml:2:8: gpus.ids: value \"[0, 1]\" is invalid; expected no ids unless "
     "gpus.select is \"list\" (it is \"all\")"},
    {"gpus_host_slots_with_all", "gpus:\n  select: all\n  host_slots: 2\n",
     "mkerneld.yaml:3:15: gpus.host_slots: value \"2\" is invalid; expected no host_slots unless "
     "gpus.select is \"host_slots\" (it is \"all\")"},
    {"gpus_host_slots_zero", "gpus:\n  select: host_slots\n  host_slots: 0\n",
     "mkerneld.yaml:3:15: gpus.host_slots: value \"0\" is invalid; expected an integer in 1..64"},

    // -- proxy ----------------------------------------------------------------------------
    {"cpu_list_backwards", "proxy:\n  cpu_affinity: \"7-3\"\n",
     "mkerneld.yaml:2:17: proxy.cpu_affinity: value \"7-3\" is invalid; expected \"auto\", "
     "\"none\" or a CPU list like \"0-7,16-23\" (CPUs 0..4095)"},
    {"poll_mode_unknown", "proxy:\n  poll:\n    mode: busy\n",
     "mkerneld.yaml:3:11: proxy.poll.mode: value \"busy\" is invalid; expected one of \"spin\", "
     "\"hybrid\""},
    {"batch_zero", "proxy:\n  batch:\n    max_commands: 0\n",
     "mkerneld.yaml:3:19: proxy.batch.max_commands: value \"0\" is invalid; expected an integer "
     "in 1..4096"},
    {"poll_sleep_negative", "proxy:\n  poll:\n    sleep_us: -5\n",
     "mkerneld.yaml:3:15: proxy.poll.sleep_us: value \"-5\" is invalid; expected an integer in "
     "1..1000000"},

    // -- transport and overrides ----------------------------------------------------------
    {"transport_kind_unknown", "transport:\n  kind: rdma\n",
     "mkerneld.yaml:2:9: transport.kind: value \"rdma\" is invalid; expected one of \"auto\", "
     "\"verbs\", \"fabric\""},
    {"provider_with_verbs", "transport:\n  kind: verbs\n  provider: efa\n",
     "mkerneld.yaml:3:13: transport.provider: value \"efa\" is invalid; expected \"auto\" when "
     "transport.kind is \"verbs\""},
    {"provider_bad_characters", "transport:\n  provider: \"tcp, rxm\"\n",
     "mkerneld.yaml:2:13: transport.provider: value \"tcp, rxm\" is invalid; expected \"auto\" "
     "or a libfabric provider name like \"efa\", \"tcp;ofi_rxm\" or \"shm\""},
    {"nic_with_slash", "transport:\n  nic: /dev/mlx5_0\n",
     "mkerneld.yaml:2:8: transport.nic: value \"/dev/mlx5_0\" is invalid; expected \"auto\" or "
     "a device name like \"mlx5_0\" (letters, digits, \"_\", \"-\", \".\" and \":\"; at most "
     "64)"},
    {"write_pieces_too_small", "transport:\n  write_piece_bytes: 100\n",
     "mkerneld.yaml:2:22: transport.write_piece_bytes: value \"100\" is invalid; expected \"auto\", 0 "
     "(whole writes) or a size in 4KiB..1GiB, in bytes or with a suffix KiB, MiB or GiB"},
    {"write_pieces_word", "transport:\n  write_piece_bytes: big\n",
     "mkerneld.yaml:2:22: transport.write_piece_bytes: value \"big\" is invalid; expected \"auto\", 0 "
     "(whole writes) or a size in 4KiB..1GiB, in bytes or with a suffix KiB, MiB or GiB"},
    {"write_pieces_with_verbs", "transport:\n  kind: verbs\n  write_piece_bytes: 1MiB\n",
     "mkerneld.yaml:3:22: transport.write_piece_bytes: value \"1MiB\" is invalid; expected \"auto\" "
     "when transport.kind is \"verbs\""},
    {"override_provider_with_verbs",
     "overrides:\n  - gpu: 0\n    transport:\n      kind: verbs\n      provider: shm\n",
     "mkerneld.yaml:5:17: overrides[0].transport.provider: value \"shm\" is invalid; expected "
     "\"auto\" when overrides[0].transport.kind is \"verbs\""},
    {"overrides_not_a_list", "overrides:\n  gpu: 0\n",
     "mkerneld.yaml:2:3: overrides: value \"{gpu: 0}\" is invalid; expected a list of maps, one "
     "per GPU"},
    {"override_entries_broken",
     "overrides:\n  - gpu: 0\n  - gpu: 0\n  - poll: {mode: spin}\n  - 5\n",
     "mkerneld.yaml:3:10: overrides[1].gpu: value \"0\" is invalid; expected a GPU without an "
     "earlier override entry\n"
     "mkerneld.yaml:4:5: overrides[2].gpu: missing; expected a GPU id in 0..255\n"
     "mkerneld.yaml:5:5: overrides[3]: value \"5\" is invalid; expected a map with a \"gpu\" key"},
    {"override_gpu_not_selected", "gpus: [0, 1]\noverrides:\n  - gpu: 2\n",
     "mkerneld.yaml:3:10: overrides[0].gpu: value \"2\" is invalid; expected one of gpus.ids "
     "(0, 1)"},
    {"override_beyond_host_slots",
     "gpus:\n  select: host_slots\n  host_slots: 2\noverrides:\n  - gpu: 2\n",
     "mkerneld.yaml:5:10: overrides[0].gpu: value \"2\" is invalid; expected a host slot in 0..1 "
     "(gpus.host_slots is 2)"},

    // -- rings, clients, timeouts ---------------------------------------------------------
    {"ring_capacity_not_power_of_two", "rings:\n  capacity: 1000\n",
     "mkerneld.yaml:2:13: rings.capacity: value \"1000\" is invalid; expected a power of two in "
     "2..1048576"},
    {"ring_capacity_too_large", "rings:\n  capacity: 2097152\n",
     "mkerneld.yaml:2:13: rings.capacity: value \"2097152\" is invalid; expected a power of two "
     "in 2..1048576"},
    {"ring_capacity_list", "rings:\n  capacity: [1024]\n",
     "mkerneld.yaml:2:13: rings.capacity: value \"[1024]\" is invalid; expected a power of two in "
     "2..1048576"},
    {"clients_per_gpu_text", "clients:\n  max_per_gpu: many\n",
     "mkerneld.yaml:2:16: clients.max_per_gpu: value \"many\" is invalid; expected an integer in "
     "1..4096"},
    {"quota_bytes_bad_suffix", "clients:\n  quota:\n    registered_bytes: 64GB\n",
     "mkerneld.yaml:3:23: clients.quota.registered_bytes: value \"64GB\" is invalid; expected a "
     "size in 1MiB..1PiB, in bytes or with a suffix KiB, MiB, GiB, TiB or PiB"},
    {"quota_bytes_too_small", "clients:\n  quota:\n    registered_bytes: 512KiB\n",
     "mkerneld.yaml:3:23: clients.quota.registered_bytes: value \"512KiB\" is invalid; expected "
     "a size in 1MiB..1PiB, in bytes or with a suffix KiB, MiB, GiB, TiB or PiB"},
    {"quota_inflight_fraction", "clients:\n  quota:\n    inflight_commands: 1.5\n",
     "mkerneld.yaml:3:24: clients.quota.inflight_commands: value \"1.5\" is invalid; expected an "
     "integer in 1..16777216"},
    {"timeout_zero", "timeouts:\n  handshake_ms: 0\n",
     "mkerneld.yaml:2:17: timeouts.handshake_ms: value \"0\" is invalid; expected an integer in "
     "1..3600000"},
    {"timeout_overflow", "timeouts:\n  drain_ms: 99999999999999999999999\n",
     "mkerneld.yaml:2:13: timeouts.drain_ms: value \"99999999999999999999999\" is invalid; "
     "expected an integer in 1..3600000"},

    // -- sockets and credentials ----------------------------------------------------------
    {"socket_mode_not_octal", "client_socket:\n  mode: \"0698\"\n",
     "mkerneld.yaml:2:9: client_socket.mode: value \"0698\" is invalid; expected an octal mode "
     "like \"0660\" (at most \"0777\")"},
    {"socket_mode_setuid", "client_socket:\n  mode: \"4755\"\n",
     "mkerneld.yaml:2:9: client_socket.mode: value \"4755\" is invalid; expected an octal mode "
     "like \"0660\" (at most \"0777\")"},
    {"socket_group_starts_with_digit", "client_socket:\n  group: 9users\n",
     "mkerneld.yaml:2:10: client_socket.group: value \"9users\" is invalid; expected a group "
     "name or a numeric gid, or \"\" for the daemon's group"},
    {"allowed_uid_negative", "client_socket:\n  allowed_uids: [1000, -1]\n",
     "mkerneld.yaml:2:24: client_socket.allowed_uids[1]: value \"-1\" is invalid; expected a uid "
     "in 0..4294967294"},
    {"allowed_gids_not_a_list", "client_socket:\n  allowed_gids: 100\n",
     "mkerneld.yaml:2:17: client_socket.allowed_gids: value \"100\" is invalid; expected a list "
     "of numeric gids"},
    {"socket_path_too_long",
     "node:\n  runtime_dir: /var/lib/mkernel/run\nclient_socket:\n  path: "
     "this-socket-name-is-far-too-long-for-a-unix-domain-socket-address-because-sun-path-holds-"
     "108-bytes.sock\n",
     "mkerneld.yaml:4:9: client_socket.path: value \"this-socket-name-is-far-too-long-for-a-unix-"
     "domain-socket-address-because-sun...\" is invalid; expected a path of at most 107 bytes "
     "once joined to node.runtime_dir (it would be 124)"},

    // -- gRPC -----------------------------------------------------------------------------
    {"grpc_tcp_without_tls", "grpc:\n  listen: [\"unix:admin.sock\", \"tcp:0.0.0.0:50051\"]\n",
     "mkerneld.yaml:2:31: grpc.listen[1]: value \"tcp:0.0.0.0:50051\" is invalid; expected a "
     "\"unix:\" address unless grpc.tls.cert and grpc.tls.key are set"},
    {"grpc_listen_bad_scheme", "grpc:\n  listen: [\"http://0.0.0.0:80\"]\n",
     "mkerneld.yaml:2:12: grpc.listen[0]: value \"http://0.0.0.0:80\" is invalid; expected "
     "\"unix:PATH\" or \"tcp:HOST:PORT\""},
    {"grpc_listen_port_out_of_range", "grpc:\n  listen: [\"tcp:[::]:70000\"]\n",
     "mkerneld.yaml:2:12: grpc.listen[0]: value \"tcp:[::]:70000\" is invalid; expected "
     "\"unix:PATH\" or \"tcp:HOST:PORT\""},
    {"grpc_listen_empty", "grpc:\n  listen: []\n",
     "mkerneld.yaml:2:11: grpc.listen: value \"[]\" is invalid; expected at least one address"},
    {"grpc_listen_same_socket_twice",
     "grpc:\n  listen:\n    - unix:admin.sock\n    - unix:/run/mkerneld/admin.sock\n",
     "mkerneld.yaml:4:7: grpc.listen[1]: value \"unix:/run/mkerneld/admin.sock\" is invalid; "
     "expected an address not already listed"},
    {"grpc_listen_on_client_socket", "grpc:\n  listen: [\"unix:mkerneld.sock\"]\n",
     "mkerneld.yaml:2:12: grpc.listen[0]: value \"unix:mkerneld.sock\" is invalid; expected a "
     "socket other than the client socket (/run/mkerneld/mkerneld.sock)"},
    {"tls_cert_without_key", "grpc:\n  tls:\n    cert: /etc/mkernel/tls/cert.pem\n",
     "mkerneld.yaml:3:5: grpc.tls.key: value \"\" is invalid; expected a key file path when "
     "grpc.tls.cert is set"},
    {"tls_relative_path", "grpc:\n  tls:\n    cert: cert.pem\n    key: /etc/mkernel/key.pem\n",
     "mkerneld.yaml:3:11: grpc.tls.cert: value \"cert.pem\" is invalid; expected an absolute "
     "path, or \"\" for none"},
    {"tls_client_ca_alone", "grpc:\n  tls:\n    client_ca: /etc/mkernel/ca.pem\n",
     "mkerneld.yaml:3:16: grpc.tls.client_ca: value \"/etc/mkernel/ca.pem\" is invalid; expected "
     "\"\" unless grpc.tls.cert and grpc.tls.key are set"},

    // -- peer -----------------------------------------------------------------------------
    {"unknown_key_peer_advertize", "peer:\n  advertize: \"tcp:10.0.0.7:7000\"\n",
     "mkerneld.yaml:2:3: unknown key \"peer.advertize\"; did you mean \"peer.advertise\"?"},
    {"unknown_section_peers", "peers:\n  max_forming: 8\n",
     "mkerneld.yaml:1:1: unknown key \"peers\"; did you mean \"peer\"?"},
    {"peer_listen_bad_scheme", "peer:\n  listen: [\"udp:0.0.0.0:7000\"]\n",
     "mkerneld.yaml:2:12: peer.listen[0]: value \"udp:0.0.0.0:7000\" is invalid; expected "
     "\"unix:PATH\" or \"tcp:HOST:PORT\""},
    {"peer_listen_ipv6_without_brackets", "peer:\n  listen: [\"tcp:fd00::7:7000\"]\n",
     "mkerneld.yaml:2:12: peer.listen[0]: value \"tcp:fd00::7:7000\" is invalid; expected "
     "\"unix:PATH\" or \"tcp:HOST:PORT\""},
    {"peer_listen_not_a_list", "peer:\n  listen: \"tcp:10.0.0.7:7000\"\n",
     "mkerneld.yaml:2:11: peer.listen: value \"tcp:10.0.0.7:7000\" is invalid; expected a list "
     "of addresses, each \"unix:PATH\" or \"tcp:HOST:PORT\""},
    {"peer_listen_empty", "peer:\n  listen: []\n",
     "mkerneld.yaml:2:11: peer.listen: value \"[]\" is invalid; expected at least one address"},
    {"peer_listen_same_socket_twice",
     "peer:\n  listen:\n    - unix:peer.sock\n    - unix:/run/mkerneld/peer.sock\n",
     "mkerneld.yaml:4:7: peer.listen[1]: value \"unix:/run/mkerneld/peer.sock\" is invalid; "
     "expected an address not already listed"},
    {"peer_listen_same_tcp_twice",
     "peer:\n  listen: [\"tcp:[fd00::7]:7000\", \"tcp:[fd00::7]:7000\"]\n  advertise: "
     "\"tcp:node7:7000\"\n",
     "mkerneld.yaml:2:34: peer.listen[1]: value \"tcp:[fd00::7]:7000\" is invalid; expected an "
     "address not already listed"},
    {"peer_listen_on_client_socket", "peer:\n  listen: [\"unix:mkerneld.sock\"]\n",
     "mkerneld.yaml:2:12: peer.listen[0]: value \"unix:mkerneld.sock\" is invalid; expected a "
     "socket other than the client socket (/run/mkerneld/mkerneld.sock)"},
    {"peer_listen_on_admin_socket", "peer:\n  listen: [\"unix:/run/mkerneld/admin.sock\"]\n",
     "mkerneld.yaml:2:12: peer.listen[0]: value \"unix:/run/mkerneld/admin.sock\" is invalid; "
     "expected a socket other than grpc.listen[0] (/run/mkerneld/admin.sock)"},
    {"peer_listen_on_admin_tcp",
     "grpc:\n  listen: [\"unix:admin.sock\", \"tcp:10.0.0.7:50051\"]\n  tls: {cert: /c.pem, key: "
     "/k.pem}\npeer:\n  listen: [\"tcp:10.0.0.7:50051\"]\n",
     "mkerneld.yaml:5:12: peer.listen[0]: value \"tcp:10.0.0.7:50051\" is invalid; expected an "
     "address other than grpc.listen[1] (tcp:10.0.0.7:50051)"},
    {"peer_listen_socket_too_long",
     "node:\n  runtime_dir: /var/lib/mkernel/run\npeer:\n  listen: [\"unix:this-socket-name-is-"
     "far-too-long-for-a-unix-domain-socket-address-because-sun-path-holds-108.sock\"]\n",
     "mkerneld.yaml:4:12: peer.listen[0]: value \"unix:this-socket-name-is-far-too-long-for-a-"
     "unix-domain-socket-address-becaus...\" is invalid; expected a path of at most 107 bytes "
     "once joined to node.runtime_dir (it would be 118)"},
    {"peer_wildcard_without_advertise", "peer:\n  listen: [\"tcp:0.0.0.0:7000\"]\n",
     "mkerneld.yaml:2:12: peer.advertise: value \"\" is invalid; expected \"tcp:HOST:PORT\" "
     "with this node's address on the cluster network, because peer.listen[0] "
     "(\"tcp:0.0.0.0:7000\") is a wildcard address other nodes cannot dial"},
    {"peer_ipv6_wildcard_with_empty_advertise",
     "peer:\n  listen: [\"tcp:[::]:7000\", \"unix:peer.sock\"]\n  advertise: \"\"\n",
     "mkerneld.yaml:3:14: peer.advertise: value \"\" is invalid; expected \"tcp:HOST:PORT\" "
     "with this node's address on the cluster network, because peer.listen[0] "
     "(\"tcp:[::]:7000\") is a wildcard address other nodes cannot dial"},
    {"peer_advertise_without_scheme", "peer:\n  advertise: 10.0.0.7:7000\n",
     "mkerneld.yaml:2:14: peer.advertise: value \"10.0.0.7:7000\" is invalid; expected "
     "\"unix:PATH\" or \"tcp:HOST:PORT\", or \"\" for the first peer.listen address"},
    {"peer_advertise_wildcard",
     "peer:\n  listen: [\"tcp:0.0.0.0:7000\"]\n  advertise: \"tcp:0.0.0.0:7000\"\n",
     "mkerneld.yaml:3:14: peer.advertise: value \"tcp:0.0.0.0:7000\" is invalid; expected an "
     "address other nodes can dial, not a wildcard host (0.0.0.0 or ::)"},
    {"peer_max_forming_zero", "peer:\n  max_forming: 0\n",
     "mkerneld.yaml:2:16: peer.max_forming: value \"0\" is invalid; expected an integer in "
     "1..1000000"},
    {"peer_max_forming_too_big", "peer:\n  max_forming: 1000001\n",
     "mkerneld.yaml:2:16: peer.max_forming: value \"1000001\" is invalid; expected an integer "
     "in 1..1000000"},

    // -- logging, metrics -----------------------------------------------------------------
    {"log_level_unknown", "logging:\n  level: verbose\n",
     "mkerneld.yaml:2:10: logging.level: value \"verbose\" is invalid; expected one of "
     "\"trace\", \"debug\", \"info\", \"warn\", \"error\""},
    {"log_level_empty", "logging:\n  level:\n",
     "mkerneld.yaml:2:3: logging.level: value \"\" is invalid; expected one of \"trace\", "
     "\"debug\", \"info\", \"warn\", \"error\""},
    {"log_level_block_map", "logging:\n  level:\n    name: info\n    also:\n      - debug\n",
     "mkerneld.yaml:3:5: logging.level: value \"{name: info, also: [debug]}\" is invalid; "
     "expected one of \"trace\", \"debug\", \"info\", \"warn\", \"error\""},
    {"log_format_map", "logging:\n  format: {type: json}\n",
     "mkerneld.yaml:2:11: logging.format: value \"{type: json}\" is invalid; expected one of "
     "\"text\", \"json\""},
    {"metrics_enabled_yes", "metrics:\n  enabled: yes\n",
     "mkerneld.yaml:2:12: metrics.enabled: value \"yes\" is invalid; expected true or false"},
    {"metrics_listen_without_port", "metrics:\n  listen: localhost\n",
     "mkerneld.yaml:2:11: metrics.listen: value \"localhost\" is invalid; expected \"HOST:PORT\" "
     "(an IPv6 host in brackets), port 1..65535"},
};

class BadConfigTest : public ::testing::TestWithParam<BadConfig> {};

TEST_P(BadConfigTest, GivesExactMessage) {
  const BadConfig& row = GetParam();
  const LoadResult r = load_config_string(row.yaml, "mkerneld.yaml");
  EXPECT_FALSE(r.ok());
  EXPECT_FALSE(r.config.has_value());
  EXPECT_EQ(messages(r), row.expected) << "config:\n" << row.yaml;
  for (const ConfigError& e : r.errors) {
    EXPECT_EQ(e.source, "mkerneld.yaml");
    EXPECT_GT(e.line, 0) << e.message;
    EXPECT_GT(e.column, 0) << e.message;
    EXPECT_FALSE(e.expected.empty()) << e.message;
  }
}

INSTANTIATE_TEST_SUITE_P(Table, BadConfigTest, ::testing::ValuesIn(kBadConfigs),
                         [](const ::testing::TestParamInfo<BadConfig>& row) {
                           return std::string(row.param.name);
                         });

TEST(BadConfigTable, NamesAreUniqueAndTheTableIsLarge) {
  std::set<std::string> names;
  for (const BadConfig& row : kBadConfigs) EXPECT_TRUE(names.insert(row.name).second) << row.name;
  EXPECT_GE(names.size(), 25u);
}

// ---- error details and collection -----------------------------------------------------------

TEST(ConfigErrors, FieldsNameKeyValueAndExpectation) {
  const LoadResult r = load_config_string("clients:\n  quota:\n    rings: 0\n", "x.yaml");
  ASSERT_EQ(r.errors.size(), 1u);
  const ConfigError& e = r.errors[0];
  EXPECT_EQ(e.source, "x.yaml");
  EXPECT_EQ(e.line, 3);
  EXPECT_EQ(e.column, 12);
  EXPECT_EQ(e.key, "clients.quota.rings");
  EXPECT_EQ(e.value, "0");
  EXPECT_EQ(e.expected, "an integer in 1..1024");
  EXPECT_EQ(e.message,
            "x.yaml:3:12: clients.quota.rings: value \"0\" is invalid; expected an integer in "
            "1..1024");
}

TEST(ConfigErrors, UnknownKeyFieldsCarryTheSuggestion) {
  const LoadResult r = load_config_string("timeouts:\n  conect_ms: 10\n", "x.yaml");
  ASSERT_EQ(r.errors.size(), 1u);
  EXPECT_EQ(r.errors[0].key, "timeouts.conect_ms");
  EXPECT_EQ(r.errors[0].value, "conect_ms");
  EXPECT_EQ(r.errors[0].expected, "a known key such as \"timeouts.connect_ms\"");
}

TEST(ConfigErrors, EveryErrorIsReportedInFileOrder) {
  const std::string yaml =
      "logging:\n"
      "  level: loud\n"          // 2: bad enum
      "rings:\n"
      "  capacity: 3\n"          // 4: not a power of two
      "clients:\n"
      "  quota:\n"
      "    rings: 0\n"           // 7: out of range
      "    registerd_bytes: 1\n"  // 8: unknown key
      "grpc:\n"
      "  listen: [\"tcp:h:1\"]\n"  // 10: TCP without TLS
      "bogus: 1\n";               // 11: unknown section
  const LoadResult r = load_config_string(yaml, "m.yaml");
  ASSERT_EQ(r.errors.size(), 6u) << r.error_text();
  const std::vector<std::string> keys = {"logging.level", "rings.capacity",
                                         "clients.quota.rings", "clients.quota.registerd_bytes",
                                         "grpc.listen[0]", "bogus"};
  for (size_t i = 0; i < keys.size(); ++i) EXPECT_EQ(r.errors[i].key, keys[i]);
  for (size_t i = 1; i < r.errors.size(); ++i) {
    EXPECT_LT(r.errors[i - 1].line, r.errors[i].line);
  }
  EXPECT_EQ(r.errors[3].message,
            "m.yaml:8:5: unknown key \"clients.quota.registerd_bytes\"; did you mean "
            "\"clients.quota.registered_bytes\"?");
}

TEST(ConfigErrors, OneMistakeGivesOneError) {
  // The broken ids list is reported once; the checks that depend on it stay quiet.
  const LoadResult r = load_config_string(
      "gpus:\n  select: list\n  ids: [0, x]\noverrides:\n  - gpu: 5\n", "m.yaml");
  EXPECT_EQ(messages(r),
            "m.yaml:3:12: gpus.ids[1]: value \"x\" is invalid; expected a GPU id in 0..255");
}

TEST(ConfigErrors, LongValuesAreShortened) {
  const std::string name(200, 'n');
  const LoadResult r = load_config_string("logging:\n  level: " + name + "\n", "m.yaml");
  ASSERT_EQ(r.errors.size(), 1u);
  EXPECT_EQ(r.errors[0].value, std::string(77, 'n') + "...");
}

TEST(ConfigErrors, ControlCharactersAreEscapedInMessages) {
  const LoadResult r = load_config_string("logging:\n  level: \"in\\tfo\\\"\"\n", "m.yaml");
  EXPECT_EQ(messages(r),
            "m.yaml:2:10: logging.level: value \"in\\tfo\\\"\" is invalid; expected one of "
            "\"trace\", \"debug\", \"info\", \"warn\", \"error\"");
}

// ---- files ----------------------------------------------------------------------------------

std::string write_temp(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + name;
  std::ofstream(path) << text;
  return path;
}

TEST(ConfigFile, MissingFileIsAnError) {
  const LoadResult r = load_config_file("/nonexistent/mkerneld.yaml");
  EXPECT_EQ(messages(r), "/nonexistent/mkerneld.yaml: cannot open: No such file or directory");
  ASSERT_EQ(r.errors.size(), 1u);
  EXPECT_EQ(r.errors[0].line, 0);
}

TEST(ConfigFile, DirectoryIsAnError) {
  const LoadResult r = load_config_file("/");
  EXPECT_EQ(messages(r), "/: not a regular file (a directory); expected a YAML file");
}

TEST(ConfigFile, MessagesArePrefixedWithThePathGiven) {
  const std::string path = write_temp("mkernel_bad.yaml", "logging:\n  format: xml\n");
  const LoadResult r = load_config_file(path);
  EXPECT_EQ(messages(r), path + ":2:11: logging.format: value \"xml\" is invalid; expected one "
                                "of \"text\", \"json\"");
}

TEST(ConfigFile, GoodFileLoads) {
  const std::string path = write_temp("mkernel_good.yaml", "logging:\n  level: debug\n");
  const LoadResult r = load_config_file(path);
  ASSERT_TRUE(r.ok()) << r.error_text();
  EXPECT_EQ(r.config->logging.level, LogLevel::kDebug);
}

// ---- defaults -------------------------------------------------------------------------------

TEST(ConfigDefaults, BuiltInDefaultServesWithoutGpuOrRdma) {
  const DaemonConfig c = default_config();
  // No GPU: "all" finds none and falls back to a host-only slot.
  EXPECT_EQ(c.gpus.select, GpuSelect::kAll);
  EXPECT_GE(c.gpus.fallback_host_slots, 1u);
  // No RDMA device: auto falls back to libfabric's tcp provider.
  EXPECT_EQ(c.transport.kind, TransportKind::kAuto);
  EXPECT_EQ(c.transport.provider, "auto");
  EXPECT_EQ(c.transport.nic, "auto");
  EXPECT_TRUE(c.overrides.empty());
  // Only local sockets, nothing on the network.
  ASSERT_EQ(c.grpc.listen.size(), 1u);
  EXPECT_EQ(c.grpc.listen[0].kind, ListenKind::kUnix);
  EXPECT_FALSE(c.metrics.enabled);
  EXPECT_EQ(client_socket_path(c), "/run/mkerneld/mkerneld.sock");
  EXPECT_EQ(grpc_uri(c, c.grpc.listen[0]), "unix:/run/mkerneld/admin.sock");
  EXPECT_EQ(c.client_socket.mode, 0660u);
  EXPECT_EQ(c.grpc.socket_mode, 0600u);
  // The peer service too: a local socket, dialed at that socket.
  ASSERT_EQ(c.peer.listen.size(), 1u);
  EXPECT_EQ(c.peer.listen[0], (ListenAddress{ListenKind::kUnix, "peer.sock", "", 0}));
  EXPECT_EQ(grpc_uri(c, c.peer.listen[0]), "unix:/run/mkerneld/peer.sock");
  EXPECT_EQ(c.peer.advertise, "");
  EXPECT_EQ(peer_advertise_target(c), "unix:/run/mkerneld/peer.sock");
}

TEST(ConfigDefaults, ProductionValues) {
  const DaemonConfig c = default_config();
  EXPECT_EQ(c.node.runtime_dir, "/run/mkerneld");
  EXPECT_EQ(c.proxy.cpu_affinity.mode, CpuAffinityMode::kAuto);
  EXPECT_EQ(c.proxy.poll.mode, PollMode::kHybrid);
  EXPECT_EQ(c.proxy.poll.spin, 1000us);
  EXPECT_EQ(c.proxy.poll.sleep, 20us);
  EXPECT_EQ(c.proxy.batch.max_commands, 64u);
  EXPECT_EQ(c.rings.capacity, 4096u);
  EXPECT_EQ(c.clients.max_per_gpu, 64u);
  EXPECT_EQ(c.clients.quota.rings, 16u);
  EXPECT_EQ(c.clients.quota.registered_bytes, uint64_t{256} << 30);
  EXPECT_EQ(c.clients.quota.inflight_commands, 4096u);
  EXPECT_EQ(c.clients.quota.regions, 256u);
  EXPECT_EQ(c.rings.max_capacity, 65536u);
  EXPECT_EQ(c.clients.max_sessions, 1024u);
  EXPECT_EQ(c.clients.max_descriptors, 8192u);
  EXPECT_EQ(c.clients.max_shared_memory, uint64_t{256} << 30);
  EXPECT_EQ(c.clients.max_queued_replies, 64u);
  EXPECT_EQ(c.clients.max_networks, 64u);
  EXPECT_EQ(c.clients.per_uid, (ShareQuota{256, 32, 1024, 8192, uint64_t{128} << 30, 4096, 32}));
  EXPECT_EQ(c.clients.per_process, (ShareQuota{64, 16, 256, 2048, uint64_t{64} << 30, 1024, 8}));
  EXPECT_EQ(c.timeouts.handshake, 5s);
  EXPECT_EQ(c.timeouts.rendezvous, 120s);
  EXPECT_EQ(c.timeouts.connect, 30s);
  EXPECT_EQ(c.timeouts.command, 30s);
  EXPECT_EQ(c.timeouts.drain, 30s);
  EXPECT_EQ(c.logging.level, LogLevel::kInfo);
  EXPECT_EQ(c.logging.format, LogFormat::kText);
  EXPECT_EQ(c.metrics.host, "127.0.0.1");
  EXPECT_EQ(c.metrics.port, 9464);
  EXPECT_EQ(c.peer.max_forming, 1024u);
}

TEST(ConfigDefaults, PrintedDefaultHoldsThePeerSection) {
  EXPECT_NE(to_yaml(default_config())
                .find("\npeer:\n  listen: [\"unix:peer.sock\"]\n  advertise: \"\"\n"
                      "  max_forming: 1024\n"),
            std::string::npos)
      << to_yaml(default_config());
}

TEST(ConfigDefaults, EmptyAndCommentOnlyFilesGiveTheDefault) {
  EXPECT_EQ(load_ok(""), default_config());
  EXPECT_EQ(load_ok("# nothing here\n\n   # still nothing\n"), default_config());
  EXPECT_EQ(load_ok("---\n"), default_config());
  EXPECT_EQ(load_ok("logging:\n"), default_config());  // an empty section keeps its defaults
}

// ---- good configs ---------------------------------------------------------------------------

TEST(GoodConfig, GpuShortForms) {
  EXPECT_EQ(load_ok("gpus: all\n").gpus, GpuSelection{});
  const DaemonConfig list = load_ok("gpus: [3, 1]\n");
  EXPECT_EQ(list.gpus.select, GpuSelect::kList);
  EXPECT_EQ(list.gpus.ids, (std::vector<uint32_t>{3, 1}));
  EXPECT_EQ(load_ok("gpus: [3, 1]\n").gpus,
            load_ok("gpus:\n  select: list\n  ids: [3, 1]\n").gpus);
}

TEST(GoodConfig, HostSlotsForMachinesWithoutGpu) {
  const DaemonConfig c = load_ok("gpus:\n  select: host_slots\n  host_slots: 4\n");
  EXPECT_EQ(c.gpus.select, GpuSelect::kHostSlots);
  EXPECT_EQ(c.gpus.host_slots, 4u);
  const DaemonConfig strict = load_ok("gpus:\n  fallback_host_slots: 0\n");
  EXPECT_EQ(strict.gpus.fallback_host_slots, 0u);
}

TEST(GoodConfig, InfinibandNodeWithPerGpuNics) {
  const DaemonConfig c = load_ok(R"(
node:
  name: gpu-node-07
gpus:
  select: list
  ids: [0, 1, 2, 3]
proxy:
  cpu_affinity: none
  poll: {mode: spin}
transport:
  kind: verbs
  nic: mlx5_0
overrides:
  - gpu: 1
    cpu_affinity: "8-15,72-79"
    transport: {nic: mlx5_1}
  - gpu: 2
    batch: {max_commands: 256}
    poll: {sleep_us: 5}
)");
  EXPECT_EQ(c.node.name, "gpu-node-07");
  ASSERT_EQ(c.overrides.size(), 2u);

  const ProxySettings p0 = proxy_settings(c, 0);
  EXPECT_EQ(p0.cpu_affinity.mode, CpuAffinityMode::kNone);
  EXPECT_EQ(p0.transport.kind, TransportKind::kVerbs);
  EXPECT_EQ(p0.transport.nic, "mlx5_0");

  const ProxySettings p1 = proxy_settings(c, 1);
  EXPECT_EQ(p1.cpu_affinity.mode, CpuAffinityMode::kList);
  std::vector<uint32_t> cpus;
  for (uint32_t i = 8; i <= 15; ++i) cpus.push_back(i);
  for (uint32_t i = 72; i <= 79; ++i) cpus.push_back(i);
  EXPECT_EQ(p1.cpu_affinity.cpus, cpus);
  EXPECT_EQ(p1.transport.kind, TransportKind::kVerbs);  // taken from the node-wide section
  EXPECT_EQ(p1.transport.nic, "mlx5_1");
  EXPECT_EQ(p1.poll.mode, PollMode::kSpin);

  const ProxySettings p2 = proxy_settings(c, 2);
  EXPECT_EQ(p2.batch.max_commands, 256u);
  EXPECT_EQ(p2.poll.mode, PollMode::kSpin);  // node-wide mode, own sleep
  EXPECT_EQ(p2.poll.sleep, 5us);
  EXPECT_EQ(p2.transport.nic, "mlx5_0");
}

TEST(GoodConfig, WritePiecesAutoZeroSizeAndPerGpu) {
  const DaemonConfig c = load_ok(R"(
transport:
  kind: fabric
  provider: shm
  write_piece_bytes: 2MiB
overrides:
  - gpu: 1
    transport: {write_piece_bytes: 0}
  - gpu: 2
    transport: {write_piece_bytes: auto}
  - gpu: 3
    transport: {write_piece_bytes: 65536}
)");
  EXPECT_EQ(proxy_settings(c, 0).transport.write_piece_bytes, uint64_t{2} << 20);
  EXPECT_EQ(proxy_settings(c, 1).transport.write_piece_bytes, 0u);
  EXPECT_EQ(proxy_settings(c, 2).transport.write_piece_bytes, kAutoWritePieceBytes);
  EXPECT_EQ(proxy_settings(c, 3).transport.write_piece_bytes, 65536u);
  EXPECT_EQ(load_ok("gpus: all\n").transport.write_piece_bytes, kAutoWritePieceBytes);
}

TEST(GoodConfig, EfaNodeOverrideSwitchingToVerbsDropsTheProvider) {
  const DaemonConfig c = load_ok(R"(
transport:
  kind: fabric
  provider: efa
overrides:
  - gpu: 0
    transport: {kind: verbs}
)");
  EXPECT_EQ(proxy_settings(c, 1).transport.provider, "efa");
  EXPECT_EQ(proxy_settings(c, 0).transport.kind, TransportKind::kVerbs);
  EXPECT_EQ(proxy_settings(c, 0).transport.provider, "auto");
}

TEST(GoodConfig, TcpAdminWithTls) {
  const DaemonConfig c = load_ok(R"(
grpc:
  listen: ["unix:/var/run/mkerneld-admin.sock", "tcp:0.0.0.0:50051", "tcp:[::]:50052"]
  tls:
    cert: /etc/mkernel/tls/server.pem
    key: /etc/mkernel/tls/server.key
    client_ca: /etc/mkernel/tls/ca.pem
)");
  ASSERT_EQ(c.grpc.listen.size(), 3u);
  EXPECT_EQ(grpc_uri(c, c.grpc.listen[0]), "unix:/var/run/mkerneld-admin.sock");
  EXPECT_EQ(grpc_uri(c, c.grpc.listen[1]), "0.0.0.0:50051");
  EXPECT_EQ(grpc_uri(c, c.grpc.listen[2]), "[::]:50052");
  EXPECT_EQ(c.grpc.listen[2].host, "::");
  EXPECT_EQ(to_string(c.grpc.listen[2]), "tcp:[::]:50052");
}

TEST(GoodConfig, PeerOnTcpWithoutTls) {
  const DaemonConfig c = load_ok(R"(
peer:
  listen: ["tcp:0.0.0.0:7000", "unix:peer.sock", "tcp:[::]:7001"]
  advertise: "tcp:gpu-node-07.cluster:7000"
  max_forming: 4096
)");
  ASSERT_EQ(c.peer.listen.size(), 3u);
  EXPECT_EQ(c.peer.listen[0], (ListenAddress{ListenKind::kTcp, "", "0.0.0.0", 7000}));
  EXPECT_EQ(grpc_uri(c, c.peer.listen[0]), "0.0.0.0:7000");
  EXPECT_EQ(grpc_uri(c, c.peer.listen[1]), "unix:/run/mkerneld/peer.sock");
  EXPECT_EQ(grpc_uri(c, c.peer.listen[2]), "[::]:7001");
  EXPECT_EQ(c.peer.advertise, "tcp:gpu-node-07.cluster:7000");
  EXPECT_EQ(c.peer.max_forming, 4096u);
  EXPECT_EQ(peer_advertise_target(c), "gpu-node-07.cluster:7000");
  EXPECT_TRUE(c.grpc.tls.cert.empty());  // TCP for peers needs no TLS
  EXPECT_EQ(c.grpc, GrpcConfig{});
}

TEST(GoodConfig, PeerAdvertiseTargets) {
  // Empty: the first listener, IPv6 in brackets, without the "tcp:" prefix.
  EXPECT_EQ(peer_advertise_target(load_ok("peer:\n  listen: [\"tcp:[fd00::7]:7000\"]\n")),
            "[fd00::7]:7000");
  EXPECT_EQ(peer_advertise_target(load_ok("peer:\n  listen: [\"tcp:10.0.0.7:7000\"]\n")),
            "10.0.0.7:7000");
  // Only the first listener matters: a wildcard after it needs no advertise.
  EXPECT_EQ(peer_advertise_target(
                load_ok("peer:\n  listen: [\"tcp:10.0.0.7:7000\", \"tcp:0.0.0.0:7001\"]\n")),
            "10.0.0.7:7000");
  // Unix paths are resolved against node.runtime_dir, for listeners and advertise alike.
  EXPECT_EQ(peer_advertise_target(
                load_ok("node: {runtime_dir: /tmp/mk}\npeer:\n  listen: [\"unix:p/peer.sock\"]\n")),
            "unix:/tmp/mk/p/peer.sock");
  EXPECT_EQ(peer_advertise_target(load_ok(
                "node: {runtime_dir: /tmp/mk}\npeer:\n  listen: [\"tcp:0.0.0.0:7000\"]\n"
                "  advertise: \"unix:relay.sock\"\n")),
            "unix:/tmp/mk/relay.sock");
  EXPECT_EQ(peer_advertise_target(load_ok("peer:\n  advertise: \"tcp:[::1]:7000\"\n")),
            "[::1]:7000");
  // A config the loader would refuse has no target.
  DaemonConfig none;
  none.peer.listen.clear();
  EXPECT_EQ(peer_advertise_target(none), "");
  none.peer.advertise = "10.0.0.7:7000";
  EXPECT_EQ(peer_advertise_target(none), "");
}

TEST(GoodConfig, PeerAndAdminOnTheSameHostDifferentPorts) {
  const DaemonConfig c = load_ok(R"(
grpc:
  listen: ["tcp:10.0.0.7:50051"]
  tls: {cert: /etc/mkernel/tls/node.pem, key: /etc/mkernel/tls/node.key}
peer:
  listen: ["tcp:10.0.0.7:7000"]
)");
  EXPECT_EQ(peer_advertise_target(c), "10.0.0.7:7000");
}

TEST(GoodConfig, PeerDefaultSocketClashIsNamed) {
  // The default peer socket is checked against a client socket moved onto it. There is no
  // peer.listen value in the file to point at, so the message has no position (as for grpc).
  const LoadResult r = load_config_string("client_socket:\n  path: peer.sock\n", "m.yaml");
  EXPECT_EQ(messages(r),
            "m.yaml: peer.listen[0]: value \"unix:peer.sock\" is invalid; expected a socket "
            "other than the client socket (/run/mkerneld/peer.sock)");
  // ... and the default admin socket against a peer listener moved onto it.
  const LoadResult g = load_config_string("peer:\n  listen: [unix:admin.sock]\n", "m.yaml");
  EXPECT_EQ(messages(g),
            "m.yaml:2:12: peer.listen[0]: value \"unix:admin.sock\" is invalid; expected a "
            "socket other than grpc.listen[0] (/run/mkerneld/admin.sock)");
}

TEST(GoodConfig, ScalarSpellings) {
  const DaemonConfig c = load_ok(R"(
client_socket:
  mode: 0666
  group: "1234"
  allowed_uids: [0, 1000]
grpc:
  socket_mode: 640
clients:
  quota:
    registered_bytes: 64 GiB
metrics:
  enabled: True
  listen: "[::1]:9100"
rings:
  capacity: "65536"
)");
  EXPECT_EQ(c.client_socket.mode, 0666u);
  EXPECT_EQ(c.client_socket.group, "1234");
  EXPECT_EQ(c.grpc.socket_mode, 0640u);
  EXPECT_EQ(c.clients.quota.registered_bytes, uint64_t{64} << 30);
  EXPECT_TRUE(c.metrics.enabled);
  EXPECT_EQ(c.metrics.host, "::1");
  EXPECT_EQ(c.metrics.port, 9100);
  EXPECT_EQ(c.rings.capacity, 65536u);
  EXPECT_EQ(load_ok("clients:\n  quota:\n    registered_bytes: 1048576\n")
                .clients.quota.registered_bytes,
            uint64_t{1} << 20);
}

TEST(GoodConfig, RingLimitsMatchTheProtocol) {
  const auto capacity = [](uint32_t log2) {
    const std::string slots = std::to_string(uint64_t{1} << log2);
    return "rings:\n  capacity: " + slots + "\n  max_capacity: " + slots + "\n";
  };
  EXPECT_TRUE(load_config_string(capacity(protocol::kMinCapacityLog2), "r").ok());
  EXPECT_TRUE(load_config_string(capacity(protocol::kMaxCapacityLog2), "r").ok());
  EXPECT_FALSE(load_config_string(capacity(protocol::kMinCapacityLog2 - 1), "r").ok());
  EXPECT_FALSE(load_config_string(capacity(protocol::kMaxCapacityLog2 + 1), "r").ok());
  EXPECT_TRUE(protocol::valid_capacity_log2(12));  // the default, 4096
}

// ---- the example file and the docs ----------------------------------------------------------

// Dotted keys of a YAML tree, list items written `[]`, as known_keys() spells them.
void walk_keys(const YAML::Node& node, const std::string& prefix, std::set<std::string>& out) {
  if (node.IsMap()) {
    for (auto it = node.begin(); it != node.end(); ++it) {
      const std::string path =
          prefix.empty() ? it->first.Scalar() : prefix + "." + it->first.Scalar();
      if (it->second.IsMap() || (it->second.IsSequence() && it->second.size() != 0 &&
                                 it->second[0].IsMap())) {
        walk_keys(it->second, path, out);
      } else {
        out.insert(path);
      }
    }
  } else if (node.IsSequence()) {
    for (const YAML::Node& item : node) walk_keys(item, prefix + "[]", out);
  }
}

// The commented-out `overrides:` block of the example, without its comment marks.
std::string example_override_block(const std::string& text) {
  std::istringstream in(text);
  std::string line;
  std::string block;
  bool inside = false;
  while (std::getline(in, line)) {
    if (line == "# overrides:") inside = true;
    if (!inside) continue;
    if (line.rfind("# ", 0) != 0) break;
    block += line.substr(2) + "\n";
  }
  return block;
}

TEST(ConfigExampleFile, LoadsAndEqualsTheBuiltInDefault) {
  const LoadResult r = load_config_file(MKERNEL_CONFIG_EXAMPLE);
  ASSERT_TRUE(r.ok()) << r.error_text();
  EXPECT_EQ(*r.config, default_config());
}

TEST(ConfigExampleFile, ShowsEveryKey) {
  const std::string text = read_text(MKERNEL_CONFIG_EXAMPLE);
  std::set<std::string> shown;
  walk_keys(YAML::Load(text), "", shown);
  const std::string block = example_override_block(text);
  ASSERT_FALSE(block.empty());
  walk_keys(YAML::Load(block), "", shown);
  // ids and host_slots belong to other selections and are shown commented out.
  for (const std::string key : {"gpus.ids", "gpus.host_slots"}) {
    EXPECT_NE(text.find("# " + key.substr(5) + ":"), std::string::npos) << key;
    shown.insert(key);
  }
  shown.erase("overrides");  // `overrides: []` in the live part
  const std::set<std::string> known(known_keys().begin(), known_keys().end());
  EXPECT_EQ(shown, known);
}

TEST(ConfigExampleFile, CommentedOverrideBlockLoads) {
  const std::string block = example_override_block(read_text(MKERNEL_CONFIG_EXAMPLE));
  const DaemonConfig c = load_ok(block);
  ASSERT_EQ(c.overrides.size(), 1u);
  EXPECT_EQ(proxy_settings(c, 0).transport.nic, "mlx5_0");
}

TEST(ConfigDocs, DescribeEveryKey) {
  const std::string doc = read_text(MKERNEL_CONFIG_DOC);
  ASSERT_FALSE(doc.empty()) << MKERNEL_CONFIG_DOC;
  for (const std::string& key : known_keys()) {
    EXPECT_NE(doc.find("`" + key + "`"), std::string::npos) << key << " is not in docs/config.md";
  }
}

TEST(ConfigDocs, YamlExamplesLoad) {
  std::istringstream in(read_text(MKERNEL_CONFIG_DOC));
  std::string line;
  std::string block;
  bool inside = false;
  int examples = 0;
  while (std::getline(in, line)) {
    if (!inside && line == "```yaml") {
      inside = true;
      block.clear();
    } else if (inside && line == "```") {
      inside = false;
      ++examples;
      const LoadResult r = load_config_string(block, "docs example");
      EXPECT_TRUE(r.ok()) << r.error_text() << block;
    } else if (inside) {
      block += line + "\n";
    }
  }
  EXPECT_GE(examples, 5);
}

TEST(ConfigKnownKeys, ListsLeavesInSchemaOrder) {
  const std::vector<std::string>& keys = known_keys();
  ASSERT_FALSE(keys.empty());
  EXPECT_EQ(keys.front(), "node.name");
  EXPECT_EQ(keys.back(), "metrics.listen");
  EXPECT_NE(std::find(keys.begin(), keys.end(), "overrides[].transport.nic"), keys.end());
  EXPECT_NE(std::find(keys.begin(), keys.end(), "clients.quota.registered_bytes"), keys.end());
  EXPECT_EQ(std::find(keys.begin(), keys.end(), "clients.quota"), keys.end());  // not a leaf
  const auto at = [&](const char* key) { return std::find(keys.begin(), keys.end(), key); };
  ASSERT_NE(at("peer.listen"), keys.end());
  EXPECT_EQ(at("peer.listen") + 1, at("peer.advertise"));
  EXPECT_EQ(at("peer.advertise") + 1, at("peer.max_forming"));
  EXPECT_EQ(at("grpc.tls.client_ca") + 1, at("peer.listen"));
}

// ---- round trips ----------------------------------------------------------------------------

TEST(ConfigRoundTrip, DefaultConfig) {
  const std::string yaml = to_yaml(default_config());
  const LoadResult r = load_config_string(yaml, "default.yaml");
  ASSERT_TRUE(r.ok()) << r.error_text() << yaml;
  EXPECT_EQ(*r.config, default_config());
}

DaemonConfig unusual_config() {
  DaemonConfig c;
  c.node.name = "node-3.rack_12";
  c.node.runtime_dir = "/var/run/mk \"quoted\" dir #1";
  c.gpus.select = GpuSelect::kList;
  c.gpus.ids = {7, 0, 3};
  c.proxy.cpu_affinity = {CpuAffinityMode::kList, {0, 1, 2, 3, 8, 10, 11}};
  c.proxy.poll = {PollMode::kSpin, 0us, 1us};
  c.proxy.batch.max_commands = 4096;
  c.transport = {TransportKind::kFabric, "tcp;ofi_rxm", "eth0"};
  GpuOverride o0;
  o0.gpu = 0;
  o0.cpu_affinity = CpuAffinity{CpuAffinityMode::kNone, {}};
  o0.transport = TransportConfig{TransportKind::kVerbs, "auto", "mlx5_0"};
  GpuOverride o7;
  o7.gpu = 7;
  o7.poll = PollConfig{PollMode::kHybrid, 5000us, 100us};
  o7.batch = BatchConfig{1};
  c.overrides = {o0, o7};
  c.rings.capacity = 2;
  c.rings.max_capacity = 1u << 20;
  c.clients.max_per_gpu = 4096;
  c.clients.max_sessions = 65536;
  c.clients.max_descriptors = 16;
  c.clients.max_shared_memory = uint64_t{1} << 50;
  c.clients.max_queued_replies = 1;
  c.clients.quota = {1024, 65536, (uint64_t{3} << 40) + (uint64_t{5} << 20), 1};
  c.clients.max_networks = 65536;
  c.clients.per_uid = {1, 4096, 1, 1u << 20, uint64_t{1} << 20, 1u << 20, 1};
  c.clients.per_process = {65536, 1, 1u << 20, 1, (uint64_t{7} << 30) + 4096, 1, 65536};
  c.timeouts = {1ms, 3600000ms, 2ms, 3ms, 4ms};
  c.client_socket = {"/tmp/a\\b.sock", "mkernel", 0600, {0, 1000}, {4294967294u}};
  c.grpc.listen = {ListenAddress{ListenKind::kUnix, "admin.sock", "", 0},
                   ListenAddress{ListenKind::kTcp, "", "fe80::1", 443},
                   ListenAddress{ListenKind::kTcp, "", "admin.example.com", 50051}};
  c.grpc.socket_group = "0";
  c.grpc.socket_mode = 0;
  c.grpc.tls = {"/etc/tls/cert.pem", "/etc/tls/key.pem", ""};
  c.peer.listen = {ListenAddress{ListenKind::kTcp, "", "::", 7000},
                   ListenAddress{ListenKind::kUnix, "/tmp/peer \"x\".sock", "", 0},
                   ListenAddress{ListenKind::kTcp, "", "admin.example.com", 7001}};
  c.peer.advertise = "tcp:[fe80::2]:7000";
  c.peer.max_forming = 1000000;
  c.logging = {LogLevel::kTrace, LogFormat::kJson};
  c.metrics = {true, "::", 1};
  return c;
}

TEST(ConfigRoundTrip, UnusualConfig) {
  const DaemonConfig c = unusual_config();
  const std::string yaml = to_yaml(c);
  const LoadResult r = load_config_string(yaml, "unusual.yaml");
  ASSERT_TRUE(r.ok()) << r.error_text() << yaml;
  EXPECT_EQ(*r.config, c) << yaml;
  EXPECT_EQ(to_yaml(*r.config), yaml);
}

TEST(ConfigRoundTrip, HostSlotsSelection) {
  DaemonConfig c;
  c.gpus.select = GpuSelect::kHostSlots;
  c.gpus.host_slots = 3;
  const LoadResult r = load_config_string(to_yaml(c), "slots.yaml");
  ASSERT_TRUE(r.ok()) << r.error_text();
  EXPECT_EQ(*r.config, c);
}

TEST(ConfigRoundTrip, LoadedConfigWritesBackTheSame) {
  const DaemonConfig c = load_ok(R"(
gpus: [1, 0]
transport: {kind: fabric, provider: efa}
overrides:
  - gpu: 1
    poll: {mode: spin}
    transport: {nic: rdmap79s0}
clients:
  quota: {registered_bytes: 1536MiB}
)");
  const LoadResult r = load_config_string(to_yaml(c), "again.yaml");
  ASSERT_TRUE(r.ok()) << r.error_text();
  EXPECT_EQ(*r.config, c);
  EXPECT_NE(to_yaml(c).find("registered_bytes: 1536MiB"), std::string::npos);
}

// ---- reload ---------------------------------------------------------------------------------

TEST(ConfigReload, HotChangesNeedNoRestart) {
  const DaemonConfig old_config = default_config();
  const DaemonConfig neu = load_ok(R"(
logging: {level: debug, format: json}
proxy:
  poll: {mode: spin}
  batch: {max_commands: 8}
clients:
  max_per_gpu: 2
  quota: {rings: 1, registered_bytes: 1GiB, inflight_commands: 10}
timeouts: {handshake_ms: 1, rendezvous_ms: 2, connect_ms: 3, command_ms: 4, drain_ms: 5}
client_socket: {allowed_uids: [1000], allowed_gids: [100]}
peer: {max_forming: 8}
overrides:
  - gpu: 0
    poll: {sleep_us: 1}
)");
  EXPECT_NE(old_config, neu);
  EXPECT_TRUE(restart_required_changes(old_config, neu).empty());
  EXPECT_EQ(hot_reloaded(old_config, neu), neu);
}

TEST(ConfigReload, RestartFieldsAreNamed) {
  const DaemonConfig old_config = load_ok(R"(
overrides:
  - gpu: 0
    transport: {nic: mlx5_0}
  - gpu: 1
    cpu_affinity: "0-3"
)");
  const DaemonConfig neu = load_ok(R"(
node: {name: other, runtime_dir: /run/mk2}
gpus: [0, 1]
proxy: {cpu_affinity: none}
transport: {kind: fabric, provider: efa, nic: rdmap0}
overrides:
  - gpu: 0
    transport: {nic: mlx5_1}
  - gpu: 1
    cpu_affinity: "0-3"
rings: {capacity: 1024}
client_socket: {path: c.sock, group: users, mode: "0666"}
grpc:
  listen: ["unix:/run/admin.sock", "tcp:0.0.0.0:1"]
  socket_group: wheel
  socket_mode: "0660"
  tls: {cert: /c.pem, key: /k.pem, client_ca: /ca.pem}
peer:
  listen: ["tcp:0.0.0.0:7000"]
  advertise: "tcp:10.0.0.7:7000"
  max_forming: 1
metrics: {enabled: true, listen: "0.0.0.0:9100"}
logging: {level: warn}
)");
  const std::vector<std::string> expected = {
      "node.name",          "node.runtime_dir",   "gpus.select",
      "gpus.ids",           "proxy.cpu_affinity", "transport.kind",
      "transport.provider", "transport.nic",      "overrides[gpu=0].transport",
      "rings.capacity",     "client_socket.path", "client_socket.group",
      "client_socket.mode", "grpc.listen",        "grpc.socket_group",
      "grpc.socket_mode",   "grpc.tls.cert",      "grpc.tls.key",
      "grpc.tls.client_ca", "peer.listen",        "peer.advertise",
      "metrics.enabled",    "metrics.listen"};
  EXPECT_EQ(restart_required_changes(old_config, neu), expected);
  EXPECT_TRUE(restart_required_changes(neu, neu).empty());
}

TEST(ConfigReload, PeerListenersNeedRestartMaxFormingIsHot) {
  const DaemonConfig running = default_config();
  const DaemonConfig tcp = load_ok(
      "peer:\n  listen: [\"tcp:10.0.0.7:7000\"]\n  max_forming: 16\n");
  EXPECT_EQ(restart_required_changes(running, tcp), std::vector<std::string>{"peer.listen"});
  const DaemonConfig advertised = load_ok("peer:\n  advertise: \"unix:/run/relay.sock\"\n");
  EXPECT_EQ(restart_required_changes(running, advertised),
            std::vector<std::string>{"peer.advertise"});

  // A reload takes the new forming limit and keeps the listeners the daemon has bound.
  const DaemonConfig result = hot_reloaded(running, tcp);
  EXPECT_EQ(result.peer.max_forming, 16u);
  EXPECT_EQ(result.peer.listen, running.peer.listen);
  EXPECT_TRUE(restart_required_changes(running, result).empty());

  const DaemonConfig limit_only = load_ok("peer:\n  max_forming: 1000000\n");
  EXPECT_TRUE(restart_required_changes(running, limit_only).empty());
  EXPECT_EQ(hot_reloaded(running, limit_only), limit_only);
}

TEST(ConfigReload, OverrideAddedOrRemovedIsNamed) {
  const DaemonConfig none = default_config();
  const DaemonConfig pinned = load_ok("overrides:\n  - gpu: 3\n    cpu_affinity: \"4-7\"\n");
  EXPECT_EQ(restart_required_changes(none, pinned),
            std::vector<std::string>{"overrides[gpu=3].cpu_affinity"});
  EXPECT_EQ(restart_required_changes(pinned, none),
            std::vector<std::string>{"overrides[gpu=3].cpu_affinity"});
}

TEST(ConfigReload, HotReloadKeepsRestartFieldsAndTakesHotOnes) {
  const DaemonConfig running = unusual_config();
  DaemonConfig loaded = default_config();
  loaded.logging.level = LogLevel::kError;
  loaded.timeouts.command = 42ms;
  loaded.peer.max_forming = 3;
  GpuOverride o;
  o.gpu = 0;
  o.batch = BatchConfig{7};
  o.transport = TransportConfig{TransportKind::kFabric, "shm", "auto"};  // restart: not taken
  loaded.overrides = {o};

  const DaemonConfig result = hot_reloaded(running, loaded);
  EXPECT_TRUE(restart_required_changes(running, result).empty());
  EXPECT_EQ(restart_required_changes(result, loaded), restart_required_changes(running, loaded));
  EXPECT_EQ(result.logging.level, LogLevel::kError);
  EXPECT_EQ(result.timeouts, loaded.timeouts);
  EXPECT_EQ(result.clients, loaded.clients);
  EXPECT_EQ(result.proxy.poll, loaded.proxy.poll);
  EXPECT_EQ(result.node, running.node);
  EXPECT_EQ(result.grpc, running.grpc);
  EXPECT_EQ(result.peer.listen, running.peer.listen);
  EXPECT_EQ(result.peer.advertise, running.peer.advertise);
  EXPECT_EQ(result.peer.max_forming, 3u);
  EXPECT_EQ(proxy_settings(result, 0).batch.max_commands, 7u);
  EXPECT_EQ(proxy_settings(result, 0).transport, proxy_settings(running, 0).transport);
  // GPU 7 had only hot settings, which the loaded file drops.
  EXPECT_EQ(proxy_settings(result, 7).poll, loaded.proxy.poll);
  EXPECT_EQ(hot_reloaded(running, running), running);
}

// ---- robustness -----------------------------------------------------------------------------

// Mangled versions of the example file: the loader must answer each with either a config or
// messages (never a crash or an exception), and every config it accepts must write back.
TEST(ConfigRobustness, MutatedExampleFiles) {
  const std::string base = read_text(MKERNEL_CONFIG_EXAMPLE);
  ASSERT_FALSE(base.empty());
  std::mt19937 rng(20261129);
  const std::string alphabet = "abz019 -_:[]{},#'\"\n\t&*!|>%@`";
  int accepted = 0;
  for (int round = 0; round < 1000; ++round) {
    std::string text = base;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < edits && !text.empty(); ++k) {
      const size_t at = rng() % text.size();
      switch (rng() % 4) {
        case 0: text.erase(at, 1 + rng() % 8); break;
        case 1: text.insert(at, 1, alphabet[rng() % alphabet.size()]); break;
        case 2: text[at] = alphabet[rng() % alphabet.size()]; break;
        default: {  // move a slice of the file elsewhere
          const size_t len = std::min<size_t>(1 + rng() % 40, text.size() - at);
          const std::string slice = text.substr(at, len);
          text.erase(at, len);
          text.insert(rng() % (text.size() + 1), slice);
        }
      }
    }
    const LoadResult r = load_config_string(text, "m.yaml");
    ASSERT_EQ(r.ok(), r.errors.empty()) << text;
    for (const ConfigError& e : r.errors) {
      ASSERT_EQ(e.message.rfind("m.yaml", 0), 0u) << e.message;
    }
    if (r.ok()) {
      ++accepted;
      const LoadResult again = load_config_string(to_yaml(*r.config), "again.yaml");
      ASSERT_TRUE(again.ok()) << again.error_text() << "\nfrom:\n" << text;
      ASSERT_EQ(*again.config, *r.config) << text;
    }
  }
  EXPECT_GT(accepted, 0);  // some edits only touch comments
}

// ---- text helpers ---------------------------------------------------------------------------

TEST(ConfigTextHelpers, EditDistance) {
  EXPECT_EQ(detail::edit_distance("ring", "ring"), 0u);
  EXPECT_EQ(detail::edit_distance("rign", "ring"), 1u);  // transposition
  EXPECT_EQ(detail::edit_distance("capcity", "capacity"), 1u);
  EXPECT_EQ(detail::edit_distance("Max-Per-GPU", "max_per_gpu"), 0u);
  EXPECT_EQ(detail::edit_distance("", "abc"), 3u);
  EXPECT_EQ(detail::edit_distance("kitten", "sitting"), 3u);
}

TEST(ConfigTextHelpers, Bytes) {
  EXPECT_EQ(detail::parse_bytes("4096"), 4096u);
  EXPECT_EQ(detail::parse_bytes("2KiB"), 2048u);
  EXPECT_EQ(detail::parse_bytes("1 PiB"), uint64_t{1} << 50);
  EXPECT_FALSE(detail::parse_bytes("1kib"));
  EXPECT_FALSE(detail::parse_bytes("GiB"));
  EXPECT_FALSE(detail::parse_bytes("99999999PiB"));  // overflows 64 bits
  EXPECT_EQ(detail::format_bytes(1536u << 20), "1536MiB");
  EXPECT_EQ(detail::format_bytes(1000), "1000");
  EXPECT_EQ(detail::format_bytes(0), "0");
}

TEST(ConfigTextHelpers, CpuLists) {
  EXPECT_EQ(detail::parse_cpu_list("3,0-2,2", 10), (std::vector<uint32_t>{0, 1, 2, 3}));
  EXPECT_FALSE(detail::parse_cpu_list("0-11", 10));
  EXPECT_FALSE(detail::parse_cpu_list("1,", 10));
  EXPECT_FALSE(detail::parse_cpu_list("1-2-3", 10));
  EXPECT_EQ(detail::format_cpu_list({0, 1, 2, 5, 7, 8}), "0-2,5,7-8");
}

TEST(ConfigTextHelpers, ModesAndAddresses) {
  EXPECT_EQ(detail::parse_mode("0660"), 0660u);
  EXPECT_EQ(detail::parse_mode("750"), 0750u);
  EXPECT_FALSE(detail::parse_mode("1777"));
  EXPECT_FALSE(detail::parse_mode("66"));
  EXPECT_EQ(detail::format_mode(0600), "0600");
  EXPECT_FALSE(detail::parse_host_port("[]:80"));
  EXPECT_FALSE(detail::parse_host_port("host:0"));
  EXPECT_FALSE(detail::parse_listen("unix:"));
  EXPECT_EQ(detail::parse_host_port("[::1]:80")->host, "::1");
}

TEST(ConfigTextHelpers, WildcardHosts) {
  for (const char* host : {"0.0.0.0", "::", "0::0", "::0", "0:0:0:0:0:0:0:0"}) {
    EXPECT_TRUE(detail::is_wildcard_host(host)) << host;
  }
  for (const char* host : {"127.0.0.1", "::1", "10.0.0.0", "0", "00", "fd00::", "localhost", ""}) {
    EXPECT_FALSE(detail::is_wildcard_host(host)) << host;
  }
}

}  // namespace
}  // namespace mkernel::config
