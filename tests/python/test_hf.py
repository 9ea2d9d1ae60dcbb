"""flashlite.hf: attn_implementation="flite" in transformers (skips without torch or transformers). Every test runs on
the CPU (tiny random models built from configs, nothing downloaded) and again on CUDA when there is a GPU and flashlite
was built with CUDA.

A tiny random LlamaForCausalLM (GQA and MHA) against the same model on "sdpa": logits, greedy generate() with
dynamic and static caches. Tiny Llama, Mistral (sliding window), Qwen2 (sliding window on some layers), Gemma2
(sliding window, softcap, query_pre_attn_scalar) and gpt-oss (sliding window, attention sinks) against the same model
on transformers' own "eager" attention, with sequences longer than the window: logits and greedy generate() with
dynamic and static caches. The attention function against SDPA on hand-made masks (static-cache padding with a
different valid length per row, sliding window, left padding falling back / raising under strict) and against a
float64 evaluation of HF's eager semantics (sliding window, softcap, sinks)."""
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
import flashlite  # noqa: E402
import flashlite.hf as flhf  # noqa: E402
from flashlite import _masks  # noqa: E402

flhf.register()

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() and flashlite.with_cuda else [])


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


def _model(dtype, kv_heads=2, seed=0, device="cpu"):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=kv_heads, head_dim=64,
                                   max_position_embeddings=256, initializer_range=0.1, attn_implementation="sdpa")
    return transformers.LlamaForCausalLM(cfg).to(device=device, dtype=dtype).eval()


def _ids(batch, seq, seed=1, device="cpu", vocab=512):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, seq), generator=g).to(device)


def _set_impl(model, impl):
    """model.set_attn_implementation (transformers >= 4.54); older ones read the config's field at every call."""
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(impl)
    else:
        model.config._attn_implementation = impl


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
    _set_impl(model, impl)
    with torch.no_grad():
        return model(ids).logits.float()


@pytest.mark.parametrize("kv_heads", [2, 4])
def test_logits_fp32_match_sdpa(kv_heads, calls, device):
    model, ids = _model(torch.float32, kv_heads, device=device), _ids(2, 37, device=device)
    ref = _logits(model, "sdpa", ids)
    fallbacks = flhf.fallbacks
    got = _logits(model, flhf.NAME, ids)
    assert calls[0] == 2 and flhf.fallbacks == fallbacks  # both layers ran flashlite
    err = (got - ref).abs().max().item()
    assert err <= 1e-4 * ref.abs().max().item(), err


def test_logits_bf16_within_sdpa_error(calls, device):
    """bf16: flashlite's error against the fp32 model is at most about sdpa-bf16's own error."""
    model, ids = _model(torch.float32, device=device), _ids(2, 61, device=device)
    exact = _logits(model, "sdpa", ids)
    model = model.to(torch.bfloat16)
    ref, got = _logits(model, "sdpa", ids), _logits(model, flhf.NAME, ids)
    assert calls[0] == 2 and torch.isfinite(got).all()
    err_ref, err_got = (ref - exact).abs().max().item(), (got - exact).abs().max().item()
    assert err_got <= 2 * err_ref + 1e-3, (err_got, err_ref)
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean().item() >= 0.95


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_generate_greedy_fp32_equal(cache, calls, device):
    model, ids = _model(torch.float32, device=device), _ids(2, 23, device=device)
    kw = dict(max_new_tokens=24, do_sample=False, min_new_tokens=24, pad_token_id=0)
    if cache == "static":
        kw.update(cache_implementation="static", disable_compile=True)
    _set_impl(model, "sdpa")
    with torch.no_grad():
        ref = model.generate(ids, **kw)
    _set_impl(model, flhf.NAME)
    fallbacks = flhf.fallbacks
    with torch.no_grad():
        got = model.generate(ids, **kw)
    assert calls[0] == 2 * 24 and flhf.fallbacks == fallbacks  # prefill + 23 decode steps, two layers each
    assert got.shape == (2, 23 + 24) and torch.equal(got, ref)


class _Module(torch.nn.Module):
    is_causal = True


def _qkv(batch, q_len, kv_len, hq=4, hkv=2, d=64, seed=3, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    mk = lambda h, s: torch.randn(batch, h, s, d, generator=g).to(device)  # noqa: E731  [B, H, S, D]
    return mk(hq, q_len), mk(hkv, kv_len), mk(hkv, kv_len)


def _sdpa(q, k, v, mask):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True).transpose(1, 2)


