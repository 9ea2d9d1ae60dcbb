"""flashlite's fused forward (backend cuda, through a ctypes C entry point, or with --torch-op through
flashlite.attention on the torch tensors, as a user calls it) against torch SDPA's FLASH_ATTENTION and
CUDNN_ATTENTION backends in ONE process on the SAME tensors: bf16, batch*seq = 16384 tokens, heads*head_dim = 2048.

The backends are interleaved in rounds (each round times every backend for --reps calls with CUDA events, inputs
rotated over two sets), so clock or thermal drift hits all of them alike; the result per backend is the median over
all calls, and the spread is the range of the per-round medians. Outputs are compared (flashlite vs flash) before
timing. Writes JSON (--out) and prints the table.

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
    ap.add_argument("--tile-grid", action="store_true",
                    help="also time the persistent kernel launched with one CTA per work tile")
    args = ap.parse_args()
    lib = load(args.lib)
    if args.torch_op:
        import flashlite
    stream = torch.cuda.current_stream().cuda_stream
    res = {"device": torch.cuda.get_device_name(), "commit": tree_commit(), "torch": torch.__version__, "protocol": __doc__.strip().split("\n\n")[1],
           "flashlite_entry": "flashlite.attention (torch op)" if args.torch_op else "C API (ctypes)",
           "rounds": args.rounds, "reps_per_round": args.reps, "rows": []}
    print(res["device"], flush=True)
    for d in map(int, args.dims.split(",")):
        for causal in (False, True):
            for s in map(int, args.seqs.split(",")):
                b, h = 16384 // s, 2048 // d
                # flashlite layout (batch, seq, heads, head_dim); SDPA gets the (batch, heads, seq, head_dim) views.
                sets = [[torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3)] for _ in range(2)]
                out = torch.empty(b, s, h, d, device="cuda", dtype=torch.bfloat16)
                lse = torch.empty(b, h, s, device="cuda", dtype=torch.float32)

                def ours(i, ctas=0):
                    q, k, v = sets[i]
                    rc = lib.fl_forward(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr(), 2, b, s, s,
                                        h, h, d, int(causal), -1, 0, ctas, stream)
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

                fns = {"flashlite": op if args.torch_op else ours, "sdpa_flash": sdpa(SDPBackend.FLASH_ATTENTION),
                       "sdpa_cudnn": sdpa(SDPBackend.CUDNN_ATTENTION)}
                if args.tile_grid:  # the Hopper kernel with one CTA per work tile (no tile loop): the persistent grid's A/B
                    fns["flashlite_tile_grid"] = lambda i: ours(i, ctas=1 << 30)
                got = fns["flashlite"](0)
                got = out if got is None else got
                ref = fns["sdpa_flash"](0).transpose(1, 2)
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
                row = {"seq": s, "batch": b, "heads": h, "head_dim": d, "causal": causal,
                       "rel_diff_vs_flash": round(float(diff), 5)}
                for name in fns:
                    us = statistics.median(times[name])
                    row[name] = {"us": round(us, 2), "tflops": round(flops / (us * 1e-6) / 1e12, 1),
                                 "round_tflops_min": round(flops / (max(medians[name]) * 1e-6) / 1e12, 1),
                                 "round_tflops_max": round(flops / (min(medians[name]) * 1e-6) / 1e12, 1)}
                row["ratio_vs_flash"] = round(row["sdpa_flash"]["us"] / row["flashlite"]["us"], 3)
                row["ratio_vs_cudnn"] = round(row["sdpa_cudnn"]["us"] / row["flashlite"]["us"], 3)
                if args.tile_grid:
                    row["ratio_vs_tile_grid"] = round(row["flashlite_tile_grid"]["us"] / row["flashlite"]["us"], 3)
                res["rows"].append(row)
                f, fl, cu = row["flashlite"], row["sdpa_flash"], row["sdpa_cudnn"]
                print(f"D{d:<4} {'causal' if causal else 'full':7} S{s:<6} ours {f['tflops']:6.1f} "
                      f"[{f['round_tflops_min']:.0f}-{f['round_tflops_max']:.0f}]  flash {fl['tflops']:6.1f} "
                      f"[{fl['round_tflops_min']:.0f}-{fl['round_tflops_max']:.0f}]  cudnn {cu['tflops']:6.1f}  "
                      f"x flash {row['ratio_vs_flash']:.3f}  x cudnn {row['ratio_vs_cudnn']:.3f}  diff {row['rel_diff_vs_flash']}"
                      + (f"  x tile grid {row['ratio_vs_tile_grid']:.3f}" if args.tile_grid else ""),
                      flush=True)
                del sets, out, lse
    with open(args.out, "w") as fh:
        json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
