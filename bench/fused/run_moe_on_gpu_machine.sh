#!/usr/bin/env bash
# run_moe_on_gpu_machine.sh: the MoE benchmark on the GPU machine, one call: our fused and
# unfused kernels and the dispatch and combine alone (moe_bench), then the reference NCCL
# all_to_all + torch._grouped_mm (moe_baseline.py, which the caller brings along: it lives in
# ../shared/baselines beside the repository), on the same machine; tables last.
#   bench/fused/run_moe_on_gpu_machine.sh BUNDLE_DIR COMMIT MACHINE BASELINE_PY
# Then the two-matrix MLP: moe_bench --mlp and the same layer in PyTorch (moe_mlp_torch.py).
# Records: $OUT/moe.jsonl (ours), $OUT/moe.json (the baseline's, as the script writes it),
# $OUT/moe_mlp_torch.jsonl.
set -u
bundle=${1:?usage: run_moe_on_gpu_machine.sh BUNDLE_DIR COMMIT MACHINE BASELINE_PY}
commit=${2:?commit}
machine=${3:?machine}
baseline=${4:?the path of moe_baseline.py}
OUT=${OUT:-./moe-out}
mkdir -p "$OUT"
source "$(dirname "${BASH_SOURCE[0]}")/../gpu_machine_env.sh"
echo "== moe_bench (world $gpus)"
timeout 330 "$bundle/bin/moe_bench" --world "$gpus" --tokens 128,4096,16384 --routing uniform,zipf,zipf_logits --iters 20 \
  --jsonl "$OUT/moe.jsonl" --commit "$commit" --machine "$machine" > "$OUT/moe_bench.log" 2>&1
echo "exit $?"
# With one GPU the baseline runs one rank too: its all_to_alls are then local copies, as our
# dispatch's sends to itself are (a comparison of the GEMM and the copies, not of a link).
echo "== moe_baseline.py (NCCL all_to_all + torch._grouped_mm, $gpus rank(s))"
OUT="$OUT" timeout 240 "$py" -m torch.distributed.run --nproc_per_node="$gpus" "$baseline" > "$OUT/baseline.log" 2>&1
echo "exit $?"
# The two-matrix MLP (SwiGLU) beside the same layer in PyTorch (moe_mlp_torch.py, beside this script).
echo "== moe_bench --mlp and moe_mlp_torch.py"
timeout 240 "$bundle/bin/moe_bench" --world "$gpus" --tokens 128,4096 --routing uniform,zipf_logits --iters 20 --mlp \
  --jsonl "$OUT/moe.jsonl" --commit "$commit" --machine "$machine" > "$OUT/moe_mlp_bench.log" 2>&1
echo "exit $?"
OUT="$OUT" timeout 240 "$py" -m torch.distributed.run --nproc_per_node="$gpus" "$(dirname "${BASH_SOURCE[0]}")/moe_mlp_torch.py" \
  --tokens 128,4096 --routing uniform,zipf_logits --iters 20 --commit "$commit" --machine "$machine" > "$OUT/moe_mlp_torch.log" 2>&1
echo "exit $?"
sed -n '/^moe_bench: world/,$p' "$OUT/moe_bench.log"; grep -E 'failed|FAIL|differs|error' "$OUT/moe_bench.log"
[ -f "$OUT/moe_rank0.txt" ] && cat "$OUT/moe_rank0.txt"
sed -n '/^moe_bench: world/,$p' "$OUT/moe_mlp_bench.log"; grep -E 'failed|FAIL|rror' "$OUT/moe_mlp_bench.log"
tail -8 "$OUT/moe_mlp_torch.log"
exit 0
