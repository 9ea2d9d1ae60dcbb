"""Training runs with flashlite's attention against the reference implementation, same seed, same data order.

Two small transformers models, byte-level (vocabulary 256) on real English text: the Python reference documentation
that ships with Python itself (pydoc_data.topics, ~465 KB; nothing downloaded):
  - llama:   LlamaForCausalLM, GQA (8 query / 2 kv heads), against attn_implementation="sdpa";
  - gpt_oss: GptOssForCausalLM (alternating sliding-window and full layers, learned per-head sinks, 4 small experts),
             against transformers' own "eager" attention (the one that implements its sinks).
Each model is built once from a seed; both runs start from copies of it and see the same batches. Per step: the loss;
per run: tokens/s (after warm-up) and peak GPU memory. Writes JSON (and a PNG of the curves with --plot).

    python3 bench/train.py --device cuda --dtype bf16 --steps 500 --json bench/results/<gpu>/train.json --plot ...
    python3 bench/train.py --device cpu --dtype fp32 --steps 8 --tiny          # what CI's test runs
"""
import argparse
import copy
import json
import math
import pathlib
import sys
import time

import torch
import transformers

import flashlite.hf as flhf

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # bench/
from tree_commit import tree_commit  # noqa: E402


def corpus():
    import pydoc_data.topics as topics
    return "".join(topics.topics[k] for k in sorted(topics.topics)).encode("utf-8")


