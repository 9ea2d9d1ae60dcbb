"""flashlite.hf: attn_implementation="flite" in transformers (skips without torch, transformers or a CUDA GPU).

A tiny random LlamaForCausalLM (GQA and MHA) against the same model on "sdpa": logits, greedy generate() with
dynamic and static caches; the attention function against SDPA on hand-made masks (static-cache padding with a
different valid length per row, sliding window, left padding falling back / raising under strict)."""
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
import flashlite  # noqa: E402

if not (torch.cuda.is_available() and flashlite.with_cuda):
    pytest.skip("needs a CUDA GPU and flashlite built with CUDA", allow_module_level=True)

import flashlite.hf as flhf  # noqa: E402

flhf.register()


def _model(dtype, kv_heads=2, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=kv_heads, head_dim=64,
                                   max_position_embeddings=256, initializer_range=0.1, attn_implementation="sdpa")
    return transformers.LlamaForCausalLM(cfg).to(device="cuda", dtype=dtype).eval()


def _ids(batch, seq, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 512, (batch, seq), generator=g).cuda()


@pytest.fixture
def calls(monkeypatch):
    """Counts the flashlite kernel calls made through the hook (so a silent fallback cannot pass a test)."""
    count = [0]
    real = flhf._attention

    def counting(*a, **kw):
        count[0] += 1
        return real(*a, **kw)

    monkeypatch.setattr(flhf, "_attention", counting)
    return count


def _logits(model, impl, ids):
    model.set_attn_implementation(impl)
    with torch.no_grad():
        return model(ids).logits.float()


@pytest.mark.parametrize("kv_heads", [2, 4])
def test_logits_fp32_match_sdpa(kv_heads, calls):
    model, ids = _model(torch.float32, kv_heads), _ids(2, 37)
    ref = _logits(model, "sdpa", ids)
    fallbacks = flhf.fallbacks
    got = _logits(model, flhf.NAME, ids)
    assert calls[0] == 2 and flhf.fallbacks == fallbacks  # both layers ran flashlite
    err = (got - ref).abs().max().item()
    assert err <= 1e-4 * ref.abs().max().item(), err


def test_logits_bf16_within_sdpa_error(calls):
    """bf16: flashlite's error against the fp32 model is at most about sdpa-bf16's own error."""
    model, ids = _model(torch.float32), _ids(2, 61)
    exact = _logits(model, "sdpa", ids)
    model = model.to(torch.bfloat16)
    ref, got = _logits(model, "sdpa", ids), _logits(model, flhf.NAME, ids)
    assert calls[0] == 2 and torch.isfinite(got).all()
    err_ref, err_got = (ref - exact).abs().max().item(), (got - exact).abs().max().item()
    assert err_got <= 2 * err_ref + 1e-3, (err_got, err_ref)
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean().item() >= 0.95


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_generate_greedy_fp32_equal(cache, calls):
    model, ids = _model(torch.float32), _ids(2, 23)
    kw = dict(max_new_tokens=24, do_sample=False, min_new_tokens=24, pad_token_id=0)
    if cache == "static":
        kw.update(cache_implementation="static", disable_compile=True)
    model.set_attn_implementation("sdpa")
    with torch.no_grad():
        ref = model.generate(ids, **kw)
    model.set_attn_implementation(flhf.NAME)
    fallbacks = flhf.fallbacks
    with torch.no_grad():
        got = model.generate(ids, **kw)
    assert calls[0] == 2 * 24 and flhf.fallbacks == fallbacks  # prefill + 23 decode steps, two layers each
    assert got.shape == (2, 23 + 24) and torch.equal(got, ref)


class _Module(torch.nn.Module):
    is_causal = True


def _qkv(batch, q_len, kv_len, hq=4, hkv=2, d=64, seed=3):
    g = torch.Generator().manual_seed(seed)
    mk = lambda h, s: torch.randn(batch, h, s, d, generator=g).cuda()  # noqa: E731  [B, H, S, D]
    return mk(hq, q_len), mk(hkv, kv_len), mk(hkv, kv_len)


