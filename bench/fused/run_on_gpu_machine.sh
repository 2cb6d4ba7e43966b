#!/usr/bin/env bash
# run_on_gpu_machine.sh: the fused-op benchmarks on the GPU machine, one call: AllGather+GEMM,
# GEMM+ReduceScatter and GEMM+AllReduce, ours beside NCCL + cuBLAS and PyTorch's fused ops (NVLink;
# none for AllReduce), AllGather+GEMM's block-split and copy variants (copy-engine pushes
# included), and with --nodes two nodes emulated through the proxies; appended to $OUT/ag_gemm.jsonl, $OUT/gemm_rs.jsonl and
# $OUT/gemm_ar.jsonl, tables last.
#   [PARTS="ag ag-torch rs ar"] bench/fused/run_on_gpu_machine.sh BUNDLE_DIR COMMIT MACHINE [--nodes]
# PARTS (default: all) splits the run over several device calls of at most 10 minutes:
#   ag (the fused op, blocks' and copy engines' pushes), ag-trace (where a launch's time goes, both
#   ways, rank 0's table printed), ag-variants (block counts, 16-byte copies),
#   ag-torch (PyTorch's ops), rs (GEMM+ReduceScatter and PyTorch's), ar (GEMM+AllReduce),
#   split (the adaptive split beside every static split and the default, AllGather+GEMM, ring
#   attention and the fused MoE, split_bench; with --nodes also through the proxies; to
#   $OUT/adaptive.jsonl).
set -u
PARTS=${PARTS:-ag ag-trace ag-variants ag-torch rs ar split}
bundle=${1:?usage: run_on_gpu_machine.sh BUNDLE_DIR COMMIT MACHINE [--nodes]}
commit=${2:?commit}
machine=${3:?machine}
nodes=${4:-}
OUT=${OUT:-./ag-out}
mkdir -p "$OUT"
source "$(dirname "${BASH_SOURCE[0]}")/../gpu_machine_env.sh"
common=(--jsonl "$OUT/ag_gemm.jsonl" --commit "$commit" --machine "$machine")
big=4096x8192x8192,8192x8192x8192,16384x14336x4096,32768x8192x8192
rs_common=(--jsonl "$OUT/gemm_rs.jsonl" --commit "$commit" --machine "$machine")
ar_common=(--all-reduce --jsonl "$OUT/gemm_ar.jsonl" --commit "$commit" --machine "$machine")
bench() {  # name, timeout, args...
  local name=$1 t=$2
  shift 2
  echo "== ag_gemm_bench $name: $*"
  timeout "$t" "$bundle/bin/ag_gemm_bench" --world "$gpus" "$@" "${common[@]}" > "$OUT/$name.log" 2>&1
  echo "exit $?"
}
trace_bench() {  # name, timeout, args...: no records (its timings carry the trace's cost)
  local name=$1 t=$2
  shift 2
  echo "== ag_gemm_bench $name: $*"
  timeout "$t" "$bundle/bin/ag_gemm_bench" --world "$gpus" "$@" --commit "$commit" --machine "$machine" \
    > "$OUT/$name.log" 2>&1
  echo "exit $?"
}
rs_bench() {  # name, timeout, args...
  local name=$1 t=$2
  shift 2
  echo "== gemm_rs_bench $name: $*"
  timeout "$t" "$bundle/bin/gemm_rs_bench" --world "$gpus" "$@" "${rs_common[@]}" > "$OUT/$name.log" 2>&1
  echo "exit $?"
}
ar_bench() {  # name, timeout, args...
  local name=$1 t=$2
  shift 2
  echo "== gemm_rs_bench --all-reduce $name: $*"
  timeout "$t" "$bundle/bin/gemm_rs_bench" --world "$gpus" "$@" "${ar_common[@]}" > "$OUT/$name.log" 2>&1
  echo "exit $?"
}
want() { [[ " $PARTS " == *" $1 "* ]]; }
if want ag; then
  bench main 200 --shapes "$big" --small-m --iters 40 --rounds 4
  bench ce 150 --shapes "$big" --small-m --copy-engine --iters 30 --rounds 3
fi
if want ag-trace; then  # where the time goes, pushes by the blocks and by the copy engines (not timings)
  mkdir -p "$OUT/trace_sm" "$OUT/trace_ce"
  trace_bench trace_sm 60 --shapes 8192x8192x8192 --trace "$OUT/trace_sm" --iters 6 --rounds 1
  trace_bench trace_ce 60 --shapes 8192x8192x8192 --copy-engine --trace "$OUT/trace_ce" --iters 6 --rounds 1
