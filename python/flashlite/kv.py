"""KV cache for generation: a cache view (contiguous or paged), append with rotary embedding, and decode.

    cache = flashlite.KVCache(k_cache, v_cache, seq_lens=[0, 0])          # [batch, max_len, kv_heads, D]
    cache.update(seq_lens=[5, 3])                                          # lengths AFTER this step's append
    q = flashlite.append_kv(cache, k_new, v_new, q=q_new, rope=flashlite.Rope(theta=500000.0))
    out = flashlite.decode(q, cache)                                       # q [batch, q_len <= 8, heads, D]
    out = flashlite.prefill(q, cache)                                      # any chunk length (fused kernel)

Paged: KVCache(k_pages, v_pages, page_indptr=..., page_indices=..., last_page_len=...) with pages
[num_pages, page_size, kv_heads, D] and a CSR page table per sequence (FlashInfer's convention). Lengths always
describe the cache after the step's append (grow them first, then append_kv writes the last n tokens of each
sequence). Arrays are torch tensors (CPU or CUDA) or numpy arrays (CPU), used in place. For a CUDA cache the index
arrays live twice: on the host (validation and planning read them before anything launches) and on the device (the
kernels read them, so a captured CUDA graph sees the lengths of every replay); update() keeps both and writes the
device copies in place. Errors (overflow past max_len or past the pages given, bad page ids, shapes) raise
ValueError / TypeError and write nothing.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from . import _C
from . import _args
from . import _check

_INDEX_NAMES = ("seq_lens", "page_indptr", "page_indices", "last_page_len")
_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def _lib(x, name):
    lib = _check.library(x)
    if lib in ("torch", "numpy"):
        return lib
    raise TypeError(f"{name} is a {_check.typename(x)}; the KV cache functions take torch tensors or numpy arrays")


def _require_cache(cache):
    if not isinstance(cache, KVCache):
        raise TypeError(f"cache is a {_check.typename(cache)}; expected a flashlite.KVCache (KVCache(k, v, "
                        "seq_lens=...) or the paged form)")
    return cache.lib


def _same_lib(lib, named):
    """Each (name, array or None) comes from the cache's library."""
    for name, x in named:
        if x is not None and _check.library(x) != lib:
            raise TypeError(f"{name} is a {_check.typename(x)}; expected a {_check.ARRAY[lib]} (the cache holds "
                            f"{_check.ARRAY[lib]}s: pass arrays of one library)")


def _cache_array(x, name, lib):
    """k / v of a KVCache: 4-D, of a dtype the kernels take, in CPU or CUDA memory."""
    if x.ndim != 4:
        raise ValueError(f"{name} has rank {x.ndim} (shape {list(x.shape)}); expected rank 4: [batch, max_len, "
                         "kv_heads, head_dim] (contiguous) or [num_pages, page_size, kv_heads, head_dim] (paged)")
    if lib == "torch":
        import torch
        if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise TypeError(f"{name} has dtype {x.dtype}; expected torch.float32, torch.float16 or torch.bfloat16")
        if x.device.type not in ("cpu", "cuda"):
            raise ValueError(f"{name} is on {x.device}; expected CPU or CUDA memory")
    elif x.dtype.name not in ("float32", "float16") or not x.dtype.isnative:
        raise TypeError(f"{name} has dtype {x.dtype.str if x.dtype.kind == 'f' else x.dtype}; expected float32 or "
                        "float16 in native byte order (numpy has no bfloat16)")


