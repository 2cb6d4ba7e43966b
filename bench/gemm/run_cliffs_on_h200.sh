#!/bin/bash
# run_cliffs_on_h200.sh: one call on the GPU machine for the "no cliffs" work (issue 13): the
# CPU schedule replay, the GEMM correctness test (with its random family), then the benchmark on
# seeded random families and on the fixed list; logs and JSON rows under $OUT, a short summary
# last.
#   bench/gemm/run_cliffs_on_h200.sh BIN_DIR COMMIT "SEEDS" [bench args for the random runs...]
# BIN_DIR holds gemm_schedule_test, gemm_gpu_test and gemm_bench built for sm_90a. SEEDS is a
# space-separated list; the first seed's run also gets the launch-overhead report.
set -u
BIN=${1:?usage: run_cliffs_on_h200.sh BIN_DIR COMMIT "SEEDS" [bench args...]}
COMMIT=${2:?commit}
SEEDS=${3:?seeds}
shift 3
OUT=${OUT:-./gemm-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
for d in /opt/torch/.venv/lib/python3*/site-packages/nvidia/cublas/lib /opt/torch/.venv/lib/python3*/site-packages/nvidia/cu13/lib; do
  [ -d "$d" ] && export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$d
done
start=$(date +%s)
stamp() { echo "[$(( $(date +%s) - start )) s] $*"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
if command -v cuobjdump >/dev/null; then
  cuobjdump --dump-sass "$BIN/gemm_bench" > "$OUT/sass.txt" 2>&1
  echo "SASS: HGMMA $(grep -c HGMMA "$OUT/sass.txt"), LDL $(grep -c 'LDL' "$OUT/sass.txt"), STL $(grep -c 'STL' "$OUT/sass.txt")" | tee "$OUT/sass_summary.txt"
  awk '/Function :/{fn=$3} /LDL|STL/{print fn": "$0}' "$OUT/sass.txt" | cut -c1-160 | head -40 > "$OUT/sass_local.txt"
  rm -f "$OUT/sass.txt"
fi
stamp "gemm_schedule_test"
"$BIN/gemm_schedule_test" > "$OUT/schedule.log" 2>&1; echo "schedule test exit $?" | tee -a "$OUT/summary.txt"
stamp "gemm_gpu_test"
timeout "${TEST_TIMEOUT:-240}" "$BIN/gemm_gpu_test" > "$OUT/test.log" 2>&1; echo "gpu test exit $?" | tee -a "$OUT/summary.txt"
grep -E "FAIL|passed|FAILED|random family" "$OUT/test.log" | head -20 | tee -a "$OUT/summary.txt"
first=1
for seed in $SEEDS; do
  stamp "gemm_bench --random $seed"
  extra=()
  [ $first = 1 ] && [ "${OVERHEAD:-1}" = 1 ] && extra=(--overhead)
  first=0
  timeout "${BENCH_TIMEOUT:-200}" "$BIN/gemm_bench" --quick --random "$seed" --count 64 --commit "$COMMIT" \
    --json "$OUT/gemm.jsonl" "${extra[@]}" "$@" > "$OUT/random_$seed.log" 2>&1
  echo "random $seed exit $?" >> "$OUT/summary.txt"
done
if [ "${FIXED:-1}" = 1 ]; then
  stamp "gemm_bench fixed list"
  timeout "${FIXED_TIMEOUT:-150}" "$BIN/gemm_bench" --quick --commit "$COMMIT" --json "$OUT/gemm.jsonl" ${FIXED_ARGS:-} \
    > "$OUT/fixed.log" 2>&1
  echo "fixed exit $?" >> "$OUT/summary.txt"
fi
stamp "done"
echo "===== summary"
cat "$OUT/summary.txt"
for f in "$OUT"/random_*.log "$OUT/fixed.log"; do
  [ -f "$f" ] || continue
  echo "== $(basename "$f")"
  grep -E "^launch overhead|^  [0-9]+x.*(event)|configuration .*geometric|geometric mean|^  [0-9]\.[0-9]{3}  " "$f" | cut -c1-150
done
