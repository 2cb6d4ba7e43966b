#!/bin/bash
# run_on_h200.sh: one call on the GPU machine: the attention test, the benchmark beside SDPA (and,
# with --variants, block_n 128 and 160, the static order and [B, S, H, D] inputs), SASS counts;
# logs under $OUT, the table last.
#   bench/attention/run_on_h200.sh BUNDLE_DIR COMMIT [attention_bench.py args...]
# BUNDLE_DIR holds bin/attention_gpu_test, bin/libmkernel_attention_capi.so and attention_bench.py:
#   cmake --build build --target attention_gpu_test mkernel_attention_capi
#   mkdir -p B/bin && cp build/tests/gpu/attention/attention_gpu_test \
#     build/bench/attention/libmkernel_attention_capi.so B/bin && strip --strip-debug B/bin/*
#   cp bench/attention/attention_bench.py bench/attention/run_on_h200.sh B/
# (both link only the CUDA runtime statically and the C/C++ runtimes, so nothing else travels).
set -u
BUNDLE=${1:?usage: run_on_h200.sh BUNDLE_DIR COMMIT [bench args...]}
COMMIT=${2:?usage: run_on_h200.sh BUNDLE_DIR COMMIT [bench args...]}
shift 2
OUT=${OUT:-./attention-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$BUNDLE/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
if command -v cuobjdump > /dev/null; then
  cuobjdump --dump-sass "$BUNDLE/bin/libmkernel_attention_capi.so" > "$OUT/sass.txt" 2>&1
  echo "SASS: HGMMA $(grep -c HGMMA "$OUT/sass.txt"), RS+tnspB $(grep -c 'tnspB' "$OUT/sass.txt"), UTMALDG $(grep -c UTMALDG "$OUT/sass.txt"), LDL/STL $(grep -c 'LDL\|STL' "$OUT/sass.txt")"
  gzip -f "$OUT/sass.txt"
fi
echo "== attention_gpu_test"
timeout "${TEST_TIMEOUT:-240}" stdbuf -oL "$BUNDLE/bin/attention_gpu_test" > "$OUT/test.log" 2>&1
rc=$?
echo "test exit: $rc"
grep -v "^ok  " "$OUT/test.log" | cut -c1-220
if [ $rc -eq 124 ]; then
  echo "the test timed out (a hang): no benchmark"
  tail -5 "$OUT/test.log"
  exit 1
fi
echo "== attention_bench $*"
PYTHONUNBUFFERED=1 timeout "${BENCH_TIMEOUT:-300}" /opt/torch/.venv/bin/python3 "$BUNDLE/attention_bench.py" \
  --lib "$BUNDLE/bin/libmkernel_attention_capi.so" --jsonl "$OUT/ring_attention.jsonl" --commit "$COMMIT" \
  "$@" > "$OUT/bench.log" 2>&1
echo "bench exit: $?"
cut -c1-200 "$OUT/bench.log" | tail -45
