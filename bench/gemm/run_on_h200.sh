#!/bin/bash
# run_on_h200.sh: one call on the GPU machine: SASS checks, the GEMM correctness test, the
# benchmark (with the configuration sweep), all logs under $OUT (default ./gemm-out).
#   bench/gemm/run_on_h200.sh BIN_DIR [bench args...]
# BIN_DIR holds gemm_gpu_test and gemm_bench built for sm_90a.
set -u
BIN=${1:?usage: run_on_h200.sh BIN_DIR [bench args...]}
shift
OUT=${OUT:-./gemm-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
for d in /opt/torch/.venv/lib/python3*/site-packages/nvidia/cublas/lib /opt/torch/.venv/lib/python3*/site-packages/nvidia/cu13/lib; do
  [ -d "$d" ] && export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$d
done
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
if command -v cuobjdump >/dev/null; then
  cuobjdump --dump-sass "$BIN/gemm_bench" > "$OUT/sass.txt" 2>&1
  echo "SASS: HGMMA $(grep -c HGMMA "$OUT/sass.txt"), UTMALDG $(grep -c UTMALDG "$OUT/sass.txt"), LDL $(grep -c 'LDL' "$OUT/sass.txt"), STL $(grep -c 'STL' "$OUT/sass.txt")" | tee "$OUT/sass_summary.txt"
  # where any local-memory traffic sits (kernel name and the instructions around it)
  awk '/Function :/{fn=$3} /LDL|STL/{print fn": "$0}' "$OUT/sass.txt" | cut -c1-200 | head -20 | tee "$OUT/sass_local.txt"
  gzip -f "$OUT/sass.txt"
fi
echo "== gemm_gpu_test"
timeout 300 "$BIN/gemm_gpu_test" 2>&1 | tee "$OUT/test.log"
echo "test exit: ${PIPESTATUS[0]}"
echo "== gemm_bench $*"
timeout 420 "$BIN/gemm_bench" --json "$OUT/gemm.jsonl" "$@" 2>&1 | tee "$OUT/bench.log"
echo "bench exit: ${PIPESTATUS[0]}"
