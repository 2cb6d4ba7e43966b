// moe: a complete MoE dispatch + experts + combine example. Expert parallelism over the ranks:
// every rank holds `tokens` tokens of `hidden` bf16 and routes each to `top_k` of `experts`
// experts (experts / world per rank). dispatch hands each rank the rows of its experts; the
// "experts" here scale their rows (expert e by 1 + (e mod 7) / 8, standing in for an MLP or a
// grouped GEMM); combine returns every token's score-weighted sum over its experts to its home.
// Then the same routing through a real expert layer, MoeMlp: dispatch, each expert's w1 (gate and
// up), SwiGLU, its w2, combine, with one token's output checked against the host.
//
// Launched by torchrun (or any launcher that sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
// MASTER_PORT) with MKERNEL_TOKEN set to the same secret on every rank:
//   MKERNEL_TOKEN=$(openssl rand -hex 16) torchrun --nproc-per-node 2 ./mkernel-moe 4096 7168 256 8 2048
// (arguments: tokens per rank, hidden, experts, top_k, the MLP's intermediate size; 0 skips the MLP).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "mkernel/runtime/ops.h"
#include "mkernel/runtime/runtime.h"

namespace rt = mkernel::rt;

// Deterministic values from (seed, index).
__device__ __host__ inline uint32_t mix(uint64_t i, uint32_t seed) {
  uint32_t x = static_cast<uint32_t>(i) * 2654435761u ^ seed * 0x9E3779B9u;
  x ^= x >> 15;
  x *= 0x2C1B3C6Du;
  return x ^ (x >> 12);
}
__device__ __host__ inline float value(uint64_t i, uint32_t seed, float scale) {
  return (static_cast<float>(mix(i, seed) % 2001) / 1000.0f - 1.0f) * scale;
}
__global__ void fill(__nv_bfloat16* p, uint64_t n, uint32_t seed, float scale = 1.0f) {
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < n; i += uint64_t{gridDim.x} * blockDim.x)
    p[i] = __float2bfloat16(value(i, seed, scale));
}
// The stand-in experts: y = x * (1 + (e mod 7) / 8) for the rows of each local expert.
__global__ void experts(const __nv_bfloat16* x, __nv_bfloat16* y, const uint32_t* offsets, uint32_t epr,
                        uint32_t first, uint32_t hidden) {
  for (uint32_t e = 0; e < epr; ++e) {
    const float w = 1.0f + static_cast<float>((first + e) % 7) / 8.0f;
    const uint64_t r0 = offsets[e], n = (offsets[e + 1] - r0) * hidden;
    for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < n; i += uint64_t{gridDim.x} * blockDim.x)
      y[r0 * hidden + i] = __float2bfloat16(__bfloat162float(x[r0 * hidden + i]) * w);
  }
}

