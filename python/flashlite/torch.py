"""PyTorch entry points: scaled_dot_product_attention with SDPA's [batch, heads, seq, head_dim] convention.

    from flashlite.torch import scaled_dot_product_attention as sdpa
    y = sdpa(q, k, v, is_causal=True)                    # q [B, H, S, D]

It reads the [B, H, S, D] inputs as flashlite's [B, S, H, D] (their seq and head dimensions swapped, no copy) and
returns a [B, H, S, D] view of a [B, S, H, D] result, so `y.transpose(1, 2).reshape(B, S, H * D)` is free. Eager calls
that autograd does not record pass the tensors as they are, with a flag telling the native layer their layout (no
transposes in Python); the others go through flashlite.attention's path on transposed views. The custom ops themselves
(torch.ops.flashlite.attention / attention_out) are registered on import.
"""
from __future__ import annotations

import torch as _torch

from . import _args, _check, _masks, _torch_ops
from ._torch_ops import attention

attention_op = _torch_ops.attention_op
attention_out_op = _torch_ops.attention_out_op

__all__ = ["scaled_dot_product_attention", "attention", "attention_op", "attention_out_op"]


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False, *, backend="auto"):
    """torch.nn.functional.scaled_dot_product_attention's signature and semantics on flashlite's kernels.

    Supported: 4-D inputs, is_causal (top-left aligned, as SDPA: query i sees keys j <= i), scale, enable_gqa, and an
    attn_mask (boolean, or additive 0 / -inf; broadcast as SDPA's) that is padding -- each batch row's visible keys one
    run, seen by every query or up to its causal position: the padding masks of batches of different lengths -- or
    packing (causal sequences packed in a row, block-diagonal); both run as the HF hook runs them (flashlite/_masks.py:
    rows alike in one call, rows that differ and packed rows as variable-length calls). Reading the mask syncs with
    the host, so torch.compile(fullgraph=True) cannot trace a masked call (it breaks the graph there). Not supported
    (ValueError): other masks and biases
    (flashlite.attention's window / sink options give the masks it knows), dropout_p > 0, is_causal with fewer
    queries than keys (SDPA's top-left alignment hides keys past the query index, which flashlite's bottom-right
    causal mask cannot express; flashlite.attention(causal=True) gives bottom-right).
    """
    if not (isinstance(query, _torch.Tensor) and isinstance(key, _torch.Tensor) and isinstance(value, _torch.Tensor)
            and query.dim() == 4 and key.dim() == 4 and value.dim() == 4):
        _refuse(query, key, value)
    if type(dropout_p) is not float or dropout_p != 0.0:
        if _args.real_value(dropout_p, "dropout_p") != 0.0:
            raise ValueError(f"dropout_p is {_args.show(dropout_p)}; flashlite has no dropout (expected 0.0)")
    if is_causal is not True and is_causal is not False:
        is_causal = _args.flag(is_causal, "is_causal")
    if enable_gqa is not True and enable_gqa is not False:
        enable_gqa = _args.flag(enable_gqa, "enable_gqa")
    q_shape, k_shape = query.shape, key.shape
    hq, hkv = q_shape[1], k_shape[1]
    if hq != hkv and not enable_gqa:
        raise ValueError(f"query has {hq} heads but key has {hkv}; pass enable_gqa=True for grouped-query attention")
    sq, sk = q_shape[2], k_shape[2]
    if attn_mask is not None:
        return _masked(query, key, value, attn_mask, is_causal, scale, backend)
    causal, window = False, (-1, -1)
    if is_causal:
        if sq == sk:
            causal = True
        elif sq > sk:
            window = (-1, sq - sk)  # top-left: key j visible iff j <= i, i.e. j <= p + (sq - sk) with p = i + sk - sq
        else:
            raise ValueError(f"is_causal with {sq} queries and {sk} keys: SDPA aligns the causal mask top-left, which "
                             "flashlite cannot express when seq_q < seq_k; use flashlite.attention(causal=True) for "
                             "the bottom-right alignment (the last query sees the last key)")
    try:
        options = _args.options(causal, scale, window, 0, 0.0, backend)
        if _torch_ops.eager_plain(query, key, value) and not _torch_ops.needs_grad(query, key, value):
            # Eager and nothing for autograd to record (flashlite.attention's eager branch): the kernel reads the
            # [B, H, S, D] tensors in place and writes a [B, H, S, D] view of a [B, S, H, D] out.
            query, key, value = _torch_ops.autocast_inputs(query, key, value)
            out = _torch_ops._new_heads_first(query)
            _torch_ops._run(query, key, value, out, None, None, None, None, *options, heads_first=True)
            return out
        # The checked path of flashlite.attention (options checked here, nothing else to convert): autograd, the
        # ops for torch.compile and tensor subclasses.
        out, _ = _torch_ops._attention_checked(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                                               None, None, None, None, options, False)
    except (TypeError, ValueError):  # a tensor DLPack cannot pass: name it as the caller did (query, not q)
        _check.explain(None, "flashlite.torch.scaled_dot_product_attention", "torch",
                       [(n, t, False, _check.FLOATS) for n, t in (("query", query), ("key", key), ("value", value))])
        raise
    return out.transpose(1, 2)


