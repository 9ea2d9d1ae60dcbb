#!/usr/bin/env bash
# First device run of the Hopper forward kernel (src/cuda/fwd_hopper/, prepared without a GPU): ONE call on an
# H100/H200 that builds (sm_90a only), proves each schedule right before anything times it, and times them
# against torch SDPA (flash, cuDNN) in one process, and on the sliding-window masks against FlexAttention. The
# mma.sync kernel's own numbers are in bench/results/h100/fwd_side_by_side_mma.json (phase "mma" re-times it here,
# with FLASHLITE_FWD_HOPPER=0). Run 2026-11-23 (results in bench/results/h100/hopper_first_run/); since then the
# Hopper kernel is the default on sm_90 (unset = schedule 3).
#
#   bash bench/fwd/hopper_first_run.sh [phases]
#     phases: comma list of build,smoke,test,bench,window,sanitize,mma
#     (default: build,smoke,test,bench,window,sanitize: correctness before timing, the sanitizers last)
#
# Run-tool call: carry [".carry/deps"] (the GoogleTest prefix, git-ignored), timeout_s 600. Everything lands in $OUT:
# logs packed in $OUT/hopper_run.tgz after every phase, JSON copied beside it. The whole run keeps inside BUDGET_S
# seconds (default 570): each phase gets at most what is left, and a phase that cannot start in time is skipped
# and says so; on a warm machine a second call with e.g. "build,sanitize,mma" rebuilds incrementally
# (build-hopper/ is git-ignored and stays on the machine between calls).
#
# FLASHLITE_FWD_HOPPER=1 is the plain schedule, 2 the pipelined one, 3 pipelined + ping-pong
# (src/cuda/fwd_hopper/hopper_kernel.cuh); MODES (default "1 2 3") picks which are run. A schedule whose smoke test
# fails or hangs (a deadlocked barrier would hang every later phase too) is left out of the timed phases.
set -uo pipefail
t0=$(date +%s)
phases="${1:-build,smoke,test,bench,window,sanitize}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
dest="${OUT:-$root/out}"
out=/tmp/hopper_run
build="${BUILD_DIR:-$root/build-hopper}"
prefix="$root/.carry/deps/usr"
budget="${BUDGET_S:-570}"
modes="${MODES:-1 2 3}"
mkdir -p "$out" "$dest"
export PYTHONUNBUFFERED=1
export PATH="$PATH:/usr/local/cuda/bin"
has() { [[ ",$phases," == *",$1,"* ]]; }
pack() { tar czf "$dest/hopper_run.tgz" -C "$out" . 2>/dev/null; }
log() { pack; echo "== $(date +%T) (+$(( $(date +%s) - t0 )) s) $*"; }
trap pack EXIT
# Seconds for a step: its own limit, or what is left of the budget (minus a margin), whichever is less.
limit() { local left=$(( t0 + budget - $(date +%s) - 5 )); [ "$left" -lt "$1" ] && echo "$left" || echo "$1"; }
# Runs a command under `limit`; a step with under 15 s left is skipped (rc 124 reported).
run() {
  local lim; lim=$(limit "$1"); shift
  if [ "$lim" -lt 15 ]; then echo "skipped (budget): $*" | cut -c1-160; return 124; fi
  timeout -s KILL "$lim" "$@"
}
test_bin="$build/tests/gpu/flashlite_gpu_hopper_fwd_test"
capi="$build/lib/libflashlite_fwd_capi.so"

# Issue 4's window target (phases window and mma): S = 8192, D = 128, causal window 1024, with and without 4 sink
# tokens, vs FlexAttention (useful TFLOP/s: visible pairs only). One process per backend (the switch is read once).