int main(int argc, char** argv) {
  const uint64_t tokens = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 4096;
  const uint64_t hidden = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 7168;
  const uint32_t experts_n = argc > 3 ? static_cast<uint32_t>(std::strtoul(argv[3], nullptr, 10)) : 256;
  const uint32_t top_k = argc > 4 ? static_cast<uint32_t>(std::strtoul(argv[4], nullptr, 10)) : 8;
  const uint64_t inter = argc > 5 ? std::strtoull(argv[5], nullptr, 10) : 2048;
  const char* world_env = std::getenv("WORLD_SIZE");
  const uint32_t world = world_env != nullptr ? static_cast<uint32_t>(std::atoi(world_env)) : 1;

  // The workspace: token and partial regions in the NVLink buffer (sized for one node of `world`
  // GPUs) and, across nodes, slots in the network workspace (sized for `world` nodes).
  rt::Options options;
  options.nvlink_bytes =
      std::max<uint64_t>(1 << 20, rt::moe_nvlink_bytes(1, world, tokens, hidden, hidden, experts_n, top_k));
  options.network_workspace_bytes = rt::moe_network_bytes(world, 1, tokens, hidden, hidden, experts_n, top_k);
  options.fused_flags = std::max<uint32_t>(65536, rt::moe_fused_flags(world, 1, tokens, experts_n, top_k));
  auto comm = rt::Communicator::create_from_env({4096}, options);
  if (!comm.ok()) return std::fprintf(stderr, "create: %s\n", comm.status().to_string().c_str()), 1;
  rt::Communicator& c = *comm.value();
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);

  // Collective: every rank plans the same shape (they check it with each other).
  auto made = rt::MoeDispatchCombine::create(c, tokens, hidden, hidden, experts_n, top_k, {}, stream);
  if (!made.ok()) return std::fprintf(stderr, "rank %u: %s\n", c.rank(), made.status().to_string().c_str()), 1;
  rt::MoeDispatchCombine& moe = *made.value();
  std::printf("rank %u: %s\n", c.rank(), moe.describe().c_str());
  const uint64_t rows = moe.rows_capacity();
  const uint32_t epr = moe.experts_per_rank();

  // Routing: top_k distinct experts per token (a hash stands in for a router), scores 1 / top_k.
  std::vector<int32_t> choice(tokens * top_k);
  std::vector<float> score(tokens * top_k, 1.0f / static_cast<float>(top_k));
  for (uint64_t t = 0; t < tokens; ++t)
    for (uint32_t j = 0; j < top_k; ++j) {
      int32_t e;
      bool again;
      uint32_t salt = 0;
      do {
        e = static_cast<int32_t>(mix(t * 64 + j + 4096ull * salt++, 77 + c.rank()) % experts_n);
        again = std::find(choice.begin() + t * top_k, choice.begin() + t * top_k + j, e) != choice.begin() + t * top_k + j;
      } while (again);
      choice[t * top_k + j] = e;
    }
  __nv_bfloat16 *x, *xe, *ye, *out;
  int32_t* dchoice;
  float* dscore;
  uint32_t* offsets;
  if (cudaMalloc(&x, tokens * hidden * 2) != cudaSuccess || cudaMalloc(&xe, rows * hidden * 2) != cudaSuccess ||
      cudaMalloc(&ye, rows * hidden * 2) != cudaSuccess || cudaMalloc(&out, tokens * hidden * 2) != cudaSuccess ||
      cudaMalloc(&dchoice, tokens * top_k * 4) != cudaSuccess || cudaMalloc(&dscore, tokens * top_k * 4) != cudaSuccess ||
      cudaMalloc(&offsets, (epr + 1) * 4) != cudaSuccess)
    return std::fprintf(stderr, "rank %u: cudaMalloc failed (%llu expert rows of %llu)\n", c.rank(),
                        static_cast<unsigned long long>(rows), static_cast<unsigned long long>(hidden)), 1;
  fill<<<256, 256, 0, stream>>>(x, tokens * hidden, 100 + c.rank());
  cudaMemcpyAsync(dchoice, choice.data(), choice.size() * 4, cudaMemcpyHostToDevice, stream);
  cudaMemcpyAsync(dscore, score.data(), score.size() * 4, cudaMemcpyHostToDevice, stream);

  for (int step = 0; step < 5; ++step) {  // no host synchronisation between steps
    if (auto s = moe.dispatch(x, dchoice, dscore, xe, offsets, nullptr, nullptr, nullptr, stream); !s.ok())
      return std::fprintf(stderr, "rank %u: dispatch: %s\n", c.rank(), s.to_string().c_str()), 1;
    experts<<<132, 256, 0, stream>>>(xe, ye, offsets, epr, c.rank() * epr, static_cast<uint32_t>(hidden));
    if (auto s = moe.combine(ye, out, stream); !s.ok())
      return std::fprintf(stderr, "rank %u: combine: %s\n", c.rank(), s.to_string().c_str()), 1;
  }
  cudaStreamSynchronize(stream);
  const mkernel::Status st = c.check();  // a bad expert, routing over capacity, a peer that died
  if (!st.ok()) return std::fprintf(stderr, "rank %u: %s\n", c.rank(), st.to_string().c_str()), 1;

  // Spot check: out[t] = sum over the token's experts of x[t] * w_e / top_k, for a few tokens.
  std::vector<__nv_bfloat16> xr(hidden), orow(hidden);
  int wrong = 0;
  for (uint64_t t : {uint64_t{0}, tokens / 2, tokens - 1}) {
    cudaMemcpy(xr.data(), x + t * hidden, hidden * 2, cudaMemcpyDeviceToHost);
    cudaMemcpy(orow.data(), out + t * hidden, hidden * 2, cudaMemcpyDeviceToHost);
    for (uint64_t col : {uint64_t{0}, hidden - 1}) {
      double sum = 0, mag = 0;
      for (uint32_t j = 0; j < top_k; ++j) {
        const int32_t e = choice[t * top_k + j];
        const float y = __bfloat162float(__float2bfloat16(__bfloat162float(xr[col]) * (1.0f + (e % 7) / 8.0f)));
        sum += double(score[t * top_k + j]) * y;
        mag += std::fabs(double(score[t * top_k + j]) * y);
      }
      const double g = __bfloat162float(orow[col]);
      const bool ok = std::fabs(g - sum) <= std::ldexp(mag, -7) + std::ldexp(std::fabs(sum), -8) + 1e-6;
      wrong += !ok;
      if (!ok || t == 0)
        std::printf("rank %u: out[%llu][%llu] = %.4f (host: %.4f)%s\n", c.rank(), static_cast<unsigned long long>(t),
                    static_cast<unsigned long long>(col), g, sum, ok ? "" : " WRONG");
    }
  }
  std::printf("rank %u: %d of 6 checked elements wrong\n", c.rank(), wrong);
  if (wrong != 0 || inter == 0) return wrong == 0 ? 0 : 1;
  cudaFree(xe);
  cudaFree(ye);

  // The expert layer: w1[e] [2 inter, hidden] (gate rows, then up rows) and w2[e] [hidden, inter],
  // every expert's values from its own seed (so any rank can recompute any expert on the host).
  auto mlp_made = rt::MoeMlp::create(c, tokens, hidden, inter, experts_n, top_k, rt::MoeActivation::kSwiGlu, {}, stream);
  if (!mlp_made.ok()) return std::fprintf(stderr, "rank %u: %s\n", c.rank(), mlp_made.status().to_string().c_str()), 1;
  rt::MoeMlp& mlp = *mlp_made.value();
  std::printf("rank %u: %s, workspace %.2f GB\n", c.rank(), mlp.describe().c_str(), mlp.workspace_bytes() / 1e9);
  const float s1 = 2.0f / std::sqrt(static_cast<float>(hidden)), s2 = 2.0f / std::sqrt(static_cast<float>(inter));
  const uint64_t w1_elems = 2 * inter * hidden, w2_elems = hidden * inter;
  __nv_bfloat16 *w1, *w2;
  if (cudaMalloc(&w1, epr * w1_elems * 2) != cudaSuccess || cudaMalloc(&w2, epr * w2_elems * 2) != cudaSuccess)
    return std::fprintf(stderr, "rank %u: cudaMalloc failed (the experts' weights, %.2f GB)\n", c.rank(),
                        epr * (w1_elems + w2_elems) * 2 / 1e9), 1;
  for (uint32_t e = 0; e < epr; ++e) {
    const uint32_t global = c.rank() * epr + e;
    fill<<<256, 256, 0, stream>>>(w1 + e * w1_elems, w1_elems, 5000 + global, s1);
    fill<<<256, 256, 0, stream>>>(w2 + e * w2_elems, w2_elems, 9000 + global, s2);
  }
  for (int step = 0; step < 3; ++step)
    if (auto s = mlp.forward(x, dchoice, dscore, w1, w2, out, stream); !s.ok())
      return std::fprintf(stderr, "rank %u: mlp forward: %s\n", c.rank(), s.to_string().c_str()), 1;
  cudaStreamSynchronize(stream);
  if (const mkernel::Status s = c.check(); !s.ok()) return std::fprintf(stderr, "rank %u: %s\n", c.rank(), s.to_string().c_str()), 1;

  // Host check of token `tokens / 2`: every choice's expert recomputed from its seeds, rounding
  // where the op rounds (w1's output, the activation, w2's output).
  const uint64_t t = tokens / 2;
  cudaMemcpy(xr.data(), x + t * hidden, hidden * 2, cudaMemcpyDeviceToHost);
  cudaMemcpy(orow.data(), out + t * hidden, hidden * 2, cudaMemcpyDeviceToHost);
  auto rb = [](double v) { return static_cast<double>(__bfloat162float(__float2bfloat16(static_cast<float>(v)))); };
  auto wv = [](uint64_t i, uint32_t seed, float scale) { return static_cast<double>(__bfloat162float(__float2bfloat16(value(i, seed, scale)))); };
  std::vector<double> ref(hidden, 0.0), mag(hidden, 0.0), h(inter);
  for (uint32_t j = 0; j < top_k; ++j) {
    const uint32_t e = static_cast<uint32_t>(choice[t * top_k + j]);
    std::vector<double> y1(2 * inter);
    for (uint64_t n = 0; n < 2 * inter; ++n) {
      double acc = 0;
      for (uint64_t k = 0; k < hidden; ++k) acc += double(__bfloat162float(xr[k])) * wv(n * hidden + k, 5000 + e, s1);
      y1[n] = rb(acc);
    }
    for (uint64_t i = 0; i < inter; ++i) h[i] = rb(y1[i] / (1.0 + std::exp(-y1[i])) * y1[inter + i]);
    for (uint64_t col = 0; col < hidden; ++col) {
      double acc = 0, m = 0;
      for (uint64_t i = 0; i < inter; ++i) {
        const double w = wv(col * inter + i, 9000 + e, s2);
        acc += w * h[i];
        m += std::fabs(w * h[i]);
      }
      ref[col] += score[t * top_k + j] * rb(acc);
      mag[col] += score[t * top_k + j] * (m + std::fabs(acc));
    }
  }
  int mlp_wrong = 0;
  double worst = 0;
  for (uint64_t col = 0; col < hidden; ++col) {
    const double g = __bfloat162float(orow[col]), d = std::fabs(g - ref[col]);
    const double bound = std::ldexp(mag[col], -6) + std::ldexp(std::fabs(ref[col]), -8) + 1e-4;
    worst = std::max(worst, d / bound);
    if (!(d <= bound) && mlp_wrong++ < 3)
      std::printf("rank %u: mlp out[%llu][%llu] = %.5f (host: %.5f) WRONG\n", c.rank(), static_cast<unsigned long long>(t),
                  static_cast<unsigned long long>(col), g, ref[col]);
  }
  std::printf("rank %u: mlp: token %llu, %d of %llu elements outside the bound (worst %.2f of it)\n", c.rank(),
              static_cast<unsigned long long>(t), mlp_wrong, static_cast<unsigned long long>(hidden), worst);
  return mlp_wrong == 0 ? 0 : 1;
}
