// Host-side helpers for GPU ring tests and benchmarks: a ring in a memfd mapping registered with
// CUDA (as the daemon's segments will be), the device producer view, and a consumer thread.
#pragma once

#include <cuda_runtime.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "mkernel/protocol/ring_device.cuh"
#include "mkernel/protocol/ring_host.h"

namespace mkt {

namespace mp = mkernel::protocol;

#define MKT_CHECK_CUDA(expr)                                                             \
  do {                                                                                   \
    cudaError_t err_ = (expr);                                                           \
    if (err_ != cudaSuccess) {                                                           \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #expr,          \
                   cudaGetErrorString(err_));                                            \
      std::exit(1);                                                                      \
    }                                                                                    \
  } while (0)

// Exits 77 (ctest: skipped) with the reason when no Hopper GPU is usable here.
inline void require_hopper_or_skip(const char* test_name) {
  // Line-buffered: a test ended by its time bound still shows the case it was in.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess || n == 0) {
    std::printf("SKIPPED %s: no CUDA GPU available (%s)\n", test_name,
                err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
    std::exit(77);
  }
  cudaDeviceProp prop{};
  MKT_CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  if (prop.major != 9) {
    std::printf("SKIPPED %s: GPU 0 is %s (sm_%d%d); these kernels are built for sm_90a\n",
                test_name, prop.name, prop.major, prop.minor);
    std::exit(77);
  }
}

// A ring whose segment is a memfd mapping registered (mapped) with CUDA.
class PinnedRing {
 public:
  PinnedRing(uint32_t capacity_log2, uint64_t epoch = 1) {
    bytes_ = mp::ring_segment_bytes(capacity_log2);
    fd_ = memfd_create("mkernel-ring-test", MFD_CLOEXEC);
    if (fd_ < 0 || ftruncate(fd_, static_cast<off_t>(bytes_)) != 0) {
      std::perror("memfd");
      std::exit(1);
    }
    mem_ = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    if (mem_ == MAP_FAILED) {
      std::perror("mmap");
      std::exit(1);
    }
    const std::string err = mp::init_ring(mem_, bytes_, capacity_log2, 1, epoch, &host_);
    if (!err.empty()) {
      std::fprintf(stderr, "init_ring: %s\n", err.c_str());
      std::exit(1);
    }
    MKT_CHECK_CUDA(cudaHostRegister(mem_, bytes_, cudaHostRegisterMapped));
    void* dev = nullptr;
    MKT_CHECK_CUDA(cudaHostGetDevicePointer(&dev, mem_, 0));
    MKT_CHECK_CUDA(cudaMalloc(&state_, sizeof(mp::RingDeviceState)));
    MKT_CHECK_CUDA(cudaMemset(state_, 0, sizeof(mp::RingDeviceState)));
    device_.header = static_cast<mp::RingHeader*>(dev);
    device_.slots =
        reinterpret_cast<mp::CommandRecord*>(static_cast<char*>(dev) + mp::kRingSlotsOffset);
    device_.state = state_;
    device_.capacity_log2 = capacity_log2;
    device_.expected_epoch = epoch;
    device_.timeout_ns = 2'000'000'000ull;
  }
  ~PinnedRing() {
    cudaFree(state_);
    cudaHostUnregister(mem_);
    munmap(mem_, bytes_);
    close(fd_);
  }
  PinnedRing(const PinnedRing&) = delete;
  PinnedRing& operator=(const PinnedRing&) = delete;

  const mp::RingView& host() const { return host_; }
  mp::RingProducerView& device() { return device_; }

 private:
  int fd_ = -1;
  size_t bytes_ = 0;
  void* mem_ = nullptr;
  mp::RingView host_;
  mp::RingProducerView device_;
  mp::RingDeviceState* state_ = nullptr;
};

// Waits for a kernel with a bound; returns false (and says so) if it did not finish in time.
inline bool wait_stream(cudaStream_t s, std::chrono::milliseconds bound, const char* what) {
  const auto deadline = std::chrono::steady_clock::now() + bound;
  for (;;) {
    const cudaError_t e = cudaStreamQuery(s);
    if (e == cudaSuccess) return true;
    if (e != cudaErrorNotReady) {
      std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
      return false;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      std::fprintf(stderr, "%s: did not finish within %lld ms\n", what,
                   static_cast<long long>(bound.count()));
      return false;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

}  // namespace mkt
