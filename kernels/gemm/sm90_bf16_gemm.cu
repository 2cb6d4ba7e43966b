// sm90_bf16_gemm.cu: argument checks, configuration choice, tensor maps and dispatch for the
// persistent bf16 GEMM. No device code here; the kernels are instantiated per BLOCK_N of
// kGemmBlockWidths in sm90_bf16_gemm_n<BLOCK_N>.cu (generated, kernels/CMakeLists.txt).
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <iterator>
#include <mutex>
#include <string>

#include "common/l2_promotion.h"
#include "gemm/sm90_bf16_gemm.h"
#include "gemm/sm90_bf16_gemm_dispatch.h"

namespace mkernel::kernels {

namespace {

constexpr int kBlockM = 128;
constexpr int kBlockK = 64;
constexpr int kMaxDevices = 64;

GemmResult fail(GemmError code, std::string message) { return GemmResult{code, std::move(message)}; }

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

struct DeviceInfo {
  int num_sms = 0;
  int major = 0, minor = 0;
  // GEMM blocks that can be resident at once, per cluster size (index 1, 2); filled on first use.
  int resident[3] = {0, 0, 0};
  int resident_quad = 0;  // ... with 2 x 2 clusters
  // ... with split-K inside clusters of 2, 4 and 8 CTAs (index 1, 2, 3).
  int resident_k[4] = {0, 0, 0, 0};
};

GemmResult device_info(DeviceInfo* info) {
  static std::mutex mu;
  static DeviceInfo cache[kMaxDevices];
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return fail(GemmError::kCudaError, std::string("cudaGetDevice: ") + cudaGetErrorString(e));
  std::lock_guard<std::mutex> lock(mu);
  if (dev < kMaxDevices && cache[dev].num_sms > 0) {
    *info = cache[dev];
    return {};
  }
  DeviceInfo d;
  if ((e = cudaDeviceGetAttribute(&d.num_sms, cudaDevAttrMultiProcessorCount, dev)) != cudaSuccess ||
      (e = cudaDeviceGetAttribute(&d.major, cudaDevAttrComputeCapabilityMajor, dev)) != cudaSuccess ||
      (e = cudaDeviceGetAttribute(&d.minor, cudaDevAttrComputeCapabilityMinor, dev)) != cudaSuccess) {
    return fail(GemmError::kCudaError, std::string("cudaDeviceGetAttribute: ") + cudaGetErrorString(e));
  }
  if (d.major == 9 && d.minor == 0) {
    // Every tile width has the same threads and at most the 256-wide tile's shared memory (the
    // pipeline depth fills what is left), so one query per cluster size (the smaller of the
    // widest and narrowest, to be safe).
    for (int cl : {1, 2}) {
      d.resident[cl] = std::min(detail::max_resident_block_n<256>(cl, d.num_sms),
                                detail::max_resident_block_n<128>(cl, d.num_sms));
    }
    d.resident_quad = std::min(detail::max_resident_quad_block_n<256>(d.num_sms),
                               detail::max_resident_quad_block_n<128>(d.num_sms));
    for (int i = 1; i <= 3; ++i) {
      d.resident_k[i] = std::min({detail::max_resident_swapk_block_n<128>(1 << i, d.num_sms),
                                  detail::max_resident_swapk_block_n<64>(1 << i, d.num_sms),
                                  detail::max_resident_swapk_block_n<16>(1 << i, d.num_sms)});
    }
  }
  if (dev < kMaxDevices) cache[dev] = d;
  *info = d;
  return {};
}

PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) !=
            cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      p = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

// 2-D bf16 tensor [rows, k] with row pitch `ld`, moved in boxes of box_rows x box_cols with
// 128-byte swizzle (box_cols = 64: one swizzle row; matches make_desc_k_major_sw128). Out-of-bounds elements read as zero,
// which is what makes partial tiles in m, n and k correct without padding.
GemmResult make_tensor_map(CUtensorMap* map, const void* ptr, int64_t rows, int64_t k, int64_t ld,
                           uint32_t box_rows, uint32_t box_cols, const char* name, int l2_promotion = kGemmDefaultL2Promotion) {
  auto encode = tensor_map_encoder();
  if (encode == nullptr) {
    return fail(GemmError::kCudaError, "cuTensorMapEncodeTiled is not available from the driver");
  }
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(k), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(ld) * 2};
  const cuuint32_t box[2] = {box_cols, box_rows};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(ptr), dims,
                            strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            CU_TENSOR_MAP_SWIZZLE_128B, tensor_map_l2_promotion(l2_promotion),
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    return fail(GemmError::kCudaError,
                std::string("cuTensorMapEncodeTiled(") + name + ") failed with CUresult " + std::to_string(r));
  }
  return {};
}

GemmResult check_dim(const char* name, int64_t v, int64_t multiple, GemmError code, const char* why) {
  if (v < multiple || v % multiple != 0) {
    return fail(code, std::string(name) + " = " + std::to_string(v) + " is not supported: it must be a positive multiple of " +
                          std::to_string(multiple) + " (" + why + ")");
  }
  if (v > (int64_t{1} << 31) - 1) {
    return fail(code, std::string(name) + " = " + std::to_string(v) + " is too large (at most 2^31 - 1)");
  }
  return {};
}

