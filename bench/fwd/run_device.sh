#!/usr/bin/env bash
# One call on the GPU machine for the fused forward kernel: build (sm_90a, all cores), GPU tests (ctest -L gpu),
# compute-sanitizer (memcheck, racecheck) on a small filter, the tile sweep and the torch peers. Logs and JSON go to
# $OUT (or ./out). Phases: any of build,test,sanitize,sweep,peers,sbs,ncu (comma list; default: the first five).
# PEER_ARGS (e.g. --flex) go to sdpa_peers.py.
#
#   bash bench/fwd/run_device.sh [phases] [commit] [sweep args...]
#
# GoogleTest: uses the machine's when CMake finds it, else a prefix carried in .carry/gtest (see docs/perf-notes.md).
set -uo pipefail
phases="${1:-build,test,sanitize,sweep,peers}"
commit="${2:-unknown}"
shift 2 2>/dev/null || shift $#
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# Logs collect in a scratch folder, packed into $OUT/fwd_run.tgz after every phase (the machine returns at most 8
# files, and a phase cut off by the time limit still leaves the earlier ones).
dest="${OUT:-$root/out}"
out=/tmp/fwd_run
build="${BUILD_DIR:-$root/build-fwd}"
mkdir -p "$out" "$dest"
export PYTHONUNBUFFERED=1
has() { [[ ",$phases," == *",$1,"* ]]; }
pack() { tar czf "$dest/fwd_run.tgz" -C "$out" . 2>/dev/null; }
log() { pack; echo "== $(date +%T) $*"; }
trap pack EXIT

if has build; then
  log "build"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$out/device.txt"
  extra=("-DCMAKE_EXE_LINKER_FLAGS=")  # reset what an older configure may have cached
  [ -d "$root/.carry/gtest" ] && extra+=("-DGTest_DIR=$root/.carry/gtest/usr/lib/x86_64-linux-gnu/cmake/GTest")
  if ! grep -rqs "run_cuda_naive" "$root/src/cuda/naive" 2>/dev/null; then
    # The CUDA naive backend has not landed in this tree: link a stand-in that throws (never committed).
    cat > /tmp/naive_stub.cpp <<'EOF'
#include <cstddef>
#include "backends.h"
#include "flashlite/errors.h"
namespace flashlite {
size_t cuda_naive_workspace_bytes(const AttentionProblem&) { return 0; }
void run_cuda_naive(const AttentionProblem&, void*, void*, size_t) { throw Error(ErrorKind::runtime, "no naive"); }
}
EOF
    g++ -std=c++20 -O2 -c -I"$root/src" -I"$root/include" -DFLASHLITE_WITH_CUDA=1 /tmp/naive_stub.cpp -o /tmp/naive_stub.o
    extra+=("-DCMAKE_CXX_STANDARD_LIBRARIES=/tmp/naive_stub.o" "-DCMAKE_CUDA_STANDARD_LIBRARIES=/tmp/naive_stub.o")
  fi
  configure() {
    cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
      -DFLASHLITE_BUILD_APPS=OFF -DFLASHLITE_BUILD_ENGINE=OFF -DFLASHLITE_FWD_SWEEP=ON "${extra[@]}" > "$out/cmake.log" 2>&1
  }
  configure || { rm -rf "$build"; configure; } || { tail -30 "$out/cmake.log"; exit 1; }
  start=$(date +%s)
  cmake --build "$build" -j"$(nproc)" ${BUILD_TARGETS:+--target $BUILD_TARGETS} > "$out/build.log" 2>&1 || { grep -E "error|FAILED" -A3 "$out/build.log" | head -60; exit 1; }
  log "built in $(( $(date +%s) - start )) s"
  cuobjdump -res-usage "$build/src/libflashlite.a" 2>/dev/null | grep -A1 "fwd_" | grep -oE "Function [^ ]+|REG:[0-9]+|STACK:[0-9]+|SHARED:[0-9]+|LOCAL:[0-9]+" \
    | paste - - - - - > "$out/res_usage.txt" || true
fi

