// gemm_model_eval.cc: the GEMM cost model (sm90_bf16_gemm_schedule.h) evaluated on measured
// configurations, for fitting its costs to benchmark records (bench/gemm/fit_cost_model.py).
//
//   gemm_model_eval [name=value ...] < lines
//
// Each input line is "M N K CONFIG" with CONFIG as gemm_bench records it (for example
// "T n160 c2 s1 rN g8 b132 sk66/78t"); each output line is the model's predicted time in
// microseconds for that configuration on a 132-SM H200, or "nan" for a line it cannot read
// (printed with the reason on stderr). With --choose, each input line is "M N K" and the output
// is the configuration the rule chooses and its prediction (--allow-m192: 192-row tiles too, as
// the library allows them for plain GEMMs; --allow-quads: 2 x 2 clusters too). name=value overrides one cost of the model (names as
// in GemmCostModel / GemmCostRegime, a regime's field prefixed with "small_m." or "general."); an
// unknown name is refused.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <sstream>
#include <string>

#include "gemm/sm90_bf16_gemm_schedule.h"

namespace mk = mkernel::kernels;

namespace {

std::map<std::string, double*> cost_fields(mk::GemmCostModel& m) {
  std::map<std::string, double*> f;
  f["masked_tail_tile_us"] = &m.masked_tail_tile_us;
  f["tall_cost_factor"] = &m.tall_cost_factor;
  f["det_part_us_small_m"] = &m.det_part_us_small_m;
  f["det_part_us"] = &m.det_part_us;
  f["cluster_partial_penalty"] = &m.cluster_partial_penalty;
  f["cluster_fade_busy"] = &m.cluster_fade_busy;
  f["cluster_full_busy"] = &m.cluster_full_busy;
  f["swap_margin"] = &m.swap_margin;
  f["swap_margin_small_m"] = &m.swap_margin_small_m;
  f["half_rows_cost_factor"] = &m.half_rows_cost_factor;
  f["narrow_iter_floor"] = &m.narrow_iter_floor;
  f["m192_cost_factor"] = &m.m192_cost_factor;
  f["m192_tile_factor"] = &m.m192_tile_factor;
  f["m192_c2_factor"] = &m.m192_c2_factor;
  f["pair_n_factor"] = &m.pair_n_factor;
  f["quad_factor"] = &m.quad_factor;
  f["quad_launch_us"] = &m.quad_launch_us;
  for (auto [prefix, r] : {std::pair<const char*, mk::GemmCostRegime*>{"small_m.", &m.small_m},
                           std::pair<const char*, mk::GemmCostRegime*>{"general.", &m.general}}) {
    const std::string p = prefix;
    f[p + "launch_us"] = &r->launch_us;
    f[p + "iter_us_n256_c2"] = &r->iter_us_n256_c2;
    f[p + "iter_us_n256_c1"] = &r->iter_us_n256_c1;
    f[p + "iter_us_n128_c2"] = &r->iter_us_n128_c2;
    f[p + "iter_us_n128_c1"] = &r->iter_us_n128_c1;
    f[p + "concurrency"] = &r->concurrency;
    f[p + "tile_us_n256"] = &r->tile_us_n256;
    f[p + "tile_us_n128"] = &r->tile_us_n128;
    f[p + "fixup_latency_us"] = &r->fixup_latency_us;
    f[p + "sum_latency_us"] = &r->sum_latency_us;
    f[p + "partial_bytes_per_us"] = &r->partial_bytes_per_us;
    f[p + "dram_bytes_per_us"] = &r->dram_bytes_per_us;
    f[p + "cta_bytes_per_us"] = &r->cta_bytes_per_us;
    f[p + "sk_iter_factor"] = &r->sk_iter_factor;
    f[p + "sk_item_us"] = &r->sk_item_us;
    f[p + "cluster2_launch_us"] = &r->cluster2_launch_us;
    f[p + "clusterk_launch_us"] = &r->clusterk_launch_us;
    f[p + "clusterk_wide"] = &r->clusterk_wide;
    f[p + "clusterk_reduce_us"] = &r->clusterk_reduce_us;
  }
  return f;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The schedule a recorded configuration string describes, predicted with `model`.
bool predict_config(const mk::GemmCostModel& model, int64_t m, int64_t n, int64_t k, const std::string& config,
                    double* out, std::string* why) {
  std::istringstream in(config);
  std::string tok;
  bool swap = false;
  mk::GemmSchedule s;
  int blocks = 0;
  bool have_decomp = false;
  while (in >> tok) {
    if (tok == "T") {
      swap = true;
    } else if (tok == "m64") {
      s.block_m = 64;
    } else if (tok == "m256") {
      s.block_m = 256;
    } else if (tok == "m192") {
      s.block_m = 192;
    } else if (tok[0] == 'n' && tok.size() > 1 && std::isdigit(static_cast<unsigned char>(tok[1]))) {
      s.block_n = std::atoi(tok.c_str() + 1);
    } else if (tok[0] == 'c' && tok.size() > 1 && std::isdigit(static_cast<unsigned char>(tok[1]))) {
      s.cluster_m = std::atoi(tok.c_str() + 1);
      // "c1x2": a pair along n
      const auto x = tok.find('x');
      if (x != std::string::npos) s.cluster_n = std::atoi(tok.c_str() + x + 1);
    } else if (tok[0] == 'k' && tok.size() > 1 && std::isdigit(static_cast<unsigned char>(tok[1]))) {
      s.cluster_k = std::atoi(tok.c_str() + 1);
    } else if (tok[0] == 'b' && tok.size() > 1 && std::isdigit(static_cast<unsigned char>(tok[1]))) {
      blocks = std::atoi(tok.c_str() + 1);
    } else if (tok == "det") {
      s.deterministic = true;
    } else if (tok == "dp" || tok.rfind("splitk", 0) == 0 || tok.rfind("sk", 0) == 0) {
      have_decomp = true;
      // filled below, once the tile counts are known
      s.sk_units = 0;
      s.sk_per_tile = 0;
      if (tok.rfind("splitk", 0) == 0) {
        s.sk_per_tile = static_cast<uint32_t>(std::atoi(tok.c_str() + 6));
        const auto slash = tok.find('/');
        s.dp_tiles = slash == std::string::npos ? 0 : static_cast<uint32_t>(std::atoi(tok.c_str() + slash + 1));  // split tiles for now
      } else if (tok.rfind("sk", 0) == 0) {
        const auto slash = tok.find('/');
        if (slash == std::string::npos) {
          *why = "stream-K token '" + tok + "' has no /tiles";
          return false;
        }
        s.sk_units = static_cast<uint32_t>(std::atoi(tok.c_str() + 2));
        s.dp_tiles = static_cast<uint32_t>(std::atoi(tok.c_str() + slash + 1));  // sk tiles for now
      }
    }
  }
  if (!have_decomp || blocks <= 0 || s.block_n <= 0 || (s.cluster_m != 1 && s.cluster_m != 2) ||
      (s.cluster_n != 1 && s.cluster_n != 2) ||
      (s.cluster_k != 1 && s.cluster_k != 2 && s.cluster_k != 4 && s.cluster_k != 8)) {
    *why = "configuration '" + config + "' lacks a width, cluster, block count or decomposition";
    return false;
  }
  const int64_t pm = swap ? n : m, pn = swap ? m : n;
  s.swap_ab = swap;
  s.num_clusters = blocks / s.cluster_ctas();
  s.m_blocks = static_cast<uint32_t>(ceil_div(pm, s.block_m));
  s.n_blocks = static_cast<uint32_t>(ceil_div(pn, s.block_n));
  s.k_blocks = static_cast<uint32_t>(ceil_div(k, 64));
  s.tiles = static_cast<uint32_t>(ceil_div(s.m_blocks, s.cluster_m) * s.n_groups());
  if (s.sk_per_tile > 0) {
    const uint32_t split_tiles = s.dp_tiles == 0 ? s.tiles : s.dp_tiles;
    if (split_tiles > s.tiles) {
      *why = "configuration '" + config + "' names more split tiles than the problem has";
      return false;
    }
    s.dp_tiles = s.tiles - split_tiles;
    s.sk_units = split_tiles * s.sk_per_tile;
  } else if (s.sk_units > 0) {
    const uint32_t sk_tiles = s.dp_tiles;
    if (sk_tiles > s.tiles) {
      *why = "configuration '" + config + "' names more stream-K tiles than the problem has";
      return false;
    }
    s.dp_tiles = s.tiles - sk_tiles;
  } else {
    s.dp_tiles = s.tiles;
  }
  mk::schedule_detail::predict(model, pm, pn, k, 132, &s, 0, swap ? m : 0);
  *out = s.predicted_us;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  mk::GemmCostModel model;
  auto fields = cost_fields(model);
  bool choose = false, allow_m192 = false, allow_quads = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--choose") {
      choose = true;
      continue;
    }
    if (a == "--allow-m192") {
      allow_m192 = true;
      continue;
    }
    if (a == "--allow-quads") {
      allow_quads = true;
      continue;
    }
    const auto eq = a.find('=');
    if (eq == std::string::npos || !fields.count(a.substr(0, eq))) {
      std::fprintf(stderr, "gemm_model_eval: argument '%s' is not name=value with a cost of the model\n", a.c_str());
      return 2;
    }
    char* end = nullptr;
    const double v = std::strtod(a.c_str() + eq + 1, &end);
    if (end == a.c_str() + eq + 1 || *end != '\0' || !std::isfinite(v)) {
      std::fprintf(stderr, "gemm_model_eval: value of '%s' is not a finite number\n", a.c_str());
      return 2;
    }
    *fields[a.substr(0, eq)] = v;
  }
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    int64_t m = 0, n = 0, k = 0;
    if (!(in >> m >> n >> k) || m <= 0 || n <= 0 || k <= 0) {
      std::fprintf(stderr, "gemm_model_eval: line '%s' does not start with M N K\n", line.c_str());
      std::printf("nan\n");
      continue;
    }
    if (choose) {
      mk::GemmScheduleRequest r;
      r.m = m;
      r.n = n;
      r.k = k;
      r.blocks_cluster1 = 132;
      r.blocks_cluster2 = 132;
      // Clusters of 4 and 8 as the H200 runs them (clusters stay inside a GPC).
      r.blocks_cluster_k2 = 132;
      r.blocks_cluster_k4 = 132;
      r.blocks_cluster_k8 = 128;
      r.swap_ab = -1;
      r.allow_m192 = allow_m192;
      r.allow_quads = allow_quads;
      r.blocks_cluster4 = 120;  // 30 clusters of 4 on the H200
      const mk::GemmSchedule s = mk::choose_gemm_schedule(r, model);
      std::printf("%s%s n%d c%d%s%s b%d %s %.3f\n", s.swap_ab ? "T " : "", s.block_m == 64 ? "m64 " : s.block_m == 256 ? "m256 " : s.block_m == 192 ? "m192 " : "",
                  s.block_n, s.cluster_m, s.cluster_n == 2 ? "x2" : "", s.cluster_k > 1 ? (" k" + std::to_string(s.cluster_k)).c_str() : "",
                  s.num_clusters * s.cluster_ctas(), s.describe().c_str(), s.predicted_us);
      continue;
    }
    std::string config;
    std::getline(in, config);
    double t = 0;
    std::string why;
    if (!predict_config(model, m, n, k, config, &t, &why)) {
      std::fprintf(stderr, "gemm_model_eval: %s\n", why.c_str());
      std::printf("nan\n");
    } else {
      std::printf("%.4f\n", t);
    }
  }
  return 0;
}
