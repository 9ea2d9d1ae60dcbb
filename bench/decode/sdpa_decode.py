"""Torch peers for the decode benchmark (GPU machine): SDPA backends with enable_gqa and a naive
matmul-softmax-matmul, on the shapes of decode_bench.cu (Hq=32, Hkv=8, D=128, bf16, q_len 1), same protocol:
inputs rotated over copies spanning >= 200 MB (4x the L2), CUDA events per call, median of --reps after warm-up;
"cold": a 512 MB read before each call (L2 and TLBs cold); "us_graph" (flash, cuDNN, efficient): per call, a CUDA
graph of N back-to-back calls on the rotated inputs, median replay / N (no host time, like decode_bench.cu's column).

    python3 bench/decode/sdpa_decode.py --out sdpa_decode.json [--reps 30]
"""
import argparse
import json

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # bench/
from tree_commit import tree_commit  # noqa: E402


def timed(fn, n_inputs, reps, before=None):
    """fn(i) runs on input copy i; returns (median, min) microseconds over reps calls cycling through the copies."""
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ms = []
    for r in range(reps + 3):
        if before:
            before()
        e0.record()
        fn(r % n_inputs)
        e1.record()
        e1.synchronize()
        if r >= 3:
            ms.append(e0.elapsed_time(e1))
    ms.sort()
    return ms[len(ms) // 2] * 1e3, ms[0] * 1e3


def graphed(fn, n_inputs, reps):
    """Per-call microseconds of a CUDA graph of max(n_inputs, 8) calls cycling through the copies (median replay)."""
    n = max(n_inputs, 8)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(2):
            fn(i % n_inputs)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(n):
            fn(i % n_inputs)
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ms = []
    for r in range(reps + 2):
        e0.record()
        g.replay()
        e1.record()
        e1.synchronize()
        if r >= 2:
            ms.append(e0.elapsed_time(e1))
    ms.sort()
    del g
    return ms[len(ms) // 2] * 1e3 / n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="sdpa_decode.json")
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    dev = torch.device("cuda")
    flush_buf = torch.ones(512 << 18, dtype=torch.float32, device=dev)  # 512 MB
    flush = lambda: flush_buf.sum()  # noqa: E731
    hq, hkv, d = 32, 8, 128
    rows = []
    backends = {
        "flash": SDPBackend.FLASH_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "math": SDPBackend.MATH,
    }
    for b in (1, 16, 64):
        for kv in (1024, 8192, 32768):
            kv_bytes = 2 * b * kv * hkv * d * 2
            copies = max(1, min(64, -(-(200 << 20) // kv_bytes)))
            qs = [torch.randn(b, hq, 1, d, device=dev, dtype=torch.bfloat16) for _ in range(copies)]
            # The cache as a decoder keeps it: [b, kv, hkv, d], viewed as [b, hkv, kv, d] for SDPA.
            ks = [torch.randn(b, kv, hkv, d, device=dev, dtype=torch.bfloat16).transpose(1, 2) for _ in range(copies)]
            vs = [torch.randn(b, kv, hkv, d, device=dev, dtype=torch.bfloat16).transpose(1, 2) for _ in range(copies)]
            ref = None
            for name, be in backends.items():
                if name == "math" and kv_bytes > (1 << 30):
                    continue

                def run(i):
                    return F.scaled_dot_product_attention(qs[i], ks[i], vs[i], enable_gqa=True)

                # The backend context is entered once, outside the timed calls (entering it per call costs tens of
                # microseconds of Python, which would not be SDPA's own cost).
                with sdpa_kernel(be):
                    try:
                        o = run(0)
                        torch.cuda.synchronize()
                    except Exception as e:  # backend refuses the shape / GQA
                        rows.append({"batch": b, "kv_len": kv, "peer": "sdpa_" + name, "error": str(e).split("\n")[0][:200]})
                        continue
                    if ref is None:
                        ref = o.float()
                    med, mn = timed(run, copies, args.reps)
                    row = {"batch": b, "kv_len": kv, "peer": "sdpa_" + name, "us_median": med, "us_min": mn,
                           "tbps": kv_bytes / (med * 1e-6) / 1e12, "copies": copies,
                           "max_abs_vs_first": float((o.float() - ref).abs().max())}
                    if name in ("flash", "cudnn"):
                        row["us_cold"] = timed(lambda i: run(0), 1, args.reps // 2, before=flush)[0]
                    if name != "math":
                        try:
                            row["us_graph"] = graphed(run, copies, max(5, args.reps // 3))
                            row["tbps_graph"] = kv_bytes / (row["us_graph"] * 1e-6) / 1e12
                        except Exception as e:  # capture refused
                            row["graph_error"] = str(e).split("\n")[0][:200]
                rows.append(row)
            if kv_bytes <= (2 << 30):  # naive: repeat K/V per q head, matmul, softmax, matmul
                def naive(i):
                    kr = ks[i].repeat_interleave(hq // hkv, dim=1)
                    vr = vs[i].repeat_interleave(hq // hkv, dim=1)
                    s = (qs[i] @ kr.transpose(-1, -2)).float() * d ** -0.5
                    return s.softmax(-1).to(torch.bfloat16) @ vr

                med, mn = timed(naive, copies, max(5, args.reps // 3))
                rows.append({"batch": b, "kv_len": kv, "peer": "naive", "us_median": med, "us_min": mn,
                             "tbps": kv_bytes / (med * 1e-6) / 1e12, "copies": copies})
            for r in rows[-6:]:
                if r.get("batch") == b and r.get("kv_len") == kv:
                    print(r, flush=True)
            del qs, ks, vs, ref
            torch.cuda.empty_cache()
    json.dump({"device": torch.cuda.get_device_name(), "commit": tree_commit(), "torch": torch.__version__, "rows": rows},
              open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