// Resolves what the caller left open: the tile width, cluster size and work decomposition come
// from the cost model (sm90_bf16_gemm_schedule.h); raster along n in bands of 8 m groups (within
// noise of the best swept setting on every large shape, docs/kernels.md). Returns an error for a
// configuration that cannot run; `c` gets no zeros back.
GemmResult resolve_config(const GemmArgs& a, const DeviceInfo& dev, GemmConfig* c, GemmSchedule* sched) {
  *c = a.config;
  if (!l2_promotion_valid(c->l2_promotion)) {
    return fail(GemmError::kInvalidConfig, "l2_promotion = " + std::to_string(c->l2_promotion) + " is not supported (" +
                                               kL2PromotionExpected + ")");
  }
  if (c->l2_promotion == -1) c->l2_promotion = kGemmDefaultL2Promotion;
  if (c->swap_ab < -1 || c->swap_ab > 1) {
    return fail(GemmError::kInvalidConfig, "swap_ab = " + std::to_string(c->swap_ab) + " is not supported (expected -1, 0 or 1)");
  }
  const bool swap_widths = c->swap_ab == 1;
  if (c->block_n != 0 && !(swap_widths ? gemm_swap_width_built(c->block_n)
                                       : gemm_block_width_built(c->block_n) || (c->swap_ab == -1 && gemm_swap_width_built(c->block_n)))) {
    std::string widths;
    if (swap_widths) {
      for (int w : kGemmSwapWidths) widths += (widths.empty() ? "" : ", ") + std::to_string(w);
    } else {
      for (int w : kGemmBlockWidths) widths += (widths.empty() ? "" : ", ") + std::to_string(w);
    }
    return fail(GemmError::kInvalidConfig, "block_n = " + std::to_string(c->block_n) + " is not a built tile width (expected 0 or one of " +
                                               widths + (swap_widths ? ", with swap_ab = 1)" : ")"));
  }
  if (c->cluster_m != 0 && c->cluster_m != 1 && c->cluster_m != 2) return fail(GemmError::kInvalidConfig, "cluster_m must be 1 or 2");
  // 256-row tiles: plain GEMMs only (the hooks and the fused ops' roles count 128-row tiles), and
  // the widths built for them.
  const GemmHooks& h = a.hooks;
  const bool plain = h.ready_flags == nullptr && h.a_local == nullptr && h.tile_flags == nullptr &&
                     h.first_m_block == 0 && c->num_role_blocks == 0 && a.epilogue == kEpilogueStore;
  if (c->block_m != 0 && c->block_m != 64 && c->block_m != 128 && c->block_m != 192 && c->block_m != 256) {
    return fail(GemmError::kInvalidConfig, "block_m = " + std::to_string(c->block_m) +
                                               " is not a built tile height (expected 0, 64 with swap_ab = 1, 128, 192 or 256)");
  }
  if (c->block_m == 64 && (c->swap_ab != 1 || (c->block_n != 0 && !gemm_swap64_width_built(c->block_n)))) {
    return fail(GemmError::kInvalidConfig, "block_m = 64 is built with swapped operands only (swap_ab = 1, got " +
                                               std::to_string(c->swap_ab) + ") and widths 16, 32, 48, 64 (block_n = " +
                                               std::to_string(c->block_n) + ")");
  }
  if (c->swap_ab == 1 && (!plain || c->block_m == 256 || c->block_m == 192 || c->widths_128_256)) {
    return fail(GemmError::kInvalidConfig,
                std::string("swap_ab = 1 needs a plain GEMM (store epilogue, no hooks, no role blocks, 128-row tiles, "
                            "any width); this call has ") +
                    (c->block_m == 256 ? "block_m = 256" : c->block_m == 192 ? "block_m = 192" : c->widths_128_256 ? "widths_128_256" :
                     a.epilogue != kEpilogueStore ? "the atomic-add epilogue" : "hooks or role blocks"));
  }
  if (c->swap_ab == -1 && c->block_n != 0 && !gemm_block_width_built(c->block_n) &&
      (!plain || c->block_m == 256 || c->block_m == 192 || c->widths_128_256)) {
    return fail(GemmError::kInvalidConfig, "block_n = " + std::to_string(c->block_n) +
                                               " is built with swapped operands only, which this call cannot use");
  }
  if (c->block_m == 192 || c->block_m == 256) {
    // 192- and 256-row tiles: plain GEMMs, and the widths built for each height (the same list).
    const std::string height = "block_m = " + std::to_string(c->block_m);
    if (!plain) {
      return fail(GemmError::kInvalidConfig,
                  height + " needs a plain GEMM (store epilogue, no hooks, no role blocks); this call has " +
                      std::string(a.epilogue != kEpilogueStore ? "the atomic-add epilogue" : "hooks or role blocks"));
    }
    static_assert(std::size(kGemmM192Widths) == std::size(kGemmTallWidths));
    if (c->block_n != 0 && !(c->block_m == 192 ? gemm_m192_width_built(c->block_n) : gemm_tall_width_built(c->block_n))) {
      std::string widths;
      for (int w : c->block_m == 192 ? kGemmM192Widths : kGemmTallWidths) widths += (widths.empty() ? "" : ", ") + std::to_string(w);
      return fail(GemmError::kInvalidConfig, "block_n = " + std::to_string(c->block_n) + " is not built with " + height +
                                                 " (expected 0 or one of " + widths + ")");
    }
  }
  // In-cluster split-K: plain GEMMs with swapped operands, 128-row tiles of a width up to 64,
  // clusters of 1 along m, whole tiles.
  if (c->cluster_k != 0 && c->cluster_k != 1 && c->cluster_k != 2 && c->cluster_k != 4 && c->cluster_k != 8) {
    return fail(GemmError::kInvalidConfig, "cluster_k = " + std::to_string(c->cluster_k) + " is not supported (expected 0, 1, 2, 4 or 8)");
  }
  if (c->cluster_k > 1) {
    std::string why;
    if (!plain) {
      why = a.epilogue != kEpilogueStore ? "the atomic-add epilogue" : "hooks or role blocks";
    } else if (c->swap_ab == 0) {
      why = "swap_ab = 0";
    } else if (c->block_m != 0 && c->block_m != 128) {
      why = "block_m = " + std::to_string(c->block_m);
    } else if (c->block_n != 0 && !gemm_swap_cluster_k_width_built(c->block_n)) {
      why = "block_n = " + std::to_string(c->block_n);
    } else if (c->cluster_m == 2) {
      why = "cluster_m = 2";
    } else if (c->num_splits > 1 || c->stream_k == 1 || c->sk_units > 0 || c->dp_tiles >= 0) {
      why = "split-K or stream-K through the workspace";
    } else if (c->widths_128_256) {
      why = "widths_128_256";
    }
    if (!why.empty()) {
      return fail(GemmError::kInvalidConfig, "cluster_k = " + std::to_string(c->cluster_k) +
                                                 " needs a plain GEMM with swapped operands (swap_ab -1 or 1), 128-row tiles "
                                                 "of width 16 to 128 (a multiple of 16), cluster_m 1 and whole tiles; this call has " + why);
    }
  }
  // Pairs along n: plain GEMMs with 128- or 192-row tiles, no pair along m, no in-cluster split-K.
  if (c->cluster_n != 0 && c->cluster_n != 1 && c->cluster_n != 2) {
    return fail(GemmError::kInvalidConfig, "cluster_n = " + std::to_string(c->cluster_n) + " is not supported (expected 0, 1 or 2)");
  }
  // 2 x 2 clusters (cluster_m = cluster_n = 2): the same, with a width of kGemmQuadWidths.
  const bool quads = c->cluster_n == 2 && c->cluster_m == 2;
  if (c->cluster_n == 2) {
    std::string why;
    if (!plain) {
      why = a.epilogue != kEpilogueStore ? "the atomic-add epilogue" : "hooks or role blocks";
    } else if (c->block_m == 64 || c->block_m == 256) {
      why = "block_m = " + std::to_string(c->block_m);
    } else if (quads && c->block_n != 0 && !gemm_quad_width_built(c->block_n)) {
      why = "cluster_m = 2 and block_n = " + std::to_string(c->block_n) + " (2 x 2 clusters are built with widths 128, 192 and 256)";
    } else if (c->cluster_k > 1) {
      why = "cluster_k = " + std::to_string(c->cluster_k);
    } else if (c->widths_128_256) {
      why = "widths_128_256";
    }
    if (!why.empty()) {
      return fail(GemmError::kInvalidConfig, "cluster_n = 2 needs a plain GEMM (store epilogue, no hooks, no role blocks) "
                                             "with 128- or 192-row tiles and cluster_k 0 or 1; this call has " + why);
    }
  }
  if (c->raster < 0) c->raster = kRasterAlongN;
  if (c->group == 0) c->group = 8;
  if (c->raster != kRasterAlongN && c->raster != kRasterAlongM) return fail(GemmError::kInvalidConfig, "raster must be 0 or 1");
  if (c->group < 1) return fail(GemmError::kInvalidConfig, "group must be at least 1");
  if (c->num_splits < 0) return fail(GemmError::kInvalidConfig, "num_splits must be at least 1 (or 0 to choose)");
  if (c->stream_k < -1 || c->stream_k > 1) return fail(GemmError::kInvalidConfig, "stream_k must be -1, 0 or 1");
  if (c->sk_units < 0) return fail(GemmError::kInvalidConfig, "sk_units must not be negative");
  if (c->dp_tiles < -1) return fail(GemmError::kInvalidConfig, "dp_tiles must be -1 (choose) or at least 0");
  if (c->num_role_blocks < 0 || c->num_gemm_blocks < 0) return fail(GemmError::kInvalidConfig, "block counts must not be negative");

  // GEMM blocks per cluster size: all that fit beside the role blocks (rounded to whole
  // clusters), or fewer when the caller asks for fewer.
  GemmScheduleRequest req;
  req.m = a.m;
  req.n = a.n;
  req.k = a.k;
  req.num_sms = dev.num_sms;
  req.role_sms = std::min(c->num_role_blocks, dev.num_sms);
  if (c->quads < -1 || c->quads > 0) {
    return fail(GemmError::kInvalidConfig, "quads = " + std::to_string(c->quads) +
                                               " is not supported (expected -1 to weigh 2 x 2 clusters or 0 for never; "
                                               "cluster_m = cluster_n = 2 asks for them)");
  }
  // 2 x 2 clusters weighed by the rule: plain GEMMs whose cluster shape is left open.
  const bool weigh_quads = plain && !c->widths_128_256 && c->quads != 0 && c->cluster_m == 0 && c->cluster_n != 2 &&
                           c->cluster_k <= 1 && (c->block_m == 0 || c->block_m == 128 || c->block_m == 192);
  for (int cl : {1, 2, 4}) {
    // Clusters of 2 serve pairs along m and pairs along n (only when asked for); clusters of 1
    // neither; clusters of 4 the 2 x 2 ones.
    const bool pairs = c->cluster_m == 2 || c->cluster_n == 2;
    if (cl == 4 ? !(quads || weigh_quads) : quads || (cl == 1 ? pairs : (c->cluster_m == 1 && !pairs))) continue;
    const int roles = static_cast<int>(ceil_div(c->num_role_blocks, cl) * cl);
    const int resident = cl == 4 ? dev.resident_quad : dev.resident[cl];
    int blocks = c->num_gemm_blocks;
    if (blocks == 0 || blocks > resident - roles) blocks = resident - roles;
    blocks -= blocks % cl;
    (cl == 1 ? req.blocks_cluster1 : cl == 2 ? req.blocks_cluster2 : req.blocks_cluster4) = std::max(0, blocks);
  }
  if (req.blocks_cluster1 < 1 && req.blocks_cluster2 < 2 && req.blocks_cluster4 < 4) {
    return fail(GemmError::kInvalidConfig, "num_gemm_blocks must be at least the cluster size (" +
                                               std::to_string(c->num_role_blocks) + " role blocks leave no room)");
  }
  req.block_n = c->block_n;
  req.block_m = c->block_m;
  // 256-row tiles only when asked for: measured beside the 128-row rule they won on a few
  // shapes (6-8%) and lost up to 1.5x on others, and the cost model could not tell which
  // (docs/kernels.md section 7).
  req.allow_tall = false;
  // 192-row tiles: plain GEMMs with more than 128 rows, weighed by the model (fitted: they ran
  // faster than the 128-row rule's choice on a quarter of 672 shapes, up to 1.33x).
  req.allow_m192 = plain && !c->widths_128_256;
  req.widths_128_256 = c->widths_128_256;
  req.deterministic = c->deterministic;
  req.cluster_m = c->cluster_m;
  // Pairs along n: plain GEMMs only (the fused ops' roles and hooks count pairs along m), never
  // beside in-cluster split-K, and only when asked for: weighed by the rule they ran as fast as
  // its choice without them on average (0.997x over the 36 of 304 shapes where the choice
  // changed, 0.69-1.25x), and on seeds not used to set their cost they picked worse
  // (docs/kernels.md section 7, "Pairs along n").
  req.cluster_n = (plain && !c->widths_128_256 && c->cluster_k <= 1 && c->cluster_n == 2) ? 2 : 1;
  req.allow_quads = weigh_quads;
  req.num_splits = c->num_splits;
  req.stream_k = c->stream_k;
  req.sk_units = c->sk_units;
  req.dp_tiles = c->dp_tiles;
  // Swapped operands: plain GEMMs with 128-row tiles only; callers that instantiate the engine
  // with 128 and 256 columns (the fused ops) never get them.
  req.swap_ab = (plain && c->block_m != 256 && c->block_m != 192 && !c->widths_128_256) ? c->swap_ab : 0;
  req.cluster_k = req.swap_ab != 0 ? c->cluster_k : 1;
  if (req.swap_ab != 0 && c->num_gemm_blocks == 0) {
    req.blocks_cluster_k2 = dev.resident_k[1];
    req.blocks_cluster_k4 = dev.resident_k[2];
    req.blocks_cluster_k8 = dev.resident_k[3];
  } else if (req.swap_ab != 0) {
    // Fewer GEMM blocks asked for: whole clusters of each size within them.
    req.blocks_cluster_k2 = std::min(dev.resident_k[1], c->num_gemm_blocks - c->num_gemm_blocks % 2);
    req.blocks_cluster_k4 = std::min(dev.resident_k[2], c->num_gemm_blocks - c->num_gemm_blocks % 4);
    req.blocks_cluster_k8 = std::min(dev.resident_k[3], c->num_gemm_blocks - c->num_gemm_blocks % 8);
  }
  *sched = choose_gemm_schedule(req);
  if (sched->tiles == 0 || sched->num_clusters < 1) {
    return fail(GemmError::kInvalidConfig, "no schedule fits the configuration (block_n " + std::to_string(c->block_n) +
                                               ", block_m " + std::to_string(c->block_m) + ", cluster_m " +
                                               std::to_string(c->cluster_m) + ", cluster_n " + std::to_string(c->cluster_n) +
                                               ", " + std::to_string(c->num_gemm_blocks) + " GEMM blocks asked for, 0 = all)");
  }
  if (c->cluster_k > 1 && sched->cluster_k != c->cluster_k) {
    return fail(GemmError::kInvalidConfig, "cluster_k = " + std::to_string(c->cluster_k) +
                                               ": no cluster of that size fits in the GEMM blocks available (" +
                                               std::to_string(c->num_gemm_blocks) + " asked for, 0 = all)");
  }
  c->cluster_k = sched->cluster_k;
  c->swap_ab = sched->swap_ab ? 1 : 0;
  c->block_n = sched->block_n;
  c->block_m = sched->block_m;
  c->cluster_m = sched->cluster_m;
  c->cluster_n = sched->cluster_n;
  c->num_splits = sched->sk_per_tile != 0 ? static_cast<int>(sched->sk_per_tile) : 1;
  c->stream_k = (sched->sk_units != 0 && sched->sk_per_tile == 0) ? 1 : 0;
  c->sk_units = c->stream_k ? static_cast<int>(sched->sk_units) : 0;
  c->dp_tiles = (c->stream_k || (sched->sk_per_tile != 0 && sched->dp_tiles > 0)) ? static_cast<int>(sched->dp_tiles) : -1;
  c->num_role_blocks = static_cast<int>(ceil_div(c->num_role_blocks, c->cluster_m) * c->cluster_m);
  c->num_gemm_blocks = sched->num_clusters * sched->cluster_ctas();
  return {};
}

