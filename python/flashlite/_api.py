"""flashlite.attention for any array library: torch (via the custom op in _torch_ops), numpy, cupy."""
from __future__ import annotations

from . import _C
from . import _args

BACKENDS = ("auto", "reference", "naive", "cpu", "cuda")


def _library(x, name="q"):
    root = type(x).__module__.split(".")[0]
    if root in ("torch", "numpy", "cupy"):
        return root
    raise TypeError(f"{name} is a {type(x).__module__}.{type(x).__name__}; expected a torch.Tensor, "
                    "numpy.ndarray or cupy.ndarray")


def _int32_list(x, name):
    """A list / tuple of ints as an int32 numpy array. Floats (which int32 would truncate: 2.5 -> 2) and values
    outside int32 (which it would wrap: 2**32 + 3 -> 3) are errors naming the argument."""
    import numpy as np
    a = np.asarray(x)
    if a.size and a.dtype.kind not in "iu":
        raise TypeError(f"{name} has entries of dtype {a.dtype}; expected ints (int32 values)")
    if a.size and (a.min() < -2**31 or a.max() > 2**31 - 1):
        raise ValueError(f"{name} has entries from {a.min()} to {a.max()}; expected int32 values")
    return a.astype(np.int32)


def _cu_seqlens(x, name="cu_seqlens"):
    """Lists become int32 numpy arrays; arrays and tensors pass as they are (they must be int32 CPU memory)."""
    if isinstance(x, (list, tuple)):
        return _int32_list(x, name)
    return x


def _lse_shape(q):
    # [batch, q_heads, seq_q]; varlen: [1, q_heads, total_q] -- the same formula on q's shape.
    return (q.shape[0], q.shape[2], q.shape[1]) if len(q.shape) == 4 else (0,)


def _options(causal, scale, window, sink_tokens, softcap, backend):
    causal, scale, left, right, sink_tokens, softcap, backend = _args.options(causal, scale, window, sink_tokens,
                                                                              softcap, backend)
    return dict(causal=causal, scale=scale, window_left=left, window_right=right, sink_tokens=sink_tokens,
                softcap=softcap, backend=backend)


def attention(q, k, v, *, causal=False, scale=None, window=(-1, -1), sink_tokens=0, sink_logits=None, softcap=0.0,
              cu_seqlens_q=None, cu_seqlens_k=None, return_lse=False, backend="auto", out=None):
    """Exact attention on [batch, seq, heads, head_dim] arrays; returns out (and the fp32 LSE when return_lse).

    causal: bottom-right aligned when seq_q != seq_k. window: (left, right), -1 = unlimited. sink_tokens: the first N
    keys stay visible to every query regardless of the window. sink_logits: fp32 [q_heads], joins the softmax
    denominator only. softcap: scores become softcap * tanh(s / softcap). cu_seqlens_q/k: int32 [batch + 1] in CPU
    memory for variable-length batches packed as [1, total, heads, head_dim]. backend: auto, reference, naive, cpu,
    cuda. out: write into this array instead of allocating one. LSE is [batch, q_heads, seq_q] fp32 (natural log).
    """
    lib = _library(q)
    if lib == "torch":
        from . import _torch_ops
        return _torch_ops.attention(q, k, v, causal=causal, scale=scale, window=window, sink_tokens=sink_tokens,
                                    sink_logits=sink_logits, softcap=softcap, cu_seqlens_q=cu_seqlens_q,
                                    cu_seqlens_k=cu_seqlens_k, return_lse=return_lse, backend=backend, out=out)
    opts = _options(causal, scale, window, sink_tokens, softcap, backend)
    cu_q, cu_k = _cu_seqlens(cu_seqlens_q, "cu_seqlens_q"), _cu_seqlens(cu_seqlens_k, "cu_seqlens_k")

    if lib == "numpy":
        import numpy as xp
        stream = 0
    else:
        import cupy as xp
        stream = xp.cuda.get_current_stream().ptr
    if out is None:
        out = xp.empty(q.shape, dtype=q.dtype)
    lse = xp.empty(_lse_shape(q), dtype=xp.float32) if return_lse else None
    _C.forward(q, k, v, out, lse, sink_logits, cu_q, cu_k, stream=stream, **opts)
    return (out, lse) if return_lse else out


def _call_args(q, k, v, kwargs):
    opts = _options(kwargs.pop("causal", False), kwargs.pop("scale", None), kwargs.pop("window", (-1, -1)),
                    kwargs.pop("sink_tokens", 0), kwargs.pop("softcap", 0.0), kwargs.pop("backend", "auto"))
    sink_logits = kwargs.pop("sink_logits", None)
    cu_q = _cu_seqlens(kwargs.pop("cu_seqlens_q", None), "cu_seqlens_q")
    cu_k = _cu_seqlens(kwargs.pop("cu_seqlens_k", None), "cu_seqlens_k")
    if kwargs:
        raise TypeError(f"unexpected keyword arguments: {', '.join(sorted(kwargs))}")
    if _library(q) == "torch":
        from ._torch_ops import _dl
        import torch
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        arrays = [_dl(t) for t in (q, k, v, out, None, sink_logits, cu_q, cu_k)]
    else:
        arrays = [q, k, v, q.copy(), None, sink_logits, cu_q, cu_k]  # out: any array of q's shape, dtype, device
    return arrays, opts


def kernel_name(q, k, v, **kwargs):
    """Which kernel flashlite.attention would run for these arguments (validates them)."""
    arrays, opts = _call_args(q, k, v, dict(kwargs))
    return _C.kernel_name(*arrays, stream=0, **opts)


def workspace_bytes(q, k, v, **kwargs):
    """Scratch bytes the chosen backend needs (only CUDA naive needs any; flashlite.attention allocates it)."""
    arrays, opts = _call_args(q, k, v, dict(kwargs))
    return _C.workspace_bytes(*arrays, stream=0, **opts)


def reference(q, k, v, **kwargs):
    """The float64 oracle on CPU arrays (numpy or torch): returns (out, lse) as float64 numpy arrays,
    out shaped like q and lse [q.shape[0], q_heads, q.shape[1]]."""
    import numpy as np
    kwargs = dict(kwargs)
    kwargs["backend"] = "reference"
    arrays, opts = _call_args(q, k, v, kwargs)
    out64 = np.full(tuple(q.shape), np.nan, dtype=np.float64)
    lse64 = np.full(_lse_shape(q), np.nan, dtype=np.float64)
    _C.reference_f64(*arrays, stream=0, out64=out64, lse64=lse64, **opts)
    return out64, lse64
