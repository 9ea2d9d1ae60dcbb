#!/usr/bin/env bash
# One call on the GPU machine for the decode path: build (sm_90a) the KV tests and the decode bench, run the kv test
# suite (ctest -L kv), the benchmark (with the split sweep), the torch peers, compute-sanitizer (memcheck on small
# cases, racecheck on one). Logs go to a tarball in $OUT, JSON next to it. Phases (comma list, default all):
#   build,test,bench,sdpa,sanitize   and, not in the default: quick (main shapes only), ncu (Nsight Compute on a few
#   shapes, NCU_RUNS="B:L:PAGE ..."), chain (launch_chain.cu: graphs of near-empty kernels shaped like the decode grids),
#   timeline (a second build with -DFLASHLITE_DECODE_TIMELINE=1: per-block %globaltimer stamps of graph-replayed calls,
#   TIMELINE_RUNS="B:L:PAGE,...")
#
#   bash bench/decode/run_device.sh [phases] [source tarball]
#
# With a source tarball (git archive of a commit) the build uses that instead of the working tree (others'
# uncommitted edits travel with the tree). GoogleTest comes from .carry/deps (scripts/make-carry.sh).
set -uo pipefail
phases="${1:-build,test,bench,sdpa,sanitize}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
src="$root"
if [ -n "${2:-}" ]; then
  src=/tmp/decode_src
  rm -rf "$src" && mkdir -p "$src" && tar xf "$2" -C "$src"
fi
dest="${OUT:-$root/out}"
logs=/tmp/decode_logs
build="${DECODE_BUILD:-/tmp/build-decode}"
mkdir -p "$dest" "$logs"
export PYTHONUNBUFFERED=1
has() { [[ ",$phases," == *",$1,"* ]]; }
pack() { tar czf "$dest/decode_logs.tgz" -C "$logs" . 2>/dev/null; }
step() { pack; echo "== $(date +%T) $*"; }
trap pack EXIT

if has build; then
  step "build"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv | tee "$logs/device.txt"
  cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
    -DFLASHLITE_BUILD_APPS=OFF -DFLASHLITE_BUILD_ENGINE=OFF -DFLASHLITE_DECODE_BENCH=ON \
    -DCMAKE_PREFIX_PATH="$root/.carry/deps/usr" > "$logs/cmake.log" 2>&1 || { tail -30 "$logs/cmake.log"; exit 1; }
  start=$(date +%s)
  cmake --build "$build" -j"$(nproc)" --target flashlite_decode_gpu_test flashlite_kv_cpu_test flashlite_kv_errors_test \
    flashlite_decode_bench flashlite_launch_chain > "$logs/build.log" 2>&1 || { grep -E "error|FAILED" -A3 "$logs/build.log" | head -60; exit 1; }
  echo "built in $(( $(date +%s) - start )) s"
fi

[ -f "$root/.kvsrc/commit.txt" ] && export FLASHLITE_COMMIT="$(cat "$root/.kvsrc/commit.txt")"
if has bench; then
  step "decode bench (read bandwidth, main shapes, split sweep)"
  "$build/bin/flashlite_decode_bench" --sweep --out "$dest/decode_raw.json" 2>&1 | tee "$logs/bench.log" | grep -v "^sweep"
  grep "^sweep" "$logs/bench.log" | awk '{printf "%s %s %s s%s %s/%s\n", $2, $3, $4, $7, $8, $20}' | paste - - - - - - | head -40
  FLASHLITE_DECODE_PDL=0 "$build/bin/flashlite_decode_bench" --quick --out "$logs/decode_nopdl.json" > "$logs/bench_nopdl.log" 2>&1
  echo "without PDL:"; grep "^main" "$logs/bench_nopdl.log"
  FLASHLITE_DECODE_CLUSTER=0 "$build/bin/flashlite_decode_bench" --quick --out "$logs/decode_combine.json" > "$logs/bench_combine.log" 2>&1
  echo "combine kernel only (FLASHLITE_DECODE_CLUSTER=0):"; grep "^main" "$logs/bench_combine.log"
fi

if has quick; then
  step "decode bench, main shapes"
  "$build/bin/flashlite_decode_bench" --quick --out "$dest/decode_quick.json" 2>&1 | tee "$logs/quick.log" | grep -E "^main|bandwidth"
fi

if has chain; then
  step "launch chain (fixed cost floor)"
  "$build/bin/flashlite_launch_chain" --out "$dest/launch_chain.json" 2>&1 | tee "$logs/chain.log"
fi

