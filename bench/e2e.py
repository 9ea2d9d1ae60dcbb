#!/usr/bin/env python3
"""GPU end-to-end generation benchmark: the flashlite engine side by side with Hugging Face transformers (sdpa,
static cache) on the same random Llama-3.2-1B-shaped bf16 checkpoint. Batch 1 and 16; prompt 512 and 4096; 128 new
tokens. Reports TTFT, time between tokens, decode tok/s (all sequences), achieved weight bandwidth (bf16 weight bytes
read per decode step / step time) against the device's measured copy bandwidth, and peak memory.

Run on the GPU machine after building flashlite with CUDA:
  python3 bench/e2e.py --flashlite build/bin/flashlite --out $OUT/e2e.json
The checkpoint is written once to --checkpoint (default /tmp/flashlite_<shape>_random) with the Llama 3 tokenizer
files from ../shared/models/llama3-tokenizer (or --tokenizer-dir) beside it.

Tensor parallelism (docs/parallel.md), on a machine with several GPUs: --tp 1,2 runs the engine at each degree on the
same checkpoint (no transformers row for TP > 1); --shape llama3-8b is the Llama-3-8B shape (16 GB of bf16 weights,
written once, about a minute). Each row then carries the all-reduce time per step from a --profile run.
"""
import argparse
import itertools
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

import torch
import transformers

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from tree_commit import tree_commit  # noqa: E402

LLAMA32_1B = dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                  num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=131072,
                  rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=True, bos_token_id=128000,
                  eos_token_id=[128001, 128008, 128009],
                  rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                "original_max_position_embeddings": 8192})
# Llama 3 8B: the same vocabulary, heads and RoPE rule; wider, deeper, untied, RoPE factor 8.
LLAMA3_8B = dict(LLAMA32_1B, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, head_dim=128,
                 tie_word_embeddings=False, rope_scaling=dict(LLAMA32_1B["rope_scaling"], factor=8.0))
SHAPES = {"llama32-1b": LLAMA32_1B, "llama3-8b": LLAMA3_8B}


def default_tokenizer_dir():
    """The Llama 3 tokenizer: $FLASHLITE_MODELS (the GPU machine's .carry/models), .carry/models, or ../shared/models."""
    roots = [os.environ.get("FLASHLITE_MODELS"), REPO / ".carry" / "models", REPO.parent / "shared" / "models"]
    for r in filter(None, roots):
        if (pathlib.Path(r) / "llama3-tokenizer" / "tokenizer.json").exists():
            return str(pathlib.Path(r) / "llama3-tokenizer")
    return str(REPO.parent / "shared" / "models" / "llama3-tokenizer")


def make_checkpoint(path, tokenizer_dir, shape="llama32-1b"):
    """The random checkpoint (written once) with the tokenizer files beside it: the engine's CLI loads its tokenizer
    from the model directory, so a checkpoint without tokenizer.json makes `flashlite generate` fail."""
    path = pathlib.Path(path)
    tok = pathlib.Path(tokenizer_dir)
    if not (tok / "tokenizer.json").exists():
        raise SystemExit(f"e2e: no tokenizer.json in --tokenizer-dir '{tok}' (copy ../shared/models/llama3-tokenizer "
                         "into .carry/models or pass --tokenizer-dir)")
    if not (path / "config.json").exists():
        torch.manual_seed(0)
        torch.set_default_dtype(torch.bfloat16)  # built in bf16: an 8B model in fp32 would not fit beside the copy
        with torch.device("cuda"):
            model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**SHAPES[shape]))
        torch.set_default_dtype(torch.float32)
        model.save_pretrained(path, safe_serialization=True)
        del model
        torch.cuda.empty_cache()
    for f in ("tokenizer.json", "tokenizer_config.json"):
        if (tok / f).exists() and not (path / f).exists():
            shutil.copy(tok / f, path / f)
    return path


