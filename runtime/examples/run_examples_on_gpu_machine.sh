#!/usr/bin/env bash
# run_examples_on_gpu_machine.sh: every fused op's example (runtime/examples) through
# run_example.sh on the GPU machine, on RANKS GPUs (default: every GPU it has, at most 2), each on
# its default shape and on an odd one, each under a time bound; logs under $OUT, a table last.
#   runtime/examples/run_examples_on_gpu_machine.sh BUNDLE_DIR [RANKS]
# BUNDLE_DIR from scripts/collect-bundle.sh with runtime/mkernel-all-gather-gemm,
# runtime/mkernel-gemm-reduce-scatter, runtime/mkernel-moe and runtime/mkernel-ring-attention.
# Exit 0 when every example exited 0; 1 otherwise (the table says which and why).
set -u
bundle=${1:?usage: run_examples_on_gpu_machine.sh BUNDLE_DIR [RANKS]}
examples_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
OUT=${OUT:-./examples-out}
mkdir -p "$OUT"
source "$examples_dir/../../bench/gpu_machine_env.sh"
ranks=${2:-$((gpus < 2 ? gpus : 2))}
[ "$ranks" -ge 1 ] 2> /dev/null || { echo "no GPU: nvidia-smi sees ${gpus:-0}"; exit 1; }
export MKERNELD=$bundle/bin/mkerneld EXAMPLE_TIMEOUT=${EXAMPLE_TIMEOUT:-180}
rows=()
failed=0
run() {  # name, program, args...
  local name=$1 prog=$2
  shift 2
  echo "== $name: $prog $*"
  local start=$(date +%s%N)
  bash "$examples_dir/run_example.sh" "$ranks" "$bundle/bin/$prog" "$@" > "$OUT/$name.log" 2>&1
  local rc=$? ms=$((($(date +%s%N) - start) / 1000000))
  local last
  last=$(grep -v '^\s*$' "$OUT/$name.log" | tail -1 | cut -c1-110)
  [ $rc -eq 0 ] || failed=1
  rows+=("$(printf '%-26s %-5s %7d  %s' "$name" "$rc" "$ms" "$last")")
}
run ag_gemm_default mkernel-all-gather-gemm
run ag_gemm_odd mkernel-all-gather-gemm 1000 4104 4160
run gemm_rs_default mkernel-gemm-reduce-scatter
run gemm_rs_odd mkernel-gemm-reduce-scatter 1000 4104 4160
run moe_small mkernel-moe 500 2048 16 4 512
run moe_default mkernel-moe 4096 7168 256 8 2048
run ring_attention_default mkernel-ring-attention
run ring_attention_odd mkernel-ring-attention 4100 8 2 64
echo
echo "examples on $ranks rank(s), $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
printf '%-26s %-5s %7s  %s\n' example exit ms "last line of its output"
printf '%s\n' "${rows[@]}"
exit $failed
