#!/usr/bin/env bash
# run_overhead_on_gpu_machine.sh: what a fused GEMM op costs beyond its GEMM when there is
# nothing to move (one rank), on the GPU machine, in one call: AllGather+GEMM, GEMM+ReduceScatter
# and GEMM+AllReduce at small and odd M, each beside our GEMM alone (in its own and in the fused
# op's configuration) and cuBLAS, with and without the programmatic launch (`mkernel_pdl`),
# timed two ways: eager (each call from an idle GPU: host time included) and replays of a CUDA
# graph of 20 calls (the GPU's time per call). Then the two GPU tests that run the programmatic
# launch (gemm_rs_gpu_test, ag_gemm_gpu_test). Records appended to $OUT/{ag_gemm,gemm_rs,gemm_ar}.jsonl,
# logs under $OUT, tables last, the tests' summary after them.
#   bench/fused/run_overhead_on_gpu_machine.sh BUNDLE_DIR COMMIT MACHINE
# BUNDLE_DIR from scripts/collect-bundle.sh with bench/fused/gemm_rs_bench, bench/fused/ag_gemm_bench,
# tests/gpu/fused/gemm_rs_gpu_test and tests/gpu/fused/ag_gemm_gpu_test. Needs about 5 minutes.
set -u
bundle=${1:?usage: run_overhead_on_gpu_machine.sh BUNDLE_DIR COMMIT MACHINE}
commit=${2:?commit}
machine=${3:?machine}
OUT=${OUT:-./overhead-out}
mkdir -p "$OUT"
source "$(dirname "${BASH_SOURCE[0]}")/../gpu_machine_env.sh"
common=(--world 1 --commit "$commit" --machine "$machine" --iters 30 --rounds 3)
run() {  # name, timeout, program, args...
  local name=$1 t=$2 prog=$3
  shift 3
  echo "== $prog $name: $*"
  timeout "$t" "$bundle/bin/$prog" "${common[@]}" "$@" > "$OUT/$name.log" 2>&1
  echo "exit $?"
}
rs_shapes=(--small-m --odd --shapes 8192x8192x8192)
run rs_eager 120 gemm_rs_bench "${rs_shapes[@]}" --jsonl "$OUT/gemm_rs.jsonl"
run rs_graph 120 gemm_rs_bench "${rs_shapes[@]}" --graph 20 --jsonl "$OUT/gemm_rs.jsonl"
run ag_eager 90 ag_gemm_bench --small-m --jsonl "$OUT/ag_gemm.jsonl"
run ag_graph 90 ag_gemm_bench --small-m --graph 20 --jsonl "$OUT/ag_gemm.jsonl"
ar_shapes=128x8192x8192,512x8192x8192,1000x4104x4160,8192x8192x8192
run ar_eager 60 gemm_rs_bench --all-reduce --shapes "$ar_shapes" --jsonl "$OUT/gemm_ar.jsonl"
run ar_graph 60 gemm_rs_bench --all-reduce --shapes "$ar_shapes" --graph 20 --jsonl "$OUT/gemm_ar.jsonl"
MKERNEL_TEST_TIMEOUT=240 OUT=$OUT/tests bash "$(dirname "${BASH_SOURCE[0]}")/../../tests/gpu/run_on_gpu_machine.sh" \
  "$bundle" gemm_rs_gpu_test ag_gemm_gpu_test > "$OUT/tests.log" 2>&1
for name in rs_eager rs_graph ag_eager ag_graph ar_eager ar_graph; do
  echo "==== $name"
  sed -n '/^gemm_rs_bench\|^ag_gemm_bench/,$p' "$OUT/$name.log" | grep -v '^checked' | cut -c1-220
  grep -q '^gemm_rs_bench\|^ag_gemm_bench' "$OUT/$name.log" || tail -5 "$OUT/$name.log"
done
echo "==== tests (logs under $OUT/tests)"
tail -3 "$OUT/tests.log"
