// Shared pieces of the runtime GPU tests: starting mkerneld processes, skipping without a GPU,
// the tile pattern kernels write and check.
#pragma once

#include <cuda_runtime.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "mkernel/protocol/session_wire.h"

namespace mkt {

// Failed checks of the running test program (GPU tests are plain programs, not gtest).
inline int failures = 0;

// Counts a failed check and prints where and why; the test goes on.
#define MKT_CHECK(cond, ...)                           \
  do {                                                 \
    if (!(cond)) {                                     \
      std::printf("FAIL %s:%d: ", __FILE__, __LINE__); \
      std::printf(__VA_ARGS__);                        \
      std::printf("\n");                               \
      ++mkt::failures;                                 \
    }                                                  \
  } while (0)

// Returns 1 from the calling function (a test's main or rank body) when a CUDA call fails, saying
// which call and why.
#define CUDA_OK(expr)                                                                         \
  do {                                                                                        \
    const cudaError_t e_ = (expr);                                                            \
    if (e_ != cudaSuccess) {                                                                  \
      std::printf("FAIL %s:%d: %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_)); \
      return 1;                                                                               \
    }                                                                                         \
  } while (0)

// Exits 77 (ctest: skipped) with the reason unless `need` Hopper GPUs are usable.
inline void require_gpus_or_skip(const char* test, int need) {
  // Line-buffered: a test ended by its time bound still shows the case it was in.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess || n < need) {
    std::printf("SKIPPED %s: needs %d CUDA GPU(s), found %d%s%s\n", test, need, err == cudaSuccess ? n : 0,
                err != cudaSuccess ? ": " : "", err != cudaSuccess ? cudaGetErrorString(err) : "");
    std::exit(77);
  }
  for (int d = 0; d < need; ++d) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, d) != cudaSuccess || prop.major != 9) {
      std::printf("SKIPPED %s: GPU %d is not a Hopper GPU (sm_90a builds)\n", test, d);
      std::exit(77);
    }
  }
}

// The same check without touching CUDA in this process (for tests that fork before any CUDA
// call): count the driver's GPUs.
inline int driver_gpu_count() {
  int n = 0;
  if (FILE* p = ::popen("ls /proc/driver/nvidia/gpus 2>/dev/null | wc -l", "r")) {
    if (std::fscanf(p, "%d", &n) != 1) n = 0;
    ::pclose(p);
  }
  return n;
}

class Daemon {
 public:
  Daemon(std::string dir, const std::string& yaml) : dir_(std::move(dir)) {
    ::mkdir(dir_.c_str(), 0755);
    std::ofstream(dir_ + "/mkerneld.yaml") << yaml;
  }
  ~Daemon() { kill(SIGTERM); }
  std::string socket() const { return dir_ + "/mkerneld.sock"; }
  const std::string& dir() const { return dir_; }
  pid_t pid() const { return pid_; }

  bool start() {
    const char* path = std::getenv("MKERNELD");
    const std::string exe = path != nullptr ? path : MKERNELD_PATH;
    pid_ = ::fork();
    if (pid_ == 0) {
      const int fd = ::open((dir_ + "/mkerneld.log").c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
      }
      const std::string cfg = dir_ + "/mkerneld.yaml";
      ::execl(exe.c_str(), exe.c_str(), "--foreground", "--runtime-dir", dir_.c_str(), "--config", cfg.c_str(),
              static_cast<char*>(nullptr));
      ::_exit(127);
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline) {
      int st = 0;
      if (::waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        std::printf("mkerneld exited at start; log %s/mkerneld.log\n", dir_.c_str());
        return false;
      }
      if (mkernel::protocol::connect_unix(socket(), std::chrono::milliseconds(100)).ok()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    std::printf("mkerneld did not answer within 20 s; log %s/mkerneld.log\n", dir_.c_str());
    return false;
  }

  void kill(int sig) {
    if (pid_ <= 0) return;
    ::kill(pid_, sig);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    int st = 0;
    while (::waitpid(pid_, &st, WNOHANG) != pid_) {
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &st, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    pid_ = -1;
  }

 private:
  std::string dir_;
  pid_t pid_ = -1;
};

// "a,b,,c" -> {"a", "b", "", "c"}: the comma lists the GPU programs take as arguments.
inline std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at <= s.size()) {
    const size_t comma = s.find(',', at);
    out.push_back(s.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return out;
}

inline std::string temp_dir(const char* name) {
  std::string t = std::string("/tmp/mkernel-gpu-") + name + "-XXXXXX";
  std::vector<char> b(t.begin(), t.end());
  b.push_back('\0');
  return ::mkdtemp(b.data()) ? std::string(b.data()) : t;
}

// A daemon config for GPU tests: GPUs `ids`, libfabric `provider`, peers on a Unix socket;
// `transport_extra` ("key: value, ...") joins the transport section.
inline std::string daemon_yaml(const std::string& provider, const std::string& gpu_ids,
                               const std::string& transport_extra = "") {
  return "gpus: {select: list, ids: [" + gpu_ids + "]}\n"
         "transport: {kind: fabric, provider: \"" + provider + "\"" + (provider == "shm" ? "" : ", nic: lo") +
         (transport_extra.empty() ? "" : ", " + transport_extra) + "}\n"
         "proxy: {poll: {mode: spin}, cpu_affinity: none}\n"
         "timeouts: {command_ms: 5000, rendezvous_ms: 30000}\n";
}

// Forks one process per rank (before any CUDA call in this process) running rank_main(rank),
// waits for all of them up to `bound` (a rank still running then is killed and counts as
// failed) and returns how many did not exit 0.
template <class RankMain>
int run_ranks(uint32_t ranks, RankMain rank_main, std::chrono::seconds bound = std::chrono::seconds(120)) {
  std::vector<pid_t> kids(ranks);
  for (uint32_t r = 0; r < ranks; ++r) {
    kids[r] = ::fork();
    if (kids[r] == 0) {
      const int rc = rank_main(r);
      std::fflush(stdout);
      ::_exit(rc);
    }
  }
  int failures = 0;
  const auto deadline = std::chrono::steady_clock::now() + bound;
  for (uint32_t r = 0; r < ranks; ++r) {
    int st = 0;
    while (::waitpid(kids[r], &st, WNOHANG) != kids[r]) {
      if (std::chrono::steady_clock::now() > deadline) {
        std::printf("FAIL rank %u did not finish within %lld s\n", r, static_cast<long long>(bound.count()));
        ::kill(kids[r], SIGKILL);
        ::waitpid(kids[r], &st, 0);
        st = 1 << 8;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    failures += !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
  return failures;
}

__host__ __device__ inline uint32_t tile_word(uint32_t from, uint32_t tile, uint64_t launch, uint32_t i) {
  uint32_t x = from * 0x9E3779B9u ^ tile * 0x85EBCA6Bu ^ static_cast<uint32_t>(launch) * 0xC2B2AE35u ^ i;
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  return x;
}

}  // namespace mkt
