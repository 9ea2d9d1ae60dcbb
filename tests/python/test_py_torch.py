"""The torch side on the CPU (skips without torch): custom ops (opcheck: schema, fake tensors, AOT dispatch),
torch.compile tracing (aot_eager, and inductor with fullgraph=True), SDPA semantics of
flashlite.torch.scaled_dot_product_attention and its errors, and where autograd cannot go: decode and prefill are
forward-only (their backward raises NotImplementedError naming them), out= with inputs that require grad raises at
once, and nothing comes back silently detached. The gradients themselves: test_py_backward.py."""
import os
import pathlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import flashlite  # noqa: E402
import flashlite.torch as fltorch  # noqa: E402
from flashlite import _masks  # noqa: E402
from pyattn_util import assert_close, assert_lse_close  # noqa: E402


def _inputs(b, sq, sk, hq, hkv, d, dtype=torch.float32, device="cpu", seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    mk = lambda s, h: torch.randn(b, s, h, d, generator=g).to(dtype=dtype, device=device)  # noqa: E731
    return mk(sq, hq), mk(sk, hkv), mk(sk, hkv)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_op_matches_reference_cpu(dtype):
    q, k, v = _inputs(2, 33, 40, 8, 2, 64, dtype)
    sinks = torch.randn(8)
    out, lse = flashlite.attention(q, k, v, causal=True, window=(16, -1), sink_tokens=2, sink_logits=sinks,
                                   return_lse=True)
    ref, ref_lse = flashlite.reference(q, k, v, causal=True, window=(16, -1), sink_tokens=2, sink_logits=sinks)
    assert out.dtype == dtype and out.shape == q.shape and lse.dtype == torch.float32
    assert_close(out.float().numpy(), ref, str(dtype).replace("torch.", ""))
    assert_lse_close(lse.numpy(), ref_lse)


def test_out_argument_and_varlen_cpu():
    q, k, v = _inputs(1, 21, 31, 4, 2, 64)
    out = torch.full_like(q, float("nan"))
    cu_q, cu_k = torch.tensor([0, 3, 3, 21], dtype=torch.int32), torch.tensor([0, 10, 12, 31], dtype=torch.int32)
    res = flashlite.attention(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=True, out=out)
    assert res is out
    ref, _ = flashlite.reference(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=True)
    assert_close(out.numpy(), ref, "float32")


def test_opcheck():
    q, k, v = _inputs(2, 9, 12, 4, 2, 32)
    args = (q, k, v, None, None, None, True, None, -1, -1, 0, 0.0, "auto")
    torch.library.opcheck(fltorch.attention_op, args)
    cu = torch.tensor([0, 4, 9], dtype=torch.int32)
    cuk = torch.tensor([0, 5, 12], dtype=torch.int32)
    torch.library.opcheck(fltorch.attention_op, (q[:1], k[:1], v[:1], torch.randn(4), cu, cuk, False, 0.3, 3, 1, 1,
                                                 2.0, "cpu"))
    torch.library.opcheck(fltorch.attention_out_op, (q, k, v, torch.empty_like(q), None, None, None, False, None, -1,
                                                     -1, 0, 0.0, "naive"))


def test_op_schemas():
    """The ops keep the names and schemas torch.library.custom_op inferred (graphs and exported programs name them)."""
    opts = ("bool causal, float? scale, SymInt window_left, SymInt window_right, SymInt sink_tokens, float softcap, "
            "str backend")
    tensors = "Tensor? sink_logits, Tensor? cu_seqlens_q, Tensor? cu_seqlens_k"
    want = {
        "attention": f"flashlite::attention(Tensor q, Tensor k, Tensor v, {tensors}, {opts}) -> (Tensor, Tensor)",
        "attention_out": f"flashlite::attention_out(Tensor q, Tensor k, Tensor v, Tensor(a3!) out, {tensors}, {opts}) "
                         "-> Tensor",
        "attention_backward": f"flashlite::attention_backward(Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
                              f"Tensor dout, Tensor? dlse, {tensors}, {opts}) -> (Tensor, Tensor, Tensor, Tensor)",
    }
    for name, schema in want.items():
        op = getattr(torch.ops.flashlite, name).default
        assert str(op._schema) == schema
        assert torch.Tag.pt2_compliant_tag in op.tags


def test_op_called_directly():
    """torch.ops.flashlite.attention in eager mode: the eager path's result, its gradients through the op's own
    autograd formula (the backward op), and no double backward."""
    q, k, v = _inputs(1, 12, 12, 4, 2, 32, seed=3)
    sink = torch.randn(4)
    args = (True, None, 5, -1, 1, 0.0, "auto")
    out, lse = torch.ops.flashlite.attention(q, k, v, sink, None, None, *args)
    want, want_lse = flashlite.attention(q, k, v, sink_logits=sink, causal=True, window=(5, -1), sink_tokens=1,
                                         return_lse=True)
    assert out.grad_fn is None
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    torch.testing.assert_close(lse, want_lse, rtol=0, atol=0)

    ts = [t.clone().requires_grad_() for t in (q, k, v, sink)]
    g = torch.Generator().manual_seed(4)
    dout, dlse = torch.randn(out.shape, generator=g), torch.randn(lse.shape, generator=g)

    def grads(out, lse):
        return torch.autograd.grad((out * dout).sum() + (lse * dlse).sum(), ts)

    via_op = grads(*torch.ops.flashlite.attention(*ts, None, None, *args))
    eager = grads(*flashlite.attention(*ts[:3], sink_logits=ts[3], causal=True, window=(5, -1), sink_tokens=1,
                                       return_lse=True))
    for a, b in zip(via_op, eager):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    out, _ = torch.ops.flashlite.attention(*ts, None, None, *args)
    (dq,) = torch.autograd.grad(out.sum(), ts[:1], create_graph=True)
    with pytest.raises(NotImplementedError, match="no double backward"):
        torch.autograd.grad(dq.sum(), ts[:1])


def test_out_bumps_the_version_counter():
    """Writing into out= is an in-place write autograd must see (it would otherwise miss a saved tensor's change):
    through the op and on the eager path. The op refuses inputs that require grad, as flashlite.attention does."""
    q, k, v = _inputs(1, 6, 6, 2, 2, 32)
    out = torch.empty_like(q)
    before = out._version
    fltorch.attention_out_op(q, k, v, out, None, None, None, False, None, -1, -1, 0, 0.0, "auto")
    assert out._version > before
    before = out._version
    flashlite.attention(q, k, v, out=out)
    assert out._version > before
    with pytest.raises(RuntimeError, match="does not support automatic differentiation"):
        fltorch.attention_out_op(q.requires_grad_(), k, v, out, None, None, None, False, None, -1, -1, 0, 0.0, "auto")


def test_lse_only_when_asked_gives_the_same_out():
    """Eager calls without return_lse (and the SDPA drop-in) pass no LSE to the kernel; out is the same."""
    q, k, v = _inputs(2, 9, 13, 4, 2, 32, seed=2)
    a = flashlite.attention(q, k, v, causal=True)
    b, _ = flashlite.attention(q, k, v, causal=True, return_lse=True)
    torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_compile_traces_the_op_cpu():
    q, k, v = _inputs(1, 16, 16, 4, 4, 64)

    def f(q, k, v):
        return fltorch.attention(q, k, v, causal=True) * 2.0

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(q, k, v), f(q, k, v))


