#!/usr/bin/env python3
"""Side-by-side attention benchmark on one GPU, in one process, on the same tensors: flashlite's backends (fused
`cuda`, split-kernel `naive`) through the Python package against torch SDPA's FLASH_ATTENTION, CUDNN_ATTENTION and
EFFICIENT_ATTENTION backends, FlexAttention (window + sink rows) and a naive torch matmul-softmax-matmul.

Protocol (docs: ../shared/DESIGN.md): CUDA events around each call, warm-up first, median of >= 20 timed calls,
inputs rotated over enough sets that the L2 cache cannot hold them; TFLOP/s = 4 B H Sq Sk D (halved for causal;
window rows count the visible pairs), microseconds, the ratio to the best peer (best peer time / this time: > 1 is
faster), peak memory (torch.cuda.max_memory_allocated around one call, minus what was allocated before it). The
same run measures the ceilings: a bf16 8192^3 matmul and a device-to-device copy. Each flashlite output is checked
against a peer before timing (relative error in the JSON).

    python3 bench/attention.py --out results.json --plots DIR [--quick] [--commit ID]
"""
import argparse
import datetime
import functools
import json
import math
import os
import statistics
import subprocess
import sys

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashlite

DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
PEERS = ("sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "flex", "torch_naive")
SDPA_BACKENDS = {"sdpa_flash": SDPBackend.FLASH_ATTENTION, "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION,
                 "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION}


# ------------------------------------------------------------------ shapes

def configs(quick):
    rows = []
    seqs = (1024, 4096) if quick else (512, 1024, 2048, 4096, 8192, 16384)
    for d in (64, 128):  # the reference shapes: batch * seq = 16384 tokens, heads * head_dim = 2048
        for causal in (False, True):
            for s in seqs:
                rows.append(dict(group="reference", batch=16384 // s, heads=2048 // d, seq=s, head_dim=d,
                                 dtype="bf16", causal=causal))
    for s in ((512,) if quick else (128, 512, 1024)):  # the seeds' shapes
        rows.append(dict(group="seed", batch=1, heads=8, seq=s, head_dim=64, dtype="fp32", causal=False))
    rows.append(dict(group="seed", batch=1, heads=32, seq=2048, head_dim=64, dtype="fp16", causal=True))
    for s in ((4096,) if quick else (4096, 16384)):  # sliding window + sink tokens (StreamingLLM / gpt-oss style)
        rows.append(dict(group="window_sinks", batch=16384 // s, heads=16, seq=s, head_dim=128, dtype="bf16",
                         causal=True, window=1024, sinks=4))
    return rows


def visible_pairs(c):
    s = c["seq"]
    if "window" in c:
        i = np.arange(s, dtype=np.int64)
        win = np.minimum(i, c["window"]) + 1  # keys i - window .. i
        sinks = np.clip(i - c["window"], 0, c["sinks"])  # sink keys below the window
        return int((win + sinks).sum())
    return s * s // 2 if c["causal"] else s * s  # DESIGN.md: causal counts half


def mask_bool(c, device):
    """[S, S] visibility for the naive torch path (None when nothing is masked)."""
    s = c["seq"]
    if not c["causal"] and "window" not in c:
        return None
    i = torch.arange(s, device=device)[:, None]
    j = torch.arange(s, device=device)[None, :]
    vis = j <= i
    if "window" in c:
        vis = vis & ((j >= i - c["window"]) | (j < c["sinks"]))
    return vis


# ------------------------------------------------------------------ backends

def flashlite_fn(c, backend):
    kw = dict(causal=c["causal"], backend=backend)
    if "window" in c:
        kw.update(window=(c["window"], -1), sink_tokens=c["sinks"])
    return lambda q, k, v, qt, kt, vt: flashlite.attention(q, k, v, **kw)


def sdpa_fn(c, name):
    if "window" in c:
        return None  # SDPA's fused backends take no window/sink mask
    backend = SDPA_BACKENDS[name]

    def run(q, k, v, qt, kt, vt):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=c["causal"])
    return run


def flex_fn(c):
    if "window" not in c:
        return None
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    w, sinks = c["window"], c["sinks"]

    def mask_mod(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & ((q_idx - kv_idx <= w) | (kv_idx < sinks))

    block_mask = create_block_mask(mask_mod, None, None, c["seq"], c["seq"], device="cuda")
    compiled = torch.compile(flex_attention, dynamic=False)
    return lambda q, k, v, qt, kt, vt: compiled(qt, kt, vt, block_mask=block_mask)


def torch_naive_fn(c):
    mask = mask_bool(c, "cuda")
    scale = 1.0 / math.sqrt(c["head_dim"])

    def run(q, k, v, qt, kt, vt):
        s = torch.matmul(qt, kt.transpose(-2, -1)) * scale
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        p = torch.softmax(s.float(), dim=-1).to(qt.dtype)
        return torch.matmul(p, vt)
    return run


def naive_bytes(c, elem):
    return c["batch"] * c["heads"] * c["seq"] ** 2 * elem


# ------------------------------------------------------------------ measuring

def l2_bytes():
    return getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 << 20) or (50 << 20)


def input_sets(c):
    """Enough (q, k, v) sets in flashlite's [B, S, H, D] layout that rotating through them overflows L2 twice;
    SDPA, flex and the naive path get the [B, H, S, D] transposed views of the same tensors."""
    dtype = DT[c["dtype"]]
    shape = (c["batch"], c["seq"], c["heads"], c["head_dim"])
    set_bytes = 3 * math.prod(shape) * dtype.itemsize
    n = min(max(2, math.ceil(2 * l2_bytes() / set_bytes) + 1), 512)
    sets = []
    for _ in range(n):
        q, k, v = (torch.randn(shape, device="cuda", dtype=dtype) for _ in range(3))
        sets.append((q, k, v, q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)))
    return sets


