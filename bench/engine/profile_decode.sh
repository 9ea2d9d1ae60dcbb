#!/usr/bin/env bash
# Per-kernel GPU times of ONE engine decode step (batch 1, prompt 512) with Nsight Compute: the engine's range mode
# (FLASHLITE_ENGINE_PROFILE=range) runs its 8th decode step eagerly between cudaProfilerStart/Stop, and ncu
# (--profile-from-start off) records only the ~100 kernels of that step: duration and DRAM bytes read per kernel,
# no clock or cache control (the step as it runs, less PDL overlap: ncu serializes kernels).
# Usage: profile_decode.sh FLASHLITE_BIN CHECKPOINT_DIR TOKENIZER_DIR [LABEL]; the engine's environment passes
# through (variant switches). Writes $LOGDIR/ncu_LABEL.{csv,err} and prints the per-kernel table on stdout.
# (Round 2's version profiled every kernel of a whole generate under a 100 s timeout and died without a log.)
set -uo pipefail
bin="$1"; ckpt="$2"; tok="$3"; label="${4:-default}"
LOGDIR="${LOGDIR:-${OUT:-/tmp/flashlite_engine_gpu}}"
mkdir -p "$LOGDIR"
[ -f "$ckpt/config.json" ] || python3 "$(dirname "$0")/../e2e.py" --flashlite "$bin" --checkpoint "$ckpt" \
  --tokenizer-dir "$tok" --batches 1 --prompts 16 --new-tokens 2 --skip-transformers --out /tmp/e2e_warm.json > /dev/null
command -v ncu > /dev/null || { echo "profile_decode: no ncu on the PATH"; exit 1; }
FLASHLITE_ENGINE_PROFILE=range timeout "${NCU_TIMEOUT:-150}" ncu --profile-from-start off --clock-control none \
  --cache-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv \
  "$bin" generate --model "$ckpt" --device cuda --prompt-tokens 512 --batch 1 --max-tokens 12 --ignore-eos --json \
  > "$LOGDIR/ncu_$label.csv" 2> "$LOGDIR/ncu_$label.err"
rc=$?
[ $rc -eq 0 ] || { echo "profile_decode ($label): ncu exited $rc"; tail -20 "$LOGDIR/ncu_$label.err"; grep -m5 "==ERROR==\|==WARNING==" "$LOGDIR/ncu_$label.csv"; exit 1; }
python3 - "$LOGDIR/ncu_$label.csv" "$label" <<'PY'
import csv, collections, re, sys
lines = open(sys.argv[1]).read().splitlines()
start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
if start is None:
    sys.exit(f"profile_decode: no kernel records in {sys.argv[1]}")
recs = collections.OrderedDict()  # (ID, kernel) -> {metric: value}
for r in csv.DictReader(lines[start:]):
    v = float(r["Metric Value"].replace(",", ""))
    unit = r["Metric Unit"]
    v *= {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6, "ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6,
          "byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9,
          "KiB": 1024, "MiB": 1 << 20, "GiB": 1 << 30}.get(unit, 1.0)
    recs.setdefault((r["ID"], r["Kernel Name"]), {})[r["Metric Name"]] = v
total = collections.OrderedDict()
step_us = step_bytes = 0.0
for (_, name), m in recs.items():
    short = re.sub(r"\(anonymous namespace\)::|flashlite::engine::cuda_ops::|flashlite::", "", name)
    short = re.sub(r"\((?:[^()]|\([^()]*\))*\)$", "", short).removeprefix("void ")[:90]
    us, by = m.get("gpu__time_duration.sum", 0.0), m.get("dram__bytes_read.sum", 0.0)
    step_us += us
    step_bytes += by
    c, t, b = total.get(short, (0, 0.0, 0.0))
    total[short] = (c + 1, t + us, b + by)
print(f"ncu, one eager decode step ({sys.argv[2]}): {len(recs)} kernels, {step_us:.1f} us of kernel time "
      f"(serialized, no PDL overlap), {step_bytes / 1e6:.1f} MB read from DRAM ({step_bytes / step_us / 1e3:.0f} GB/s)")
for n, (c, t, b) in sorted(total.items(), key=lambda kv: -kv[1][1]):
    print(f"{t:9.1f} us {c:4d} launches {t / c:8.2f} us each {b / 1e6:8.1f} MB {b / t / 1e3 if t else 0:7.0f} GB/s  {n}")
PY