@pytest.mark.parametrize("sq,sk,hq,hkv,causal", [(17, 17, 4, 4, False), (32, 32, 8, 2, True), (40, 24, 4, 4, True),
                                                  (1, 50, 4, 1, False)])
def test_sdpa_semantics_cpu(sq, sk, hq, hkv, causal):
    g = torch.Generator().manual_seed(sq)
    q = torch.randn(2, hq, sq, 64, generator=g)  # SDPA layout [B, H, S, D]
    k = torch.randn(2, hkv, sk, 64, generator=g)
    v = torch.randn(2, hkv, sk, 64, generator=g)
    got = fltorch.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=hq != hkv, scale=0.1)
    kk, vv = k.repeat_interleave(hq // hkv, 1), v.repeat_interleave(hq // hkv, 1)
    want = torch.nn.functional.scaled_dot_product_attention(q.double(), kk.double(), vv.double(), is_causal=causal,
                                                             scale=0.1)
    assert got.shape == want.shape
    assert (got.double() - want).abs().max().item() < 1e-4


def _heads_first(b, s, h, d, layout, g):
    """A [B, H, S, D] tensor: contiguous, a transposed [B, S, H, D] one (HF's q / k / v), or a view into a padded
    buffer (every stride but head_dim's uneven; the seq window starts at row 2)."""
    if layout == "contiguous":
        return torch.randn(b, h, s, d, generator=g)
    if layout == "from_bshd":
        return torch.randn(b, s, h, d, generator=g).transpose(1, 2)
    return torch.randn(b, h + 1, s + 3, d + 8, generator=g)[:, 1:, 2:2 + s, :d]


@pytest.mark.parametrize("layout", ["contiguous", "from_bshd", "padded"])
@pytest.mark.parametrize("sq,sk,hq,hkv,causal", [(37, 37, 6, 2, True), (19, 45, 4, 1, False), (30, 12, 3, 3, True)])
def test_sdpa_heads_first_cpu(monkeypatch, layout, sq, sk, hq, hkv, causal):
    """Eager calls that autograd does not record pass SDPA's [B, H, S, D] tensors to the native layer as they are
    (heads_first: no transposes): non-contiguous inputs and GQA against float64 SDPA, the result a [B, H, S, D] view of
    [B, S, H, D] memory, and bitwise the values of the recorded (autograd) path, which transposes in Python."""
    from flashlite import _torch_ops
    calls = []
    run = _torch_ops._run
    monkeypatch.setattr(_torch_ops, "_run",
                        lambda *a, **kw: (calls.append(1) if kw.get("heads_first") else None) or run(*a, **kw))
    g = torch.Generator().manual_seed(sq * 100 + hq)
    q, k, v = (_heads_first(2, s, h, 64, layout, g) for s, h in ((sq, hq), (sk, hkv), (sk, hkv)))
    assert layout == "contiguous" or not q.is_contiguous()
    got = fltorch.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=hq != hkv, scale=0.1)
    assert len(calls) == 1, "the eager no-grad call did not take the heads-first path"
    assert got.shape == (2, hq, sq, 64) and got.transpose(1, 2).is_contiguous()
    kk, vv = k.repeat_interleave(hq // hkv, 1), v.repeat_interleave(hq // hkv, 1)
    want = torch.nn.functional.scaled_dot_product_attention(q.double(), kk.double(), vv.double(), is_causal=causal,
                                                             scale=0.1)
    assert (got.double() - want).abs().max().item() < 1e-4
    recorded = fltorch.scaled_dot_product_attention(q.clone().requires_grad_(), k, v, is_causal=causal,
                                                    enable_gqa=hq != hkv, scale=0.1)
    assert len(calls) == 1 and recorded.grad_fn is not None
    assert torch.equal(recorded.detach(), got)
    with torch.no_grad():  # grad mode off: the heads-first path again, inputs that require grad or not
        assert torch.equal(fltorch.scaled_dot_product_attention(q.clone().requires_grad_(), k, v, is_causal=causal,
                                                                enable_gqa=hq != hkv, scale=0.1), got)
    assert len(calls) == 2


def _padding_mask(kind, lengths, s):
    """SDPA attn_masks for a batch of sequences of `lengths` (padded to s): boolean or additive, causal or not."""
    j = torch.arange(s)
    valid = torch.stack([(j < n) if kind != "left" else (j >= s - n) for n in lengths])  # [B, S] keys
    if kind == "keys":  # key padding alone, broadcast over heads and queries: [B, 1, 1, S]
        return valid[:, None, None, :]
    if kind == "packed":  # each row packs sequences of these lengths and the rest of the row: block-diagonal causal
        seq = torch.stack([torch.cat([torch.zeros(n, dtype=torch.long), torch.ones(s - n, dtype=torch.long)])
                           for n in lengths])
        causal = j[None, :] <= j[:, None]
        return (causal[None] & (seq[:, :, None] == seq[:, None, :]))[:, None]
    causal = j[None, :] <= j[:, None]
    mask = (causal[None] & valid[:, None, :])[:, None]  # [B, 1, S, S]
    if kind == "additive":
        return torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
    return mask


@pytest.mark.parametrize("varlen", [False, True])
@pytest.mark.parametrize("kind", ["right", "left", "keys", "additive", "all", "packed"])
def test_sdpa_padding_masks_match_torch(kind, varlen, monkeypatch):
    """attn_mask that is padding (right or left, causal or key padding alone, boolean or additive, or every key) or
    packing (two causal sequences per row, block-diagonal) runs on flashlite and equals torch SDPA on every row,
    gradients included; rows that differ run one call per row, or (varlen: from 1 query instead of 64) as
    variable-length calls."""
    if varlen:
        monkeypatch.setattr(_masks, "VARLEN_MIN_QUERIES", 1)
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(5, h, 13, 32, generator=g, dtype=torch.float64) for h in (4, 2, 2))
    lengths = [13, 13, 9, 4, 4]
    mask = torch.ones(13, 13, dtype=torch.bool) if kind == "all" else _padding_mask(kind, lengths, 13)

    def grads(fn):
        ts = [t.clone().float().requires_grad_() for t in (q, k, v)]
        out = fn(*ts, attn_mask=mask, enable_gqa=True)
        w = torch.randn(out.shape, generator=torch.Generator().manual_seed(6))
        return (out,) + torch.autograd.grad((out * w).sum(), ts)

    got = grads(fltorch.scaled_dot_product_attention)
    want = grads(torch.nn.functional.scaled_dot_product_attention)
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        torch.testing.assert_close(a, b.nan_to_num(0.0), atol=2e-5, rtol=1e-4, msg=name)


