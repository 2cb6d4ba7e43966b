#include "mkernel/runtime/runtime.h"

#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <mutex>

#include <cstdlib>
#include <cstring>

#include "mkernel/protocol/session_client.h"
#include "vmm.h"

namespace mkernel::rt {

namespace mp = mkernel::protocol;
using namespace std::chrono_literals;

// launch.cu
Status enqueue_begin_launch(unsigned long long* counter, cudaStream_t stream);

namespace {

constexpr const char* kIdPrefix = "mk1;";

Status cuda_status(const char* what, cudaError_t err) {
  return Status(StatusCode::kDeviceError, std::string(what) + ": " + cudaGetErrorString(err));
}

std::string hex(const uint8_t* p, size_t n) {
  static const char* d = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    out += d[p[i] >> 4];
    out += d[p[i] & 15];
  }
  return out;
}

StatusOr<std::string> random_hex(size_t bytes) {
  std::vector<uint8_t> buf(bytes);
  size_t got = 0;
  while (got < bytes) {
    const ssize_t n = ::getrandom(buf.data() + got, bytes - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno_status("getrandom", errno);
    }
    got += static_cast<size_t>(n);
  }
  return hex(buf.data(), bytes);
}

struct ParsedId {
  std::string root, communicator, token;
};

StatusOr<ParsedId> parse_id(const UniqueId& id) {
  const std::string text(id.bytes.data(), strnlen(id.bytes.data(), id.bytes.size()));
  if (text.rfind(kIdPrefix, 0) != 0)
    return Status(StatusCode::kInvalidArgument, "unique id: does not start with \"mk1;\"; expected one made by "
                                                "get_unique_id (or to_string of one)");
  const size_t a = text.find(';', 4), b = a == std::string::npos ? a : text.find(';', a + 1);
  if (b == std::string::npos)
    return Status(StatusCode::kInvalidArgument, "unique id: expected \"mk1;ROOT;COMMUNICATOR;TOKEN\"");
  ParsedId p{text.substr(4, a - 4), text.substr(a + 1, b - a - 1), text.substr(b + 1)};
  if (p.communicator.empty() || p.token.size() < 16)
    return Status(StatusCode::kInvalidArgument, "unique id: empty communicator or a token under 16 bytes");
  return p;
}

UniqueId make_id(const std::string& root, const std::string& comm, const std::string& token) {
  UniqueId id;
  const std::string text = kIdPrefix + root + ";" + comm + ";" + token;
  std::memcpy(id.bytes.data(), text.data(), std::min(text.size(), id.bytes.size() - 1));
  return id;
}

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : fallback;
}

StatusOr<uint32_t> env_uint(const char* name, bool required, uint32_t fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') {
    if (required) return Status(StatusCode::kInvalidArgument, std::string(name) + ": not set; expected a number");
    return fallback;
  }
  char* end = nullptr;
  const unsigned long x = std::strtoul(v, &end, 10);
  if (end == v || *end != '\0' || x > 0xFFFFFFFFul)
    return Status(StatusCode::kInvalidArgument,
                  std::string(name) + ": \"" + v + "\" is not a number; expected a non-negative integer");
  return static_cast<uint32_t>(x);
}

}  // namespace

std::string to_string(const UniqueId& id) {
  return std::string(id.bytes.data(), strnlen(id.bytes.data(), id.bytes.size()));
}

StatusOr<UniqueId> unique_id_from_string(const std::string& text) {
  UniqueId id;
  if (text.size() >= id.bytes.size())
    return Status(StatusCode::kInvalidArgument, "unique id: " + std::to_string(text.size()) +
                                                    " bytes; expected fewer than " + std::to_string(id.bytes.size()));
  std::memcpy(id.bytes.data(), text.data(), text.size());
  MK_RETURN_IF_ERROR(parse_id(id).status());
  return id;
}

const char* staging_name(Staging s) {
  switch (s) {
    case Staging::kHostPinned: return "host-pinned";
    case Staging::kGpuMemory: return "gpu-memory";
  }
  return "?";
}

StatusOr<GpuMemory> gpu_memory_from_string(const std::string& text) {
  if (text == "auto") return GpuMemory::kAuto;
  if (text == "require") return GpuMemory::kRequire;
  if (text == "off") return GpuMemory::kOff;
  return Status(StatusCode::kInvalidArgument,
                "gpu_memory: \"" + text + "\"; expected auto, require or off");
}

