#!/usr/bin/env bash
# The one command for a GPU machine: builds everything for the GPU it finds (sm_90a on Hopper) plus the Python module
# (pip, into a target folder), runs every ctest suite (the GPU tests run for real there), the main job (`flashlite
# attn`) on a few shapes, pytest tests/python (GPU backends vs float64 and torch SDPA, torch.compile, CUDA graphs),
# the server's tests (tests/serve, with the openai client from .carry/wheels) and its load benchmark, compute-sanitizer (memcheck, racecheck,
# initcheck) on a small driver, a few Hopper forward and backward cases, the attention benchmark and the forward
# (bench/fwd: C API, torch op, host cost) and backward (bench/bwd) side by side. Results go to
# OUTDIR (argument, else $OUT, else ./out): attn_main_job.json, attention.json and plots, fwd_side_by_side.json,
# fwd_side_by_side_op.json, host_cost.json, bwd_side_by_side.json,
# (servebench) serve_load.json / .png and serve_engine_baseline.json, (tp) tp*_logits.json and (tpbench) e2e_tp*.json
# as files, every log bundled
# into gpu_check_logs.tgz (a GPU lease returns at most 8 files). The per-area benchmarks (forward side by side,
# decode, engine e2e, CPU) are described in bench/README.md.
#
#   bash scripts/gpu-check.sh [OUTDIR] [--only STEP[,STEP...]] [--skip STEP[,STEP...]]
#   steps, in order: info build ctest attn pytest serve servebench sanitize bench fwdbench bwdbench tp tpbench
#   (tp, tpbench: tensor parallelism on a machine of 2+ GPUs, e.g. `--only build,tp` then `--only tpbench` on
#   nvidia-h100-x2; nothing on one GPU)
#
# Environment: COMMIT (the commit id the results record; give it on the device machine, whose copy of .git is the
# session's first state), BENCH_ARGS (for bench/attention.py,
# default --quick), BWD_SEQS (bwdbench's sequence lengths), CMAKE_EXTRA (more CMake arguments), BUILD_TARGETS (default: all), CTEST_ARGS (e.g. "-L gpu"),
# PYTEST_ARGS, BUILD_DIR, CUDA_ARCH.
# The GPU machine has no package registry: GoogleTest, CLI11 and PCRE2 come from .carry/ (made here by
# scripts/make-carry.sh; name .carry in the device tool's carry list); torch, nanobind and scikit-build-core are there.
# A failing step is reported and the script goes on; the exit status is 1 if any step failed.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="${OUT:-$root/out}"
only="" skip=""
while [ $# -gt 0 ]; do
  case "$1" in
    --only) only="$2"; shift 2 ;;
    --skip) skip="$2"; shift 2 ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    *) dest="$1"; shift ;;
  esac
done
mkdir -p "$dest"
dest="$(cd "$dest" && pwd)"
logs="$(mktemp -d /tmp/gpu_check.XXXX)"
build="${BUILD_DIR:-$root/build-gpu}"
pysite="$build/pysite"  # the Python module is installed here (pip --target); PYTHONPATH points at it
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
commit="${COMMIT:-$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)}"
[ -z "${COMMIT:-}" ] && echo "gpu-check: COMMIT is not set; the results record $commit from this tree's .git" >&2
export FLASHLITE_COMMIT="$commit"  # what the bench scripts record (bench/tree_commit.py)
failed=()

want() { [[ -z "$only" || ",$only," == *",$1,"* ]] && [[ ",$skip," != *",$1,"* ]]; }
pack() { tar czf "$dest/gpu_check_logs.tgz" -C "$logs" . 2>/dev/null; }
say() { echo "== $(date +%T) $*" | tee -a "$logs/summary.txt"; }
step() {  # step NAME: runs step_NAME, times it, records failure
  want "$1" || return 0
  local t0=$SECONDS
  say "$1"
  if "step_$1"; then say "$1 ok ($((SECONDS - t0)) s)"; else say "$1 FAILED ($((SECONDS - t0)) s)"; failed+=("$1"); fi
  pack
}

gpu_arch() {  # compute capability 9.0 -> 90a (Hopper-only instructions), 8.6 -> 86
  local cc
  cc="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')"
  [ -z "$cc" ] && { echo 90a; return; }
  [ "$cc" = 90 ] && echo 90a || echo "$cc"
}
arch="${CUDA_ARCH:-$(gpu_arch)}"

