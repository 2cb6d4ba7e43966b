// sm90_attention.cu: argument checks, configuration choice, tensor maps and dispatch of the
// attention core. No device code here (instantiations: sm90_attention_d64.cu, _d128.cu).
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <mutex>
#include <string>

#include "attention/sm90_attention.h"
#include "attention/sm90_attention_launch.cuh"
#include "common/l2_promotion.h"

namespace mkernel::kernels {

namespace {

constexpr int64_t kBlockM = 128;
constexpr int kMaxDevices = 64;
constexpr int64_t kMaxDim = (int64_t{1} << 31) - 1;
// Workspace: [0, 256) the dynamic schedule's counters; then the running state of a chunked launch.
constexpr size_t kWorkspaceHeader = 256;

AttnResult fail(AttnError code, std::string message) { return AttnResult{code, std::move(message)}; }

std::string str(int64_t v) { return std::to_string(v); }

struct DeviceInfo {
  int num_sms = 0, major = 0, minor = 0;
};

AttnResult device_info(DeviceInfo* info) {
  static std::mutex mu;
  static DeviceInfo cache[kMaxDevices];
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return fail(AttnError::kCudaError, std::string("cudaGetDevice: ") + cudaGetErrorString(e));
  std::lock_guard<std::mutex> lock(mu);
  if (dev < kMaxDevices && cache[dev].num_sms > 0) {
    *info = cache[dev];
    return {};
  }
  DeviceInfo d;
  if ((e = cudaDeviceGetAttribute(&d.num_sms, cudaDevAttrMultiProcessorCount, dev)) != cudaSuccess ||
      (e = cudaDeviceGetAttribute(&d.major, cudaDevAttrComputeCapabilityMajor, dev)) != cudaSuccess ||
      (e = cudaDeviceGetAttribute(&d.minor, cudaDevAttrComputeCapabilityMinor, dev)) != cudaSuccess) {
    return fail(AttnError::kCudaError, std::string("cudaDeviceGetAttribute: ") + cudaGetErrorString(e));
  }
  if (dev < kMaxDevices) cache[dev] = d;
  *info = d;
  return {};
}

PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      p = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

// A [batch, heads, rows, head_dim] bf16 tensor with the given strides (elements), moved in boxes
// of 64 columns x box_rows rows of one head, 128-byte swizzle (sm90_attention.cuh: Sm90AttnTraits).
// Rows past `rows` read as zero and are not written, which is what makes a ragged last tile of
// queries or keys correct without padding (the kernel masks keys past the end).
AttnResult make_map(CUtensorMap* map, const void* ptr, int64_t head_dim, int64_t rows, int64_t heads, int64_t batch,
                    const AttnStrides& st, uint32_t box_rows, const char* name,
                    int l2_promotion = kAttnDefaultL2Promotion) {
  auto encode = tensor_map_encoder();
  if (encode == nullptr) return fail(AttnError::kCudaError, "cuTensorMapEncodeTiled is not available from the driver");
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(head_dim), static_cast<cuuint64_t>(rows),
                              static_cast<cuuint64_t>(heads), static_cast<cuuint64_t>(batch)};
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(st.seq) * 2, static_cast<cuuint64_t>(st.head) * 2,
                                 static_cast<cuuint64_t>(st.batch) * 2};
  const cuuint32_t box[4] = {64, box_rows, 1, 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  const CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, const_cast<void*>(ptr), dims, strides, box,
                            elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            tensor_map_l2_promotion(l2_promotion), CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    return fail(AttnError::kCudaError, std::string("cuTensorMapEncodeTiled(") + name + ") failed with CUresult " +
                                           std::to_string(static_cast<int>(r)));
  }
  return {};
}

AttnStrides packed_strides(AttnLayout layout, int64_t heads, int64_t seq, int64_t d) {
  if (layout == AttnLayout::kBSHD) return AttnStrides{seq * heads * d, d, heads * d};
  return AttnStrides{heads * seq * d, seq * d, d};
}

AttnResult check_strides(const char* name, const AttnStrides& s) {
  const struct {
    const char* what;
    int64_t v;
  } f[] = {{"batch", s.batch}, {"head", s.head}, {"seq", s.seq}};
  for (const auto& x : f) {
    if (x.v <= 0 || x.v % 8 != 0 || x.v > (int64_t{1} << 39)) {
      return fail(AttnError::kInvalidLayout,
                  std::string(name) + "_strides." + x.what + " = " + str(x.v) +
                      " is not supported: it must be a positive multiple of 8 elements below 2^39 (TMA walks "
                      "16-byte aligned rows; head_dim is the contiguous dimension)");
    }
  }
  return {};
}

