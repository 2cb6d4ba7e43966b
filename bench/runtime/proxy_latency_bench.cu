// proxy_latency_bench: one-way latency GPU -> proxy -> remote GPU flag, and command rate, on two
// GPUs as two nodes (two mkerneld processes, libfabric shm or tcp;ofi_rxm, host staging), beside
// NCCL send/recv of the same sizes in the same run.
//
// Ours: a kernel on rank 0 pushes a write-with-signal (size S) to rank 1; rank 1's kernel waits
// for the flag and pushes one back; rank 0 times each round trip with %globaltimer inside the
// kernel (no launch in the loop). One-way = round trip / 2. Rate: rank 0 pushes N 64-byte
// write-with-signal commands back to back; time until rank 1 saw the last flag, from rank 0's
// first push (both clocks are the GPUs' globaltimer, read on each side; we report rank 1's
// elapsed time from its first observed flag as a lower bound and rank 0's push window).
// NCCL: ncclSend/ncclRecv ping-pong of S bytes between the two GPUs (NCCL_NVLS_ENABLE=0), each
// round trip timed with CUDA events; one-way = round trip / 2.
//
// Prints one JSON line per (what, bytes) with p50/p99/mean one-way microseconds.
#include <cuda_runtime.h>
#include <nccl.h>
#include <sys/mman.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "mkernel/runtime/runtime.h"
#include "runtime_gpu_util.h"

namespace rt = mkernel::rt;
namespace mp = mkernel::protocol;

namespace {

constexpr int kIters = 2000, kWarm = 200;
const uint64_t kSizes[] = {8, 4096, 65536, 1 << 20};

__global__ void ping(rt::DeviceComm c, uint64_t bytes, int iters, uint64_t base, unsigned long long* rtt_ns,
                     unsigned int* err) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  namespace rd = mkernel::sync;
  for (int i = 0; i < iters; ++i) {
    const uint64_t v = base + i + 1;
    const uint64_t t0 = rd::globaltimer_ns();
    if (mp::ring_push(c.ring, mp::make_write_signal(1, 0, 0, 1, 0, bytes, 0, v)) != mp::kRingOk) { *err = 1; return; }
    if (!rt::wait_flag(c, 1, v)) { *err = 2; return; }
    rtt_ns[i] = rd::globaltimer_ns() - t0;
  }
}

__global__ void pong(rt::DeviceComm c, uint64_t bytes, int iters, uint64_t base, unsigned int* err) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  for (int i = 0; i < iters; ++i) {
    const uint64_t v = base + i + 1;
    if (!rt::wait_flag(c, 0, v)) { *err = 2; return; }
    if (mp::ring_push(c.ring, mp::make_write_signal(0, 0, 0, 1, 0, bytes, 1, v)) != mp::kRingOk) { *err = 1; return; }
  }
}

// Rate: rank 0 pushes n commands as fast as the ring takes them; rank 1 waits for the last.
__global__ void blast(rt::DeviceComm c, int n, uint64_t base, unsigned long long* ns, unsigned int* err) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  namespace rd = mkernel::sync;
  const uint64_t t0 = rd::globaltimer_ns();
  for (int i = 0; i < n; ++i)
    if (mp::ring_push(c.ring, mp::make_write_signal(1, 0, 0, 1, 0, 64, 2, base + i + 1)) != mp::kRingOk) { *err = 1; return; }
  ns[0] = rd::globaltimer_ns() - t0;
}
__global__ void drain(rt::DeviceComm c, uint64_t last, unsigned long long* ns, unsigned int* err) {
  namespace rd = mkernel::sync;
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  // Starts timing at the first flag it sees move.
  const uint64_t before = rd::ld_acquire_sys(&c.flags[2]);
  while (rd::ld_acquire_sys(&c.flags[2]) == before) {
  }
  const uint64_t t0 = rd::globaltimer_ns();
  if (!rt::wait_flag(c, 2, last)) { *err = 2; return; }
  ns[0] = rd::globaltimer_ns() - t0;
}

struct Shared {  // parent <-> children, in a shared anonymous mapping
  double ours[4][3];   // p50, p99, mean one-way us
  double nccl[4][3];
  double rate_push, rate_seen;
  int ok[2];
  ncclUniqueId nccl_id;
};

void percentiles(std::vector<double> v, double out[3]) {
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (double x : v) sum += x;
  out[0] = v[v.size() / 2];
  out[1] = v[std::min(v.size() - 1, v.size() * 99 / 100)];
  out[2] = sum / v.size();
}