StatusOr<UniqueId> get_unique_id(const Options& options_in) {
  const std::string socket = env_or("MKERNEL_SOCKET", options_in.socket_path);
  MK_ASSIGN_OR_RETURN(std::string comm, random_hex(12));
  MK_ASSIGN_OR_RETURN(std::string token, random_hex(32));
  // A short session tells us the daemon's peer address, the root the other ranks dial.
  mp::SessionClient::Options o;
  o.socket_path = socket;
  o.client_name = options_in.client_name + " (unique id)";
  o.gpu = options_in.proxy >= 0 ? options_in.proxy : 0;
  o.communicator = "uid-" + comm;
  o.timeout = options_in.timeout;
  MK_ASSIGN_OR_RETURN(auto client, mp::SessionClient::connect(o));
  const std::string root = client->peer_address();
  client->close();
  if (root.find(';') != std::string::npos)
    return Status(StatusCode::kInvalidArgument, "peer address \"" + root + "\" contains ';'");
  return make_id(root, "mk-" + comm, token);
}

// ---- Communicator -----------------------------------------------------------------------------

struct Communicator::Impl {
  std::unique_ptr<mp::SessionClient> client;
  mp::ClientRing* ring = nullptr;
  std::vector<mp::ClientRegion*> regions;
  mp::ClientFlags* flags = nullptr;
  std::vector<void*> registered;  // host ranges registered with CUDA
  std::vector<std::unique_ptr<VmmBuffer>> nvl;  // own NVLink buffer first, then peers' mappings
  std::vector<std::unique_ptr<VmmBuffer>> gpu_buffers;  // Staging::kGpuMemory buffers
  mp::RingDeviceState* ring_state = nullptr;
  unsigned long long* launch_counter = nullptr;
  unsigned long long* fused_state = nullptr;
  uint32_t* agreement_scratch = nullptr;
  uint32_t* agreement_host = nullptr;  // pinned
  uint8_t** nvl_ptrs = nullptr;  // device array: rank r's NVLink buffer as mapped here
  DeviceStatus* status_host = nullptr;
  int cuda_device = 0;
  std::atomic<bool> daemon_gone{false};
  mutable std::mutex mu;
  Status monitor_status;  // guarded by mu

  ~Impl() {
    if (client) client->close();
    if (!nvl.empty() || !gpu_buffers.empty()) (void)cudaDeviceSynchronize();
    nvl.clear();
    gpu_buffers.clear();  // the daemon dropped its dmabuf descriptors with the session
    for (void* p : registered) (void)cudaHostUnregister(p);
    if (ring_state) (void)cudaFree(ring_state);
    if (launch_counter) (void)cudaFree(launch_counter);
    if (fused_state) (void)cudaFree(fused_state);
    if (agreement_scratch) (void)cudaFree(agreement_scratch);
    if (agreement_host) (void)cudaFreeHost(agreement_host);
    if (nvl_ptrs) (void)cudaFree(nvl_ptrs);
    if (status_host) (void)cudaFreeHost(status_host);
  }

  StatusOr<void*> map_for_gpu(void* host, size_t bytes) {
    cudaError_t e = cudaHostRegister(host, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable);
    if (e != cudaSuccess) return cuda_status("cudaHostRegister of a daemon segment", e);
    registered.push_back(host);
    void* dev = nullptr;
    e = cudaHostGetDevicePointer(&dev, host, 0);
    if (e != cudaSuccess) return cuda_status("cudaHostGetDevicePointer", e);
    return dev;
  }
};

Communicator::~Communicator() {
  op_cache_.clear();  // plans first: they free device memory of their own
  stop_.store(true);
  if (monitor_.joinable()) monitor_.join();
  impl_.reset();
}

StatusOr<std::unique_ptr<Communicator>> Communicator::create(uint32_t rank, uint32_t size, const UniqueId& id,
                                                             const std::vector<uint64_t>& buffer_bytes,
                                                             const Options& options) {
  std::unique_ptr<Communicator> c(new Communicator());
  MK_RETURN_IF_ERROR(c->setup(rank, size, id, buffer_bytes, options));
  return c;
}

