// all_gather_gemm: the complete AllGather+GEMM example of docs/api.md. A tensor-parallel
// column-linear layer: every rank holds m_local rows of the activation and n_local rows of the
// weight, and gets C_r = AllGather(A) @ W_r^T [M, n_local] and the gathered A [M, k].
//
// Launched by torchrun (or any launcher that sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
// MASTER_PORT) with MKERNEL_TOKEN set to the same secret on every rank:
//   MKERNEL_TOKEN=$(openssl rand -hex 16) torchrun --nproc-per-node 2 ./all_gather_gemm 4096 4096 8192
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "mkernel/runtime/ops.h"
#include "mkernel/runtime/runtime.h"

namespace rt = mkernel::rt;

// Deterministic bf16 values from (seed, index), so every rank can build any rank's rows.
__global__ void fill(__nv_bfloat16* p, uint64_t n, uint32_t seed) {
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < n; i += uint64_t{gridDim.x} * blockDim.x) {
    uint32_t x = static_cast<uint32_t>(i) * 2654435761u ^ seed * 0x9E3779B9u;
    x ^= x >> 15;
    x *= 0x2C1B3C6Du;
    x ^= x >> 12;
    p[i] = __float2bfloat16(static_cast<float>(x % 2001) / 1000.0f - 1.0f);
  }
}

int main(int argc, char** argv) {
  const uint64_t m_local = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 4096;
  const uint64_t n_local = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 4096;
  const uint64_t k = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 8192;
  const char* world_env = std::getenv("WORLD_SIZE");
  const uint32_t world = world_env != nullptr ? static_cast<uint32_t>(std::atoi(world_env)) : 1;

  // The workspace the op needs: the gathered A in the NVLink buffer (and, across nodes, one
  // shard per node in the network workspace).
  rt::Options options;
  options.nvlink_bytes = rt::all_gather_gemm_nvlink_bytes(world, m_local, k);
  options.network_workspace_bytes = rt::all_gather_gemm_network_bytes(world, m_local, k);  // upper bound
  auto comm = rt::Communicator::create_from_env({4096}, options);
  if (!comm.ok()) return std::fprintf(stderr, "create: %s\n", comm.status().to_string().c_str()), 1;
  rt::Communicator& c = *comm.value();

  const uint64_t M = uint64_t{c.size()} * m_local;
  __nv_bfloat16 *a, *w, *out, *gathered;
  cudaMalloc(&a, m_local * k * 2);
  cudaMalloc(&w, n_local * k * 2);
  cudaMalloc(&out, M * n_local * 2);
  cudaMalloc(&gathered, M * k * 2);
  fill<<<256, 256>>>(a, m_local * k, 100 + c.rank());
  fill<<<256, 256>>>(w, n_local * k, 200 + c.rank());
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  cudaDeviceSynchronize();

  // Collective: every rank plans the same shape (they check it with each other).
  auto op = rt::AllGatherGemm::create(c, m_local, n_local, k, {}, stream);
  if (!op.ok()) return std::fprintf(stderr, "rank %u: %s\n", c.rank(), op.status().to_string().c_str()), 1;
  std::printf("rank %u: %s\n", c.rank(), op.value()->describe().c_str());
  for (int step = 0; step < 10; ++step) {  // no host synchronisation between launches
    if (auto s = op.value()->launch(a, w, out, gathered, stream); !s.ok())
      return std::fprintf(stderr, "rank %u: %s\n", c.rank(), s.to_string().c_str()), 1;
  }
  cudaStreamSynchronize(stream);
  const mkernel::Status st = c.check();  // a peer that died, a wait past its bound, the daemon gone
  if (!st.ok()) return std::fprintf(stderr, "rank %u: %s\n", c.rank(), st.to_string().c_str()), 1;

  // Spot check: row 0 of rank (world - 1)'s shard in the gathered A, and C[0][0] on the host.
  const uint64_t last = uint64_t{c.size() - 1} * m_local;
  std::vector<__nv_bfloat16> row(k), wrow(k), expect(k);
  __nv_bfloat16* tmp;
  cudaMalloc(&tmp, k * 2);
  fill<<<1, 256>>>(tmp, k, 100 + c.size() - 1);  // that rank's first row, rebuilt here
  cudaMemcpy(expect.data(), tmp, k * 2, cudaMemcpyDeviceToHost);
  cudaMemcpy(row.data(), gathered + last * k, k * 2, cudaMemcpyDeviceToHost);
  cudaMemcpy(wrow.data(), w, k * 2, cudaMemcpyDeviceToHost);
  uint64_t differ = 0;
  for (uint64_t i = 0; i < k; ++i) differ += __bfloat162float(row[i]) != __bfloat162float(expect[i]);
  std::vector<__nv_bfloat16> a0(k);
  cudaMemcpy(a0.data(), gathered, k * 2, cudaMemcpyDeviceToHost);
  double ref = 0;
  for (uint64_t i = 0; i < k; ++i) ref += double(__bfloat162float(a0[i])) * __bfloat162float(wrow[i]);
  __nv_bfloat16 c00;
  cudaMemcpy(&c00, out, 2, cudaMemcpyDeviceToHost);
  std::printf("rank %u: gathered row %llu %s; C[0][0] = %.4f (host: %.4f)\n", c.rank(),
              static_cast<unsigned long long>(last), differ == 0 ? "exact" : "WRONG", __bfloat162float(c00), ref);
  return differ == 0 ? 0 : 1;
}
