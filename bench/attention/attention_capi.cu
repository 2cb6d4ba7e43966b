// attention_capi.cu: a C entry point to the attention core for the benchmark's Python side
// (attention_bench.py loads it with ctypes and hands over torch tensors' pointers and stream), so
// both implementations run in one process on the same inputs. Not a product API: the runtime's
// entry point and the Python package come with the ring kernel.
//
//   int mk_attention_fwd(q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv, head_dim,
//                        layout, causal, block_n, pingpong, unit_order, l2_promotion, stream, err, err_len)
//       0 on success; else the planner's message in err. The plan of the last call is kept and
//       reused when every argument is the same (the tensor maps are encoded once).
//   int mk_attention_status(msg, len)
//       reads and clears the kernels' status word: 0 when no kernel reported an error.
//   int mk_attention_config(buf, len)   the configuration string of the last plan.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>

#include "attention/sm90_attention.h"

namespace mk = mkernel::kernels;

namespace {

std::mutex g_mu;
mk::AttnPlan g_plan;
bool g_have_plan = false;
long long g_key[17];
mk::DeviceStatus* g_status = nullptr;
void* g_workspace = nullptr;  // the schedule counters (attention_workspace_bytes of one chunk)

void put(char* dst, int len, const std::string& s) {
  if (dst == nullptr || len <= 0) return;
  std::snprintf(dst, static_cast<size_t>(len), "%s", s.c_str());
}

}  // namespace

extern "C" int mk_attention_fwd(const void* q, const void* k, const void* v, void* o, float* lse, long long batch,
                                long long heads_q, long long heads_kv, long long seq_q, long long seq_kv,
                                long long head_dim, int layout, int causal, int block_n, int pingpong, int unit_order,
                                int l2_promotion, void* stream,
                                char* err, int err_len) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_status == nullptr) {
    if (cudaMalloc(&g_status, sizeof(mk::DeviceStatus)) != cudaSuccess ||
        cudaMemset(g_status, 0, sizeof(mk::DeviceStatus)) != cudaSuccess || cudaMalloc(&g_workspace, 256) != cudaSuccess ||
        cudaMemset(g_workspace, 0, 256) != cudaSuccess) {
      put(err, err_len, "cannot allocate the status word and workspace");
      return 1;
    }
  }
  const long long key[17] = {reinterpret_cast<long long>(q), reinterpret_cast<long long>(k),
                             reinterpret_cast<long long>(v), reinterpret_cast<long long>(o),
                             reinterpret_cast<long long>(lse), batch, heads_q, heads_kv, seq_q, seq_kv, head_dim,
                             layout, causal, block_n, pingpong, unit_order, l2_promotion};
  if (!g_have_plan || std::memcmp(key, g_key, sizeof(key)) != 0) {
    mk::AttnArgs a;
    a.q = q;
    a.k = k;
    a.v = v;
    a.o = o;
    a.lse = lse;
    a.batch = batch;
    a.heads_q = heads_q;
    a.heads_kv = heads_kv;
    a.seq_q = seq_q;
    a.seq_kv = seq_kv;
    a.head_dim = head_dim;
    a.layout = static_cast<mk::AttnLayout>(layout);
    a.causal = causal != 0;
    a.config.block_n = block_n;
    a.config.pingpong = pingpong;
    a.config.unit_order = unit_order;
    a.config.l2_promotion = l2_promotion;
    a.wait.status = g_status;
    a.workspace = g_workspace;
    a.workspace_bytes = 256;
    const mk::AttnResult r = mk::attention_plan(a, &g_plan);
    if (!r.ok()) {
      g_have_plan = false;
      put(err, err_len, r.message);
      return 1;
    }
    std::memcpy(g_key, key, sizeof(key));
    g_have_plan = true;
  }
  const mk::AttnResult r = mk::attention_launch(g_plan, static_cast<cudaStream_t>(stream));
  if (!r.ok()) {
    put(err, err_len, r.message);
    return 1;
  }
  return 0;
}

extern "C" int mk_attention_status(char* msg, int len) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_status == nullptr) return 0;
  mk::DeviceStatus s{};
  if (cudaMemcpy(&s, g_status, sizeof(s), cudaMemcpyDeviceToHost) != cudaSuccess) {
    put(msg, len, "cannot read the status word");
    return -1;
  }
  cudaMemset(g_status, 0, sizeof(s));
  put(msg, len, mk::describe_device_status(s, 5'000'000'000ull));
  return static_cast<int>(s.code);
}

extern "C" int mk_attention_config(char* buf, int len) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_have_plan) return 1;
  put(buf, len, mk::attention_config_string(g_plan));
  return 0;
}
