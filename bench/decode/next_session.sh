#!/usr/bin/env bash
# Round 5 of the decode work (docs/perf-notes.md "Decode", "Round 5"): ONE call on the GPU machine (H100) that builds,
# tests and measures the two opt-in variants against the default:
#   FLASHLITE_DECODE_PREFETCH=N  L2 prefetch of the first N tiles of each split before griddepcontrol.wait
#   FLASHLITE_DECODE_WAVES=W     splits planned for W waves of resident blocks instead of one
# Phases (comma list, default build,test,bench,sanitize), each skipped with a message when the call's time budget
# (BUDGET_S, default 530 s, under the device tool's 600 s) would not cover it:
#   build     cmake (sm_90a, Release, no apps / engine) + the KV tests and the decode bench
#   test      ctest -L kv (the decode grid with each variant, the graph and repeated-merge tests with each variant)
#   bench     flashlite_decode_bench at the issue's shapes (b1 kv 1024/8192/32768, b16/b64 kv 8192; contiguous and
#             paged 16; eager and graph columns) for: default, PREFETCH=2, PREFETCH=4, WAVES=2, PREFETCH=4+WAVES=2,
#             default again (run-to-run noise); one JSON per run merged into $OUT/decode_round5.json, a table printed
#   sanitize  compute-sanitizer memcheck (graph and repeated-merge tests and a few grid cases, default and each
#             variant; then a few grid cases with the environment switches) and racecheck (a few grid cases, default
#             and each variant: the variants change no shared-memory code)
# Everything else (logs, per-run JSON) goes to $OUT/decode_round5_logs.tgz: two files come back in all.
#
# From the repository root, on the device tool (GoogleTest from .carry/deps, see scripts/make-carry.sh):
#   run(command="bash bench/decode/next_session.sh", carry=[".carry/deps"], timeout_s=590)
# To build a commit rather than the working tree (others' uncommitted edits travel with the tree), first here:
#   mkdir -p .carry/decode_src && git archive -o .carry/decode_src/src.tar HEAD && git rev-parse --short HEAD > .carry/decode_src/commit.txt
# and add ".carry/decode_src" to carry.
set -uo pipefail
phases="${1:-build,test,bench,sanitize}"
t0=$(date +%s)
budget="${BUDGET_S:-530}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
src="$root"
if [ -f "$root/.carry/decode_src/src.tar" ]; then
  src=/tmp/decode_r5_src
  rm -rf "$src" && mkdir -p "$src" && tar xf "$root/.carry/decode_src/src.tar" -C "$src"
  export FLASHLITE_COMMIT="$(cat "$root/.carry/decode_src/commit.txt" 2>/dev/null || echo archive)"
else
  export FLASHLITE_COMMIT="$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)+tree"
fi
dest="${OUT:-$root/out}"
logs=/tmp/decode_r5_logs
build=/tmp/build-decode-r5
mkdir -p "$dest" "$logs"
has() { [[ ",$phases," == *",$1,"* ]]; }
left() { echo $((budget - ($(date +%s) - t0))); }
pack() { tar czf "$dest/decode_round5_logs.tgz" -C "$logs" . 2>/dev/null; }
step() { pack; echo "== $(date +%T) (+$(($(date +%s) - t0)) s) $*"; }
# fits SECONDS: true when SECONDS more still fit the budget, else says what is skipped
fits() { [ "$(left)" -ge "$1" ] && return 0; echo "SKIPPED (budget: $(left) s left, needs ~$1 s): $2"; return 1; }
trap pack EXIT
echo "source: $src, commit $FLASHLITE_COMMIT, phases $phases, budget $budget s"