def _prefix_causal_mask(lengths, q_len, kv_len, window=None, device="cpu"):
    """[B, 1, q, kv] bool: first L_b keys valid, causal bottom-right, optional HF sliding window (W keys)."""
    j = torch.arange(kv_len)[None, None, :]
    pos = torch.arange(q_len)[None, :, None] + (torch.tensor(lengths)[:, None, None] - q_len)
    m = j <= pos
    if window:
        m &= j > pos - window
    return m[:, None].to(device)


@pytest.mark.parametrize("q_len,lengths,window,additive", [(1, [9, 30], None, False), (5, [17, 17], None, True),
                                                           (4, [12, 40], 7, False), (1, [40, 25], 8, False)])
def test_static_cache_mask_sliced(q_len, lengths, window, additive, calls, device):
    kv_len = 48  # the static cache's maximum length; keys past L_b are unwritten slots, poisoned here
    q, k, v = _qkv(len(lengths), q_len, kv_len, device=device)
    for b, n in enumerate(lengths):
        k[b, :, n:], v[b, :, n:] = float("nan"), float("nan")
    mask = _prefix_causal_mask(lengths, q_len, kv_len, window, device=device)
    ref_mask = mask
    if additive:
        mask = torch.zeros(mask.shape, device=device).masked_fill(~mask, torch.finfo(torch.float32).min)
    fallbacks = flhf.fallbacks
    out, weights = flhf.attention_forward(_Module(), q, k, v, mask, scaling=0.125, sliding_window=window)
    assert weights is None and flhf.fallbacks == fallbacks and calls[0] >= 1
    kf, vf = k.nan_to_num(0.0), v.nan_to_num(0.0)
    ref = torch.nn.functional.scaled_dot_product_attention(q, kf, vf, attn_mask=ref_mask, scale=0.125,
                                                           enable_gqa=True).transpose(1, 2)
    assert out.shape == (len(lengths), q_len, 4, 64)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)


def test_no_mask_prefill_into_static_cache(device):
    """No mask with more keys than queries: SDPA's top-left is_causal, i.e. the first q_len keys."""
    q, k, v = _qkv(2, 6, 32, device=device)
    k[:, :, 6:], v[:, :, 6:] = float("nan"), float("nan")
    out, _ = flhf.attention_forward(_Module(), q, k, v, None)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k[:, :, :6], v[:, :, :6], is_causal=True,
                                                           enable_gqa=True).transpose(1, 2)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)


def test_left_padding_falls_back_or_raises(calls, device):
    q, k, v = _qkv(2, 5, 5, device=device)
    mask = _prefix_causal_mask([5, 5], 5, 5, device=device)
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


# Tiny random models of the architectures whose attention differs (nothing downloaded): against transformers' own
# "eager" attention (its plain matmul-softmax-matmul with the additive mask, sinks and softcap as the model defines
# them), in float32, on sequences longer than the sliding window (8 keys).
WINDOW = 8
_COMMON = dict(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, head_dim=64, max_position_embeddings=256, initializer_range=0.1)
ARCHS = {
    "llama": lambda: (transformers.LlamaConfig(**_COMMON), transformers.LlamaForCausalLM),
    "mistral": lambda: (transformers.MistralConfig(**_COMMON, sliding_window=WINDOW), transformers.MistralForCausalLM),
    "qwen2": lambda: (transformers.Qwen2Config(**_COMMON, use_sliding_window=True, sliding_window=WINDOW,
                                               max_window_layers=1), transformers.Qwen2ForCausalLM),  # layer 1 slides
    "gemma2": lambda: (transformers.Gemma2Config(**_COMMON, sliding_window=WINDOW, attn_logit_softcapping=2.0,
                                                 query_pre_attn_scalar=40), transformers.Gemma2ForCausalLM),
    "gpt_oss": lambda: (transformers.GptOssConfig(**_COMMON, sliding_window=WINDOW, num_local_experts=4,
                                                  num_experts_per_tok=2), transformers.GptOssForCausalLM),
}


def _arch_model(arch, device, seed=0):
    try:
        cfg, cls = ARCHS[arch]()
    except AttributeError as e:  # gpt-oss arrived in transformers 4.55
        pytest.skip(f"transformers {transformers.__version__} lacks {arch}: {e}")
    torch.manual_seed(seed)
    model = cls(cfg).to(device).eval()
    if arch == "gpt_oss":  # sinks large enough to matter next to scores of a few units
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.sinks.normal_(0.0, 2.0)
    return model