if has timeline; then
  step "timeline build + run"
  tl=/tmp/build-decode-timeline
  cmake -S "$src" -B "$tl" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
    -DFLASHLITE_BUILD_APPS=OFF -DFLASHLITE_BUILD_ENGINE=OFF -DFLASHLITE_DECODE_BENCH=ON -DFLASHLITE_BUILD_TESTS=OFF \
    -DCMAKE_CUDA_FLAGS=-DFLASHLITE_DECODE_TIMELINE=1 -DCMAKE_CXX_FLAGS=-DFLASHLITE_DECODE_TIMELINE=1 \
    -DCMAKE_PREFIX_PATH="$root/.carry/deps/usr" > "$logs/timeline_cmake.log" 2>&1 &&
    cmake --build "$tl" -j"$(nproc)" --target flashlite_decode_bench > "$logs/timeline_build.log" 2>&1 ||
    { grep -E "error|FAILED" -A3 "$logs/timeline_build.log" "$logs/timeline_cmake.log" | head -40; }
  "$tl/bin/flashlite_decode_bench" --no-bw --timeline --only "${TIMELINE_RUNS:-1:1024:0,1:8192:0,1:32768:0,16:8192:0}" \
    --out "$dest/decode_timeline.json" 2>&1 | tee "$logs/timeline.log" | grep -E "^timeline|^main"
fi

if has ncu; then
  step "ncu"
  ncu_bin="$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)"
  for c in ${NCU_RUNS:-1:8192:0 1:32768:0 64:8192:0}; do
    {
      timeout 120 "$ncu_bin" --clock-control none -k regex:decode_ --launch-skip 4 --launch-count 2 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
        --section WarpStateStats --section SchedulerStats \
        --metrics dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sector_hit_rate.pct \
        "$build/bin/flashlite_decode_bench" --only "$c" --no-bw --reps 4 > "$logs/ncu_${c//:/_}.txt" 2>&1
      echo "ncu $c rc=$?"
      grep -E "decode_(split|combine)_kernel|^    Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|dram__throughput|dram__bytes_read|Warp Cycles Per Issued|No Eligible" \
        "$logs/ncu_${c//:/_}.txt" | head -24
      cp "$logs/ncu_${c//:/_}.txt" "$dest/" 2>/dev/null
    }
  done
fi

if has sdpa; then
  step "torch peers"
  python3 "$src/bench/decode/sdpa_decode.py" --out "$dest/sdpa_decode.json" > "$logs/sdpa.log" 2>&1
  echo "sdpa rc=$?"; grep -E "^\{" "$logs/sdpa.log" | python3 -c "
import sys, ast
for l in sys.stdin:
    r = ast.literal_eval(l)
    print(r['batch'], r['kv_len'], r['peer'], '%.2f us %.3f TB/s' % (r['us_median'], r['tbps']) if 'us_median' in r else r.get('error', '')[:80])"
fi

if has test; then
  step "ctest -L kv"
  (cd "$build" && ctest -L kv -j"$(nproc)" --timeout 600 > "$logs/ctest.log" 2>&1)
  grep -E "tests passed|tests failed|Total Test" "$logs/ctest.log"
  sed -n '/The following tests FAILED/,$p' "$logs/ctest.log" | head -40
  grep -E "Failure|non-finite|relative error|LSE mismatch|lse\[|were written|must be exactly|Which is|Expected|first:" "$logs/ctest.log" | head -40
  "$build/tests/kv/flashlite_decode_gpu_test" --gtest_filter='*long65536_contig*:*splits40*' 2>&1 | grep -E "kernel:|OK|FAILED" | head
fi

if has sanitize; then
  step "compute-sanitizer"
  t="$build/tests/kv/flashlite_decode_gpu_test"
  f='GpuKv.SplitMerge*:*/window_sinks:*/splits17:*/q8_short_rows_masked:*/group16_q5_two_row_chunks:*/empty_sequences:*/paged16_bf16_d64*:*/contig_f16_d128*:*GpuAppend*/paged_bfloat16*:*GpuAppend*/contig_float16_rope_llama3*:GpuKv.CudaSpecificErrors:*/paged48_window_sinks:*/paged17_splits17'
  compute-sanitizer --tool memcheck --error-exitcode 3 "$t" --gtest_filter="$f" > "$logs/memcheck.log" 2>&1
  echo "memcheck rc=$? $(grep -E 'ERROR SUMMARY|PASSED|FAILED' "$logs/memcheck.log" | tr '\n' ' ')"
  compute-sanitizer --tool racecheck --error-exitcode 3 "$t" --gtest_filter='GpuKv.SplitMerge*:*/window_sinks:*/group8_q8_64rows:*/paged17_splits17' > "$logs/racecheck.log" 2>&1
  echo "racecheck rc=$? $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY|PASSED|FAILED' "$logs/racecheck.log" | tr '\n' ' ')"
fi
step "done"
