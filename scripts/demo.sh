#!/usr/bin/env bash
# demo.sh: the main job on an already built tree: start mkerneld with its built-in default
# config (no GPU and no RDMA device needed) in a private runtime directory, move data through
# one of its proxies with the demonstration client, show what `mkerneldctl status` and `stats`
# report, and stop the daemon; then, where Hopper GPUs are present, run the fused
# AllGather+GEMM on them beside NCCL + cuBLAS. Extra arguments go to mkernel-demo-client.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

bin="$build_dir/daemon"
runtime_dir=$(mktemp -d /tmp/mkerneld-demo.XXXXXX)
log="$runtime_dir/mkerneld.log"
"$bin/mkerneld" --foreground --runtime-dir "$runtime_dir" >"$log" 2>&1 &
daemon_pid=$!
cleanup() {
  kill -TERM "$daemon_pid" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$daemon_pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$daemon_pid" 2>/dev/null || true
  rm -rf "$runtime_dir"
}
trap cleanup EXIT

for _ in $(seq 100); do
  [ -S "$runtime_dir/mkerneld.sock" ] && [ -S "$runtime_dir/admin.sock" ] && break
  kill -0 "$daemon_pid" 2>/dev/null || { echo "mkerneld exited:"; cat "$log"; exit 1; }
  sleep 0.1
done
[ -S "$runtime_dir/admin.sock" ] || { echo "mkerneld did not come up within 10 s:"; cat "$log"; exit 1; }

echo "== mkerneld started (pid $daemon_pid, runtime directory $runtime_dir)"
sed 's/^/   /' "$log"
echo "== demonstration client"
"$bin/mkernel-demo-client" --runtime-dir "$runtime_dir" "$@"
echo "== mkerneldctl status"
"$bin/ctl/mkerneldctl" --socket "$runtime_dir/admin.sock" status
echo "== mkerneldctl stats"
"$bin/ctl/mkerneldctl" --socket "$runtime_dir/admin.sock" stats
echo "== mkerneldctl health"
"$bin/ctl/mkerneldctl" --socket "$runtime_dir/admin.sock" health

# The fused AllGather+GEMM on the GPUs this machine has (NVLink between them when there are two
# or more), beside NCCL all-gather + cuBLAS and our GEMM alone: every result checked, then the
# table. Without a Hopper GPU, say so.
echo "== fused AllGather+GEMM"
gpus=0
if command -v nvidia-smi >/dev/null 2>&1; then
  gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | grep -c -E 'H100|H200|H800|GH200' || true)
fi
bench="$build_dir/bench/fused/ag_gemm_bench"
if [ "$gpus" -lt 1 ]; then
  echo "   no Hopper GPU on this machine: the fused kernels need one (H100/H200); skipped"
elif [ ! -x "$bench" ]; then
  echo "   $bench was not built (CUDA toolkit or NCCL missing when building); skipped"
else
  NCCL_NVLS_ENABLE=0 MKERNELD="$bin/mkerneld" "$bench" --world "$gpus" --shapes "8192x8192x8192,1024x8192x8192" \
    --iters 20 --rounds 2
fi
