#include "vmm.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include <mutex>
#include <string>

namespace mkernel::rt {

namespace {

struct Driver {
  decltype(&cuMemCreate) create = nullptr;
  decltype(&cuMemRelease) release = nullptr;
  decltype(&cuMemAddressReserve) reserve = nullptr;
  decltype(&cuMemAddressFree) address_free = nullptr;
  decltype(&cuMemMap) map = nullptr;
  decltype(&cuMemUnmap) unmap = nullptr;
  decltype(&cuMemSetAccess) set_access = nullptr;
  decltype(&cuMemGetAllocationGranularity) granularity = nullptr;
  decltype(&cuMemExportToShareableHandle) export_handle = nullptr;
  decltype(&cuMemImportFromShareableHandle) import_handle = nullptr;
  decltype(&cuGetErrorString) error_string = nullptr;
  decltype(&cuMemGetHandleForAddressRange) range_handle = nullptr;  // optional
  decltype(&cuDeviceGetAttribute) attribute = nullptr;
  decltype(&cuDeviceGet) device_get = nullptr;
  Status status;
};

template <class F>
Status entry(const char* name, F* fn) {
  cudaDriverEntryPointQueryResult q{};
  void* p = nullptr;
  const cudaError_t e = cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q);
  if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || p == nullptr)
    return Status(StatusCode::kDeviceError, std::string("CUDA driver entry point ") + name + " is unavailable: " +
                                                (e != cudaSuccess ? cudaGetErrorString(e) : "not found"));
  *fn = reinterpret_cast<F>(p);
  return Status::Ok();
}

const Driver& driver() {
  static Driver d;
  static std::once_flag once;
  std::call_once(once, [] {
    Status s;
    auto get = [&](const char* n, auto* fn) {
      if (s.ok()) s = entry(n, fn);
    };
    get("cuMemCreate", &d.create);
    get("cuMemRelease", &d.release);
    get("cuMemAddressReserve", &d.reserve);
    get("cuMemAddressFree", &d.address_free);
    get("cuMemMap", &d.map);
    get("cuMemUnmap", &d.unmap);
    get("cuMemSetAccess", &d.set_access);
    get("cuMemGetAllocationGranularity", &d.granularity);
    get("cuMemExportToShareableHandle", &d.export_handle);
    get("cuMemImportFromShareableHandle", &d.import_handle);
    get("cuGetErrorString", &d.error_string);
    get("cuDeviceGetAttribute", &d.attribute);
    get("cuDeviceGet", &d.device_get);
    d.status = s;
    // Only GPU-memory buffers for the NIC need it; its absence is reported there.
    if (!entry("cuMemGetHandleForAddressRange", &d.range_handle).ok()) d.range_handle = nullptr;
  });
  return d;
}

Status cu(const char* what, CUresult r) {
  if (r == CUDA_SUCCESS) return Status::Ok();
  const char* text = nullptr;
  if (driver().error_string) driver().error_string(r, &text);
  return Status(StatusCode::kDeviceError, std::string(what) + ": " + (text ? text : "CUDA driver error ") +
                                              (text ? "" : std::to_string(static_cast<int>(r))));
}

CUmemAllocationProp prop_for(int device, bool gpu_direct_rdma = false) {
  CUmemAllocationProp prop{};
  prop.allocFlags.gpuDirectRDMACapable = gpu_direct_rdma ? 1 : 0;
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

// Reserves, maps and opens `handle` to `device`; fills ptr/size on success.
Status map_handle(uint64_t handle, size_t bytes, int device, uint64_t* ptr) {
  const Driver& d = driver();
  CUdeviceptr va = 0;
  MK_RETURN_IF_ERROR(cu("cuMemAddressReserve", d.reserve(&va, bytes, 0, 0, 0)));
  if (Status s = cu("cuMemMap", d.map(va, bytes, 0, static_cast<CUmemGenericAllocationHandle>(handle), 0)); !s.ok()) {
    d.address_free(va, bytes);
    return s;
  }
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (Status s = cu("cuMemSetAccess", d.set_access(va, bytes, &access, 1)); !s.ok()) {
    d.unmap(va, bytes);
    d.address_free(va, bytes);
    return s;
  }
  *ptr = va;
  return Status::Ok();
}

}  // namespace

