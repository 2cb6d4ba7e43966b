#!/usr/bin/env bash
# run_role_cost_on_gpu_machine.sh: what the fused ops' roles cost the GEMM kernel at one rank, on
# the GPU machine, in one call: run_overhead_on_gpu_machine.sh (eager and graph-replay timings of
# AllGather+GEMM, GEMM+ReduceScatter and GEMM+AllReduce beside our GEMM and cuBLAS, then the
# gemm_rs and ag_gemm GPU tests), then Nsight Compute kernel durations (--clock-control none) of
# the GEMM+ReduceScatter kernel against the same engine instantiation without the role
# (NoRole: gemm_rs_bench's "mkernel_gemm_as_fused") at the shapes docs/kernels.md section 11
# measured. Logs under $OUT; the ncu table last.
#   bench/fused/run_role_cost_on_gpu_machine.sh BUNDLE_DIR COMMIT MACHINE
# BUNDLE_DIR as run_overhead_on_gpu_machine.sh's. Needs about 7 minutes.
set -u
bundle=${1:?usage: run_role_cost_on_gpu_machine.sh BUNDLE_DIR COMMIT MACHINE}
commit=${2:?commit}
machine=${3:?machine}
OUT=${OUT:-./role-cost-out}
mkdir -p "$OUT"
script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
OUT=$OUT/overhead bash "$script_dir/run_overhead_on_gpu_machine.sh" "$bundle" "$commit" "$machine" > "$OUT/overhead.txt" 2>&1
echo "overhead script exit $? (output in $OUT/overhead.txt)"
source "$script_dir/../gpu_machine_env.sh"
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
sed -n '/^==== rs_graph/,/^==== ag_eager/p;/^==== ag_graph/,/^==== ar_eager/p;/^==== ar_graph/,$p' "$OUT/overhead.txt" | cut -c1-160
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
