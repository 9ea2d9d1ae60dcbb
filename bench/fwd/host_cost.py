"""Host time of one forward attention call from Python, flashlite's entry points beside torch SDPA's, on the same
tensors in one process: CUDA bf16 B1 S128 H16 D128 when a GPU is present, else CPU fp32 B1 S16 H2 D64.

Each path is called N times back to back (no sync inside the loop) and timed with perf_counter; on CUDA the device is
synchronised before the loop (host_us: the loop's time per call) and again after it (wall_us: loop and drain). The
shape is tiny, so the GPU finishes each kernel before the host has queued the next: the queue never fills and never
stalls the loop, so host_us is the host cost alone (wall_us close to host_us confirms it). Paths are interleaved in
rounds and each reports the minimum (and median) over rounds, so background load hits all of them alike.

Paths: eager_no_grad (flashlite.attention), eager_grad (the same on inputs that require grad: forward only, the graph
is dropped), op and op_grad (torch.ops.flashlite.attention, the custom op as torch.compile's graphs call it, on the
same two kinds of input), sdpa_dropin (flashlite.torch.scaled_dot_product_attention on [B, H, S, D] views), torch_sdpa
and torch_sdpa_grad (torch.nn.functional.scaled_dot_product_attention: the target), native (flashlite._C.forward on
DLPack capsules of q, k, v and a preallocated out, no LSE: the C++ call alone -- validation, planning and the kernel
launch or, on CPU, the kernel -- which the flashlite paths' python_us subtract).

    python bench/fwd/host_cost.py --out host_cost.json
"""
import argparse
import json
import pathlib
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import flashlite
import flashlite.torch as fltorch
from flashlite import _C

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # bench/
from tree_commit import tree_commit  # noqa: E402


def paths(device, dtype, shape):
    b, s, h, d = shape
    g = torch.Generator(device="cpu").manual_seed(0)
    q, k, v = (torch.randn(b, s, h, d, generator=g).to(device=device, dtype=dtype) for _ in range(3))  # (b, s, h, d)
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    qs, ks, vs = (t.transpose(1, 2) for t in (q, k, v))  # SDPA's (b, h, s, d) views
    qsg, ksg, vsg = (t.transpose(1, 2) for t in (qg, kg, vg))
    out = torch.empty_like(q)
    stream = torch.cuda.current_stream().cuda_stream if device == "cuda" else 0
    dl = torch.utils.dlpack.to_dlpack
    op = torch.ops.flashlite.attention

    def native():
        _C.forward(dl(q), dl(k), dl(v), dl(out), None, None, None, None, causal=False, scale=None, window_left=-1,
                   window_right=-1, sink_tokens=0, softcap=0.0, backend="auto", stream=stream)

    torch.testing.assert_close(flashlite.attention(q, k, v).float(), F.scaled_dot_product_attention(qs, ks, vs)
                               .transpose(1, 2).float(), atol=2e-2, rtol=2e-2)
    return {
        "eager_no_grad": lambda: flashlite.attention(q, k, v),
        "eager_grad": lambda: flashlite.attention(qg, kg, vg),
        "op": lambda: op(q, k, v, None, None, None, False, None, -1, -1, 0, 0.0, "auto"),
        "op_grad": lambda: op(qg, kg, vg, None, None, None, False, None, -1, -1, 0, 0.0, "auto"),
        "sdpa_dropin": lambda: fltorch.scaled_dot_product_attention(qs, ks, vs),
        "torch_sdpa": lambda: F.scaled_dot_product_attention(qs, ks, vs),
        "torch_sdpa_grad": lambda: F.scaled_dot_product_attention(qsg, ksg, vsg),
        "native": native,
    }


def time_calls(fn, calls, sync):
    """(host seconds, wall seconds) of `calls` back-to-back calls."""
    sync()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    sync()
    return t1 - t0, time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=1000, help="back-to-back calls per path and round")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--out", default="host_cost.json")
    args = ap.parse_args()
    if torch.cuda.is_available():
        device, dtype, shape = "cuda", torch.bfloat16, (1, 128, 16, 128)
        device_name, sync = torch.cuda.get_device_name(), torch.cuda.synchronize
    else:
        device, dtype, shape = "cpu", torch.float32, (1, 16, 2, 64)
        device_name, sync = f"cpu ({torch.get_num_threads()} torch threads)", lambda: None
    fns = paths(device, dtype, shape)
    for fn in fns.values():  # warm-up: allocator pools, lazy initialisation, the first-call paths
        time_calls(fn, 50, sync)
    host = {name: [] for name in fns}
    wall = {name: [] for name in fns}
    for _ in range(args.rounds):
        for name, fn in fns.items():
            h, w = time_calls(fn, args.calls, sync)
            host[name].append(h / args.calls * 1e6)
            wall[name].append(w / args.calls * 1e6)
    rows = {name: {"host_us": round(min(host[name]), 2), "host_us_median": round(statistics.median(host[name]), 2),
                   "wall_us": round(min(wall[name]), 2)} for name in fns}
    for name in ("eager_no_grad", "eager_grad", "op", "op_grad", "sdpa_dropin"):
        rows[name]["python_us"] = round(rows[name]["host_us"] - rows["native"]["host_us"], 2)
    res = {"device": device_name, "torch": torch.__version__, "commit": tree_commit(), "dtype": str(dtype)[6:],
           "shape_bshd": list(shape), "calls": args.calls, "rounds": args.rounds, "protocol": __doc__.split("\n\n")[1],
           "paths": rows}
    print(f"{device_name}, torch {torch.__version__}, {res['dtype']} B{shape[0]} S{shape[1]} H{shape[2]} D{shape[3]}")
    print(f"{'path':16} {'host us':>8} {'median':>8} {'wall us':>8} {'python us':>10}")
    for name, r in rows.items():
        print(f"{name:16} {r['host_us']:8.2f} {r['host_us_median']:8.2f} {r['wall_us']:8.2f} "
              f"{r.get('python_us', ''):>10}")
    pathlib.Path(args.out).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
