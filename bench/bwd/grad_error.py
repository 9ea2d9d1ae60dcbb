"""Gradient error against float64 on the training run's attention shape (bench/train.py's Llama: batch 16, seq 512, 8
query / 2 kv heads, head_dim 64, causal, bf16): flashlite, SDPA flash and transformers-style eager math (fp32 softmax,
P rounded to bf16), on the same bf16 inputs. Per output and gradient: the relative error |g - g64| / |g64| and the
bias, the error's projection on the true gradient <g - g64, g64> / |g64|^2 (negative: the gradient is shrunk on
average, as if the learning rate were smaller). Several seeds and input scales; prints a table and writes JSON.

    python3 bench/bwd/grad_error.py --out grad_error.json
"""
import argparse
import json
import pathlib
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashlite

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # bench/
from tree_commit import tree_commit  # noqa: E402


def expand(t, group):  # [B, S, Hkv, D] -> [B, S, Hkv * group, D]
    return t.repeat_interleave(group, dim=2)


def eager(q, k, v, group):  # transformers' eager attention: fp32 softmax, P back to the inputs' dtype
    qh, kh, vh = q.transpose(1, 2), expand(k, group).transpose(1, 2), expand(v, group).transpose(1, 2)
    s = (qh @ kh.transpose(-1, -2)) * q.shape[-1] ** -0.5
    n = s.shape[-1]
    s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    p = torch.softmax(s, dim=-1, dtype=torch.promote_types(q.dtype, torch.float32)).to(q.dtype)  # fp64 stays fp64
    return (p @ vh).transpose(1, 2)


def sdpa_flash(q, k, v, group):
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return F.scaled_dot_product_attention(q.transpose(1, 2), expand(k, group).transpose(1, 2),
                                              expand(v, group).transpose(1, 2), is_causal=True).transpose(1, 2)


def flite(q, k, v, group):
    return flashlite.attention(q, k, v, causal=True)


def grads(fn, q, k, v, dout, group):
    """(out, dq, dk, dv) of one implementation."""
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = fn(q, k, v, group)
    return (out.detach(), *torch.autograd.grad(out, (q, k, v), dout))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--out", default="grad_error.json")
    args = ap.parse_args()
    B, S, HQ, HKV, D = 16, 512, 8, 2, 64
    group = HQ // HKV
    impls = {"flashlite": flite, "sdpa_flash": sdpa_flash, "eager": eager}
    res = {"benchmark": "gradient error against float64", "device": torch.cuda.get_device_name(),
           "commit": tree_commit(), "torch": torch.__version__, "shape": [B, S, HQ, HKV, D], "rows": []}
    for scale in (1.0, 3.0):
        for seed in range(args.seeds):
            g = torch.Generator(device="cuda").manual_seed(seed)
            q, k = (torch.randn(B, S, h, D, device="cuda", generator=g) * scale for h in (HQ, HKV))
            v = torch.randn(B, S, HKV, D, device="cuda", generator=g)
            dout = torch.randn(B, S, HQ, D, device="cuda", generator=g)
            q, k, v, dout = (t.bfloat16() for t in (q, k, v, dout))
            ref = grads(eager, *(t.double() for t in (q, k, v, dout)), group)
            for name, fn in impls.items():
                got = grads(fn, q, k, v, dout, group)
                row = {"impl": name, "input_std": scale, "seed": seed}
                for gname, a, r in zip(("out", "dq", "dk", "dv"), got, ref):
                    e = a.double() - r
                    row[gname + "_rel_err"] = (e.norm() / r.norm()).item()
                    row[gname + "_bias"] = ((e * r).sum() / (r * r).sum()).item()
                res["rows"].append(row)
                print(f"std {scale:3.1f} seed {seed} {name:10s} " + "  ".join(
                    f"{n} err {row[n + '_rel_err']:.2e} bias {row[n + '_bias']:+.2e}"
                    for n in ("out", "dq", "dk", "dv")),
                    flush=True)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
