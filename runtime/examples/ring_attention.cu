// ring_attention: a complete ring-attention example (sequence parallelism). Every rank builds the
// same causal sequence (Q, K, V [1, H, S, D] from a seed), reorders it into zigzag placement on
// its GPU (rt::zigzag_reorder), keeps its S / world positions, and runs the fused ring: its
// queries attend to every rank's keys and values while they travel around the ranks. A few
// output rows are then checked on the host against attention over the whole sequence.
//
// Launched by torchrun (or any launcher that sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
// MASTER_PORT) with MKERNEL_TOKEN set to the same secret on every rank:
//   MKERNEL_TOKEN=$(openssl rand -hex 16) torchrun --nproc-per-node 2 ./ring_attention 8192 8 2 128
// (arguments: S (the whole sequence; a multiple of 2 x world), query heads, key/value heads,
// head dim 64 or 128).
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

// Deterministic bf16 values in [-1, 1] from (seed, index): every rank builds the same sequence.
__global__ void fill(__nv_bfloat16* p, uint64_t n, uint32_t seed) {
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < n; i += uint64_t{gridDim.x} * blockDim.x) {
    uint32_t x = static_cast<uint32_t>(i) * 2654435761u ^ seed * 0x9E3779B9u;
    x ^= x >> 15;
    x *= 0x2C1B3C6Du;
    x ^= x >> 12;
    p[i] = __float2bfloat16(static_cast<float>(x % 2001) / 1000.0f - 1.0f);
  }
}

std::vector<float> to_host(const __nv_bfloat16* d, uint64_t n) {
  std::vector<__nv_bfloat16> b(n);
  cudaMemcpy(b.data(), d, n * 2, cudaMemcpyDeviceToHost);
  std::vector<float> f(n);
  for (uint64_t i = 0; i < n; ++i) f[i] = __bfloat162float(b[i]);
  return f;
}

