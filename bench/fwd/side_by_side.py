"""flashlite's fused forward (backend cuda, through a ctypes C entry point, or with --torch-op through
flashlite.attention on the torch tensors, as a user calls it) against torch SDPA's FLASH_ATTENTION and
CUDNN_ATTENTION backends in ONE process on the SAME tensors: bf16, batch*seq = 16384 tokens, heads*head_dim = 2048.

The backends are interleaved in rounds (each round times every backend for --reps calls with CUDA events, inputs
rotated over two sets), so clock or thermal drift hits all of them alike; the result per backend is the median over
all calls, and the spread is the range of the per-round medians. Outputs are compared (flashlite vs flash) before
timing. Writes JSON (--out) and prints the table.
--baseline-lib times the same C entry point of another build beside --lib's (an A/B of a kernel change, as
"baseline"); --window-sinks adds the row of a causal window of 1024 keys with 4 sink tokens at D128 S 8192 against
FlexAttention instead of SDPA, its FLOPs counted by the visible pairs.

    python3 bench/fwd/side_by_side.py --lib build/lib/libflashlite_fwd_capi.so --out sbs.json
"""
import argparse
import ctypes
import json
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # bench/
from tree_commit import tree_commit  # noqa: E402
from window_sinks import flex, visible_pairs  # noqa: E402


