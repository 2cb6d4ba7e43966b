// py_communicator.cc: the compiled module's communicator (py_communicator.h).
#include "py_communicator.h"

#include <cuda_runtime.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <utility>

namespace mkernel::python {

namespace {

// Makes `device` current for the scope and gives the caller's back (note 4). A quiet scope
// (for close(), which destructors call) never throws: it leaves the device as it is on failure.
class DeviceScope {
 public:
  explicit DeviceScope(int device, bool quiet = false) {
    if (cudaGetDevice(&saved_) != cudaSuccess) {
      (void)cudaGetLastError();
      saved_ = -1;
    }
    if (device >= 0 && device != saved_) {
      const cudaError_t e = cudaSetDevice(device);
      if (e != cudaSuccess && quiet) {
        (void)cudaGetLastError();
      } else if (e != cudaSuccess) {
        throw_status(Status(StatusCode::kDeviceError,
                            "cudaSetDevice(" + std::to_string(device) + "): " + cudaGetErrorString(e)));
      }
    }
  }
  ~DeviceScope() {
    int now = -1;
    if (saved_ >= 0 && cudaGetDevice(&now) == cudaSuccess && now != saved_) (void)cudaSetDevice(saved_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int saved_ = -1;
};

cudaStream_t as_stream(uintptr_t s) { return reinterpret_cast<cudaStream_t>(s); }

std::string shape_key(uint64_t m, uint64_t n, uint64_t k) {
  return "(m_local=" + std::to_string(m) + ", n_local=" + std::to_string(n) + ", k=" + std::to_string(k) + ")";
}

}  // namespace

void throw_status(const Status& s) {
  throw StatusError{status_code_name(s.code()), s.message(), s.where()};
}

StatusOr<rt::Options> CommOptions::to_options() const {
  rt::Options o;
  if (!socket_path.empty()) o.socket_path = socket_path;
  o.cuda_device = device;
  o.nvlink_bytes = nvlink_bytes;
  o.network_workspace_bytes = network_workspace_bytes;
  o.rendezvous_timeout = std::chrono::milliseconds(rendezvous_timeout_ms);
  o.device_wait_timeout_ns = device_wait_timeout_ms * 1000000ull;
  o.client_name = client_name;
  auto mode = rt::gpu_memory_from_string(gpu_memory);
  if (!mode.ok()) return mode.status();
  o.gpu_memory = mode.value();
  if (rendezvous_timeout_ms == 0)
    return Status(StatusCode::kInvalidArgument, "rendezvous_timeout: 0; expected a positive bound in milliseconds");
  if (device_wait_timeout_ms == 0)
    return Status(StatusCode::kInvalidArgument, "device_wait_timeout: 0; expected a positive bound in milliseconds");
  return o;
}

std::unique_ptr<PyCommunicator> PyCommunicator::create(uint32_t rank, uint32_t size, const std::string& unique_id,
                                                       const CommOptions& options) {
  auto o = options.to_options();
  throw_if_error(o.status());
  auto id = rt::unique_id_from_string(unique_id);
  if (!id.ok()) throw_status(id.status());
  // create() sets the communicator's device itself; the scope gives the caller's back.
  DeviceScope scope(-1);
  auto made = rt::Communicator::create(rank, size, id.value(), options.buffer_bytes, o.value());
  if (!made.ok()) throw_status(made.status());
  std::unique_ptr<PyCommunicator> c(new PyCommunicator());
  c->comm_ = std::move(made.value());
  c->nvlink_bytes_ = options.nvlink_bytes;
  c->network_workspace_bytes_ = options.network_workspace_bytes;
  return c;
}

std::unique_ptr<PyCommunicator> PyCommunicator::create_from_env(const CommOptions& options) {
  auto o = options.to_options();
  throw_if_error(o.status());
  DeviceScope scope(-1);
  auto made = rt::Communicator::create_from_env(options.buffer_bytes, o.value());
  if (!made.ok()) throw_status(made.status());
  std::unique_ptr<PyCommunicator> c(new PyCommunicator());
  c->comm_ = std::move(made.value());
  c->nvlink_bytes_ = options.nvlink_bytes;
  c->network_workspace_bytes_ = options.network_workspace_bytes;
  return c;
}

PyCommunicator::~PyCommunicator() { close(); }

rt::Communicator& PyCommunicator::live(const char* what) {
  if (!comm_)
    throw_status(Status(StatusCode::kFailedPrecondition,
                        std::string(what) + ": the communicator was closed; make a new one"));
  return *comm_;
}

rt::AllGatherGemm& PyCommunicator::plan_locked(uint64_t m_local, uint64_t n_local, uint64_t k, uintptr_t stream) {
  rt::Communicator& comm = live("all_gather_gemm");
  auto it = plans_.find({m_local, n_local, k});
  if (it != plans_.end()) return *it->second;
  // Planning synchronises its stream (the agreement between ranks): not while it is captured.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(as_stream(stream), &capture) != cudaSuccess) {
    (void)cudaGetLastError();
    capture = cudaStreamCaptureStatusNone;
  }
  if (capture != cudaStreamCaptureStatusNone)
    throw_status(Status(StatusCode::kFailedPrecondition,
                        "all_gather_gemm: shape " + shape_key(m_local, n_local, k) +
                            " has no plan yet and the stream is being captured into a CUDA graph; planning is "
                            "collective and synchronises its stream, so run this shape once before the capture "
                            "(a warm-up call) or call Communicator.plan() with it"));
  auto op = rt::AllGatherGemm::create(comm, m_local, n_local, k, rt::AllGatherGemmConfig{}, as_stream(stream));
  if (!op.ok()) throw_status(op.status());
  auto& slot = plans_[{m_local, n_local, k}];
  slot = std::move(op.value());
  return *slot;
}

void PyCommunicator::plan(uint64_t m_local, uint64_t n_local, uint64_t k, uintptr_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  DeviceScope scope(live("plan").cuda_device());
  (void)plan_locked(m_local, n_local, k, stream);
}

bool PyCommunicator::has_plan(uint64_t m_local, uint64_t n_local, uint64_t k) {
  std::lock_guard<std::mutex> lock(mu_);
  return plans_.count({m_local, n_local, k}) != 0;
}

std::string PyCommunicator::describe(uint64_t m_local, uint64_t n_local, uint64_t k) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = plans_.find({m_local, n_local, k});
  if (it == plans_.end())
    throw_status(Status(StatusCode::kNotFound, "describe: no plan for " + shape_key(m_local, n_local, k) +
                                                   "; plan() it or run the op with that shape first"));
  return it->second->describe();
}

void PyCommunicator::all_gather_gemm(const AllGatherGemmArgs& args, uintptr_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  rt::Communicator& comm = live("all_gather_gemm");
  if (args.a.device != comm.cuda_device())
    throw ArgumentError{"a: on CUDA device " + std::to_string(args.a.device) + "; expected the communicator's device " +
                        std::to_string(comm.cuda_device()) + " (rank " + std::to_string(comm.rank()) + ")"};
  const uint64_t world = comm.size();
  if (args.c.rows != world * args.a.rows)
    throw ArgumentError{"out: " + std::to_string(args.c.rows) + " rows; expected world * m_local = " +
                        std::to_string(world) + " * " + std::to_string(args.a.rows)};
  DeviceScope scope(comm.cuda_device());
  // A failure of an earlier launch is raised before anything more is queued behind it.
  throw_if_error(comm.check());
  rt::AllGatherGemm& op = plan_locked(args.a.rows, args.w.rows, args.a.cols, stream);
  throw_if_error(op.launch(args.a.data, args.w.data, args.c.data, args.gathered ? args.gathered->data : nullptr,
                           as_stream(stream)));
}

void PyCommunicator::check() {
  std::lock_guard<std::mutex> lock(mu_);
  throw_if_error(live("check").check());
}

void PyCommunicator::close() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!comm_) return;
  DeviceScope scope(comm_->cuda_device(), /*quiet=*/true);
  plans_.clear();
  comm_.reset();
}

uint32_t PyCommunicator::rank() const { return comm_ ? comm_->rank() : 0; }
uint32_t PyCommunicator::size() const { return comm_ ? comm_->size() : 0; }
int PyCommunicator::device() const { return comm_ ? comm_->cuda_device() : -1; }
uint32_t PyCommunicator::nodes() const { return comm_ ? comm_->num_nodes() : 0; }
std::string PyCommunicator::staging() const { return comm_ ? rt::staging_name(comm_->staging()) : ""; }
std::string PyCommunicator::staging_reason() const { return comm_ ? comm_->staging_reason() : ""; }
std::string PyCommunicator::transport() const { return comm_ ? comm_->transport() : ""; }

std::string get_unique_id(const CommOptions& options) {
  auto o = options.to_options();
  throw_if_error(o.status());
  auto id = rt::get_unique_id(o.value());
  if (!id.ok()) throw_status(id.status());
  return rt::to_string(id.value());
}

}  // namespace mkernel::python