if has build; then
  log "build (CMAKE_CUDA_ARCHITECTURES=90a)"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$out/device.txt"
  extra=()
  [ -d "$prefix" ] && extra+=("-DCMAKE_PREFIX_PATH=$prefix" "-DGTest_DIR=$prefix/lib/x86_64-linux-gnu/cmake/GTest")
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
    -DFLASHLITE_BUILD_APPS=OFF -DFLASHLITE_BUILD_ENGINE=OFF -DFLASHLITE_FWD_SWEEP=ON "${extra[@]}" > "$out/cmake.log" 2>&1 \
    || { tail -30 "$out/cmake.log"; exit 1; }
  start=$(date +%s)
  run 300 cmake --build "$build" -j"$(nproc)" --target flashlite_gpu_hopper_fwd_test flashlite_fwd_capi > "$out/build.log" 2>&1 \
    || { grep -E "error|FAILED" -A3 "$out/build.log" | head -60; exit 1; }
  log "built in $(( $(date +%s) - start )) s"
  # Static evidence again, from the objects of this build: registers, stack, shared memory, HGMMA per object.
  for o in "$build"/src/CMakeFiles/flashlite_fwd_hopper.dir/cuda/fwd_hopper/wgmma_*.cu.o; do
    echo "$(basename "$o"): $(cuobjdump -res-usage "$o" 2>/dev/null | grep -oE 'REG:[0-9]+|STACK:[0-9]+|SHARED:[0-9]+|LOCAL:[0-9]+' | tr '\n' ' ')" \
         "HGMMA=$(cuobjdump -sass "$o" 2>/dev/null | grep -c HGMMA)"
  done | tee "$out/static.txt"
  # setmaxnreg 24 / 240 hands out exactly the pool of 168 registers x 384 threads: an entry count below 168 would
  # make the consumers' setmaxnreg.inc wait forever (a hang in the smoke test, not a wrong number).
  grep -oE 'REG:[0-9]+' "$out/static.txt" | grep -vqx 'REG:168' \
    && echo "WARNING: a Hopper kernel object is not at 168 registers: setmaxnreg 24/240 may not fit its pool"
fi

good="$modes"  # the schedules that passed their smoke test
hung=""        # ... and those whose smoke test hung (their full grid is skipped too)
if has smoke; then
  # One small case per variant and schedule; 45 s each: a hang means a barrier bug.
  f='HopperEligibility.*:*bf16_d128_q129_k129_full:*bf16_d64_q129_k129_causal:*f16_d128_q17_k17_causal:*f16_d64_q1000_k17_full:*bf16_d128_q1000_k1000_causal'
  good=""
  for mode in $modes; do
    log "smoke, FLASHLITE_FWD_HOPPER=$mode"
    FLASHLITE_FWD_HOPPER=$mode run 45 "$test_bin" --gtest_filter="$f" > "$out/smoke$mode.log" 2>&1
    rc=$?
    echo "smoke mode $mode rc=$rc"; grep -E "OK \]|FAILED|Failure|Expected|picked|relative error|skipped" "$out/smoke$mode.log" | head -20
    [ $rc -eq 0 ] && good="$good $mode"
    [ $rc -eq 137 ] && hung="$hung $mode"  # killed by the time limit
  done
  echo "schedules that passed the smoke test:${good:- none}"
fi

if has test; then
  # Through ctest, one process per case on every core (the float64 reference is single-threaded and slow); the
  # switch reaches the test processes through the environment. 45 s per case (the slowest reference takes a few
  # seconds): a case that hangs is named as a timeout and the others still run inside the 120 s.
  for mode in $modes; do
    [[ " $hung " == *" $mode "* ]] && { echo "test mode $mode skipped: its smoke test hung"; continue; }
    log "hopper_fwd_test, full grid + fallbacks, FLASHLITE_FWD_HOPPER=$mode"
    (cd "$build" && FLASHLITE_FWD_HOPPER=$mode run 120 ctest -R Hopper -j"$(nproc)" --timeout 45 --output-on-failure \
      --output-junit "$out/hopper_test_mode$mode.xml" > "$out/test$mode.log" 2>&1)
    echo "test mode $mode rc=$?"; grep -E "tests passed|tests failed|Total Test time" "$out/test$mode.log"
    sed -n '/The following tests FAILED/,$p' "$out/test$mode.log" | head -30
    grep -E "Failure|relative error|LSE mismatches|were written|non-finite|picked" "$out/test$mode.log" | head -20
    cp "$out/hopper_test_mode$mode.xml" "$dest/" 2>/dev/null
  done
fi

