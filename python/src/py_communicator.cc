// py_communicator.cc: the compiled module's communicator (py_communicator.h).
#include "py_communicator.h"

#include <cuda_runtime.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
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

std::string shape_key(uint64_t m, uint64_t n, uint64_t k, const char* n_name = "n_local",
                      const char* m_name = "m_local") {
  return "(" + std::string(m_name) + "=" + std::to_string(m) + ", " + n_name + "=" + std::to_string(n) +
         ", k=" + std::to_string(k) + ")";
}

// Planning synchronises its stream (the agreement between ranks): not while it is captured.
void refuse_if_capturing(uintptr_t stream, const std::string& what, const std::string& shape, const char* plan_call) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(as_stream(stream), &capture) != cudaSuccess) {
    (void)cudaGetLastError();
    capture = cudaStreamCaptureStatusNone;
  }
  if (capture != cudaStreamCaptureStatusNone)
    throw_status(Status(StatusCode::kFailedPrecondition,
                        what + ": shape " + shape +
                            " has no plan yet and the stream is being captured into a CUDA graph; planning is "
                            "collective and synchronises its stream, so run this shape once before the capture "
                            "(a warm-up call) or call " + plan_call + " with it"));
}

}  // namespace

rt::MoeConfig MoeShape::config() const {
  rt::MoeConfig c;
  c.recv_tokens_per_source = recv_tokens_per_source;
  c.expert_rows_capacity = expert_rows_capacity;
  c.apply_scores = apply_scores;
  c.fused = fused;
  return c;
}

std::string MoeShape::text() const {
  std::string s = "(tokens=" + std::to_string(tokens) + ", hidden=" + std::to_string(hidden) +
                  ", out_hidden=" + std::to_string(out_hidden) + ", experts=" + std::to_string(experts) +
                  ", top_k=" + std::to_string(top_k);
  if (recv_tokens_per_source) s += ", recv_tokens_per_source=" + std::to_string(recv_tokens_per_source);
  if (expert_rows_capacity) s += ", expert_rows_capacity=" + std::to_string(expert_rows_capacity);
  if (!apply_scores) s += ", apply_scores=false";
  if (fused) s += ", fused";
  return s + ")";
}

