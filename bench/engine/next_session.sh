#!/usr/bin/env bash
# The engine's batch-1 work (docs/perf-notes.md, Engine (CUDA); written for round 3, whose winner is now the default)
# in ONE device call, under 9 minutes:
#   1. build (sm_90a) the CLI, the engine's CUDA tests and bench/engine's GEMV benchmark;
#   2. cuda_ops_test (each GEMV variant vs float64 and the fused RoPE vs the unfused path), flashlite_engine_gemv_bench
#      (every shape alone / in a stream, default and variants) and cuda_model_test (every switch: the default's greedy
#      tokens);
#   3. a per-kernel table of one decode step: the engine's event profile (FLASHLITE_ENGINE_PROFILE=1, eager steps
#      queued behind a flag) and ncu on one range-marked step (bench/engine/profile_decode.sh), the defaults and all switches off;
#   4. bench/e2e.py engine-only at batch 1 and 16, prompt 512: default, then every entry of e2e.py's VARIANTS
#      (each relative to the defaults: PDL off, all switches off, late trigger, preload small, split-K off, decode
#      splits 1 / 2 / 4), with the JSON rewritten after every run.
# Knobs (environment): OPS_FILTER / MODEL_FILTER (gtest filters), EVENT_PROFILES / NCU_PROFILES (a bash word list
# of label|VARS specs, e.g. '"default|" "stream|$stream"'; $off and $stream name the switches-off and streamed sets),
# E2E_BATCHES (default 1,16), E2E_VARIANTS (default all), SKIP_EVENT=1 / SKIP_NCU=1 (leave those profiles out).
# ../shared does not travel: first, on the dev machine,
#   mkdir -p .carry/models && cp -r ../shared/models/stories260K ../shared/models/llama3-tokenizer .carry/models/
# then run this with `.carry` in the run's carry list (and the GoogleTest/CLI11/PCRE2 prefixes .carry/deps,
# .carry/gtest if the machine lacks them, as gpu_run.sh). Output under $OUT (at most 8 files): gpu.txt, e2e.json,
# profile.txt (both per-kernel tables), tests.txt (the tests' summaries and GEMV timings), logs.tgz (everything).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
OUT="${OUT:-/tmp/flashlite_engine_round3}"
# The logs live outside $OUT and are packed into $OUT/logs.tgz after every phase: a run killed at the device tool's
# limit (SIGKILL: no EXIT trap) still returns at most 8 files, the logs of the phases it finished among them.
LOGDIR=/tmp/flashlite_engine_round3_logs/logs
rm -rf "$LOGDIR"
mkdir -p "$LOGDIR" "$OUT"
export PYTHONUNBUFFERED=1 LOGDIR
export FLASHLITE_MODELS="${FLASHLITE_MODELS:-$root/.carry/models}"
export FLASHLITE_PARITY_CACHE="${FLASHLITE_PARITY_CACHE:-/tmp/flashlite_parity}"
build="${BUILD_DIR:-$root/build-gpu}"
ckpt="$FLASHLITE_PARITY_CACHE/llama32_1b_random"
tok="$FLASHLITE_MODELS/llama3-tokenizer"
t0=$(date +%s)
budget="${BUDGET_S:-565}"  # seconds of the device call's 600 this script may use (the last phases are cut to fit)
elapsed() { echo $(( $(date +%s) - t0 )); }
pack() { tar -czf "$OUT/logs.tgz.tmp" -C "$(dirname "$LOGDIR")" logs 2>/dev/null && mv -f "$OUT/logs.tgz.tmp" "$OUT/logs.tgz"; }
stamp() { pack; echo "[$(elapsed) s] $*" | tee -a "$LOGDIR/timeline.txt"; }
# before SECONDS: true while the elapsed time is below SECONDS, else says what is skipped
before() { [ "$(elapsed)" -lt "$1" ] && return 0; echo "SKIPPED at $(elapsed) s (budget): $2" | tee -a "$LOGDIR/timeline.txt" "$OUT/profile.txt"; return 1; }
finish() { stamp "done"; pack; }
trap finish EXIT

nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv | tee "$OUT/gpu.txt"
git -C "$root" log -1 --format='commit %H %s' >> "$OUT/gpu.txt" 2>/dev/null
prefixes=""
for d in "$root/.carry/deps/usr" "$root/.carry/gtest/usr"; do [ -d "$d" ] && prefixes="${prefixes:+$prefixes;}$d"; done
stamp "configure + build"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DFLASHLITE_BUILD_BENCH=ON \
  ${prefixes:+"-DCMAKE_PREFIX_PATH=$prefixes"} > "$LOGDIR/configure.log" 2>&1 || { tail -30 "$LOGDIR/configure.log"; exit 1; }
cmake --build "$build" -j16 --target flashlite_cli flashlite_engine_cuda_model_test flashlite_engine_cuda_ops_test \
  flashlite_engine_gemv_bench \
  > "$LOGDIR/build.log" 2>&1 || { grep -E "error|FAILED" "$LOGDIR/build.log" | head -30; exit 1; }
bin="$build/bin/flashlite"
cuobjdump -res-usage "$build/engine/CMakeFiles/flashlite_engine.dir/cuda_ops/gemv.cu.o" > "$LOGDIR/res_usage_gemv.txt" 2>&1

