#!/usr/bin/env bash
# The engine on the GPU machine in one call: build with CUDA (sm_90a), the engine's CUDA tests (vs float64 and the CPU
# path), the transformers parity tests (stories260K fp32 greedy, random Llama-3.2-1B bf16 logits) and the e2e benchmark
# vs transformers. Logs and JSON under $OUT.
#
# ../shared does not travel to the GPU machine: copy the models the tests need into the git-ignored .carry/ first,
#   mkdir -p .carry/models && cp -r ../shared/models/stories260K ../shared/models/llama3-tokenizer .carry/models/
# and pass `.carry` in the run's carry list. FLASHLITE_MODELS defaults to that folder.
# PROFILE=1 adds per-kernel times of decode steps (bench/engine/profile_decode.sh, ncu); E2E_ARGS passes options to
# bench/e2e.py (e.g. --skip-transformers, --ablations); SKIP_PARITY=1 leaves out the transformers parity tests.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
OUT="${OUT:-/tmp/flashlite_engine_gpu}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export FLASHLITE_MODELS="${FLASHLITE_MODELS:-$root/.carry/models}"
build="${BUILD_DIR:-$root/build-gpu}"

nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
prefixes=""  # GoogleTest, CLI11, PCRE2 unpacked by scripts/make-carry.sh (the GPU machine has no package registry)
for d in "$root/.carry/deps/usr" "$root/.carry/gtest/usr"; do [ -d "$d" ] && prefixes="${prefixes:+$prefixes;}$d"; done
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DFLASHLITE_BUILD_BENCH=OFF \
  ${prefixes:+"-DCMAKE_PREFIX_PATH=$prefixes"} > "$OUT/configure.log" 2>&1 ||
  { tail -30 "$OUT/configure.log"; exit 1; }
cmake --build "$build" -j16 --target flashlite_cli flashlite_engine_cuda_model_test flashlite_engine_cuda_ops_test \
  > "$OUT/build.log" 2>&1 ||
  { grep -E "error|FAILED" "$OUT/build.log" | head -30; exit 1; }

status=0
# One random 1B checkpoint for the parity test and the benchmark (same seed and config; written once, ~5 s).
export FLASHLITE_PARITY_CACHE="${FLASHLITE_PARITY_CACHE:-/tmp/flashlite_parity}"
"$build/tests/engine/flashlite_engine_cuda_ops_test" 2>&1 | tee "$OUT/cuda_ops_test.log" || status=1
"$build/tests/engine/flashlite_engine_cuda_model_test" 2>&1 | tee "$OUT/cuda_model_test.log" || status=1
[ -z "${SKIP_PARITY:-}" ] && { FLASHLITE_BIN="$build/bin/flashlite" FLASHLITE_PARITY_OUT="$OUT" \
  python3 -m pytest -q -s -p no:cacheprovider tests/engine/test_engine_gpu_parity.py 2>&1 | tee "$OUT/parity.log" || status=1; }
[ -n "${PROFILE:-}" ] && { bash bench/engine/profile_decode.sh "$build/bin/flashlite" "$FLASHLITE_PARITY_CACHE/llama32_1b_random" \
  "$FLASHLITE_MODELS/llama3-tokenizer" 2>&1 | tail -60 || status=1; }
python3 bench/e2e.py --flashlite "$build/bin/flashlite" --checkpoint "$FLASHLITE_PARITY_CACHE/llama32_1b_random" \
  --tokenizer-dir "$FLASHLITE_MODELS/llama3-tokenizer" --out "$OUT/e2e.json" ${E2E_ARGS:-} 2>&1 | tee "$OUT/e2e.log" || status=1
exit "$status"