namespace {

std::string ring_text(const rt::RingAttentionShape& s) {
  static const char* const placements[] = {"non-causal", "causal contiguous", "causal zigzag"};
  const auto p = static_cast<uint32_t>(s.placement);
  return "(batch=" + std::to_string(s.batch) + ", heads_q=" + std::to_string(s.heads_q) +
         ", heads_kv=" + std::to_string(s.heads_kv) + ", s_local=" + std::to_string(s.s_local) +
         ", head_dim=" + std::to_string(s.head_dim) +
         ", layout=" + (s.layout == rt::AttentionLayout::kBSHD ? "bshd" : "bhsd") + ", " +
         (p < 3 ? placements[p] : "placement " + std::to_string(p)) + ", scale=" + std::to_string(s.scale) + ")";
}

std::string on_device_text(const char* name, int device, const rt::Communicator& comm) {
  return std::string(name) + ": on CUDA device " + std::to_string(device) + "; expected the communicator's device " +
         std::to_string(comm.cuda_device()) + " (rank " + std::to_string(comm.rank()) + ")";
}

// The plan of `key` in `plans`, made by make() on first use. Planning is collective and
// synchronises its stream (the ranks' agreement), so a first use while the stream is being
// captured is refused, naming `plan_call` as the way to plan before the capture.
template <class Map, class Make>
auto& cached_plan(Map& plans, const typename Map::key_type& key, uintptr_t stream, const char* op,
                  const std::string& shape, const char* plan_call, Make&& make) {
  auto it = plans.find(key);
  if (it != plans.end()) return *it->second;
  refuse_if_capturing(stream, op, shape, plan_call);
  auto made = make();
  if (!made.ok()) throw_status(made.status());
  auto& slot = plans[key];
  slot = std::move(made.value());
  return *slot;
}

// describe() of an existing plan, or kNotFound naming the shape.
template <class Map>
std::string describe_plan(const Map& plans, const typename Map::key_type& key, const char* what,
                          const std::string& shape) {
  auto it = plans.find(key);
  if (it == plans.end())
    throw_status(Status(StatusCode::kNotFound, std::string(what) + ": no plan for " + shape +
                                                   "; plan it or run the op with that shape first"));
  return it->second->describe();
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
  if (fused_flags != 0) o.fused_flags = fused_flags;
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
  c->fused_flags_ = o.value().fused_flags;
  c->adaptive_split_ = options.adaptive_split;
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
  c->fused_flags_ = o.value().fused_flags;
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
  return cached_plan(plans_, {m_local, n_local, k}, stream, "all_gather_gemm", shape_key(m_local, n_local, k),
                     "Communicator.plan()", [&] {
                       rt::AllGatherGemmConfig config;
                       config.adaptive_split = adaptive_split_;
                       return rt::AllGatherGemm::create(comm, m_local, n_local, k, config, as_stream(stream));
                     });
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
  return describe_plan(plans_, {m_local, n_local, k}, "describe", shape_key(m_local, n_local, k));
}

void PyCommunicator::all_gather_gemm(const AllGatherGemmArgs& args, uintptr_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  rt::Communicator& comm = live("all_gather_gemm");
  if (args.a.device != comm.cuda_device()) throw ArgumentError{on_device_text("a", args.a.device, comm)};
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

rt::GemmReduceScatter& PyCommunicator::rs_plan_locked(uint64_t m_local, uint64_t n, uint64_t k, uintptr_t stream) {
  rt::Communicator& comm = live("gemm_reduce_scatter");
  return cached_plan(rs_plans_, {m_local, n, k}, stream, "gemm_reduce_scatter", shape_key(m_local, n, k, "n"),
                     "Communicator.plan_matmul_reduce_scatter()", [&] {
                       return rt::GemmReduceScatter::create(comm, m_local, n, k, rt::GemmReduceScatterConfig{},
                                                            as_stream(stream));
                     });
}

void PyCommunicator::plan_reduce_scatter(uint64_t m_local, uint64_t n, uint64_t k, uintptr_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  DeviceScope scope(live("plan_reduce_scatter").cuda_device());
  (void)rs_plan_locked(m_local, n, k, stream);
}

bool PyCommunicator::has_reduce_scatter_plan(uint64_t m_local, uint64_t n, uint64_t k) {
  std::lock_guard<std::mutex> lock(mu_);
  return rs_plans_.count({m_local, n, k}) != 0;
}

std::string PyCommunicator::describe_reduce_scatter(uint64_t m_local, uint64_t n, uint64_t k) {
  std::lock_guard<std::mutex> lock(mu_);
  return describe_plan(rs_plans_, {m_local, n, k}, "describe_reduce_scatter", shape_key(m_local, n, k, "n"));
}

void PyCommunicator::gemm_reduce_scatter(const GemmReduceScatterArgs& args, uintptr_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  rt::Communicator& comm = live("gemm_reduce_scatter");
  if (args.a.device != comm.cuda_device()) throw ArgumentError{on_device_text("a", args.a.device, comm)};
  const uint64_t world = comm.size();
  if (args.a.rows % world != 0 || args.c.rows * world != args.a.rows)
    throw ArgumentError{"out: " + std::to_string(args.c.rows) + " rows; expected M / world = " +
                        std::to_string(args.a.rows) + " / " + std::to_string(world)};
  DeviceScope scope(comm.cuda_device());
  throw_if_error(comm.check());
  rt::GemmReduceScatter& op = rs_plan_locked(args.c.rows, args.w.rows, args.a.cols, stream);
  throw_if_error(op.launch(args.a.data, args.w.data, args.c.data, as_stream(stream)));
}

// ---- GEMM+AllReduce -----------------------------------------------------------------------------

rt::GemmAllReduce& PyCommunicator::ar_plan_locked(uint64_t m, uint64_t n, uint64_t k, uintptr_t stream) {
  rt::Communicator& comm = live("gemm_all_reduce");
  return cached_plan(ar_plans_, {m, n, k}, stream, "gemm_all_reduce", shape_key(m, n, k, "n", "m"),
                     "Communicator.plan_matmul_all_reduce()", [&] {
                       return rt::GemmAllReduce::create(comm, m, n, k, rt::GemmReduceScatterConfig{},
                                                        as_stream(stream));
                     });
}

void PyCommunicator::plan_all_reduce(uint64_t m, uint64_t n, uint64_t k, uintptr_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  DeviceScope scope(live("plan_all_reduce").cuda_device());
  (void)ar_plan_locked(m, n, k, stream);
}

bool PyCommunicator::has_all_reduce_plan(uint64_t m, uint64_t n, uint64_t k) {
  std::lock_guard<std::mutex> lock(mu_);
  return ar_plans_.count({m, n, k}) != 0;
}

std::string PyCommunicator::describe_all_reduce(uint64_t m, uint64_t n, uint64_t k) {
  std::lock_guard<std::mutex> lock(mu_);
  return describe_plan(ar_plans_, {m, n, k}, "describe_all_reduce", shape_key(m, n, k, "n", "m"));
}

void PyCommunicator::gemm_all_reduce(const GemmAllReduceArgs& args, uintptr_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  rt::Communicator& comm = live("gemm_all_reduce");
  if (args.a.device != comm.cuda_device()) throw ArgumentError{on_device_text("a", args.a.device, comm)};
  DeviceScope scope(comm.cuda_device());
  throw_if_error(comm.check());
  rt::GemmAllReduce& op = ar_plan_locked(args.a.rows, args.w.rows, args.a.cols, stream);
  throw_if_error(op.launch(args.a.data, args.w.data, args.c.data, as_stream(stream)));
}

// ---- MoE ----------------------------------------------------------------------------------------

rt::MoeDispatchCombine& PyCommunicator::moe_plan_locked(const MoeShape& shape, uintptr_t stream) {
  rt::Communicator& comm = live("moe");
  return cached_plan(moe_plans_, shape.key(), stream, shape.fused ? "moe_forward" : "moe_dispatch", shape.text(),
                     "Communicator.plan_moe()", [&] {
                       rt::MoeConfig config = shape.config();
                       config.adaptive_split = adaptive_split_ && shape.fused;  // only the fused kernel has a split
                       return rt::MoeDispatchCombine::create(comm, shape.tokens, shape.hidden, shape.out_hidden,
                                                             shape.experts, shape.top_k, config, as_stream(stream));
                     });
}

void PyCommunicator::plan_moe(const MoeShape& shape, uintptr_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  DeviceScope scope(live("plan_moe").cuda_device());
  (void)moe_plan_locked(shape, stream);
}

bool PyCommunicator::has_moe_plan(const MoeShape& shape) {
  std::lock_guard<std::mutex> lock(mu_);
  return moe_plans_.count(shape.key()) != 0;
}

std::string PyCommunicator::describe_moe(const MoeShape& shape) {
  std::lock_guard<std::mutex> lock(mu_);
  return describe_plan(moe_plans_, shape.key(), "describe_moe", shape.text());
}

void PyCommunicator::moe_dispatch(const MoeDispatchArgs& args, const MoeShape& shape, uintptr_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  rt::Communicator& comm = live("moe_dispatch");
  if (args.x.device != comm.cuda_device()) throw ArgumentError{on_device_text("x", args.x.device, comm)};
  if (shape.fused)
    throw_status(Status(StatusCode::kInvalidArgument, "moe_dispatch: the shape is marked fused; use moe_forward"));
  DeviceScope scope(comm.cuda_device());
  throw_if_error(comm.check());
  rt::MoeDispatchCombine& op = moe_plan_locked(shape, stream);
  // The plan fixes the rows; Python sizes the outputs with the same rule (mkernel._moe).
  if (args.x_expert.shape[0] != op.rows_capacity())
    throw ArgumentError{"x_expert: " + std::to_string(args.x_expert.shape[0]) + " rows; expected the plan's " +
                        std::to_string(op.rows_capacity()) + " (rows_capacity of " + shape.text() + ")"};
  if (args.expert_offsets.shape[0] != uint64_t{op.experts_per_rank()} + 1)
    throw ArgumentError{"expert_offsets: " + std::to_string(args.expert_offsets.shape[0]) + " entries; expected " +
                        "experts_per_rank + 1 = " + std::to_string(op.experts_per_rank() + 1)};
  auto ptr = [](const std::optional<Array>& a) { return a ? a->data : nullptr; };
  moe_dispatched_ = nullptr;  // a new dispatch supersedes one still waiting, whether or not it launches
  throw_if_error(op.dispatch(args.x.data, static_cast<const int32_t*>(args.choices.data),
                             static_cast<const float*>(args.scores.data), args.x_expert.data,
                             static_cast<uint32_t*>(args.expert_offsets.data),
                             static_cast<int32_t*>(ptr(args.row_source)), static_cast<int32_t*>(ptr(args.row_token)),
                             static_cast<float*>(ptr(args.row_score)), as_stream(stream)));
  moe_dispatched_ = &op;
  moe_dispatched_shape_ = shape;
}

void PyCommunicator::moe_combine(const MoeCombineArgs& args, uintptr_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  rt::Communicator& comm = live("moe_combine");
  if (args.y_expert.device != comm.cuda_device())
    throw ArgumentError{on_device_text("y_expert", args.y_expert.device, comm)};
  if (moe_dispatched_ == nullptr)
    throw_status(Status(StatusCode::kFailedPrecondition,
                        "moe_combine: no moe_dispatch on this communicator waits for its combine (none ran, or its "
                        "combine already did); expected moe_dispatch, then moe_combine of the expert outputs in its "
                        "rows"));
  const MoeShape& s = moe_dispatched_shape_;
  const uint64_t rows = moe_dispatched_->rows_capacity();
  if (args.y_expert.shape[0] != rows || args.y_expert.shape[1] != s.out_hidden)
    throw ArgumentError{"y_expert: shape (" + std::to_string(args.y_expert.shape[0]) + ", " +
                        std::to_string(args.y_expert.shape[1]) + "); expected (" + std::to_string(rows) + ", " +
                        std::to_string(s.out_hidden) + "): (rows, out_hidden) of the last moe_dispatch on this " +
                        "communicator " + s.text()};
  if (args.out.shape[0] != s.tokens)
    throw ArgumentError{"num_tokens: " + std::to_string(args.out.shape[0]) + " (rows of out); expected " +
                        std::to_string(s.tokens) + ", the tokens of the last moe_dispatch on this communicator " +
                        s.text()};
  DeviceScope scope(comm.cuda_device());
  throw_if_error(comm.check());
  rt::MoeDispatchCombine* op = moe_dispatched_;
  // Consumed either way: a refused combine (another launch since the dispatch) leaves nothing to combine.
  moe_dispatched_ = nullptr;
  throw_if_error(op->combine(args.y_expert.data, args.out.data, as_stream(stream)));
}

void PyCommunicator::moe_forward(const MoeForwardArgs& args, const MoeShape& shape, uintptr_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  rt::Communicator& comm = live("moe_forward");
  if (args.x.device != comm.cuda_device()) throw ArgumentError{on_device_text("x", args.x.device, comm)};
  if (!shape.fused)
    throw_status(Status(StatusCode::kInvalidArgument, "moe_forward: the shape is not marked fused"));
  DeviceScope scope(comm.cuda_device());
  throw_if_error(comm.check());
  rt::MoeDispatchCombine& op = moe_plan_locked(shape, stream);
  if (args.w.shape[0] != op.experts_per_rank())
    throw ArgumentError{"w: " + std::to_string(args.w.shape[0]) + " experts; expected experts_per_rank = " +
                        std::to_string(op.experts_per_rank()) + " of " + shape.text()};
  throw_if_error(op.forward(args.x.data, static_cast<const int32_t*>(args.choices.data),
                            static_cast<const float*>(args.scores.data), args.w.data, args.out.data,
                            as_stream(stream)));
}

void PyCommunicator::moe_mlp(const MoeMlpArgs& args, const MoeShape& shape, rt::MoeActivation activation,
                             uintptr_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  rt::Communicator& comm = live("moe_mlp");
  if (args.x.device != comm.cuda_device()) throw ArgumentError{on_device_text("x", args.x.device, comm)};
  DeviceScope scope(comm.cuda_device());
  throw_if_error(comm.check());
  const uint64_t inter = args.w2.shape[2];
  rt::MoeMlp& op = cached_plan(
      mlp_plans_, std::make_tuple(shape.key(), inter, static_cast<int>(activation)), stream, "moe_mlp",
      shape.text() + " inter=" + std::to_string(inter), "moe_mlp with it before capturing", [&] {
        return rt::MoeMlp::create(comm, shape.tokens, shape.hidden, inter, shape.experts, shape.top_k, activation,
                                  shape.config(), as_stream(stream));
      });
  if (args.w2.shape[0] != op.experts_per_rank())
    throw ArgumentError{"w2: " + std::to_string(args.w2.shape[0]) + " experts; expected experts_per_rank = " +
                        std::to_string(op.experts_per_rank()) + " of " + shape.text()};
  moe_dispatched_ = nullptr;  // the MLP's own dispatch and combine run on the communicator
  throw_if_error(op.forward(args.x.data, static_cast<const int32_t*>(args.choices.data),
                            static_cast<const float*>(args.scores.data), args.w1.data, args.w2.data, args.out.data,
                            as_stream(stream)));
}

// ---- ring attention -----------------------------------------------------------------------------

PyCommunicator::RingKey PyCommunicator::ring_key(const rt::RingAttentionShape& s) {
  uint32_t scale_bits = 0;
  std::memcpy(&scale_bits, &s.scale, sizeof scale_bits);
  return {s.batch, s.heads_q, s.heads_kv, s.s_local, s.head_dim, static_cast<uint32_t>(s.layout),
          static_cast<uint32_t>(s.placement), scale_bits};
}

rt::RingAttention& PyCommunicator::ring_plan_locked(const rt::RingAttentionShape& shape, uintptr_t stream) {
  rt::Communicator& comm = live("ring_attention");
  return cached_plan(ring_plans_, ring_key(shape), stream, "ring_attention", ring_text(shape),
                     "Communicator.plan_ring_attention()", [&] {
                       rt::RingAttentionConfig config;
                       config.adaptive_split = adaptive_split_ && comm.size() > 1;  // one rank: no comm blocks
                       return rt::RingAttention::create(comm, shape, config, as_stream(stream));
                     });
}

void PyCommunicator::plan_ring_attention(const rt::RingAttentionShape& shape, uintptr_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  DeviceScope scope(live("plan_ring_attention").cuda_device());
  (void)ring_plan_locked(shape, stream);
}

bool PyCommunicator::has_ring_attention_plan(const rt::RingAttentionShape& shape) {
  std::lock_guard<std::mutex> lock(mu_);
  return ring_plans_.count(ring_key(shape)) != 0;
}

std::string PyCommunicator::describe_ring_attention(const rt::RingAttentionShape& shape) {
  std::lock_guard<std::mutex> lock(mu_);
  return describe_plan(ring_plans_, ring_key(shape), "describe_ring_attention", ring_text(shape));
}

void PyCommunicator::ring_attention(const RingAttentionArgs& args, const rt::RingAttentionShape& shape,
                                    uintptr_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  rt::Communicator& comm = live("ring_attention");
  if (args.q.device != comm.cuda_device()) throw ArgumentError{on_device_text("q", args.q.device, comm)};
  DeviceScope scope(comm.cuda_device());
  throw_if_error(comm.check());
  rt::RingAttention& op = ring_plan_locked(shape, stream);
  throw_if_error(op.launch(args.q.data, args.k.data, args.v.data, args.o.data, static_cast<float*>(args.lse.data),
                           as_stream(stream)));
}

std::string PyCommunicator::split_report() {
  std::lock_guard<std::mutex> lock(mu_);
  DeviceScope scope(device());
  std::string out;
  auto add = [&](const std::string& what, const StatusOr<rt::SplitState>& st) {
    if (st.ok() && st.value().adaptive) out += what + ": " + st.value().text + "\n";
  };
  if (!adaptive_split_) return out;
  for (auto& [key, op] : plans_)
    add("all_gather_gemm " + shape_key(std::get<0>(key), std::get<1>(key), std::get<2>(key)), op->split_state());
  for (auto& [key, op] : ring_plans_) add("ring_attention " + op->describe(), op->split_state());
  for (auto& [key, op] : moe_plans_) add("moe " + op->describe(), op->split_state());
  return out;
}

void PyCommunicator::check() {
  std::lock_guard<std::mutex> lock(mu_);
  throw_if_error(live("check").check());
}

void PyCommunicator::close() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!comm_) return;
  DeviceScope scope(comm_->cuda_device(), /*quiet=*/true);
  moe_dispatched_ = nullptr;
  plans_.clear();
  rs_plans_.clear();
  ar_plans_.clear();
  moe_plans_.clear();
  ring_plans_.clear();
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