StatusOr<std::unique_ptr<Communicator>> Communicator::create_from_env(const std::vector<uint64_t>& buffer_bytes,
                                                                      Options options) {
  MK_ASSIGN_OR_RETURN(uint32_t rank, env_uint("RANK", true, 0));
  MK_ASSIGN_OR_RETURN(uint32_t size, env_uint("WORLD_SIZE", true, 1));
  MK_ASSIGN_OR_RETURN(uint32_t local_rank, env_uint("LOCAL_RANK", false, 0));
  MK_ASSIGN_OR_RETURN(uint32_t peer_port, env_uint("MKERNEL_PEER_PORT", false, 7100));
  const std::string addr = env_or("MASTER_ADDR", "");
  const std::string port = env_or("MASTER_PORT", "");
  if (addr.empty()) return Status(StatusCode::kInvalidArgument, "MASTER_ADDR: not set; expected rank 0's host");
  if (port.empty()) return Status(StatusCode::kInvalidArgument, "MASTER_PORT: not set; expected a port number");
  const std::string token = env_or("MKERNEL_TOKEN", "");
  if (token.size() < 16 || token.size() > 256)
    return Status(StatusCode::kInvalidArgument,
                  "MKERNEL_TOKEN: " + std::to_string(token.size()) +
                      " bytes; expected the communicator's secret, 16..256 bytes, the same on every rank");
  if (peer_port == 0 || peer_port > 65535)
    return Status(StatusCode::kInvalidArgument,
                  "MKERNEL_PEER_PORT: " + std::to_string(peer_port) + "; expected 1..65535");
  if (options.cuda_device < 0) options.cuda_device = static_cast<int>(local_rank);
  const bool v6 = addr.find(':') != std::string::npos;
  const std::string root = (v6 ? "[" + addr + "]" : addr) + ":" + std::to_string(peer_port);
  return create(rank, size, make_id(root, "env-" + addr + "-" + port, token), buffer_bytes, options);
}

