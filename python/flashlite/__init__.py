"""flashlite: exact, IO-aware attention for NVIDIA GPUs and CPUs.

    out = flashlite.attention(q, k, v, causal=True)          # q [B, Sq, Hq, D], k/v [B, Sk, Hkv, D]

Differentiable on torch tensors (eager calls: a torch.autograd.Function; under torch.compile: the custom op's
registered autograd, the same formula); numpy / cupy callers get the gradients from
flashlite.attention_backward. Works on torch tensors (CPU and CUDA, through a torch custom op that torch.compile and
CUDA graphs accept), numpy
arrays (CPU) and cupy arrays (CUDA), viewed in place through DLPack. SDPA's [B, H, S, D] convention:
flashlite.torch.scaled_dot_product_attention. KV cache (contiguous or paged) for generation: flashlite.KVCache,
flashlite.append_kv (with RoPE), flashlite.decode, flashlite.prefill (flashlite/kv.py). Errors arrive as ValueError / TypeError / RuntimeError.
"""
from . import _C
from ._api import attention, attention_backward, kernel_name, reference, workspace_bytes
from .kv import KVCache, Rope, append_kv, decode, decode_kernel_name, prefill

__version__ = _C.__version__
with_cuda = bool(_C.with_cuda)

__all__ = ["attention", "attention_backward", "kernel_name", "reference", "workspace_bytes", "with_cuda", "__version__", "KVCache", "Rope",
           "append_kv", "decode", "decode_kernel_name", "prefill"]
