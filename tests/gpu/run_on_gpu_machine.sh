#!/usr/bin/env bash
# run_on_gpu_machine.sh: runs GPU test programs from a bundle (scripts/collect-bundle.sh) on the
# GPU machine, each under a time bound, logs under $OUT, and prints a summary table last.
#   tests/gpu/run_on_gpu_machine.sh BUNDLE_DIR test_program [test_program ...]
# A program exits 0 (pass), 77 (skipped, it says why) or anything else (fail).
set -u
bundle=${1:?usage: run_on_gpu_machine.sh BUNDLE_DIR program...}
shift
OUT=${OUT:-./gpu-out}
mkdir -p "$OUT"
source "$bundle/env.sh"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
for d in /opt/torch/.venv/lib/python3*/site-packages/nvidia/cublas/lib /opt/torch/.venv/lib/python3*/site-packages/nvidia/cu13/lib \
         /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib; do
  [ -d "$d" ] && export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$d
done
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
nvidia-smi --query-gpu=index,name,clocks.sm,memory.used,temperature.gpu --format=csv > "$OUT/gpu.txt" 2>&1
summary=()
for t in "$@"; do
  echo "== $t"
  start=$(date +%s%N)
  timeout "${MKERNEL_TEST_TIMEOUT:-300}" "$bundle/bin/$t" > "$OUT/$t.log" 2>&1
  rc=$?
  ms=$(( ($(date +%s%N) - start) / 1000000 ))
  tail -n 40 "$OUT/$t.log"
  case $rc in
    0) verdict=PASS ;;
    77) verdict=SKIP ;;
    124) verdict="FAIL(timeout)" ;;
    *) verdict="FAIL($rc)" ;;
  esac
  summary+=("$(printf '%-32s %-14s %6d.%01d s' "$t" "$verdict" $((ms / 1000)) $((ms % 1000 / 100)))")
done
echo "== summary ($(head -2 "$OUT/gpu.txt" | tail -1))"
printf '%s\n' "${summary[@]}"
