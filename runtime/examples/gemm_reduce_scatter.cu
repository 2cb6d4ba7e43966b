// gemm_reduce_scatter: a complete GEMM+ReduceScatter example. A tensor-parallel row-linear
// layer: every rank holds the whole activation's share of the reduction dimension, A_r [M, k],
// and the matching columns of the weight, W_r [n, k]; it gets its M / world rows of
// sum over q of A_q @ W_q^T, [m_local, n].
//
// Launched by torchrun (or any launcher that sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
// MASTER_PORT) with MKERNEL_TOKEN set to the same secret on every rank:
//   MKERNEL_TOKEN=$(openssl rand -hex 16) torchrun --nproc-per-node 2 ./gemm_reduce_scatter 4096 8192 4096
// (arguments: m_local, n, k; the global problem is M = world x m_local, K = world x k).
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

// Deterministic bf16 values from (seed, index), so every rank can rebuild any rank's operands.
__global__ void fill(__nv_bfloat16* p, uint64_t n, uint64_t first, uint32_t seed) {
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < n; i += uint64_t{gridDim.x} * blockDim.x) {
    uint32_t x = static_cast<uint32_t>(first + i) * 2654435761u ^ seed * 0x9E3779B9u;
    x ^= x >> 15;
    x *= 0x2C1B3C6Du;
    x ^= x >> 12;
    p[i] = __float2bfloat16(static_cast<float>(x % 2001) / 1000.0f - 1.0f);
  }
}

// Row `row` of a [rows, k] operand drawn with `seed`, on the host.
std::vector<float> host_row(uint64_t row, uint64_t k, uint32_t seed, __nv_bfloat16* tmp) {
  fill<<<8, 256>>>(tmp, k, row * k, seed);
  std::vector<__nv_bfloat16> b(k);
  cudaMemcpy(b.data(), tmp, k * 2, cudaMemcpyDeviceToHost);
  std::vector<float> f(k);
  for (uint64_t i = 0; i < k; ++i) f[i] = __bfloat162float(b[i]);
  return f;
}

int main(int argc, char** argv) {
  const uint64_t m_local = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 4096;
  const uint64_t n = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 8192;
  const uint64_t k = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 4096;
  const char* world_env = std::getenv("WORLD_SIZE");
  const uint32_t world = world_env != nullptr ? static_cast<uint32_t>(std::atoi(world_env)) : 1;

  // The workspace the op needs: the node peers' partial tiles in the NVLink buffer (and, across
  // nodes, a receive and a send slot per node in the network workspace). Sized here for one
  // node of `world` GPUs and, as an upper bound, for `world` nodes.
  rt::Options options;
  options.nvlink_bytes = std::max<uint64_t>(1 << 20, rt::gemm_reduce_scatter_nvlink_bytes(1, world, m_local, n));
  options.network_workspace_bytes = rt::gemm_reduce_scatter_network_bytes(world, m_local, n);
  // One flag per staged tile, about (world - 1) x (M / world / 128) x (n / 128); create() says
  // how many it needs when these are too few.
  options.fused_flags = 65536;
  auto comm = rt::Communicator::create_from_env({4096}, options);
  if (!comm.ok()) return std::fprintf(stderr, "create: %s\n", comm.status().to_string().c_str()), 1;
  rt::Communicator& c = *comm.value();

  const uint64_t M = uint64_t{c.size()} * m_local;
  __nv_bfloat16 *a, *w, *out;
  if (cudaMalloc(&a, M * k * 2) != cudaSuccess || cudaMalloc(&w, n * k * 2) != cudaSuccess ||
      cudaMalloc(&out, m_local * n * 2) != cudaSuccess)
    return std::fprintf(stderr, "rank %u: cudaMalloc of %llu bytes failed\n", c.rank(),
                        static_cast<unsigned long long>((M * k + n * k + m_local * n) * 2)), 1;
  fill<<<256, 256>>>(a, M * k, 0, 100 + c.rank());
  fill<<<256, 256>>>(w, n * k, 0, 200 + c.rank());
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  cudaDeviceSynchronize();

  // Collective: every rank plans the same shape (they check it with each other).
  auto op = rt::GemmReduceScatter::create(c, m_local, n, k, {}, stream);
  if (!op.ok()) return std::fprintf(stderr, "rank %u: %s\n", c.rank(), op.status().to_string().c_str()), 1;
  std::printf("rank %u: %s\n", c.rank(), op.value()->describe().c_str());
  for (int step = 0; step < 10; ++step) {  // no host synchronisation between launches
    if (auto s = op.value()->launch(a, w, out, stream); !s.ok())
      return std::fprintf(stderr, "rank %u: %s\n", c.rank(), s.to_string().c_str()), 1;
  }
  cudaStreamSynchronize(stream);
  const mkernel::Status st = c.check();  // a peer that died, a wait past its bound, the daemon gone
  if (!st.ok()) return std::fprintf(stderr, "rank %u: %s\n", c.rank(), st.to_string().c_str()), 1;

  // Spot check on the host: a few elements of this rank's rows, from every rank's operands
  // rebuilt here, each within one bf16 rounding of every partial and of the sum.
  __nv_bfloat16* tmp;
  cudaMalloc(&tmp, k * 2);
  int wrong = 0;
  const uint64_t rows[2] = {0, m_local - 1}, cols[3] = {0, n / 2, n - 1};
  for (uint64_t i : rows)
    for (uint64_t j : cols) {
      double sum = 0, mag = 0;
      for (uint32_t q = 0; q < c.size(); ++q) {
        const std::vector<float> ar = host_row(uint64_t{c.rank()} * m_local + i, k, 100 + q, tmp);
        const std::vector<float> wr = host_row(j, k, 200 + q, tmp);
        double part = 0;
        for (uint64_t t = 0; t < k; ++t) part += double(ar[t]) * wr[t];
        sum += part;
        mag += std::fabs(part);
      }
      __nv_bfloat16 got;
      cudaMemcpy(&got, out + i * n + j, 2, cudaMemcpyDeviceToHost);
      const double g = __bfloat162float(got);
      const bool ok = std::fabs(g - sum) <= std::ldexp(mag, -7) + std::ldexp(std::fabs(sum), -8) + 1e-6;
      wrong += !ok;
      if ((i == 0 && j == 0) || !ok)
        std::printf("rank %u: C[%llu][%llu] = %.4f (host: %.4f)%s\n", c.rank(), static_cast<unsigned long long>(i),
                    static_cast<unsigned long long>(j), g, sum, ok ? "" : " WRONG");
    }
  std::printf("rank %u: %d of 6 checked elements wrong\n", c.rank(), wrong);
  return wrong == 0 ? 0 : 1;
}