def test_sdpa_mask_edges():
    """The drop-in's masks at their edges: a batch row without any key is zeros (as torch's); fp16's lowest in a
    float32 mask hides keys as -inf does; a finite "minus infinity" that hides a query's every key is refused (torch
    would average over all keys there); masks that do not broadcast over the heads, or that require grad, are refused;
    empty queries give an empty result."""
    g = torch.Generator().manual_seed(9)
    q = torch.randn(2, 4, 6, 16, generator=g)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    empty_row = torch.ones(2, 1, 6, 6, dtype=torch.bool)
    empty_row[1] = False
    got = fltorch.scaled_dot_product_attention(q, q, q, attn_mask=empty_row)
    assert torch.equal(got[1], torch.zeros_like(got[1]))
    torch.testing.assert_close(got, sdpa(q, q, q, attn_mask=empty_row).nan_to_num(0.0), atol=2e-5, rtol=1e-4)
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    fp16_min = torch.zeros(6, 6).masked_fill(~causal, torch.finfo(torch.float16).min)
    torch.testing.assert_close(fltorch.scaled_dot_product_attention(q, q, q, attn_mask=fp16_min),
                               sdpa(q, q, q, attn_mask=causal), atol=2e-5, rtol=1e-4)
    hides_a_query = fp16_min.clone()
    hides_a_query[0, 0] = torch.finfo(torch.float32).min
    with pytest.raises(ValueError, match="is not a padding or packing mask"):
        fltorch.scaled_dot_product_attention(q, q, q, attn_mask=hides_a_query)
    with pytest.raises(ValueError, match="is not a padding or packing mask"):
        fltorch.scaled_dot_product_attention(q, q, q, attn_mask=causal.expand(1, 3, 6, 6))
    with pytest.raises(ValueError, match="requires grad"):
        fltorch.scaled_dot_product_attention(q, q, q, attn_mask=torch.zeros(6, 6, requires_grad=True))
    assert fltorch.scaled_dot_product_attention(q[:, :, :0], q, q, attn_mask=causal[:0]).shape == (2, 4, 0, 16)


