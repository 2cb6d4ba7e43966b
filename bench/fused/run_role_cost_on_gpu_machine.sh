#!/usr/bin/env bash
# run_role_cost_on_gpu_machine.sh: what the fused ops' roles cost the GEMM kernel at one rank, on
# the GPU machine, in one call: run_overhead_on_gpu_machine.sh (eager and graph-replay timings of
# AllGather+GEMM, GEMM+ReduceScatter and GEMM+AllReduce beside our GEMM and cuBLAS, then the
# gemm_rs and ag_gemm GPU tests), then Nsight Compute kernel durations (--clock-control none) of
# the GEMM+ReduceScatter kernel against the same engine instantiation without the role
# (NoRole: gemm_rs_bench's "mkernel_gemm_as_fused") at the shapes docs/kernels.md section 11
# measured. Logs under $OUT; the ncu table last. By default only the graph-replay timings and the
# tests (about 5 minutes in all); ROLE_COST_FULL=1 runs the whole overhead script (about 7).
#   bench/fused/run_role_cost_on_gpu_machine.sh BUNDLE_DIR COMMIT MACHINE
# BUNDLE_DIR as run_overhead_on_gpu_machine.sh's.
set -u
bundle=${1:?usage: run_role_cost_on_gpu_machine.sh BUNDLE_DIR COMMIT MACHINE}
commit=${2:?commit}
machine=${3:?machine}
OUT=${OUT:-./role-cost-out}
mkdir -p "$OUT"
script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$script_dir/../gpu_machine_env.sh"
if [ "${ROLE_COST_FULL:-0}" = 1 ]; then
  OUT=$OUT/overhead bash "$script_dir/run_overhead_on_gpu_machine.sh" "$bundle" "$commit" "$machine" > "$OUT/overhead.txt" 2>&1
  echo "overhead script exit $? (output in $OUT/overhead.txt)"
else
  # The graph-replay half of run_overhead_on_gpu_machine.sh (the GPU's time per call) and its two
  # tests, in the same layout of logs, in about half the time.
  common=(--world 1 --commit "$commit" --machine "$machine" --iters 30 --rounds 3 --graph 20)
  {
    echo "==== rs_graph"
    timeout 120 "$bundle/bin/gemm_rs_bench" "${common[@]}" --small-m --odd --shapes 8192x8192x8192 \
      --jsonl "$OUT/gemm_rs.jsonl" 2>&1 | sed -n '/^gemm_rs_bench/,$p' | grep -v '^checked'
    echo "==== ag_graph"
    timeout 90 "$bundle/bin/ag_gemm_bench" "${common[@]}" --small-m --jsonl "$OUT/ag_gemm.jsonl" 2>&1 |
      sed -n '/^ag_gemm_bench/,$p' | grep -v '^checked'
    echo "==== ar_graph"
    timeout 60 "$bundle/bin/gemm_rs_bench" "${common[@]}" --all-reduce \
      --shapes 128x8192x8192,512x8192x8192,1000x4104x4160,8192x8192x8192 --jsonl "$OUT/gemm_ar.jsonl" 2>&1 |
      sed -n '/^gemm_rs_bench/,$p' | grep -v '^checked'
    MKERNEL_TEST_TIMEOUT=240 OUT=$OUT/tests bash "$script_dir/../../tests/gpu/run_on_gpu_machine.sh" \
      "$bundle" gemm_rs_gpu_test ag_gemm_gpu_test > "$OUT/tests.log" 2>&1
    echo "==== tests (logs under $OUT/tests)"
    tail -3 "$OUT/tests.log"
  } > "$OUT/overhead.txt" 2>&1
fi
ncu_bin=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
shapes=(128x8192x8192 1000x4104x4160 8200x1544x2112)
for s in "${shapes[@]}"; do
  if [ -z "$ncu_bin" ]; then
    echo "ncu: not found on this machine" > "$OUT/ncu_$s.txt"
    continue
  fi
  timeout 150 "$ncu_bin" --clock-control none --metrics gpu__time_duration.sum --print-summary per-kernel \
    -k regex:'sm90_bf16_gemm_kernel|begin_launch' \
    "$bundle/bin/gemm_rs_bench" --world 1 --iters 10 --rounds 1 --shapes "$s" > "$OUT/ncu_$s.txt" 2>&1
  echo "ncu $s exit $?"
done
echo "==== overhead tables (from $OUT/overhead.txt)"
sed -n '/^==== rs_graph/,/^==== ag_eager/p;/^==== ag_graph/,/^==== ar_eager/p;/^==== ar_graph/,$p' "$OUT/overhead.txt" |
  grep -v '^==== ag_eager\|^==== ar_eager' | cut -c1-160
echo "==== ncu kernel durations (us, avg of the launches; --clock-control none)"
for s in "${shapes[@]}"; do
  awk -v shape="$s" '
    /sm90_bf16_gemm_kernel|begin_launch/ {
      name = $0
      sub(/^ */, "", name)
      if (name ~ /begin_launch/) kind = "begin_launch"
      else {
        match(name, /Sm90GemmTraits<[^>]*>/)
        t = substr(name, RSTART + 15, RLENGTH - 16)
        role = name ~ /GemmRsRole/ ? "GemmRsRole" : (name ~ /NoRole/ ? "NoRole" : "other")
        kind = role " <" t ">"
      }
      getline
      if ($1 == "gpu__time_duration.sum") printf "%-16s %-40s min %8s max %8s avg %8s\n", shape, kind, $3, $4, $5
    }' "$OUT/ncu_$s.txt"
  grep -q "gpu__time_duration" "$OUT/ncu_$s.txt" || { echo "$s: no kernel durations; tail of the log:"; tail -5 "$OUT/ncu_$s.txt"; }
done