Status Communicator::setup(uint32_t rank, uint32_t size, const UniqueId& id, const std::vector<uint64_t>& bufs,
                           const Options& options) {
  if (size == 0 || rank >= size)
    return Status(StatusCode::kInvalidArgument,
                  "rank: " + std::to_string(rank) + " of size " + std::to_string(size) + "; expected rank < size");
  const size_t max_user_buffers = kMaxBuffers - (options.network_workspace_bytes > 0 ? 1 : 0);
  if (bufs.empty() || bufs.size() > max_user_buffers)
    return Status(StatusCode::kInvalidArgument,
                  "buffer_bytes: " + std::to_string(bufs.size()) + " buffers; expected 1.." +
                      std::to_string(max_user_buffers) +
                      (options.network_workspace_bytes > 0 ? " (one is kept for network_workspace_bytes)" : ""));
  for (size_t i = 0; i < bufs.size(); ++i)
    if (bufs[i] == 0)
      return Status(StatusCode::kInvalidArgument, "buffer_bytes[" + std::to_string(i) + "]: 0; expected > 0");
  if (options.num_flags == 0)
    return Status(StatusCode::kInvalidArgument, "num_flags: 0; expected at least 1");
  MK_ASSIGN_OR_RETURN(ParsedId pid, parse_id(id));
  rank_ = rank;
  size_ = size;
  rendezvous_timeout_ = options.rendezvous_timeout;
  impl_ = std::make_unique<Impl>();
  Impl& m = *impl_;

  if (options.cuda_device >= 0) {
    if (const cudaError_t e = cudaSetDevice(options.cuda_device); e != cudaSuccess)
      return cuda_status(("cudaSetDevice(" + std::to_string(options.cuda_device) + ")").c_str(), e);
  }
  if (const cudaError_t e = cudaGetDevice(&m.cuda_device); e != cudaSuccess) return cuda_status("cudaGetDevice", e);

  mp::SessionClient::Options o;
  o.socket_path = env_or("MKERNEL_SOCKET", options.socket_path);
  o.client_name = options.client_name;
  o.gpu = options.proxy >= 0 ? options.proxy : m.cuda_device;
  o.communicator = pid.communicator;
  o.rank = rank;
  o.world_size = size;
  o.timeout = options.timeout;
  MK_ASSIGN_OR_RETURN(m.client, mp::SessionClient::connect(o));
  MK_ASSIGN_OR_RETURN(m.ring, m.client->create_ring(options.ring_capacity_log2));
  GpuMemory mode = options.gpu_memory;
  if (const char* v = std::getenv("MKERNEL_GPU_MEMORY"); v != nullptr && *v != '\0') {
    auto parsed = gpu_memory_from_string(v);
    if (!parsed.ok()) return parsed.status().with_context("MKERNEL_GPU_MEMORY");
    mode = parsed.value();
  }
  std::vector<uint64_t> all_bufs = bufs;
  if (options.network_workspace_bytes > 0) {
    network_workspace_ = static_cast<uint32_t>(bufs.size());
    all_bufs.push_back(options.network_workspace_bytes);
  }
  MK_RETURN_IF_ERROR(setup_buffers(all_bufs, mode));
  if (uint64_t{options.num_flags} + options.fused_flags > 0xFFFFFFFFull)
    return Status(StatusCode::kInvalidArgument, "num_flags + fused_flags: over 2^32 - 1");
  MK_ASSIGN_OR_RETURN(m.flags, m.client->create_flags(options.num_flags + options.fused_flags));

  // Map everything for the GPU.
  MK_ASSIGN_OR_RETURN(void* ring_dev, m.map_for_gpu(m.ring->mapping.data(), m.ring->mapping.size()));
  device_.ring.header = static_cast<mp::RingHeader*>(ring_dev);
  device_.ring.slots = reinterpret_cast<mp::CommandRecord*>(static_cast<uint8_t*>(ring_dev) + mp::kRingSlotsOffset);
  device_.ring.capacity_log2 = m.ring->view.capacity_log2;
  device_.ring.expected_epoch = m.client->epoch();
  device_.ring.timeout_ns = options.device_wait_timeout_ns;
  for (size_t i = 0; i < m.regions.size(); ++i) {
    if (m.regions[i]->gpu()) {
      device_.buffers[i] = reinterpret_cast<uint8_t*>(static_cast<uintptr_t>(m.regions[i]->gpu_address));
    } else {
      MK_ASSIGN_OR_RETURN(void* dev, m.map_for_gpu(m.regions[i]->data(), m.regions[i]->size()));
      device_.buffers[i] = static_cast<uint8_t*>(dev);
    }
    device_.buffer_bytes[i] = all_bufs[i];
  }
  device_.num_buffers = static_cast<uint32_t>(all_bufs.size());
  device_.network_workspace = network_workspace_;
  MK_ASSIGN_OR_RETURN(void* flags_dev, m.map_for_gpu(m.flags->mapping.data(), m.flags->mapping.size()));
  device_.flags = static_cast<uint64_t*>(flags_dev);
  device_.num_flags = options.num_flags;
  device_.num_fused_flags = options.fused_flags;
  if (cudaError_t e = cudaMalloc(&m.ring_state, sizeof(mp::RingDeviceState)); e != cudaSuccess)
    return cuda_status("cudaMalloc (ring state)", e);
  if (cudaError_t e = cudaMalloc(&m.launch_counter, sizeof(unsigned long long)); e != cudaSuccess)
    return cuda_status("cudaMalloc (launch counter)", e);
  if (cudaError_t e = cudaMemset(m.ring_state, 0, sizeof(mp::RingDeviceState)); e != cudaSuccess)
    return cuda_status("cudaMemset", e);
  if (cudaError_t e = cudaMemset(m.launch_counter, 0, sizeof(unsigned long long)); e != cudaSuccess)
    return cuda_status("cudaMemset", e);
  if (cudaError_t e = cudaMalloc(&m.fused_state, kernels::kFusedStateWords * sizeof(unsigned long long));
      e != cudaSuccess)
    return cuda_status("cudaMalloc (fused-op state)", e);
  if (cudaError_t e = cudaMemset(m.fused_state, 0, kernels::kFusedStateWords * sizeof(unsigned long long));
      e != cudaSuccess)
    return cuda_status("cudaMemset", e);
  if (cudaError_t e = cudaMalloc(&m.agreement_scratch, agreement_scratch_words(size) * sizeof(uint32_t));
      e != cudaSuccess)
    return cuda_status("cudaMalloc (agreement scratch)", e);
  agreement_scratch_ = m.agreement_scratch;
  if (cudaError_t e = cudaHostAlloc(&m.agreement_host, agreement_scratch_words(size) * sizeof(uint32_t),
                                    cudaHostAllocDefault);
      e != cudaSuccess)
    return cuda_status("cudaHostAlloc (agreement scratch)", e);
  agreement_host_ = m.agreement_host;
  if (cudaError_t e = cudaHostAlloc(&m.status_host, sizeof(DeviceStatus), cudaHostAllocMapped | cudaHostAllocPortable);
      e != cudaSuccess)
    return cuda_status("cudaHostAlloc (status word)", e);
  std::memset(m.status_host, 0, sizeof(DeviceStatus));
  void* status_dev = nullptr;
  if (cudaError_t e = cudaHostGetDevicePointer(&status_dev, m.status_host, 0); e != cudaSuccess)
    return cuda_status("cudaHostGetDevicePointer (status word)", e);
  device_.ring.state = m.ring_state;
  device_.launch_counter = m.launch_counter;
  device_.fused_state = m.fused_state;
  device_.status = static_cast<DeviceStatus*>(status_dev);
  device_.rank = rank;
  device_.world_size = size;
  device_.wait_timeout_ns = options.device_wait_timeout_ns;
  if (cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess) return cuda_status("cudaDeviceSynchronize", e);

  if (options.nvlink_bytes > 0) MK_RETURN_IF_ERROR(setup_nvlink(options));

  // Join the other ranks (through the daemons).
  mp::ConnectOptions co;
  co.root = pid.root;
  co.token = pid.token;
  co.timeout = options.rendezvous_timeout;
  co.network_for_local = options.network_for_local;
  MK_ASSIGN_OR_RETURN(mp::ConnectInfo info, m.client->connect_communicator(co));
  transport_ = info.transport;
  if (staging_ == Staging::kGpuMemory) staging_reason_ = "GPU memory registered through dmabuf by " + transport_;
  network_.assign(size, false);
  std::vector<std::string> node_names(size);
  for (const mp::RankRoute& r : info.ranks)
    if (r.rank < size) {
      network_[r.rank] = r.network;
      node_names[r.rank] = r.node;
    }
  // Nodes numbered in order of their lowest rank; a rank the daemon did not name shares rank
  // 0's node only if its name is equally empty.
  node_of_.assign(size, 0);
  std::vector<std::string> seen;
  for (uint32_t r = 0; r < size; ++r) {
    auto it = std::find(seen.begin(), seen.end(), node_names[r]);
    node_of_[r] = static_cast<uint32_t>(it - seen.begin());
    if (it == seen.end()) seen.push_back(node_names[r]);
  }
  num_nodes_ = static_cast<uint32_t>(seen.size());
  if (options.nvlink_bytes > 0) MK_RETURN_IF_ERROR(map_nvlink_peers(options));
  monitor_ = std::thread([this] { monitor(); });
  return Status::Ok();
}

