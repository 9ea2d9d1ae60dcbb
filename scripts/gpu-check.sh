#!/usr/bin/env bash
# The one command for the GPU machine: build everything for the GPU found (sm_90a on Hopper), run the GPU tests
# (ctest: fused forward, CUDA engine), run the main job (`flashlite attn`) on a few shapes, and leave logs and JSON in
# OUTDIR (argument, or $OUT). The fused kernel's sweep/profiling/side-by-side live in bench/fwd/run_device.sh.
#
#   bash scripts/gpu-check.sh [OUTDIR]
#
# The GPU machine has no package registry: GoogleTest, CLI11 and PCRE2 come from .carry/deps (made here by
# scripts/make-carry.sh; name .carry in the device tool's carry list). See the README.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-${OUT:-$root/out}}"
build="${BUILD_DIR:-$root/build-gpu}"
mkdir -p "$out"
logs=/tmp/gpu-check-logs
mkdir -p "$logs"
pack() { tar czf "$out/gpu-check-logs.tgz" -C "$logs" . 2>/dev/null; }
trap pack EXIT
step() { echo "== $(date +%T) $*"; }

step "device"
nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv | tee "$logs/device.txt"
cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d '.')
arch="${cap}"
[ "$cap" = "90" ] && arch="90a"

step "build (sm_${arch})"
extra=()
prefixes=""
[ -d "$root/.carry/deps/usr" ] && prefixes="$root/.carry/deps/usr"
[ -d "$root/.carry/gtest/usr" ] && prefixes="${prefixes:+$prefixes;}$root/.carry/gtest/usr"
[ -n "$prefixes" ] && extra+=("-DCMAKE_PREFIX_PATH=$prefixes")
start=$(date +%s)
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$arch" "${extra[@]}" \
  > "$logs/cmake.log" 2>&1 || { tail -30 "$logs/cmake.log"; exit 1; }
cmake --build "$build" -j"$(nproc)" > "$logs/build.log" 2>&1 || { grep -E "error|FAILED" -A3 "$logs/build.log" | head -60; exit 1; }
echo "built in $(( $(date +%s) - start )) s"

step "ctest (every suite; GPU tests run for real here)"
(cd "$build" && ctest -j8 --timeout 900 --output-on-failure > "$logs/ctest.log" 2>&1)
ctest_rc=$?
grep -E "tests passed|tests failed|Total Test" "$logs/ctest.log"
grep -E "\(Failed\)|\(Timeout\)|\*\*\*Exception" "$logs/ctest.log" | head -20

step "main job: flashlite attn"
bin="$build/bin/flashlite"
"$bin" info | tee "$logs/info.txt"
{
  echo "["
  first=1
  while read -r args; do
    [ $first -eq 1 ] || echo ","
    first=0
    # shellcheck disable=SC2086
    "$bin" attn $args --json || echo '{"failed": "'"$args"'"}'
  done <<'CASES'
--batch 1 --heads 8 --seq-q 1024
--batch 4 --heads 16 --seq-q 4096 --head-dim 128 --causal --no-check --repeat 20
--batch 2 --heads 32 --kv-heads 8 --seq-q 2048 --head-dim 128 --causal --repeat 20
--batch 1 --heads 8 --seq-q 4096 --head-dim 128 --window 1024,0 --sink-tokens 4 --sink-logits --repeat 20
--batch 3 --heads 8 --kv-heads 2 --seq-q 700 --seq-k 900 --varlen --causal --dtype f16
--batch 1 --heads 8 --seq-q 512 --dtype f32 --causal
CASES
  echo "]"
} > "$out/attn_main_job.json" 2> "$logs/attn.err"
python3 -c "
import json,sys
rows=json.load(open('$out/attn_main_job.json'))
for r in rows:
    if 'failed' in r: print('FAILED', r['failed']); continue
    print('%-9s %-26s b%d h%d/%d sq%d sk%d d%d %8.3f ms %8.1f TFLOP/s  %s' % (r['dtype'], r['kernel'], r['batch'], r['heads'], r['kv_heads'], r['seq_q'], r['seq_k'], r['head_dim'], r['median_ms'], r['gflops_per_s']/1e3, ('rel %.2e PASS' % r['rel_err']) if r.get('passed') else ('unchecked' if not r['checked'] else 'FAIL')))
" | tee "$logs/attn_summary.txt"
cp "$logs/ctest.log" "$out/ctest.log" 2>/dev/null
exit $ctest_rc
