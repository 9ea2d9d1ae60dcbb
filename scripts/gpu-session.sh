#!/usr/bin/env bash
# One device call (<= 10 minutes) that verifies the tree and re-measures the headline numbers after defaults change:
#   1. scripts/gpu-check.sh --skip attn,bench: build (sm_90a), every ctest suite (GPU, kv, engine with the real tiny
#      models), pytest tests/python, compute-sanitizer;
#   2. bench/fwd/side_by_side.py: the default forward kernel (the Hopper kernel on sm_90) and torch SDPA flash / cuDNN
#      in one process on the same tensors, every reference shape;
#   3. bench/e2e.py, engine only, batch 1 and 16 (E2E_BATCHES), prompt 512;
#   4. (only when PHASES lists it) tests/engine/test_engine_gpu_parity.py: the engine against transformers on the
#      Llama-3.2-1B-shaped random checkpoint (e2e's, cached under FLASHLITE_PARITY_CACHE).
#   5. (only when PHASES lists `build`, for a quick call instead of check) configure and build only the CLI and the
#      engine's CUDA test binaries in build-gpu/ and run those two suites (ENGINE_TEST_FILTER: a gtest filter).
# PHASES (comma list, default check,sbs,e2e) picks them (the later ones use check's build in build-gpu/, so leave
# check out only on a warm machine that has it); each is cut to what is left of BUDGET_S (default 560 s). Run-tool call, from the repository root:
#   run(command="bash scripts/gpu-session.sh", carry=[".carry"], timeout_s=600)
# with .carry holding the GoogleTest/CLI11/PCRE2 prefixes (scripts/make-carry.sh) and the tiny models
# (mkdir -p .carry/models && cp -r ../shared/models/* .carry/models/). Output in $OUT: gpu-check's files,
# fwd_side_by_side.json, e2e.json, session_logs.tgz.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
dest="${OUT:-$root/out}"
mkdir -p "$dest"
t0=$(date +%s)
budget="${BUDGET_S:-560}"
left() { echo $(( budget - ($(date +%s) - t0) )); }
# cap N: N seconds, or what is left of the budget (less a margin) when that is less; never below 1
cap() { local l=$(( $(left) - 5 )); [ "$l" -lt 1 ] && l=1; [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }
logs=/tmp/gpu_session_logs
mkdir -p "$logs"
pack() { tar czf "$dest/session_logs.tgz" -C "$logs" . 2>/dev/null; }
trap pack EXIT
export FLASHLITE_MODELS="${FLASHLITE_MODELS:-$root/.carry/models}"
export FLASHLITE_PARITY_CACHE="${FLASHLITE_PARITY_CACHE:-/tmp/flashlite_parity}"
build="${BUILD_DIR:-$root/build-gpu}"
status=0
phases="${PHASES:-check,sbs,e2e}"
has() { [[ ",$phases," == *",$1,"* ]]; }

echo "== $(date +%T) gpu-check (budget $(left) s)"
if has check; then
  reserve=150; [ "$phases" = check ] && reserve=10  # room for the later phases, when there are any
  lim=$(( $(left) - reserve ))
  if [ "$lim" -ge 60 ]; then
    timeout -s KILL "$lim" bash scripts/gpu-check.sh "$dest" --skip "attn,bench${SKIP_CHECK:+,$SKIP_CHECK}" \
      2>&1 | tail -40 || status=1
  else
    echo "SKIPPED (budget): gpu-check"; status=1
  fi
fi

if has build && ! has check; then
  echo "== $(date +%T) build: CLI and the engine's CUDA tests ($(left) s left)"
  prefixes=""
  for d in "$root/.carry/deps/usr" "$root/.carry/gtest/usr"; do [ -d "$d" ] && prefixes="${prefixes:+$prefixes;}$d"; done
  if cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DFLASHLITE_BUILD_BENCH=OFF \
       ${prefixes:+"-DCMAKE_PREFIX_PATH=$prefixes"} > "$logs/build_cmake.log" 2>&1 &&
     timeout "$(cap 400)" cmake --build "$build" -j"$(nproc)" --target flashlite_cli flashlite_engine_cuda_ops_test \
       flashlite_engine_cuda_model_test > "$logs/build.log" 2>&1; then
    for t in flashlite_engine_cuda_ops_test flashlite_engine_cuda_model_test; do
      timeout "$(cap 120)" "$build/tests/engine/$t" --gtest_brief=1 ${ENGINE_TEST_FILTER:+--gtest_filter=$ENGINE_TEST_FILTER} \
        > "$logs/$t.log" 2>&1 || status=1
      echo "$t: $(grep -E '^\[  (PASSED|FAILED)' "$logs/$t.log" | tr '\n' ' ')"
    done
  else
    grep -E "error|FAILED" -A3 "$logs/build.log" "$logs/build_cmake.log" | head -30; status=1
  fi
fi

echo "== $(date +%T) forward side by side ($(left) s left)"
if has sbs && [ "$(left)" -gt 130 ]; then
  cmake -S . -B "$build" -DFLASHLITE_FWD_SWEEP=ON > "$logs/sbs_cmake.log" 2>&1 &&
    timeout "$(cap 240)" cmake --build "$build" -j"$(nproc)" --target flashlite_fwd_capi > "$logs/sbs_build.log" 2>&1 &&
    timeout "$(cap 100)" python3 bench/fwd/side_by_side.py --lib "$build/lib/libflashlite_fwd_capi.so" --rounds 3 \
      --seqs 512,1024,2048,4096,8192,16384 --out "$dest/fwd_side_by_side.json" 2>&1 | tee "$logs/sbs.log" | tail -30 ||
    status=1
else
  echo "SKIPPED (budget): side by side"
fi

echo "== $(date +%T) engine e2e ($(left) s left)"
if has e2e && [ "$(left)" -gt 60 ]; then
  timeout -s KILL "$(cap 600)" python3 bench/e2e.py --flashlite "$build/bin/flashlite" \
    --checkpoint "$FLASHLITE_PARITY_CACHE/llama32_1b_random" --tokenizer-dir "$FLASHLITE_MODELS/llama3-tokenizer" \
    --skip-transformers --batches "${E2E_BATCHES:-1,16}" --prompts 512 \
    --out "$dest/e2e.json" > "$logs/e2e.log" 2>&1 || status=1
  grep -E "tok/s|variant|tbt" "$logs/e2e.log" | cut -c1-220 | tail -12
else
  echo "SKIPPED (budget): e2e"
fi
if has parity && [ "$(left)" -gt 60 ]; then
  echo "== $(date +%T) engine parity vs transformers ($(left) s left)"
  [ -x "$build/bin/flashlite" ] || cmake --build "$build" -j"$(nproc)" --target flashlite_cli > "$logs/cli_build.log" 2>&1 ||
    status=1
  FLASHLITE_BIN="$build/bin/flashlite" FLASHLITE_PARITY_OUT="$dest" timeout -s KILL "$(cap 600)" \
    python3 -m pytest -q -s -p no:cacheprovider tests/engine/test_engine_gpu_parity.py > "$logs/parity.log" 2>&1 || status=1
  tail -15 "$logs/parity.log"
fi
echo "== $(date +%T) done, status $status"
exit "$status"