def _assert_logits_close(got, ref, what=""):
    err = (got - ref).abs().max().item()
    assert err <= 1e-4 * ref.abs().max().item(), f"{what}: max abs logit error {err:.3g}"


@pytest.mark.parametrize("arch", list(ARCHS))
def test_arch_logits_match_eager(arch, calls, device):
    model, ids = _arch_model(arch, device), _ids(2, 37, device=device, vocab=256)  # 37 tokens > the window of 8
    ref = _logits(model, "eager", ids)
    fallbacks = flhf.fallbacks
    got = _logits(model, flhf.NAME, ids)
    assert calls[0] == 2 and flhf.fallbacks == fallbacks  # both layers ran flashlite (no SDPA fallback)
    _assert_logits_close(got, ref, arch)


def test_sliding_window_matters(device):
    """The window changes the answer of these tests' models (so a wrong window cannot pass them)."""
    model, ids = _arch_model("mistral", device), _ids(2, 37, device=device, vocab=256)
    windowed = _logits(model, "eager", ids)
    model.config.sliding_window = 64  # longer than the sequence: no window
    full = _logits(model, "eager", ids)
    assert (windowed - full).abs().max().item() > 1e-2 * full.abs().max().item()


@pytest.mark.parametrize("cache", ["dynamic", "static", "left_padded"])
@pytest.mark.parametrize("arch", ["mistral", "gemma2", "gpt_oss"])
def test_arch_generate_matches_eager(arch, cache, calls, device):
    """Greedy generate() from a 21-token prompt: the prefill and the decode steps of sliding-window (and full)
    layers, the cache holding more tokens than the window. left_padded: a batch whose second prompt is 5 tokens
    shorter, left-padded as batched generation does (a dynamic cache; its rows take one call each)."""
    model, ids = _arch_model(arch, device), _ids(2, 21, device=device, vocab=256)
    steps = 6
    kw = dict(max_new_tokens=steps, min_new_tokens=steps, do_sample=False, pad_token_id=0,
              return_dict_in_generate=True, output_logits=True)
    if cache == "static":
        kw.update(cache_implementation="static", disable_compile=True)
    if cache == "left_padded":
        kw.update(attention_mask=_padding(2, 21, [0, 5], "left", device))
    _set_impl(model, "eager")
    with torch.no_grad():
        ref = model.generate(ids, **kw)
    _set_impl(model, flhf.NAME)
    fallbacks = flhf.fallbacks
    with torch.no_grad():
        got = model.generate(ids, **kw)
    assert (calls[0] >= 2 * steps if cache == "left_padded" else calls[0] == 2 * steps) and flhf.fallbacks == fallbacks
    assert torch.equal(got.sequences, ref.sequences)
    for step, (a, b) in enumerate(zip(got.logits, ref.logits)):
        _assert_logits_close(a.float(), b.float(), f"{arch} {cache} step {step}")


def _padding(batch, seq, pads, side, device):
    """A 2-D attention_mask: row b has pads[b] padding tokens on `side`."""
    mask = torch.ones(batch, seq, dtype=torch.long)
    for b, n in enumerate(pads):
        if n:
            mask[b, :n] = 0 if side == "left" else 1
            mask[b, seq - n:] = 0 if side == "right" else mask[b, seq - n:]
    return mask.to(device)


@pytest.mark.parametrize("side,pads", [("left", [0, 3, 7]), ("right", [0, 3, 7]), ("right", [0, 12, 0])])
@pytest.mark.parametrize("arch", ["llama", "mistral", "gpt_oss"])
def test_padded_batch_runs_flashlite(arch, side, pads, calls, device):
    """A padded batch (the masks transformers builds from a 2-D attention_mask, left or right padding, windows and
    sinks too) runs flashlite -- no fallback -- and every real token's logits equal eager's; the pad tokens' own rows
    are not compared (implementations differ there). Right padding of 12 is longer than the window (8): its pad rows
    see a band of keys left of their position (a call of its own), and past it none."""
    model, ids = _arch_model(arch, device), _ids(3, 21, device=device, vocab=256)
    attn = _padding(3, 21, pads, side, device)

    def logits(impl):
        _set_impl(model, impl)
        with torch.no_grad():
            return model(ids, attention_mask=attn).logits.float()

    ref = logits("eager")
    fallbacks = flhf.fallbacks
    got = logits(flhf.NAME)
    assert calls[0] >= 2 and flhf.fallbacks == fallbacks  # rows of different padding run one call each
    real = attn.bool()
    _assert_logits_close(got[real], ref[real], f"{arch} {side}")