status=0
stamp "cuda_ops_test"
timeout 150 stdbuf -oL "$build/tests/engine/flashlite_engine_cuda_ops_test" --gtest_filter="${OPS_FILTER:-*}" > "$LOGDIR/cuda_ops_test.log" 2>&1 || status=1
stamp "gemv_bench"
timeout 120 stdbuf -oL "$build/bin/flashlite_engine_gemv_bench" > "$LOGDIR/gemv_bench.log" 2>&1 || status=1
stamp "cuda_model_test"
timeout 150 stdbuf -oL "$build/tests/engine/flashlite_engine_cuda_model_test" --gtest_filter="${MODEL_FILTER:-*}" > "$LOGDIR/cuda_model_test.log" 2>&1 || status=1
{ grep -hE "^\[  (PASSED|FAILED|SKIPPED) |^\[==========\]|Failure|error:|parts from|bit-equal|gemv .* us alone|vs float64" \
    "$LOGDIR/cuda_ops_test.log" "$LOGDIR/gemv_bench.log" "$LOGDIR/cuda_model_test.log"; } > "$OUT/tests.txt"
tail -n 3 "$LOGDIR/cuda_ops_test.log" "$LOGDIR/cuda_model_test.log"

stamp "checkpoint"
[ -f "$ckpt/config.json" ] || python3 bench/e2e.py --flashlite "$bin" --checkpoint "$ckpt" --tokenizer-dir "$tok" \
  --batches 1 --prompts 16 --new-tokens 2 --skip-transformers --out "$LOGDIR/e2e_warm.json" > "$LOGDIR/checkpoint.log" 2>&1

off="FLASHLITE_ENGINE_SPLITK=0 FLASHLITE_ENGINE_FUSE_ROPE=0 FLASHLITE_ENGINE_FUSE_ARGMAX=0 FLASHLITE_ENGINE_PRELOAD=0"  # = e2e.py SWITCHES_OFF
stamp "event profiles"
stream="FLASHLITE_ENGINE_STREAM=1"
specs=("default|" "switches_off|$off" "default_batch16|")
[ -n "${EVENT_PROFILES:-}" ] && eval "specs=($EVENT_PROFILES)"
[ "${SKIP_EVENT:-0}" = 1 ] && specs=()
for spec in "${specs[@]}"; do
  before 380 "event profile ${spec%%|*}" || continue
  label="${spec%%|*}"; vars="${spec#*|}"; b=1; [ "$label" = default_batch16 ] && b=16
  env $vars FLASHLITE_ENGINE_PROFILE=1 timeout 60 "$bin" generate --model "$ckpt" --device cuda --prompt-tokens 512 \
    --batch "$b" --max-tokens 40 --ignore-eos --json > "$LOGDIR/profile_$label.json" 2> "$LOGDIR/profile_$label.err"
  { echo "== event profile: $label (batch $b), the last 16 steps =="; grep -m1 "flashlite engine variants" "$LOGDIR/profile_$label.err"
    awk '/flashlite engine profile/{buf=""} /flashlite engine profile|^  /{buf=buf $0 "\n"} END{printf "%s", buf}' "$LOGDIR/profile_$label.err"
    grep -q "flashlite engine profile" "$LOGDIR/profile_$label.err" || tail -n 8 "$LOGDIR/profile_$label.err"; } >> "$OUT/profile.txt"
done
stamp "ncu profiles"
specs=("default|" "switches_off|$off")
[ -n "${NCU_PROFILES:-}" ] && eval "specs=($NCU_PROFILES)"
[ "${SKIP_NCU:-0}" = 1 ] && specs=()
for spec in "${specs[@]}"; do
  label="${spec%%|*}"; vars="${spec#*|}"
  before 330 "ncu profile $label" || continue
  { env $vars NCU_TIMEOUT=100 bash bench/engine/profile_decode.sh "$bin" "$ckpt" "$tok" "$label" 2>&1; echo; } >> "$OUT/profile.txt"
done

stamp "e2e: default, then the variants"
left=$(( budget - 10 - $(elapsed) ))
[ "$left" -lt 40 ] && { echo "SKIPPED at $(elapsed) s (budget): e2e" | tee -a "$OUT/profile.txt"; exit "$status"; }
timeout "$left" python3 bench/e2e.py --flashlite "$bin" --checkpoint "$ckpt" --tokenizer-dir "$tok" \
  --skip-transformers --batches "${E2E_BATCHES:-1,16}" --prompts 512 --variants "${E2E_VARIANTS:-all}" --out "$OUT/e2e.json" \
  > "$LOGDIR/e2e.log" 2>&1 || status=1
python3 - "$OUT/e2e.json" <<'PY' | tee -a "$OUT/profile.txt"
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:
    sys.exit(f"no e2e.json: {e}")
floor = r["rows"][0]["weight_floor_tbt_ms"] if r["rows"] else float("nan")
print(f"e2e (engine only, prompt 512, 128 tokens; weight floor {floor:.3f} ms): ms/step, tok/s")
def line(name, rows):
    cells = []
    for row in rows:
        f = row["flashlite"]
        cells.append(f"b{row['batch']}: " + (f"{f['tbt_ms']:.3f} ms {f['decode_tok_s']:.0f} tok/s" if "tbt_ms" in f
                                              else "= default (GEMV switches only)" if "skipped" in f else "error"))
    print(f"  {name:24s} " + " | ".join(cells))
line("default", r["rows"])
for name, v in r.get("variants", {}).items():
    line(name, v["rows"])
PY
exit "$status"