def test_sdpa_mask_written_in_place_is_read_again():
    """The mask reader remembers its last masks; one written in place between calls is read again, not reused."""
    g = torch.Generator().manual_seed(11)
    q = torch.randn(2, 4, 7, 16, generator=g)
    mask = _padding_mask("right", [7, 5], 7)
    for lengths in ([7, 5], [3, 6]):
        mask.copy_(_padding_mask("right", lengths, 7))
        torch.testing.assert_close(fltorch.scaled_dot_product_attention(q, q, q, attn_mask=mask),
                                   torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=mask),
                                   atol=2e-5, rtol=1e-4)


def test_out_runs_as_given_under_autocast():
    """flashlite.attention(out=...) under autocast runs in the dtype it is given (torch's out= functions are not
    autocast): float32 in, float32 out, the same values as outside autocast."""
    g = torch.Generator().manual_seed(10)
    q, k, v = (torch.randn(1, 9, h, 16, generator=g) for h in (4, 2, 2))
    want = flashlite.attention(q, k, v, causal=True)
    out = torch.empty_like(q)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        flashlite.attention(q, k, v, causal=True, out=out)
    assert torch.equal(out, want)


def test_sdpa_errors():
    q = torch.randn(1, 4, 8, 64)
    k = torch.randn(1, 2, 8, 64)
    with pytest.raises(ValueError, match="shape \\(8, 8\\) and dtype torch.bool is not a padding or packing"):
        fltorch.scaled_dot_product_attention(q, q, q, attn_mask=torch.eye(8, dtype=torch.bool).flip(-1))
    with pytest.raises(ValueError, match="attn_mask and is_causal=True together"):
        fltorch.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(8, 8, dtype=torch.bool), is_causal=True)
    with pytest.raises(ValueError, match="dropout_p is 0.1"):
        fltorch.scaled_dot_product_attention(q, q, q, dropout_p=0.1)
    with pytest.raises(ValueError, match="enable_gqa=True"):
        fltorch.scaled_dot_product_attention(q, k, k)
    with pytest.raises(ValueError, match="top-left"):
        fltorch.scaled_dot_product_attention(q[:, :, :4], q, q, is_causal=True)
    with pytest.raises(ValueError, match="4-D"):
        fltorch.scaled_dot_product_attention(q[0], q[0], q[0])


