"""Issue 4's window target: S = 8192, D = 128, causal window 1024, with and without 4 sink tokens; flashlite (the
dispatched kernel, through bench/fwd's C entry point) or FlexAttention, useful TFLOP/s (visible pairs only). One
process per backend (flashlite's environment switches are read once per process).

    python3 bench/fwd/window_flex.py REPO_ROOT LIBFLASHLITE_FWD_CAPI LABEL|flex OUT.json
"""
import json, os, statistics, sys
import torch
sys.path.insert(0, os.path.join(sys.argv[1], "bench", "fwd"))
from side_by_side import load

lib = load(sys.argv[2])
which = sys.argv[3]  # a label for flashlite (FLASHLITE_FWD_HOPPER set by the caller), or "flex"
b, h, s, d = 2, 16, 8192, 128
torch.manual_seed(0)
sets = [[torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3)] for _ in range(2)]
out = torch.empty(b, s, h, d, device="cuda", dtype=torch.bfloat16)
stream = torch.cuda.current_stream().cuda_stream
rows = []
if which == "flex":
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    flex = torch.compile(flex_attention)


def median_us(fn, reps=30):
    for i in range(3):
        fn(i % 2)
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for i, (e0, e1) in enumerate(ev):
        e0.record(); fn(i % 2); e1.record()
    torch.cuda.synchronize()
    return statistics.median(e0.elapsed_time(e1) * 1e3 for e0, e1 in ev)


for sinks in (0, 4):
    vis = sum(min(i, 1024) + 1 + max(0, min(sinks, i - 1024)) for i in range(s))
    if which == "flex":
        def mask_mod(bi, hi, qi, ki, sinks=sinks):
            return (ki <= qi) & ((qi - ki <= 1024) | (ki < sinks))
        bm = create_block_mask(mask_mod, None, None, s, s)
        fn = lambda i: flex(*(x.transpose(1, 2) for x in sets[i]), block_mask=bm)
    else:
        def fn(i):
            q, k, v = sets[i]
            if lib.fl_forward(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), None, 2, b, s, s, h, h, d, 1,
                              1024, sinks, stream) != 0:
                raise RuntimeError(lib.fl_last_error().decode())
    us = median_us(fn)
    rows.append({"backend": which, "seq": s, "batch": b, "heads": h, "head_dim": d, "window_left": 1024,
                 "sink_tokens": sinks, "us": round(us, 2), "useful_tflops": round(4 * b * h * vis * d / (us * 1e-6) / 1e12, 1)})
    print(rows[-1], flush=True)
json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, open(sys.argv[4], "w"), indent=1)