int main(int argc, char** argv) {
  const uint64_t S = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 8192;
  const uint64_t H = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 8;
  const uint64_t Hkv = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 2;
  const uint64_t D = argc > 4 ? std::strtoull(argv[4], nullptr, 10) : 128;
  const char* world_env = std::getenv("WORLD_SIZE");
  const uint32_t world = world_env != nullptr ? static_cast<uint32_t>(std::atoi(world_env)) : 1;

  rt::RingAttentionShape shape;
  shape.batch = 1;
  shape.heads_q = H;
  shape.heads_kv = Hkv;
  shape.s_local = S / world;
  shape.head_dim = D;
  shape.placement = rt::RingPlacement::kCausalZigzag;  // causal, the same work on every rank
  // The workspace the op needs: a few K/V chunks in the NVLink buffer (and one per node in the
  // network workspace across nodes). Sized for one node of `world` GPUs and, as an upper bound
  // of the network part, for `world` nodes.
  rt::Options options;
  options.nvlink_bytes = std::max<uint64_t>(1 << 20, rt::ring_attention_nvlink_bytes(1, world, shape));
  options.network_workspace_bytes = rt::ring_attention_network_bytes(world, shape);
  options.fused_flags =
      std::max<uint32_t>({4096, rt::ring_attention_fused_flags(1, world), rt::ring_attention_fused_flags(world, 1)});
  auto comm = rt::Communicator::create_from_env({4096}, options);
  if (!comm.ok()) return std::fprintf(stderr, "create: %s\n", comm.status().to_string().c_str()), 1;
  rt::Communicator& c = *comm.value();

  // The whole sequence in original order, then zigzag-placed; this rank's part is
  // positions [rank S / world, (rank + 1) S / world) of the placed sequence: per head a
  // contiguous run of s_local rows ([B, H, S, D]), copied out with one 2-D copy per tensor.
  const uint64_t s_local = shape.s_local;
  __nv_bfloat16 *whole[3], *placed, *mine[3], *out;
  float* lse;
  const uint64_t heads[3] = {H, Hkv, Hkv};
  cudaMalloc(&placed, H * S * D * 2);
  for (int t = 0; t < 3; ++t) {
    cudaMalloc(&whole[t], heads[t] * S * D * 2);
    cudaMalloc(&mine[t], heads[t] * s_local * D * 2);
    fill<<<256, 256>>>(whole[t], heads[t] * S * D, 100 + t);
  }
  cudaMalloc(&out, H * s_local * D * 2);
  cudaMalloc(&lse, H * s_local * 4);
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  cudaDeviceSynchronize();
  for (int t = 0; t < 3; ++t) {
    if (auto s = rt::zigzag_reorder(whole[t], placed, 1, heads[t], S, D, 2, rt::AttentionLayout::kBHSD, c.size(), true,
                                    stream);
        !s.ok())
      return std::fprintf(stderr, "rank %u: %s\n", c.rank(), s.to_string().c_str()), 1;
    cudaMemcpy2DAsync(mine[t], s_local * D * 2, placed + uint64_t{c.rank()} * s_local * D, S * D * 2, s_local * D * 2,
                      heads[t], cudaMemcpyDeviceToDevice, stream);
  }

  // Collective: every rank plans the same shape (they check it with each other).
  auto op = rt::RingAttention::create(c, shape, {}, stream);
  if (!op.ok()) return std::fprintf(stderr, "rank %u: %s\n", c.rank(), op.status().to_string().c_str()), 1;
  std::printf("rank %u: %s\n", c.rank(), op.value()->describe().c_str());
  for (int step = 0; step < 5; ++step) {  // no host synchronisation between launches
    if (auto s = op.value()->launch(mine[0], mine[1], mine[2], out, lse, stream); !s.ok())
      return std::fprintf(stderr, "rank %u: %s\n", c.rank(), s.to_string().c_str()), 1;
  }
  cudaStreamSynchronize(stream);
  const mkernel::Status st = c.check();  // a peer that died, a wait past its bound, the daemon gone
  if (!st.ok()) return std::fprintf(stderr, "rank %u: %s\n", c.rank(), st.to_string().c_str()), 1;

  // Spot check on the host: a few (head, local row) outputs against causal attention over the
  // original sequence (query at original position p sees keys 0 .. p).
  auto perm = rt::zigzag_permutation(S, c.size());
  if (!perm.ok()) return std::fprintf(stderr, "%s\n", perm.status().to_string().c_str()), 1;
  const std::vector<float> q = to_host(whole[0], H * S * D), k = to_host(whole[1], Hkv * S * D),
                           v = to_host(whole[2], Hkv * S * D), o = to_host(out, H * s_local * D);
  int wrong = 0;
  const uint64_t rows[3] = {0, s_local / 2, s_local - 1};
  for (uint64_t h : {uint64_t{0}, H - 1})
    for (uint64_t l : rows) {
      const uint64_t p = perm.value()[uint64_t{c.rank()} * s_local + l], hk = h / (H / Hkv);
      std::vector<double> w(p + 1);
      double mx = -1e300, sum = 0, err = 0, mag = 0;
      for (uint64_t j = 0; j <= p; ++j) {
        double dot = 0;
        for (uint64_t d = 0; d < D; ++d) dot += double(q[(h * S + p) * D + d]) * k[(hk * S + j) * D + d];
        w[j] = dot / std::sqrt(double(D));
        mx = std::max(mx, w[j]);
      }
      for (double& x : w) sum += (x = std::exp(x - mx));
      for (uint64_t d = 0; d < D; ++d) {
        double ref = 0;
        for (uint64_t j = 0; j <= p; ++j) ref += w[j] * v[(hk * S + j) * D + d];
        ref /= sum;
        err += (o[(h * s_local + l) * D + d] - ref) * (o[(h * s_local + l) * D + d] - ref);
        mag += ref * ref;
      }
      const double rel = std::sqrt(err / std::max(mag, 1e-30));
      wrong += rel > 2e-2;
      std::printf("rank %u: head %llu local row %llu (position %llu): relative error %.2e\n", c.rank(),
                  static_cast<unsigned long long>(h), static_cast<unsigned long long>(l),
                  static_cast<unsigned long long>(p), rel);
    }
  std::printf("rank %u: %d of 6 checked rows wrong\n", c.rank(), wrong);
  return wrong == 0 ? 0 : 1;
}
