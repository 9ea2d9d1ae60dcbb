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
to its causal position (optionally within the sliding window) or all of them: the masks transformers builds for a
StaticCache's unwritten tail, for left padding (batched generation), right padding (training batches) and an encoder's
key padding. Rows alike run as one call with K/V sliced to the run; rows that differ (from 64 queries a row) as
variable-length calls over their gathered keys, else one call per stretch of rows alike. Rows that pack several causal
sequences (the block-diagonal mask transformers builds for a packed training batch from position_ids) run as one
variable-length call (flashlite/_masks.py). Reading the mask costs one host sync per forward (the result is kept for
the other layers, which receive the same mask tensor). Any other mask (a custom pattern, a real bias) runs torch's
SDPA with the mask instead -- or, for softcap and sinks, which SDPA lacks, the attention written out as transformers'
eager does -- and `fallbacks` counts those calls; register(strict=True) raises ValueError instead.
"""
from __future__ import annotations

import torch

from . import _args, _check, _masks
from ._torch_ops import attention as _attention

NAME = "flite"
fallbacks = 0  # calls that ran the fallback (SDPA or eager) because the mask was not one flashlite expresses
_strict = False


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
    # a row without a visible key (and no sink): zeros, as flashlite's kernels give, and no NaN in its gradient
    empty = torch.isneginf(s).all(dim=-1, keepdim=True)
    p = torch.softmax(s.masked_fill(empty, 0.0), dim=-1).masked_fill(empty, 0.0)
    if sink_logits is not None:
        p = p[..., :-1]
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
    # With a mask, the mask alone says who sees what (is_causal included): an encoder's key padding is a run of keys
    # that every query sees.
    plan = _masks.plan(attention_mask, batch, q_len, kv_len, window_left)
    if plan is None:
        return _fallback(module, query, key, value, attention_mask, scaling, softcap, sinks), None

    def call(q, k, v, causal, window, cu_seqlens_q=None, cu_seqlens_k=None):
        return _attention(q, k, v, causal=causal, scale=scaling, window=window, softcap=softcap, sink_logits=sinks,
                          cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
    return _masks.attend(q, k, v, plan, window_left, call), None
