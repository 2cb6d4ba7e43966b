#!/usr/bin/env bash
# run.sh: set everything up, build, and run mkernel's main job. Safe to run again.
# Today the main job is the command-ring demonstration: producer threads standing in for GPU
# blocks push commands that one validating consumer (what a daemon proxy runs) takes exactly once.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

bash "$repo/scripts/install-deps.sh"
echo "== build ($build_dir)"
mkernel_configure_and_build
echo "== command ring demonstration"
"$build_dir/protocol/mkernel-ring-demo" "$@"
