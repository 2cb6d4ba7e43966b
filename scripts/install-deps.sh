#!/usr/bin/env bash
# install-deps.sh: everything mkernel needs on Debian 12, installed idempotently.
#   - Debian packages (build tools, RDMA and fabric libraries, gRPC/protobuf, logging, config,
#     CLI, test and benchmark frameworks, promtool to check the metrics text, topology, systemd)
#   - a Python venv in .deps/venv with the pinned nvidia-cutlass wheel (CUTLASS/CuTe headers)
#     and the Python packages the tests use (and the Python package's: nanobind,
#     scikit-build-core, pytest, torch)
# The CUDA 13 toolkit cannot come from Debian's archive: it is detected and reported, never
# installed here. Without it everything that needs no CUDA is still built and tested.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
deps_dir=${MKERNEL_DEPS_DIR:-$repo/.deps}
cutlass_version=4.2.0.0

packages=(
  build-essential cmake ninja-build pkg-config git ca-certificates
  clang libclang-rt-14-dev
  python3 python3-venv python3-pip
  libibverbs-dev rdma-core ibverbs-utils libfabric-dev libfabric-bin
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libspdlog-dev libfmt-dev libyaml-cpp-dev libcli11-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  prometheus libhwloc-dev libsystemd-dev systemd
  iproute2 nftables procps
)

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"
  elif command -v sudo >/dev/null 2>&1; then sudo "$@"
  else
    echo "install-deps: installing Debian packages needs root; run as root or install sudo" >&2
    return 1
  fi
}

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${#missing[@]} Debian package(s): ${missing[*]}"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
else
  echo "install-deps: Debian packages already installed"
fi

# Python: a private venv, so the system Python (PEP 668) is left alone.
python=${MKERNEL_PYTHON:-python3}
if [ ! -x "$deps_dir/venv/bin/python" ]; then
  echo "install-deps: creating $deps_dir/venv"
  mkdir -p "$deps_dir"
  "$python" -m venv "$deps_dir/venv"
fi
pip=("$deps_dir/venv/bin/python" -m pip --disable-pip-version-check -q)
want_py=("nvidia-cutlass==$cutlass_version" "grpcio" "grpcio-health-checking" "pyyaml")
if ! "$deps_dir/venv/bin/python" - "$cutlass_version" <<'PY' 2>/dev/null; then
import importlib.metadata as md, sys
assert md.version("nvidia-cutlass") == sys.argv[1]
for name in ("grpcio", "grpcio-health-checking", "pyyaml"):
    md.version(name)
PY
  echo "install-deps: installing Python packages: ${want_py[*]}"
  # nvidia-cutlass is wanted for its C++ headers only: its Python dependencies are not needed.
  "${pip[@]}" install --no-deps "nvidia-cutlass==$cutlass_version"
  "${pip[@]}" install grpcio grpcio-health-checking pyyaml
else
  echo "install-deps: Python packages already installed"
fi
# The Python package (python/, docs/python.md): nanobind and scikit-build-core build it, pytest
# runs its tests, torch is what its ops serve. torch is pinned to the GPU machine's version; the
# package index has only CUDA builds for Linux (about 4.6 GB with their NVIDIA libraries, a
# minute or two here), which import and trace fine without a GPU. MKERNEL_TORCH=off leaves torch
# out (its tests then say they are skipped and why); a failed torch install only warns.
torch_version=2.11.0
if ! "$deps_dir/venv/bin/python" -c 'import nanobind, scikit_build_core, pytest' 2>/dev/null; then
  echo "install-deps: installing Python packages: nanobind scikit-build-core pytest"
  "${pip[@]}" install "nanobind==3.1.0" "scikit-build-core==1.1.2" pytest
fi
if [ "${MKERNEL_TORCH:-on}" = off ]; then
  echo "install-deps: torch left out (MKERNEL_TORCH=off)"
elif "$deps_dir/venv/bin/python" - "$torch_version" <<'PY' 2>/dev/null; then
import importlib.metadata as md, sys
assert md.version("torch").split("+")[0] == sys.argv[1]
md.version("numpy")
PY
  echo "install-deps: torch $torch_version already installed"
else
  echo "install-deps: installing torch $torch_version and numpy (bounded to 15 minutes)"
  start=$(date +%s)
  if timeout 900 "${pip[@]}" install --no-warn-conflicts "torch==$torch_version" numpy; then
    echo "install-deps: torch $torch_version installed in $(($(date +%s) - start)) s"
  else
    echo "install-deps: WARNING: torch $torch_version could not be installed; the Python package's torch tests will be skipped"
  fi
fi

cute_dir=$("$deps_dir/venv/bin/python" -c \
  'import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), "source", "include"))')
[ -f "$cute_dir/cute/tensor.hpp" ] || { echo "install-deps: CuTe headers missing in $cute_dir" >&2; exit 1; }
echo "install-deps: CUTLASS/CuTe $cutlass_version headers at $cute_dir"

# CUDA: detected, never installed.
nvcc_path=$(command -v nvcc || true)
[ -n "$nvcc_path" ] || { [ -x /usr/local/cuda/bin/nvcc ] && nvcc_path=/usr/local/cuda/bin/nvcc; } || true
if [ -n "$nvcc_path" ]; then
  echo "install-deps: CUDA toolkit: $("$nvcc_path" --version | grep -o 'release [0-9.]*') at $nvcc_path"
else
  echo "install-deps: NO CUDA TOOLKIT FOUND. The CUDA 13 toolkit is not in Debian's archive;"
  echo "install-deps: install it from NVIDIA to build the kernels. Everything that needs no CUDA"
  echo "install-deps: (protocol, daemon, CPU and integration tests) is built and tested without it."
fi
