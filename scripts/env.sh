# env.sh: shared settings for the build scripts (sourced, not run).
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${MKERNEL_BUILD_DIR:-$repo/build}
jobs=${MKERNEL_JOBS:-$(nproc)}

mkernel_cuda_flag() {
  if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
    echo "-DMKERNEL_CUDA=ON"
  else
    echo "-DMKERNEL_CUDA=OFF"
  fi
}

mkernel_configure_and_build() {
  cmake -S "$repo" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    "$(mkernel_cuda_flag)" "$@"
  cmake --build "$build_dir" -j "$jobs"
}
