#!/usr/bin/env bash
# run.sh: the Python package on two GPUs (docs/python.md, "Tests"). Starts a private mkerneld
# serving GPUs 0 and 1 (libfabric shm between ranks it does not serve; both ranks are on it, so
# they meet over NVLink), runs test_fused_ops.py on two ranks under torchrun, stops the daemon.
#
#   MKERNEL_PYTHON=/opt/torch/.venv/bin/python3 PYTHONPATH=<package dir> MKERNELD=<mkerneld> \
#       bash tests/gpu/python/run.sh
#
# Exit 0: passed; 77: skipped, the reason printed (no torch, fewer than two GPUs, no compiled
# module, no mkerneld); anything else: failed. Every step is bounded in time.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
python=${MKERNEL_PYTHON:-python3}
test_name=python_two_gpu_test
skip() {
  echo "SKIPPED $test_name: $*"
  exit 77
}

"$python" -c "import torch" > /dev/null 2>&1 || skip "torch is not importable by $python"
gpus=$(timeout 120 "$python" -c "import torch; print(torch.cuda.device_count())" 2> /dev/null || echo 0)
# MKERNEL_PY_TEST_RANKS=1 runs the same cases with one rank on one GPU (a reduced check: the
# comparisons against torch's op hold with one rank too, but nothing crosses a link).
ranks=${MKERNEL_PY_TEST_RANKS:-2}
[ "${gpus:-0}" -ge "$ranks" ] 2> /dev/null || skip "needs $ranks CUDA GPUs, found ${gpus:-0}"
reason=$("$python" -c "import mkernel; print(mkernel.native_unavailable_reason)" 2>&1) ||
  skip "the mkernel package does not import: $reason"
[ -z "$reason" ] || skip "$reason"
mkerneld=${MKERNELD:-$(command -v mkerneld || true)}
[ -n "$mkerneld" ] && [ -x "$mkerneld" ] || skip "no mkerneld (set MKERNELD or put it on PATH)"

source "$here/../../../scripts/private-mkerneld.sh"
dir=$(mktemp -d /tmp/mkernel-py-gpu-XXXXXX)
trap 'private_mkerneld_stop' EXIT
master_port=$(private_mkerneld_free_port "$python")
# The peer listener is on TCP so that Communicator.from_env can dial it (MKERNEL_PEER_PORT).
# The daemon serves exactly the GPUs the ranks use (0 .. ranks - 1).
private_mkerneld_start "$mkerneld" "$ranks" "$dir" "$python" || { echo "FAIL: the private mkerneld did not start"; exit 1; }

MKERNEL_TOKEN=$("$python" -c "import secrets; print(secrets.token_hex(16))")
export MKERNEL_TOKEN
# NVLink multicast stays off on the shared machines (DESIGN.md); torch's symm_mem is the reference.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
timeout "${MKERNEL_TEST_TIMEOUT:-540}" "$python" -m torch.distributed.run --nproc_per_node="$ranks" \
  --master_addr=127.0.0.1 --master_port="$master_port" "$here/test_fused_ops.py"
rc=$?
[ $rc -eq 124 ] && echo "FAIL: the two ranks did not finish within ${MKERNEL_TEST_TIMEOUT:-540} s"
if [ $rc -ne 0 ]; then
  echo "== mkerneld's log (last 20 lines)"
  tail -20 "$dir/mkerneld.log"
fi
private_mkerneld_stop
rm -rf "$dir"
exit $rc
