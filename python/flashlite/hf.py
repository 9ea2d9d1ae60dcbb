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
is accepted when it is exactly "the first L keys are valid, causal aligned bottom-right, optional sliding window" with
one L per batch row -- a StaticCache pads K/V to its maximum length and masks the tail, and this is that mask; K/V
are then sliced to L (rows with different L run one at a time). Reading the mask costs one host sync per forward
(the result is kept for the other layers, which receive the same mask tensor). Any other mask (left padding in a
batch, a custom or additive bias) runs torch's SDPA with the mask instead, and `fallbacks` counts those calls;
register(strict=True) raises ValueError instead.
"""
from __future__ import annotations

import weakref

import torch

from . import _args, _check
from ._torch_ops import attention as _attention

NAME = "flite"
fallbacks = 0  # calls that ran torch SDPA because the mask was not one flashlite expresses
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
    """The valid key count per batch row if the mask is "first L keys, causal bottom-right, window_left", else None."""
    vis = _visible(mask)
    if vis is None or vis.shape[-2:] != (q_len, kv_len) or vis.shape[0] not in (1, batch):
        return None
    lengths = vis[:, -1, :].sum(-1)  # (b,): the last query sees every valid key (or its window)
    if window_left >= 0:
        # with a window the last row does not show L; the last visible key of the last row does
        idx = torch.arange(kv_len, device=vis.device)
        lengths = torch.where(vis[:, -1, :], idx + 1, 0).amax(-1)
    i = torch.arange(q_len, device=vis.device)[:, None]
    j = torch.arange(kv_len, device=vis.device)[None, :]
    pos = i + (lengths[:, None, None] - q_len)  # the key index of query i
    expect = (j <= pos) & (pos >= 0)
    if window_left >= 0:
        expect &= j >= pos - window_left
    if not bool(torch.equal(expect, vis)):
        return None
    return [int(x) for x in lengths.tolist()] * (batch if vis.shape[0] == 1 else 1)


def _lengths_for(mask, batch, q_len, kv_len, window_left):
    global _mask_memo
    ref, result = _mask_memo
    if ref is not None and ref() is mask and result[0] == (batch, q_len, kv_len, window_left):
        return result[1]
    lengths = _analyse(mask, batch, q_len, kv_len, window_left)
    _mask_memo = (weakref.ref(mask), ((batch, q_len, kv_len, window_left), lengths))
    return lengths


def _sdpa_fallback(module, query, key, value, mask, scaling, softcap, sink_logits):
    global fallbacks
    if _strict:
        raise ValueError(f"attention_mask of shape {tuple(mask.shape)} is not a causal mask over a prefix of the keys "
                         "(e.g. left padding or an additive bias); flashlite cannot express it (strict=True)")
    if softcap:
        raise ValueError(f"softcap={softcap} with an attention mask flashlite cannot express: no fallback has softcap")
    if sink_logits is not None:
        raise ValueError("attention sinks (s_aux) with an attention mask flashlite cannot express: the SDPA fallback "
                         "has no sink logits")
    fallbacks += 1
    return torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, scale=scaling, enable_gqa=query.shape[1] != key.shape[1]).transpose(1, 2)


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
        return _sdpa_fallback(module, query, key, value, attention_mask, scaling, softcap, sinks), None

    lengths = _lengths_for(attention_mask, batch, q_len, kv_len, window_left)
    if lengths is None or min(lengths) < q_len:
        return _sdpa_fallback(module, query, key, value, attention_mask, scaling, softcap, sinks), None
    opts = dict(causal=True, scale=scaling, window=window, softcap=softcap, sink_logits=sinks)
    if all(n == lengths[0] for n in lengths):
        n = lengths[0]
        return _attention(q, k[:, :n], v[:, :n], **opts), None
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)  # (batch, q_len, q_heads, head_dim)
    for b, n in enumerate(lengths):
        out[b:b + 1] = _attention(q[b:b + 1], k[b:b + 1, :n], v[b:b + 1, :n], **opts)
    return out, None