namespace {
constexpr const char* kNvlKey = "nvlink-buffer";
}

Status Communicator::setup_buffers(const std::vector<uint64_t>& bufs, GpuMemory mode) {
  Impl& m = *impl_;
  // GPU memory when the daemon's transport registers it and this GPU exports it (note 2).
  std::string why_not;
  if (mode == GpuMemory::kOff) {
    why_not = "gpu_memory is off";
  } else if (!m.client->gpu_memory()) {
    why_not = "mkerneld: " + m.client->gpu_memory_reason();
  } else if (const Status s = VmmBuffer::dmabuf_supported(m.cuda_device); !s.ok()) {
    why_not = s.message();
  }
  if (!why_not.empty()) {
    if (mode == GpuMemory::kRequire)
      return Status(StatusCode::kFailedPrecondition,
                    "gpu_memory: require, but buffers cannot be GPU memory here: " + why_not);
    staging_ = Staging::kHostPinned;
    staging_reason_ = why_not;
    for (uint64_t b : bufs) {
      MK_ASSIGN_OR_RETURN(mp::ClientRegion * r, m.client->create_region(b, /*remote_writable=*/true));
      m.regions.push_back(r);
    }
    return Status::Ok();
  }
  staging_ = Staging::kGpuMemory;
  for (size_t i = 0; i < bufs.size(); ++i) {
    MK_ASSIGN_OR_RETURN(VmmBuffer * raw, VmmBuffer::allocate(m.cuda_device, bufs[i], /*gpu_direct_rdma=*/true));
    m.gpu_buffers.emplace_back(raw);
    if (cudaError_t e = cudaMemset(raw->ptr(), 0, raw->size()); e != cudaSuccess) return cuda_status("cudaMemset", e);
    MK_ASSIGN_OR_RETURN(int fd, raw->export_dmabuf());
    mp::GpuRegionSpec spec;
    spec.bytes = bufs[i];
    spec.remote_writable = true;
    spec.dmabuf_fd = fd;
    spec.dmabuf_offset = 0;
    spec.gpu_address = reinterpret_cast<uintptr_t>(raw->ptr());
    spec.cuda_device = m.cuda_device;
    auto r = m.client->import_region(spec);
    ::close(fd);  // the daemon holds its own copy
    if (!r.ok()) return r.status().with_context("buffer " + std::to_string(i) + " in GPU memory");
    m.regions.push_back(r.value());
  }
  if (cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess) return cuda_status("cudaDeviceSynchronize", e);
  return Status::Ok();
}