def test_errors_from_the_op():
    q, k, v = _inputs(1, 8, 8, 4, 2, 64)
    with pytest.raises(TypeError, match="k has dtype bfloat16 but q has float32"):
        flashlite.attention(q, k.bfloat16(), v)
    with pytest.raises(ValueError, match="window_left is -3"):
        flashlite.attention(q, k, v, window=(-3, 0))
    with pytest.raises(TypeError, match="causal is 'no'; expected True or False"):
        flashlite.attention(q, k, v, causal="no")
    with pytest.raises(ValueError, match="sink_tokens is 4294967296; expected a value within int32"):
        flashlite.attention(q, k, v, sink_tokens=2**32)
    with pytest.raises(TypeError, match="expected a torch.Tensor"):
        flashlite.attention(q, np.zeros((1, 8, 2, 64), np.float32), v)


# Gradients are tested in test_py_backward.py; out= cannot be recorded by autograd and refuses at once.


def test_out_argument_refuses_grad():
    q, k, v = _inputs(1, 6, 6, 2, 2, 32)
    out = torch.empty_like(q)
    with pytest.raises(RuntimeError, match=r"attention\(out=...\) does not support automatic differentiation"):
        flashlite.attention(q, k.requires_grad_(), v, out=out)
    with torch.no_grad():  # nothing to record: fine
        assert flashlite.attention(q, k, v, out=out) is out


def test_no_grad_and_inference_mode_use_the_fast_path():
    """Without anything for autograd to record the result is plain (no grad_fn) and equal to the op's."""
    q, k, v = _inputs(1, 7, 7, 2, 2, 32)
    q.requires_grad_()
    with torch.no_grad():
        a = flashlite.attention(q, k, v)
    with torch.inference_mode():
        b = flashlite.attention(q.detach(), k, v)
    c = flashlite.attention(q, k, v).detach()
    assert a.grad_fn is None and not a.requires_grad and b.grad_fn is None
    torch.testing.assert_close(a, c, rtol=0, atol=0)
    torch.testing.assert_close(b, c, rtol=0, atol=0)


def test_compile_inductor_cpu_fullgraph():
    """The CPU counterpart of test_py_gpu's test_torch_compile_fullgraph, with the default backend (inductor, which
    builds C++ for the surrounding ops)."""
    q, k, v = _inputs(2, 16, 16, 4, 2, 32, seed=5)

    def block(q, k, v):
        return fltorch.attention(q, k, v, causal=True, window=(5, -1), softcap=3.0).float().square().mean(-1) + 1.0

    torch.testing.assert_close(torch.compile(block, fullgraph=True)(q, k, v), block(q, k, v))
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    sdpa = torch.compile(lambda a, b, c: fltorch.scaled_dot_product_attention(a, b, c, is_causal=True,
                                                                               enable_gqa=True) * 2, fullgraph=True)
    torch.testing.assert_close(sdpa(qt, kt, vt),
                               fltorch.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=True) * 2)
    # The generic entry point compiles too (graph breaks allowed there).
    torch.testing.assert_close(torch.compile(lambda a, b, c: flashlite.attention(a, b, c) + 0)(q, k, v),
                               flashlite.attention(q, k, v))