step_info() {
  {
    echo "commit: $commit"
    nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total,clocks.max.sm --format=csv
    nvcc --version | tail -2
    python3 -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version())"
    python3 -c "import nanobind, scikit_build_core; print('nanobind', nanobind.__version__, 'scikit-build-core', scikit_build_core.__version__)"
    echo "cuda arch: $arch, cores: $(nproc)"
  } 2>&1 | tee "$logs/info.txt"
}

step_build() {
  local extra=(-DCMAKE_CUDA_ARCHITECTURES="$arch") prefixes=""
  [ -d "$root/.carry/deps/usr" ] && prefixes="$root/.carry/deps/usr"
  [ -d "$root/.carry/gtest/usr" ] && prefixes="${prefixes:+$prefixes;}$root/.carry/gtest/usr"
  [ -n "$prefixes" ] && extra+=("-DCMAKE_PREFIX_PATH=$prefixes")
  # The Python module builds at the same time as the C++ tree (both use every core; the CUDA files dominate).
  (python3 -m pip install --no-build-isolation --no-deps --no-compile --target "$pysite" --upgrade \
     -Cbuild-dir="$build/py" -Ccmake.define.CMAKE_CUDA_ARCHITECTURES="$arch" "$root" > "$logs/pip_build.log" 2>&1
   echo $? > "$logs/pip_build.rc") &
  local pip_pid=$!
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${extra[@]}" ${CMAKE_EXTRA:-} > "$logs/cmake.log" 2>&1 \
    && cmake --build "$build" -j"$(nproc)" ${BUILD_TARGETS:+--target $BUILD_TARGETS} > "$logs/build.log" 2>&1
  local rc=$?
  wait "$pip_pid"
  [ $rc -ne 0 ] && grep -E "error|FAILED" -A3 "$logs/build.log" "$logs/cmake.log" | head -40
  [ "$(cat "$logs/pip_build.rc")" != 0 ] && { tail -30 "$logs/pip_build.log"; rc=1; }
  return $rc
}

step_ctest() {
  # shellcheck disable=SC2086
  (cd "$build" && ctest -j8 --timeout 900 --output-on-failure ${CTEST_ARGS:-} > "$logs/ctest.log" 2>&1)
  local rc=$?
  grep -q "No tests were found" "$logs/ctest.log" && { echo "ctest found no tests (did the build fail?)"; rc=1; }
  grep -E "tests passed|tests failed|Total Test time" "$logs/ctest.log"
  grep -E "\(Failed\)|\(Timeout\)|\*\*\*Exception" "$logs/ctest.log" | head -20
  return $rc
}

step_attn() {  # the main job on a few shapes, checked against the float64 reference, as JSON
  local bin="$build/bin/flashlite" first=1 rc=0
  [ -x "$bin" ] || { echo "no $bin (apps not built)"; return 1; }
  "$bin" info > "$logs/flashlite_info.txt" 2>&1
  {
    echo "["
    while read -r args; do
      [ $first -eq 1 ] || echo ","
      first=0
      # shellcheck disable=SC2086
      "$bin" attn $args --json || { echo '{"failed": "'"$args"'"}'; }
    done <<'CASES'
--batch 1 --heads 8 --seq-q 1024
--batch 4 --heads 16 --seq-q 4096 --head-dim 128 --causal --no-check --repeat 20
--batch 2 --heads 32 --kv-heads 8 --seq-q 2048 --head-dim 128 --causal --repeat 20
--batch 1 --heads 8 --seq-q 4096 --head-dim 128 --window 1024,0 --sink-tokens 4 --sink-logits --repeat 20
--batch 3 --heads 8 --kv-heads 2 --seq-q 700 --seq-k 900 --varlen --causal --dtype f16
--batch 1 --heads 8 --seq-q 512 --dtype f32 --causal
--batch 2 --heads 8 --kv-heads 2 --seq-q 1024 --head-dim 128 --causal --dtype bf16 --backend naive --repeat 5
CASES
    echo "]"
  } > "$dest/attn_main_job.json" 2> "$logs/attn.err"
  python3 - "$dest/attn_main_job.json" <<'PY' | tee "$logs/attn_summary.txt" || rc=1
import json, sys
bad = 0
for r in json.load(open(sys.argv[1])):
    if "failed" in r:
        bad += 1
        print("FAILED", r["failed"])
        continue
    ok = r.get("passed") or not r.get("checked")
    bad += not ok
    print("%-5s %-34s b%d h%d/%d sq%d sk%d d%d %9.3f ms %7.1f TFLOP/s  %s" % (
        r["dtype"], r["kernel"], r["batch"], r["heads"], r["kv_heads"], r["seq_q"], r["seq_k"], r["head_dim"],
        r["median_ms"], r["gflops_per_s"] / 1e3,
        ("rel %.2e PASS" % r["rel_err"]) if r.get("passed") else ("unchecked" if not r.get("checked") else "FAIL")))
sys.exit(1 if bad else 0)
PY
  return $rc
}

