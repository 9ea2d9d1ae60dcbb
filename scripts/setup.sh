#!/usr/bin/env bash
# Installs what flashlite needs on a fresh Debian machine (idempotent; a second run takes a second).
#
#   bash scripts/setup.sh            # Debian packages only (compilers, CMake, GoogleTest, CLI11, json, PCRE2, OpenMP):
#                                    #   enough to build the library, the engine and the CLI
#   bash scripts/setup.sh --python   # also the project's Python environment for the tests and the Python package
#
# Debian packages come from scripts/apt-packages.txt (apt-get, as root or through sudo). Python packages
# (scripts/requirements.txt: numpy, pytest, torch, transformers, ...) go into a virtual environment, by default
# .venv/ in the repository (FLASHLITE_VENV overrides it), so Debian's externally-managed python3 (PEP 668) is never
# touched; the environment is created with $PYTHON (default python3). The first --python run downloads torch from PyPI
# (about 2.5 GB of wheels, 5.6 GB installed, ~2 minutes here); later runs skip pip while requirements.txt is unchanged.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
with_python=0
for arg in "$@"; do
  case "$arg" in
    --python) with_python=1 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "setup: unknown argument '$arg' (expected --python)" >&2; exit 2 ;;
  esac
done

read_list() { sed 's/#.*//' "$1" | awk 'NF { print $1 }' ; }

apt_missing=()
while read -r pkg; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || apt_missing+=("$pkg")
done < <(read_list "$here/apt-packages.txt")
if [ ${#apt_missing[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${apt_missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${apt_missing[@]}"
fi

if [ "$with_python" -eq 1 ]; then
  venv="${FLASHLITE_VENV:-$root/.venv}"
  python="${PYTHON:-python3}"
  if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
    echo "setup: creating the Python environment $venv (from $("$python" -c 'import sys; print(sys.executable)'))"
    rm -rf "$venv"
    "$python" -m venv "$venv"
  fi
  stamp="$venv/.flashlite-requirements"
  want="$(sha256sum "$here/requirements.txt" | cut -d' ' -f1)"
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    mapfile -t py_pkgs < <(read_list "$here/requirements.txt")
    echo "setup: installing Python packages into $venv: ${py_pkgs[*]}"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check "${py_pkgs[@]}"
    echo "$want" > "$stamp"
  fi
  echo "setup: ok (Python environment: $venv)"
else
  echo "setup: ok"
fi