def _hf_eager_f64(q, k, v, scaling, sliding_window=None, softcap=None, sinks=None):
    """HF's eager attention in float64, written out: query i (at key position i + kv_len - q_len) sees keys
    pos - sliding_window < j <= pos; softcap on the scaled scores; sinks join the softmax as one extra logit."""
    q, k, v = q.double(), k.double(), v.double()
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = q @ k.transpose(-1, -2) * scaling  # [B, H, q, kv]
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    q_len, kv_len = s.shape[-2:]
    pos = torch.arange(q_len)[:, None] + kv_len - q_len
    j = torch.arange(kv_len)[None, :]
    vis = j <= pos
    if sliding_window:
        vis &= j > pos - sliding_window
    s = s.masked_fill(~vis.to(s.device), float("-inf"))
    if sinks is not None:
        s = torch.cat([s, sinks.double().reshape(1, -1, 1, 1).expand(*s.shape[:-1], 1)], dim=-1)
    p = torch.softmax(s, dim=-1)[..., :kv_len]
    return (p @ v).transpose(1, 2)  # [B, q, H, D]


@pytest.mark.parametrize("q_len,kv_len", [(20, 20), (1, 20)])
@pytest.mark.parametrize("extra", ["window", "softcap", "sinks"])
def test_attention_forward_without_mask_matches_eager_semantics(q_len, kv_len, extra, device):
    """No mask (transformers passes none when is_causal suffices): the window, softcap and sinks reach the kernel."""
    q, k, v = _qkv(2, q_len, kv_len, device=device)
    opts = dict(scaling=0.2, sliding_window=5)
    if extra == "softcap":
        opts["softcap"] = 1.5
    if extra == "sinks":
        opts["s_aux"] = torch.tensor([1.5, -0.5, 3.0, 0.0], device=device)
    out, weights = flhf.attention_forward(_Module(), q, k, v, None, **opts)
    want = _hf_eager_f64(q, k, v, 0.2, 5, opts.get("softcap"), opts.get("s_aux"))
    assert weights is None
    torch.testing.assert_close(out.double(), want, atol=2e-5, rtol=1e-4)


def _masked_f64(q, k, v, vis, scaling, softcap=None, sinks=None):
    """Attention in float64 under a boolean mask [B, 1, q, kv] (q [B, Hq, S, D], GQA by repeat), softcap and sinks as
    transformers' eager; a row without a visible key (and its sink alone) gives zeros."""
    group = q.shape[1] // k.shape[1]
    qd, kd, vd = q.double(), k.double().repeat_interleave(group, 1), v.double().repeat_interleave(group, 1)
    sc = qd @ kd.transpose(-1, -2) * scaling
    if softcap:
        sc = softcap * torch.tanh(sc / softcap)
    sc = sc.masked_fill(~vis, float("-inf"))
    if sinks is not None:
        sc = torch.cat([sc, sinks.double().reshape(1, -1, 1, 1).expand(*sc.shape[:-1], 1)], dim=-1)
    p = torch.softmax(sc, -1)[..., :k.shape[2]].nan_to_num(0.0)
    return (p @ vd).transpose(1, 2)


@pytest.mark.parametrize("side,pads,window", [("right", [0, 12], 8), ("right", [3, 0], 8), ("left", [0, 6], 8),
                                              ("right", [0, 12], None)])
@pytest.mark.parametrize("sinks", [False, True])
def test_padding_masks_every_row(side, pads, window, sinks, calls, device):
    """Hand-made padding masks as transformers builds them (causal, the padding's keys hidden, optional window),
    against float64 on every row, the pad rows included: right padding longer than the window runs as three parts
    (causal, the band left of the pad rows, rows without keys)."""
    q, k, v = _qkv(2, 21, 21, device=device)
    pad = _padding(2, 21, pads, side, "cpu").bool()
    i, j = torch.arange(21)[:, None], torch.arange(21)[None, :]
    vis = (j <= i) & pad[:, None, :]
    if window:
        vis &= j > i - window
    vis = vis[:, None].to(device)
    s_aux = torch.tensor([1.5, -0.5, 3.0, 0.0], device=device) if sinks else None
    fallbacks = flhf.fallbacks
    out, _ = flhf.attention_forward(_Module(), q, k, v, vis, scaling=0.2, sliding_window=window, s_aux=s_aux)
    assert flhf.fallbacks == fallbacks and calls[0] >= 1
    torch.testing.assert_close(out.double(), _masked_f64(q, k, v, vis, 0.2, None, s_aux), atol=2e-5, rtol=1e-4)