fi
if want ag-variants; then
  bench comm12 60 --shapes 4096x8192x8192,8192x8192x8192 --comm-blocks 12 --iters 30 --rounds 3
  bench lsu 60 --shapes 4096x8192x8192,8192x8192x8192 --lsu --iters 30 --rounds 3
  bench lsu12 60 --shapes 4096x8192x8192,8192x8192x8192 --lsu --comm-blocks 12 --iters 30 --rounds 3
fi
if want ag-torch; then
  echo "== PyTorch"
  timeout 170 "$py" -m torch.distributed.run --nproc_per_node="$gpus" bench/fused/ag_gemm_torch.py --small-m \
    --iters 40 "${common[@]}" > "$OUT/torch.log" 2>&1
  echo "exit $?"
fi
if want rs; then
  rs_bench rs_main 200 --shapes "$big" --small-m --odd --iters 40 --rounds 4
  echo "== PyTorch GEMM+ReduceScatter (after rs_main: its table reads mkernel's medians from gemm_rs.jsonl)"
  timeout 170 "$py" -m torch.distributed.run --nproc_per_node="$gpus" bench/fused/gemm_rs_torch.py --small-m --odd \
    --iters 40 "${rs_common[@]}" > "$OUT/rs_torch.log" 2>&1
  echo "exit $?"
fi
want ar && ar_bench ar_main 200 --shapes "$big" --small-m --odd --iters 40 --rounds 4
split_bench() {  # name, timeout, args...
  local name=$1 t=$2
  shift 2
  echo "== split_bench $name: $*"
  timeout "$t" "$bundle/bin/split_bench" --world "$gpus" "$@" --jsonl "$OUT/adaptive.jsonl" --commit "$commit" \
    --machine "$machine" > "$OUT/$name.log" 2>&1
  echo "exit $?"
}
if want split; then
  split_bench split_nvl 280 --kernels ag_gemm,ring --shapes 4096x8192x8192,8192x8192x8192,16384x14336x4096 \
    --seqs 32768 --iters 16 --rounds 4
  split_bench split_moe 200 --kernels moe --tokens 4096 --iters 16 --rounds 4
  [ "$nodes" = "--nodes" ] && split_bench split_nodes 280 --nodes --provider shm --kernels ag_gemm,ring \
    --shapes 4096x8192x8192,8192x8192x8192 --seqs 32768 --iters 8 --rounds 2
fi
if [ "$nodes" = "--nodes" ]; then
  bench nodes 110 --nodes --provider shm --shapes 4096x8192x8192,8192x8192x8192 --iters 20 --rounds 2
  mkdir -p "$OUT/trace_nodes"
  trace_bench trace_nodes 90 --nodes --provider shm --shapes 8192x8192x8192 --trace "$OUT/trace_nodes" --iters 4 \
    --rounds 1
  rs_bench rs_nodes 110 --nodes --provider shm --shapes 4096x8192x8192,8192x8192x8192 --iters 20 --rounds 2
  ar_bench ar_nodes 110 --nodes --provider shm --shapes 4096x8192x8192,8192x8192x8192 --iters 20 --rounds 2
fi
for f in split_nvl split_moe split_nodes; do
  [ -f "$OUT/$f.log" ] && sed -n '/^split_bench: world/,$p' "$OUT/$f.log" | grep -v '^    ' | cut -c1-150
  [ -f "$OUT/$f.log" ] && grep -E '^split_bench: .*(wrong|differ|failed)|exit' "$OUT/$f.log"
done
for f in main comm12 lsu lsu12 ce nodes; do
  [ -f "$OUT/$f.log" ] && grep -E '^[0-9]+x|^ag_gemm_bench|exit|failed|FAIL' "$OUT/$f.log" | cut -c1-130
done
[ -f "$OUT/torch.log" ] && grep -E '^[0-9]+x' "$OUT/torch.log"
for d in trace_sm trace_ce trace_nodes; do
  for f in "$OUT/$d"/ag_trace_*_r0.txt; do [ -f "$f" ] && { echo "== $f"; head -c 6000 "$f"; }; done
done
for f in rs_main rs_nodes; do
  [ -f "$OUT/$f.log" ] && grep -E '^[0-9]+x|^gemm_rs_bench|^checked|exit|failed|FAIL|wrong' "$OUT/$f.log" | cut -c1-130
done
[ -f "$OUT/rs_torch.log" ] && { sed -n '/^gemm_rs_torch: world/,$p' "$OUT/rs_torch.log"; grep -E 'failed|disagrees' "$OUT/rs_torch.log"; }
for f in ar_main ar_nodes; do
  [ -f "$OUT/$f.log" ] && grep -E '^[0-9]+x|^gemm_rs_bench|^checked|exit|failed|FAIL|wrong' "$OUT/$f.log" | cut -c1-130
done
