#!/usr/bin/env python3
"""Padded and packed batches through the Hugging Face hook: what the mask reader (flashlite/_masks.py) costs against
SDPA's one masked call. A Llama-3.2-1B-shaped LlamaForCausalLM (bench/e2e.py's LLAMA32_1B: GQA 32 / 8, head_dim 64)
cut to --layers layers and a 32k vocabulary, random bf16 weights, attn_implementation "flite" against "sdpa" on the
same batches, in one process:

- full:   --batch rows of --seq tokens, no mask (the floor both share);
- padded: the same rows right-padded to random lengths in [seq / 4, seq] (attention_mask; labels -100 on pads);
- packed: each row packs sequences of random lengths in [seq / 16, seq / 2] (position_ids restart at each; no
          attention_mask, so transformers builds a block-diagonal causal mask from them).

Per batch kind: a training step (forward + backward of the loss) and a forward alone (no_grad), median ms of --repeats
after a warm-up, the memory a training step adds at its peak (CUDA), and whether the hook ran flashlite on every
layer (flashlite.hf.fallbacks unchanged).

  PYTHONPATH=<flashlite install> python3 bench/hf_batches.py --out bench/results/h100/hf_batches.json
  python3 bench/hf_batches.py --tiny --device cpu   (a smoke run)
"""
import argparse
import json
import pathlib
import sys
import time

import torch
import transformers

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from e2e import LLAMA32_1B  # noqa: E402
from tree_commit import tree_commit  # noqa: E402

import flashlite  # noqa: E402
import flashlite.hf  # noqa: E402


def build_model(layers, tiny, device, seed):
    torch.manual_seed(seed)
    shape = dict(LLAMA32_1B, num_hidden_layers=layers, vocab_size=32000, bos_token_id=1, eos_token_id=2)
    if tiny:
        shape.update(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2)
    cfg = transformers.LlamaConfig(**shape)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    with torch.device(device):
        model = transformers.LlamaForCausalLM._from_config(cfg, dtype=dtype, attn_implementation="sdpa")
    return model


def batches(batch, seq, vocab, device, seed):
    """{kind: model kwargs} for the three batch kinds (the same tokens in each)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, seq), generator=g)
    lengths = torch.randint(seq // 4, seq + 1, (batch,), generator=g)
    mask = (torch.arange(seq)[None] < lengths[:, None]).long()
    positions = []
    for _ in range(batch):
        row, left = [], seq
        while left > 0:
            n = min(left, int(torch.randint(seq // 16, seq // 2 + 1, (1,), generator=g)))
            row.append(torch.arange(n))
            left -= n
        positions.append(torch.cat(row))
    kinds = {"full": dict(input_ids=ids, labels=ids),
             "padded": dict(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)),
             "packed": dict(input_ids=ids, position_ids=torch.stack(positions), labels=ids)}
    real = {"full": batch * seq, "padded": int(lengths.sum()), "packed": batch * seq}
    return {k: {n: t.to(device) for n, t in kw.items()} for k, kw in kinds.items()}, real


def timed(fn, repeats, device):
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2] * 1e3


def measure(model, impl, kwargs, repeats, device):
    model.set_attn_implementation(impl)
    fallbacks = flashlite.hf.fallbacks

    def train_step():
        model.zero_grad(set_to_none=True)
        model(**kwargs, use_cache=False).loss.backward()

    def forward():
        with torch.no_grad():
            return model(**kwargs, use_cache=False).loss.item()

    res = {"loss": forward(), "train_step_ms": timed(train_step, repeats, device),
           "forward_ms": timed(forward, repeats, device)}
    if device == "cuda":  # the memory a training step adds over the model and its gradients
        model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        train_step()
        torch.cuda.synchronize()
        res["train_step_peak_mib"] = (torch.cuda.max_memory_allocated() - base) / 2**20
    if impl == flashlite.hf.NAME:
        res["fallback_calls"] = flashlite.hf.fallbacks - fallbacks
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tiny", action="store_true", help="a width-256 model (CPU smoke run)")
    args = ap.parse_args(argv)

    flashlite.hf.register()
    model = build_model(args.layers, args.tiny, args.device, args.seed).train()
    kinds, real = batches(args.batch, args.seq, model.config.vocab_size, args.device, args.seed + 1)
    result = {"benchmark": "hf_batches", "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
              "commit": tree_commit(), "torch": torch.__version__, "transformers": transformers.__version__,
              "model": f"LlamaForCausalLM, Llama-3.2-1B shape, {args.layers} layers, vocab 32000, random weights"
                       + (" (tiny)" if args.tiny else ""),
              "dtype": str(model.dtype).replace("torch.", ""), "batch": args.batch, "seq": args.seq,
              "repeats": args.repeats, "rows": []}
    for kind, kwargs in kinds.items():
        row = {"kind": kind, "real_tokens": real[kind]}
        for impl in (flashlite.hf.NAME, "sdpa"):
            row[impl] = measure(model, impl, kwargs, args.repeats, args.device)
        row["train_speedup"] = row["sdpa"]["train_step_ms"] / row[flashlite.hf.NAME]["train_step_ms"]
        row["forward_speedup"] = row["sdpa"]["forward_ms"] / row[flashlite.hf.NAME]["forward_ms"]
        print(json.dumps(row), flush=True)
        result["rows"].append(row)
    if args.out:
        out = pathlib.Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
