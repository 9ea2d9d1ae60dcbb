#!/usr/bin/env bash
# Prepares .carry/ (git-ignored) for the GPU machine, which has no package registry: the Debian packages the build
# needs there and lacks (GoogleTest, CLI11, PCRE2; cpp-httplib for `flashlite serve`: Debian's is a header plus a shared
# library built with OpenSSL, zlib and Brotli, so their headers and Brotli's libraries come too), unpacked with dpkg -x.
# Name .carry in the device tool's carry list; scripts/gpu-check.sh points CMake at it.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && apt-get download -q libgtest-dev libgmock-dev googletest libcli11-dev libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3 \
  libcpp-httplib-dev libcpp-httplib0.11 libssl-dev libbrotli-dev libbrotli1 zlib1g-dev >/dev/null)
mkdir -p "$root/.carry/deps"
for deb in "$tmp"/*.deb; do dpkg -x "$deb" "$root/.carry/deps"; done
# The carry has a size limit: the static archives and docs of httplib's dependencies are never used (it links to the
# shared ones), so they stay behind.
rm -rf "$root/.carry/deps/usr/share/doc" "$root/.carry/deps/usr/share/man"
for lib in ssl crypto brotlicommon brotlidec brotlienc z; do rm -f "$root/.carry/deps/usr/lib/x86_64-linux-gnu/lib$lib.a"; done
echo "unpacked into $root/.carry/deps"
# The server's tests use the openai client, which the GPU machine's Python (3.12) lacks: wheels for pip --no-index.
py="$root/.venv/bin/python"; [ -x "$py" ] || py=python3
"$py" -m pip download -q openai -d "$root/.carry/wheels" --python-version 3.12 --only-binary=:all: \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64
echo "openai wheels in $root/.carry/wheels"
