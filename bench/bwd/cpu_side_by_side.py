"""The CPU backward side by side: flashlite's backend 'cpu' against torch SDPA's CPU path, in one process on the same
tensors: fp32 (or --dtype bfloat16), B 1, H 8, D 64, torch with the process's threads (OMP_NUM_THREADS).

Per shape: forward + backward through autograd (flashlite.attention and torch SDPA on tensors that require grad, then
torch.autograd.grad), and flashlite's backward alone (flashlite.attention_backward on the forward's out and LSE). Each
one's gradients (dq, dk, dv) are compared with torch SDPA's in float64 on the same inputs: the relative error
|g - g64| / |g64|, the largest of the three.
Paths are interleaved in rounds; each reports its best time over all rounds (the CPU's noise only ever adds).

    OMP_NUM_THREADS=2 python3 bench/bwd/cpu_side_by_side.py --out bench/results/cpu/bwd_cpu.json
"""
import argparse
import json
import os
import pathlib
import platform
import sys
import time

import torch
import torch.nn.functional as F

import flashlite

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # bench/
from tree_commit import tree_commit  # noqa: E402


def best_ms(fn, reps):
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best * 1e3


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="1024:0,1024:1,2048:1", help="S:causal,...")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--out", default="bwd_cpu.json")
    args = ap.parse_args(argv)
    b, h, d = 1, 8, 64
    res = {"benchmark": "cpu backward side by side", "device": platform.processor() or platform.machine(),
           "threads": torch.get_num_threads(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
           "torch": torch.__version__, "commit": tree_commit(), "dtype": args.dtype, "batch": b, "heads": h,
           "head_dim": d, "protocol": __doc__.strip().split("\n\n")[1], "rows": []}
    for shape in args.shapes.split(","):
        s, causal = int(shape.split(":")[0]), shape.split(":")[1] == "1"
        g = torch.Generator().manual_seed(0)
        dtype = getattr(torch, args.dtype)
        q, k, v, dout = (torch.randn(b, s, h, d, generator=g).to(dtype) for _ in range(4))
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        with torch.no_grad():
            out, lse = flashlite.attention(q, k, v, causal=causal, return_lse=True, backend="cpu")

        def flite_fwd_bwd():
            o = flashlite.attention(qg, kg, vg, causal=causal, backend="cpu")
            return torch.autograd.grad(o, (qg, kg, vg), dout)

        def sdpa_fwd_bwd():
            o = F.scaled_dot_product_attention(qg.transpose(1, 2), kg.transpose(1, 2), vg.transpose(1, 2),
                                               is_causal=causal).transpose(1, 2)
            return torch.autograd.grad(o, (qg, kg, vg), dout)

        def flite_bwd():
            return flashlite.attention_backward(q, k, v, out, lse, dout, causal=causal, backend="cpu")

        paths = {"flashlite_fwd_bwd": flite_fwd_bwd, "sdpa_fwd_bwd": sdpa_fwd_bwd, "flashlite_bwd": flite_bwd}
        grads = {n: fn() for n, fn in paths.items() if n.endswith("fwd_bwd")}  # warm-up, and the check below
        diff = max((a.float() - r.float()).abs().max().item()
                   for a, r in zip(grads["flashlite_fwd_bwd"], grads["sdpa_fwd_bwd"]))
        q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
        o64 = F.scaled_dot_product_attention(q64.transpose(1, 2), k64.transpose(1, 2), v64.transpose(1, 2),
                                             is_causal=causal).transpose(1, 2)
        ref = torch.autograd.grad(o64, (q64, k64, v64), dout.double())
        rel_err = {n: max(((a.double() - r).norm() / r.norm()).item() for a, r in zip(gr, ref))
                   for n, gr in grads.items()}
        times = {n: float("inf") for n in paths}
        for _ in range(args.rounds):
            for n, fn in paths.items():
                times[n] = min(times[n], best_ms(fn, args.reps))
        row = {"seq": s, "causal": causal, "max_abs_grad_diff": diff,
               "grad_rel_err_vs_float64": {n.removesuffix("_fwd_bwd"): e for n, e in rel_err.items()}}
        row |= {n: {"ms": round(t, 2)} for n, t in times.items()}
        res["rows"].append(row)
        print(f"S {s:5d} {'causal' if causal else 'full  '}  " + "  ".join(f"{n} {t:7.1f} ms" for n, t in times.items())
              + f"  grad diff {diff:.1e}  rel err vs float64 "
              + " ".join(f"{n} {e:.1e}" for n, e in row["grad_rel_err_vs_float64"].items()), flush=True)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    return res


if __name__ == "__main__":
    main()
