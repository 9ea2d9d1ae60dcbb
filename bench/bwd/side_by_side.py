"""The backward pass side by side: flashlite (through its torch op, as a user's autograd calls it) against torch SDPA's
FLASH_ATTENTION and CUDNN_ATTENTION backends and FlexAttention (window + sink tokens), in ONE process on the SAME
tensors: bf16, batch*seq = 16384 tokens, heads*head_dim = 2048, GQA off.

Each backend runs its forward once with autograd, then its backward alone is timed with CUDA events:
torch.autograd.grad(out, (q, k, v), dout, retain_graph=True). Backends are interleaved in rounds (--rounds, --reps
calls each); the result is the median over all calls. Useful FLOPs: 2.5 x the forward's 4 * B * H * Sq * Sk * D,
halved for causal, window counted by its visible pairs. Gradients are compared with SDPA flash's before timing.
Also the forward + backward time and the peak memory of one forward + backward per backend.

    python3 bench/bwd/side_by_side.py --out bench/results/<gpu>/bwd_side_by_side.json
"""
import argparse
import json
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashlite
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # bench/
from tree_commit import tree_commit  # noqa: E402


def sdpa(backend, causal):
    def fwd(q, k, v):  # flashlite layout in, SDPA's [B, H, S, D] views inside
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                  is_causal=causal).transpose(1, 2)
    return fwd


def flite(causal, window=(-1, -1), sink_tokens=0):
    return lambda q, k, v: flashlite.attention(q, k, v, causal=causal, window=window, sink_tokens=sink_tokens)


def flex(window, sink_tokens):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    compiled = torch.compile(flex_attention)
    cache = {}

    def fwd(q, k, v):
        S = q.shape[1]
        if S not in cache:
            def mask(b, h, i, j):
                return (j <= i) & ((j >= i - window) | (j < sink_tokens))
            cache[S] = create_block_mask(mask, None, None, S, S, device="cuda")
        return compiled(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                        block_mask=cache[S]).transpose(1, 2)
    return fwd


def time_backward(fn, q, k, v, dout, reps):
    out = fn(q, k, v)
    grads = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)  # warm-up (and compile)
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return times, grads


def fwd_bwd_ms_and_peak(fn, q, k, v, dout, reps=5):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        torch.autograd.grad(fn(q, k, v), (q, k, v), dout)
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / reps, (torch.cuda.max_memory_allocated() - base) / 2**20


def visible_pairs(S, causal, window, sink_tokens):
    i = torch.arange(S, device="cuda")[:, None]
    j = torch.arange(S, device="cuda")[None, :]
    vis = torch.ones(S, S, dtype=torch.bool, device="cuda")
    if causal:
        vis &= j <= i
    if window >= 0:
        vis &= (j >= i - window) | (j < sink_tokens)
    return vis.sum().item()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seqs", default="1024,2048,4096,8192,16384")
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default="bwd_side_by_side.json")
    args = ap.parse_args()
    res = {"benchmark": "backward side by side", "device": torch.cuda.get_device_name(), "commit": tree_commit(),
           "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
           "protocol": __doc__.strip().split("\n\n")[1], "rows": []}
    print(res["device"], flush=True)
    shapes = [(d, causal, s, -1, 0) for d in map(int, args.dims.split(",")) for causal in (False, True)
              for s in map(int, args.seqs.split(","))]
    shapes += [(128, True, 8192, 1024, 4)]  # window 1024 + 4 sink tokens: FlexAttention's case
    for d, causal, s, window, sinks in shapes:
        b, h = 16384 // s, 2048 // d
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v, dout = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
        for t in (q, k, v):
            t.requires_grad_()
        if window >= 0:
            peers = {"flashlite": flite(causal, (window, -1), sinks), "flex": flex(window, sinks)}
        else:
            peers = {"flashlite": flite(causal), "flash": sdpa(SDPBackend.FLASH_ATTENTION, causal),
                     "cudnn": sdpa(SDPBackend.CUDNN_ATTENTION, causal)}
        pairs = visible_pairs(s, causal, window, sinks)
        flops = 2.5 * 4 * b * h * pairs * d
        times = {n: [] for n in peers}
        grads = {}
        for _ in range(args.rounds):
            for n, fn in peers.items():
                t, grads[n] = time_backward(fn, q, k, v, dout, args.reps)
                times[n] += t
        ref = grads.get("flash", grads.get("flex"))
        diff = max((a.float() - r.float()).abs().max().item() for a, r in zip(grads["flashlite"], ref))
        row = {"head_dim": d, "causal": causal, "seq": s, "batch": b, "heads": h, "window": window,
               "sink_tokens": sinks, "max_abs_grad_diff": diff}
        for n, fn in peers.items():
            ms = statistics.median(times[n])
            fb_ms, peak = fwd_bwd_ms_and_peak(fn, q, k, v, dout)
            row[n] = {"bwd_ms": ms, "bwd_tflops": flops / ms / 1e9, "fwd_bwd_ms": fb_ms, "peak_mib": peak}
        res["rows"].append(row)
        print(f"D{d:<4} {'causal' if causal else 'full':6s} S{s:<6} w{window:<5} "
              + "  ".join(f"{n} {row[n]['bwd_tflops']:6.1f}" for n in peers) + f"  diff {diff:.3g}", flush=True)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
