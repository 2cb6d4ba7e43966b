// ring_attention.cu: ring attention on a Communicator (ops.h): the layout from the communicator,
// the checks, the agreement between ranks, then the kernel-level plan (kernels/fused/ring_attn);
// and the zigzag placement helpers.
#include <cuda_runtime.h>

#include <algorithm>

#include "agree.h"
#include "fused/ring_attn/ring_attn.h"
#include "mkernel/runtime/ops.h"
#include "op_common.h"

namespace mkernel::rt {

namespace mk = mkernel::kernels;

using ops_detail::layout_of;

namespace {

constexpr const char* kWhat = "ring_attention";

Status from_attn(const mk::AttnResult& r, const std::string& what) {
  if (r.ok()) return Status::Ok();
  StatusCode code = StatusCode::kInvalidArgument;
  switch (r.code) {
    case mk::AttnError::kWorkspaceTooSmall:
      code = StatusCode::kResourceExhausted;
      break;
    case mk::AttnError::kUnsupportedDevice:
      code = StatusCode::kFailedPrecondition;
      break;
    case mk::AttnError::kCudaError:
      code = StatusCode::kDeviceError;
      break;
    default:
      break;
  }
  return Status(code, what + ": " + r.message);
}

mk::AttnLayout kernel_layout(AttentionLayout l) {
  return l == AttentionLayout::kBSHD ? mk::AttnLayout::kBSHD : mk::AttnLayout::kBHSD;
}

// Every field in range, before anything is planned: the messages name the field, its value and
// what is expected.
Status check_shape(const RingAttentionShape& s, uint32_t world) {
  auto bad = [](const std::string& m) { return Status(StatusCode::kInvalidArgument, std::string(kWhat) + ": " + m); };
  const struct {
    const char* name;
    uint64_t v;
  } dims[] = {{"batch", s.batch}, {"heads_q", s.heads_q}, {"heads_kv", s.heads_kv}, {"s_local", s.s_local}};
  for (const auto& d : dims)
    if (d.v == 0 || d.v > 0x7FFFFFFFu)
      return bad(std::string(d.name) + " = " + std::to_string(d.v) + "; expected 1 .. 2^31 - 1");
  if (s.heads_q % s.heads_kv != 0)
    return bad("heads_q = " + std::to_string(s.heads_q) +
               " is not a multiple of heads_kv = " + std::to_string(s.heads_kv) + " (grouped-query attention)");
  if (s.head_dim != 64 && s.head_dim != 128)
    return bad("head_dim = " + std::to_string(s.head_dim) + "; expected 64 or 128");
  if (s.layout != AttentionLayout::kBHSD && s.layout != AttentionLayout::kBSHD)
    return bad("layout = " + std::to_string(static_cast<uint32_t>(s.layout)) + "; expected kBHSD or kBSHD");
  if (s.placement != RingPlacement::kNonCausal && s.placement != RingPlacement::kCausalContiguous &&
      s.placement != RingPlacement::kCausalZigzag)
    return bad("placement = " + std::to_string(static_cast<uint32_t>(s.placement)) +
               "; expected kNonCausal, kCausalContiguous or kCausalZigzag");
  if (s.placement == RingPlacement::kCausalZigzag && s.s_local % 2 != 0)
    return bad("s_local = " + std::to_string(s.s_local) +
               " with zigzag placement; expected an even number (two chunks of s_local / 2 positions per rank; the "
               "whole sequence is world x s_local = " +
               std::to_string(uint64_t{world} * s.s_local) + ")");
  if (!(s.scale >= 0.0f) || s.scale > 1e30f)
    return bad("scale = " + std::to_string(s.scale) + "; expected a positive finite number (0: 1/sqrt(head_dim))");
  return Status::Ok();
}

uint32_t resolved_slots(uint32_t nodes, uint32_t gpus, uint32_t slots) {
  return slots != 0 ? slots : mk::ring_default_slots(mk::FusedLayout{nodes, gpus});
}

}  // namespace

uint64_t ring_attention_nvlink_bytes(uint32_t nodes, uint32_t gpus, const RingAttentionShape& s, uint32_t slots) {
  if (uint64_t{nodes} * gpus <= 1) return 0;
  return mk::ring_nvl_bytes_needed(resolved_slots(nodes, gpus, slots), static_cast<uint32_t>(s.batch),
                                   static_cast<uint32_t>(s.heads_kv), static_cast<uint32_t>(s.s_local),
                                   static_cast<uint32_t>(s.head_dim));
}
uint64_t ring_attention_network_bytes(uint32_t nodes, const RingAttentionShape& s) {
  return mk::ring_net_bytes_needed(nodes, static_cast<uint32_t>(s.batch), static_cast<uint32_t>(s.heads_kv),
                                   static_cast<uint32_t>(s.s_local), static_cast<uint32_t>(s.head_dim));
}
uint32_t ring_attention_fused_flags(uint32_t nodes, uint32_t gpus) {
  const mk::RingGeometry g{mk::FusedLayout{nodes, gpus}, 0, 2, mk::kRingNonCausal, 1};
  return std::max<uint32_t>(g.nvl_flags_needed(), g.net_flags_needed() + nodes * gpus * mk::kAgreeWords);
}

RingAttention::~RingAttention() = default;

StatusOr<std::unique_ptr<RingAttention>> RingAttention::create(Communicator& comm, const RingAttentionShape& shape,
                                                               const RingAttentionConfig& config, cudaStream_t stream) {
  MK_RETURN_IF_ERROR(check_shape(shape, comm.size()));
  if (config.slots > mk::kRingMaxSlots)
    return Status(StatusCode::kInvalidArgument, std::string(kWhat) + ": slots = " + std::to_string(config.slots) +
                                                    "; expected 0 (choose) to " + std::to_string(mk::kRingMaxSlots));
  if (config.comm_blocks < 0 || config.attn_blocks < 0)
    return Status(StatusCode::kInvalidArgument,
                  std::string(kWhat) + ": comm_blocks = " + std::to_string(config.comm_blocks) +
                      ", attn_blocks = " + std::to_string(config.attn_blocks) + "; expected 0 (choose) or more");
  MK_RETURN_IF_ERROR(ops_detail::check_device(comm, kWhat));
  MK_ASSIGN_OR_RETURN(mk::FusedLayout layout, layout_of(comm));
  const uint32_t slots = resolved_slots(layout.nodes, layout.gpus, config.slots);
  // Every rank must plan the same thing (slot places, flag places and the steps depend on it).
  const mk::DeviceComm& c = comm.device();
  const uint32_t form = static_cast<uint32_t>(shape.head_dim) | (static_cast<uint32_t>(shape.layout) << 8) |
                        (static_cast<uint32_t>(shape.placement) << 16);
  MK_RETURN_IF_ERROR(
      agree(comm, kWhat,
            {4u, static_cast<uint32_t>(shape.batch), static_cast<uint32_t>(shape.heads_q),
             static_cast<uint32_t>(shape.heads_kv), static_cast<uint32_t>(shape.s_local), form, layout.nodes, slots,
             c.num_flags, c.num_fused_flags, c.nvl_fused_flags, static_cast<uint32_t>(c.nvl_bytes >> 12)},
            {"the op", "batch", "heads_q", "heads_kv", "s_local (positions per rank)",
             "head_dim | layout << 8 | placement << 16", "the number of nodes", "slots", "Options::num_flags",
             "Options::fused_flags", "the NVLink buffer's fused-op flags", "Options::nvlink_bytes / 4096"},
            stream));
  mk::RingAttnSetup s;
  s.comm = c;
  s.wait = comm.wait_context();
  s.layout = layout;
  s.batch = static_cast<uint32_t>(shape.batch);
  s.heads_q = static_cast<uint32_t>(shape.heads_q);
  s.heads_kv = static_cast<uint32_t>(shape.heads_kv);
  s.s_local = static_cast<uint32_t>(shape.s_local);
  s.head_dim = static_cast<uint32_t>(shape.head_dim);
  s.tensor_layout = kernel_layout(shape.layout);
  s.placement = static_cast<uint32_t>(shape.placement);
  s.scale = shape.scale;
  s.config = mk::RingAttnConfig{config.comm_blocks, config.attn_blocks, slots, config.bulk_copies, config.adaptive_split};
  std::unique_ptr<RingAttention> op(new RingAttention());
  op->comm_ = &comm;
  MK_RETURN_IF_ERROR(from_attn(mk::RingAttnPlan::create(s, &op->plan_), kWhat));
  return StatusOr<std::unique_ptr<RingAttention>>(std::move(op));
}

Status RingAttention::launch(const void* q, const void* k, const void* v, void* o, float* lse, cudaStream_t stream) {
  if (q != checked_[0] || k != checked_[1] || v != checked_[2] || o != checked_[3] || lse != checked_[4])
    MK_RETURN_IF_ERROR(ops_detail::check_pointers(
        *comm_, kWhat, {{"q", q, false}, {"k", k, false}, {"v", v, false}, {"o", o, false}, {"lse", lse, false}}));
  checked_[0] = q;
  checked_[1] = k;
  checked_[2] = v;
  checked_[3] = o;
  checked_[4] = lse;
  MK_RETURN_IF_ERROR(comm_->begin_launch(stream));
  return from_attn(plan_->launch(q, k, v, o, lse, stream), kWhat);
}

std::string RingAttention::describe() const { return plan_->describe(); }

StatusOr<SplitState> RingAttention::split_state() const {
  mk::SplitReport r;
  MK_RETURN_IF_ERROR(from_attn(plan_->split_report(&r), kWhat));
  return ops_detail::to_split_state(r);
}

Status RingAttention::pin_split(int comm_blocks) { return from_attn(plan_->pin_split(comm_blocks), kWhat); }
double RingAttention::flops() const { return plan_->flops(); }

Status ring_attention(Communicator& comm, const void* q, const void* k, const void* v, void* o, float* lse,
                      const RingAttentionShape& shape, cudaStream_t stream) {
  const std::string key = std::string(kWhat) + "/" + std::to_string(shape.batch) + "/" + std::to_string(shape.heads_q) +
                          "/" + std::to_string(shape.heads_kv) + "/" + std::to_string(shape.s_local) + "/" +
                          std::to_string(shape.head_dim) + "/" + std::to_string(static_cast<uint32_t>(shape.layout)) +
                          "/" + std::to_string(static_cast<uint32_t>(shape.placement)) + "/" +
                          std::to_string(shape.scale);
  std::shared_ptr<void>& slot = comm.op_slot(key);
  if (!slot) {
    MK_ASSIGN_OR_RETURN(std::unique_ptr<RingAttention> op, RingAttention::create(comm, shape, {}, stream));
    slot = std::shared_ptr<RingAttention>(std::move(op));
  }
  return static_cast<RingAttention*>(slot.get())->launch(q, k, v, o, lse, stream);
}

StatusOr<std::vector<uint64_t>> zigzag_permutation(uint64_t seq, uint32_t world) {
  if (std::string e = mk::ring_zigzag_check(seq, world); !e.empty())
    return Status(StatusCode::kInvalidArgument, "zigzag_permutation: " + e);
  return mk::ring_zigzag_permutation(seq, world);
}

Status zigzag_reorder(const void* src, void* dst, uint64_t batch, uint64_t heads, uint64_t seq, uint64_t head_dim,
                      uint32_t elem_bytes, AttentionLayout layout, uint32_t world, bool to_zigzag,
                      cudaStream_t stream) {
  const uint64_t limit = uint64_t{1} << 40;
  if (batch > limit || heads > limit || seq > limit || head_dim > limit)
    return Status(StatusCode::kInvalidArgument, "zigzag_reorder: a dimension is over 2^40");
  return from_attn(mk::ring_zigzag_reorder(src, dst, static_cast<int64_t>(batch), static_cast<int64_t>(heads),
                                           static_cast<int64_t>(seq), static_cast<int64_t>(head_dim), elem_bytes,
                                           kernel_layout(layout), world, to_zigzag, stream),
                   "zigzag_reorder");
}

}  // namespace mkernel::rt
