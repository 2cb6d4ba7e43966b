// GPU memory for the NIC on a real GPU: a GPUDirect-RDMA-capable VMM allocation exported as a
// dmabuf, handed to mkerneld, which reads the descriptor's fdinfo (exporter, size) and checks
// it; the per-transport decision of libmkernel (auto, require, off) with the reasons it gives.
// No transport here registers GPU memory (libfabric's shm never does, and no RDMA NIC exists),
// so the daemon refuses the real dmabuf naming its transport, and buffers are host-staged.
#include <cuda_runtime.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "mkernel/protocol/session_client.h"
#include "mkernel/runtime/runtime.h"
#include "runtime_gpu_util.h"
#include "vmm.h"

namespace rt = mkernel::rt;
namespace mp = mkernel::protocol;

namespace {

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::string fdinfo(int fd) {
  std::ifstream in("/proc/self/fdinfo/" + std::to_string(fd));
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

int main() {
  mkt::require_gpus_or_skip("runtime_dmabuf_gpu_test", 1);
  if (cudaSetDevice(0) != cudaSuccess) return 1;

  // 1. The GPU side: export a dmabuf of GPUDirect-RDMA-capable VMM memory.
  const mkernel::Status support = rt::VmmBuffer::dmabuf_supported(0);
  std::printf("GPU 0 dmabuf export: %s\n", support.ok() ? "supported" : support.to_string().c_str());
  if (!support.ok()) {
    std::printf("SKIPPED runtime_dmabuf_gpu_test: %s\n", support.to_string().c_str());
    return 77;
  }
  constexpr size_t kBytes = size_t{4} << 20;
  auto buf = rt::VmmBuffer::allocate(0, kBytes, /*gpu_direct_rdma=*/true);
  MKT_CHECK(buf.ok(), "allocate: %s", buf.status().to_string().c_str());
  if (!buf.ok()) return 1;
  std::unique_ptr<rt::VmmBuffer> gpu(buf.value());
  auto fd = gpu->export_dmabuf();
  MKT_CHECK(fd.ok(), "export_dmabuf: %s", fd.status().to_string().c_str());
  if (!fd.ok()) return 1;
  const std::string info = fdinfo(fd.value());
  std::printf("dmabuf fdinfo:\n%s", info.c_str());
  MKT_CHECK(has(info, "exp_name:"), "a CUDA dmabuf's fdinfo names its exporter");

  // 2. The daemon: checks the real descriptor, then refuses it for its transport (shm).
  mkt::Daemon d(mkt::temp_dir("dmabuf"), mkt::daemon_yaml("shm", "0"));
  if (!d.start()) return 1;
  mp::SessionClient::Options so;
  so.socket_path = d.socket();
  so.client_name = "dmabuf-test";
  so.communicator = "dmabuf";
  auto client = mp::SessionClient::connect(so);
  MKT_CHECK(client.ok(), "connect: %s", client.status().to_string().c_str());
  if (!client.ok()) return 1;
  mp::SessionClient& c = *client.value();
  std::printf("hello: gpu_memory %d (%s)\n", c.gpu_memory(), c.gpu_memory_reason().c_str());
  MKT_CHECK(!c.gpu_memory(), "shm does not register GPU memory");
  MKT_CHECK(has(c.gpu_memory_reason(), "shm"), "the reason names the transport: %s", c.gpu_memory_reason().c_str());

  mp::GpuRegionSpec spec;
  spec.bytes = kBytes;
  spec.dmabuf_fd = fd.value();
  spec.gpu_address = reinterpret_cast<uintptr_t>(gpu->ptr());
  spec.cuda_device = 0;
  auto refused = c.import_region(spec);
  std::printf("import of the real dmabuf: %s\n", refused.status().to_string().c_str());
  MKT_CHECK(!refused.ok() && refused.status().code() == mkernel::StatusCode::kFailedPrecondition,
        "refused for the transport: %s", refused.status().to_string().c_str());
  MKT_CHECK(has(refused.status().message(), "GPU memory (dmabuf from \""), "the daemon read the exporter: %s",
        refused.status().message().c_str());
  MKT_CHECK(has(refused.status().message(), std::to_string(gpu->size()) + " bytes"),
        "the daemon read the dmabuf's size (%zu): %s", gpu->size(), refused.status().message().c_str());
  spec.bytes = gpu->size() + 4096;  // past the end of the dmabuf
  auto too_big = c.import_region(spec);
  MKT_CHECK(!too_big.ok() && has(too_big.status().message(), "run past the dmabuf"), "too big: %s",
        too_big.status().to_string().c_str());
  spec.bytes = 4096;
  spec.dmabuf_offset = gpu->size();
  auto past = c.import_region(spec);
  MKT_CHECK(!past.ok() && has(past.status().message(), "run past the dmabuf"), "offset past the end: %s",
        past.status().to_string().c_str());
  const int memfd = ::memfd_create("pretend-gpu", MFD_CLOEXEC);
  spec.dmabuf_fd = memfd;
  spec.dmabuf_offset = 0;
  auto wrong_kind = c.import_region(spec);
  MKT_CHECK(!wrong_kind.ok() && has(wrong_kind.status().message(), "is not a dmabuf"), "memfd: %s",
        wrong_kind.status().to_string().c_str());
  ::close(memfd);
  ::close(fd.value());
  MKT_CHECK(c.ping().ok(), "the session carries on after refusals");
  c.close();

  // 3. libmkernel's decision.
  rt::Options o;
  o.socket_path = d.socket();
  o.cuda_device = 0;
  o.network_for_local = true;
  // A fresh communicator for every create.
  auto fresh = [&] {
    auto id = rt::get_unique_id(o);
    MKT_CHECK(id.ok(), "get_unique_id: %s", id.status().to_string().c_str());
    return id.ok() ? id.value() : rt::UniqueId{};
  };
  o.gpu_memory = rt::GpuMemory::kRequire;
  auto required = rt::Communicator::create(0, 1, fresh(), {1 << 20}, o);
  std::printf("gpu_memory require: %s\n", required.status().to_string().c_str());
  MKT_CHECK(!required.ok() && has(required.status().message(), "gpu_memory: require") &&
            has(required.status().message(), "shm"),
        "require fails naming the transport: %s", required.status().to_string().c_str());
  o.gpu_memory = rt::GpuMemory::kAuto;
  {
    auto made = rt::Communicator::create(0, 1, fresh(), {1 << 20}, o);
    MKT_CHECK(made.ok(), "auto: %s", made.status().to_string().c_str());
    if (made.ok()) {
      rt::Communicator& comm = *made.value();
      std::printf("gpu_memory auto: staging %s (%s)\n", rt::staging_name(comm.staging()),
                  comm.staging_reason().c_str());
      MKT_CHECK(comm.staging() == rt::Staging::kHostPinned, "auto falls back to host staging");
      MKT_CHECK(has(comm.staging_reason(), "mkerneld: "), "the reason is the daemon's: %s", comm.staging_reason().c_str());
      MKT_CHECK(comm.host_buffer(0) != nullptr && comm.device_buffer(0) != nullptr, "host-staged buffers have both views");
    }
  }
  o.gpu_memory = rt::GpuMemory::kOff;
  {
    auto made = rt::Communicator::create(0, 1, fresh(), {1 << 20}, o);
    MKT_CHECK(made.ok() && made.value()->staging_reason() == "gpu_memory is off", "off: %s",
          made.ok() ? made.value()->staging_reason().c_str() : made.status().to_string().c_str());
  }
  ::setenv("MKERNEL_GPU_MEMORY", "sometimes", 1);
  auto bad_env = rt::Communicator::create(0, 1, fresh(), {1 << 20}, o);
  MKT_CHECK(!bad_env.ok() && has(bad_env.status().message(), "MKERNEL_GPU_MEMORY") &&
            has(bad_env.status().message(), "expected auto, require or off"),
        "bad MKERNEL_GPU_MEMORY: %s", bad_env.status().to_string().c_str());
  ::setenv("MKERNEL_GPU_MEMORY", "require", 1);
  o.gpu_memory = rt::GpuMemory::kAuto;
  auto env_require = rt::Communicator::create(0, 1, fresh(), {1 << 20}, o);
  MKT_CHECK(!env_require.ok() && has(env_require.status().message(), "gpu_memory: require"),
        "MKERNEL_GPU_MEMORY=require overrides auto: %s", env_require.status().to_string().c_str());
  ::unsetenv("MKERNEL_GPU_MEMORY");

  std::printf("%s runtime_dmabuf_gpu_test (%d failures)\n", mkt::failures == 0 ? "PASS" : "FAIL", mkt::failures);
  return mkt::failures == 0 ? 0 : 1;
}
