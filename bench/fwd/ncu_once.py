"""One shape through flashlite's dispatched forward kernel, for Nsight Compute: two warm-up calls, then one call to
profile (`ncu --launch-skip 2 --launch-count 1 -k regex:fwd_`), bf16, batch*seq = 16384, heads*head_dim = 2048 (the
reference shapes of bench/fwd/side_by_side.py).

    python3 bench/fwd/ncu_once.py LIBFLASHLITE_FWD_CAPI SEQ HEAD_DIM CAUSAL(0|1)
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from side_by_side import load  # noqa: E402

lib = load(sys.argv[1])
s, d, causal = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
b, h = 16384 // s, 2048 // d
q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
out = torch.empty_like(q)
stream = torch.cuda.current_stream().cuda_stream
for _ in range(3):
    if lib.fl_forward(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), None, 2, b, s, s, h, h, d, causal, -1, 0,
                      stream) != 0:
        raise SystemExit(lib.fl_last_error().decode())
torch.cuda.synchronize()
print(f"ran b{b} h{h} s{s} d{d} causal {causal}")
