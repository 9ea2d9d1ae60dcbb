"""One attention shape's kernels, for a profiler: flashlite or a torch SDPA backend (flash, cuDNN), forward or
backward, at the benchmarks' reference shapes (bf16, batch*seq = 16384 tokens, heads*head_dim = 2048). One warm-up
call, then --calls calls between cudaProfilerStart and cudaProfilerStop, so that a profiler started with its
collection off sees only those (ncu --profile-from-start off):

    ncu --profile-from-start off --clock-control none --section SpeedOfLight --section WarpStateStats \
        python3 bench/profile_kernels.py --op bwd --peer flashlite --dim 64 --seq 2048 --causal
"""
import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashlite


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--op", choices=["fwd", "bwd"], required=True)
    ap.add_argument("--peer", choices=["flashlite", "flash", "cudnn"], required=True)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--calls", type=int, default=1)
    args = ap.parse_args()

    torch.manual_seed(0)
    batch, heads = 16384 // args.seq, 2048 // args.dim
    shape = (batch, args.seq, heads, args.dim)  # flashlite's layout; SDPA gets [B, H, S, D] views of it
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=args.op == "bwd")
               for _ in range(3))
    dout = torch.randn(shape, device="cuda", dtype=torch.bfloat16)

    def forward():
        if args.peer == "flashlite":
            return flashlite.attention(q, k, v, causal=args.causal)
        backend = SDPBackend.FLASH_ATTENTION if args.peer == "flash" else SDPBackend.CUDNN_ATTENTION
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                  is_causal=args.causal).transpose(1, 2)

    if args.op == "fwd":
        call = forward
    else:
        out = forward()
        call = lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)  # noqa: E731
    call()  # warm-up
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for _ in range(args.calls):
        call()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