if has build; then
  step "build"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv | tee "$logs/device.txt"
  cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
    -DFLASHLITE_BUILD_APPS=OFF -DFLASHLITE_BUILD_ENGINE=OFF -DFLASHLITE_DECODE_BENCH=ON \
    -DCMAKE_PREFIX_PATH="$root/.carry/deps/usr" > "$logs/cmake.log" 2>&1 || { tail -30 "$logs/cmake.log"; exit 1; }
  start=$(date +%s)
  cmake --build "$build" -j"$(nproc)" --target flashlite_decode_gpu_test flashlite_prefill_gpu_test flashlite_kv_cpu_test \
    flashlite_kv_errors_test flashlite_prefill_cpu_test flashlite_prefill_errors_test flashlite_decode_bench \
    > "$logs/build.log" 2>&1 || { grep -E "error|FAILED" -A3 "$logs/build.log" | head -60; exit 1; }
  echo "built in $(($(date +%s) - start)) s; warnings: $(grep -c -i "warning" "$logs/build.log")"
fi
t="$build/tests/kv/flashlite_decode_gpu_test"
b="$build/bin/flashlite_decode_bench"

if has test && fits 150 "ctest -L kv"; then
  step "ctest -L kv (variants included)"
  (cd "$build" && timeout "$(($(left) - 200 > 150 ? $(left) - 200 : 150))" ctest -L kv -j8 --timeout 300 > "$logs/ctest.log" 2>&1)
  echo "ctest rc=$?"
  grep -E "tests passed|tests failed|Total Test" "$logs/ctest.log"
  sed -n '/The following tests FAILED/,$p' "$logs/ctest.log" | head -40
  grep -c "GpuDecodeVariant" "$logs/ctest.log" | sed 's/^/variant grid tests in the log: /'
  "$t" --gtest_filter='*VariantPlans*:*prefetch4_long65536_contig*:*waves3_splits40*:*waves3_long65536_paged16*' 2>&1 |
    grep -E "kernel:|OK \]|FAILED" | head -12
fi

# bench: one process per variant (the switches are read once per process)
shapes="1:1024:0,1:8192:0,1:32768:0,1:1024:16,1:8192:16,1:32768:16,16:8192:0,16:8192:16,64:8192:0,64:8192:16"
run_bench() {  # name, then the environment for it
  local name=$1
  shift
  fits 45 "bench $name" || return 0
  env "$@" timeout 90 "$b" --only "$shapes" --reps 20 --out "$logs/bench_$name.json" > "$logs/bench_$name.log" 2>&1
  echo "bench $name rc=$? $(grep -E "^decode variant" "$logs/bench_$name.log")"
}
if has bench; then
  step "decode bench: default vs variants"
  run_bench default FLASHLITE_DECODE_PREFETCH=0
  run_bench prefetch2 FLASHLITE_DECODE_PREFETCH=2
  run_bench prefetch4 FLASHLITE_DECODE_PREFETCH=4
  run_bench waves2 FLASHLITE_DECODE_WAVES=2
  run_bench prefetch4_waves2 FLASHLITE_DECODE_PREFETCH=4 FLASHLITE_DECODE_WAVES=2
  run_bench default_again FLASHLITE_DECODE_PREFETCH=0
  python3 - "$logs" "$dest/decode_round5.json" <<'EOF'
import glob, json, os, sys
logs, out = sys.argv[1], sys.argv[2]
order = ["default", "prefetch2", "prefetch4", "waves2", "prefetch4_waves2", "default_again"]
runs = {}
for name in order:
    p = os.path.join(logs, f"bench_{name}.json")
    try:
        runs[name] = json.load(open(p))
    except Exception as e:  # a run that did not finish leaves no (or half a) JSON
        print(f"{name}: no result ({e.__class__.__name__})")
json.dump({"note": "round 5 decode variants, one process per variant (bench/decode/next_session.sh)", "runs": runs},
          open(out, "w"), indent=1)
names = [n for n in order if n in runs]
if not names:
    sys.exit(0)
for n in names:  # the bench checks sequence 0 / kv head 0 against float64 where batch x kv_len <= 1M
    errs = [r["check_rel_err"] for r in runs[n]["rows"] if r.get("check_rel_err", 0) > 0]
    print(f"{n}: variant {runs[n].get('variant')}, rows {len(runs[n]['rows'])}, checked {len(errs)}, max rel err {max(errs, default=0):.1e}")