// The plan's tensor maps from plan->args (pointers, shape and leading dimensions).
GemmResult encode_maps(GemmPlan* plan) {
  const GemmArgs& a = plan->args;
  const GemmConfig& c = plan->config;
  if (c.swap_ab == 1) {
    // The kernel's A is the weight (boxes of the tile's 64 or 128 rows), its B the activations
    // (the width's rows, or half of them per CTA of a cluster), its output D stored transposed
    // in 16 x 64 boxes (8 x 64 with 64-row tiles, whose consumers own half of the width each).
    // (Pairs along n: each CTA loads half of the kernel's A tile, the weight's rows, for both.)
    GemmResult r = make_tensor_map(&plan->tma_a, a.w, a.n, a.k, a.ldw, static_cast<uint32_t>(c.block_m / c.cluster_n),
                                   kBlockK, "w", c.l2_promotion);
    if (!r.ok()) return r;
    plan->tma_a_local = plan->tma_a;
    r = make_tensor_map(&plan->tma_b, a.a, a.m, a.k, a.lda, static_cast<uint32_t>(c.block_n / c.cluster_m), kBlockK,
                        "a", c.l2_promotion);
    if (!r.ok()) return r;
    return make_tensor_map(&plan->tma_d, a.d, a.m, a.n, a.ldd, c.block_m == 64 ? 8 : 16, 64, "d");
  }
  // Pairs along n: each CTA loads half of the A tile for both.
  GemmResult r =
      make_tensor_map(&plan->tma_a, a.a, a.m, a.k, a.lda, static_cast<uint32_t>(c.block_m / c.cluster_n), kBlockK, "a",
                      c.l2_promotion);
  if (!r.ok()) return r;
  if (a.hooks.a_local != nullptr) {
    r = make_tensor_map(&plan->tma_a_local, a.hooks.a_local, a.hooks.local_rows_end - a.hooks.local_rows_begin, a.k,
                        a.lda, kBlockM, kBlockK, "a_local", c.l2_promotion);
    if (!r.ok()) return r;
  } else {
    plan->tma_a_local = plan->tma_a;
  }
  r = make_tensor_map(&plan->tma_b, a.w, a.n, a.k, a.ldw, static_cast<uint32_t>(c.block_n / c.cluster_m), kBlockK,
                      "w", c.l2_promotion);
  if (!r.ok()) return r;
  // The output as a [m, n] tensor stored in 64 x 64 chunks (see store_tile_tma).
  return make_tensor_map(&plan->tma_d, a.d, a.m, a.n, a.ldd, 64, 64, "d");
}

}  // namespace