@pytest.mark.parametrize("fn", ["decode", "prefill"])
def test_kv_functions_say_forward_only(fn):
    kc, vc = torch.randn(2, 16, 2, 32), torch.randn(2, 16, 2, 32)
    cache = flashlite.KVCache(kc, vc, seq_lens=[9, 13])
    q = torch.randn(2, 1, 4, 32)
    call = getattr(flashlite, fn)
    with torch.no_grad():
        want = call(q, cache)
    got, lse = call(q.clone().requires_grad_(), cache, return_lse=True)
    assert got.requires_grad and got.grad_fn is not None
    torch.testing.assert_close(got.detach(), want, rtol=0, atol=0)
    with pytest.raises(NotImplementedError, match=f"flashlite.{fn} is forward-only"):
        got.sum().backward()
    with pytest.raises(RuntimeError, match=r"out=...\) does not support automatic differentiation"):
        call(q.requires_grad_(), cache, out=torch.empty_like(q))


# --- the ops' C++ kernels (flashlite/_torch_C) and the Python ones -----------------------------------------------

def test_native_ops_loaded_when_built_for_this_torch():
    """A build that made flashlite/_torch_C for this torch (_torch_C.version beside it) loads it, so every other test
    here runs the ops' C++ kernels and autograd; a build without it runs the Python kernels (next test)."""
    from flashlite import _torch_ops
    pkg = pathlib.Path(_torch_ops.__file__).parent
    version = pkg / "_torch_C.version"
    built = version.exists() and version.read_text().strip() == torch.__version__
    assert _torch_ops.NATIVE_OPS == built


_FALLBACK_SCRIPT = r"""
import torch, flashlite
from flashlite import _torch_ops
assert not _torch_ops.NATIVE_OPS
g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(2, 19, h, 32, generator=g) for h in (4, 2, 2))
sink = torch.randn(4)
ts = [t.clone().requires_grad_() for t in (q, k, v, sink)]
out = flashlite.attention(*ts[:3], sink_logits=ts[3], causal=True, window=(6, -1), sink_tokens=1)
dout = torch.randn(out.shape, generator=g)
eager = torch.autograd.grad((out * dout).sum(), ts)
out2, _ = torch.ops.flashlite.attention(*ts, None, None, True, None, 6, -1, 1, 0.0, "auto")
via_op = torch.autograd.grad((out2 * dout).sum(), ts)
ref = flashlite.reference(q, k, v, sink_logits=sink, causal=True, window=(6, -1), sink_tokens=1)[0]
torch.testing.assert_close(out.detach().double(), torch.from_numpy(ref), rtol=1e-5, atol=1e-5)
for a, b in zip(eager, via_op):
    torch.testing.assert_close(a, b, rtol=0, atol=0)
compiled = torch.compile(lambda *t: flashlite.attention(*t, causal=True), backend="aot_eager", fullgraph=True)
torch.testing.assert_close(compiled(q, k, v), flashlite.attention(q, k, v, causal=True), rtol=0, atol=0)
print("fallback ok")
"""


@pytest.mark.parametrize("case", ["other_torch", "broken_library"])
def test_python_kernels_serve_without_native_ops(tmp_path, case):
    """The package with flashlite/_torch_C built for another torch, or one that fails to load (and, silently, without
    it: a build without torch): the library is not used, a warning says why, and the Python kernels and autograd give
    the same results, eager, through the op, and under torch.compile."""
    import shutil
    import subprocess
    import sys
    from flashlite import _torch_ops
    pkg = pathlib.Path(_torch_ops.__file__).parent
    dst = tmp_path / "flashlite"
    dst.mkdir()
    for f in pkg.iterdir():
        if f.is_file() and not f.name.startswith("_torch_C"):
            shutil.copy(f.resolve(), dst / f.name)
    if case == "other_torch":  # and no library: it is not even looked for
        (dst / "_torch_C.version").write_text("0.0.0+another\n")
        expect = "_torch_C.so was built for torch 0.0.0+another, this is torch"
    else:
        (dst / "_torch_C.version").write_text(torch.__version__ + "\n")
        (dst / "_torch_C.so").write_bytes(b"not a shared library")
        expect = "_torch_C.so failed to load"
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    r = subprocess.run([sys.executable, "-c", _FALLBACK_SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "fallback ok" in r.stdout, r.stdout + r.stderr
    assert expect in r.stderr and "the torch ops run their Python kernels" in r.stderr, r.stderr
