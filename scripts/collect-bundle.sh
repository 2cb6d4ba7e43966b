#!/usr/bin/env bash
# collect-bundle.sh: copies mkerneld, its tools and the given test or benchmark programs from a
# build directory into OUT/bin, and every shared library they need that a machine of the same
# architecture may lack into OUT/lib, so they run on a machine with no package registry (the GPU
# machine). The C and C++ runtimes (glibc, libstdc++, libgcc_s) are left out: the target's own,
# newer ones serve, and so do the GPU driver, NCCL and cuBLAS (benchmarks compare against the
# target's own; the CUDA toolkit there has cuBLAS). OUT/env.sh sets PATH and LD_LIBRARY_PATH.
#
#   scripts/collect-bundle.sh BUILD_DIR OUT_DIR [extra program paths relative to BUILD_DIR...]
set -euo pipefail
if [[ $# -lt 2 ]]; then
  echo "usage: $0 BUILD_DIR OUT_DIR [program ...]" >&2
  exit 2
fi
build=$1
out=$2
shift 2
[[ -d $build ]] || { echo "$0: build directory '$build' does not exist" >&2; exit 2; }
mkdir -p "$out/bin" "$out/lib"
programs=(daemon/mkerneld daemon/ctl/mkerneldctl daemon/mkernel-demo-client "$@")
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|libgcc_s|libstdc\+\+|libcuda\.so|libnvidia|libnccl|libcublas)'
for p in "${programs[@]}"; do
  src=$build/$p
  [[ -x $src ]] || { echo "$0: $src is not an executable (build it first)" >&2; exit 1; }
  cp -f "$src" "$out/bin/"
  ldd "$src" | while read -r name _ path _; do
    [[ $name =~ $skip ]] && continue
    [[ -n ${path:-} && -f $path ]] || continue
    cp -fL "$path" "$out/lib/$name"
  done
done
# Debug information is most of the size and the bundle travels: strip the copies.
if command -v strip > /dev/null; then
  strip --strip-debug "$out"/bin/* "$out"/lib/* 2> /dev/null || true
fi
cat > "$out/env.sh" <<'ENV'
# Source me: the bundle's programs first on PATH, its libraries found by the loader.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export PATH="$here/bin:$PATH"
export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export MKERNELD="$here/bin/mkerneld"
ENV
echo "bundle in $out: $(ls "$out/bin" | wc -l) programs, $(ls "$out/lib" | wc -l) libraries ($(du -sh "$out" | cut -f1))"
