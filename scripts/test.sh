#!/usr/bin/env bash
# Install what is needed, build everything, and run every test: the C++ suites (ctest) and the Python suites (pytest,
# torch and transformers included). GPU tests skip cleanly when no GPU is present; everything else runs.
#
# It always configures build/ for the tests (whatever scripts/run.sh configured there before) and compiles the CUDA
# code when nvcc is found (FLASHLITE_CUDA=OFF skips it). The Python module is built CPU-only into .venv/
# (PY_FLASHLITE_CUDA=ON builds its CUDA backend too). It fails when ctest or pytest finds no test, and when a suite
# listed in tests/suites.txt did not run. In CI (CI=true, or FLASHLITE_STRICT=1) the tests that need
# ../shared/models fail instead of skipping when the models are absent.
#
# Time on a 2-core machine without a GPU: ~2 minutes for the Python environment (first run), ~8 minutes to build
# (most of it the CUDA kernels), ~4 minutes of tests.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD_DIR:-$root/build}"
venv="${FLASHLITE_VENV:-$root/.venv}"
python="$venv/bin/python"
export PATH="$PATH:/usr/local/cuda/bin"
t0=$SECONDS

bash "$root/scripts/setup.sh" --python

strict=0
if [ "${CI:-}" = true ] || [ "${FLASHLITE_STRICT:-0}" = 1 ]; then strict=1; fi
models="${FLASHLITE_MODELS:-$root/../shared/models}"
if [ "$strict" -eq 1 ]; then
  [ -d "$models" ] || { echo "test: strict mode and the models directory $models is absent" >&2; exit 1; }
  "$python" -c "import torch, transformers" \
    || { echo "test: strict mode and torch / transformers do not import in $venv" >&2; exit 1; }
  export FLASHLITE_REQUIRE_MODELS=1  # tests that would skip for missing model files fail instead
fi

echo "== build ($build)"
cmake -S "$root" -B "$build" -G Ninja -DFLASHLITE_BUILD_TESTS=ON -DFLASHLITE_BUILD_APPS=ON \
  -DFLASHLITE_BUILD_ENGINE=ON -DFLASHLITE_BUILD_BENCH=ON -DFLASHLITE_CUDA="${FLASHLITE_CUDA:-AUTO}" ${CMAKE_ARGS:-}
cmake --build "$build" -j "${JOBS:-$(nproc)}"
echo "== build done ($((SECONDS - t0)) s)"

reports="$build/test-reports"
rm -rf "$reports" && mkdir -p "$reports"
status=0

echo "== C++ tests (ctest)"
(cd "$build" && ctest --output-on-failure --no-tests=error -j "$(nproc)" --timeout 1200 \
   --output-junit "$reports/ctest.xml") || status=1
(cd "$build" && ctest --show-only=json-v1 > "$reports/ctest-list.json")

echo "== Python module into $venv (CUDA ${PY_FLASHLITE_CUDA:-OFF})"
"$python" -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps \
  -Ccmake.define.FLASHLITE_CUDA="${PY_FLASHLITE_CUDA:-OFF}" "$root"

echo "== Python tests (pytest)"
export FLASHLITE_BIN="$build/bin/flashlite" FLASHLITE_MODELS="$models"
pytest_status=0
"$python" -m pytest -q "$root/tests" --rootdir "$root" -p no:cacheprovider -o junit_family=xunit1 \
  --junitxml="$reports/pytest.xml" || pytest_status=$?
if [ "$pytest_status" -eq 5 ]; then echo "test: pytest collected no test" >&2; fi
[ "$pytest_status" -eq 0 ] || status=1

echo "== suites (tests/suites.txt)"
cuda_flag=()
"$build/bin/flashlite" info | grep -q "^cuda backends: not compiled" || cuda_flag=(--cuda)
"$python" "$root/scripts/check_suites.py" "$root/tests/suites.txt" "$reports/ctest-list.json" "$reports/pytest.xml" \
  "${cuda_flag[@]}" || status=1

echo "== test.sh: $([ $status -eq 0 ] && echo passed || echo FAILED) in $((SECONDS - t0)) s"
exit "$status"
