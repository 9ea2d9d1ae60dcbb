#!/usr/bin/env bash
# Installs everything the build and the tests need on a fresh Debian machine (idempotent).
# Debian packages from scripts/apt-packages.txt, Python packages from scripts/requirements.txt.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

read_list() { grep -v '^\s*#' "$1" | sed 's/#.*//' | awk 'NF' ; }

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

python="${PYTHON:-python3}"
if ! "$python" -m pip --version >/dev/null 2>&1; then
  echo "setup: pip is missing for $python" >&2
  exit 1
fi
mapfile -t py_pkgs < <(read_list "$here/requirements.txt")
if [ ${#py_pkgs[@]} -gt 0 ]; then
  if ! "$python" - "${py_pkgs[@]}" <<'PY' 2>/dev/null
import sys, importlib.metadata as md, re
for req in sys.argv[1:]:
    name = re.split(r"[<>=!~\[ ;]", req, 1)[0]
    md.version(name)
PY
  then
    echo "setup: installing Python packages: ${py_pkgs[*]}"
    "$python" -m pip install -q --disable-pip-version-check "${py_pkgs[@]}"
  fi
fi
echo "setup: ok"