@dataclasses.dataclass(frozen=True)
class Rope:
    """Rotary embedding applied by append_kv: pair c of the token at position p turns by p * theta^(-2c/D).
    layout: "half_split" (pairs (c, c + D/2), Hugging Face Llama) or "interleaved" (pairs (2c, 2c+1), Meta's
    original). llama3=True rescales the frequencies by Llama-3's rule with the four parameters below."""
    theta: float = 10000.0
    layout: str = "half_split"
    llama3: bool = False
    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: float = 8192.0

    def __post_init__(self):
        """Checks each field (named in the error) and stores the numbers as floats: a string theta, an unknown
        layout or a llama3 rule that cannot work fail here, not at the first append_kv."""
        put = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731  (a frozen dataclass)
        put("theta", _args.finite_value(self.theta, "Rope.theta", positive=True))
        if not isinstance(self.layout, str):
            raise TypeError(f"Rope.layout is {_args.show(self.layout)}; expected 'half_split' or 'interleaved'")
        if self.layout not in ("half_split", "interleaved"):
            raise ValueError(f"Rope.layout is {self.layout!r}; expected 'half_split' or 'interleaved'")
        put("llama3", _args.flag(self.llama3, "Rope.llama3"))
        for name in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position"):
            put(name, _args.real_value(getattr(self, name), f"Rope.{name}"))
        if self.llama3:
            _args.finite_value(self.factor, "Rope.factor", positive=True)
            _args.finite_value(self.original_max_position, "Rope.original_max_position", positive=True)
            low, high = self.low_freq_factor, self.high_freq_factor
            if not (0 < low < high < float("inf")):
                raise ValueError(f"Rope.low_freq_factor / high_freq_factor are {low} / {high}; expected "
                                 "0 < low_freq_factor < high_freq_factor (finite)")

    @classmethod
    def from_hf_config(cls, config) -> "Rope":
        """From a transformers config (rope_theta, rope_scaling / rope_parameters with rope_type 'llama3'), or a
        dict of the same keys."""
        if config is None or isinstance(config, (str, bytes, int, float, list, tuple)):
            raise TypeError(f"config is {_args.show(config)}; expected a transformers config (PretrainedConfig) or "
                            "a dict with rope_theta / rope_scaling")
        get = config.get if isinstance(config, Mapping) else (lambda name: getattr(config, name, None))
        where = "rope_scaling" if get("rope_scaling") else "rope_parameters"
        scaling = get(where) or {}
        if not isinstance(scaling, Mapping):
            raise TypeError(f"config.{where} is {_args.show(scaling)}; expected a dict (rope_type, factor, ...) or "
                            "None")
        if get("rope_theta") is not None:
            theta = _args.finite_value(get("rope_theta"), "config.rope_theta", positive=True)
        else:
            theta = _args.finite_value(scaling.get("rope_theta", 10000.0), f"config.{where}['rope_theta']",
                                       positive=True)
        kind = scaling.get("rope_type", scaling.get("type", "default"))
        if kind not in ("default", "llama3"):
            raise ValueError(f"rope_type {kind!r} is not supported (default or llama3)")
        if kind == "default":
            return cls(theta=theta)
        missing = [key for key in _LLAMA3_KEYS if key not in scaling]
        if missing:
            raise ValueError(f"config.{where} has no {', '.join(map(repr, missing))}; rope_type 'llama3' needs "
                             f"{', '.join(_LLAMA3_KEYS)}")
        value = {key: _args.real_value(scaling[key], f"config.{where}['{key}']") for key in _LLAMA3_KEYS}
        return cls(theta=theta, llama3=True, factor=value["factor"], low_freq_factor=value["low_freq_factor"],
                   high_freq_factor=value["high_freq_factor"],
                   original_max_position=value["original_max_position_embeddings"])

    def inv_freq(self, head_dim: int):
        """The float64 inverse frequencies (list of head_dim / 2) this rule gives."""
        head_dim = _args.int_value(head_dim, "head_dim", 2, 2**30, "an even int >= 2")
        if head_dim % 2:
            raise ValueError(f"head_dim is {head_dim}; expected an even int >= 2 (rotary pairs)")
        return [_C.rope_inv_freq(self.theta, self.llama3, self.factor, self.low_freq_factor, self.high_freq_factor,
                                 self.original_max_position, head_dim, c) for c in range(head_dim // 2)]


class KVCache:
    """A view of one layer's KV cache (the arrays are the caller's; nothing is copied but the index arrays)."""

    def __init__(self, k, v, *, seq_lens=None, page_indptr=None, page_indices=None, last_page_len=None):
        self.lib = _lib(k, "k")
        if _check.library(v) != self.lib:
            raise TypeError(f"k and v must come from the same library: k is a {_check.typename(k)}, v is a "
                            f"{_check.typename(v)}")
        _cache_array(k, "k", self.lib)
        _cache_array(v, "v", self.lib)
        if self.lib == "torch" and v.device != k.device:
            raise ValueError(f"v is on {v.device} but k is on {k.device}; expected one device")
        paged = [x is not None for x in (page_indptr, page_indices, last_page_len)]
        if any(paged) and not all(paged):
            raise ValueError("a paged cache needs page_indptr, page_indices and last_page_len together")
        if all(paged) and seq_lens is not None:
            raise ValueError("give seq_lens (contiguous cache) or the page table (paged cache), not both")
        if not any(paged) and seq_lens is None:
            raise ValueError("give seq_lens (contiguous cache) or page_indptr/page_indices/last_page_len (paged)")
        self.layout = "paged" if all(paged) else "contiguous"
        self.k, self.v = k, v
        self.host = dict.fromkeys(_INDEX_NAMES)
        self.device = dict.fromkeys(_INDEX_NAMES)
        self._staging = {}  # CUDA cache: name -> (pinned host buffer, event after the last copy out of it)
        self.update(seq_lens=seq_lens, page_indptr=page_indptr, page_indices=page_indices,
                    last_page_len=last_page_len)

    @property
    def is_cuda(self):
        return self.lib == "torch" and self.k.is_cuda

    def _host_int32(self, x, name):
        """An index argument as a 1-D int32 host array of the cache's library: lists / tuples of ints are checked and
        converted; int32 arrays (numpy, or a torch tensor on the CPU or a CUDA device) are taken as given."""
        if isinstance(x, (list, tuple)):
            return _check.int32_array(x, name, self.lib)
        found = _check.library(x)
        if found == "torch":
            import torch
            if x.dtype != torch.int32:
                raise TypeError(f"{name} has dtype {x.dtype}; expected torch.int32")
            if x.device.type not in ("cpu", "cuda"):
                raise ValueError(f"{name} is on {x.device}; expected CPU or CUDA memory")
        elif found == "numpy":
            if x.dtype.name != "int32" or not x.dtype.isnative:
                raise TypeError(f"{name} has dtype {x.dtype}; expected int32")
        else:
            raise TypeError(f"{name} is a {_check.typename(x)}; expected a list of ints or a 1-D int32 array")
        if x.ndim != 1:
            raise ValueError(f"{name} has rank {x.ndim} (shape {list(x.shape)}); expected rank 1 (one entry per "
                             "sequence, or per page for page_indices)")
        if found == "torch":
            h = x.detach().cpu().contiguous()
            return h if self.lib == "torch" else h.numpy()
        import numpy as np
        h = np.ascontiguousarray(x)
        if self.lib == "torch":
            import torch
            return torch.from_numpy(h)
        return h

    def update(self, **index):
        """Replaces index arrays (seq_lens, or page_indptr / page_indices / last_page_len): lists or int32 arrays.
        The host copies are taken as given; for a CUDA cache the device copies are written in place when their size
        is unchanged (a captured graph keeps reading them), else reallocated. The in-place write is stream-ordered on
        the current stream and does not wait for the device (see _write_device)."""
        for name, x in index.items():
            if name not in _INDEX_NAMES:
                raise TypeError(f"update() got {name!r}; expected one of {', '.join(_INDEX_NAMES)}")
            if x is None:
                continue
            if (self.layout == "paged") != (name != "seq_lens"):
                raise ValueError(f"{name} does not describe a {self.layout} cache")
            h = self._host_int32(x, name)
            self.host[name] = h
            if self.is_cuda:
                d = self.device[name]
                if d is not None and d.shape == h.shape:
                    self._write_device(name, h, d)
                else:
                    self.device[name] = h.to(self.k.device)
        return self

    def _write_device(self, name, h, d):
        """h into the device copy d without a host sync: h goes into a pinned buffer owned by the cache (so the
        caller may change h at once), which the device reads asynchronously on the current stream. Before the buffer
        is refilled, the previous copy out of it is waited for (by then long finished in a decode loop)."""
        import torch
        buf, done = self._staging.get(name, (None, None))
        if buf is None or buf.shape != h.shape:
            buf, done = torch.empty(h.shape, dtype=torch.int32, pin_memory=True), torch.cuda.Event()
        else:
            done.synchronize()
        buf.copy_(h)
        d.copy_(buf, non_blocking=True)
        done.record(torch.cuda.current_stream(d.device))
        self._staging[name] = (buf, done)

    def lengths(self):
        """Tokens held by each sequence (from the host index)."""
        if self.layout == "contiguous":
            return [int(n) for n in self.host["seq_lens"].tolist()]
        indptr, last = self.host["page_indptr"].tolist(), self.host["last_page_len"].tolist()
        page = int(self.k.shape[1])
        return [0 if indptr[b + 1] == indptr[b] else (indptr[b + 1] - indptr[b] - 1) * page + int(last[b])
                for b in range(len(last))]

    def _parts(self):
        conv = _dl if self.lib == "torch" else (lambda a: a)
        return ((self.layout, conv(self.k), conv(self.v))
                + tuple(conv(self.host[n]) for n in _INDEX_NAMES)
                + tuple(conv(self.device[n]) if self.is_cuda else None for n in _INDEX_NAMES))


def _dl(t):
    if t is None:
        return None
    from torch.utils import dlpack
    return dlpack.to_dlpack(t.detach())


def _stream(cache):
    if cache.is_cuda:
        from ._torch_ops import _current_stream
        return _current_stream(cache.k.device)
    return 0


def _native(fn, what, lib, named, make_args, **kw):
    """fn(*make_args(), **kw); a refusal by DLPack or nanobind (a read-only out, an object array, a meta tensor)
    becomes an error naming the argument of `named` ((name, array, written, expected dtypes)) that caused it."""
    try:
        return fn(*make_args(), **kw)
    except (TypeError, ValueError, BufferError, RuntimeError) as err:
        _check.explain(err, what, lib, named)
        raise


def append_kv(cache: KVCache, k, v, *, q=None, q_out=None, rope: Rope | None = None, backend="auto"):
    """Writes k, v [batch, n, kv_heads, D] as the last n tokens of each sequence (one launch on CUDA), rotating k
    (and q [batch, n, heads, D], when given) by `rope` on the way. Returns the rotated q (into q_out when given; pass
    q_out=q to rotate in place), else None."""
    lib = _require_cache(cache)
    _same_lib(lib, (("k", k), ("v", v), ("q", q), ("q_out", q_out)))
    if k is None or v is None:
        raise TypeError(f"{'k' if k is None else 'v'} is None; expected a {_check.ARRAY[lib]} [batch, n, kv_heads, "
                        "head_dim]")
    if rope is not None and not isinstance(rope, Rope):
        raise TypeError(f"rope is {_args.show(rope)}; expected a flashlite.Rope or None")
    if not isinstance(backend, str):
        raise TypeError(f"backend is {_args.show(backend)}; expected one of auto, cpu, cuda")
    if q is not None and rope is None:
        raise ValueError("q is given without rope: there is nothing to apply to it")
    conv = _dl if lib == "torch" else (lambda a: a)
    if q is not None and q_out is None:
        if lib == "torch":
            import torch
            q_out = torch.empty_like(q)
        else:
            import numpy as np
            q_out = np.empty_like(q)
    r = rope or Rope()
    named = (("k", k, False, _check.FLOATS), ("v", v, False, _check.FLOATS), ("q", q, False, _check.FLOATS),
             ("q_out", q_out, True, _check.FLOATS))
    _native(_C.append_kv, "flashlite.append_kv", lib, named,
            lambda: (cache._parts(), conv(k), conv(v), conv(q), conv(q_out), rope is not None, r.theta, r.layout,
                     r.llama3, r.factor, r.low_freq_factor, r.high_freq_factor, r.original_max_position, backend,
                     _stream(cache)))
    return q_out


def _decode_call(q, cache, out, lse, causal, scale, window, sink_tokens, sink_logits, softcap, backend):
    causal, scale, left, right, sink_tokens, softcap, backend = _args.options(causal, scale, window, sink_tokens,
                                                                              softcap, backend)
    conv = _dl if cache.lib == "torch" else (lambda a: a)
    return ((conv(q), cache._parts(), conv(out), conv(lse), conv(sink_logits), causal, scale, left, right, sink_tokens,
             softcap, backend, _stream(cache)))


def _decode_named(q, out, lse, sink_logits, cu_seqlens_q=None):
    return (("q", q, False, _check.FLOATS), ("out", out, True, _check.FLOATS), ("lse", lse, True, "float32"),
            ("sink_logits", sink_logits, False, "float32"), ("cu_seqlens_q", cu_seqlens_q, False, "int32"))


def _check_arrays(q, cache, out, sink_logits):
    """The cache is a KVCache; q (a 4-D array), out and sink_logits come from its library. Returns the library."""
    lib = _require_cache(cache)
    _lib(q, "q")
    _same_lib(lib, (("q", q), ("out", out), ("sink_logits", sink_logits)))
    if len(q.shape) != 4:
        raise ValueError(f"q has rank {len(q.shape)} (shape {list(q.shape)}); expected rank 4 [batch, q_len, "
                         "q_heads, head_dim]")
    return lib


def _outputs(q, cache, out, return_lse):
    """(array module, out, lse) for a call on q: out allocated like q unless given, the fp32 LSE [batch, heads,
    q rows] when asked for."""
    if return_lse is not True and return_lse is not False:
        return_lse = _args.flag(return_lse, "return_lse")
    if cache.lib == "torch":
        import torch as xp
        kw = dict(dtype=xp.float32, device=q.device)
    else:
        import numpy as xp
        kw = dict(dtype=xp.float32)
    out = xp.empty_like(q) if out is None else out
    lse = xp.empty((q.shape[0], q.shape[2], q.shape[1]), **kw) if return_lse else None
    return xp, out, lse


def _grad_guard(what, q, cache, sink_logits, out, call):
    """torch with grad mode on and q, the cache or sink_logits requiring grad: the kernels are forward-only, so the
    result gets a grad_fn whose backward raises (out= refuses at once: autograd cannot record a write into it).
    None when autograd has nothing to record (the plain call follows)."""
    if cache.lib != "torch":
        return None
    from . import _torch_ops
    if not _torch_ops.needs_grad(q, cache.k, cache.v, sink_logits):
        return None
    if out is not None:
        raise RuntimeError(f"{what}(out=...) does not support automatic differentiation, but an input requires grad: "
                           f"{what} {_torch_ops.BACKWARD_ERROR}")
    return _torch_ops.forward_only(what, call, q, cache.k, cache.v, sink_logits)


def decode(q, cache: KVCache, *, causal=True, scale=None, window=(-1, -1), sink_tokens=0, sink_logits=None,
           softcap=0.0, return_lse=False, backend="auto", out=None, max_kv_len=-1, num_splits=0):
    """Attention of the last q_len tokens of each sequence (q [batch, q_len, heads, D], q_len 1..8 on CUDA) over
    the whole cache. Masks as flashlite.attention (causal is bottom-right: query i sits at position length - q_len
    + i). On CUDA: one split-KV kernel (flash-decoding, GQA heads packed) plus a combine kernel (on sm_90 the splits
    merge inside a thread-block cluster instead where they fit one); the split workspace comes from torch's allocator. max_kv_len: the length bound the split plan serves (-1: the longest sequence now; give
    the capacity when the call is captured in a CUDA graph that is replayed as sequences grow). Returns out [and the
    fp32 LSE, shape [batch, heads, q_len]]. Forward-only (see _grad_guard)."""
    lib = _check_arrays(q, cache, out, sink_logits)
    if type(max_kv_len) is not int or not -1 <= max_kv_len < 2**31:
        max_kv_len = _args.int_value(max_kv_len, "max_kv_len", -1, 2**31 - 1,
                                     "-1 (the longest sequence now) or a length >= it, within int32")
    if type(num_splits) is not int or not 0 <= num_splits < 2**31:
        num_splits = _args.int_value(num_splits, "num_splits", 0, 2**31 - 1, "0 (choose) or a split count > 0")
    recorded = _grad_guard("flashlite.decode", q, cache, sink_logits, out, lambda: decode(
        q, cache, causal=causal, scale=scale, window=window, sink_tokens=sink_tokens, sink_logits=sink_logits,
        softcap=softcap, return_lse=return_lse, backend=backend, max_kv_len=max_kv_len, num_splits=num_splits))
    if recorded is not None:
        return recorded
    xp, out, lse = _outputs(q, cache, out, return_lse)
    allocate = None
    if cache.lib == "torch" and q.is_cuda:  # the split workspace from torch's caching allocator (graph-capturable)
        allocate = lambda n: _dl(xp.empty(n, dtype=xp.uint8, device=q.device))  # noqa: E731
    _native(_C.decode, "flashlite.decode", lib, _decode_named(q, out, lse, sink_logits),
            lambda: _decode_call(q, cache, out, lse, causal, scale, window, sink_tokens, sink_logits, softcap, backend),
            max_kv_len=max_kv_len, num_splits=num_splits, allocate=allocate)
    return (out, lse) if lse is not None else out


def prefill(q, cache: KVCache, *, causal=True, scale=None, window=(-1, -1), sink_tokens=0, sink_logits=None,
            softcap=0.0, cu_seqlens_q=None, return_lse=False, backend="auto", out=None):
    """Prefill / chunked prefill from the cache: a chunk of new queries per sequence (after append_kv wrote its K/V)
    attends over the whole cached sequence; query i of a chunk of n tokens sits at position length - n + i. q is
    [batch, q_len, heads, D], or ragged [1, total_q, heads, D] with cu_seqlens_q (int32 [batch + 1] on the CPU: the
    chunk of sequence b is rows cu[b] .. cu[b+1] - 1). Any chunk length; on CUDA the fused tensor-core kernel reads
    K/V from the cache (through the page table when paged). Returns out [and the fp32 LSE]. Forward-only (see
    _grad_guard)."""
    lib = _check_arrays(q, cache, out, sink_logits)
    cu_seqlens_q = _check.index_array(cu_seqlens_q, "cu_seqlens_q", lib)
    recorded = _grad_guard("flashlite.prefill", q, cache, sink_logits, out, lambda: prefill(
        q, cache, causal=causal, scale=scale, window=window, sink_tokens=sink_tokens, sink_logits=sink_logits,
        softcap=softcap, cu_seqlens_q=cu_seqlens_q, return_lse=return_lse, backend=backend))
    if recorded is not None:
        return recorded
    xp, out, lse = _outputs(q, cache, out, return_lse)
    conv = _dl if lib == "torch" else (lambda a: a)
    _native(_C.prefill, "flashlite.prefill", lib, _decode_named(q, out, lse, sink_logits, cu_seqlens_q),
            lambda: _decode_call(q, cache, out, lse, causal, scale, window, sink_tokens, sink_logits, softcap, backend)
            + (conv(cu_seqlens_q),))
    return (out, lse) if lse is not None else out


def decode_kernel_name(q, cache: KVCache, *, causal=True, scale=None, window=(-1, -1), sink_tokens=0,
                       sink_logits=None, softcap=0.0, backend="auto"):
    """Which kernel decode() would run, e.g. "cuda_decode_split_bf16_d128_contiguous (splits 32, combine kernel)".
    Validates the arguments."""
    lib = _check_arrays(q, cache, None, sink_logits)
    if lib == "torch":
        import torch
        out = torch.empty_like(q)
    else:
        import numpy as np
        out = np.empty_like(q)
    return _native(_C.decode_kernel_name, "flashlite.decode_kernel_name", lib, _decode_named(q, out, None, sink_logits),
                   lambda: _decode_call(q, cache, out, None, causal, scale, window, sink_tokens, sink_logits, softcap,
                                        backend))