pyenv() { PYTHONPATH="$pysite${PYTHONPATH:+:$PYTHONPATH}" "$@"; }

step_pytest() {
  local par=()
  python3 -c "import xdist" 2>/dev/null && par=(-n 4)
  pyenv python3 -m pytest -q -rs -p no:cacheprovider "${par[@]}" "$root/tests/python" ${PYTEST_ARGS:-} \
    --junitxml="$logs/pytest.xml" > "$logs/pytest.log" 2>&1
  local rc=$?
  tail -25 "$logs/pytest.log"
  return $rc
}

step_serve() {  # the server's tests against this build (tests/serve: the CPU ones and the CUDA ones), openai from .carry
  local wheels="$root/.carry/wheels" oa="$build/openai_site"
  if ! python3 -c "import openai" 2>/dev/null; then
    [ -d "$wheels" ] || { echo "no openai package and no $wheels (scripts/make-carry.sh makes it)"; return 1; }
    python3 -m pip install -q --no-index --find-links "$wheels" --target "$oa" openai > "$logs/openai_pip.log" 2>&1 ||
      { tail -5 "$logs/openai_pip.log"; return 1; }
  fi
  FLASHLITE_BIN="$build/bin/flashlite" PYTHONPATH="$oa${PYTHONPATH:+:$PYTHONPATH}" python3 -m pytest -q -rs \
    -p no:cacheprovider "$root/tests/serve" --junitxml="$logs/serve.xml" > "$logs/serve.log" 2>&1
  local rc=$?
  tail -15 "$logs/serve.log"
  return $rc
}

step_servebench() {  # the server under load (bench/serve/load.py) beside the engine's static batches (bench/e2e.py, the
  # decode step they are measured against), on the same Llama-3.2-1B-shaped bf16 checkpoint
  local ckpt=/tmp/flashlite_llama32_1b_random rc=0
  pyenv python3 "$root/bench/e2e.py" --flashlite "$build/bin/flashlite" --shape llama32-1b --checkpoint "$ckpt" \
    --batches 1,64 --prompts 64 --new-tokens 128 --repeats 1 --skip-transformers --out "$dest/serve_engine_baseline.json" \
    > "$logs/serve_e2e.log" 2>&1 || rc=1
  tail -2 "$logs/serve_e2e.log"
  pyenv python3 "$root/bench/serve/load.py" --model "$ckpt" --flashlite "$build/bin/flashlite" --device cuda \
    --max-batch 64 --concurrency 1,16,64 --rates 16,64 --out "$dest/serve_load.json" \
    --plot "$dest/serve_load.png" > "$logs/serve_load.log" 2>&1 || rc=1
  tail -8 "$logs/serve_load.log"
  # 64 clients in steady state: 1,024 requests, so that the ramp and the drain weigh little
  pyenv python3 "$root/bench/serve/load.py" --model "$ckpt" --flashlite "$build/bin/flashlite" --device cuda \
    --max-batch 64 --concurrency 64 --requests 1024 --out "$dest/serve_load_long.json" > "$logs/serve_load_long.log" 2>&1 ||
    rc=1
  tail -2 "$logs/serve_load_long.log"
  return $rc
}

