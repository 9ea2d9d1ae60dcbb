"""The backward pass side by side: flashlite (through its torch op, as a user's autograd calls it) against torch SDPA's
FLASH_ATTENTION and CUDNN_ATTENTION backends and FlexAttention (window + sink tokens), in ONE process on the SAME
tensors: bf16, batch*seq = 16384 tokens, heads*head_dim = 2048, GQA off.

Each backend runs its forward once with autograd, then its backward alone is timed with CUDA events:
torch.autograd.grad(out, (q, k, v), dout, retain_graph=True), queued behind a 2 ms GPU sleep so that the time is the
GPU's, not the host's launch latency (autograd's own host time grows to ~0.6 ms a call at S 16k, for every
backend alike, which a training step hides behind the previous layer's work). Backends are interleaved in rounds
(--rounds, --reps calls each); the result is the median over all calls. Useful FLOPs: 2.5 x the forward's
4 * B * H * Sq * Sk * D, halved for causal, window counted by its visible pairs. Gradients are compared with SDPA flash's before timing.
Also the forward + backward time and the peak memory of one forward + backward per backend. With --lib (the
flashlite_bwd_capi library, a ctypes C entry point) each CUDA backward family also runs forced ("flashlite_mma",
"flashlite_hopper": the C API's backward alone on flashlite's own out and lse), whichever the planner would pick.
With --baseline-lib (the same library from another build) both families of that build also run forced, in the same
rounds ("baseline_mma", "baseline_hopper"): an A/B of two builds on the same tensors.

    python3 bench/bwd/side_by_side.py --out bench/results/<gpu>/bwd_side_by_side.json \
        [--lib build/lib/libflashlite_bwd_capi.so]
"""
import argparse
import ctypes
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
from window_sinks import flex, visible_pairs  # noqa: E402


GPU_CYCLES_PER_US = 1980  # the H100's boost clock; the sleep need only outlast the host's queueing


def sdpa(backend, causal):
    def fwd(q, k, v):  # flashlite layout in, SDPA's [B, H, S, D] views inside
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                  is_causal=causal).transpose(1, 2)
    return fwd


def flite(causal, window=(-1, -1), sink_tokens=0):
    return lambda q, k, v: flashlite.attention(q, k, v, causal=causal, window=window, sink_tokens=sink_tokens)


def gpu_times_ms(call, reps):
    """GPU milliseconds of each of `reps` calls, each queued behind a 2 ms GPU sleep (the host queues the call while
    the GPU sleeps, so its launch latency is not counted)."""
    times = []
    for _ in range(reps):
        torch.cuda._sleep(2000 * GPU_CYCLES_PER_US)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        call()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return times


def time_backward(fn, q, k, v, dout, reps):
    out = fn(q, k, v)
    grads = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)  # warm-up (and compile)
    return gpu_times_ms(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True), reps), grads


def load_capi(path):
    lib = ctypes.CDLL(path)
    lib.fl_backward.restype = ctypes.c_int
    lib.fl_backward.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_void_p] * 5 + [ctypes.c_int] * 11 + [ctypes.c_void_p]
    lib.fl_last_error.restype = ctypes.c_char_p
    return lib


def capi_backward(lib, kernel, causal, window, sink_tokens):
    """A peer that times the C API's backward with a forced kernel (1 mma.sync, 2 Hopper) on flashlite's forward
    outputs; returns (times, grads) as time_backward does, or None when the kernel refuses the call (named)."""
    def run(q, k, v, dout, reps):
        with torch.no_grad():
            out, lse = flashlite.attention(q, k, v, causal=causal, window=(window, -1), sink_tokens=sink_tokens,
                                           return_lse=True)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        b, s, h, d = q.shape

        def call():
            rc = lib.fl_backward(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr(),
                                 dout.data_ptr(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), 2, b, s, s, h,
                                 k.shape[2], d, int(causal), window, sink_tokens, kernel,
                                 torch.cuda.current_stream().cuda_stream)
            if rc != 0:
                raise RuntimeError(lib.fl_last_error().decode())
        call()  # warm-up
        return gpu_times_ms(call, reps), (dq.clone(), dk.clone(), dv.clone())
    return run


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




def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seqs", default="1024,2048,4096,8192,16384")
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default="bwd_side_by_side.json")
    ap.add_argument("--lib", help="libflashlite_bwd_capi.so: also time the forced mma.sync and Hopper backward")
    ap.add_argument("--baseline-lib", help="the same library of another build, timed forced beside --lib's")
    args = ap.parse_args()
    capi = load_capi(args.lib) if args.lib else None
    base = load_capi(args.baseline_lib) if args.baseline_lib else None
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
        forced = {}
        if capi is not None:
            forced = {"flashlite_mma": capi_backward(capi, 1, causal, window, sinks),
                      "flashlite_hopper": capi_backward(capi, 2, causal, window, sinks)}
        if base is not None:
            forced |= {"baseline_mma": capi_backward(base, 1, causal, window, sinks),
                       "baseline_hopper": capi_backward(base, 2, causal, window, sinks)}
        pairs = visible_pairs(s, causal, window, sinks)
        flops = 2.5 * 4 * b * h * pairs * d
        times = {n: [] for n in list(peers) + list(forced)}
        grads, refused = {}, {}
        for _ in range(args.rounds):
            for n, fn in peers.items():
                t, grads[n] = time_backward(fn, q, k, v, dout, args.reps)
                times[n] += t
            for n, run in forced.items():
                if n in refused:
                    continue
                try:
                    t, grads[n] = run(q, k, v, dout, args.reps)
                    times[n] += t
                except RuntimeError as err:  # e.g. not an sm_90 device: named in the JSON
                    refused[n] = str(err)
        ref = grads.get("flash", grads.get("flex"))
        diff = {n: max((a.float() - r.float()).abs().max().item() for a, r in zip(grads[n], ref))
                for n in grads if n.startswith(("flashlite", "baseline"))}
        row = {"head_dim": d, "causal": causal, "seq": s, "batch": b, "heads": h, "window": window,
               "sink_tokens": sinks, "max_abs_grad_diff": diff["flashlite"], "max_abs_grad_diffs": diff}
        for n, fn in peers.items():
            ms = statistics.median(times[n])
            fb_ms, peak = fwd_bwd_ms_and_peak(fn, q, k, v, dout)
            row[n] = {"bwd_ms": ms, "bwd_tflops": flops / ms / 1e9, "fwd_bwd_ms": fb_ms, "peak_mib": peak}
        for n in forced:
            row[n] = {"refused": refused[n]} if n in refused else {
                "bwd_ms": statistics.median(times[n]), "bwd_tflops": flops / statistics.median(times[n]) / 1e9}
        res["rows"].append(row)
        shown = [n for n in list(peers) + list(forced) if "bwd_tflops" in row[n]]
        print(f"D{d:<4} {'causal' if causal else 'full':6s} S{s:<6} w{window:<5} "
              + "  ".join(f"{n} {row[n]['bwd_tflops']:6.1f}" for n in shown)
              + "  diff " + " ".join(f"{n}={v:.3g}" for n, v in diff.items()), flush=True)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