def time_fn(fn, sets, warmup, reps):
    for i in range(warmup):
        fn(*sets[i % len(sets)])
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for i, (e0, e1) in enumerate(ev):
        args = sets[(warmup + i) % len(sets)]
        e0.record()
        fn(*args)
        e1.record()
    torch.cuda.synchronize()
    return [e0.elapsed_time(e1) * 1e3 for e0, e1 in ev]  # microseconds


def peak_memory(fn, args):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = fn(*args)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del out
    return int(peak)


def as_bshd(out, name):
    return out if name.startswith("flashlite") else out.transpose(1, 2)


def count_kernels(fn, args):
    """CUDA kernels one call launches (torch profiler; None where it cannot tell)."""
    try:
        from torch.profiler import ProfilerActivity, profile
        fn(*args)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn(*args)
            torch.cuda.synchronize()
        names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                 and not e.name.lower().startswith(("memcpy", "memset"))]
        return len(names), sorted(set(names))
    except Exception as e:  # noqa: BLE001 -- the profiler is optional evidence
        return None, [f"profiler failed: {e}"]


def ceilings(reps):
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    t = statistics.median(time_fn(functools.partial(torch.matmul, a, b), [()], 3, reps))
    mm = 2 * 8192 ** 3 / (t * 1e-6) / 1e12
    del a, b
    n = 1 << 30  # 1 GiB each way
    x = torch.empty(n, dtype=torch.uint8, device="cuda").random_(0, 255)
    y = torch.empty_like(x)
    t = statistics.median(time_fn(functools.partial(y.copy_, x), [()], 3, reps))
    bw = 2 * n / (t * 1e-6) / 1e12
    del x, y
    torch.cuda.empty_cache()
    return {"matmul_bf16_8192_tflops": round(mm, 1), "copy_tbps_read_plus_write": round(bw, 3)}


