"""Hugging Face transformers hot swap: `attn_implementation="flite"`.

    import flashlite.hf
    flashlite.hf.register()                                                      # returns "flite"
    model = LlamaForCausalLM.from_pretrained(path, attn_implementation="flite")   # or
    model.set_attn_implementation("flite")

The name is "flite", not "flashlite": transformers treats every implementation name containing "flash" as a flash-attn
variant and tries to import or download that package (transformers 5.17, utils/generic.is_flash_attention_requested).

register() adds the name to transformers' AttentionInterface (the attention function) and AttentionMaskInterface
(the mask builder: the same one as "sdpa", so the model hands over either no mask or a 4-D boolean mask).
Prefill and decode both run flashlite's fused forward (torch.ops.flashlite.attention): transformers' caches hand the
attention function the whole K/V, and one query with the bottom-right causal mask is a decode step. sliding_window
(HF counts the query's own key: window_left = sliding_window - 1), softcap and gpt-oss's attention sinks (s_aux, as
sink_logits) pass through. Differentiable: a model on "flite" trains (the sinks get their gradient too).

Masks. No mask means SDPA's is_causal semantics (when there are more keys than queries, which only happens for a
prefill into an empty StaticCache, the keys past the queries are slots not yet written and are dropped). A 4-D mask
(boolean, or additive 0 / -inf) is accepted when each batch row's valid keys are one run and each query sees those up
to its causal position (optionally within the sliding window): the masks transformers builds for a StaticCache's
unwritten tail, for left padding (batched generation) and for right padding (training batches). K/V are sliced to
the run; rows with different runs take one call each. Reading the mask costs one host sync per forward (the result is
kept for the other layers, which receive the same mask tensor). Any other mask (a custom pattern, a real bias) runs
torch's SDPA with the mask instead -- or, for softcap and sinks, which SDPA lacks, the attention written out as
transformers' eager does -- and `fallbacks` counts those calls; register(strict=True) raises ValueError instead.
"""
from __future__ import annotations

import weakref

import torch

from . import _args, _check
from ._torch_ops import attention as _attention

NAME = "flite"
fallbacks = 0  # calls that ran the fallback (SDPA or eager) because the mask was not one flashlite expresses
_strict = False
_mask_memo = (None, None)  # (weakref to the last mask tensor, its analysis): layers share one mask per forward


def register(name: str = NAME, strict: bool = False) -> str:
    """Registers the attention function and its mask builder under `name` with transformers; returns the name."""
    global _strict
    if not isinstance(name, str):
        raise TypeError(f"name is {_args.show(name)}; expected a string (the attn_implementation name, e.g. 'flite')")
    if not name.strip():
        raise ValueError(f"name is {name!r}; expected a non-empty attn_implementation name, e.g. 'flite'")
    strict = _args.flag(strict, "strict")
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    if "flash" in name:
        raise ValueError(f"name {name!r} contains 'flash', which transformers reserves for flash-attn packages "
                         "(it would try to import or download one); pick another, e.g. the default 'flite'")
    _strict = strict
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name


def _visible(mask: torch.Tensor) -> torch.Tensor | None:
    """A boolean [B, q, kv] view of a 4-D mask (True = attend), or None when the mask is not a pure 0/-inf pattern
    or differs between heads."""
    if mask.dim() != 4:
        return None
    if mask.dtype == torch.bool:
        vis = mask
    else:
        lowest = torch.finfo(mask.dtype).min
        vis = mask == 0
        if not bool(torch.all(vis | (mask <= lowest / 2))):  # a real additive bias (e.g. ALiBi)
            return None
    if vis.shape[1] != 1 and not bool(torch.all(vis == vis[:, :1])):
        return None
    return vis[:, 0]


