"""flashlite.attention for any array library: torch (via the custom op in _torch_ops), numpy, cupy."""
from __future__ import annotations

from . import _C
from . import _args
from . import _check

BACKENDS = ("auto", "reference", "naive", "cpu", "cuda")


def _library(x, name="q"):
    lib = _check.library(x)
    if lib is not None:
        return lib
    raise TypeError(f"{name} is a {_check.typename(x)}; expected a torch.Tensor, numpy.ndarray or cupy.ndarray")


def _torch_module():
    """flashlite._torch_ops, imported on first use (torch is optional) and then kept: a function-level
    `from . import` costs ~1 us per call."""
    global _TORCH_OPS
    if _TORCH_OPS is None:
        from . import _torch_ops
        _TORCH_OPS = _torch_ops
    return _TORCH_OPS


_TORCH_OPS = None


def _int32_list(x, name):
    """A list / tuple of ints as an int32 numpy array. Floats (which int32 would truncate: 2.5 -> 2) and values
    outside int32 (which it would wrap: 2**32 + 3 -> 3) are errors naming the argument."""
    return _check.int32_array(x, name, "numpy")


def _cu_seqlens(x, name="cu_seqlens"):
    """Lists become int32 numpy arrays; arrays and tensors pass as they are (they must be int32 CPU memory)."""
    return _check.index_array(x, name, "numpy")


def _same_library(lib, k, v, out, sink_logits):
    """k, v, out and sink_logits come from q's library (one array library per call: a torch out for numpy inputs
    would be written behind torch's back, a list is no array)."""
    why = f" (q is a {_check.ARRAY[lib]}: pass arrays of one library)"
    _check.require(k, "k", lib, why)
    _check.require(v, "v", lib, why)
    _check.require(out, "out", lib, why, optional=True)
    _check.require(sink_logits, "sink_logits", lib, why, optional=True)


def _native_args(q, k, v, out, lse, sink_logits, cu_q, cu_k):
    """(name, array, written, expected dtypes) of a native forward call, for _check.explain."""
    return (("q", q, False, _check.FLOATS), ("k", k, False, _check.FLOATS), ("v", v, False, _check.FLOATS),
            ("out", out, True, _check.FLOATS), ("lse", lse, True, "float32"),
            ("sink_logits", sink_logits, False, "float32"), ("cu_seqlens_q", cu_q, False, "int32"),
            ("cu_seqlens_k", cu_k, False, "int32"))


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
        return _torch_module().attention(q, k, v, causal=causal, scale=scale, window=window,
                                         sink_tokens=sink_tokens, sink_logits=sink_logits, softcap=softcap,
                                         cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, return_lse=return_lse,
                                         backend=backend, out=out)
    _same_library(lib, k, v, out, sink_logits)
    opts = _options(causal, scale, window, sink_tokens, softcap, backend)
    return_lse = _args.flag(return_lse, "return_lse")
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
    try:
        _C.forward(q, k, v, out, lse, sink_logits, cu_q, cu_k, stream=stream, **opts)
    except (TypeError, ValueError, BufferError) as err:
        _check.explain(err, "flashlite.attention", lib, _native_args(q, k, v, out, lse, sink_logits, cu_q, cu_k))
        raise
    return (out, lse) if return_lse else out


def _call_args(q, k, v, kwargs):
    opts = _options(kwargs.pop("causal", False), kwargs.pop("scale", None), kwargs.pop("window", (-1, -1)),
                    kwargs.pop("sink_tokens", 0), kwargs.pop("softcap", 0.0), kwargs.pop("backend", "auto"))
    sink_logits = kwargs.pop("sink_logits", None)
    cu_q = _cu_seqlens(kwargs.pop("cu_seqlens_q", None), "cu_seqlens_q")
    cu_k = _cu_seqlens(kwargs.pop("cu_seqlens_k", None), "cu_seqlens_k")
    if kwargs:
        raise TypeError(f"unexpected keyword arguments: {', '.join(sorted(kwargs))}")
    lib = _library(q)
    _same_library(lib, k, v, None, sink_logits)
    if lib == "torch":
        import torch
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    else:
        out = q.copy()  # any array of q's shape, dtype, device
    return lib, [q, k, v, out, None, sink_logits, cu_q, cu_k], opts