step_sanitize() {
  local rc=0 tool
  for tool in memcheck racecheck initcheck; do
    pyenv compute-sanitizer --tool "$tool" --error-exitcode 3 python3 "$root/tests/python/sanitize_driver.py" \
      > "$logs/sanitize_$tool.log" 2>&1
    local r=$?
    echo "$tool rc=$r: $(grep -hE 'ERROR SUMMARY|RACECHECK SUMMARY|cases passed|skipped' "$logs/sanitize_$tool.log" | tr '\n' ' ')"
    [ $r -ne 0 ] && { rc=1; grep -m5 -E "Invalid|Race|Uninitialized|Error" "$logs/sanitize_$tool.log"; }
    # The Hopper forward on a few cases of more work tiles than SMs, as planned and with 3 CTAs walking every tile.
    for few in "" --few-ctas; do
      compute-sanitizer --tool "$tool" --error-exitcode 3 "$build/tests/gpu/flashlite_gpu_hopper_fwd_test" $few \
        --gtest_filter='Cuda/HopperGrid.*bf16_d64_b4_h12x4_q520_causal_win*:Cuda/HopperGrid.*bf16_d128_q1000_k17*:Cuda/HopperGrid.*f16_d64_varlen_causal' \
        > "$logs/sanitize_hopper_fwd_$tool$few.log" 2>&1
      r=$?
      echo "$tool (Hopper forward $few) rc=$r: $(grep -hE 'ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED' "$logs/sanitize_hopper_fwd_$tool$few.log" | tr '\n' ' ')"
      [ $r -ne 0 ] && { rc=1; grep -m5 -E "Invalid|Race|Uninitialized|Error" "$logs/sanitize_hopper_fwd_$tool$few.log"; }
    done
    # The backward suite on a few small cases (the Hopper kernels where the GPU has them).
    compute-sanitizer --tool "$tool" --error-exitcode 3 "$build/tests/gpu/flashlite_gpu_backward_test" \
      --gtest_filter='Grid/*/bf16_seq130_causal:Grid/*/f16_d64_gqa4_batch2_causal:Grid/*/bf16_d128_seq1025_causal_sinklogits' \
      > "$logs/sanitize_bwd_$tool.log" 2>&1
    r=$?
    echo "$tool (backward) rc=$r: $(grep -hE 'ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED' "$logs/sanitize_bwd_$tool.log" | tr '\n' ' ')"
    [ $r -ne 0 ] && { rc=1; grep -m5 -E "Invalid|Race|Uninitialized|Error" "$logs/sanitize_bwd_$tool.log"; }
  done
  return $rc
}

step_fwdbench() {  # the forward side by side with torch SDPA (flash, cuDNN): through the C API, then the torch op
  local rc=0
  pyenv python3 "$root/bench/fwd/side_by_side.py" --lib "$build/lib/libflashlite_fwd_capi.so" \
    --out "$dest/fwd_side_by_side.json" > "$logs/fwdbench.log" 2>&1 || rc=1
  pyenv python3 "$root/bench/fwd/side_by_side.py" --lib "$build/lib/libflashlite_fwd_capi.so" --torch-op \
    --out "$dest/fwd_side_by_side_op.json" > "$logs/fwdbench_op.log" 2>&1 || rc=1
  pyenv python3 "$root/bench/fwd/host_cost.py" --out "$dest/host_cost.json" > "$logs/host_cost.log" 2>&1 || rc=1
  tail -n 25 "$logs/fwdbench.log" "$logs/fwdbench_op.log" "$logs/host_cost.log"  # (-25 is refused for several files)
  return $rc
}

step_bwdbench() {  # the backward side by side with torch (SDPA flash, cuDNN, FlexAttention), and each CUDA family forced
  pyenv python3 "$root/bench/bwd/side_by_side.py" --lib "$build/lib/libflashlite_bwd_capi.so" \
    --seqs "${BWD_SEQS:-1024,2048,4096,8192,16384}" --rounds 2 --out "$dest/bwd_side_by_side.json" \
    > "$logs/bwdbench.log" 2>&1
  local rc=$?
  tail -25 "$logs/bwdbench.log"
  return $rc
}

tp_gpus() {  # prints the GPU count; fails (nothing to run) below 2
  local gpus
  gpus="$(nvidia-smi -L 2>/dev/null | wc -l)"
  echo "$gpus"
  [ "$gpus" -ge 2 ]
}
tp_ckpt=/tmp/flashlite_llama3_8b_random  # the 8B-shaped checkpoint (16 GB, written once by bench/e2e.py)