Status Communicator::setup_nvlink(const Options& options) {
  Impl& m = *impl_;
  const kernels::NvlLayout layout{options.nvlink_bytes, options.nvlink_flags, options.fused_flags};
  MK_ASSIGN_OR_RETURN(VmmBuffer * raw, VmmBuffer::allocate(m.cuda_device, layout.total_bytes()));
  m.nvl.emplace_back(raw);
  if (cudaError_t e = cudaMemset(raw->ptr(), 0, raw->size()); e != cudaSuccess) return cuda_status("cudaMemset", e);
  if (cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess) return cuda_status("cudaDeviceSynchronize", e);
  MK_ASSIGN_OR_RETURN(int fd, raw->export_fd());
  const Status shared = m.client->share_handle(kNvlKey, fd);
  ::close(fd);
  MK_RETURN_IF_ERROR(shared.with_context("sharing the NVLink buffer"));
  device_.nvl_bytes = layout.data_bytes;
  device_.nvl_num_flags = layout.user_flags;
  device_.nvl_fused_flags = layout.fused_flags;
  return Status::Ok();
}

Status Communicator::map_nvlink_peers(const Options& options) {
  // Every rank shared its buffer before the rendezvous, so after it each one is there.
  Impl& m = *impl_;
  const size_t size = m.nvl.front()->size();
  std::vector<uint8_t*> ptrs(size_, nullptr);
  ptrs[rank_] = static_cast<uint8_t*>(m.nvl.front()->ptr());
  for (uint32_t r = 0; r < size_; ++r) {
    if (r == rank_ || network_[r]) continue;
    MK_ASSIGN_OR_RETURN(mp::UniqueFd fd, m.client->fetch_handle(r, kNvlKey));
    auto imported = VmmBuffer::import(fd.get(), m.cuda_device, size);
    if (!imported.ok())
      return imported.status().with_context("mapping rank " + std::to_string(r) +
                                            "'s NVLink buffer (is its GPU reachable over NVLink from GPU " +
                                            std::to_string(m.cuda_device) + "?)");
    m.nvl.emplace_back(imported.value());
    ptrs[r] = static_cast<uint8_t*>(imported.value()->ptr());
  }
  if (cudaError_t e = cudaMalloc(&m.nvl_ptrs, size_ * sizeof(uint8_t*)); e != cudaSuccess)
    return cuda_status("cudaMalloc (NVLink peer table)", e);
  if (cudaError_t e = cudaMemcpy(m.nvl_ptrs, ptrs.data(), size_ * sizeof(uint8_t*), cudaMemcpyHostToDevice);
      e != cudaSuccess)
    return cuda_status("cudaMemcpy (NVLink peer table)", e);
  device_.nvl = m.nvl_ptrs;
  nvl_ptrs_.assign(ptrs.begin(), ptrs.end());
  (void)options;
  return Status::Ok();
}