if has bench && [ -n "${good// /}" ]; then
  # bench/fwd/side_by_side.py: flashlite and SDPA flash / cuDNN in one process on the same tensors, interleaved
  # rounds, outputs compared with flash first (rel_diff_vs_flash). The switch is read once per process: one process
  # per schedule, each with its own peers.
  for mode in $good; do
    log "side by side, FLASHLITE_FWD_HOPPER=$mode"
    FLASHLITE_FWD_HOPPER=$mode run 60 python3 "$root/bench/fwd/side_by_side.py" --lib "$capi" --rounds 3 \
      --seqs 1024,4096,16384 --out "$out/sbs_hopper_mode$mode.json" > "$out/sbs_mode$mode.log" 2>&1
    echo "sbs mode $mode rc=$?"; cat "$out/sbs_mode$mode.log"; cp "$out/sbs_hopper_mode$mode.json" "$dest/" 2>/dev/null
  done
fi

if has window && [ -n "${good// /}" ]; then
  log "window 1024 +- 4 sinks: Hopper (each schedule), FlexAttention"
  for mode in $good; do
    FLASHLITE_FWD_HOPPER=$mode run 45 python3 "$root/bench/fwd/window_flex.py" "$root" "$capi" "hopper_mode$mode" "$out/window_hopper_mode$mode.json" 2>&1 | tail -3
  done
  run 120 python3 "$root/bench/fwd/window_flex.py" "$root" "$capi" flex "$out/window_flex.json" 2>&1 | tail -3
  cp "$out"/window_*.json "$dest/" 2>/dev/null
fi

if has sanitize; then
  log "compute-sanitizer memcheck (each schedule), racecheck, synccheck on small cases"
  f='*bf16_d128_q129_k300_causal:*f16_d64_q17_k17_full:*bf16_d64_varlen_causal:*bf16_d128_causal_win100_sinks3_q257_k391'
  for mode in $modes; do
    [[ " $hung " == *" $mode "* ]] && continue
    FLASHLITE_FWD_HOPPER=$mode run 60 compute-sanitizer --tool memcheck --error-exitcode 3 "$test_bin" --gtest_filter="$f" \
      > "$out/memcheck$mode.log" 2>&1
    echo "memcheck mode $mode rc=$? $(grep -E 'ERROR SUMMARY|PASSED|FAILED' "$out/memcheck$mode.log" | tr '\n' ' ')"
  done
  # The device tests skip when FLASHLITE_FWD_HOPPER=0 (kHopperEnv), so each run names its schedule. racecheck on the
  # first schedule that did not hang, synccheck on ping-pong (named barriers).
  rmode=""
  for mode in $modes; do [[ " $hung " == *" $mode "* ]] || { rmode=$mode; break; }; done
  if [ -n "$rmode" ]; then
    FLASHLITE_FWD_HOPPER=$rmode run 90 compute-sanitizer --tool racecheck --error-exitcode 3 "$test_bin" \
      --gtest_filter='*bf16_d128_q129_k129_causal' > "$out/racecheck.log" 2>&1
    echo "racecheck (mode $rmode) rc=$? $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY|PASSED|FAILED|SKIPPED' "$out/racecheck.log" | tr '\n' ' ')"
  fi
  if [[ " $modes " == *" 3 "* && " $hung " != *" 3 "* ]]; then
    FLASHLITE_FWD_HOPPER=3 run 60 compute-sanitizer --tool synccheck --error-exitcode 3 "$test_bin" \
      --gtest_filter='*f16_d64_q129_k129_full' > "$out/synccheck.log" 2>&1
    echo "synccheck rc=$? $(grep -E 'ERROR SUMMARY|PASSED|FAILED|SKIPPED' "$out/synccheck.log" | tr '\n' ' ')"
  fi
fi

if has mma; then
  log "side by side, mma.sync kernel (switch off)"
  FLASHLITE_FWD_HOPPER=0 run 75 python3 "$root/bench/fwd/side_by_side.py" --lib "$capi" --rounds 3 --seqs 1024,4096,16384 \
    --out "$out/sbs_mma.json" > "$out/sbs_mma.log" 2>&1
  echo "sbs mma rc=$?"; cat "$out/sbs_mma.log"; cp "$out/sbs_mma.json" "$dest/" 2>/dev/null
  FLASHLITE_FWD_HOPPER=0 run 45 python3 "$root/bench/fwd/window_flex.py" "$root" "$capi" mma "$out/window_mma.json" 2>&1 | tail -3
  cp "$out/window_mma.json" "$dest/" 2>/dev/null
fi
log "done"
