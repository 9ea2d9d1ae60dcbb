#!/usr/bin/env bash
# The main job: install what is needed, build, and run `flashlite attn` (on the GPU when there is one, else the CPU).
# Extra arguments go to `flashlite attn` (e.g. scripts/run.sh --causal --seq-q 4096).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
CMAKE_ARGS="${CMAKE_ARGS:-} -DFLASHLITE_BUILD_TESTS=OFF" bash "$root/scripts/build.sh"
"${BUILD_DIR:-$root/build}/bin/flashlite" info
"${BUILD_DIR:-$root/build}/bin/flashlite" attn "$@"
