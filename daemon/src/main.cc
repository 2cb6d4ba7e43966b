// mkerneld: the mkernel node daemon.
#include <fcntl.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <signal.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/sinks/syslog_sink.h>
#include <spdlog/pattern_formatter.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <thread>
#include <cstdio>
#include <iostream>

#include "daemon.h"
#include "mkernel/config/config.h"
#include "ops_hooks.h"

namespace {

constexpr const char* kDefaultConfigPath = "/etc/mkernel/mkerneld.yaml";

spdlog::level::level_enum to_spdlog(mkernel::config::LogLevel l) {
  switch (l) {
    case mkernel::config::LogLevel::kTrace: return spdlog::level::trace;
    case mkernel::config::LogLevel::kDebug: return spdlog::level::debug;
    case mkernel::config::LogLevel::kInfo: return spdlog::level::info;
    case mkernel::config::LogLevel::kWarn: return spdlog::level::warn;
    case mkernel::config::LogLevel::kError: return spdlog::level::err;
  }
  return spdlog::level::info;
}

// %j: the message as the inside of a JSON string (quotes, backslashes and control characters
// escaped), so every line of the json log format parses whatever a message contains.
class JsonEscapedMessage final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&, spdlog::memory_buf_t& dest) override {
    static const char* kHex = "0123456789abcdef";
    auto put = [&dest](std::string_view text) { dest.append(text.data(), text.data() + text.size()); };
    for (const char ch : msg.payload) {
      const auto c = static_cast<unsigned char>(ch);
      switch (c) {
        case '"': put(std::string_view("\\\"")); break;
        case '\\': put(std::string_view("\\\\")); break;
        case '\n': put(std::string_view("\\n")); break;
        case '\r': put(std::string_view("\\r")); break;
        case '\t': put(std::string_view("\\t")); break;
        default:
          if (c < 0x20) {
            const char esc[6] = {'\\', 'u', '0', '0', kHex[c >> 4], kHex[c & 15]};
            dest.append(esc, esc + 6);
          } else {
            dest.push_back(ch);
          }
      }
    }
  }
  std::unique_ptr<spdlog::custom_flag_formatter> clone() const override {
    return std::make_unique<JsonEscapedMessage>();
  }
};

void setup_logging(const mkernel::config::LoggingConfig& lc, bool to_syslog) {
  std::shared_ptr<spdlog::logger> logger;
  if (to_syslog)
    logger = std::make_shared<spdlog::logger>(
        "mkerneld", std::make_shared<spdlog::sinks::syslog_sink_mt>("mkerneld", LOG_PID, LOG_DAEMON, true));
  else
    logger = std::make_shared<spdlog::logger>("mkerneld", std::make_shared<spdlog::sinks::stderr_sink_mt>());
  // Journal-friendly by default: no timestamp (journald adds one), level in brackets.
  if (lc.format == mkernel::config::LogFormat::kJson) {
    auto formatter = std::make_unique<spdlog::pattern_formatter>();
    formatter->add_flag<JsonEscapedMessage>('j').set_pattern(
        R"({"time":"%Y-%m-%dT%H:%M:%S.%f%z","level":"%l","thread":%t,"msg":"%j"})");
    logger->set_formatter(std::move(formatter));
  } else {
    logger->set_pattern("[%l] %v");
  }
  logger->set_level(to_spdlog(lc.level));
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
}

// The heap: memory that sessions freed goes back to the system instead of staying with the
// allocator. A fixed mmap threshold keeps glibc from raising it after large frees (then large
// blocks would come from the heap and stay there); few arenas keep freed memory in few places;
// the event loop trims the heap after sessions end (event_loop.h note 3).
void configure_heap() {
#ifdef __GLIBC__
  ::mallopt(M_MMAP_THRESHOLD, 128 * 1024);
  ::mallopt(M_TRIM_THRESHOLD, 1 << 20);
  ::mallopt(M_ARENA_MAX, 2);
#endif
}

