#!/usr/bin/env bash
# Where a batch-1 decode step's time goes between kernels (diagnostic, docs/perf-notes.md "Engine round 9"): builds the
# CLI with -DFLASHLITE_DECODE_TIMELINE=1 (per-block %globaltimer stamps in the decode and GEMV kernels, compiled out
# of normal builds), makes the random Llama-3.2-1B-shaped checkpoint if missing (bench/e2e.py), and runs
# `flashlite generate` with FLASHLITE_ENGINE_TIMELINE=1 at batch 1, prompt 512: the engine prints, when it is
# destroyed, each layer's kernels of the last (graph-replayed) step: first start / median after the wait / last end.
# TIMELINE_VARIANTS: a bash word list of label|VARS specs (default: the defaults, 4 decode splits, no cluster merge).
# Then (E2E_VARIANTS set) bench/e2e.py engine-only at batch 1 with those variants, on the same (timeline) build:
# its stamps cost a branch per block where the timeline is off. Output under $OUT: timeline.txt, e2e.json, build.log.
# Run with `.carry` in the carry list (GoogleTest / CLI11 / PCRE2 prefixes and the models, as next_session.sh).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
OUT="${OUT:-/tmp/flashlite_engine_timeline}"
mkdir -p "$OUT"
export FLASHLITE_MODELS="${FLASHLITE_MODELS:-$root/.carry/models}"
export FLASHLITE_PARITY_CACHE="${FLASHLITE_PARITY_CACHE:-/tmp/flashlite_parity}"
build="$root/build-timeline"
ckpt="$FLASHLITE_PARITY_CACHE/llama32_1b_random"
tok="$FLASHLITE_MODELS/llama3-tokenizer"
prefixes=""
for d in "$root/.carry/deps/usr" "$root/.carry/gtest/usr"; do [ -d "$d" ] && prefixes="${prefixes:+$prefixes;}$d"; done
t0=$(date +%s)
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DFLASHLITE_BUILD_BENCH=OFF \
  -DCMAKE_CUDA_FLAGS=-DFLASHLITE_DECODE_TIMELINE=1 -DCMAKE_CXX_FLAGS=-DFLASHLITE_DECODE_TIMELINE=1 \
  ${prefixes:+"-DCMAKE_PREFIX_PATH=$prefixes"} > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
cmake --build "$build" -j16 --target flashlite_cli >> "$OUT/build.log" 2>&1 || { grep -E "error|FAILED" "$OUT/build.log" | head -30; exit 1; }
echo "[$(( $(date +%s) - t0 )) s] built"
bin="$build/bin/flashlite"
[ -f "$ckpt/config.json" ] || python3 bench/e2e.py --flashlite "$bin" --checkpoint "$ckpt" --tokenizer-dir "$tok" \
  --batches 1 --prompts 16 --new-tokens 2 --skip-transformers --out /tmp/e2e_warm.json > "$OUT/checkpoint.log" 2>&1
echo "[$(( $(date +%s) - t0 )) s] checkpoint"
specs=("default|" "decode_splits_4|FLASHLITE_ENGINE_DECODE_SPLITS=4" "cluster_off|FLASHLITE_DECODE_CLUSTER=0")
[ -n "${TIMELINE_VARIANTS:-}" ] && eval "specs=($TIMELINE_VARIANTS)"
for spec in "${specs[@]}"; do
  label="${spec%%|*}"; vars="${spec#*|}"
  { echo "== $label ($vars)"
    env $vars FLASHLITE_ENGINE_TIMELINE=1 timeout 60 "$bin" generate --model "$ckpt" --device cuda --prompt-tokens 512 \
      --batch 1 --max-tokens 64 --ignore-eos --json 2>&1 >/dev/null | grep -v "^\s*$" | tail -n 24; } >> "$OUT/timeline.txt"
done
echo "[$(( $(date +%s) - t0 )) s] timelines"
if [ -n "${E2E_VARIANTS:-}" ]; then
  timeout "${E2E_TIMEOUT:-300}" python3 bench/e2e.py --flashlite "$bin" --checkpoint "$ckpt" --tokenizer-dir "$tok" \
    --skip-transformers --batches 1 --prompts 512 --variants "$E2E_VARIANTS" --out "$OUT/e2e.json" > "$OUT/e2e.log" 2>&1
  tail -n 5 "$OUT/e2e.log"
  python3 -c "
import json,sys
r=json.load(open('$OUT/e2e.json'))
print('default', [round(x['flashlite'].get('decode_tok_s',0)) for x in r['rows']])
for n,v in r.get('variants',{}).items(): print(n, [round(x['flashlite'].get('decode_tok_s',0)) for x in v['rows']])"
fi
echo "[$(( $(date +%s) - t0 )) s] done"
