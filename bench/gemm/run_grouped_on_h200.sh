#!/bin/bash
# run_grouped_on_h200.sh: one call on the GPU machine for the grouped GEMM (experts): the
# correctness test, the benchmark against one cuBLAS call per group and our dense GEMM,
# torch._grouped_mm on the same counts, and the combined table last. Logs under $OUT
# (default ./grouped-out); records appended to $OUT/grouped_gemm.jsonl (copy them into
# bench/results/grouped_gemm.jsonl).
#   bench/gemm/run_grouped_on_h200.sh BIN_DIR [bench args...]
# BIN_DIR holds grouped_gemm_gpu_test and grouped_gemm_bench built for sm_90a (a directory with
# both, or a build directory: tests/gpu/gemm/ and bench/gemm/ are searched too). COMMIT names the
# tree measured when git is not at hand.
set -u
BIN=${1:?usage: run_grouped_on_h200.sh BIN_DIR [bench args...]}
shift
find_bin() {
  for d in "$BIN" "$BIN/tests/gpu/gemm" "$BIN/bench/gemm"; do
    [ -x "$d/$1" ] && { echo "$d/$1"; return; }
  done
  echo "run_grouped_on_h200.sh: $1 not found under $BIN" >&2
  echo "/nonexistent/$1"
}
TEST=$(find_bin grouped_gemm_gpu_test)
BENCH=$(find_bin grouped_gemm_bench)
OUT=${OUT:-./grouped-out}
mkdir -p "$OUT"
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PYTHON:-/opt/torch/.venv/bin/python3}
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
for d in /opt/torch/.venv/lib/python3*/site-packages/nvidia/cublas/lib /opt/torch/.venv/lib/python3*/site-packages/nvidia/cu13/lib; do
  [ -d "$d" ] && export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$d
done
if [ -z "${COMMIT:-}" ]; then
  COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
  if [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then COMMIT="$COMMIT+wip"; fi
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv | tee "$OUT/gpu.txt"

if [ -z "${SKIP_TEST:-}" ]; then  # SKIP_TEST=1: the caller ran the test already
  echo "== grouped_gemm_gpu_test"
  timeout 300 "$TEST" 2>&1 | tee "$OUT/test.log"
  echo "test exit: ${PIPESTATUS[0]}"
fi

echo "== grouped_gemm_bench $*"
timeout 420 "$BENCH" --json "$OUT/grouped_gemm.jsonl" --cases-out "$OUT/cases.json" \
  --commit "$COMMIT" "$@" 2>&1 | tee "$OUT/bench.log"
echo "bench exit: ${PIPESTATUS[0]}"

echo "== torch._grouped_mm ($PY)"
timeout 300 "$PY" "$HERE/grouped_gemm_torch.py" --cases "$OUT/cases.json" --json "$OUT/grouped_gemm.jsonl" \
  --commit "$COMMIT" 2>&1 | tee "$OUT/torch.log"
echo "torch exit: ${PIPESTATUS[0]}"

# The table last.
python3 "$HERE/grouped_gemm_torch.py" --report "$OUT/grouped_gemm.jsonl" --commit "$COMMIT" | tee "$OUT/table.txt"
