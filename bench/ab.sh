#!/usr/bin/env bash
# An A/B of a CUDA kernel change on a GPU machine: this tree against git revision BASE (default HEAD, so the change
# under test stays uncommitted), both builds timed in one process on the same tensors (bench/AREA/side_by_side.py
# --lib / --baseline-lib), after this tree's GPU tests of the area and compute-sanitizer (memcheck, racecheck) on the
# cases SANITIZE_FILTER names. AREA: fwd (the Hopper forward tests; the side by side with the window + sinks row
# against FlexAttention) or bwd (the backward tests; every CUDA backward family forced). This tree builds through
# scripts/gpu-check.sh (C++ and the Python module the benchmarks import, .carry/ as there); BASE builds only the
# benchmark's library.
#
#   BASE=HEAD SEQS=2048,8192 bash bench/ab.sh bwd [OUTDIR]
#
# Environment: BASE, SEQS (side_by_side's --seqs), ROUNDS (its --rounds, default 3), TEST_FILTER (the test's
# --gtest_filter, default all), SANITIZE_FILTER, COMMIT (what the JSON records: the device machine's .git is the
# session's first state). Results in OUTDIR (argument, else $OUT, else ./out): AREA_ab.json, ab_logs.tgz. The exit
# status is 1 if a step failed; every step runs.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
area="${1:-}"
case "$area" in
  fwd) capi=flashlite_fwd_capi test_name=flashlite_gpu_hopper_fwd_test
       default_filter="Cuda/HopperGrid.*win150_sinks16*:Cuda/HopperGrid.*win90_sinks17*"
       default_filter+=":Cuda/HopperGrid.*q520_causal_win100_sinks3*" ;;
  bwd) capi=flashlite_bwd_capi test_name=flashlite_gpu_backward_test
       default_filter="Grid/*/bf16_window_sinks16_d64:Grid/*/bf16_window_sinks17_d128"
       default_filter+=":Grid/*/bf16_gqa3_window_sinks_softcap_d128" ;;
  *) echo "usage: bench/ab.sh fwd|bwd [OUTDIR]" >&2; exit 2 ;;
esac
dest="${2:-${OUT:-$root/out}}"
mkdir -p "$dest"
dest="$(cd "$dest" && pwd)"
base_rev="${BASE:-HEAD}"
build="$root/build-ab"
base_src="$(mktemp -d /tmp/bwd_ab_base.XXXX)"
logs="$(mktemp -d /tmp/bwd_ab_logs.XXXX)"
rc=0
say() { echo "== $(date +%T) $*" | tee -a "$logs/summary.txt"; }
fail() { say "FAILED: $*"; rc=1; }

say "this tree (build-ab) and $base_rev ($(git -C "$root" rev-parse --short "$base_rev" 2>/dev/null))"
git -C "$root" diff --stat "$base_rev" > "$logs/tree_diff.txt" 2>&1
BUILD_DIR="$build" BUILD_TARGETS="$test_name $capi" \
  bash "$root/scripts/gpu-check.sh" "$logs/gpu_check" --only build > "$logs/build_tree.log" 2>&1 ||
  fail "this tree's build (build_tree.log)"

# BASE: its source from git, built with the same CMake arguments as gpu-check.sh's build step.
arch="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')"
[ "$arch" = 90 ] && arch=90a
prefixes=""
[ -d "$root/.carry/deps/usr" ] && prefixes="$root/.carry/deps/usr"
[ -d "$root/.carry/gtest/usr" ] && prefixes="${prefixes:+$prefixes;}$root/.carry/gtest/usr"
if git -C "$root" archive "$base_rev" | tar -x -C "$base_src"; then
  cmake -S "$base_src" -B "$base_src/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHLITE_BUILD_TESTS=OFF \
    ${arch:+-DCMAKE_CUDA_ARCHITECTURES=$arch} ${prefixes:+-DCMAKE_PREFIX_PATH=$prefixes} \
    > "$logs/build_base.log" 2>&1 &&
    cmake --build "$base_src/build" -j"$(nproc)" --target "$capi" >> "$logs/build_base.log" 2>&1 ||
    fail "$base_rev's build (build_base.log)"
else
  fail "git archive $base_rev"
fi

test_bin="$build/tests/gpu/$test_name"
say "$test_name"
"$test_bin" ${TEST_FILTER:+--gtest_filter="$TEST_FILTER"} > "$logs/gpu_test.log" 2>&1 || fail "$test_name"
grep -E "^\[  (PASSED|FAILED|SKIPPED) " "$logs/gpu_test.log" | head -20 | tee -a "$logs/summary.txt"

sanitize_filter="${SANITIZE_FILTER:-$default_filter}"
for tool in memcheck racecheck; do
  compute-sanitizer --tool "$tool" --error-exitcode 3 "$test_bin" --gtest_filter="$sanitize_filter" \
    > "$logs/sanitize_$tool.log" 2>&1 || fail "$tool"
  say "$tool: $(grep -hE 'ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED' "$logs/sanitize_$tool.log" | tr '\n' ' ')"
  grep -q "Running 0 tests" "$logs/sanitize_$tool.log" && fail "$tool: the filter $sanitize_filter selects no test"
done

say "side by side"
extra=()
[ "$area" = fwd ] && extra=(--window-sinks)
FLASHLITE_COMMIT="${COMMIT:-$(git -C "$root" rev-parse --short HEAD)}+tree" PYTHONPATH="$build/pysite" \
  python3 "$root/bench/$area/side_by_side.py" --lib "$build/lib/lib$capi.so" \
  --baseline-lib "$base_src/build/lib/lib$capi.so" --seqs "${SEQS:-2048,8192}" --rounds "${ROUNDS:-3}" \
  "${extra[@]}" --out "$dest/${area}_ab.json" > "$logs/side_by_side.log" 2>&1 || fail "side by side"
tail -20 "$logs/side_by_side.log" | tee -a "$logs/summary.txt"

tar czf "$dest/ab_logs.tgz" -C "$logs" . 2>/dev/null
exit $rc