def versions():
    drv = "unknown"
    try:
        drv = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[0]
    except Exception:  # noqa: BLE001
        pass
    p = torch.cuda.get_device_properties(0)
    return {"device": torch.cuda.get_device_name(0), "sm_count": p.multi_processor_count,
            "compute_capability": f"{p.major}.{p.minor}", "memory_gib": round(p.total_memory / 2 ** 30, 1),
            "l2_bytes": l2_bytes(), "driver": drv, "torch": torch.__version__, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(), "flashlite": flashlite.__version__,
            "python": sys.version.split()[0]}


def commit_id(arg):
    if arg:
        return arg
    try:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        return subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip() or "unknown"
    except Exception:  # noqa: BLE001
        return "unknown"


# ------------------------------------------------------------------ main

def run_config(c, args, free_bytes):
    sets = input_sets(c)
    fns = {"flashlite_cuda": flashlite_fn(c, "cuda"), "flashlite_naive": flashlite_fn(c, "naive")}
    for name in SDPA_BACKENDS:
        fns[name] = sdpa_fn(c, name)
    try:
        fns["flex"] = flex_fn(c) if not args.no_flex else None
    except Exception as e:  # noqa: BLE001 -- no FlexAttention in this torch
        fns["flex"] = e
    fns["torch_naive"] = torch_naive_fn(c)
    # S x S buffers: flashlite naive keeps fp32 scores; torch's naive path holds scores, their fp32 softmax and P.
    limits = {"flashlite_naive": naive_bytes(c, 4), "torch_naive": naive_bytes(c, 2 + 4 + 4 + DT[c["dtype"]].itemsize)}
    flops = 4 * c["batch"] * c["heads"] * visible_pairs(c) * c["head_dim"]
    rows = []
    for name, fn in fns.items():
        row = dict(c, backend=name)
        if fn is None:
            continue
        if isinstance(fn, Exception):
            rows.append(dict(row, status=f"unsupported: {type(fn).__name__}: {str(fn).splitlines()[0][:160]}"))
            continue
        if name in limits and limits[name] > min(free_bytes * 0.8, args.max_naive_gb * 2 ** 30):
            row.update(status=f"skipped: its S x S buffers need {limits[name] / 2 ** 30:.1f} GiB")
            rows.append(row)
            continue
        try:
            row["_out"] = as_bshd(fn(*sets[0]), name).float()  # first call: also compiles flex, outside the timing
            torch.cuda.synchronize()
            t = time_fn(fn, sets, args.warmup, args.reps)
            us = statistics.median(t)
            row.update(status="ok", us=round(us, 2), tflops=round(flops / (us * 1e-6) / 1e12, 2),
                       us_p10=round(float(np.percentile(t, 10)), 2), us_p90=round(float(np.percentile(t, 90)), 2),
                       reps=len(t), peak_mem_bytes=peak_memory(fn, sets[0]))
        except Exception as e:  # noqa: BLE001 -- an unsupported combination is a result too
            row.update(status=f"unsupported: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
        rows.append(row)
        torch.cuda.empty_cache()
    # Correctness of each result against the first peer that ran (flash, else cuDNN/efficient, else naive torch).
    peer_ref = next((r["_out"] for r in rows if r["backend"] in PEERS and "_out" in r), None)
    for r in rows:
        out = r.pop("_out", None)
        if out is not None and peer_ref is not None and r["backend"] not in ("torch_naive",):
            r["rel_err_vs_peer"] = round(float((out - peer_ref).norm() / peer_ref.norm()), 5)
    best_peer = min((r["us"] for r in rows if r["backend"] in PEERS and r["status"] == "ok"), default=None)
    for r in rows:
        if best_peer and r["status"] == "ok":
            r["ratio_to_best_peer"] = round(best_peer / r["us"], 3)
    r_naive = next((r for r in rows if r["backend"] == "torch_naive" and r["status"] == "ok"), None)
    for r in rows:
        if r_naive and r["status"] == "ok":
            r["speedup_vs_torch_naive"] = round(r_naive["us"] / r["us"], 2)
    for r in rows:
        r["flops"] = flops
        r["input_sets"] = len(sets)
    del sets
    torch.cuda.empty_cache()
    return rows


def label(c):
    extra = f" win{c['window']}+{c['sinks']}sinks" if "window" in c else ""
    return (f"{c['group']:12} {c['dtype']} B{c['batch']} H{c['heads']} S{c['seq']} D{c['head_dim']}"
            f"{' causal' if c['causal'] else ''}{extra}")


def print_rows(rows):
    print(f"  {'backend':16} {'us':>11} {'TFLOP/s':>8} {'x best peer':>11} {'x naive':>8} {'peak MiB':>9} "
          f"{'err vs peer':>11}")
    for r in rows:
        if r["status"] != "ok":
            print(f"  {r['backend']:16} {r['status']}")
            continue
        print(f"  {r['backend']:16} {r['us']:11.1f} {r['tflops']:8.1f} {r.get('ratio_to_best_peer', 0):11.3f} "
              f"{r.get('speedup_vs_torch_naive', 0):8.2f} {r['peak_mem_bytes'] / 2 ** 20:9.1f} "
              f"{r.get('rel_err_vs_peer', float('nan')):11.2e}")
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="attention.json")
    ap.add_argument("--plots", default=None, help="folder for the PNG plots (needs matplotlib)")
    ap.add_argument("--commit", default=None)
    ap.add_argument("--quick", action="store_true", help="a few shapes only (S 1024 and 4096)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--max-naive-gb", type=float, default=60.0, help="skip naive paths whose S x S buffers exceed this")
    ap.add_argument("--no-flex", action="store_true")
    args = ap.parse_args()
    assert args.reps >= 20, "the protocol takes the median of at least 20 calls"
    torch.manual_seed(0)
    info = versions()
    print(f"{info['device']} ({info['sm_count']} SMs, driver {info['driver']}), torch {info['torch']}, cuDNN "
          f"{info['cudnn']}, flashlite {info['flashlite']}", flush=True)
    ceil = ceilings(args.reps)
    print(f"ceilings: bf16 matmul 8192^3 {ceil['matmul_bf16_8192_tflops']} TFLOP/s, device copy "
          f"{ceil['copy_tbps_read_plus_write']} TB/s (read + write)", flush=True)
    result = dict(info, commit=commit_id(args.commit), date=datetime.datetime.now(datetime.timezone.utc).isoformat(),
                  ceilings=ceil, protocol=__doc__.split("\n\n")[1].replace("\n", " "), quick=args.quick,
                  rows=[], kernels_per_call={})
    # Kernel launches per call on one shape (the seeds count 15 per attention layer on the PyTorch path).
    kc = dict(group="kernels", batch=1, heads=32, seq=2048, head_dim=64, dtype="fp16", causal=True)
    ks = input_sets(dict(kc))[:1]
    for name, fn in (("flashlite_cuda", flashlite_fn(kc, "cuda")), ("flashlite_naive", flashlite_fn(kc, "naive")),
                     ("sdpa_flash", sdpa_fn(kc, "sdpa_flash")), ("torch_naive", torch_naive_fn(kc))):
        n, names = count_kernels(fn, ks[0])
        result["kernels_per_call"][name] = {"kernels": n, "names": names[:12]}
        print(f"kernels per call, {name}: {n}", flush=True)
    del ks
    free = torch.cuda.mem_get_info()[0]
    for c in configs(args.quick):
        print(label(c), flush=True)
        rows = run_config(c, args, free)
        print_rows(rows)
        result["rows"] += rows
        with open(args.out, "w") as fh:  # written after every shape: a cut-off run keeps what it measured
            json.dump(result, fh, indent=1)
    if args.plots:
        try:
            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
            from plot_attention import plot_all
            for path in plot_all(result, args.plots):
                print("plot:", path)
        except ImportError as e:
            print(f"plots skipped: {e}")


if __name__ == "__main__":
    main()