def _sdpa(q, k, v, mask):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True).transpose(1, 2)


def _prefix_causal_mask(lengths, q_len, kv_len, window=None):
    """[B, 1, q, kv] bool: first L_b keys valid, causal bottom-right, optional HF sliding window (W keys)."""
    j = torch.arange(kv_len)[None, None, :]
    pos = torch.arange(q_len)[None, :, None] + (torch.tensor(lengths)[:, None, None] - q_len)
    m = j <= pos
    if window:
        m &= j > pos - window
    return m[:, None].cuda()


@pytest.mark.parametrize("q_len,lengths,window,additive", [(1, [9, 30], None, False), (5, [17, 17], None, True),
                                                           (4, [12, 40], 7, False), (1, [40, 25], 8, False)])
def test_static_cache_mask_sliced(q_len, lengths, window, additive, calls):
    kv_len = 48  # the static cache's maximum length; keys past L_b are unwritten slots, poisoned here
    q, k, v = _qkv(len(lengths), q_len, kv_len)
    for b, n in enumerate(lengths):
        k[b, :, n:], v[b, :, n:] = float("nan"), float("nan")
    mask = _prefix_causal_mask(lengths, q_len, kv_len, window)
    ref_mask = mask
    if additive:
        mask = torch.zeros(mask.shape, device="cuda").masked_fill(~mask, torch.finfo(torch.float32).min)
    fallbacks = flhf.fallbacks
    out, weights = flhf.attention_forward(_Module(), q, k, v, mask, scaling=0.125, sliding_window=window)
    assert weights is None and flhf.fallbacks == fallbacks and calls[0] >= 1
    kf, vf = k.nan_to_num(0.0), v.nan_to_num(0.0)
    ref = torch.nn.functional.scaled_dot_product_attention(q, kf, vf, attn_mask=ref_mask, scale=0.125,
                                                           enable_gqa=True).transpose(1, 2)
    assert out.shape == (len(lengths), q_len, 4, 64)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)


def test_no_mask_prefill_into_static_cache():
    """No mask with more keys than queries: SDPA's top-left is_causal, i.e. the first q_len keys."""
    q, k, v = _qkv(2, 6, 32)
    k[:, :, 6:], v[:, :, 6:] = float("nan"), float("nan")
    out, _ = flhf.attention_forward(_Module(), q, k, v, None)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k[:, :, :6], v[:, :, :6], is_causal=True,
                                                           enable_gqa=True).transpose(1, 2)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)


def test_left_padding_falls_back_or_raises(calls):
    q, k, v = _qkv(2, 5, 5)
    mask = _prefix_causal_mask([5, 5], 5, 5)
    mask[1, :, :, :2] = False  # row 1 is left-padded by two tokens
    mask[1, :, :2, 0] = True   # (HF un-masks fully masked rows so that SDPA returns no NaN)
    fallbacks = flhf.fallbacks
    out, _ = flhf.attention_forward(_Module(), q, k, v, mask)
    assert flhf.fallbacks == fallbacks + 1 and calls[0] == 0
    torch.testing.assert_close(out, _sdpa(q, k, v, mask), atol=1e-6, rtol=1e-6)
    flhf.register(strict=True)
    try:
        with pytest.raises(ValueError, match="attention_mask"):
            flhf.attention_forward(_Module(), q, k, v, mask.clone())
    finally:
        flhf.register(strict=False)


def test_register_refuses_flash_names():
    with pytest.raises(ValueError, match="flash"):
        flhf.register("flashlite")
    assert flhf.NAME in transformers.AttentionInterface._global_mapping


def test_rejects_dropout_and_output_attentions():
    q, k, v = _qkv(1, 3, 3)
    with pytest.raises(ValueError, match="dropout"):
        flhf.attention_forward(_Module(), q, k, v, None, dropout=0.1)
    with pytest.raises(ValueError, match="output_attentions"):
        flhf.attention_forward(_Module(), q, k, v, None, output_attentions=True)