def test_padded_and_packed_rows_keep_a_call_per_row_under_capture(calls, monkeypatch, device):
    """Under CUDA graph capture (faked here) rows that differ, and packed rows, run one call per row, as graphs can
    capture them (variable-length calls copy their offsets from the host), with the same result."""
    monkeypatch.setattr(_masks, "VARLEN_MIN_QUERIES", 1)
    q, k, v = _qkv(3, 13, 13, seed=4, device=device)
    i, j = torch.arange(13)[:, None], torch.arange(13)[None, :]
    pad = _padding(3, 13, [0, 4, 9], "right", "cpu").bool()
    seq = torch.tensor([[0] * 13, [0] * 5 + [1] * 8, [0] * 9 + [1] * 4])  # packed: sequences per row
    masks = {"padded": (pad[:, None, :] & (j <= i))[:, None],
             "packed": ((j <= i) & (seq[:, :, None] == seq[:, None, :]))[:, None]}
    for name, vis in masks.items():
        vis = vis.to(device)
        outs = []
        for capturing in (False, True):
            monkeypatch.setattr(_masks, "_capturing", lambda t: capturing)
            calls[0] = 0
            outs.append(flhf.attention_forward(_Module(), q, k, v, vis, scaling=0.2)[0])
            assert calls[0] == (3 if capturing else 1 if name == "packed" else 2), (name, capturing)
        torch.testing.assert_close(outs[1], outs[0], atol=2e-6, rtol=1e-5, msg=name)
        torch.testing.assert_close(outs[1].double(), _masked_f64(q, k, v, vis, 0.2), atol=2e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("kind,window,calls_made", [("right", None, 2), ("left", None, 1), ("left", 8, 1),
                                                     ("keys", None, 1), ("cache", None, 1), ("cache", 6, 1),
                                                     ("right", 8, 6)])  # (rows padded past the window: 2)
@pytest.mark.parametrize("extra", [None, "sinks", "softcap"])
def test_padded_rows_run_as_varlen_calls(kind, window, calls_made, extra, calls, monkeypatch, device):
    """Rows that differ (padding of four lengths, one row unpadded; a static cache's lengths; an encoder's key
    padding) run as one variable-length call over the gathered keys, right padding as two (its real rows and its pad
    rows), not one per row; right padding under a window keeps a call per row. Out against float64 on every row, pad
    rows included, and on the CPU every gradient against float64's."""
    monkeypatch.setattr(_masks, "VARLEN_MIN_QUERIES", 1)  # (the real threshold, 64 queries, makes slow tests)
    lengths, kv_len = [21, 15, 9, 4], 21
    q_len = 5 if kind == "cache" else kv_len
    q, k, v = _qkv(4, q_len, kv_len, seed=11, device=device)
    if kind == "cache":
        vis = _prefix_causal_mask(lengths, q_len, kv_len, window, device)
    else:
        i, j = torch.arange(kv_len)[:, None], torch.arange(kv_len)[None, :]
        pad = _padding(4, kv_len, [kv_len - n for n in lengths], "left" if kind == "left" else "right", "cpu").bool()
        vis = pad[:, None, :] & ((j <= i) if kind != "keys" else True)
        if window:
            vis &= j > i - window
        vis = vis[:, None].to(device)
    opts = {"s_aux": torch.tensor([1.5, -0.5, 3.0, 0.0], device=device)} if extra == "sinks" else \
        {"softcap": 1.5} if extra == "softcap" else {}
    grad = device == "cpu"  # (the CUDA backward takes fp16 / bf16)
    q, k, v = (t.requires_grad_(grad) for t in (q, k, v))
    fallbacks = flhf.fallbacks
    out, _ = flhf.attention_forward(_Module(), q, k, v, vis, scaling=0.2, sliding_window=window, **opts)
    assert flhf.fallbacks == fallbacks and calls[0] == calls_made
    want = _masked_f64(q, k, v, vis, 0.2, opts.get("softcap"), opts.get("s_aux"))
    torch.testing.assert_close(out.double(), want, atol=2e-5, rtol=1e-4)
    if grad:
        w = torch.randn(out.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
        got = torch.autograd.grad((out.double() * w).sum(), (q, k, v))
        ref = torch.autograd.grad((want * w).sum(), (q, k, v))
        for name, a, b in zip("qkv", got, ref):
            torch.testing.assert_close(a, b.float(), atol=1e-4, rtol=1e-4, msg=f"d{name}")


def test_fallback_rows_without_keys_have_no_nan(device):
    """The written-out fallback (softcap here) on an additive -inf mask in which a query sees no key: that row is
    zeros, and the gradients of the rows that count are finite."""
    q, k, v = (t.requires_grad_() for t in _qkv(1, 4, 4, device=device))
    i, j = torch.arange(4)[:, None], torch.arange(4)[None, :]
    vis = (j <= i) & (j >= 1)
    vis[3, 1] = False  # not a form flashlite runs: the fallback
    mask = torch.zeros(4, 4).masked_fill(~vis, float("-inf"))[None, None].to(device)
    fallbacks = flhf.fallbacks
    out, _ = flhf.attention_forward(_Module(), q, k, v, mask, scaling=0.2, softcap=5.0)
    assert flhf.fallbacks == fallbacks + 1
    assert torch.equal(out[:, 0], torch.zeros_like(out[:, 0]))
    out[:, 1:].sum().backward()
    assert all(bool(torch.isfinite(t.grad).all()) for t in (q, k, v))


@pytest.mark.parametrize("extra", ["sinks", "softcap"])
def test_fallback_keeps_sinks_and_softcap(extra, calls, device):
    """A mask flashlite cannot express (older transformers' un-masked key 0 for left padding's empty rows) on a model
    with sinks or softcap, which SDPA lacks: the fallback writes the attention out with them, not without."""
    q, k, v = _qkv(2, 5, 5, device=device)
    mask = _prefix_causal_mask([5, 5], 5, 5, device=device)
    mask[1, :, :, :2] = False
    mask[1, :, :2, 0] = True
    opts = {"s_aux": torch.tensor([1.5, -0.5, 3.0, 0.0], device=device)} if extra == "sinks" else {"softcap": 1.5}
    fallbacks = flhf.fallbacks
    out, _ = flhf.attention_forward(_Module(), q, k, v, mask, scaling=0.2, **opts)
    assert flhf.fallbacks == fallbacks + 1 and calls[0] == 0
    want = _masked_f64(q, k, v, mask, 0.2, opts.get("softcap"), opts.get("s_aux"))
    torch.testing.assert_close(out.double(), want, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("arch", ["llama", "mistral"])  # (transformers' gpt-oss builds no packed masks)
def test_packed_sequences_run_one_varlen_call(arch, calls, device):
    """Packed training batches (several sequences in a row, position_ids restarting at each; transformers builds a
    block-diagonal causal mask from them): one variable-length flashlite call per layer, logits and gradients equal to
    eager's (the rule of _check_training_step)."""
    model, ids = _arch_model(arch, device), _ids(1, 29, device=device, vocab=256)
    position_ids = torch.cat([torch.arange(n) for n in (11, 4, 14)])[None].to(device)  # three sequences, one > window
    model.train()

    def step(m):
        logits = m(ids, position_ids=position_ids, use_cache=False).logits.float()
        logits.square().mean().backward()
        return logits.detach()

    fallbacks = flhf.fallbacks
    _check_training_step(model, step, device, arch)
    assert calls[0] == 2 and flhf.fallbacks == fallbacks  # one call per layer


def test_encoder_key_padding_runs_flashlite(calls, device):
    """An encoder (BERT: not causal) with a padded batch: its key-padding mask is a run of keys every query sees,
    so it runs flashlite, and every real token's hidden state equals eager's."""
    cfg = transformers.BertConfig(vocab_size=256, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=256)
    torch.manual_seed(0)
    model = transformers.BertModel(cfg).to(device).eval()
    ids, attn = _ids(3, 19, device=device, vocab=256), _padding(3, 19, [0, 7, 14], "right", device)

    def hidden(impl):
        _set_impl(model, impl)
        with torch.no_grad():
            return model(ids, attention_mask=attn).last_hidden_state

    ref = hidden("eager")
    fallbacks = flhf.fallbacks
    got = hidden(flhf.NAME)
    assert calls[0] >= 2 and flhf.fallbacks == fallbacks
    real = attn.bool()
    _assert_logits_close(got[real], ref[real], "bert")


@pytest.mark.parametrize("arch", ["llama", "gpt_oss"])
def test_mixed_precision_training_matches_eager(arch, calls, device):
    """Mixed-precision training (float32 weights under torch.autocast to bf16), the usual way to train: the hook gets
    the rotated q and k in float32 beside a bf16 v and runs them in bf16, as SDPA would. Every parameter's gradient
    (float32) is about as far from a float32 eager step as eager's own under the same autocast is."""
    if device == "cuda" and arch == "gpt_oss":
        pytest.skip("bf16 noise flips gpt-oss's top-k expert routing (see test_training_gradients_match_eager)")
    model, ids = _arch_model(arch, device), _ids(2, 37, device=device, vocab=256)
    model.train()

    def grads(impl, autocast):
        _set_impl(model, impl)
        model.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast):
            loss = model(ids, labels=ids).loss
        loss.backward()
        return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}

    base = grads("eager", False)
    ref = grads("eager", True)
    calls[0] = 0
    got = grads(flhf.NAME, True)
    assert calls[0] == 2  # both layers ran flashlite under autocast (no fallback, no error on the mixed dtypes)
    assert got.keys() == ref.keys()
    for name in ref:
        assert got[name].dtype == torch.float32, name
        slack = 3 * (ref[name] - base[name]).abs().max().item() + 2e-2 * base[name].abs().max().item()
        err = (got[name] - base[name]).abs().max().item()
        assert err <= max(slack, 1e-9), f"{arch} {name}: max gradient error {err:.3g} (allowed {slack:.3g})"


def _check_training_step(model, step, device, what):
    """step(model) runs a forward and backward and returns what to compare besides every parameter's gradient
    (logits, or the loss). On the CPU (float32) flashlite's equal eager's to float32 rounding. The CUDA backward takes
    fp16 / bf16 only, so there the model runs in bf16 and must be about as far from a float32 eager step as bf16 eager
    is: FlashAttention's kernel rule is 2x on the same inputs; layer 0's dout already carries layer 1's bf16 error, so
    for 2 layers 3x. Returns flashlite's gradients."""
    def run(impl, dtype=torch.float32):
        m = model.to(dtype)
        _set_impl(m, impl)
        m.zero_grad(set_to_none=True)
        out = step(m).float()
        return out, {n: p.grad.detach().float().clone() for n, p in m.named_parameters() if p.grad is not None}

    base, base_grads = run("eager")
    if device == "cpu":
        got, got_grads = run(flhf.NAME)
        out_slack = 1e-4 * base.abs().max().item()
        slack = {n: 1e-3 * g.abs().max().item() for n, g in base_grads.items()}
    else:
        ref, ref_grads = run("eager", torch.bfloat16)
        got, got_grads = run(flhf.NAME, torch.bfloat16)
        model.float()
        out_slack = 3 * (ref - base).abs().max().item() + 1e-2 * base.abs().max().item()
        slack = {n: 3 * (ref_grads[n] - g).abs().max().item() + 2e-2 * g.abs().max().item()
                 for n, g in base_grads.items()}
    err = (got - base).abs().max().item()
    assert err <= out_slack, f"{what}: max output error {err:.3g} (allowed {out_slack:.3g})"
    assert got_grads.keys() == base_grads.keys()
    for name, g in base_grads.items():
        err = (got_grads[name] - g).abs().max().item()
        assert err <= max(slack[name], 1e-9), f"{what} {name}: max gradient error {err:.3g} (allowed {slack[name]:.3g})"
    return got_grads


@pytest.mark.parametrize("arch", list(ARCHS))
def test_training_gradients_match_eager(arch, calls, device):
    """A training step's gradients on "flite" equal transformers' "eager" attention's: every parameter, gpt-oss's
    learned sinks included (their gradient flows through flashlite's sink_logits)."""
    if device == "cuda" and arch == "gpt_oss":
        pytest.skip("bf16 noise flips gpt-oss's top-k expert routing, so its router's gradient jumps; its bf16 "
                    "training is compared by loss curve (bench/train.py), its sinks' gradient by the kernel tests")
    model, ids = _arch_model(arch, device), _ids(2, 37, device=device, vocab=256)
    model.train()

    def step(m):
        loss = m(ids, labels=ids).loss
        loss.backward()
        return loss.detach()

    got = _check_training_step(model, step, device, arch)
    assert calls[0] == 2  # both layers ran flashlite
    if arch == "gpt_oss":
        assert any(n.endswith("sinks") for n in got), "the sinks got no gradient"


@pytest.mark.parametrize("seed", range(6))
def test_random_masks_run_exactly_or_fall_back(seed, device):
    """Random masks near the expressible forms (runs of keys, offsets, windows, q_len != kv_len), some with one entry
    flipped: whatever the mask reader accepts runs flashlite and equals float64 on every row; the rest falls back
    (and is exact too)."""
    g = torch.Generator().manual_seed(seed)
    ran = {"flashlite": 0, "fallback": 0}
    for case in range(12):
        batch = int(torch.randint(1, 4, (1,), generator=g))
        kv_len = int(torch.randint(2, 30, (1,), generator=g))
        q_len = int(torch.randint(1, kv_len + 1, (1,), generator=g))
        window = int(torch.randint(1, 12, (1,), generator=g)) if case % 2 else None
        q, k, v = _qkv(batch, q_len, kv_len, seed=seed * 100 + case, device=device)
        i, j = torch.arange(q_len)[:, None], torch.arange(kv_len)[None, :]
        rows = []
        for _ in range(batch):
            start = int(torch.randint(0, kv_len, (1,), generator=g))
            end = int(torch.randint(start + 1, kv_len + 1, (1,), generator=g))
            off = start - q_len + 1 + int(torch.randint(0, kv_len + 2, (1,), generator=g))  # the last query sees start
            vis = (j >= start) & (j < end) & (j <= i + off)
            if window:
                vis &= j > i + off - window
            rows.append(vis)
        vis = torch.stack(rows)[:, None]
        if case % 3 == 2:  # one entry flipped: mostly not expressible any more
            b, r, c = (int(torch.randint(0, n, (1,), generator=g)) for n in (batch, q_len, kv_len))
            vis[b, 0, r, c] = ~vis[b, 0, r, c]
        vis = vis.to(device)
        fallbacks = flhf.fallbacks
        out, _ = flhf.attention_forward(_Module(), q, k, v, vis, scaling=0.2, sliding_window=window)
        ran["fallback" if flhf.fallbacks > fallbacks else "flashlite"] += 1
        torch.testing.assert_close(out.double(), _masked_f64(q, k, v, vis, 0.2), atol=2e-5, rtol=1e-4,
                                   msg=f"case {case}: batch {batch}, q {q_len}, kv {kv_len}, window {window}")
    assert ran["flashlite"] >= 4, ran


@pytest.mark.parametrize("seed", range(4))
def test_random_packed_masks_run_exactly_or_fall_back(seed, device):
    """Random block-diagonal causal masks (sequences of random lengths packed in each row, optional window), some
    with one entry flipped: exact on every row against float64, run as variable-length calls or fallen back."""
    g = torch.Generator().manual_seed(seed)
    ran = 0
    for case in range(8):
        batch, seq = int(torch.randint(1, 3, (1,), generator=g)), int(torch.randint(2, 30, (1,), generator=g))
        window = int(torch.randint(1, 12, (1,), generator=g)) if case % 2 else None
        q, k, v = _qkv(batch, seq, seq, seed=seed * 100 + case, device=device)
        i = torch.arange(seq)
        rows = []
        for _ in range(batch):
            ids = (torch.rand(seq, generator=g) < 0.2).long().cumsum(0)  # sequence id of each position
            vis = (i[None, :] <= i[:, None]) & (ids[:, None] == ids[None, :])
            if window:
                vis &= i[None, :] > i[:, None] - window
            rows.append(vis)
        vis = torch.stack(rows)[:, None]
        if case % 3 == 2:
            b, r, c = (int(torch.randint(0, n, (1,), generator=g)) for n in (batch, seq, seq))
            vis[b, 0, r, c] = ~vis[b, 0, r, c]
        vis = vis.to(device)
        fallbacks = flhf.fallbacks
        out, _ = flhf.attention_forward(_Module(), q, k, v, vis, scaling=0.2, sliding_window=window)
        ran += flhf.fallbacks == fallbacks
        torch.testing.assert_close(out.double(), _masked_f64(q, k, v, vis, 0.2), atol=2e-5, rtol=1e-4,
                                   msg=f"case {case}: batch {batch}, seq {seq}, window {window}")
    assert ran >= 4
