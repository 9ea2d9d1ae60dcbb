#!/usr/bin/env bash
# CI's sanitizer + fuzz step (run by .ci/run after scripts/test.sh): builds the library, the engine's loaders and
# their tests with AddressSanitizer + UndefinedBehaviorSanitizer (CPU only, -O1) into build-asan/, then runs
#   - the API's bad-argument suites and the loader / tokenizer / model suites (every crafted-file regression case),
#   - the mutation fuzzers of the model files (safetensors, config.json, llama2.c), of the tokenizers
#     (tokenizer.json, tok*.bin) and of the server's request bodies, each test within FUZZ_SECONDS (default 20) of
#     wall time,
#   - the safetensors differential test (flashlite's parser vs the `safetensors` package) through the sanitized parser.
# Any sanitizer report aborts the process and fails the step. ~6 minutes on 2 cores (most of it the build).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${ASAN_BUILD_DIR:-$root/build-asan}"
python="${FLASHLITE_VENV:-$root/.venv}/bin/python"
fuzz_seconds="${FUZZ_SECONDS:-20}"
t0=$SECONDS

flags="-O1 -g -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DFLASHLITE_CUDA=OFF -DFLASHLITE_BUILD_TESTS=ON \
  -DFLASHLITE_BUILD_ENGINE=ON -DFLASHLITE_BUILD_APPS=OFF -DFLASHLITE_BUILD_BENCH=OFF \
  -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" > /tmp/flashlite-asan-configure.log 2>&1 \
  || { cat /tmp/flashlite-asan-configure.log >&2; exit 1; }
suites=(validation_test kv_errors_test prefill_errors_test engine_loader_hardening_test engine_fuzz_loaders_test
        engine_tokenizer_fuzz_test engine_hf_checkpoint_test engine_llama2c_model_test engine_chat_template_test
        serve_request_fuzz_test)
cmake --build "$build" -j "${JOBS:-$(nproc)}" --target "${suites[@]/#/flashlite_}" flashlite_safetensors_check
echo "== sanitize: built in $((SECONDS - t0)) s"

export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export FLASHLITE_TOKENIZER_FUZZ_SECONDS="$fuzz_seconds" FLASHLITE_TOKENIZER_FUZZ_ITERATIONS=1000000
export FLASHLITE_REQUEST_FUZZ_SECONDS="$fuzz_seconds" FLASHLITE_REQUEST_FUZZ_ITERATIONS=1000000
status=0
for s in "${suites[@]}"; do
  exe="$(find "$build/tests" -name "flashlite_$s" -type f | head -1)"
  [ -x "$exe" ] || { echo "sanitize: flashlite_$s was not built" >&2; status=1; continue; }
  t1=$SECONDS
  if "$exe" --gtest_brief=1 > "$build/$s.log" 2>&1; then
    echo "sanitize: $s ok ($(grep -Eo '[0-9]+ tests?' "$build/$s.log" | tail -1), $((SECONDS - t1)) s)"
  else
    echo "sanitize: $s FAILED" >&2; tail -40 "$build/$s.log" >&2; status=1
  fi
done

t1=$SECONDS
if FLASHLITE_ST_CHECK="$build/bin/flashlite_safetensors_check" FLASHLITE_DIFF_CASES="${DIFF_CASES:-400}" \
   "$python" -m pytest -q -p no:cacheprovider "$root/tests/engine/test_safetensors_diff.py" > "$build/st_diff.log" 2>&1; then
  echo "sanitize: safetensors differential ok ($(tail -1 "$build/st_diff.log"), $((SECONDS - t1)) s)"
else
  echo "sanitize: safetensors differential FAILED" >&2; tail -40 "$build/st_diff.log" >&2; status=1
fi
echo "== sanitize: $([ $status -eq 0 ] && echo passed || echo FAILED) in $((SECONDS - t0)) s"
exit "$status"