AttnResult check_pointer(const char* name, const void* p, uintptr_t align) {
  if (p == nullptr || reinterpret_cast<uintptr_t>(p) % align != 0) {
    return fail(AttnError::kInvalidPointer,
                std::string("pointer ") + name + " is null or not " + std::to_string(align) + "-byte aligned");
  }
  return {};
}

AttnResult check_positive(const char* name, int64_t v) {
  if (v < 1) return fail(AttnError::kInvalidShape, std::string(name) + " = " + str(v) + " is not supported: it must be at least 1");
  if (v > kMaxDim) return fail(AttnError::kInvalidShape, std::string(name) + " = " + str(v) + " is too large (at most 2^31 - 1)");
  return {};
}

// The chunks a launch visits, resolved (num_chunks == 0: one chunk from k, v, seq_kv, causal).
int resolved_chunks(const AttnArgs& a, AttnKVChunk* out) {
  if (a.num_chunks == 0) {
    out[0] = AttnKVChunk{a.k, a.v, a.seq_kv, a.causal ? kAttnCausal : kAttnFull, 0};
    return 1;
  }
  for (int i = 0; i < a.num_chunks; ++i) out[i] = a.chunks[i];
  return a.num_chunks;
}

int64_t visible_pairs(int64_t seq_q, const AttnKVChunk& c) {
  if (c.relation == kAttnSkip) return 0;
  if (c.relation == kAttnFull) return seq_q * c.kv_len;
  int64_t pairs = 0;
  for (int64_t i = 0; i < seq_q; ++i) {
    const int64_t n = i + c.causal_offset + 1;
    pairs += n <= 0 ? 0 : (n > c.kv_len ? c.kv_len : n);
  }
  return pairs;
}

}  // namespace

const char* attn_dtype_name(AttnDtype t) {
  switch (t) {
    case AttnDtype::kBF16: return "bf16";
    case AttnDtype::kFP16: return "fp16";
    case AttnDtype::kFP32: return "fp32";
    case AttnDtype::kFP8E4M3: return "fp8_e4m3";
    default: return "unknown";
  }
}

AttnResult attention_tensor_map(CUtensorMap* map, const void* ptr, int64_t head_dim, int64_t rows, int64_t heads,
                                int64_t batch, const AttnStrides& strides, uint32_t box_rows, const char* name,
                                int l2_promotion) {
  return make_map(map, ptr, head_dim, rows, heads, batch, strides, box_rows, name, l2_promotion);
}

AttnStrides attention_packed_strides(AttnLayout layout, int64_t heads, int64_t seq, int64_t head_dim) {
  return packed_strides(layout, heads, seq, head_dim);
}

size_t attention_workspace_bytes(const AttnArgs& a) {
  if (a.num_chunks <= 1 || a.batch < 1 || a.heads_q < 1 || a.seq_q < 1 || a.head_dim < 1) return kWorkspaceHeader;
  const size_t rows = static_cast<size_t>(a.batch) * a.heads_q * a.seq_q;
  return kWorkspaceHeader + rows * (a.head_dim + 1) * sizeof(float);
}

double attention_flops(const AttnArgs& a) {
  AttnKVChunk chunks[kAttnMaxChunks];
  const int n = resolved_chunks(a, chunks);
  double pairs = 0;
  for (int i = 0; i < n; ++i) pairs += static_cast<double>(visible_pairs(a.seq_q, chunks[i]));
  return 4.0 * static_cast<double>(a.batch) * a.heads_q * a.head_dim * pairs;
}