def _masked(query, key, value, attn_mask, is_causal, scale, backend):
    """scaled_dot_product_attention with a padding attn_mask (see its docstring); ValueError for other masks."""
    if is_causal:
        raise ValueError("attn_mask and is_causal=True together: pass one of them (as torch SDPA requires)")
    if not isinstance(attn_mask, _torch.Tensor):
        raise TypeError(f"attn_mask is a {_check.typename(attn_mask)}; expected a torch.Tensor (boolean, or additive "
                        "0 / -inf)")
    if attn_mask.requires_grad and _torch.is_grad_enabled():
        raise ValueError("attn_mask requires grad: a learned bias has a gradient, which flashlite's masks do not; "
                         "use torch SDPA")
    batch, heads, sq, sk = query.shape[0], query.shape[1], query.shape[2], key.shape[2]
    if sq == 0 or sk == 0:  # nothing for a mask to choose: the unmasked call (zeros, or an empty result)
        return scaled_dot_product_attention(query, key, value, scale=scale, enable_gqa=heads != key.shape[1],
                                            backend=backend)
    # torch refuses a mask whose heads do not broadcast; the reader would take one alike over fewer heads
    plan = _masks.plan(attn_mask, batch, sq, sk, -1) if attn_mask.dim() < 3 or attn_mask.shape[-3] in (1, heads) \
        else None
    if plan is None:
        raise ValueError(f"attn_mask of shape {tuple(attn_mask.shape)} and dtype {attn_mask.dtype} is not a padding "
                         f"or packing mask for {sq} queries and {sk} keys: "
                         "flashlite.torch.scaled_dot_product_attention takes masks whose every batch row sees one "
                         "run of keys, from every query or up to its causal position, or packs causal sequences "
                         "(block-diagonal); boolean, or additive 0 / -inf, the same for every head. Use torch SDPA for "
                         "others, or flashlite.attention(window=..., sink_tokens=...) for the masks it knows")
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)

    def call(q, k, v, causal, window, cu_seqlens_q=None, cu_seqlens_k=None):
        return attention(q, k, v, causal=causal, scale=scale, window=window, backend=backend,
                         cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
    return _masks.attend(q, k, v, plan, -1, call).transpose(1, 2)


def _refuse(query, key, value):
    """The TypeError / ValueError for a non-tensor or a tensor that is not 4-D (off the hot path)."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, _torch.Tensor):
            raise TypeError(f"{name} is a {_check.typename(t)}; expected a torch.Tensor")
        if t.dim() != 4:
            raise ValueError(f"{name} has shape {tuple(t.shape)}; flashlite supports 4-D [batch, heads, seq, head_dim]")
