// fused_harness.h: what the fused-op GPU tests and benchmarks share. A cluster of `nodes` x
// `gpus` ranks emulated on the GPUs at hand: one mkerneld per node (so ranks on different
// daemons talk through the proxies, host-staged), each rank on its own GPU when there are
// enough, else all on GPU 0 (ranks on one daemon still map each other's NVLink buffers: on one
// GPU that is a second mapping of the same memory, which exercises every line of the NVLink path
// but not the link). Ranks run as threads of this process, each with its own communicator and
// non-blocking stream, so their kernels run side by side on a shared GPU when the caller sizes
// the block split to fit.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <barrier>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "mkernel/runtime/runtime.h"
#include "runtime_gpu_util.h"

namespace fused_test {

namespace rt = mkernel::rt;

// One printer at a time among the ranks' threads.
inline std::mutex g_print;

// In a rank's body (with `rank` and an int `fails` in scope): prints the failed condition's
// message with the rank and place, and counts it.
#define RANK_CHECK(cond, ...)                                          \
  do {                                                                 \
    if (!(cond)) {                                                     \
      std::lock_guard<std::mutex> lock_(fused_test::g_print);          \
      std::printf("FAIL rank %u %s:%d: ", rank, __FILE__, __LINE__);   \
      std::printf(__VA_ARGS__);                                        \
      std::printf("\n");                                               \
      ++fails;                                                         \
    }                                                                  \
  } while (0)

struct Topology {
  uint32_t nodes = 1;
  uint32_t gpus = 2;               // ranks per node
  std::string provider = "shm";    // libfabric provider between the daemons
  uint32_t world() const { return nodes * gpus; }
  std::string name() const {
    return std::to_string(nodes) + "x" + std::to_string(gpus) + (nodes > 1 ? " over " + provider : "");
  }
};

// The daemons of an emulated cluster. Ranks r of node n = r / gpus use device device_of(r).
class Cluster {
 public:
  // transport_extra: settings joined to each daemon's transport section ("write_piece_bytes: 0");
  // when empty, MKERNEL_TEST_TRANSPORT from the environment (the same form), so any GPU test can
  // run its emulated nodes with other transport settings.
  Cluster(const Topology& t, const char* name, std::string transport_extra = "") : topo_(t) {
    if (const char* env = std::getenv("MKERNEL_TEST_TRANSPORT"); transport_extra.empty() && env != nullptr)
      transport_extra = env;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    devices_ = static_cast<uint32_t>(n);
    std::string ids;
    for (uint32_t g = 0; g < devices_; ++g) ids += (g ? ", " : "") + std::to_string(g);
    if (ids.empty()) ids = "0";
    // Each daemon is a node of its own name (the fused ops group ranks by node name).
    for (uint32_t node = 0; node < t.nodes; ++node)
      daemons_.push_back(std::make_unique<mkt::Daemon>(
          mkt::temp_dir(name),
          mkt::daemon_yaml(t.provider, ids, transport_extra) + "node: {name: \"emulated-node-" + std::to_string(node) + "\"}\n"));
  }
  bool start() {
    for (auto& d : daemons_)
      if (!d->start()) return false;
    return true;
  }
  // A GPU per rank when there are enough; else all ranks on GPU 0 (sharing it).
  int device_of(uint32_t rank) const { return shared_gpu() ? 0 : static_cast<int>(rank); }
  bool shared_gpu() const { return topo_.world() > devices_; }
  std::string socket_of(uint32_t rank) const { return daemons_[rank / topo_.gpus]->socket(); }
  mkt::Daemon& daemon(uint32_t node) { return *daemons_[node]; }
  const Topology& topology() const { return topo_; }

 private:
  Topology topo_;
  uint32_t devices_ = 0;
  std::vector<std::unique_ptr<mkt::Daemon>> daemons_;
};

// Creates every rank's communicator (in its own thread, since create() waits for all) with
// `base` options pointed at its daemon and device, then runs body(rank, comm, stream, sync) in
// that thread. Returns how many ranks failed (a failed create() counts, with its message printed).
//
// Ranks that share a GPU share its work queue: a CUDA call that synchronises the whole device
// implicitly (cudaMalloc, cudaFree, module loading, a cuBLAS call that allocates its workspace,
// mapping a peer's buffer) waits for every running kernel, including another rank's kernel that
// waits for this rank's data: a stall until that kernel's bound. One rank per GPU, as deployed,
// never meets this. The bodies therefore move in step around launches: sync() is a barrier of
// all ranks' threads, called once everything that may allocate is done and before the launches;
// and such programs set CUDA_MODULE_LOADING=EAGER (a module loaded on first use waits too).
using RankSync = std::function<void()>;
using RankBody = std::function<int(uint32_t rank, rt::Communicator& comm, cudaStream_t stream, const RankSync& sync)>;

inline int run_ranks_in_threads(Cluster& cluster, const rt::Options& base, const std::vector<uint64_t>& buffers,
                                const RankBody& body) {
  const uint32_t R = cluster.topology().world();
  rt::Options o0 = base;
  o0.socket_path = cluster.socket_of(0);
  o0.cuda_device = cluster.device_of(0);
  if (cudaSetDevice(o0.cuda_device) != cudaSuccess) return static_cast<int>(R);
  auto id = rt::get_unique_id(o0);
  if (!id.ok()) {
    std::printf("FAIL get_unique_id: %s\n", id.status().to_string().c_str());
    return static_cast<int>(R);
  }
  std::atomic<int> failed{0};
  // No rank tears down its communicator while another may still send to it (the last launch's
  // slot-free signals travel after the kernels ended).
  std::barrier done(static_cast<std::ptrdiff_t>(R));
  std::barrier step(static_cast<std::ptrdiff_t>(R));
  const RankSync sync = [&step] { step.arrive_and_wait(); };
  std::vector<std::thread> threads;
  for (uint32_t r = 0; r < R; ++r) {
    threads.emplace_back([&, r] {
      rt::Options o = base;
      o.socket_path = cluster.socket_of(r);
      o.cuda_device = cluster.device_of(r);
      std::unique_ptr<rt::Communicator> comm;
      cudaStream_t stream = nullptr;
      if (cudaSetDevice(o.cuda_device) != cudaSuccess ||
          cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
        ++failed;
      } else if (auto made = rt::Communicator::create(r, R, id.value(), buffers, o); !made.ok()) {
        std::printf("FAIL rank %u: create: %s\n", r, made.status().to_string().c_str());
        ++failed;
        step.arrive_and_drop();
      } else {
        comm = std::move(made.value());
        sync();  // every rank done with its communicator's set-up (which maps peers' buffers)
        if (body(r, *comm, stream, sync) != 0) ++failed;
        (void)cudaStreamSynchronize(stream);
        step.arrive_and_drop();
      }
      done.arrive_and_wait();
      std::this_thread::sleep_for(std::chrono::milliseconds(200));  // in-flight proxy commands land
      comm.reset();
      if (stream != nullptr) (void)cudaStreamDestroy(stream);
    });
  }
  for (auto& t : threads) t.join();
  return failed.load();
}

}  // namespace fused_test