GemmResult gemm_plan(const GemmArgs& args, GemmPlan* plan) {
  // ---- arguments --------------------------------------------------------------------------------
  if (args.m < 1) return fail(GemmError::kInvalidM, "m = " + std::to_string(args.m) + " is not supported: it must be at least 1");
  if (args.m > (int64_t{1} << 31) - 1) return fail(GemmError::kInvalidM, "m = " + std::to_string(args.m) + " is too large (at most 2^31 - 1)");
  GemmResult r = check_dim("n", args.n, 8, GemmError::kInvalidN,
                           "rows of the weight and of the output must start on 16-byte boundaries for TMA");
  if (!r.ok()) return r;
  r = check_dim("k", args.k, 8, GemmError::kInvalidK, "rows of A and of the weight must be 16-byte aligned for TMA");
  if (!r.ok()) return r;
  const int64_t lda = args.lda ? args.lda : args.k;
  const int64_t ldw = args.ldw ? args.ldw : args.k;
  const int64_t ldd = args.ldd ? args.ldd : args.n;
  struct {
    const char* name;
    int64_t v, min;
  } lds[] = {{"lda", lda, args.k}, {"ldw", ldw, args.k}, {"ldd", ldd, args.n}};
  for (const auto& ld : lds) {
    if (ld.v < ld.min || ld.v % 8 != 0) {
      return fail(GemmError::kInvalidLeadingDim,
                  std::string(ld.name) + " = " + std::to_string(ld.v) + " is not supported: it must be a multiple of 8 and at least " +
                      std::to_string(ld.min));
    }
  }
  struct {
    const char* name;
    const void* p;
  } ptrs[] = {{"a", args.a}, {"w", args.w}, {"d", args.d}};
  for (const auto& p : ptrs) {
    if (p.p == nullptr || reinterpret_cast<uintptr_t>(p.p) % 16 != 0) {
      return fail(GemmError::kInvalidPointer, std::string("pointer ") + p.name + " is null or not 16-byte aligned");
    }
  }
  if (args.epilogue != kEpilogueStore && args.epilogue != kEpilogueAtomicAdd) {
    return fail(GemmError::kInvalidConfig, "unknown epilogue " + std::to_string(args.epilogue));
  }
  const GemmHooks& h = args.hooks;
  if (h.ready_flags != nullptr && h.ready_rows_per_flag == 0) {
    return fail(GemmError::kInvalidConfig, "ready_rows_per_flag = 0; expected at least 1");
  }
  if (h.ready_shard_rows > 0 && h.ready_rows_per_flag > h.ready_shard_rows) {
    return fail(GemmError::kInvalidConfig, "ready_rows_per_flag = " + std::to_string(h.ready_rows_per_flag) +
                                               " exceeds ready_shard_rows = " + std::to_string(h.ready_shard_rows));
  }
  if (h.a_local != nullptr) {
    if (reinterpret_cast<uintptr_t>(h.a_local) % 16 != 0)
      return fail(GemmError::kInvalidPointer, "pointer a_local is not 16-byte aligned");
    if (h.local_rows_begin < 0 || h.local_rows_end <= h.local_rows_begin || h.local_rows_end > args.m)
      return fail(GemmError::kInvalidConfig, "local rows [" + std::to_string(h.local_rows_begin) + ", " +
                                                 std::to_string(h.local_rows_end) + ") must be a non-empty range inside [0, m = " +
                                                 std::to_string(args.m) + ")");
  }

  DeviceInfo dev;
  r = device_info(&dev);
  if (!r.ok()) return r;
  if (dev.major != 9 || dev.minor != 0) {
    return fail(GemmError::kUnsupportedDevice, "the GEMM needs compute capability 9.0 (Hopper, sm_90a); this device is " +
                                                   std::to_string(dev.major) + "." + std::to_string(dev.minor));
  }

  // ---- configuration ------------------------------------------------------------------------------
  GemmConfig c;
  GemmSchedule sched;
  r = resolve_config(args, dev, &c, &sched);
  if (!r.ok()) return r;
  const int64_t m_blocks = sched.m_blocks;
  const int64_t n_blocks = sched.n_blocks;
  const int64_t k_blocks = sched.k_blocks;
  const int64_t m_groups = ceil_div(m_blocks, c.cluster_m);
  const int64_t k_per_split = ceil_div(k_blocks, c.num_splits);

  // ---- parameters -----------------------------------------------------------------------------------
  GemmParams& p = plan->params;
  p = GemmParams{};
  // Swapped operands: the kernel's problem is n x m (D^T); the stores name D's own layout.
  p.m = static_cast<uint32_t>(c.swap_ab == 1 ? args.n : args.m);
  p.n = static_cast<uint32_t>(c.swap_ab == 1 ? args.m : args.n);
  p.k = static_cast<uint32_t>(args.k);
  p.ldd = static_cast<uint32_t>(ldd);
  p.d = args.d;
  p.num_m_blocks = static_cast<uint32_t>(m_blocks);
  p.num_n_blocks = static_cast<uint32_t>(n_blocks);
  p.num_k_blocks = static_cast<uint32_t>(k_blocks);
  p.num_splits = static_cast<uint32_t>(c.num_splits);
  p.k_blocks_per_split = static_cast<uint32_t>(k_per_split);
  p.raster = static_cast<uint32_t>(c.raster);
  p.group = static_cast<uint32_t>(c.group);
  p.m_group_offset = static_cast<uint32_t>((args.hooks.first_m_block / c.cluster_m) % m_groups);
  p.num_gemm_blocks = static_cast<uint32_t>(c.num_gemm_blocks);
  p.dp_tiles = sched.dp_tiles;
  p.sk_units = sched.sk_units;
  p.sk_per_tile = sched.sk_per_tile;
  p.ready_flags = h.ready_flags;
  p.ready_value = h.ready_value;
  p.ready_value_ptr = h.ready_value_ptr;
  p.ready_rows_per_flag = h.ready_rows_per_flag;
  p.ready_shard_rows = h.ready_shard_rows > 0 ? h.ready_shard_rows : static_cast<uint32_t>(args.m);
  p.ready_chunks_per_shard =
      static_cast<uint32_t>(ceil_div(p.ready_shard_rows, std::max<uint32_t>(1, p.ready_rows_per_flag)));
  p.local_rows_begin = h.a_local != nullptr ? static_cast<uint32_t>(h.local_rows_begin) : 0;
  p.local_rows_end = h.a_local != nullptr ? static_cast<uint32_t>(h.local_rows_end) : 0;
  p.tile_flags = h.tile_flags;
  p.tile_flag_value = h.tile_flag_value;
  p.wait = args.wait;
  p.role_args = h.role_args;
  p.role_ptrs[0] = h.role_ptrs[0];
  p.role_ptrs[1] = h.role_ptrs[1];

  if (sched.sk_units > 0) {
    const size_t need = sched.workspace_bytes();
    if (args.workspace == nullptr || args.workspace_bytes < need) {
      return fail(GemmError::kWorkspaceTooSmall, "the schedule (" + sched.describe() + ") needs a workspace of " +
                                                     std::to_string(need) + " bytes, zeroed once; got " +
                                                     std::to_string(args.workspace_bytes));
    }
    p.split_counters = static_cast<uint32_t*>(args.workspace);
    p.split_workspace = reinterpret_cast<float*>(static_cast<char*>(args.workspace) + sched.counter_bytes());
    p.split_slots = sched.deterministic ? 1u : 0u;
  }

  plan->args = args;
  plan->args.lda = lda;
  plan->args.ldw = ldw;
  plan->args.ldd = ldd;
  plan->config = c;
  plan->schedule = sched;
  plan->num_stages = detail::gemm_stages(c.block_n, c.block_m, c.cluster_k);
  plan->epilogue = args.epilogue;
  return encode_maps(plan);
}