bool daemonize() {
  const pid_t pid = ::fork();
  if (pid < 0) return false;
  if (pid > 0) ::_exit(0);
  if (::setsid() < 0) return false;
  const pid_t pid2 = ::fork();
  if (pid2 < 0) return false;
  if (pid2 > 0) ::_exit(0);
  if (::chdir("/") != 0) return false;
  const int devnull = ::open("/dev/null", O_RDWR);
  if (devnull >= 0) {
    ::dup2(devnull, 0);
    ::dup2(devnull, 1);
    ::dup2(devnull, 2);
    if (devnull > 2) ::close(devnull);
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  namespace cfg = mkernel::config;
  CLI::App app{"mkerneld: the mkernel node daemon. It owns the NICs, runs one proxy per GPU and "
               "serves client sessions on a Unix socket in its runtime directory."};
  std::string config_path, runtime_dir, log_level, check_config;
  bool foreground = false, test_hooks = false, print_default = false;
  app.add_option("--config", config_path,
                 std::string("YAML config file (default: ") + kDefaultConfigPath +
                     " when it exists, else the built-in default)");
  app.add_option("--runtime-dir", runtime_dir,
                 "runtime directory for sockets (overrides node.runtime_dir), so several daemons "
                 "can run side by side");
  app.add_flag("--foreground", foreground, "stay in the foreground and log to stderr (systemd, tests)");
  app.add_option("--log-level", log_level, "trace, debug, info, warn or error (overrides logging.level)")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}));
  app.add_option("--check-config", check_config, "validate FILE, print the verdict and exit (1 on error)");
  app.add_flag("--print-default-config", print_default, "print the built-in default config as YAML and exit");
  app.add_flag("--enable-test-hooks", test_hooks, "allow test-only admin calls (StallProxy)");
  CLI11_PARSE(app, argc, argv);

  if (!check_config.empty()) {
    const cfg::LoadResult r = cfg::load_config_file(check_config);
    if (r.ok()) {
      std::printf("%s: ok\n", check_config.c_str());
      // What the unit's LimitNOFILE must be for this config (docs/operations.md).
      std::printf("descriptors: LimitNOFILE=%llu or more (clients.max_descriptors %u + %u kept for admin, "
                  "health, metrics and peers)\n",
                  static_cast<unsigned long long>(uint64_t{r.config->clients.max_descriptors} +
                                                  cfg::kReservedDescriptors),
                  r.config->clients.max_descriptors, cfg::kReservedDescriptors);
      return 0;
    }
    std::fprintf(stderr, "%s", r.error_text().c_str());
    std::fprintf(stderr, "%s: %zu error(s)\n", check_config.c_str(), r.errors.size());
    return 1;
  }
  if (print_default) {
    std::cout << cfg::to_yaml(cfg::default_config());
    return 0;
  }

  mkernel::daemon::DaemonOptions opts;
  if (config_path.empty() && ::access(kDefaultConfigPath, F_OK) == 0) config_path = kDefaultConfigPath;
  if (!config_path.empty()) {
    cfg::LoadResult r = cfg::load_config_file(config_path);
    if (!r.ok()) {
      std::fprintf(stderr, "%s", r.error_text().c_str());
      std::fprintf(stderr, "mkerneld: %s has %zu error(s); not starting\n", config_path.c_str(), r.errors.size());
      return 1;
    }
    opts.config = *r.config;
    opts.config_source = config_path;
  } else {
    opts.config = cfg::default_config();
  }
  // The command line wins over the file, at start and at every reload (daemon_state.h).
  if (!runtime_dir.empty()) {
    if (runtime_dir[0] != '/') {
      char cwd[4096];
      if (::getcwd(cwd, sizeof(cwd)) != nullptr) runtime_dir = std::string(cwd) + "/" + runtime_dir;
    }
    opts.runtime_dir_override = runtime_dir;
    opts.config.node.runtime_dir = runtime_dir;
  }
  if (!log_level.empty()) {
    const char* names[] = {"trace", "debug", "info", "warn", "error"};
    for (int i = 0; i < 5; ++i)
      if (log_level == names[i]) opts.log_level_override = static_cast<cfg::LogLevel>(i);
    opts.config.logging.level = *opts.log_level_override;
  }
  configure_heap();
  opts.test_hooks = test_hooks;
  if (!foreground && !daemonize()) {
    std::perror("mkerneld: cannot daemonize");
    return 1;
  }
  setup_logging(opts.config.logging, !foreground);

  // Signals go to this thread only: every thread started below inherits the mask.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGHUP);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  mkernel::daemon::Daemon daemon(opts);
  if (const mkernel::Status s = daemon.start(); !s.ok()) {
    spdlog::error("mkerneld: cannot start: {}", s.to_string());
    return 1;
  }
  auto ops = mkernel::daemon::start_ops(daemon.control(), opts.config);
  if (!ops.ok()) {
    spdlog::error("mkerneld: cannot start the operations services: {}", ops.status().to_string());
    daemon.stop();
    return 1;
  }
  ops.value()->notify_ready();

  for (;;) {
    timespec wait{1, 0};
    const int sig = ::sigtimedwait(&sigs, nullptr, &wait);
    if (sig == SIGHUP) {
      ops.value()->notify_reloading();
      const mkernel::daemon::ReloadResult r = daemon.control().reload("");
      if (!r.status.ok()) spdlog::warn("SIGHUP: {}", r.status.to_string());
      ops.value()->notify_ready();
    } else if (sig == SIGTERM || sig == SIGINT) {
      spdlog::info("mkerneld: {} received, stopping", sig == SIGTERM ? "SIGTERM" : "SIGINT");
      break;
    }
  }
  ops.value()->notify_stopping();
  // A proxy thread can be stuck inside a provider call (libfabric's shm provider spins forever
  // on a peer that died holding its lock) and then cannot be joined: stopping is bounded, and a
  // stop that overruns ends the process with a plain message instead of hanging.
  std::atomic<bool> stopped{false};
  std::thread stop_guard([&stopped, bound = daemon.config().timeouts.drain + std::chrono::seconds(5)] {
    const auto deadline = std::chrono::steady_clock::now() + bound;
    while (!stopped.load()) {
      if (std::chrono::steady_clock::now() > deadline) {
        spdlog::error("mkerneld: stopping took longer than timeouts.drain_ms + 5 s (a proxy is stuck in its "
                      "transport); exiting without waiting for it");
        spdlog::shutdown();
        ::_exit(1);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  ops.value()->stop();
  daemon.stop();
  stopped.store(true);
  stop_guard.join();
  spdlog::info("mkerneld: stopped");
  return 0;
}
