#!/usr/bin/env bash
# The main job: install the Debian packages, build the `flashlite` CLI into build/ and run `flashlite attn` (on the
# GPU when there is one, else the CPU). Extra arguments go to `flashlite attn`, e.g.
#   bash scripts/run.sh --causal --seq-q 4096 --heads 16
#
# What it builds: with a GPU, the CLI with the CUDA kernels (the kernels for the GPU found: ~3 minutes on 16 cores);
# without one, the CPU-only CLI (~1.5 minutes on 2 cores). A build/ that scripts/test.sh already made is reused as it
# is. The binary is build/bin/flashlite (BUILD_DIR overrides build/); `cmake --install build --prefix DIR` installs
# it as DIR/bin/flashlite.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD_DIR:-$root/build}"
export PATH="$PATH:/usr/local/cuda/bin"
bash "$root/scripts/setup.sh"

gpu_cc="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .' || true)"
args=()
if [ -n "$gpu_cc" ] && command -v nvcc >/dev/null; then
  [ "$gpu_cc" = 90 ] && gpu_cc=90a  # Hopper's wgmma/TMA kernels need the arch-specific target
  echo "run: GPU found (sm_$gpu_cc): building the CLI with the CUDA kernels for it into $build"
  args=(-DFLASHLITE_CUDA=ON)
  grep -q '^CMAKE_CUDA_ARCHITECTURES:' "$build/CMakeCache.txt" 2>/dev/null || args+=(-DCMAKE_CUDA_ARCHITECTURES="$gpu_cc")
elif [ -f "$build/CMakeCache.txt" ]; then
  echo "run: no GPU found: building the CLI in the existing $build (its CUDA setting unchanged)"
else
  echo "run: no GPU found: building the CPU-only CLI into $build (about 1.5 minutes on 2 cores)"
  args=(-DFLASHLITE_CUDA=OFF)
fi
mkdir -p "$build"
cmake -S "$root" -B "$build" -G Ninja "${args[@]}" > "$build/configure.log" 2>&1 \
  || { cat "$build/configure.log" >&2; exit 1; }
cmake --build "$build" -j "${JOBS:-$(nproc)}" --target flashlite_cli flashlite_bench_cpu
echo "run: built $build/bin/flashlite"
"$build/bin/flashlite" info
"$build/bin/flashlite" attn "$@"
