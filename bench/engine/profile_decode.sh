#!/usr/bin/env bash
# Per-kernel GPU times of the engine's decode steps (batch 1, prompt 512) with Nsight Compute: every kernel of a short
# eager generate (FLASHLITE_ENGINE_GRAPH=0, so each launch is its own record), then the last two decode steps summed
# by kernel name. Usage: profile_decode.sh FLASHLITE_BIN CHECKPOINT_DIR TOKENIZER_DIR; writes $OUT/ncu_decode.{csv,txt}.
set -uo pipefail
bin="$1"; ckpt="$2"; OUT="${OUT:-/tmp/flashlite_engine_gpu}"
mkdir -p "$OUT"
[ -f "$ckpt/config.json" ] || python3 "$(dirname "$0")/../e2e.py" --flashlite "$bin" --checkpoint "$ckpt" \
  --tokenizer-dir "$3" --batches 1 --prompts 16 --new-tokens 2 --skip-transformers --out /tmp/e2e_warm.json > /dev/null
FLASHLITE_ENGINE_GRAPH=0 timeout 100 ncu --clock-control none --metrics gpu__time_duration.sum --csv \
  "$bin" generate --model "$ckpt" --device cuda --prompt-tokens 512 --batch 1 --max-tokens 3 --ignore-eos --json \
  > "$OUT/ncu_decode.csv" 2> "$OUT/ncu_decode.err" || { tail -20 "$OUT/ncu_decode.err"; exit 1; }
python3 - "$OUT/ncu_decode.csv" <<'PY' | tee "$OUT/ncu_decode.txt"
import csv, collections, re, sys
lines = open(sys.argv[1]).read().splitlines()
start = next(i for i, l in enumerate(lines) if l.startswith('"ID"'))
rows = [r for r in csv.DictReader(lines[start:]) if r["Metric Name"] == "gpu__time_duration.sum"]
scale = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3}
k = [(r["Kernel Name"], float(r["Metric Value"].replace(",", "")) * scale[r["Metric Unit"]]) for r in rows]
starts = [i for i, (n, _) in enumerate(k) if "embed_kernel" in n]  # each forward begins with the embedding
steps = k[starts[-2]:]  # the last two decode steps
total = collections.OrderedDict()
for n, us in steps:
    short = re.sub(r"\(anonymous namespace\)::|flashlite::engine::cuda_ops::|flashlite::", "", n)
    short = re.sub(r"\((?:[^()]|\([^()]*\))*\)$", "", short)  # the parameter list
    short = short.removeprefix("void ")[:100]
    c, t = total.get(short, (0, 0.0))
    total[short] = (c + 1, t + us)
print(f"{len(k)} kernels profiled; last 2 decode steps: {len(steps)} kernels, {sum(u for _, u in steps) / 2:.1f} us per step")
for n, (c, t) in sorted(total.items(), key=lambda kv: -kv[1][1]):
    print(f"{t / 2:9.1f} us/step  {c / 2:5.1f} launches/step  {n}")
PY