if has test; then
  log "ctest -L gpu"
  (cd "$build" && ctest -L gpu -j"$(nproc)" --timeout 600 --output-on-failure > "$out/ctest.log" 2>&1)
  grep -E "tests passed|tests failed" "$out/ctest.log"
  sed -n '/The following tests FAILED/,$p' "$out/ctest.log" | head -60
  grep -E "Failure|non-finite|relative error|LSE mismatches|were written|must be exactly|Which is|Expected" "$out/ctest.log" | head -40
fi

if has sanitize; then
  log "compute-sanitizer"
  t="$build/tests/gpu/flashlite_gpu_fwd_grid_test"
  f='*_d64_q17_k17_causal:*_d128_q128_k300_full:*varlen_causal_win20_sinks3:*layout_padded:*_d32_causal:*_d256_full:bf16_d64_win40_sinks4_q257_k391:*varlen150*'
  compute-sanitizer --tool memcheck --error-exitcode 3 "$t" --gtest_filter="$f" > "$out/memcheck.log" 2>&1
  echo "memcheck rc=$? $(grep -E 'ERROR SUMMARY|PASSED|FAILED' "$out/memcheck.log" | tr '\n' ' ')"
  compute-sanitizer --tool racecheck --error-exitcode 3 "$t" --gtest_filter='*bf16_d64_q17_k17_causal:*f16_d128_q128_k300_full:*bf16_varlen_causal_win20_sinks3:*f32_d64_q17_k17_causal' \
    > "$out/racecheck.log" 2>&1
  echo "racecheck rc=$? $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY|PASSED|FAILED' "$out/racecheck.log" | tr '\n' ' ')"
fi

if has sweep; then
  log "sweep"
  "$build/bin/flashlite_fwd_sweep" --commit "$commit" --out "$out/fwd_sweep_raw.json" "$@" > "$out/sweep.log" 2>&1
  echo "sweep rc=$?"
  grep -E "check|FAILED" "$out/sweep.log" | head -30
fi

if has peers; then
  log "peers"
  python3 "$root/bench/fwd/sdpa_peers.py" --out "$out/sdpa_peers.json" ${PEER_ARGS:-} > "$out/peers.log" 2>&1
  echo "peers rc=$?"; tail -3 "$out/peers.log"
fi

if has sbs; then
  log "side by side with torch SDPA (one process, same tensors, interleaved rounds)"
  python3 "$root/bench/fwd/side_by_side.py" --lib "$build/lib/libflashlite_fwd_capi.so" --out "$out/side_by_side.json" \
    > "$out/sbs.log" 2>&1
  echo "sbs rc=$?"; cat "$out/sbs.log"; cp "$out/side_by_side.json" "$dest/" 2>/dev/null
fi

if has ncu; then
  log "ncu (Speed of Light of the dispatched kernel, D128 and D64, S 4096, causal and not)"
  for d in 128 64; do
    ncu --clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats --section ComputeWorkloadAnalysis --section WarpStateStats -k regex:fwd_mma --launch-skip 3 -c 2 \
      "$build/bin/flashlite_fwd_sweep" --no-variants --seqs 4096 --dims $d --reps 1 --out /tmp/ncu_sweep.json \
      > "$out/ncu_d$d.log" 2>&1
    echo "ncu d$d rc=$?"
    grep -E "fwd_mma_kernel|Memory Throughput|Compute \(SM\) Throughput|Duration|Registers Per|Achieved Occupancy|Executed Ipc Active|Issue Slots Busy" "$out/ncu_d$d.log" | head -24
  done
  python3 "$root/bench/fwd/ncu_peers_once.py" > "$out/peers_once.log" 2>&1; cat "$out/peers_once.log"
  ncu --clock-control none --section SpeedOfLight --nvtx --nvtx-include "naive/" --nvtx-include "flash/" \
    python3 "$root/bench/fwd/ncu_peers_once.py" > "$out/ncu_peers.log" 2>&1
  echo "ncu peers rc=$?"
  grep -E "^  [a-zA-Z_].*\(|Memory Throughput|Compute \(SM\) Throughput|Duration" "$out/ncu_peers.log" | cut -c1-110 | head -40
fi

if has sweep && has peers; then
  python3 "$root/bench/fwd/combine.py" "$out/fwd_sweep_raw.json" "$out/sdpa_peers.json" --out "$out/fwd_sweep.json"
  cp "$out/fwd_sweep.json" "$dest/"
fi
log "done"
