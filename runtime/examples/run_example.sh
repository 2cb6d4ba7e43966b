#!/usr/bin/env bash
# run_example.sh: runs one of the runtime's examples (mkernel-moe, mkernel-all-gather-gemm, ...) on
# this machine's first N GPUs, the way a user would under torchrun, with a private mkerneld that
# serves exactly those GPUs (libfabric shm between ranks it does not serve; ranks on it meet over
# NVLink). Every step is bounded in time; the daemon is stopped on exit.
#
#   runtime/examples/run_example.sh N PROGRAM [ARGS...]
#   e.g. runtime/examples/run_example.sh 2 build/runtime/mkernel-moe 4096 7168 256 8 2048
#
# MKERNELD (default: mkerneld on PATH) and TORCHRUN (default: torchrun on PATH, or
# /opt/torch/.venv/bin/torchrun) may be set. Exit status: the example's (124 when it ran past
# EXAMPLE_TIMEOUT seconds, default 300), or 2 when something it needs is missing (said why).
set -uo pipefail
ranks=${1:?usage: run_example.sh N PROGRAM [ARGS...]}
shift
program=${1:?usage: run_example.sh N PROGRAM [ARGS...]}
shift
fail() {
  echo "run_example.sh: $*" >&2
  exit 2
}
[[ $ranks =~ ^[1-9][0-9]*$ ]] || fail "N = '$ranks'; expected a positive number of ranks (one GPU each)"
[ -x "$program" ] || fail "$program is not an executable (build it: ninja -C build $(basename "$program"))"
mkerneld=${MKERNELD:-$(command -v mkerneld || true)}
[ -n "$mkerneld" ] && [ -x "$mkerneld" ] || fail "no mkerneld (set MKERNELD or put it on PATH)"
torchrun=${TORCHRUN:-$(command -v torchrun || echo /opt/torch/.venv/bin/torchrun)}
[ -x "$torchrun" ] || fail "no torchrun (set TORCHRUN; it only launches the ranks, no torch code runs)"
gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader 2> /dev/null | wc -l)
[ "$gpus" -ge "$ranks" ] || fail "$ranks rank(s) need as many GPUs; nvidia-smi sees $gpus"

source "$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/scripts/private-mkerneld.sh"
dir=$(mktemp -d /tmp/mkernel-example-XXXXXX)
cleanup() {
  private_mkerneld_stop
  rm -rf "$dir"
}
trap cleanup EXIT
master_port=$(private_mkerneld_free_port)
private_mkerneld_start "$mkerneld" "$ranks" "$dir" 2> "$dir/start.err" || fail "$(cat "$dir/start.err")"
MKERNEL_TOKEN=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
export MKERNEL_TOKEN NCCL_NVLS_ENABLE=0
timeout "${EXAMPLE_TIMEOUT:-300}" "$torchrun" --no-python --nproc_per_node="$ranks" --master_addr=127.0.0.1 \
  --master_port="$master_port" "$program" "$@"
rc=$?
[ $rc -eq 124 ] && echo "run_example.sh: $(basename "$program") did not finish within ${EXAMPLE_TIMEOUT:-300} s" >&2
if [ $rc -ne 0 ]; then
  echo "== mkerneld's log (last 20 lines)" >&2
  tail -20 "$dir/mkerneld.log" >&2
fi
exit $rc