def load(path):
    lib = ctypes.CDLL(path)
    lib.fl_forward.restype = ctypes.c_int
    lib.fl_forward.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_void_p] + [ctypes.c_int] * 11 + [ctypes.c_void_p]
    lib.fl_last_error.restype = ctypes.c_char_p
    return lib


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--seqs", default="512,1024,2048,4096,8192,16384")
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out", default="side_by_side.json")
    ap.add_argument("--torch-op", action="store_true",
                    help="time flashlite.attention on the torch tensors (the Python op, host cost included)")
    ap.add_argument("--baseline-lib", help="the same C entry point of another build, timed beside --lib's")
    ap.add_argument("--window-sinks", action="store_true",
                    help="also the causal window 1024 + 4 sink tokens row (D128 S 8192) against FlexAttention")
    ap.add_argument("--tile-grid", action="store_true",
                    help="also time the persistent kernel launched with one CTA per work tile")
    args = ap.parse_args()
    lib = load(args.lib)
    base = load(args.baseline_lib) if args.baseline_lib else None
    if args.torch_op:
        import flashlite
    stream = torch.cuda.current_stream().cuda_stream
    res = {"device": torch.cuda.get_device_name(), "commit": tree_commit(), "torch": torch.__version__, "protocol": __doc__.strip().split("\n\n")[1],
           "flashlite_entry": "flashlite.attention (torch op)" if args.torch_op else "C API (ctypes)",
           "rounds": args.rounds, "reps_per_round": args.reps, "rows": []}
    print(res["device"], flush=True)
    shapes = [(d, causal, s, -1, 0) for d in map(int, args.dims.split(",")) for causal in (False, True)
              for s in map(int, args.seqs.split(","))]
    if args.window_sinks:
        shapes.append((128, True, 8192, 1024, 4))
    for d, causal, s, window, sinks in shapes:
        b, h = 16384 // s, 2048 // d
        # flashlite layout (batch, seq, heads, head_dim); SDPA gets the (batch, heads, seq, head_dim) views.
        sets = [[torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3)] for _ in range(2)]
        out = torch.empty(b, s, h, d, device="cuda", dtype=torch.bfloat16)
        lse = torch.empty(b, h, s, device="cuda", dtype=torch.float32)

        def ours(i, ctas=0, lib=lib):
            q, k, v = sets[i]
            rc = lib.fl_forward(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr(), 2, b, s, s,
                                h, h, d, int(causal), window, sinks, ctas, stream)
            if rc != 0:
                raise RuntimeError(lib.fl_last_error().decode())

        def sdpa(backend):
            def run(i):
                q, k, v = (x.transpose(1, 2) for x in sets[i])
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            return run

        def op(i):
            q, k, v = sets[i]
            return flashlite.attention(q, k, v, causal=causal)

        if window >= 0:  # FlexAttention is the peer that takes a window with sink tokens
            flex_fn = flex(window, sinks)
            fns = {"flashlite": ours, "flex": lambda i: flex_fn(*sets[i])}
        else:
            fns = {"flashlite": op if args.torch_op else ours, "sdpa_flash": sdpa(SDPBackend.FLASH_ATTENTION),
                   "sdpa_cudnn": sdpa(SDPBackend.CUDNN_ATTENTION)}
        if base is not None:
            fns["baseline"] = lambda i: ours(i, lib=base)
        if args.tile_grid:  # the Hopper kernel with one CTA per work tile (no tile loop): the persistent grid's A/B
            fns["flashlite_tile_grid"] = lambda i: ours(i, ctas=1 << 30)
        got = fns["flashlite"](0)
        got = (out if got is None else got).clone()
        ref = fns["flex"](0) if window >= 0 else fns["sdpa_flash"](0).transpose(1, 2)
        torch.cuda.synchronize()
        diff = (got.float() - ref.float()).norm() / ref.float().norm()
        times = {k: [] for k in fns}
        medians = {k: [] for k in fns}
        for name, fn in fns.items():  # warm-up
            for i in range(3):
                fn(i % 2)
        for _ in range(args.rounds):
            for name, fn in fns.items():
                ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(args.reps)]
                for i, (e0, e1) in enumerate(ev):
                    e0.record()
                    fn(i % 2)
                    e1.record()
                torch.cuda.synchronize()
                t = [e0.elapsed_time(e1) * 1e3 for e0, e1 in ev]
                times[name] += t
                medians[name].append(statistics.median(t))
        flops = 4 * b * h * s * s * d * (0.5 if causal else 1.0)
        if window >= 0:
            flops = 4 * b * h * visible_pairs(s, causal, window, sinks) * d
        row = {"seq": s, "batch": b, "heads": h, "head_dim": d, "causal": causal,
               "rel_diff_vs_flash" if window < 0 else "rel_diff_vs_flex": round(float(diff), 5)}
        if window >= 0:
            row |= {"window": window, "sink_tokens": sinks}
        for name in fns:
            us = statistics.median(times[name])
            row[name] = {"us": round(us, 2), "tflops": round(flops / (us * 1e-6) / 1e12, 1),
                         "round_tflops_min": round(flops / (max(medians[name]) * 1e-6) / 1e12, 1),
                         "round_tflops_max": round(flops / (min(medians[name]) * 1e-6) / 1e12, 1)}
        for peer in ("sdpa_flash", "sdpa_cudnn", "flex", "baseline"):
            if peer in fns:
                key = "ratio_vs_" + peer.removeprefix("sdpa_")
                row[key] = round(row[peer]["us"] / row["flashlite"]["us"], 3)
        if args.tile_grid:
            row["ratio_vs_tile_grid"] = round(row["flashlite_tile_grid"]["us"] / row["flashlite"]["us"], 3)
        res["rows"].append(row)
        f = row["flashlite"]
        shape = f"D{d:<4} {'causal' if causal else 'full':7} S{s:<6}" + (f" w{window}+{sinks}" if window >= 0 else "")
        print(f"{shape} ours {f['tflops']:6.1f} [{f['round_tflops_min']:.0f}-{f['round_tflops_max']:.0f}]  "
              + "  ".join(f"{n} {row[n]['tflops']:6.1f}" for n in fns if n != "flashlite")
              + "  " + "  ".join(f"{k.removeprefix('ratio_')} {v:.3f}" for k, v in row.items()
                                 if k.startswith("ratio_"))
              + f"  diff {float(diff):.3g}", flush=True)
        del sets, out, lse
    with open(args.out, "w") as fh:
        json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
