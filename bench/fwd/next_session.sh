#!/usr/bin/env bash
# What the Hopper kernel's first session left unmeasured (docs/perf-notes.md, "Block order"), in one device call
# (~5 minutes; each phase skipped with a message when BUDGET_S, default 540 s, would not cover it):
#   build   sm_90a: the C entry point for the Python benches (bench/fwd/fl_capi.cpp) and the Hopper test
#   window  bench/fwd/window_flex.py (S 8192, D 128, window 1024, +- 4 sinks): the default (windows keep the
#           whole-grid causal order), FLASHLITE_FWD_RANK_GROUP=8 (groups for windows too), FlexAttention
#   mma     the mma.sync kernel (FLASHLITE_FWD_HOPPER=0, the sm_80/89 default) with the whole-grid order (its default)
#           and with groups of 8: bench/fwd/side_by_side.py, causal rows decide
#   ncu     Speed of Light of the Hopper kernel (D 128 S 4096 full and causal, D 64 S 1024 causal, D 128 S 16384
#           full): SOL, occupancy, compute workload, warp states (the table docs/analysis.md lacks)
# Output in $OUT: the JSON files and next_session_logs.tgz.
#   run(command="bash bench/fwd/next_session.sh", carry=[".carry/deps"], timeout_s=600)
set -uo pipefail
phases="${1:-build,window,mma,ncu}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
dest="${OUT:-$root/out}"
logs=/tmp/fwd_next_logs
build=/tmp/build-fwd-next
prefix="$root/.carry/deps/usr"
t0=$(date +%s)
budget="${BUDGET_S:-540}"
mkdir -p "$dest" "$logs"
has() { [[ ",$phases," == *",$1,"* ]]; }
left() { echo $(( budget - ($(date +%s) - t0) )); }
fits() { [ "$(left)" -ge "$1" ] && return 0; echo "SKIPPED (budget: $(left) s left, needs ~$1 s): $2"; return 1; }
pack() { tar czf "$dest/next_session_logs.tgz" -C "$logs" . 2>/dev/null; }
trap pack EXIT
capi="$build/lib/libflashlite_fwd_capi.so"
export PYTHONUNBUFFERED=1

if has build; then
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv | tee "$logs/device.txt"
  extra=()
  [ -d "$prefix" ] && extra+=("-DCMAKE_PREFIX_PATH=$prefix" "-DGTest_DIR=$prefix/lib/x86_64-linux-gnu/cmake/GTest")
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
    -DFLASHLITE_BUILD_APPS=OFF -DFLASHLITE_BUILD_ENGINE=OFF -DFLASHLITE_FWD_SWEEP=ON "${extra[@]}" > "$logs/cmake.log" 2>&1 ||
    { tail -20 "$logs/cmake.log"; exit 1; }
  cmake --build "$build" -j"$(nproc)" --target flashlite_fwd_capi > "$logs/build.log" 2>&1 ||
    { grep -E "error|FAILED" -A3 "$logs/build.log" | head -40; exit 1; }
  echo "built ($(( $(date +%s) - t0 )) s)"
fi

if has window && fits 150 "window"; then
  timeout 45 python3 "$root/bench/fwd/window_flex.py" "$root" "$capi" default "$dest/window_default.json" 2>&1 | tail -2
  FLASHLITE_FWD_RANK_GROUP=8 timeout 45 python3 "$root/bench/fwd/window_flex.py" "$root" "$capi" group8 "$dest/window_group8.json" 2>&1 | tail -2
  timeout 100 python3 "$root/bench/fwd/window_flex.py" "$root" "$capi" flex "$dest/window_flex.json" 2>&1 | tail -2
fi

if has mma && fits 130 "mma"; then
  for g in 0 8; do
    echo "== mma.sync kernel, FLASHLITE_FWD_RANK_GROUP=$g"
    FLASHLITE_FWD_HOPPER=0 FLASHLITE_FWD_RANK_GROUP=$g timeout 60 python3 "$root/bench/fwd/side_by_side.py" --lib "$capi" \
      --rounds 3 --out "$dest/sbs_mma_group$g.json" > "$logs/sbs_mma_group$g.log" 2>&1
    grep causal "$logs/sbs_mma_group$g.log"
  done
fi

if has ncu; then
  for shape in "4096 128 0" "4096 128 1" "1024 64 1" "16384 128 0"; do
    fits 40 "ncu $shape" || break
    tag="${shape// /_}"
    timeout 90 ncu --clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats \
      --section ComputeWorkloadAnalysis --section WarpStateStats --section MemoryWorkloadAnalysis -k regex:fwd_ \
      --launch-skip 2 --launch-count 1 python3 "$root/bench/fwd/ncu_once.py" "$capi" $shape > "$logs/ncu_$tag.log" 2>&1
    echo "== ncu S D causal = $shape: rc $?"
    grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|L2 Hit|Registers Per|Achieved Occupancy|Issue Slots Busy|Executed Ipc Active" \
      "$logs/ncu_$tag.log" | head -12
  done
fi
echo "done ($(( $(date +%s) - t0 )) s)"
