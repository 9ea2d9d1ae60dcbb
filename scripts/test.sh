#!/usr/bin/env bash
# Install what is needed, build everything, and run every test: the C++ suites (ctest) and the Python suites (pytest).
# GPU tests skip cleanly when no GPU is present.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD_DIR:-$root/build}"
bash "$root/scripts/setup.sh"
BUILD_DIR="$build" bash "$root/scripts/build.sh"

echo "== C++ tests (ctest)"
(cd "$build" && ctest --output-on-failure -j "$(nproc)" --timeout 1200)

if [ -f "$root/pyproject.toml" ]; then
  echo "== Python module (CPU-only build unless CUDA is wanted)"
  python3 -m pip install -q --disable-pip-version-check --no-build-isolation \
    -Ccmake.define.FLASHLITE_CUDA="${PY_FLASHLITE_CUDA:-OFF}" "$root"
fi

echo "== Python tests (pytest)"
export FLASHLITE_BIN="$build/bin/flashlite"
status=0
python3 -m pytest -q "$root/tests" -p no:cacheprovider || status=$?
if [ "$status" -eq 5 ]; then
  echo "pytest: no Python tests collected"
  status=0
fi
exit "$status"
