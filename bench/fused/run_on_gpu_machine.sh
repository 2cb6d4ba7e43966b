#!/usr/bin/env bash
# run_on_gpu_machine.sh: the AllGather+GEMM benchmark on the GPU machine, one call: ours beside
# NCCL + cuBLAS and PyTorch's fused op (NVLink), the block-split and copy variants, and with
# --nodes two nodes emulated through the proxies; all appended to $OUT/ag_gemm.jsonl, tables last.
#   bench/fused/run_on_gpu_machine.sh BUNDLE_DIR COMMIT MACHINE [--nodes]
set -u
bundle=${1:?usage: run_on_gpu_machine.sh BUNDLE_DIR COMMIT MACHINE [--nodes]}
commit=${2:?commit}
machine=${3:?machine}
nodes=${4:-}
OUT=${OUT:-./ag-out}
mkdir -p "$OUT"
source "$bundle/env.sh"
for d in /usr/local/cuda/lib64 /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib \
         /opt/torch/.venv/lib/python3*/site-packages/nvidia/cu13/lib; do
  [ -d "$d" ] && export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$d
done
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
py=/opt/torch/.venv/bin/python3
common=(--jsonl "$OUT/ag_gemm.jsonl" --commit "$commit" --machine "$machine")
big=4096x8192x8192,8192x8192x8192,16384x14336x4096,32768x8192x8192
bench() {  # name, timeout, args...
  local name=$1 t=$2
  shift 2
  echo "== ag_gemm_bench $name: $*"
  timeout "$t" "$bundle/bin/ag_gemm_bench" --world "$gpus" "$@" "${common[@]}" > "$OUT/$name.log" 2>&1
  echo "exit $?"
}
bench main 200 --shapes "$big" --small-m --iters 40 --rounds 4
bench comm12 60 --shapes 4096x8192x8192,8192x8192x8192 --comm-blocks 12 --iters 30 --rounds 3
bench lsu 60 --shapes 4096x8192x8192,8192x8192x8192 --lsu --iters 30 --rounds 3
bench lsu12 60 --shapes 4096x8192x8192,8192x8192x8192 --lsu --comm-blocks 12 --iters 30 --rounds 3
echo "== PyTorch"
timeout 170 "$py" -m torch.distributed.run --nproc_per_node="$gpus" bench/fused/ag_gemm_torch.py --small-m \
  --iters 40 "${common[@]}" > "$OUT/torch.log" 2>&1
echo "exit $?"
if [ "$nodes" = "--nodes" ]; then
  bench nodes 110 --nodes --provider shm --shapes 4096x8192x8192,8192x8192x8192 --iters 20 --rounds 2
fi
for f in main comm12 lsu lsu12 nodes; do
  [ -f "$OUT/$f.log" ] && grep -E '^[0-9]+x|^ag_gemm_bench|exit|failed|FAIL' "$OUT/$f.log" | cut -c1-130
done
grep -E '^[0-9]+x' "$OUT/torch.log"