def batches(data, steps, batch, seq, seed):
    """steps batches of [batch, seq + 1] byte ids, random windows of the corpus in a fixed order."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.frombuffer(bytearray(data), dtype=torch.uint8).long()
    starts = torch.randint(0, len(ids) - seq - 1, (steps, batch), generator=g)
    return [torch.stack([ids[s:s + seq + 1] for s in row.tolist()]) for row in starts]


def config(arch, tiny):
    width = dict(hidden_size=128 if tiny else 512, intermediate_size=256 if tiny else 1536,
                 num_hidden_layers=2 if tiny else 6, num_attention_heads=8, num_key_value_heads=2,
                 head_dim=16 if tiny else 64, vocab_size=256, max_position_embeddings=4096, initializer_range=0.02)
    if arch == "llama":
        return transformers.LlamaConfig(**width), transformers.LlamaForCausalLM, "sdpa"
    cfg = transformers.GptOssConfig(**width, sliding_window=32 if tiny else 128, num_local_experts=4,
                                    num_experts_per_tok=2)
    return cfg, transformers.GptOssForCausalLM, "eager"


# The noise floor: another exact attention of transformers against the reference (llama: eager against sdpa; gpt-oss
# has one implementation with sinks, eager, so sdpa -- which transformers runs without them -- cannot serve).
BASELINE = {"llama": "eager"}


def lr_factor(step, steps, schedule, warmup):
    """The learning rate of `step` over the peak: "constant"; "cosine": a linear warm-up over `warmup` steps, then a
    cosine decay to a tenth of the peak at the last step (the usual language-model recipe)."""
    if schedule == "constant":
        return 1.0
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - 1 - warmup)
    return 0.1 + 0.45 * (1.0 + math.cos(math.pi * progress))


def train(model, impl, data, device, dtype, lr, schedule="constant", warmup=0):
    """dtype "amp": float32 weights and optimizer, the forward under torch.autocast to bf16 (mixed precision)."""
    amp = dtype == "amp"
    model = copy.deepcopy(model).to(device=device, dtype=torch.float32 if amp else dtype)
    model.set_attn_implementation(impl)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: lr_factor(step, len(data), schedule, warmup))
    losses, t_start, tokens = [], None, 0
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for step, b in enumerate(data):
        if step == 2:  # after warm-up (allocator, kernels' first launches)
            if device == "cuda":
                torch.cuda.synchronize()
            t_start = time.perf_counter()
        b = b.to(device)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=amp):
            loss = _loss(model, b)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if step >= 2:
            tokens += b[:, :-1].numel()
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t_start if t_start else float("nan")
    peak = torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else None
    return dict(impl=impl, losses=losses, tokens_per_s=tokens / seconds if tokens else None,
                peak_memory_mib=peak)


def _loss(model, b):
    logits = model(b[:, :-1]).logits.float()
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), b[:, 1:].reshape(-1))


def build_model(arch, tiny, seed):
    """(the float32 model of `arch` made from `seed`, its reference attention implementation)."""
    cfg, cls, ref_impl = config(arch, tiny)
    torch.manual_seed(seed)
    model = cls(cfg)
    if arch == "gpt_oss":  # sinks away from zero so that they matter from the first step
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.sinks.normal_(0.0, 1.0)
    return model, ref_impl


def run(arch, args):
    model, ref_impl = build_model(arch, args.tiny, args.seed)
    data = batches(corpus(), args.steps, args.batch, args.seq, args.seed)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "amp": "amp"}[args.dtype]
    recipe = dict(lr=args.lr, schedule=args.schedule, warmup=args.warmup)
    runs = [train(model, impl, data, args.device, dtype, **recipe) for impl in (flhf.NAME, ref_impl)]

    def final(run_):
        return sum(run_["losses"][-args.average:]) / len(run_["losses"][-args.average:])

    ref_final = final(runs[1])

    def rel_diff(run_):
        return abs(final(run_) - ref_final) / ref_final

    res = dict(arch=arch, reference=ref_impl, params=sum(p.numel() for p in model.parameters()), runs=runs,
               final_loss_flite=final(runs[0]), final_loss_reference=ref_final, final_loss_rel_diff=rel_diff(runs[0]))
    if args.baseline and arch in BASELINE:  # another exact implementation against the reference: the noise floor of the comparison
        runs.append(train(model, BASELINE[arch], data, args.device, dtype, **recipe))
        res.update(final_loss_baseline=final(runs[-1]), final_loss_baseline_rel_diff=rel_diff(runs[-1]))
    if args.rerun:  # the reference against itself: what its own nondeterminism (atomics) does to the run
        runs.append(dict(train(model, ref_impl, data, args.device, dtype, **recipe), rerun=True))
        res.update(final_loss_rerun=final(runs[-1]), final_loss_rerun_rel_diff=rel_diff(runs[-1]),
                   rerun_identical=runs[-1]["losses"] == runs[1]["losses"])
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", choices=["llama", "gpt_oss", "both"], default="both")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=["fp32", "bf16", "fp16", "amp"], default="bf16",
                    help="the weights' dtype; amp: float32 weights, bf16 autocast (mixed precision)")
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--lr", type=float, default=1e-3, help="the peak learning rate")
    ap.add_argument("--schedule", choices=["constant", "cosine"], default="constant",
                    help="cosine: linear warm-up over --warmup steps, then a cosine decay to lr / 10")
    ap.add_argument("--warmup", type=int, default=25, help="warm-up steps of the cosine schedule")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--average", type=int, default=50, help="final loss: mean of the last N steps")
    ap.add_argument("--tiny", action="store_true", help="2-layer width-128 models (CI)")
    ap.add_argument("--baseline", action="store_true",
                    help="llama only: a third run with transformers' eager attention (the noise floor)")
    ap.add_argument("--rerun", action="store_true",
                    help="a further run of the reference itself (the noise floor of its own nondeterminism; "
                         "identical when it is deterministic)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--plot", help="write the loss curves here (PNG, needs matplotlib)")
    ap.add_argument("--commit", default=None)
    args = ap.parse_args(argv)
    flhf.register()
    archs = ["llama", "gpt_oss"] if args.arch == "both" else [args.arch]
    results = [run(a, args) for a in archs]
    for r in results:
        print(f"{r['arch']:8s} {r['params'] / 1e6:6.1f}M params  final loss flite {r['final_loss_flite']:.4f}  "
              f"{r['reference']} {r['final_loss_reference']:.4f}  rel diff {r['final_loss_rel_diff']:.2%}  "
              + (f"(noise floor {r['final_loss_baseline_rel_diff']:.2%})  " if "final_loss_baseline" in r else "")
              + (f"(rerun {r['final_loss_rerun_rel_diff']:.2%}{', identical' if r['rerun_identical'] else ''})  "
                 if "final_loss_rerun" in r else "")
              + "  ".join(f"{x['impl']} {x['tokens_per_s'] or 0:,.0f} tok/s"
                          + (f" {x['peak_memory_mib']:,.0f} MiB" if x["peak_memory_mib"] else "") for x in r["runs"]))
    out = dict(benchmark="train", device=torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
               torch=torch.__version__, transformers=transformers.__version__, commit=args.commit or tree_commit(),
               dtype=args.dtype, steps=args.steps, batch=args.batch, seq=args.seq, lr=args.lr,
               schedule=args.schedule, warmup=args.warmup if args.schedule == "cosine" else 0, seed=args.seed,
               data="pydoc_data.topics (Python's reference documentation), bytes", results=results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    if args.plot:
        _plot(out, args.plot)
    return out


def _plot(out, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(out["results"]), figsize=(6 * len(out["results"]), 4), squeeze=False)
    for ax, r in zip(axes[0], out["results"]):
        for run_ in r["runs"]:
            ax.plot(run_["losses"], label=run_["impl"] + (" (rerun)" if run_.get("rerun") else ""), lw=1)
        ax.set_title(f"{r['arch']} ({r['params'] / 1e6:.0f}M, {out['dtype']}, {out['device']})")
        ax.set_xlabel("step")
        ax.set_ylabel("loss")
        ax.set_ylim(top=min(6.0, max(max(x["losses"]) for x in r["runs"])))
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