GemmResult gemm_rebind(GemmPlan* plan, const void* a, const void* w, void* d, const void* a_local) {
  struct {
    const char* name;
    const void* p;
  } ptrs[] = {{"a", a}, {"w", w}, {"d", d}};
  for (const auto& p : ptrs) {
    if (p.p == nullptr || reinterpret_cast<uintptr_t>(p.p) % 16 != 0) {
      return fail(GemmError::kInvalidPointer, std::string("pointer ") + p.name + " is null or not 16-byte aligned");
    }
  }
  if ((plan->args.hooks.a_local != nullptr) != (a_local != nullptr) ||
      reinterpret_cast<uintptr_t>(a_local) % 16 != 0) {
    return fail(GemmError::kInvalidPointer, "pointer a_local is not 16-byte aligned, or given to a plan made without "
                                            "one (or missing for a plan made with one)");
  }
  if (a == plan->args.a && w == plan->args.w && d == plan->args.d && a_local == plan->args.hooks.a_local) return {};
  plan->args.a = a;
  plan->args.w = w;
  plan->args.d = d;
  plan->args.hooks.a_local = a_local;
  plan->params.d = d;
  return encode_maps(plan);
}

size_t gemm_workspace_bytes(const GemmArgs& args) {
  if (args.m < 1 || args.n < 1 || args.k < 1) return 0;
  DeviceInfo dev;
  if (!device_info(&dev).ok()) return 0;
  GemmConfig c;
  GemmSchedule sched;
  if (!resolve_config(args, dev, &c, &sched).ok()) return 0;
  return sched.workspace_bytes();
}

