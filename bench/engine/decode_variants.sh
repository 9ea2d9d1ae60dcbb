#!/usr/bin/env bash
# Decode-step time of the engine CLI under each engine switch (environment variables), batch 1 and 4 at prompt 512,
# 128 greedy tokens, one process per setting: for choosing defaults. Usage: decode_variants.sh FLASHLITE_BIN CHECKPOINT
set -uo pipefail
bin="$1"; ckpt="$2"
for b in 1 4; do
  for v in "" "FLASHLITE_ENGINE_PDL=0" "FLASHLITE_ENGINE_PREFETCH=0" "FLASHLITE_ENGINE_PREFETCH=32" \
           "FLASHLITE_ENGINE_GEMV=0"; do
    ms=$(env $v "$bin" generate --model "$ckpt" --device cuda --prompt-tokens 512 --batch "$b" --max-tokens 128 \
         --ignore-eos --warmup 1 --json 2>/dev/null | python3 -c 'import json,sys; print("%.4f" % json.load(sys.stdin)["stats"]["mean_tbt_ms"])')
    echo "batch $b ${v:-default}: ${ms:-failed} ms/step"
  done
done
