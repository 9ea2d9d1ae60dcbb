#!/usr/bin/env bash
# One device call (<= 10 minutes) for the split merge in a thread-block cluster (src/cuda/decode/cluster_merge.cuh):
#   build    sm_90a: the decode test, the decode bench and the engine CLI
#   test     the decode suite with the cluster merge (the default) and with FLASHLITE_DECODE_CLUSTER=0
#   bench    decode bench --quick under FLASHLITE_DECODE_CLUSTER=1 (the default) and 0 (combine kernel), then the
#            split sweep under the default (run 1 of round 6 ran this at e2a0022, with a third mode since removed;
#            docs/perf-notes.md "Decode", round 6)
#   e2e      bench/e2e.py engine only, batch 1 and 16, prompt 512: default and FLASHLITE_DECODE_CLUSTER=0
#   sanitize memcheck + racecheck on the cluster cases
# Each phase is skipped with a message when the budget (BUDGET_S, default 560 s) would not cover it.
#   run(command="bash bench/decode/cluster_session.sh", carry=[".carry"], timeout_s=600)
set -uo pipefail
phases="${1:-build,test,bench,e2e,sanitize}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
dest="${OUT:-$root/out}"
logs=/tmp/cluster_logs
build=/tmp/build-cluster
mkdir -p "$dest" "$logs"
t0=$(date +%s)
budget="${BUDGET_S:-560}"
export PYTHONUNBUFFERED=1
export FLASHLITE_MODELS="${FLASHLITE_MODELS:-$root/.carry/models}"
export FLASHLITE_PARITY_CACHE="${FLASHLITE_PARITY_CACHE:-/tmp/flashlite_parity}"
has() { [[ ",$phases," == *",$1,"* ]]; }
left() { echo $(( budget - ($(date +%s) - t0) )); }
fits() { [ "$(left)" -ge "$1" ] && return 0; echo "SKIPPED (budget: $(left) s left, needs ~$1 s): $2"; return 1; }
pack() { tar czf "$dest/cluster_logs.tgz" -C "$logs" . 2>/dev/null; }
step() { pack; echo "== $(date +%T) [$(( $(date +%s) - t0 )) s] $*"; }
trap pack EXIT

if has build; then
  step "build"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv | tee "$logs/device.txt"
  git log -1 --format='commit %H %s' 2>/dev/null | tee -a "$logs/device.txt"
  prefix="$root/.carry/deps/usr"
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
    -DFLASHLITE_DECODE_BENCH=ON -DCMAKE_PREFIX_PATH="$prefix" > "$logs/cmake.log" 2>&1 || { tail -30 "$logs/cmake.log"; exit 1; }
  cmake --build "$build" -j"$(nproc)" --target flashlite_decode_gpu_test flashlite_decode_bench flashlite_cli \
    > "$logs/build.log" 2>&1 || { grep -E "error|FAILED" -A3 "$logs/build.log" | head -60; exit 1; }
  echo "built ($(( $(date +%s) - t0 )) s)"
fi
t="$build/tests/kv/flashlite_decode_gpu_test"

if has test && fits 90 "test"; then
  step "decode suite: cluster merge (default), then FLASHLITE_DECODE_CLUSTER=0"
  timeout 150 "$t" > "$logs/test_default.log" 2>&1; echo "default rc=$?"
  FLASHLITE_DECODE_CLUSTER=0 timeout 150 "$t" > "$logs/test_off.log" 2>&1; echo "off rc=$?"
  for f in default off; do
    grep -E "^\[  (PASSED|FAILED) |^\[==========\]" "$logs/test_$f.log" | tail -4
    grep -E "Failure|relative error|Which is|Expected" "$logs/test_$f.log" | head -12
  done
  grep -E "cluster merge|combine kernel" "$logs/test_default.log" | sort | uniq -c | sort -rn | head -12
fi

if has bench && fits 150 "bench"; then
  b="$build/bin/flashlite_decode_bench"
  for mode in 1 0; do
    step "decode bench --quick, FLASHLITE_DECODE_CLUSTER=$mode"
    FLASHLITE_DECODE_CLUSTER=$mode timeout 120 "$b" --quick --out "$dest/decode_cluster_$mode.json" > "$logs/bench_$mode.log" 2>&1
    grep -E "^main|bandwidth" "$logs/bench_$mode.log" | cut -c1-200
  done
  if fits 120 "sweep"; then
    step "split sweep (default mode)"
    timeout 150 "$b" --sweep --no-bw --out "$logs/decode_sweep.json" > "$logs/sweep.log" 2>&1
    grep "^sweep" "$logs/sweep.log" | awk '{printf "%s %s %s s%s %s\n", $2, $3, $4, $7, $8}' | paste - - - - - | head -40
    cp "$logs/decode_sweep.json" "$dest/" 2>/dev/null
  fi
fi

if has e2e && fits 150 "e2e"; then
  step "engine e2e: default, then FLASHLITE_DECODE_CLUSTER=0"
  for mode in default 0; do
    env_args=()
    [ "$mode" = 0 ] && env_args=(--engine-env FLASHLITE_DECODE_CLUSTER=0)
    timeout -s KILL "$(( $(left) - 40 ))" python3 bench/e2e.py --flashlite "$build/bin/flashlite" \
      --checkpoint "$FLASHLITE_PARITY_CACHE/llama32_1b_random" --tokenizer-dir "$FLASHLITE_MODELS/llama3-tokenizer" \
      --skip-transformers --batches 1,16 --prompts 512 "${env_args[@]}" --out "$dest/e2e_cluster_$mode.json" \
      > "$logs/e2e_$mode.log" 2>&1
    echo "e2e $mode rc=$?"
    grep -E "tok/s|tbt" "$logs/e2e_$mode.log" | cut -c1-220 | tail -4
    fits 100 "e2e off" || break
  done
fi

if has sanitize && fits 60 "sanitize"; then
  step "compute-sanitizer"
  f='*SplitsMergeInACluster*:*/splits3:*/window_sinks:*/empty_sequences:*/group16_q5_two_row_chunks:*/q8_short_sink_logits:GpuKv.SplitMerge*:GpuKv.DecodeStepCaptured*'
  timeout 120 compute-sanitizer --tool memcheck --error-exitcode 3 "$t" --gtest_filter="$f" > "$logs/memcheck.log" 2>&1
  echo "memcheck rc=$? $(grep -E 'ERROR SUMMARY|PASSED|FAILED' "$logs/memcheck.log" | tr '\n' ' ')"
  fits 30 "racecheck" && timeout 100 compute-sanitizer --tool racecheck --error-exitcode 3 "$t" \
    --gtest_filter='*SplitsMergeInACluster*:*/splits3:*/window_sinks:*/group8_q8_64rows' > "$logs/racecheck.log" 2>&1
  echo "racecheck rc=$? $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY|PASSED|FAILED' "$logs/racecheck.log" | tr '\n' ' ')"
fi
step "done"