uint32_t gemm_num_tiles(const GemmArgs& args) {
  DeviceInfo dev;
  if (args.m < 1 || args.n < 1 || args.k < 1 || !device_info(&dev).ok()) return 0;
  GemmConfig c;
  GemmSchedule sched;
  if (!resolve_config(args, dev, &c, &sched).ok()) return 0;
  return sched.m_blocks * sched.n_blocks;
}

namespace detail {

GemmResult gemm_device_query(int* num_sms, int* major, int* minor) {
  DeviceInfo dev;
  GemmResult r = device_info(&dev);
  if (!r.ok()) return r;
  *num_sms = dev.num_sms;
  *major = dev.major;
  *minor = dev.minor;
  return {};
}

GemmResult gemm_encode_tensor_map(CUtensorMap* map, const void* ptr, int64_t rows, int64_t k, int64_t ld,
                                  uint32_t box_rows, uint32_t box_cols, const char* name, int l2_promotion) {
  return make_tensor_map(map, ptr, rows, k, ld, box_rows, box_cols, name, l2_promotion);
}

}  // namespace detail

GemmResult gemm_launch(const GemmPlan& plan, cudaStream_t stream) {
  if (plan.config.cluster_n == 2 &&
      (plan.config.cluster_m < 1 || plan.config.cluster_m > 2 || plan.config.cluster_k > 1 || plan.config.block_m == 64 ||
       plan.config.block_m == 256 || plan.epilogue != kEpilogueStore ||
       (plan.config.cluster_m == 2 && !gemm_quad_width_built(plan.config.block_n)))) {
    return fail(GemmError::kInvalidConfig, "plan.config.cluster_n = 2 is built with cluster_m 1 (or 2 at widths 128, 192 "
                                           "and 256), cluster_k 1, 128- or 192-row tiles and the store epilogue only");
  }
  if (plan.config.swap_ab == 1 && plan.config.cluster_k > 1) {
    switch (plan.config.block_n) {
      case 128: return detail::launch_swapk_block_n<128>(plan, stream);
      case 112: return detail::launch_swapk_block_n<112>(plan, stream);
      case 96: return detail::launch_swapk_block_n<96>(plan, stream);
      case 80: return detail::launch_swapk_block_n<80>(plan, stream);
      case 64: return detail::launch_swapk_block_n<64>(plan, stream);
      case 48: return detail::launch_swapk_block_n<48>(plan, stream);
      case 32: return detail::launch_swapk_block_n<32>(plan, stream);
      case 16: return detail::launch_swapk_block_n<16>(plan, stream);
      default:
        return fail(GemmError::kInvalidConfig, "plan.config.block_n = " + std::to_string(plan.config.block_n) +
                                                   " is not built with swap_ab = 1 and cluster_k = " +
                                                   std::to_string(plan.config.cluster_k));
    }
  }
  if (plan.config.swap_ab == 1 && plan.config.block_m == 64) {
    switch (plan.config.block_n) {
      case 64: return detail::launch_swap64_block_n<64>(plan, stream);
      case 48: return detail::launch_swap64_block_n<48>(plan, stream);
      case 32: return detail::launch_swap64_block_n<32>(plan, stream);
      case 16: return detail::launch_swap64_block_n<16>(plan, stream);
      default:
        return fail(GemmError::kInvalidConfig, "plan.config.block_n = " + std::to_string(plan.config.block_n) +
                                                   " is not built with swap_ab = 1 and block_m = 64");
    }
  }
  if (plan.config.swap_ab == 1) {
    switch (plan.config.block_n) {
      case 256: return detail::launch_swap_block_n<256>(plan, stream);
      case 224: return detail::launch_swap_block_n<224>(plan, stream);
      case 208: return detail::launch_swap_block_n<208>(plan, stream);
      case 192: return detail::launch_swap_block_n<192>(plan, stream);
      case 176: return detail::launch_swap_block_n<176>(plan, stream);
      case 160: return detail::launch_swap_block_n<160>(plan, stream);
      case 144: return detail::launch_swap_block_n<144>(plan, stream);
      case 128: return detail::launch_swap_block_n<128>(plan, stream);
      case 112: return detail::launch_swap_block_n<112>(plan, stream);
      case 96: return detail::launch_swap_block_n<96>(plan, stream);
      case 80: return detail::launch_swap_block_n<80>(plan, stream);
      case 64: return detail::launch_swap_block_n<64>(plan, stream);
      case 48: return detail::launch_swap_block_n<48>(plan, stream);
      case 32: return detail::launch_swap_block_n<32>(plan, stream);
      case 16: return detail::launch_swap_block_n<16>(plan, stream);
      default:
        return fail(GemmError::kInvalidConfig,
                    "plan.config.block_n = " + std::to_string(plan.config.block_n) + " is not built with swap_ab = 1");
    }
  }
  if (plan.config.block_m == 192) {
    switch (plan.config.block_n) {
      case 192: return detail::launch_m192_block_n<192>(plan, stream);
      case 176: return detail::launch_m192_block_n<176>(plan, stream);
      case 160: return detail::launch_m192_block_n<160>(plan, stream);
      case 144: return detail::launch_m192_block_n<144>(plan, stream);
      case 128: return detail::launch_m192_block_n<128>(plan, stream);
      default:
        return fail(GemmError::kInvalidConfig,
                    "plan.config.block_n = " + std::to_string(plan.config.block_n) + " is not built with block_m = 192");
    }
  }
  if (plan.config.block_m == 256) {
    switch (plan.config.block_n) {
      case 192: return detail::launch_tall_block_n<192>(plan, stream);
      case 176: return detail::launch_tall_block_n<176>(plan, stream);
      case 160: return detail::launch_tall_block_n<160>(plan, stream);
      case 144: return detail::launch_tall_block_n<144>(plan, stream);
      case 128: return detail::launch_tall_block_n<128>(plan, stream);
      default:
        return fail(GemmError::kInvalidConfig,
                    "plan.config.block_n = " + std::to_string(plan.config.block_n) + " is not built with block_m = 256");
    }
  }
  switch (plan.config.block_n) {
    case 256: return detail::launch_block_n<256>(plan, stream);
    case 224: return detail::launch_block_n<224>(plan, stream);
    case 208: return detail::launch_block_n<208>(plan, stream);
    case 192: return detail::launch_block_n<192>(plan, stream);
    case 176: return detail::launch_block_n<176>(plan, stream);
    case 160: return detail::launch_block_n<160>(plan, stream);
    case 144: return detail::launch_block_n<144>(plan, stream);
    case 128: return detail::launch_block_n<128>(plan, stream);
    default:
      return fail(GemmError::kInvalidConfig,
                  "plan.config.block_n = " + std::to_string(plan.config.block_n) + " is not a built tile width");
  }
}
// Every width the rule may choose has a case above.
static_assert([] {
  for (int w : kGemmBlockWidths)
    if (w % 16 != 0 || w < 128 || w > 256) return false;
  return sizeof(kGemmBlockWidths) / sizeof(int) == 8;
}(), "kGemmBlockWidths and gemm_launch's cases disagree");
static_assert([] {
  for (int w : kGemmSwapWidths)
    if (w % 16 != 0 || w < 16 || w > 256 || w == 240) return false;
  return sizeof(kGemmSwapWidths) / sizeof(int) == 15;
}(), "kGemmSwapWidths and gemm_launch's swapped cases disagree");
static_assert([] {
  for (int w : kGemmTallWidths)
    if (w % 16 != 0 || w < 128 || w > 192) return false;
  return sizeof(kGemmTallWidths) / sizeof(int) == 5;
}(), "kGemmTallWidths and gemm_launch's 256-row cases disagree");
static_assert([] {
  for (int w : kGemmM192Widths)
    if (w % 16 != 0 || w < 128 || w > 192) return false;
  return sizeof(kGemmM192Widths) / sizeof(int) == 5;
}(), "kGemmM192Widths and gemm_launch's 192-row cases disagree");

