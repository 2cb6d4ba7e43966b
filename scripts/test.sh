#!/usr/bin/env bash
# test.sh: set everything up, build everything (every CUDA source is compiled when a CUDA
# toolkit is present), and run the test suites: cpu, integration, gpu (skipped with the reason
# where there is no GPU) and, with clang, the libFuzzer target for a bounded time.
# Exits non-zero on any failure. Safe to run again.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

bash "$repo/scripts/install-deps.sh"
echo "== build ($build_dir)"
mkernel_configure_and_build

echo "== fuzz (libFuzzer, clang)"
fuzz_dir=${build_dir}-fuzz
cmake -S "$repo" -B "$fuzz_dir" -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DMKERNEL_CUDA=OFF -DMKERNEL_BUILD_DAEMON=OFF -DMKERNEL_BUILD_BENCH=OFF \
  -DMKERNEL_BUILD_FUZZERS=ON -DMKERNEL_FUZZ_SECONDS="${MKERNEL_FUZZ_SECONDS:-60}" >/dev/null
cmake --build "$fuzz_dir" -j "$jobs" --target ring_consumer_fuzzer
ctest --test-dir "$fuzz_dir" -L fuzz --output-on-failure

echo "== gpu tests (each says why when it is skipped)"
ctest --test-dir "$build_dir" -L gpu -V 2>&1 | grep -E "SKIPPED|PASS|FAIL|tests passed" || true

echo "== all tests"
ctest --test-dir "$build_dir" -j "$jobs" --output-on-failure --timeout 600