step_tp() {  # 2+ GPUs: the NCCL tests, then TP 2 (and 4) against TP 1 on the 8B-shaped checkpoint
  local gpus rc=0
  gpus="$(tp_gpus)" || { echo "$gpus GPU(s): tensor parallelism needs 2 (its CPU tests ran in ctest)"; return 0; }
  "$build/tests/engine/flashlite_engine_one_shot_test" > "$logs/one_shot_test.log" 2>&1 || rc=1
  grep -E "PASSED|FAILED|SKIPPED" "$logs/one_shot_test.log" | head -6
  "$build/tests/engine/flashlite_engine_tensor_parallel_test" > "$logs/tp_test.log" 2>&1 || rc=1
  grep -E "^tp |PASSED|FAILED|SKIPPED" "$logs/tp_test.log" | head -12
  pyenv python3 -c "import sys; sys.path.insert(0, '$root/bench'); import e2e; e2e.make_checkpoint('$tp_ckpt', e2e.default_tokenizer_dir(), 'llama3-8b')" \
    > "$logs/tp_ckpt.log" 2>&1 || { tail -5 "$logs/tp_ckpt.log"; return 1; }
  FLASHLITE_BIN="$build/bin/flashlite" FLASHLITE_TP_CHECKPOINT="$tp_ckpt" FLASHLITE_TP_OUT="$dest" \
    pyenv python3 -m pytest -q -rs -s -p no:cacheprovider \
    "$root/tests/engine/test_engine_tp_gpu.py" > "$logs/tp_pytest.log" 2>&1 || rc=1
  tail -5 "$logs/tp_pytest.log"
  return $rc
}

step_tpbench() {  # 2+ GPUs: bench/e2e.py on the 8B shape, TP 1, 2 (and 4): batch 1 and 16 at prompt 512 (TP > 1 also
  # with --nccl-only), then TTFT at prompt 4096; and the 1B shape
  local gpus tps=1,2 rc=0
  gpus="$(tp_gpus)" || { echo "$gpus GPU(s): nothing to run"; return 0; }
  [ "$gpus" -ge 4 ] && tps=1,2,4
  pyenv python3 "$root/bench/e2e.py" --flashlite "$build/bin/flashlite" --shape llama3-8b --checkpoint "$tp_ckpt" \
    --tp "$tps" --batches 1,16 --prompts 512 --repeats 1 --skip-transformers --nccl-compare \
    --out "$dest/e2e_tp.json" > "$logs/e2e_tp.log" 2>&1 || rc=1
  tail -3 "$logs/e2e_tp.log"
  pyenv python3 "$root/bench/e2e.py" --flashlite "$build/bin/flashlite" --shape llama3-8b --checkpoint "$tp_ckpt" \
    --tp "$tps" --batches 1 --prompts 4096 --new-tokens 16 --repeats 1 --skip-transformers \
    --out "$dest/e2e_tp_prompt4096.json" > "$logs/e2e_tp_4096.log" 2>&1 || rc=1
  tail -3 "$logs/e2e_tp_4096.log"
  # The Llama-3.2-1B shape: where TP stops paying (2.5 GB of weights per step).
  pyenv python3 "$root/bench/e2e.py" --flashlite "$build/bin/flashlite" --shape llama32-1b --tp "$tps" \
    --batches 1,16 --prompts 512 --repeats 1 --skip-transformers --out "$dest/e2e_tp_1b.json" \
    > "$logs/e2e_tp_1b.log" 2>&1 || rc=1
  tail -3 "$logs/e2e_tp_1b.log"
  return $rc
}

step_bench() {
  pyenv python3 "$root/bench/attention.py" --commit "$commit" --out "$dest/attention.json" \
    --plots "$dest" ${BENCH_ARGS:---quick} 2>&1 | tee "$logs/bench.log" | tail -60
}

for s in info build ctest attn pytest serve servebench sanitize bench fwdbench bwdbench tp tpbench; do step "$s"; done
say "done; failed steps: ${failed[*]:-none}"
pack
[ ${#failed[@]} -eq 0 ]
