#!/usr/bin/env bash
# run_on_gpu_machine.sh: the AllGather+GEMM benchmark on the GPU machine, one call: ours beside
# NCCL + cuBLAS (NVLink, and two nodes emulated through the proxies) and PyTorch's fused op, all
# appended to $OUT/ag_gemm.jsonl; tables last.
#   bench/fused/run_on_gpu_machine.sh BUNDLE_DIR COMMIT MACHINE
set -u
bundle=${1:?usage: run_on_gpu_machine.sh BUNDLE_DIR COMMIT MACHINE}
commit=${2:?commit}
machine=${3:?machine}
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
echo "== ag_gemm_bench, $gpus GPUs, NVLink"
timeout 220 "$bundle/bin/ag_gemm_bench" --world "$gpus" --small-m --shapes \
  4096x8192x8192,8192x8192x8192,16384x14336x4096,32768x8192x8192 --iters 40 --rounds 4 "${common[@]}" \
  > "$OUT/nvlink.log" 2>&1; echo "exit $?"
echo "== PyTorch"
timeout 170 "$py" -m torch.distributed.run --nproc_per_node="$gpus" bench/fused/ag_gemm_torch.py --small-m \
  --iters 40 "${common[@]}" > "$OUT/torch.log" 2>&1; echo "exit $?"
echo "== ag_gemm_bench, two nodes emulated (shm, host-staged)"
timeout 110 "$bundle/bin/ag_gemm_bench" --world "$gpus" --nodes --provider shm \
  --shapes 4096x8192x8192,8192x8192x8192 --iters 20 --rounds 2 "${common[@]}" > "$OUT/nodes.log" 2>&1; echo "exit $?"
tail -n 22 "$OUT/nvlink.log"; tail -n 16 "$OUT/torch.log"; tail -n 6 "$OUT/nodes.log"
