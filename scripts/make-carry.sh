#!/usr/bin/env bash
# Prepares .carry/ (git-ignored) for the GPU machine, which has no package registry: the Debian packages the build
# needs there and lacks (GoogleTest, CLI11, PCRE2), unpacked with dpkg -x. Name .carry in the device tool's carry list;
# scripts/gpu-check.sh points CMake at it.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && apt-get download -q libgtest-dev libgmock-dev googletest libcli11-dev libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3 >/dev/null)
mkdir -p "$root/.carry/deps"
for deb in "$tmp"/*.deb; do dpkg -x "$deb" "$root/.carry/deps"; done
echo "unpacked into $root/.carry/deps"
