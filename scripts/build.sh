#!/usr/bin/env bash
# Configures and builds flashlite into BUILD_DIR (default build/). CUDA is enabled when nvcc is found.
# Extra CMake arguments can be passed in CMAKE_ARGS.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD_DIR:-$root/build}"
export PATH="$PATH:/usr/local/cuda/bin"
jobs="${JOBS:-$(nproc)}"
# shellcheck disable=SC2086
cmake -S "$root" -B "$build" -G Ninja ${CMAKE_ARGS:-}
cmake --build "$build" -j "$jobs"
