// vmm.h: GPU memory another process can map (the CUDA virtual memory API), for NVLink peers,
// and GPU memory a NIC can reach (GPUDirect RDMA capable, exported as a dmabuf descriptor).
// The driver entry points come from cudaGetDriverEntryPointByVersion, so nothing links libcuda
// and programs still load (and report "no GPU") on machines without a driver.
#pragma once

#include <cstddef>
#include <cstdint>

#include "mkernel/common/status.h"

namespace mkernel::rt {

// One mapping of device memory into this process's address space: allocated here (exportable
// as a POSIX file descriptor) or imported from a descriptor another process exported.
class VmmBuffer {
 public:
  VmmBuffer() = default;
  ~VmmBuffer();
  VmmBuffer(const VmmBuffer&) = delete;
  VmmBuffer& operator=(const VmmBuffer&) = delete;

  // Allocates at least `bytes` on `device`, readable and writable by `device`. With
  // `gpu_direct_rdma` the allocation is made GPUDirect RDMA capable (a NIC may reach it).
  static StatusOr<VmmBuffer*> allocate(int device, size_t bytes, bool gpu_direct_rdma = false);
  // Maps memory exported by another process into this one, accessible from `device`.
  static StatusOr<VmmBuffer*> import(int fd, int device, size_t bytes);
  // A new descriptor for the allocation (the caller closes it).
  StatusOr<int> export_fd() const;
  // A dmabuf descriptor for the whole mapping, offset 0 = ptr() (the caller closes it).
  StatusOr<int> export_dmabuf() const;
  // Ok when `device` can export GPUDirect-RDMA-capable VMM memory as dmabuf; else says why.
  static Status dmabuf_supported(int device);

  void* ptr() const { return reinterpret_cast<void*>(ptr_); }
  size_t size() const { return size_; }

 private:
  uint64_t ptr_ = 0;     // CUdeviceptr
  size_t size_ = 0;
  uint64_t handle_ = 0;  // CUmemGenericAllocationHandle
  bool mapped_ = false;
};

}  // namespace mkernel::rt