int run_rank(uint32_t rank, const rt::UniqueId& id, const std::string& socket, Shared* sh) {
  rt::Options o;
  o.socket_path = socket;
  o.cuda_device = static_cast<int>(rank);
  o.proxy = static_cast<int32_t>(rank);
  o.device_wait_timeout_ns = 10000000000ull;
  auto made = rt::Communicator::create(rank, 2, id, {2u << 20, 2u << 20}, o);
  if (!made.ok()) {
    std::printf("rank %u: create: %s\n", rank, made.status().to_string().c_str());
    return 1;
  }
  rt::Communicator& comm = *made.value();
  unsigned long long* rtt = nullptr;
  unsigned int* err = nullptr;
  cudaMalloc(&rtt, sizeof(unsigned long long) * (kIters + kWarm));
  cudaMalloc(&err, sizeof(unsigned int));
  cudaMemset(err, 0, sizeof(unsigned int));
  uint64_t base = 0;
  for (int s = 0; s < 4; ++s) {
    const int n = kIters + kWarm;
    if (rank == 0) ping<<<1, 32>>>(comm.device(), kSizes[s], n, base, rtt, err);
    else pong<<<1, 32>>>(comm.device(), kSizes[s], n, base, err);
    if (cudaDeviceSynchronize() != cudaSuccess) return 1;
    base += n;
    if (rank == 0) {
      std::vector<unsigned long long> h(n);
      cudaMemcpy(h.data(), rtt, sizeof(unsigned long long) * n, cudaMemcpyDeviceToHost);
      std::vector<double> one_way;
      for (int i = kWarm; i < n; ++i) one_way.push_back(h[i] / 2000.0);
      percentiles(one_way, sh->ours[s]);
    }
  }
  // Command rate.
  constexpr int kBlast = 200000;
  unsigned long long* ns = rtt;
  if (rank == 0) blast<<<1, 32>>>(comm.device(), kBlast, base, ns, err);
  else drain<<<1, 32>>>(comm.device(), base + kBlast, ns, err);
  if (cudaDeviceSynchronize() != cudaSuccess) return 1;
  unsigned long long h_ns = 0;
  unsigned int h_err = 0;
  cudaMemcpy(&h_ns, ns, sizeof(h_ns), cudaMemcpyDeviceToHost);
  cudaMemcpy(&h_err, err, sizeof(h_err), cudaMemcpyDeviceToHost);
  if (rank == 0) sh->rate_push = kBlast / (h_ns / 1e9);
  else sh->rate_seen = (kBlast - 1) / (h_ns / 1e9);
  if (h_err != 0 || !comm.check().ok()) {
    std::printf("rank %u: device error %u, %s\n", rank, h_err, comm.check().to_string().c_str());
    return 1;
  }

  // NCCL send/recv ping-pong, same sizes, same GPUs.
  ncclComm_t nc;
  if (ncclCommInitRank(&nc, 2, sh->nccl_id, static_cast<int>(rank)) != ncclSuccess) {
    std::printf("rank %u: ncclCommInitRank failed\n", rank);
    return 1;
  }
  void* buf = nullptr;
  cudaMalloc(&buf, 1 << 20);
  cudaStream_t st;
  cudaStreamCreate(&st);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  for (int s = 0; s < 4; ++s) {
    std::vector<double> one_way;
    for (int i = 0; i < kIters + kWarm; ++i) {
      cudaEventRecord(e0, st);
      if (rank == 0) {
        ncclSend(buf, kSizes[s], ncclInt8, 1, nc, st);
        ncclRecv(buf, kSizes[s], ncclInt8, 1, nc, st);
      } else {
        ncclRecv(buf, kSizes[s], ncclInt8, 0, nc, st);
        ncclSend(buf, kSizes[s], ncclInt8, 0, nc, st);
      }
      cudaEventRecord(e1, st);
      cudaEventSynchronize(e1);
      float ms = 0;
      cudaEventElapsedTime(&ms, e0, e1);
      if (i >= kWarm) one_way.push_back(ms * 1000.0 / 2.0);
    }
    if (rank == 0) percentiles(one_way, sh->nccl[s]);
  }
  ncclCommDestroy(nc);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string provider = argc > 1 ? argv[1] : "shm";
  if (mkt::driver_gpu_count() < 2) {
    std::printf("proxy_latency_bench: needs 2 GPUs, the driver lists %d\n", mkt::driver_gpu_count());
    return 77;
  }
  auto* sh = static_cast<Shared*>(::mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  ncclGetUniqueId(&sh->nccl_id);
  mkt::Daemon a(mkt::temp_dir("lat-a"), mkt::daemon_yaml(provider, "0"));
  mkt::Daemon b(mkt::temp_dir("lat-b"), mkt::daemon_yaml(provider, "1"));
  if (!a.start() || !b.start()) return 1;
  rt::Options o;
  o.socket_path = a.socket();
  o.proxy = 0;
  auto id = rt::get_unique_id(o);
  if (!id.ok()) return 1;
  if (mkt::run_ranks(2, [&](uint32_t r) { return run_rank(r, id.value(), r == 0 ? a.socket() : b.socket(), sh); },
                     std::chrono::seconds(300)) != 0)
    return 1;
  for (int s = 0; s < 4; ++s) {
    std::printf("{\"bench\":\"proxy_latency\",\"path\":\"mkernel\",\"provider\":\"%s\",\"staging\":\"host-pinned\","
                "\"bytes\":%llu,\"one_way_us_p50\":%.2f,\"one_way_us_p99\":%.2f,\"one_way_us_mean\":%.2f}\n",
                provider.c_str(), static_cast<unsigned long long>(kSizes[s]), sh->ours[s][0], sh->ours[s][1],
                sh->ours[s][2]);
    std::printf("{\"bench\":\"proxy_latency\",\"path\":\"nccl_send_recv\",\"bytes\":%llu,\"one_way_us_p50\":%.2f,"
                "\"one_way_us_p99\":%.2f,\"one_way_us_mean\":%.2f}\n",
                static_cast<unsigned long long>(kSizes[s]), sh->nccl[s][0], sh->nccl[s][1], sh->nccl[s][2]);
  }
  std::printf("{\"bench\":\"proxy_command_rate\",\"provider\":\"%s\",\"bytes\":64,\"pushed_per_s\":%.0f,"
              "\"delivered_per_s\":%.0f}\n",
              provider.c_str(), sh->rate_push, sh->rate_seen);
  return 0;
}
