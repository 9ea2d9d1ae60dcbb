#!/usr/bin/env bash
# A/B of the causal block order (FLASHLITE_FWD_RANK_GROUP: rank-major within groups of N (sequence, head) pairs, so a
# group's K/V stays in L2; 0 = rank-major over the whole grid, the order before). One device call (~4 minutes):
# build, the Hopper grid with N = 3 (groups of 3, 3, ..., and a smaller last one: every block must still find its
# tile), then bench/fwd/side_by_side.py with N = 0, 8, 32 and 0 again (run-to-run spread).
#   run(command="bash bench/fwd/rank_group_ab.sh", carry=[".carry/deps"], timeout_s=400)
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
dest="${OUT:-$root/out}"
build=/tmp/build-rank-group
prefix="$root/.carry/deps/usr"
mkdir -p "$dest"
extra=()
[ -d "$prefix" ] && extra+=("-DCMAKE_PREFIX_PATH=$prefix" "-DGTest_DIR=$prefix/lib/x86_64-linux-gnu/cmake/GTest")
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DFLASHLITE_BUILD_APPS=OFF -DFLASHLITE_BUILD_ENGINE=OFF -DFLASHLITE_FWD_SWEEP=ON "${extra[@]}" > "$dest/cmake.log" 2>&1 ||
  { tail -20 "$dest/cmake.log"; exit 1; }
cmake --build "$build" -j"$(nproc)" --target flashlite_gpu_hopper_fwd_test flashlite_fwd_capi > "$dest/build.log" 2>&1 ||
  { grep -E "error|FAILED" -A3 "$dest/build.log" | head -40; exit 1; }
echo "built"
status=0
(cd "$build" && FLASHLITE_FWD_RANK_GROUP=3 timeout 120 ctest -R Hopper -j"$(nproc)" --timeout 45 > "$dest/ctest_group3.log" 2>&1) ||
  status=1
grep -E "tests passed|FAILED" "$dest/ctest_group3.log"
for n in 0 8 32 0b; do
  echo "== FLASHLITE_FWD_RANK_GROUP=$n"
  FLASHLITE_FWD_RANK_GROUP=${n%b} timeout 60 python3 "$root/bench/fwd/side_by_side.py" --lib "$build/lib/libflashlite_fwd_capi.so" \
    --rounds 3 --seqs 512,1024,2048,4096,8192,16384 --out "$dest/sbs_group$n.json" > "$dest/sbs_group$n.log" 2>&1 ||
    status=1
  grep causal "$dest/sbs_group$n.log"
done
exit "$status"
