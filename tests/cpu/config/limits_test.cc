// The client limits of the config (clients.max_*, clients.per_uid, clients.per_process,
// rings.max_capacity): their messages, their reload rules, and reading a config path that is
// not a file without blocking.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>

#include "mkernel/config/config.h"

namespace mkernel::config {
namespace {

std::string messages(const LoadResult& r) {
  std::string out;
  for (const ConfigError& e : r.errors) out += (out.empty() ? "" : "\n") + e.message;
  return out;
}

std::string errors_of(const std::string& yaml) { return messages(load_config_string(yaml, "limits.yaml")); }

TEST(ClientLimits, BadValuesNameKeyValueAndRange) {
  EXPECT_EQ(errors_of("clients:\n  max_sessions: 0\n"),
            "limits.yaml:2:17: clients.max_sessions: value \"0\" is invalid; expected an integer in 1..65536");
  EXPECT_EQ(errors_of("clients:\n  max_descriptors: 8\n"),
            "limits.yaml:2:20: clients.max_descriptors: value \"8\" is invalid; expected an integer in 16..1048576");
  EXPECT_EQ(errors_of("clients:\n  max_shared_memory: 64GB\n"),
            "limits.yaml:2:22: clients.max_shared_memory: value \"64GB\" is invalid; expected a size in "
            "1MiB..1PiB, in bytes or with a suffix KiB, MiB, GiB, TiB or PiB");
  EXPECT_EQ(errors_of("clients:\n  max_queued_replies: 5000\n"),
            "limits.yaml:2:23: clients.max_queued_replies: value \"5000\" is invalid; expected an integer in "
            "1..4096");
  EXPECT_EQ(errors_of("clients:\n  per_uid:\n    sessions_per_gpu: 0\n"),
            "limits.yaml:3:23: clients.per_uid.sessions_per_gpu: value \"0\" is invalid; expected an integer in "
            "1..4096");
  EXPECT_EQ(errors_of("clients:\n  per_process:\n    networks: -1\n"),
            "limits.yaml:3:15: clients.per_process.networks: value \"-1\" is invalid; expected an integer in "
            "1..65536");
  EXPECT_EQ(errors_of("clients:\n  per_uid:\n    sesions: 3\n"),
            "limits.yaml:3:5: unknown key \"clients.per_uid.sesions\"; did you mean \"clients.per_uid.sessions\"?");
  EXPECT_EQ(errors_of("clients:\n  quota:\n    regions: 65537\n"),
            "limits.yaml:3:14: clients.quota.regions: value \"65537\" is invalid; expected an integer in 1..65536");
}

TEST(ClientLimits, TheDefaultRingFitsUnderTheLargestOne) {
  EXPECT_EQ(errors_of("rings:\n  capacity: 8192\n  max_capacity: 4096\n"),
            "limits.yaml:3:17: rings.max_capacity: value \"4096\" is invalid; expected a power of two of at least "
            "rings.capacity (8192)");
  EXPECT_EQ(errors_of("rings:\n  capacity: 131072\n"),
            "limits.yaml:2:13: rings.capacity: value \"131072\" is invalid; expected a power of two of at most "
            "rings.max_capacity (65536)");
  const LoadResult big = load_config_string("rings:\n  capacity: 131072\n  max_capacity: 1048576\n", "b");
  ASSERT_TRUE(big.ok()) << big.error_text();
  EXPECT_EQ(big.config->rings.max_capacity, 1u << 20);
}

TEST(ClientLimits, AllHotRingCapacityStillNeedsARestart) {
  const DaemonConfig running = default_config();
  const LoadResult r = load_config_string(
      "rings:\n  capacity: 8192\n  max_capacity: 16384\n"
      "clients:\n  max_sessions: 10\n  max_networks: 2\n  per_uid: {sessions: 5, networks: 1}\n"
      "  per_process: {shared_memory: 1GiB}\n",
      "r");
  ASSERT_TRUE(r.ok()) << r.error_text();
  EXPECT_EQ(restart_required_changes(running, *r.config), std::vector<std::string>{"rings.capacity"});
  const DaemonConfig next = hot_reloaded(running, *r.config);
  EXPECT_EQ(next.rings.capacity, 4096u) << "restart key kept";
  EXPECT_EQ(next.rings.max_capacity, 16384u) << "a limit on new requests: hot";
  EXPECT_EQ(next.clients.max_sessions, 10u);
  EXPECT_EQ(next.clients.per_uid.sessions, 5u);
  EXPECT_EQ(next.clients.per_uid.networks, 1u);
  EXPECT_EQ(next.clients.per_process.shared_memory, uint64_t{1} << 30);
  EXPECT_TRUE(restart_required_changes(running, next).empty());
}

TEST(ClientLimits, TheDescriptorReserveShrinksWithASmallLimit) {
  EXPECT_EQ(reserved_descriptors(1u << 20), kReservedDescriptors);
  EXPECT_EQ(reserved_descriptors(4096), kReservedDescriptors);
  EXPECT_EQ(reserved_descriptors(1024), 256u);
  EXPECT_EQ(reserved_descriptors(64), 16u);
}

// `mkerneldctl reload /some/fifo` must not hang an admin thread until someone writes to it.
TEST(ConfigFileKinds, AFifoIsRefusedWithoutWaitingForAWriter) {
  char dir[] = "/tmp/mkcfg-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string fifo = std::string(dir) + "/cfg.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const auto t0 = std::chrono::steady_clock::now();
  const LoadResult r = load_config_file(fifo);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
  EXPECT_EQ(messages(r), fifo + ": not a regular file (a FIFO); expected a YAML file");
  const LoadResult dev = load_config_file("/dev/zero");
  EXPECT_EQ(messages(dev), "/dev/zero: not a regular file (a device); expected a YAML file");
  ::unlink(fifo.c_str());
  ::rmdir(dir);
}

}  // namespace
}  // namespace mkernel::config
