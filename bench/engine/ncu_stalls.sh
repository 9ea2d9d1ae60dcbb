#!/usr/bin/env bash
# Why the engine's latency-bound kernels take as long as they do (diagnostic): builds the CLI (sm_90a), makes the
# random Llama-3.2-1B-shaped checkpoint if missing, and runs Nsight Compute on the 8th decode step (batch 1, prompt
# 512; FLASHLITE_ENGINE_PROFILE=range) for the kernels matching NCU_KERNELS (default: the decode split kernel and the
# register GEMVs, NCU_COUNT launches), with the warp-state (stall reasons), scheduler, occupancy and speed-of-light
# sections. ncu serializes the kernels (no PDL overlap) and leaves caches and clocks alone. Output: $OUT/ncu_stalls.txt.
# Run with `.carry` in the carry list (as next_session.sh).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
OUT="${OUT:-/tmp/flashlite_ncu_stalls}"
mkdir -p "$OUT"
export FLASHLITE_MODELS="${FLASHLITE_MODELS:-$root/.carry/models}"
export FLASHLITE_PARITY_CACHE="${FLASHLITE_PARITY_CACHE:-/tmp/flashlite_parity}"
build="${BUILD_DIR:-$root/build-gpu}"
ckpt="$FLASHLITE_PARITY_CACHE/llama32_1b_random"
tok="$FLASHLITE_MODELS/llama3-tokenizer"
prefixes=""
for d in "$root/.carry/deps/usr" "$root/.carry/gtest/usr"; do [ -d "$d" ] && prefixes="${prefixes:+$prefixes;}$d"; done
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DFLASHLITE_BUILD_BENCH=OFF \
  ${prefixes:+"-DCMAKE_PREFIX_PATH=$prefixes"} > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
cmake --build "$build" -j16 --target flashlite_cli >> "$OUT/build.log" 2>&1 || { grep -E "error|FAILED" "$OUT/build.log" | head -30; exit 1; }
bin="$build/bin/flashlite"
[ -f "$ckpt/config.json" ] || python3 bench/e2e.py --flashlite "$bin" --checkpoint "$ckpt" --tokenizer-dir "$tok" \
  --batches 1 --prompts 16 --new-tokens 2 --skip-transformers --out /tmp/e2e_warm.json > "$OUT/checkpoint.log" 2>&1
FLASHLITE_ENGINE_PROFILE=range timeout "${NCU_TIMEOUT:-240}" ncu --profile-from-start off --clock-control none \
  --cache-control none -k "regex:${NCU_KERNELS:-decode_split|gemv}" -c "${NCU_COUNT:-6}" \
  --section WarpStateStats --section SchedulerStats --section Occupancy --section SpeedOfLight --section LaunchStats \
  --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
  "$bin" generate --model "$ckpt" --device cuda --prompt-tokens 512 --batch 1 --max-tokens 12 --ignore-eos --json \
  > "$OUT/ncu_stalls.txt" 2> "$OUT/ncu_stalls.err"
echo "ncu exited $?"