GemmResult gemm_bf16_tn(const GemmArgs& args, cudaStream_t stream) {
  GemmPlan plan;
  GemmResult r = gemm_plan(args, &plan);
  if (!r.ok()) return r;
  return gemm_launch(plan, stream);
}

std::string gemm_config_string(const GemmPlan& plan) {
  const GemmConfig& c = plan.config;
  return (c.swap_ab == 1 ? (c.block_m == 64 ? "T m64 n" : "T n") : c.block_m == 256 ? "m256 n" : c.block_m == 192 ? "m192 n" : "n") + std::to_string(c.block_n) + " c" + std::to_string(c.cluster_m) + (c.cluster_n == 2 ? "x2" : "") +
         (c.cluster_k > 1 ? " k" + std::to_string(c.cluster_k) : "") + " s" + std::to_string(c.num_splits) +
         (c.raster == kRasterAlongN ? " rN" : " rM") + " g" + std::to_string(c.group) + " b" +
         std::to_string(c.num_gemm_blocks) + " " + plan.schedule.describe() +
         (plan.schedule.deterministic && plan.schedule.sk_units > 0 ? " det" : "") +
         (c.l2_promotion != kGemmDefaultL2Promotion ? " pr" + std::to_string(c.l2_promotion) : "");
}

}  // namespace mkernel::kernels
