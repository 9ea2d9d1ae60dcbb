#!/usr/bin/env bash
# Static checks of the engine's CUDA kernels, no GPU needed: each engine/cuda_ops/*.cu compiled for sm_80 and sm_90a
# with -Wall -Wextra and `-Xptxas -v`; prints registers, stack and spills per kernel and fails on any warning or spill.
# Usage: bench/engine/static_check.sh [ARCH ...] (default: 80 90a). Needs nvcc (PATH or /usr/local/cuda/bin).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
export PATH="$PATH:/usr/local/cuda/bin"
archs=("$@"); [ ${#archs[@]} -eq 0 ] && archs=(80 90a)
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
status=0
for src in "$root"/engine/cuda_ops/*.cu; do
  for a in "${archs[@]}"; do
    log="$tmp/$(basename "$src" .cu)_$a.log"
    nvcc -DFLASHLITE_ENGINE_CUDA=1 -DFLASHLITE_WITH_CUDA=1 -I"$root" -I"$root/include" -O3 -std=c++20 -lineinfo \
      --generate-code=arch=compute_$a,code=sm_$a -Xptxas -v -Xcompiler=-Wall,-Wextra -c "$src" -o "$tmp/out.o" \
      > "$log" 2>&1 || { echo "FAILED: $src sm_$a"; cat "$log"; status=1; continue; }
    grep -i "warning" "$log" && status=1
  done
done
python3 - "$tmp"/*.log <<'PY' || status=1
import re, subprocess, sys
bad = 0
for f in sys.argv[1:]:
    fn = stack = None
    for l in open(f):
        m = re.search(r"Compiling entry function '(\S+)'", l)
        if m:
            fn = subprocess.run(["c++filt", m.group(1)], capture_output=True, text=True).stdout.strip()
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", l)
        if m and fn:
            stack = tuple(map(int, m.groups()))
        m = re.search(r"Used (\d+) registers", l)
        if m and fn:
            short = re.sub(r"flashlite::engine::cuda_ops::|\(anonymous namespace\)::|void ", "", fn)[:90]
            s = stack or (0, 0, 0)
            bad += s[1] + s[2] > 0
            print(f"{f.rsplit('/', 1)[-1][:-4]:12s} regs {m.group(1):>3s} stack {s[0]:>3d} spill {s[1]}/{s[2]}  {short}")
            fn = stack = None
print(f"{bad} kernels spill" if bad else "no spills")
sys.exit(1 if bad else 0)
PY
exit "$status"