AttnResult attention_plan(const AttnArgs& args, AttnPlan* plan) {
  // ---- element types ---------------------------------------------------------------------------
  const struct {
    const char* name;
    AttnDtype t, want;
  } types[] = {{"q", args.q_dtype, AttnDtype::kBF16},
               {"k", args.k_dtype, AttnDtype::kBF16},
               {"v", args.v_dtype, AttnDtype::kBF16},
               {"o", args.o_dtype, AttnDtype::kBF16},
               {"lse", args.lse_dtype, AttnDtype::kFP32}};
  for (const auto& t : types) {
    if (t.t != t.want) {
      return fail(AttnError::kInvalidDtype, std::string(t.name) + " dtype = " + attn_dtype_name(t.t) +
                                                " is not supported: the attention core takes bf16 q, k, v and o and "
                                                "writes fp32 lse (expected " + attn_dtype_name(t.want) + ")");
    }
  }

  // ---- shapes ----------------------------------------------------------------------------------
  AttnResult r;
  if (!(r = check_positive("batch", args.batch)).ok()) return r;
  if (!(r = check_positive("heads_q", args.heads_q)).ok()) return r;
  if (!(r = check_positive("heads_kv", args.heads_kv)).ok()) return r;
  if (!(r = check_positive("seq_q", args.seq_q)).ok()) return r;
  if (args.heads_q % args.heads_kv != 0) {
    return fail(AttnError::kInvalidHeads, "heads_q = " + str(args.heads_q) + " is not a multiple of heads_kv = " +
                                              str(args.heads_kv) +
                                              " (grouped-query attention shares each key/value head among the same "
                                              "number of query heads)");
  }
  if (args.head_dim != 64 && args.head_dim != 128) {
    return fail(AttnError::kInvalidHeadDim, "head_dim = " + str(args.head_dim) + " is not supported: it must be 64 or 128");
  }
  if (!(args.scale >= 0.0f) || std::isinf(args.scale)) {
    return fail(AttnError::kInvalidConfig, "scale = " + std::to_string(args.scale) +
                                               " is not supported: it must be a positive finite number (0: 1/sqrt(head_dim))");
  }
  const int64_t num_m_blocks = (args.seq_q + kBlockM - 1) / kBlockM;
  const int64_t num_units = args.batch * args.heads_q * num_m_blocks;
  if (num_units > kMaxDim) {
    return fail(AttnError::kInvalidShape, "batch * heads_q * ceil(seq_q / 128) = " + str(num_units) +
                                              " is too large (at most 2^31 - 1 query tiles)");
  }

  // ---- chunks of keys and values ---------------------------------------------------------------
  if (args.num_chunks < 0 || args.num_chunks > kAttnMaxChunks) {
    return fail(AttnError::kInvalidChunks, "num_chunks = " + std::to_string(args.num_chunks) + " is not supported: it must be 0 (one "
                                               "chunk from k, v, seq_kv) to " + std::to_string(kAttnMaxChunks));
  }
  AttnKVChunk chunks[kAttnMaxChunks];
  const int num_chunks = resolved_chunks(args, chunks);
  for (int i = 0; i < num_chunks; ++i) {
    const std::string name = args.num_chunks == 0 ? std::string("seq_kv") : "chunks[" + std::to_string(i) + "].kv_len";
    if (!(r = check_positive(name.c_str(), chunks[i].kv_len)).ok()) return r;
    if (chunks[i].relation != kAttnFull && chunks[i].relation != kAttnCausal && chunks[i].relation != kAttnSkip) {
      return fail(AttnError::kInvalidChunks, "chunks[" + std::to_string(i) + "].relation = " +
                                                 std::to_string(static_cast<int>(chunks[i].relation)) +
                                                 " is not a relation (expected kAttnFull, kAttnCausal or kAttnSkip)");
    }
    if (chunks[i].causal_offset < -kMaxDim || chunks[i].causal_offset > kMaxDim) {
      return fail(AttnError::kInvalidChunks, "chunks[" + std::to_string(i) + "].causal_offset = " +
                                                 str(chunks[i].causal_offset) + " is out of range (|offset| < 2^31)");
    }
  }

  // ---- layout and pointers ---------------------------------------------------------------------
  if (args.layout != AttnLayout::kBHSD && args.layout != AttnLayout::kBSHD && args.layout != AttnLayout::kStrided) {
    return fail(AttnError::kInvalidLayout, "layout = " + std::to_string(static_cast<int>(args.layout)) +
                                               " is not a layout (expected kBHSD, kBSHD or kStrided)");
  }
  AttnStrides sq, sk, sv, so;
  if (args.layout == AttnLayout::kStrided) {
    sq = args.q_strides;
    sk = args.k_strides;
    sv = args.v_strides;
    so = args.o_strides;
  } else {
    if (args.num_chunks > 0) {
      return fail(AttnError::kInvalidLayout,
                  "layout must be kStrided with num_chunks > 0 (chunks address spans of a longer buffer, whose "
                  "strides the packed layouts cannot know)");
    }
    sq = packed_strides(args.layout, args.heads_q, args.seq_q, args.head_dim);
    so = sq;
    sk = packed_strides(args.layout, args.heads_kv, args.seq_kv, args.head_dim);
    sv = sk;
  }
  if (!(r = check_strides("q", sq)).ok()) return r;
  if (!(r = check_strides("k", sk)).ok()) return r;
  if (!(r = check_strides("v", sv)).ok()) return r;
  if (!(r = check_strides("o", so)).ok()) return r;
  if (!(r = check_pointer("q", args.q, 16)).ok()) return r;
  if (!(r = check_pointer("o", args.o, 16)).ok()) return r;
  if (!(r = check_pointer("lse", args.lse, 4)).ok()) return r;
  for (int i = 0; i < num_chunks; ++i) {
    const std::string kn = args.num_chunks == 0 ? std::string("k") : "chunks[" + std::to_string(i) + "].k";
    const std::string vn = args.num_chunks == 0 ? std::string("v") : "chunks[" + std::to_string(i) + "].v";
    if (!(r = check_pointer(kn.c_str(), chunks[i].k, 16)).ok()) return r;
    if (!(r = check_pointer(vn.c_str(), chunks[i].v, 16)).ok()) return r;
  }
  const size_t need = attention_workspace_bytes(args);
  const bool have_workspace = args.workspace != nullptr && args.workspace_bytes >= need;
  if (num_chunks > 1) {
    if (!have_workspace) {
      return fail(AttnError::kWorkspaceTooSmall, "workspace_bytes = " + std::to_string(args.workspace_bytes) +
                                                     " (pointer " + (args.workspace ? "set" : "null") + ") is smaller than the " +
                                                     std::to_string(need) + " bytes " + std::to_string(num_chunks) +
                                                     " chunks need (attention_workspace_bytes)");
    }
  }
  if (args.workspace != nullptr && !(r = check_pointer("workspace", args.workspace, 16)).ok()) return r;

  // ---- device and configuration ----------------------------------------------------------------
  DeviceInfo dev;
  if (!(r = device_info(&dev)).ok()) return r;
  if (dev.major != 9 || dev.minor != 0) {
    return fail(AttnError::kUnsupportedDevice, "the attention core needs a Hopper GPU (compute capability 9.0); this device is " +
                                                   std::to_string(dev.major) + "." + std::to_string(dev.minor));
  }
  AttnConfig c = args.config;
  if (c.block_n == 0) {
    // Measured on one H200 (docs/kernels.md, attention core): 160-wide key blocks beat 128-wide
    // ones by 3-9% at S = 8K-32K, causal or not, at head dim 128, and by 1-5% at head dim 64
    // (where 192 was within 1% of 160).
    c.block_n = 160;
  }
  if (c.pingpong < 0) c.pingpong = 1;
  if (!l2_promotion_valid(c.l2_promotion)) {
    return fail(AttnError::kInvalidConfig, "config l2_promotion = " + std::to_string(c.l2_promotion) +
                                               " is not supported (" + kL2PromotionExpected + ")");
  }
  if (c.l2_promotion == -1) c.l2_promotion = kAttnDefaultL2Promotion;
  if (c.num_blocks == 0) c.num_blocks = static_cast<int>(num_units < dev.num_sms ? num_units : dev.num_sms);
  if (c.unit_order < 0) {
    // Units of a causal launch differ in cost: take them dynamically when there is a workspace
    // for the counters (one chunk); otherwise, and without a mask, head-major.
    const bool causal1 = num_chunks == 1 && chunks[0].relation == kAttnCausal;
    c.unit_order = causal1 && have_workspace ? kAttnDynamic : kAttnHeadMajor;
  }
  if (c.unit_order != kAttnHeadMajor && c.unit_order != kAttnCostSnake && c.unit_order != kAttnDynamic) {
    return fail(AttnError::kInvalidConfig, "config unit_order = " + std::to_string(c.unit_order) +
                                               " is not an order (expected -1, kAttnHeadMajor, kAttnCostSnake or "
                                               "kAttnDynamic)");
  }
  if (c.unit_order == kAttnDynamic && (num_chunks != 1 || !have_workspace)) {
    return fail(AttnError::kInvalidConfig,
                "config unit_order = kAttnDynamic needs one chunk (num_chunks = " + std::to_string(num_chunks) +
                    ") and a workspace of attention_workspace_bytes() = " + std::to_string(need) +
                    " bytes (workspace_bytes = " + std::to_string(args.workspace ? args.workspace_bytes : 0) +
                    ") for its counters");
  }
  const bool built = (c.block_n == 128 && (c.pingpong == 0 || c.pingpong == 1)) ||
                     (c.block_n == 160 && c.pingpong == 1) || (args.head_dim == 64 && c.block_n == 192 && c.pingpong == 1);
  if (!built) {
    return fail(AttnError::kInvalidConfig, "config block_n = " + std::to_string(c.block_n) + ", pingpong = " +
                                               std::to_string(c.pingpong) + " is not built for head_dim " +
                                               str(args.head_dim) +
                                               " (built: block_n 128 with pingpong 0 or 1; block_n 160 with "
                                               "pingpong 1; block_n 192 with pingpong 1 for head_dim 64)");
  }
  if (c.num_blocks < 1) {
    return fail(AttnError::kInvalidConfig, "config num_blocks = " + std::to_string(c.num_blocks) + " is not supported: at least 1");
  }

  // ---- the plan --------------------------------------------------------------------------------
  plan->args = args;
  plan->config = c;
  AttnParams& p = plan->params;
  p = AttnParams{};
  p.batch = static_cast<uint32_t>(args.batch);
  p.heads_q = static_cast<uint32_t>(args.heads_q);
  p.heads_kv = static_cast<uint32_t>(args.heads_kv);
  p.group = static_cast<uint32_t>(args.heads_q / args.heads_kv);
  p.q_len = static_cast<uint32_t>(args.seq_q);
  p.num_m_blocks = static_cast<uint32_t>(num_m_blocks);
  p.num_units = static_cast<uint32_t>(num_units);
  p.unit_order = static_cast<uint32_t>(c.unit_order);
  p.scale = args.scale > 0.0f ? args.scale : 1.0f / std::sqrt(static_cast<float>(args.head_dim));
  p.scale_log2 = p.scale * 1.4426950408889634f;
  p.lse = args.lse;
  p.lse_head_stride = p.q_len;
  if (have_workspace) p.sched_counters = static_cast<uint32_t*>(args.workspace);
  if (num_chunks > 1) {
    auto* ws = reinterpret_cast<float*>(static_cast<char*>(args.workspace) + kWorkspaceHeader);
    p.o_run = ws;
    p.lse_run = ws + static_cast<size_t>(args.batch) * args.heads_q * args.seq_q * args.head_dim;
  }
  p.num_chunks = static_cast<uint32_t>(num_chunks);
  for (int i = 0; i < num_chunks; ++i) {
    AttnChunk& pc = p.chunks[i];
    pc.kv_len = static_cast<uint32_t>(chunks[i].kv_len);
    pc.relation = chunks[i].relation;
    pc.causal_offset = static_cast<int32_t>(chunks[i].causal_offset);
    pc.flags = (i > 0 ? kAttnReadRunning : 0u) | (i == num_chunks - 1 ? kAttnWriteFinal : 0u);
  }
  p.wait = args.wait;
  p.debug = args.debug;

  AttnMaps& m = plan->maps;
  m = AttnMaps{};
  if (!(r = make_map(&m.q, args.q, args.head_dim, args.seq_q, args.heads_q, args.batch, sq, 128, "q", c.l2_promotion)).ok())
    return r;
  if (!(r = make_map(&m.o, args.o, args.head_dim, args.seq_q, args.heads_q, args.batch, so, 64, "o")).ok()) return r;
  for (int i = 0; i < num_chunks; ++i) {
    const auto rows = static_cast<uint32_t>(c.block_n);
    if (!(r = make_map(&m.k[i], chunks[i].k, args.head_dim, chunks[i].kv_len, args.heads_kv, args.batch, sk, rows, "k",
                       c.l2_promotion)).ok())
      return r;
    if (!(r = make_map(&m.v[i], chunks[i].v, args.head_dim, chunks[i].kv_len, args.heads_kv, args.batch, sv, rows, "v",
                       c.l2_promotion)).ok())
      return r;
  }
  return {};
}

AttnResult attention_launch(const AttnPlan& plan, cudaStream_t stream) {
  if (plan.args.head_dim == 64) return launch_attention_d64(plan, stream);
  return launch_attention_d128(plan, stream);
}

AttnResult attention_fwd(const AttnArgs& args, cudaStream_t stream) {
  AttnPlan plan;
  AttnResult r = attention_plan(args, &plan);
  if (!r.ok()) return r;
  return attention_launch(plan, stream);
}

std::string attention_config_string(const AttnPlan& plan) {
  return "d" + str(plan.args.head_dim) + " n" + std::to_string(plan.config.block_n) + " pp" +
         std::to_string(plan.config.pingpong) + " b" + std::to_string(plan.config.num_blocks) +
         (plan.config.unit_order == kAttnCostSnake ? " snake" : (plan.config.unit_order == kAttnDynamic ? " dynamic" : " heads")) +
         " c" + std::to_string(plan.params.num_chunks) +
         (plan.config.l2_promotion != kAttnDefaultL2Promotion ? " pr" + std::to_string(plan.config.l2_promotion) : "");
}

}  // namespace mkernel::kernels
