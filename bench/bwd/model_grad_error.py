"""Whole-model gradient error against float64, on bench/train.py's models and data: where a training run's gap
(flashlite's final loss away from the reference's) could come from, seen through every parameter's gradient rather
than the attention's alone (bench/bwd/grad_error.py).

The model (--arch: train.py's Llama or GPT-OSS) starts from train.py's seed and, with --warm-steps N, is first trained
N steps with --warm-impl (attention grows peaked as training goes on, so step 0 alone may not show what step 300
does). Its weights, rounded to bf16, are then copied exactly into a float64 model with transformers' eager attention
(the reference) and into a model per implementation (flite, sdpa, eager; GPT-OSS: flite, eager, the implementations
with its sinks) in bf16, or with --amp in float32 under bf16 autocast (mixed precision, warm-up included). On
--batches fresh batches, each gives its loss and every parameter's gradient; per implementation, against float64:
  - loss_diff: its loss minus the reference's;
  - rel_err: |g - g64| / |g64| over all parameters, and per group (attention projections, MLP, the rest);
  - cos: the cosine between g and g64;
  - bias: <g - g64, g64> / |g64|^2 (negative: the step is shorter on average, as with a smaller learning rate).

    python3 bench/bwd/model_grad_error.py --warm-steps 300 --out model_grad_error.json          # the GPU run
    python3 bench/bwd/model_grad_error.py --arch gpt_oss --amp --warm-steps 300 --out ...       # GPT-OSS, mixed
    python3 bench/bwd/model_grad_error.py --device cpu --tiny --batch 2 --seq 32 --batches 1     # what CI runs
"""
import argparse
import copy
import importlib.util
import json
import pathlib
import sys

import torch

import flashlite.hf as flhf

BENCH = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))
from tree_commit import tree_commit  # noqa: E402


def _train_module():
    spec = importlib.util.spec_from_file_location("flashlite_bench_train", BENCH / "train.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def group_of(name):
    if ".self_attn." in name:
        return "attention"
    if ".mlp." in name:
        return "mlp"
    return "other"  # embeddings, norms, the LM head


def loss_and_grads(model, impl, batch, device, dtype, loss_fn, amp=False):
    """The loss and every parameter's gradient (float64 copies) of `model` in `dtype`; amp: float32 weights, the
    forward under bf16 autocast."""
    m = copy.deepcopy(model).to(device=device, dtype=torch.float32 if amp else dtype)
    m.set_attn_implementation(impl)
    if hasattr(m, "set_experts_implementation") and getattr(m.config, "num_local_experts", None):
        m.set_experts_implementation("eager")  # GPT-OSS: the grouped GEMM has no float64; one formula for all
    m.train()
    with torch.autocast(device, dtype=torch.bfloat16, enabled=amp):
        loss = loss_fn(m, batch.to(device))
    loss.backward()
    grads = {n: p.grad.detach().double() for n, p in m.named_parameters() if p.grad is not None}
    return loss.item(), grads


def compare(got, ref):
    """rel_err, cos and bias of got against ref over the named gradients (all, and per group)."""
    out = {}
    for group in ("all", "attention", "mlp", "other"):
        names = [n for n in ref if group == "all" or group_of(n) == group]
        if not names:
            continue
        e2 = r2 = er = gr = g2 = 0.0
        for n in names:
            g, r = got[n], ref[n]
            e = g - r
            e2 += (e * e).sum().item()
            r2 += (r * r).sum().item()
            er += (e * r).sum().item()
            gr += (g * r).sum().item()
            g2 += (g * g).sum().item()
        out[group] = {"rel_err": (e2 / r2) ** 0.5, "cos": gr / (g2 * r2) ** 0.5, "bias": er / r2}
    return out


def warm(model, impl, data, device, lr, loss_fn, amp=False):
    """train.py's optimizer and clipping for len(data) steps in bf16 (amp: float32 weights under bf16 autocast);
    returns the trained model."""
    m = copy.deepcopy(model).to(device=device, dtype=torch.float32 if amp else torch.bfloat16)
    m.set_attn_implementation(impl)
    m.train()
    opt = torch.optim.AdamW(m.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    for b in data:
        with torch.autocast(device, dtype=torch.bfloat16, enabled=amp):
            loss = loss_fn(m, b.to(device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
    return m


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--arch", choices=["llama", "gpt_oss"], default="llama")
    ap.add_argument("--amp", action="store_true", help="float32 weights under bf16 autocast instead of bf16 weights")
    ap.add_argument("--tiny", action="store_true", help="train.py's 2-layer width-128 model (CI)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--warm-steps", type=int, default=0, help="bf16 training steps before the probe")
    ap.add_argument("--warm-impl", default=None, help="the attention those steps use (default: the reference)")
    ap.add_argument("--batches", type=int, default=4, help="fresh batches probed after the warm-up")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    flhf.register()
    tm = _train_module()
    model, ref_impl = tm.build_model(args.arch, args.tiny, args.seed)
    args.warm_impl = args.warm_impl or ref_impl
    data = tm.batches(tm.corpus(), args.warm_steps + args.batches, args.batch, args.seq, args.seed)
    if args.warm_steps:
        model = warm(model, args.warm_impl, data[:args.warm_steps], args.device, args.lr, tm._loss, args.amp)
    model = model.to(device="cpu", dtype=torch.bfloat16)  # the probe's weights: bf16 values, exact in float64 too
    impls = [flhf.NAME, "sdpa", "eager"] if args.arch == "llama" else [flhf.NAME, "eager"]  # sdpa has no sinks
    res = {"benchmark": "whole-model gradient error against float64 (bench/bwd/model_grad_error.py)",
           "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "commit": tree_commit(),
           "torch": torch.__version__, "arch": args.arch, "amp": args.amp, "tiny": args.tiny, "seed": args.seed,
           "warm_steps": args.warm_steps, "warm_impl": args.warm_impl, "batch": args.batch, "seq": args.seq, "rows": []}
    for i, b in enumerate(data[args.warm_steps:]):
        ref_loss, ref = loss_and_grads(model, "eager", b, args.device, torch.float64, tm._loss)
        for impl in impls:
            loss, got = loss_and_grads(model, impl, b, args.device, torch.bfloat16, tm._loss, args.amp)
            row = {"batch_index": i, "impl": impl, "loss": loss, "loss_fp64": ref_loss, "loss_diff": loss - ref_loss,
                   **compare(got, ref)}
            res["rows"].append(row)
            print(f"batch {i} {impl:6s} loss {loss:.5f} (fp64 {ref_loss:.5f}, {loss - ref_loss:+.2e})  " + "  ".join(
                f"{g} err {row[g]['rel_err']:.2e} cos {row[g]['cos']:.6f} bias {row[g]['bias']:+.2e}"
                for g in ("all", "attention", "mlp", "other")), flush=True)
    means = {}
    for impl in impls:
        rows = [r for r in res["rows"] if r["impl"] == impl]
        means[impl] = {"loss_diff": sum(r["loss_diff"] for r in rows) / len(rows),
                       **{g: {k: sum(r[g][k] for r in rows) / len(rows) for k in ("rel_err", "cos", "bias")}
                          for g in ("all", "attention", "mlp", "other")}}
        m = means[impl]
        print(f"mean {impl:6s} loss_diff {m['loss_diff']:+.2e}  all err {m['all']['rel_err']:.2e} "
              f"bias {m['all']['bias']:+.2e}  attention err {m['attention']['rel_err']:.2e} "
              f"bias {m['attention']['bias']:+.2e}")
    res["means"] = means
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    return res


if __name__ == "__main__":
    main()
