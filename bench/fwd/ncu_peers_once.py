"""One call each of the naive torch path (matmul, mask, softmax, matmul) and torch SDPA's flash backend, in NVTX
ranges "naive" and "flash", for Nsight Compute (bench/fwd/run_device.sh, phase ncu). Prints the naive path's peak
extra memory and its kernel count. B=4, H=32, S=4096, D=64, causal, bf16."""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

b, h, s, d = 4, 32, 4096, 64
q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
mask = torch.ones(s, s, device="cuda", dtype=torch.bool).tril()


def naive():
    sc = (q @ k.transpose(-1, -2)) * d**-0.5
    sc = sc.masked_fill(~mask, float("-inf"))
    return torch.softmax(sc.float(), dim=-1).to(q.dtype) @ v


def flash():
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


naive(), flash()
torch.cuda.synchronize()
for name, fn in (("naive", naive), ("flash", flash)):
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        torch.cuda.nvtx.range_push(name)
        out = fn()
        torch.cuda.nvtx.range_pop()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    print(f"{name}: peak extra bytes {torch.cuda.max_memory_allocated() - base}, output bytes {out.numel() * 2}, "
          f"kernels {len(kernels)}: {sorted({e.name[:60] for e in kernels})}", flush=True)
