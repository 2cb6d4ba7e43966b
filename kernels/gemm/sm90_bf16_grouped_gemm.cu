// sm90_bf16_grouped_gemm.cu: argument checks, configuration, parameters and tensor maps of the
// grouped GEMM. No device code here: the kernels are the persistent GEMM's, instantiated with
// grouped traits per BLOCK_N in sm90_bf16_grouped_gemm_n128.cu / _n256.cu (generated).
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <mutex>
#include <string>

#include "common/l2_promotion.h"
#include "gemm/sm90_bf16_gemm_dispatch.h"
#include "gemm/sm90_bf16_grouped_gemm.h"

namespace mkernel::kernels {

namespace {

constexpr int kBlockM = 128;
constexpr int kBlockK = 64;
constexpr int kMaxDevices = 64;

GemmResult fail(GemmError code, std::string message) { return GemmResult{code, std::move(message)}; }

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// GEMM blocks of a grouped instantiation that can be resident at once, per device, tile width
// (index 0: 128, 1: 256) and cluster size (index 1, 2); 0 = not asked yet.
int resident_blocks(int device, int num_sms, int block_n, int cluster_m) {
  static std::mutex mu;
  static int cache[kMaxDevices][2][3] = {};
  const int w = block_n == 256 ? 1 : 0;
  std::lock_guard<std::mutex> lock(mu);
  if (device >= 0 && device < kMaxDevices && cache[device][w][cluster_m] > 0) return cache[device][w][cluster_m];
  const int r = block_n == 256 ? detail::max_resident_grouped_block_n<256>(cluster_m, num_sms)
                               : detail::max_resident_grouped_block_n<128>(cluster_m, num_sms);
  if (device >= 0 && device < kMaxDevices) cache[device][w][cluster_m] = r;
  return r;
}

// The tile width: 256 unless its last column of tiles wastes more than a third of the padded
// width and 128 wastes less (the dense engine's measurement: 128-wide tiles pull twice the bytes
// per flop, so they pay only against a large waste). n = 2048 and 7168 take 256.
int choose_block_n(int64_t n) {
  const int64_t pad256 = ceil_div(n, 256) * 256, pad128 = ceil_div(n, 128) * 128;
  return ((pad256 - n) * 3 > pad256 && pad128 < pad256) ? 128 : 256;
}

// The cluster size, from the bounds only (the counts are not known here). Expected m blocks
// B = capacity / 128 + G / 2 (a group's last m block is half full on average), of which about
// G / 2 are the odd last m block of a group. With clusters of 2 the paired m blocks share
// (multicast) each weight tile and run a k block faster (per CTA, all SMs busy, the dense
// engine's calibration: 0.835 vs 1.0 us with 256-wide tiles, 0.535 vs 0.56 us with 128-wide
// ones); the odd last m blocks run as split tiles at the speed of clusters of 1, and with an odd
// n block count each pads one CTA for one tile (map note 1). Take 2 when its cost is lower; with
// an even n block count (n = 2048, 7168) that is always.
int choose_cluster(int64_t capacity, int64_t groups, int64_t n_blocks, int block_n) {
  const double t1 = block_n == 256 ? 1.0 : 0.56;
  const double t2 = block_n == 256 ? 0.835 : 0.535;
  const double odd = 0.5 * static_cast<double>(groups);
  const double b = static_cast<double>(capacity) / kBlockM + odd;
  const double nb = static_cast<double>(n_blocks);
  const double cost1 = t1 * b * nb;
  const double cost2 = t2 * (b - odd) * nb + t1 * odd * (nb + static_cast<double>(n_blocks % 2));
  return cost2 < cost1 ? 2 : 1;
}

GemmResult resolve(const GroupedGemmArgs& a, int device, int num_sms, GroupedGemmConfig* c) {
  *c = a.config;
  if (c->block_n != 0 && c->block_n != 128 && c->block_n != 256)
    return fail(GemmError::kInvalidConfig,
                "config.block_n = " + std::to_string(c->block_n) + "; expected 0, 128 or 256");
  if (c->cluster_m != 0 && c->cluster_m != 1 && c->cluster_m != 2)
    return fail(GemmError::kInvalidConfig,
                "config.cluster_m = " + std::to_string(c->cluster_m) + "; expected 0, 1 or 2");
  if (c->raster < -1 || c->raster > 1)
    return fail(GemmError::kInvalidConfig, "config.raster = " + std::to_string(c->raster) + "; expected -1, 0 or 1");
  if (c->band < 0)
    return fail(GemmError::kInvalidConfig, "config.band = " + std::to_string(c->band) + "; expected 0 or more");
  if (!l2_promotion_valid(c->l2_promotion))
    return fail(GemmError::kInvalidConfig,
                "config.l2_promotion = " + std::to_string(c->l2_promotion) + "; " + kL2PromotionExpected);
  if (c->num_gemm_blocks < 0 || c->num_role_blocks < 0)
    return fail(GemmError::kInvalidConfig, "config.num_gemm_blocks = " + std::to_string(c->num_gemm_blocks) +
                                               ", num_role_blocks = " + std::to_string(c->num_role_blocks) +
                                               "; expected 0 or more");
  if (c->block_n == 0) c->block_n = choose_block_n(a.n);
  if (c->cluster_m == 0) c->cluster_m = choose_cluster(a.capacity, a.num_groups, ceil_div(a.n, c->block_n), c->block_n);
  if (c->raster < 0) c->raster = kRasterAlongN;
  if (c->band == 0) c->band = 8;
  if (c->l2_promotion == -1) c->l2_promotion = kGemmDefaultL2Promotion;
  c->num_role_blocks = static_cast<int>(ceil_div(c->num_role_blocks, c->cluster_m) * c->cluster_m);
  const int resident = resident_blocks(device, num_sms, c->block_n, c->cluster_m);
  int blocks = c->num_gemm_blocks;
  if (blocks == 0 || blocks > resident - c->num_role_blocks) blocks = resident - c->num_role_blocks;
  blocks -= blocks % c->cluster_m;
  if (blocks < c->cluster_m) {
    return fail(GemmError::kInvalidConfig, "config.num_role_blocks = " + std::to_string(c->num_role_blocks) +
                                               " leaves no GEMM block (" + std::to_string(resident) +
                                               " resident); expected fewer role blocks");
  }
  c->num_gemm_blocks = blocks;
  return {};
}

GemmResult encode_maps(GroupedGemmPlan* plan) {
  const GroupedGemmArgs& a = plan->args;
  const GroupedGemmConfig& c = plan->config;
  GemmPlan& e = plan->engine;
  GemmResult r = detail::gemm_encode_tensor_map(&e.tma_a, a.a, a.capacity, a.k, a.k, kBlockM, kBlockK, "a",
                                                 c.l2_promotion);
  if (!r.ok()) return r;
  e.tma_a_local = e.tma_a;
  // Every group's weight in one [num_groups * n, k] map: group g's rows start at g * n. The last
  // n block of a group may read the next group's first rows when n is not a multiple of the
  // tile; those columns are past n and never stored.
  r = detail::gemm_encode_tensor_map(&e.tma_b, a.w, a.num_groups * a.n, a.k, a.k,
                                     static_cast<uint32_t>(c.block_n / c.cluster_m), kBlockK, "w", c.l2_promotion);
  if (!r.ok()) return r;
  return detail::gemm_encode_tensor_map(&e.tma_d, a.d, a.capacity, a.n, a.n, 64, 64, "d");
}

GemmResult check_pointers(const void* a, const void* w, const void* d, const uint32_t* offsets) {
  struct {
    const char* name;
    const void* p;
  } ptrs[] = {{"a", a}, {"w", w}, {"d", d}};
  for (const auto& p : ptrs) {
    if (p.p == nullptr || reinterpret_cast<uintptr_t>(p.p) % 16 != 0) {
      return fail(GemmError::kInvalidPointer, std::string("pointer ") + p.name + " = " +
                                                  std::to_string(reinterpret_cast<uintptr_t>(p.p)) +
                                                  " is not supported: expected non-null and 16-byte aligned");
    }
  }
  if (offsets == nullptr || reinterpret_cast<uintptr_t>(offsets) % 4 != 0) {
    return fail(GemmError::kInvalidPointer,
                "pointer offsets = " + std::to_string(reinterpret_cast<uintptr_t>(offsets)) +
                    " is not supported: expected non-null and 4-byte aligned (device memory, "
                    "num_groups + 1 entries)");
  }
  return {};
}

}  // namespace

GemmResult grouped_gemm_plan(const GroupedGemmArgs& args, GroupedGemmPlan* plan) {
  // ---- arguments ------------------------------------------------------------------------------
  const int block_n_for_bounds = args.config.block_n == 128 ? 128 : (args.config.block_n == 256 ? 256 : 128);
  const std::string bounds = grouped_bounds_error(args.capacity, args.num_groups, args.n, args.k, block_n_for_bounds);
  if (!bounds.empty()) {
    GemmError code = GemmError::kInvalidGroups;
    if (bounds.rfind("n = ", 0) == 0) code = GemmError::kInvalidN;
    if (bounds.rfind("k = ", 0) == 0) code = GemmError::kInvalidK;
    return fail(code, bounds);
  }
  GemmResult r = check_pointers(args.a, args.w, args.d, args.offsets);
  if (!r.ok()) return r;
  const GroupedGemmHooks& h = args.hooks;
  if (h.ready_flags != nullptr && h.ready_rows_per_flag == 0) {
    return fail(GemmError::kInvalidConfig, "hooks.ready_rows_per_flag = 0; expected at least 1");
  }
  for (const auto& [name, ptr] : {std::pair<const char*, const void*>{"hooks.group_ready", h.group_ready},
                                  {"hooks.ready_flags", h.ready_flags},
                                  {"hooks.tile_flags", h.tile_flags},
                                  {"hooks.mblock_flags", h.mblock_flags},
                                  {"hooks.mblock_counts", h.mblock_counts}}) {
    if (reinterpret_cast<uintptr_t>(ptr) % 8 != 0) {
      return fail(GemmError::kInvalidPointer, std::string(name) + " = " +
                                                  std::to_string(reinterpret_cast<uintptr_t>(ptr)) +
                                                  " is not supported: expected null or 8-byte aligned (uint64 flags)");
    }
  }

  if ((h.mblock_flags != nullptr) != (h.mblock_counts != nullptr) ||
      (h.mblock_flags != nullptr && h.tile_flags == nullptr)) {
    return fail(GemmError::kInvalidConfig,
                std::string("hooks.mblock_flags is ") + (h.mblock_flags ? "set" : "null") + ", hooks.mblock_counts " +
                    (h.mblock_counts ? "set" : "null") + ", hooks.tile_flags " + (h.tile_flags ? "set" : "null") +
                    "; expected the first two both null, or all three set");
  }

  int num_sms = 0, major = 0, minor = 0, device = 0;
  r = detail::gemm_device_query(&num_sms, &major, &minor);
  if (!r.ok()) return r;
  if (major != 9 || minor != 0) {
    return fail(GemmError::kUnsupportedDevice,
                "the grouped GEMM needs compute capability 9.0 (Hopper, sm_90a); this "
                "device is " +
                    std::to_string(major) + "." + std::to_string(minor));
  }
  if (cudaGetDevice(&device) != cudaSuccess) return fail(GemmError::kCudaError, "cudaGetDevice failed");

  // ---- configuration --------------------------------------------------------------------------
  GroupedGemmConfig c;
  r = resolve(args, device, num_sms, &c);
  if (!r.ok()) return r;
  const std::string tiles = grouped_bounds_error(args.capacity, args.num_groups, args.n, args.k, c.block_n);
  if (!tiles.empty()) return fail(GemmError::kInvalidGroups, tiles);

  // ---- the engine's parameters ----------------------------------------------------------------
  GemmPlan& e = plan->engine;
  e = GemmPlan{};
  const int64_t n_blocks = ceil_div(args.n, c.block_n);
  const int64_t k_blocks = ceil_div(args.k, kBlockK);
  GemmParams& p = e.params;
  p = GemmParams{};
  p.m = static_cast<uint32_t>(args.capacity);
  p.n = static_cast<uint32_t>(args.n);
  p.k = static_cast<uint32_t>(args.k);
  p.ldd = static_cast<uint32_t>(args.n);
  p.d = args.d;
  p.num_m_blocks = 0;  // grouped: per group, from the offsets
  p.num_n_blocks = static_cast<uint32_t>(n_blocks);
  p.num_k_blocks = static_cast<uint32_t>(k_blocks);
  p.num_splits = 1;
  p.k_blocks_per_split = static_cast<uint32_t>(k_blocks);
  p.raster = static_cast<uint32_t>(c.raster);
  p.group = static_cast<uint32_t>(c.band);
  p.num_gemm_blocks = static_cast<uint32_t>(c.num_gemm_blocks);
  p.ready_flags = h.ready_flags;
  p.ready_value = h.ready_value;
  p.ready_value_ptr = h.ready_value_ptr;
  p.ready_rows_per_flag = h.ready_rows_per_flag;
  p.ready_shard_rows = static_cast<uint32_t>(args.capacity);
  p.ready_chunks_per_shard =
      static_cast<uint32_t>(ceil_div(args.capacity, std::max<uint32_t>(1, h.ready_rows_per_flag)));
  p.tile_flags = h.tile_flags;
  p.tile_flag_value = h.tile_flag_value;
  p.mblock_flags = h.mblock_flags;
  p.mblock_counts = h.mblock_counts;
  p.wait = args.wait;
  p.role_args = h.role_args;
  p.role_ptrs[0] = h.role_ptrs[0];
  p.role_ptrs[1] = h.role_ptrs[1];
  const uint32_t per_chunk = grouped_groups_per_chunk(static_cast<uint32_t>(args.num_groups));
  p.grouped = GroupedMapParams{args.offsets,
                               static_cast<uint32_t>(args.num_groups),
                               static_cast<uint32_t>(args.capacity),
                               static_cast<uint32_t>(n_blocks),
                               static_cast<uint32_t>(c.raster),
                               static_cast<uint32_t>(c.band),
                               per_chunk,
                               static_cast<uint32_t>(ceil_div(args.num_groups, per_chunk)),
                               0u};
  p.group_ready_flags = h.group_ready;

  // The engine's view of the launch (what launch_sm90_bf16_gemm reads: block counts, cluster).
  e.args.a = args.a;
  e.args.w = args.w;
  e.args.d = args.d;
  e.args.m = args.capacity;
  e.args.n = args.n;
  e.args.k = args.k;
  e.args.lda = args.k;
  e.args.ldw = args.k;
  e.args.ldd = args.n;
  e.args.wait = args.wait;
  e.config.block_n = c.block_n;
  e.config.cluster_m = c.cluster_m;
  e.config.num_splits = 1;
  e.config.raster = c.raster;
  e.config.group = c.band;
  e.config.num_gemm_blocks = c.num_gemm_blocks;
  e.config.num_role_blocks = c.num_role_blocks;
  e.config.stream_k = 0;
  e.config.sk_units = 0;
  e.config.dp_tiles = -1;
  e.num_stages = detail::gemm_stages_for_block_n(c.block_n);
  e.epilogue = kEpilogueStore;

  plan->args = args;
  plan->config = c;
  return encode_maps(plan);
}

GemmResult grouped_gemm_launch(const GroupedGemmPlan& plan, cudaStream_t stream) {
  return plan.config.block_n == 256 ? detail::launch_grouped_block_n<256>(plan.engine, stream)
                                    : detail::launch_grouped_block_n<128>(plan.engine, stream);
}

GemmResult grouped_gemm_bf16_tn(const GroupedGemmArgs& args, cudaStream_t stream) {
  GroupedGemmPlan plan;
  GemmResult r = grouped_gemm_plan(args, &plan);
  if (!r.ok()) return r;
  return grouped_gemm_launch(plan, stream);
}

GemmResult grouped_gemm_rebind(GroupedGemmPlan* plan, const void* a, const void* w, void* d, const uint32_t* offsets) {
  GemmResult r = check_pointers(a, w, d, offsets);
  if (!r.ok()) return r;
  plan->args.a = a;
  plan->args.w = w;
  plan->args.d = d;
  plan->args.offsets = offsets;
  plan->engine.args.a = a;
  plan->engine.args.w = w;
  plan->engine.args.d = d;
  plan->engine.params.d = d;
  plan->engine.params.grouped.offsets = offsets;
  return encode_maps(plan);
}

uint64_t grouped_gemm_num_tile_flags(const GroupedGemmArgs& args) {
  int block_n = args.config.block_n;
  if (block_n == 0) block_n = choose_block_n(args.n);
  if (block_n != 128 && block_n != 256) return 0;
  if (!grouped_bounds_error(args.capacity, args.num_groups, args.n, args.k, block_n).empty()) return 0;
  return grouped_max_m_blocks(static_cast<uint64_t>(args.capacity), static_cast<uint64_t>(args.num_groups)) *
         static_cast<uint64_t>(ceil_div(args.n, block_n));
}

uint64_t grouped_gemm_num_mblock_flags(const GroupedGemmArgs& args) {
  int block_n = args.config.block_n;
  if (block_n == 0) block_n = choose_block_n(args.n);
  if (block_n != 128 && block_n != 256) return 0;
  if (!grouped_bounds_error(args.capacity, args.num_groups, args.n, args.k, block_n).empty()) return 0;
  return grouped_max_m_blocks(static_cast<uint64_t>(args.capacity), static_cast<uint64_t>(args.num_groups));
}

GemmResult grouped_gemm_check_offsets(const uint32_t* host_offsets, int64_t num_groups, int64_t capacity) {
  if (num_groups < 1)
    return fail(GemmError::kInvalidGroups, "num_groups = " + std::to_string(num_groups) + "; expected at least 1");
  const std::string e = grouped_offsets_error(host_offsets, num_groups, capacity);
  if (!e.empty()) return fail(GemmError::kInvalidGroups, e);
  return {};
}

std::string grouped_gemm_config_string(const GroupedGemmPlan& plan) {
  const GroupedGemmConfig& c = plan.config;
  return "grouped n" + std::to_string(c.block_n) + " c" + std::to_string(c.cluster_m) +
         (c.raster == kRasterAlongN ? " rN" : " rM") + " b" + std::to_string(c.band) + " blocks" +
         std::to_string(c.num_gemm_blocks) + " G" + std::to_string(plan.args.num_groups) + " cap" +
         std::to_string(plan.args.capacity) +
         (c.l2_promotion != kGemmDefaultL2Promotion ? " pr" + std::to_string(c.l2_promotion) : "");
}

}  // namespace mkernel::kernels