void Communicator::monitor() {
  Impl& m = *impl_;
  while (!stop_.load(std::memory_order_acquire)) {
    const Status s = m.client->check_alive(100ms);
    if (s.ok()) continue;
    {
      std::lock_guard<std::mutex> lock(m.mu);
      m.monitor_status = s;
    }
    // A daemon that died cannot mark the ring: do it here so GPU waits end now.
    uint32_t* err = &m.ring->view.header->error;
    uint32_t expected = 0;
    __atomic_compare_exchange_n(err, &expected, mp::kRingErrDaemonGone, false, __ATOMIC_RELEASE, __ATOMIC_RELAXED);
    m.daemon_gone.store(true, std::memory_order_release);
    return;
  }
}

Status Communicator::begin_launch(cudaStream_t stream) {
  MK_RETURN_IF_ERROR(enqueue_begin_launch(impl_->launch_counter, stream));
  ++launches_;
  return Status::Ok();
}

void* Communicator::host_buffer(uint32_t i) const {
  return i < impl_->regions.size() ? impl_->regions[i]->data() : nullptr;
}

void* Communicator::device_buffer(uint32_t i) const { return i < kMaxBuffers ? device_.buffers[i] : nullptr; }

uint64_t Communicator::buffer_bytes(uint32_t i) const { return i < kMaxBuffers ? device_.buffer_bytes[i] : 0; }

const uint64_t* Communicator::host_flags() const { return impl_->flags->flags(); }

int Communicator::cuda_device() const { return impl_->cuda_device; }

kernels::WaitContext Communicator::wait_context() const {
  kernels::WaitContext w;
  w.status = device_.status;
  w.ring_error = &device_.ring.header->error;
  if (void* own = nvlink_buffer(rank_); own != nullptr) {
    const kernels::NvlLayout layout{device_.nvl_bytes, device_.nvl_num_flags, device_.nvl_fused_flags};
    w.peer_abort = reinterpret_cast<const uint64_t*>(static_cast<uint8_t*>(own) + layout.system_offset()) +
                   kernels::kNvlWordPeerAbort;
  }
  w.launch_counter = device_.launch_counter;
  w.timeout_ns = device_.wait_timeout_ns;
  w.rank = rank_;
  if (device_.fused_state != nullptr) {  // wait.cuh note 8
    w.host_gate = device_.fused_state + kernels::kWaitHostDue;
    w.failed = device_.fused_state + kernels::kWaitFailedMark;
  }
  return w;
}

Status Communicator::check() const {
  const Impl& m = *impl_;
  DeviceStatus st{};
  st.code = __atomic_load_n(&m.status_host->code, __ATOMIC_ACQUIRE);
  st.detail = __atomic_load_n(&m.status_host->detail, __ATOMIC_ACQUIRE);
  st.launch = __atomic_load_n(&m.status_host->launch, __ATOMIC_ACQUIRE);
  st.where = __atomic_load_n(&m.status_host->where, __ATOMIC_ACQUIRE);
  st.rank = __atomic_load_n(&m.status_host->rank, __ATOMIC_ACQUIRE);
  if (st.code != kDeviceOk) {
    const StatusCode code = st.code == kDeviceWaitTimeout || st.code == kernels::kDevicePipelineTimeout
                                ? StatusCode::kDeadlineExceeded
                            : st.code == kDeviceBadArgument || st.code == kernels::kDeviceMoeRouting
                                ? StatusCode::kInvalidArgument
                                : StatusCode::kUnavailable;
    Status s(code, kernels::describe_device_status(st, device_.wait_timeout_ns));
    std::lock_guard<std::mutex> lock(m.mu);
    if (!m.monitor_status.ok()) return s.with_context(m.monitor_status.message());
    return s;
  }
  std::lock_guard<std::mutex> lock(m.mu);
  if (!m.monitor_status.ok()) return m.monitor_status;
  const uint32_t ring_err = __atomic_load_n(&m.ring->view.header->error, __ATOMIC_ACQUIRE);
  if (ring_err != 0)
    return Status(StatusCode::kUnavailable, std::string("rank ") + std::to_string(rank_) + ": " +
                                                mp::ring_error_name(ring_err) + " (ring error " +
                                                std::to_string(ring_err) + ")");
  return Status::Ok();
}

}  // namespace mkernel::rt