def _native(fn, what, lib, arrays, **kw):
    """fn(*arrays, **kw) (torch tensors as DLPack capsules); nanobind's and DLPack's refusals become named errors."""
    try:
        if lib == "torch":
            from ._torch_ops import _dl
            return fn(*[_dl(t) for t in arrays], **kw)
        return fn(*arrays, **kw)
    except (TypeError, ValueError, BufferError, RuntimeError) as err:
        _check.explain(err, what, lib, _native_args(*arrays))
        raise


def kernel_name(q, k, v, **kwargs):
    """Which kernel flashlite.attention would run for these arguments (validates them)."""
    lib, arrays, opts = _call_args(q, k, v, dict(kwargs))
    return _native(_C.kernel_name, "flashlite.kernel_name", lib, arrays, stream=0, **opts)


def workspace_bytes(q, k, v, **kwargs):
    """Scratch bytes the chosen backend needs (CUDA only: the naive backend's scores, the fused kernels' fold space
    past 32768 keys, the Hopper kernel's tile counter for causal / window / varlen calls; flashlite.attention on torch
    tensors allocates it through torch)."""
    lib, arrays, opts = _call_args(q, k, v, dict(kwargs))
    return _native(_C.workspace_bytes, "flashlite.workspace_bytes", lib, arrays, stream=0, **opts)


def reference(q, k, v, **kwargs):
    """The float64 oracle on CPU arrays (numpy or torch): returns (out, lse) as float64 numpy arrays,
    out shaped like q and lse [q.shape[0], q_heads, q.shape[1]]."""
    import numpy as np
    kwargs = dict(kwargs)
    kwargs["backend"] = "reference"
    lib, arrays, opts = _call_args(q, k, v, kwargs)
    out64 = np.full(tuple(q.shape), np.nan, dtype=np.float64)
    lse64 = np.full(_lse_shape(q), np.nan, dtype=np.float64)
    _native(_C.reference_f64, "flashlite.reference", lib, arrays, stream=0, out64=out64, lse64=lse64, **opts)
    return out64, lse64


def attention_backward(q, k, v, out, lse, dout, *, dlse=None, causal=False, scale=None, window=(-1, -1),
                       sink_tokens=0, sink_logits=None, softcap=0.0, cu_seqlens_q=None, cu_seqlens_k=None,
                       backend="auto", deterministic=False):
    """The gradients (dq, dk, dv, dsink_logits) of attention() for numpy / cupy (and torch) arrays, for callers that
    run their own autograd: q, k, v and the options of the forward call, its out and lse (return_lse=True), and dout
    (and dlse) the loss's gradients with respect to them. dsink_logits is None without sink_logits. torch users need
    not call this: flashlite.attention is differentiable."""
    lib = _library(q)
    _same_library(lib, k, v, out, sink_logits)
    why = f" (q is a {_check.ARRAY[lib]}: pass arrays of one library)"
    _check.require(lse, "lse", lib, why)
    _check.require(dout, "dout", lib, why)
    _check.require(dlse, "dlse", lib, why, optional=True)
    opts = _options(causal, scale, window, sink_tokens, softcap, backend)
    deterministic = _args.flag(deterministic, "deterministic")
    cu_q, cu_k = _cu_seqlens(cu_seqlens_q, "cu_seqlens_q"), _cu_seqlens(cu_seqlens_k, "cu_seqlens_k")
    if lib == "torch":
        from . import _torch_ops
        o = opts
        return _torch_ops._run_backward(q, k, v, out, lse, dout, dlse, sink_logits, cu_q, cu_k, o["causal"],
                                        o["scale"], o["window_left"], o["window_right"], o["sink_tokens"],
                                        o["softcap"], o["backend"], deterministic)
    if lib == "numpy":
        import numpy as xp
        stream = 0
    else:
        import cupy as xp
        stream = xp.cuda.get_current_stream().ptr
    dq, dk, dv = xp.empty(q.shape, q.dtype), xp.empty(k.shape, k.dtype), xp.empty(v.shape, v.dtype)
    dsink = None if sink_logits is None else xp.empty(sink_logits.shape, xp.float32)
    try:
        _C.backward(q, k, v, out, lse, dout, dlse, dq, dk, dv, dsink, sink_logits, cu_q, cu_k, stream=stream,
                    deterministic=deterministic, **opts)
    except (TypeError, ValueError, BufferError) as err:
        _check.explain(err, "flashlite.attention_backward", lib,
                       _native_args(q, k, v, out, lse, sink_logits, cu_q, cu_k))
        raise
    return dq, dk, dv, dsink
