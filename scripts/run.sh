#!/usr/bin/env bash
# run.sh: set everything up, build, and run mkernel's main job. Safe to run again.
# The main job: mkerneld with its built-in default config (no GPU or RDMA device needed) and a
# demonstration client that moves data through one of its proxies, then what mkerneldctl
# reports. Arguments go to the demonstration client.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

bash "$repo/scripts/install-deps.sh"
echo "== build ($build_dir)"
mkernel_configure_and_build
bash "$repo/scripts/demo.sh" "$@"
