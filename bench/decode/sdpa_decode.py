"""Torch peers for the decode benchmark (GPU machine): SDPA backends with enable_gqa and a naive
matmul-softmax-matmul, on the shapes of decode_bench.cu (Hq=32, Hkv=8, D=128, bf16, q_len 1), same protocol:
a 512 MB read between timed calls (K/V from HBM), CUDA events, median of --reps calls after warm-up.

    python3 bench/decode/sdpa_decode.py --out sdpa_decode.json [--reps 30]
"""
import argparse
import json

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def timed(fn, flush, reps):
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ms = []
    for r in range(reps + 3):
        flush()
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        if r >= 3:
            ms.append(e0.elapsed_time(e1))
    ms.sort()
    return ms[len(ms) // 2] * 1e3, ms[0] * 1e3


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
            q = torch.randn(b, hq, 1, d, device=dev, dtype=torch.bfloat16)
            # The cache as a decoder keeps it: [b, kv, hkv, d], viewed as [b, hkv, kv, d] for SDPA.
            k = torch.randn(b, kv, hkv, d, device=dev, dtype=torch.bfloat16).transpose(1, 2)
            v = torch.randn(b, kv, hkv, d, device=dev, dtype=torch.bfloat16).transpose(1, 2)
            kv_bytes = 2 * b * kv * hkv * d * 2
            ref = None
            for name, be in backends.items():
                if name == "math" and kv_bytes > (2 << 30):
                    continue

                def run(be=be):
                    with sdpa_kernel(be):
                        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

                try:
                    o = run()
                    torch.cuda.synchronize()
                except Exception as e:  # backend refuses the shape / GQA
                    rows.append({"batch": b, "kv_len": kv, "peer": "sdpa_" + name, "error": str(e).split("\n")[0][:200]})
                    continue
                if ref is None:
                    ref = o.float()
                med, mn = timed(run, flush, args.reps)
                rows.append({"batch": b, "kv_len": kv, "peer": "sdpa_" + name, "us_median": med, "us_min": mn,
                             "tbps": kv_bytes / (med * 1e-6) / 1e12,
                             "max_abs_vs_first": float((o.float() - ref).abs().max())})
            if kv_bytes <= (2 << 30):  # naive: repeat K/V per q head, matmul, softmax, matmul
                def naive():
                    kr = k.repeat_interleave(hq // hkv, dim=1)
                    vr = v.repeat_interleave(hq // hkv, dim=1)
                    s = (q @ kr.transpose(-1, -2)).float() * d ** -0.5
                    return s.softmax(-1).to(q.dtype) @ vr

                med, mn = timed(naive, flush, args.reps)
                rows.append({"batch": b, "kv_len": kv, "peer": "naive", "us_median": med, "us_min": mn,
                             "tbps": kv_bytes / (med * 1e-6) / 1e12})
            for r in rows[-6:]:
                if r.get("batch") == b and r.get("kv_len") == kv:
                    print(r, flush=True)
            del q, k, v, ref
            torch.cuda.empty_cache()
    json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows},
              open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
