#!/usr/bin/env bash
# pip_install_test.sh PYTHON: `pip install .` of the repository into a throwaway venv through
# scikit-build-core, with CUDA switched off so that it takes a minute, not the kernels' build
# (the compiled module's build is the main CMake build's, which drives the same python/
# CMakeLists.txt). Checks that the package installs, imports, names the reason its compiled
# module is missing, and refuses an op with that reason.
# Exit 0: passed; 77: skipped (the reason is printed: no package index reachable); else failed.
set -uo pipefail
# The launcher's variables would change what Communicator.from_env says below.
unset RANK WORLD_SIZE LOCAL_RANK MASTER_ADDR MASTER_PORT MKERNEL_TOKEN
python=${1:?usage: pip_install_test.sh PYTHON}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
work=$(mktemp -d /tmp/mkernel-pip-XXXXXX)
trap 'rm -rf "$work"' EXIT

"$python" -m venv "$work/venv" || { echo "FAIL: cannot make a venv with $python"; exit 1; }
pip=("$work/venv/bin/python" -m pip --disable-pip-version-check)
# The build requirements (scikit-build-core, nanobind) come from the package index in pip's
# isolated build environment; without an index there is nothing to test.
if ! timeout 120 "${pip[@]}" download -q --no-deps -d "$work/probe" scikit-build-core > "$work/probe.log" 2>&1; then
  echo "SKIPPED python_pip_install_test: no Python package index reachable ($(tail -1 "$work/probe.log"))"
  exit 77
fi
start=$(date +%s)
if ! timeout 800 "${pip[@]}" install -q "$repo" -C cmake.define.MKERNEL_CUDA=OFF -C build-dir="$work/build" \
    > "$work/install.log" 2>&1; then
  echo "FAIL: pip install . did not succeed; its log:"
  tail -40 "$work/install.log"
  exit 1
fi
echo "pip install . (CUDA off) took $(($(date +%s) - start)) s"
cd "$work" || exit 1  # away from the source tree, so the installed package is the one imported
"$work/venv/bin/python" - <<'PY'
import os, sys
import mkernel
from mkernel import _build_info
where = os.path.dirname(mkernel.__file__)
assert "site-packages" in where, where
assert not mkernel.native_available()
assert "no CUDA toolkit" in mkernel.native_unavailable_reason, mkernel.native_unavailable_reason
assert mkernel.torch_unavailable_reason.startswith("torch is not installed"), mkernel.torch_unavailable_reason
try:
    mkernel.fused_all_gather_matmul(None, [], 0, "0")
except mkernel.NotBuiltError as e:
    assert "torch is not installed" in str(e)
else:
    sys.exit("fused_all_gather_matmul without torch did not refuse")
try:
    mkernel.Communicator.from_env(workspace_bytes=1 << 20)
except mkernel.NotBuiltError as e:
    assert "built without its compiled module: no CUDA toolkit" in str(e), str(e)
else:
    sys.exit("Communicator.from_env without the compiled module did not refuse")
files = sorted(os.listdir(where))
assert not any(f.startswith("lib") or f.endswith(".a") for f in files), files
print("installed at", where, "with", ", ".join(f for f in files if f.endswith(".py")))
print("reason given:", mkernel.native_unavailable_reason)
PY
[ $? -eq 0 ] || { echo "FAIL: the package installed without CUDA does not behave as documented"; exit 1; }

# With the CUDA toolkit: the whole package (libmkernel, its kernels, the module), as a user's
# `pip install .` builds it (the target mkernel_python only: about two minutes on two cores).
if ! command -v nvcc > /dev/null 2>&1 && [ ! -x /usr/local/cuda/bin/nvcc ]; then
  echo "no CUDA toolkit here: the install with the compiled module is not tried"
  exit 0
fi
start=$(date +%s)
cd "$repo" || exit 1
if ! CMAKE_BUILD_PARALLEL_LEVEL=2 timeout 800 "${pip[@]}" install -q --force-reinstall --no-deps "$repo" \
    -C build-dir="$work/build-cuda" > "$work/install-cuda.log" 2>&1; then
  echo "FAIL: pip install . with CUDA did not succeed; its log:"
  tail -40 "$work/install-cuda.log"
  exit 1
fi
echo "pip install . (CUDA on) took $(($(date +%s) - start)) s"
cd "$work" || exit 1
"$work/venv/bin/python" - <<'PY'
import glob, os
import mkernel
assert mkernel.native_available(), mkernel.native_unavailable_reason
where = os.path.dirname(mkernel.__file__)
module = glob.glob(os.path.join(where, "_C*.so"))
assert len(module) == 1, os.listdir(where)
assert mkernel.all_gather_matmul_workspace_bytes(2, 128, 256) == 2 * 128 * 256 * 2
try:  # a runtime Status through the installed module
    mkernel.Communicator.from_env(workspace_bytes=1 << 20)
except mkernel.ArgumentError as e:
    assert e.where.startswith("runtime.cc:"), e.where
print("installed", os.path.basename(module[0]), "with the compiled module")
PY