def copy_bandwidth():
    """Device copy bandwidth (read + write bytes per second), median of 20 copies of 1 GiB."""
    x = torch.empty(1 << 28, dtype=torch.float32, device="cuda")
    y = torch.empty_like(x)
    times = []
    for i in range(25):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        y.copy_(x)
        b.record()
        b.synchronize()
        if i >= 5:
            times.append(a.elapsed_time(b) / 1e3)
    times.sort()
    del x, y
    torch.cuda.empty_cache()
    return 2 * (1 << 30) / times[len(times) // 2]


def weight_bytes(model_dir):
    total = 0
    for f in pathlib.Path(model_dir).glob("*.safetensors"):
        with open(f, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(n))
        total += sum(v["data_offsets"][1] - v["data_offsets"][0] for k, v in header.items() if k != "__metadata__")
    return total


def all_reduce_us(args, model_dir, batch, tp):
    """Mean all-reduce time per decode step (us) from the engine's --profile output (eager steps, rank 0's lines)."""
    cmd = [args.flashlite, "generate", "--model", str(model_dir), "--device", "cuda", "--prompt-tokens", "64",
           "--batch", str(batch), "--max-tokens", "40", "--ignore-eos", "--tp", str(tp), "--profile", "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    step = [line.split() for line in proc.stderr.splitlines() if line.strip().startswith(("all-reduce", "flashlite engine profile"))]
    totals = [float(w[w.index("us") - 1]) for w in step if w[0] == "flashlite"]
    reduces = [float(w[1]) for w in step if w[0] == "all-reduce"]
    if proc.returncode != 0 or not reduces:  # the run itself was measured apart; only the probe found nothing
        return {"all_reduce_probe_error": proc.stderr[-800:]}
    return {"all_reduce_us_per_step": reduces[0], "profiled_step_us": totals[0] if totals else None}


def run_engine(args, model_dir, batch, prompt, new, tp=1, extra=()):
    cmd = [args.flashlite, "generate", "--model", str(model_dir), "--device", "cuda", "--prompt-tokens", str(prompt),
           "--batch", str(batch), "--max-tokens", str(new), "--ignore-eos", "--warmup", "1", "--json", "--tp", str(tp),
           *extra]
    runs = []
    for _ in range(args.repeats):
        proc = subprocess.run(cmd, capture_output=True)
        if proc.returncode != 0:  # keep going: the row records the CLI's error instead of the numbers
            err = proc.stderr.decode(errors="replace").strip()
            print(f"e2e: {' '.join(cmd)} exited {proc.returncode}:\n{err}", file=sys.stderr)
            return {"error": f"exit {proc.returncode}: {err[-800:]}", "command": " ".join(cmd)}
        runs.append(json.loads(proc.stdout)["stats"])
    runs.sort(key=lambda s: s["decode_tokens_per_s"])
    s = runs[len(runs) // 2]
    steps = s.get("step_ms") or [0.0]
    return {"ttft_ms": s["ttft_ms"], "tbt_ms": s["mean_tbt_ms"], "median_tbt_ms": s["median_tbt_ms"],
            # a stall shows in the slowest step and the count of steps over twice the median, not in the median
            "max_tbt_ms": max(steps), "steps_over_2x_median": sum(v > 2 * s["median_tbt_ms"] for v in steps),
            "decode_tok_s": s["decode_tokens_per_s"], "prefill_tok_s": s["prefill_tokens_per_s"],
            "peak_device_bytes": s.get("device_bytes", 0), "attention_kernel": s.get("attention_kernel"),
            "device": s.get("device")}


def run_transformers(model, batch, prompt, new, repeats):
    ids = torch.randint(0, 128000, (batch, prompt), device="cuda")
    ids[:, 0] = 128000
    kw = dict(do_sample=False, cache_implementation="static", pad_token_id=0)

    def timed(n):
        torch.cuda.synchronize()
        t = time.perf_counter()
        model.generate(ids, max_new_tokens=n, min_new_tokens=n, **kw)
        torch.cuda.synchronize()
        return time.perf_counter() - t

    timed(new)  # warm-up at the measured length (static cache allocation, every kernel and shape once)
    torch.cuda.reset_peak_memory_stats()
    ttft = sorted(timed(1) for _ in range(repeats))[repeats // 2]
    total = sorted(timed(new) for _ in range(repeats))[repeats // 2]
    tbt = (total - ttft) / (new - 1)
    return {"ttft_ms": ttft * 1e3, "tbt_ms": tbt * 1e3, "decode_tok_s": batch / tbt,
            "peak_device_bytes": torch.cuda.max_memory_allocated()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--flashlite", default=os.environ.get("FLASHLITE_BIN", str(REPO / "build" / "bin" / "flashlite")))
    ap.add_argument("--shape", choices=sorted(SHAPES), default="llama32-1b")
    ap.add_argument("--checkpoint", default=None, help="default: /tmp/flashlite_<shape>_random")
    ap.add_argument("--tp", default="1", help="tensor-parallel degrees to run, e.g. 1,2")
    ap.add_argument("--nccl-compare", action="store_true", help="TP > 1 rows also with --nccl-only (no one-shot kernel)")
    ap.add_argument("--tokenizer-dir", default=default_tokenizer_dir())
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--prompts", default="512,4096")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--engine-repeats", type=int, default=1)
    ap.add_argument("--skip-transformers", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    tps = [int(t) for t in args.tp.split(",")]
    if max(tps) > torch.cuda.device_count():
        raise SystemExit(f"e2e: --tp {max(tps)} needs that many GPUs; this machine has {torch.cuda.device_count()}")
    checkpoint = args.checkpoint or f"/tmp/flashlite_{args.shape.replace('-', '_')}_random"
    model_dir = make_checkpoint(checkpoint, args.tokenizer_dir, args.shape)
    bw = copy_bandwidth()
    wbytes = weight_bytes(model_dir)
    hf = None
    if not args.skip_transformers:
        hf = transformers.LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16,
                                                           attn_implementation="sdpa").cuda().eval()
    commit = tree_commit()
    out = args.out or str(REPO / "bench" / "results" / torch.cuda.get_device_name().replace(" ", "_") / "e2e.json")
    pathlib.Path(out).parent.mkdir(parents=True, exist_ok=True)
    rows = []

    def write():  # after every measurement, so a run cut short keeps what it measured
        result = {"benchmark": "e2e", "device": torch.cuda.get_device_name(), "commit": commit, "shape": args.shape,
                  "gpus": torch.cuda.device_count(),
                  "torch": torch.__version__, "transformers": transformers.__version__,
                  "copy_bandwidth_gb_s": bw / 1e9, "weight_bytes": wbytes, "rows": rows}
        pathlib.Path(out).write_text(json.dumps(result, indent=2) + "\n")

    for tp, b, p in itertools.product(tps, map(int, args.batches.split(",")), map(int, args.prompts.split(","))):
        row = {"batch": b, "prompt": p, "new_tokens": args.new_tokens, "tp": tp,
               "flashlite": run_engine(args, model_dir, b, p, args.new_tokens, tp)}
        if tp > 1:
            row["flashlite"].update(all_reduce_us(args, model_dir, b, tp))
            if args.nccl_compare:
                row["flashlite_nccl_only"] = run_engine(args, model_dir, b, p, args.new_tokens, tp, ["--nccl-only"])
        if hf is not None and tp == 1:
            row["transformers"] = run_transformers(hf, b, p, args.new_tokens, args.repeats)
        for k in ("flashlite", "transformers"):
            if k in row and "tbt_ms" in row[k]:  # every decode step reads all weights once (each GPU its 1 / tp)
                row[k]["weight_gb_s"] = wbytes / tp / (row[k]["tbt_ms"] / 1e3) / 1e9
                row[k]["fraction_of_copy_bw"] = row[k]["weight_gb_s"] * 1e9 / bw
        # Floor of a decode step: the weights read once at the measured bandwidth (KV cache reads add to it).
        row["weight_floor_tbt_ms"] = wbytes / tp / bw * 1e3
        base = next((r for r in rows if r["tp"] == 1 and r["batch"] == b and r["prompt"] == p), None)
        if tp > 1 and base and "decode_tok_s" in base["flashlite"] and "decode_tok_s" in row["flashlite"]:
            row["decode_speedup_vs_tp1"] = row["flashlite"]["decode_tok_s"] / base["flashlite"]["decode_tok_s"]
            row["ttft_speedup_vs_tp1"] = base["flashlite"]["ttft_ms"] / row["flashlite"]["ttft_ms"]
        if "transformers" in row and "decode_tok_s" in row["flashlite"]:
            row["decode_speedup"] = row["flashlite"]["decode_tok_s"] / row["transformers"]["decode_tok_s"]
            row["ttft_speedup"] = row["transformers"]["ttft_ms"] / row["flashlite"]["ttft_ms"]
        rows.append(row)
        print(json.dumps(row))
        write()
    write()
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