def _analyse(mask: torch.Tensor, batch: int, q_len: int, kv_len: int, window_left: int):
    """Per batch row, the flashlite call that the mask is, or None when it is not one.

    The masks flashlite expresses: row b's valid keys are one run start..end-1, and query i sees key j in it iff
    j <= i + off (optionally j >= i + off - window_left too). transformers' padded masks are all of this form: a static
    cache's unwritten tail (off = L - q_len), left padding (start > 0) and right padding (end < q_len, off = 0). Keys
    start..end-1 become flashlite's keys, so its bottom-right position is p = i + (end - start) - q_len and query i
    sees local keys up to p + right, right = off + q_len - end: causal when right is 0, else the window (left, right).
    Returns [(start, end, right), ...] (one per batch row) or None."""
    vis = _visible(mask)
    if vis is None or vis.shape[-2:] != (q_len, kv_len) or vis.shape[0] not in (1, batch):
        return None
    idx = torch.arange(kv_len, device=vis.device)
    i = torch.arange(q_len, device=vis.device)[:, None]
    seen = vis.any(dim=1)  # [b, kv]: keys some query sees
    start = torch.where(seen, idx, kv_len).amin(-1)
    end = torch.where(seen, idx + 1, 0).amax(-1)
    last = torch.where(vis, idx, -1).amax(-1)  # [b, q]: each query's last visible key (-1: none)
    # off from a query whose last key is not the run's end (any such query gives it; the check below holds them all
    # to it), else the alignment of a static cache's prefix and of decode, end - q_len
    free = (last >= 0) & (last < end[:, None] - 1)
    off = torch.where(free.any(-1), torch.where(free, last - i[:, 0], -(2**31)).amax(-1), end - q_len)
    pos = i + off[:, None, None]  # [b, q, 1]
    j = idx[None, None, :]
    expect = (j >= start[:, None, None]) & (j < end[:, None, None]) & (j <= pos)
    if window_left >= 0:
        expect &= j >= pos - window_left
    if not bool(torch.equal(expect, vis)):
        return None
    rows = []
    for s, e, o in zip(start.tolist(), end.tolist(), off.tolist()):
        right = o + q_len - e
        if e <= s or right < 0 or (0 <= window_left < right and right >= q_len):
            return None  # a row without keys, queries that stop short of the run's end, or all past it
        rows.append((s, e, right))
    return rows * (batch if vis.shape[0] == 1 else 1)


def _rows_for(mask, batch, q_len, kv_len, window_left):
    global _mask_memo
    ref, result = _mask_memo
    if ref is not None and ref() is mask and result[0] == (batch, q_len, kv_len, window_left):
        return result[1]
    rows = _analyse(mask, batch, q_len, kv_len, window_left)
    _mask_memo = (weakref.ref(mask), ((batch, q_len, kv_len, window_left), rows))
    return rows


def _fallback(module, query, key, value, mask, scaling, softcap, sink_logits):
    """A mask flashlite cannot express: torch's SDPA with the mask, or, where the model has softcap or attention
    sinks (which SDPA lacks), the attention written out as transformers' eager runs it (float32 softmax)."""
    global fallbacks
    if _strict:
        raise ValueError(f"attention_mask of shape {tuple(mask.shape)} is not a causal mask over a run of keys "
                         "flashlite expresses (e.g. a custom pattern or an additive bias); strict=True")
    fallbacks += 1
    if not softcap and sink_logits is None:
        return torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, scale=scaling, enable_gqa=query.shape[1] != key.shape[1]).transpose(1, 2)
    group = query.shape[1] // key.shape[1]
    k, v = key.repeat_interleave(group, 1), value.repeat_interleave(group, 1)
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    s = (query @ k.transpose(-1, -2)).float() * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask.float()
    if sink_logits is not None:  # one more logit per head in the denominator, no value
        s = torch.cat([s, sink_logits.float().reshape(1, -1, 1, 1).expand(*s.shape[:-1], 1)], dim=-1)
    p = torch.softmax(s, dim=-1)
    if sink_logits is not None:
        p = p[..., :-1]
    p = p.nan_to_num(0.0)  # a row without a visible key (and no sink): zeros, as flashlite's kernels give
    return (p.to(value.dtype) @ v).transpose(1, 2)


def attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, sliding_window=None,
                      softcap=None, **kwargs):
    """transformers' attention-function contract: query [B, Hq, Sq, D], key/value [B, Hkv, Sk, D] (grouped-query
    heads are flashlite's native layout, no repeat); returns (attn_output [B, Sq, Hq, D], None). s_aux (gpt-oss's
    learned per-head attention sinks) becomes flashlite's sink_logits."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} is a {_check.typename(t)}; expected a torch.Tensor [batch, heads, seq, head_dim]")
        if t.dim() != 4:
            raise ValueError(f"{name} has shape {tuple(t.shape)}; expected 4-D [batch, heads, seq, head_dim]")
    if dropout and _args.real_value(dropout, "dropout"):
        raise ValueError(f"dropout is {_args.show(dropout)}; flashlite has no dropout (call model.eval(), or use "
                         "attention dropout 0)")
    if kwargs.get("output_attentions"):
        raise ValueError("output_attentions=True: flashlite never forms the attention matrix; use eager")
    if kwargs.get("position_bias") is not None:
        raise ValueError("position_bias is not supported by flashlite (an additive bias per score)")
    batch, _, q_len, _ = query.shape
    kv_len = key.shape[2]
    if sliding_window is not None and (type(sliding_window) is not int or sliding_window < 0):
        sliding_window = _args.int_value(sliding_window, "sliding_window", 0, 2**31 - 1, "None or a key count >= 1")
    window_left = sliding_window - 1 if sliding_window else -1  # HF's window counts the query's own key
    softcap = 0.0 if softcap is None else _args.real_value(softcap, "softcap")
    sinks = kwargs.get("s_aux")
    if sinks is not None and not isinstance(sinks, torch.Tensor):
        raise TypeError(f"s_aux is a {_check.typename(sinks)}; expected a torch.Tensor of attention-sink logits "
                        "[q_heads]")
    sinks = None if sinks is None else sinks.float()  # [Hq]: joins the softmax denominator only
    is_causal = kwargs.get("is_causal")
    is_causal = getattr(module, "is_causal", True) if is_causal is None else bool(is_causal)
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)  # [B, S, H, D] views, no copy
    window = (window_left, -1 if is_causal else window_left)

    if attention_mask is None:
        if is_causal and 1 < q_len < kv_len:  # SDPA's top-left is_causal: a prefill into an empty static cache
            k, v = k[:, :q_len], v[:, :q_len]
        return _attention(q, k, v, causal=is_causal, scale=scaling, window=window, softcap=softcap,
                          sink_logits=sinks), None
    if not is_causal:
        return _fallback(module, query, key, value, attention_mask, scaling, softcap, sinks), None

    rows = _rows_for(attention_mask, batch, q_len, kv_len, window_left)
    if rows is None:
        return _fallback(module, query, key, value, attention_mask, scaling, softcap, sinks), None

    def call(q, k, v, causal, window):
        return _attention(q, k, v, causal=causal, scale=scaling, window=window, softcap=softcap, sink_logits=sinks)

    def run(q, k, v, start, end, right):
        k, v = k[:, start:end], v[:, start:end]
        if window_left < 0 or right <= window_left:  # one window: (left, right) around the bottom-right position
            return call(q, k, v, not right, (window_left - right if window_left >= 0 else -1, right if right else -1))
        # Right padding longer than the window: the first q_len - right queries are causal over the run, the next
        # window_left see the band that ends at the run's last key (a window left of their position: their own
        # call), the rest see no key (zeros, as every kernel gives a row without keys).
        inside, band = q.shape[1] - right, window_left
        parts = [call(q[:, :inside], k, v, True, (window_left, -1)),
                 call(q[:, inside:inside + band], k, v, False, (0, band))]
        parts.append(parts[0].new_zeros((q.shape[0], right - band) + tuple(parts[0].shape[2:])))
        return torch.cat(parts, dim=1)
    if all(r == rows[0] for r in rows):
        return run(q, k, v, *rows[0]), None
    # rows with different valid keys (padding, a static cache's lengths) run one at a time
    return torch.cat([run(q[b:b + 1], k[b:b + 1], v[b:b + 1], *r) for b, r in enumerate(rows)]), None
