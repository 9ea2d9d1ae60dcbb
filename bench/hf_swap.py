#!/usr/bin/env python3
"""The Hugging Face hot swap on the GPU machine: a Llama-3.2-1B-shaped LlamaForCausalLM with random bf16 weights
(bench/e2e.py's LLAMA32_1B) on attn_implementation "flite" (flashlite.hf)
against "sdpa" and "eager".

1. Teacher-forced logits (2 x 512 random tokens): flashlite vs sdpa max abs / relative difference and top-1
   agreement; random weights give near-tied logits, so the floor is reported beside it: sdpa-bf16 vs the same model
   in fp32 (and flashlite-bf16 vs fp32); exact top-1 on the decisive positions, and over all positions the share of
   picks within bf16 tolerance of fp32's maximum.
2. generate() greedy with the default DynamicCache, prompt 512, 128 new tokens, batch 1 and 16: TTFT (generate of one
   token), time between tokens ((t_128 - t_1) / 127), decode tok/s (all sequences), medians of --repeats.

  PYTHONPATH=<flashlite install> python3 bench/hf_swap.py --out bench/results/h100/hf_swap.json
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

import flashlite  # noqa: E402
import flashlite.hf  # noqa: E402


def build_model(seed):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(**LLAMA32_1B)
    with torch.device("cuda"):
        model = transformers.LlamaForCausalLM._from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa")
    return model.eval()


@torch.no_grad()
def logits(model, impl, ids):
    model.set_attn_implementation(impl)
    return model(ids).logits.float()


@torch.no_grad()
def accuracy(model, batch, prompt, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 128000, (batch, prompt), generator=g).cuda()
    fallbacks = flashlite.hf.fallbacks
    fl, sd = logits(model, flashlite.hf.NAME, ids), logits(model, "sdpa", ids)
    assert flashlite.hf.fallbacks == fallbacks, "flashlite.hf fell back to SDPA"
    top_fl, top_sd = fl.argmax(-1), sd.argmax(-1)
    diff = (fl - sd).abs().max().item()
    res = {"positions": batch * prompt, "max_abs_flashlite_vs_sdpa": diff,
           "rel_flashlite_vs_sdpa": diff / sd.abs().max().item(),
           "top1_agree_flashlite_vs_sdpa": (top_fl == top_sd).float().mean().item()}
    del fl
    model.float()  # the fp32 floor: the same weights, exact attention (sdpa fp32)
    exact = logits(model, "sdpa", ids)
    model.to(torch.bfloat16)
    top_ex = exact.argmax(-1)
    res.update({"top1_agree_sdpa_bf16_vs_fp32": (top_sd == top_ex).float().mean().item(),
                "top1_agree_flashlite_bf16_vs_fp32": (top_fl == top_ex).float().mean().item()})
    # the fp32 model's top-1 margin: how tied the random model's logits are
    top2 = exact.topk(2, dim=-1).values
    margin = top2[..., 0] - top2[..., 1]
    res["fp32_top1_margin_median"] = margin.median().item()
    # Decisive positions (as tests/engine/test_engine_gpu_parity.py): fp32's top-1/top-2 margin exceeds 4x that
    # position's RMS bf16 rounding error (sdpa-bf16 vs fp32), so rounding alone can hardly flip the argmax.
    decisive = margin > 4 * (sd - exact).pow(2).mean(-1).sqrt()
    agree = lambda a, b: (a == b)[decisive].float().mean().item()
    res.update({"decisive_positions": int(decisive.sum()),
                "top1_agree_flashlite_vs_sdpa_decisive": agree(top_fl, top_sd),
                "top1_agree_flashlite_vs_fp32_decisive": agree(top_fl, top_ex),
                "top1_agree_sdpa_bf16_vs_fp32_decisive": agree(top_sd, top_ex)})
    # Over all positions, near-ties included (as the engine's parity test): the pick's fp32 logit within 4x the
    # position's RMS bf16 rounding error of fp32's maximum.
    rms = (sd - exact).pow(2).mean(-1).sqrt()
    def within(top):
        short = (top2[..., 0] - exact.gather(-1, top[..., None])[..., 0]) / rms
        return (short <= 4).float().mean().item(), short.max().item()
    for name, top in (("flashlite", top_fl), ("sdpa", top_sd)):
        frac, worst = within(top)
        res[f"top1_{name}_bf16_within_bf16_tolerance_vs_fp32"] = frac
        res[f"worst_{name}_bf16_pick_shortfall_in_bf16_rms"] = worst
    del sd, exact
    return res


@torch.no_grad()
def timing(model, impl, batch, prompt, new, repeats, seed):
    model.set_attn_implementation(impl)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 128000, (batch, prompt), generator=g).cuda()
    kw = dict(do_sample=False, pad_token_id=0)

    def timed(n):
        torch.cuda.synchronize()
        t = time.perf_counter()
        out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, **kw)
        torch.cuda.synchronize()
        assert out.shape == (batch, prompt + n)
        return time.perf_counter() - t

    timed(4)  # warm-up
    torch.cuda.reset_peak_memory_stats()
    ttft = sorted(timed(1) for _ in range(repeats))[repeats // 2]
    total = sorted(timed(new) for _ in range(repeats))[repeats // 2]
    tbt = (total - ttft) / (new - 1)
    return {"impl": impl, "batch": batch, "prompt": prompt, "new_tokens": new, "ttft_ms": ttft * 1e3,
            "tbt_ms": tbt * 1e3, "decode_tok_s": batch / tbt, "total_s": total, "end_to_end_tok_s": batch * new / total,
            "peak_device_bytes": torch.cuda.max_memory_allocated()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="bench/results/h100/hf_swap.json")
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--impls", default="flite,sdpa,eager")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--accuracy-only", action="store_true", help="the teacher-forced logits only, no generate() timing")
    args = ap.parse_args()

    flashlite.hf.register()
    model = build_model(args.seed)
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "transformers": transformers.__version__, "flashlite": flashlite.__version__,
              "model": "LlamaForCausalLM, Llama-3.2-1B shape (bench/e2e.py LLAMA32_1B), random bf16 weights",
              "cache": "DynamicCache (generate's default)"}
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    save = lambda: out.write_text(json.dumps(result, indent=1) + "\n")  # noqa: E731  (after every step)
    result["accuracy"] = accuracy(model, 2, args.prompt, args.seed + 1)
    print(json.dumps(result["accuracy"], indent=1), flush=True)
    save()
    if args.accuracy_only:
        return
    runs = result["generate"] = []
    save()
    for batch in (int(b) for b in args.batches.split(",")):
        for impl in args.impls.split(","):
            r = timing(model, impl, batch, args.prompt, args.new, args.repeats, args.seed + 2)
            print(json.dumps(r), flush=True)
            runs.append(r)
            save()


if __name__ == "__main__":
    main()