VmmBuffer::~VmmBuffer() {
  const Driver& d = driver();
  if (!d.status.ok()) return;
  if (mapped_) {
    d.unmap(ptr_, size_);
    d.address_free(ptr_, size_);
  }
  if (handle_ != 0) d.release(static_cast<CUmemGenericAllocationHandle>(handle_));
}

StatusOr<VmmBuffer*> VmmBuffer::allocate(int device, size_t bytes, bool gpu_direct_rdma) {
  const Driver& d = driver();
  MK_RETURN_IF_ERROR(d.status);
  CUmemAllocationProp prop = prop_for(device, gpu_direct_rdma);
  size_t gran = 0;
  MK_RETURN_IF_ERROR(cu("cuMemGetAllocationGranularity",
                        d.granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)));
  const size_t size = (bytes + gran - 1) / gran * gran;
  auto* b = new VmmBuffer();
  b->size_ = size;
  CUmemGenericAllocationHandle h = 0;
  if (Status s = cu("cuMemCreate", d.create(&h, size, &prop, 0)); !s.ok()) {
    delete b;
    return s;
  }
  b->handle_ = h;
  if (Status s = map_handle(b->handle_, size, device, &b->ptr_); !s.ok()) {
    delete b;
    return s;
  }
  b->mapped_ = true;
  return b;
}

StatusOr<VmmBuffer*> VmmBuffer::import(int fd, int device, size_t bytes) {
  const Driver& d = driver();
  MK_RETURN_IF_ERROR(d.status);
  auto* b = new VmmBuffer();
  b->size_ = bytes;
  CUmemGenericAllocationHandle h = 0;
  if (Status s = cu("cuMemImportFromShareableHandle",
                    d.import_handle(&h, reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
                                    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
      !s.ok()) {
    delete b;
    return s;
  }
  b->handle_ = h;
  if (Status s = map_handle(b->handle_, bytes, device, &b->ptr_); !s.ok()) {
    delete b;
    return s;
  }
  b->mapped_ = true;
  return b;
}

StatusOr<int> VmmBuffer::export_fd() const {
  const Driver& d = driver();
  MK_RETURN_IF_ERROR(d.status);
  int fd = -1;
  MK_RETURN_IF_ERROR(cu("cuMemExportToShareableHandle",
                        d.export_handle(&fd, static_cast<CUmemGenericAllocationHandle>(handle_),
                                        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)));
  return fd;
}

StatusOr<int> VmmBuffer::export_dmabuf() const {
  const Driver& d = driver();
  MK_RETURN_IF_ERROR(d.status);
  if (d.range_handle == nullptr)
    return Status(StatusCode::kFailedPrecondition, "cuMemGetHandleForAddressRange: not offered by this CUDA driver");
  int fd = -1;
  MK_RETURN_IF_ERROR(cu("cuMemGetHandleForAddressRange(dmabuf)",
                        d.range_handle(&fd, ptr_, size_, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0)));
  return fd;
}

Status VmmBuffer::dmabuf_supported(int device) {
  const Driver& d = driver();
  MK_RETURN_IF_ERROR(d.status);
  if (d.range_handle == nullptr)
    return Status(StatusCode::kFailedPrecondition,
                  "the CUDA driver offers no cuMemGetHandleForAddressRange (dmabuf export)");
  CUdevice dev = 0;
  MK_RETURN_IF_ERROR(cu("cuDeviceGet", d.device_get(&dev, device)));
  int dmabuf = 0, rdma_vmm = 0;
  MK_RETURN_IF_ERROR(cu("cuDeviceGetAttribute(DMA_BUF_SUPPORTED)",
                        d.attribute(&dmabuf, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, dev)));
  MK_RETURN_IF_ERROR(cu("cuDeviceGetAttribute(GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED)",
                        d.attribute(&rdma_vmm, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, dev)));
  if (dmabuf == 0)
    return Status(StatusCode::kFailedPrecondition,
                  "CUDA device " + std::to_string(device) +
                      " cannot export dmabuf (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED is 0: the open kernel "
                      "modules and Linux 5.12 or newer are needed)");
  if (rdma_vmm == 0)
    return Status(StatusCode::kFailedPrecondition,
                  "CUDA device " + std::to_string(device) +
                      " has no GPUDirect RDMA for VMM allocations "
                      "(CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED is 0)");
  return Status::Ok();
}

}  // namespace mkernel::rt