bw = runs[names[0]]["read_bw_tbps"]
print(f"device {runs[names[0]]['device']}, read bandwidth {bw:.3f} TB/s (first run); us per call, graph (eager); % of read bw (graph)")
print("%-20s" % "case" + "".join(" %-26s" % n for n in names))
key = lambda r: (r["batch"], r["kv_len"], r["page_size"], r["q_len"])
cases = [key(r) for r in runs[names[0]]["rows"]]
for c in cases:
    line = "b%d kv%d %s" % (c[0], c[1], "paged%d" % c[2] if c[2] else "contig")
    cells = []
    for n in names:
        r = next((r for r in runs[n]["rows"] if key(r) == c), None)
        cells.append("-" if r is None else "%.2f (%.1f) %.1f%% s%d" % (r["us_graph"], r["us_median"], r["pct_read_bw_graph"], r["splits"]))
    print("%-20s" % line + "".join(" %-26s" % x for x in cells))
EOF
fi

if has sanitize; then
  step "compute-sanitizer (default and each variant)"
  f='GpuKv.SplitMerge*:GpuKv.DecodeStep*:GpuKv.VariantPlans:Kv/GpuDecode.*/window_sinks:Kv/GpuDecode.*/paged17_splits17:Kv/GpuDecodeVariant.*/prefetch4_window_sinks:Kv/GpuDecodeVariant.*/prefetch4_paged17_splits17:Kv/GpuDecodeVariant.*/prefetch4_group16_q5_two_row_chunks:Kv/GpuDecodeVariant.*/prefetch4_empty_sequences:Kv/GpuDecodeVariant.*/prefetch4_paged48_window_sinks:Kv/GpuDecodeVariant.*/waves3_window_sinks:Kv/GpuDecodeVariant.*/waves3_contig_float16_d128*'
  if fits 60 "memcheck"; then
    timeout "$(($(left) > 200 ? 150 : $(left) - 30))" compute-sanitizer --tool memcheck --error-exitcode 3 "$t" --gtest_filter="$f" > "$logs/memcheck.log" 2>&1
    echo "memcheck rc=$? $(grep -E 'ERROR SUMMARY|PASSED|FAILED' "$logs/memcheck.log" | tr '\n' ' ')"
  fi
  if fits 40 "memcheck with the environment switches"; then
    FLASHLITE_DECODE_PREFETCH=8 FLASHLITE_DECODE_WAVES=2 timeout 90 compute-sanitizer --tool memcheck --error-exitcode 3 "$t" \
      --gtest_filter='Kv/GpuDecode.*/paged17_splits17:Kv/GpuDecode.*/long65536_paged16:Kv/GpuDecode.*/window_sinks' > "$logs/memcheck_env.log" 2>&1
    echo "memcheck (env PREFETCH=8 WAVES=2) rc=$? $(grep -E 'ERROR SUMMARY|PASSED|FAILED' "$logs/memcheck_env.log" | tr '\n' ' ')"
  fi
  if fits 60 "racecheck"; then
    timeout "$(($(left) > 150 ? 120 : $(left) - 20))" compute-sanitizer --tool racecheck --error-exitcode 3 "$t" \
      --gtest_filter='Kv/GpuDecode.*/window_sinks:Kv/GpuDecode.*/group8_q8_64rows:Kv/GpuDecodeVariant.*/prefetch4_window_sinks:Kv/GpuDecodeVariant.*/waves3_group8_q8_64rows:Kv/GpuDecodeVariant.*/prefetch4_paged17_splits17' \
      > "$logs/racecheck.log" 2>&1
    echo "racecheck rc=$? $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY|PASSED|FAILED' "$logs/racecheck.log" | tr '\n' ' ')"
  fi
fi
step "done"
