"""flashlite.attention is differentiable on torch tensors: its gradients for q, k, v and sink_logits (and through the
returned lse) against torch autograd of a float64 attention written here from the documented rules (independent of
flashlite), for every mask kind, GQA and varlen; the SDPA drop-in against torch's own SDPA; torch.compile(fullgraph)
and activation checkpointing; gradcheck. Runs on the CPU (CI); the same tests take CUDA tensors where the machine has
a GPU and the CUDA backward exists."""
import pytest
import torch
import torch.utils.checkpoint

import flashlite
from flashlite import torch as fltorch

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() and flashlite.with_cuda else [])


def ref_attention(q, k, v, causal=False, window=(-1, -1), sink_tokens=0, sink_logits=None, softcap=0.0, scale=None):
    """out [B, Sq, Hq, D] and lse [B, Hq, Sq] in float64 with autograd: softmax over the visible keys (bottom-right
    causal, window, sink tokens) and the sink logit; rows with no key and no sink give zeros."""
    q, k, v = q.double(), k.double(), v.double()
    B, Sq, Hq, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    kx, vx = k.repeat_interleave(Hq // Hkv, dim=2), v.repeat_interleave(Hq // Hkv, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, kx) * (D ** -0.5 if scale is None else scale)
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(Sq, device=q.device)[:, None] + (Sk - Sq)
    j = torch.arange(Sk, device=q.device)[None, :]
    in_window = torch.ones(Sq, Sk, dtype=torch.bool, device=q.device)
    if window[0] >= 0:
        in_window &= j >= i - window[0]
    if window[1] >= 0:
        in_window &= j <= i + window[1]
    visible = (in_window | (j < sink_tokens)) & ((j <= i) if causal else True)
    s = s.masked_fill(~visible, -1e30)  # finite, so hidden keys get exactly zero gradient (no 0 * NaN)
    logits = s
    if sink_logits is not None:
        sink = sink_logits.double()[None, :, None, None].expand(B, Hq, Sq, 1)
        logits = torch.cat([s, sink], dim=-1)
    lse = torch.logsumexp(logits, dim=-1)
    p = torch.exp(s - lse[..., None]) * visible
    out = torch.einsum("bhqk,bkhd->bqhd", p, vx)
    return out, lse


def _inputs(B, Sq, Sk, Hq, Hkv, D, dtype=torch.float32, device="cpu", seed=0, sinks=False):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, s, h, D, generator=g).to(device=device, dtype=dtype)
               for s, h in ((Sq, Hq), (Sk, Hkv), (Sk, Hkv)))
    sink = torch.randn(Hq, generator=g).to(device) if sinks else None
    return q, k, v, sink


CASES = {
    "plain": dict(shape=(2, 33, 33, 4, 4, 64), opts={}),
    "causal_gqa": dict(shape=(1, 70, 70, 8, 2, 64), opts=dict(causal=True)),
    "causal_qshort": dict(shape=(2, 9, 80, 4, 2, 64), opts=dict(causal=True)),
    "causal_qlong_keyless": dict(shape=(1, 80, 30, 6, 2, 64), opts=dict(causal=True), sinks=True),
    "window_sinks_sinklogits": dict(shape=(1, 100, 100, 4, 1, 64),
                                    opts=dict(causal=True, window=(20, -1), sink_tokens=4), sinks=True),
    "window_both_softcap_scale": dict(shape=(2, 40, 50, 2, 2, 96), opts=dict(window=(8, 5), softcap=3.0, scale=0.3)),
}


def _grads(fn, tensors, weight, lse_weight=None):
    out, lse = fn(*tensors)
    loss = (out.double() * weight).sum()
    if lse_weight is not None:
        loss = loss + (lse.double() * lse_weight).sum()
    return torch.autograd.grad(loss, [t for t in tensors if t is not None])


def _check_case(name, dtype, device, with_lse=False):
    if device == "cuda" and dtype == torch.float32:
        dtype = torch.bfloat16  # the CUDA backward takes fp16 / bf16 (fp32 is refused by name: test_cuda_fp32_refused)
    c = CASES[name]
    q, k, v, sink = _inputs(*c["shape"], dtype=dtype, device=device, seed=hash(name) % 1000, sinks=c.get("sinks"))
    tensors = [t.requires_grad_() if t is not None else None for t in (q, k, v, sink)]
    opts = c["opts"]
    g = torch.Generator().manual_seed(7)
    w = torch.randn(q.shape, generator=g, dtype=torch.float64).to(device)
    u = torch.randn(q.shape[0], q.shape[2], q.shape[1], generator=g, dtype=torch.float64).to(device) if with_lse else None
    got = _grads(lambda q, k, v, s: flashlite.attention(q, k, v, sink_logits=s, return_lse=True, **opts),
                 tensors, w, u)
    want = _grads(lambda q, k, v, s: ref_attention(q, k, v, sink_logits=s, **opts), tensors, w, u)
    # fp32: close to float64; fp16 / bf16: the inputs' rounding is shared, the rest within the dtype's precision.
    tol = {torch.float32: 2e-4, torch.float16: 2e-2, torch.bfloat16: 8e-2}[dtype]
    for name_, a, b in zip(("dq", "dk", "dv", "dsink"), got, want):
        scale = b.abs().max().item()
        assert scale > 1e-6, f"{name_} is all zero: the case tests nothing"
        err = (a.double() - b).abs().max().item()
        assert err <= tol * max(1.0, scale), f"{name_}: max error {err:.3g} (scale {scale:.3g})"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(CASES))
def test_gradients_match_float64_autograd(name, device):
    _check_case(name, torch.float32, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", ["causal_gqa", "window_sinks_sinklogits"])
def test_gradients_half_precision(name, dtype, device):
    _check_case(name, dtype, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["plain", "window_sinks_sinklogits"])
def test_gradient_through_lse(name, device):
    """A loss on both outputs: lse's gradient joins (d lse / d score = P, d lse / d sink = its probability)."""
    _check_case(name, torch.float32, device, with_lse=True)


@pytest.mark.skipif("cuda" not in DEVICES, reason="needs a GPU")
def test_cuda_fp32_refused():
    """fp32 on CUDA: the forward runs (the SIMT kernel), the backward says what it takes."""
    q, k, v, _ = _inputs(1, 16, 16, 2, 2, 64, device="cuda")
    out = flashlite.attention(q.requires_grad_(), k, v)
    with pytest.raises(TypeError, match="float32 is unsupported by the CUDA backward"):
        out.sum().backward()


@pytest.mark.parametrize("device", DEVICES)
def test_varlen_gradients(device):
    lens_q, lens_k = [5, 0, 1, 40], [7, 3, 1, 40]
    Hq, Hkv, D = 4, 2, 64
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    q, k, v, sink = _inputs(1, sum(lens_q), sum(lens_k), Hq, Hkv, D, dtype=dtype, device=device, seed=3, sinks=True)
    for t in (q, k, v, sink):
        t.requires_grad_()
    cq = torch.tensor([0, 5, 5, 6, 46], dtype=torch.int32)
    ck = torch.tensor([0, 7, 10, 11, 51], dtype=torch.int32)
    w = torch.randn(q.shape, dtype=torch.float64, device=device)
    out = flashlite.attention(q, k, v, causal=True, sink_logits=sink, cu_seqlens_q=cq, cu_seqlens_k=ck)
    got = torch.autograd.grad((out.double() * w).sum(), [q, k, v, sink])
    loss = 0
    for b in range(4):
        qs, ks = slice(int(cq[b]), int(cq[b + 1])), slice(int(ck[b]), int(ck[b + 1]))
        o, _ = ref_attention(q[:, qs], k[:, ks], v[:, ks], causal=True, sink_logits=sink)
        loss = loss + (o * w[:, qs]).sum()
    want = torch.autograd.grad(loss, [q, k, v, sink])
    for name, a, b in zip(("dq", "dk", "dv", "dsink"), got, want):
        err = (a.double() - b).abs().max().item()
        tol = 2e-4 if dtype == torch.float32 else 8e-2
        assert err <= tol * max(1.0, b.abs().max().item()), f"{name}: max error {err:.3g}"


@pytest.mark.parametrize("device", DEVICES)
def test_sdpa_dropin_backward_matches_torch(device):
    q, k, v, _ = _inputs(2, 24, 24, 4, 2, 64, device=device, seed=4)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    qt, kt, vt = (x.transpose(1, 2).to(dtype).double().detach().requires_grad_() for x in (q, k, v))
    mine = [x.to(dtype).detach().requires_grad_() for x in (qt, kt, vt)]
    y = fltorch.scaled_dot_product_attention(*mine, is_causal=True, enable_gqa=True)
    w = torch.randn(y.shape, dtype=torch.float64, device=device)
    got = torch.autograd.grad((y.double() * w).sum(), mine)
    ref = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=True)
    want = torch.autograd.grad((ref * w).sum(), [qt, kt, vt])
    tol = 2e-4 if dtype == torch.float32 else 8e-2
    for a, b in zip(got, want):
        assert (a.double() - b).abs().max().item() <= tol * max(1.0, b.abs().max().item())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("path", ["eager", "op", "sdpa_dropin", "compiled"])
def test_autocast_runs_in_the_autocast_dtype(path, device):
    """Under torch.autocast, mixed float32 / bf16 inputs run in bf16, as SDPA does: the output and the gradients are
    bitwise those of the same call on inputs cast by hand, and the float32 inputs get float32 gradients."""
    q, k, v, sink = _inputs(2, 24, 24, 4, 2, 64, device=device, seed=11, sinks=True)
    k = k.to(torch.bfloat16)  # q and v stay float32

    def call(q, k, v, s):
        if path == "eager":
            return flashlite.attention(q, k, v, causal=True, sink_logits=s)
        if path == "op":
            return fltorch.attention_op(q, k, v, s, None, None, True, None, -1, -1, 0, 0.0, "auto")[0]
        if path == "sdpa_dropin":  # no sink logits in SDPA's signature
            return fltorch.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                        is_causal=True, enable_gqa=True).transpose(1, 2)
        return torch.compile(lambda *a: flashlite.attention(*a, causal=True, sink_logits=s), fullgraph=True,
                             backend="aot_eager")(q, k, v)

    def run(inputs, autocast):
        ts = [t.detach().clone().requires_grad_() for t in inputs]
        with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast):
            out = call(*ts)
        w = torch.randn(out.shape, generator=torch.Generator().manual_seed(3)).to(device)
        grads = torch.autograd.grad((out.float() * w).sum(), ts, allow_unused=path == "sdpa_dropin")
        return out, grads

    out, grads = run((q, k, v, sink), True)
    want_out, want_grads = run((q.to(torch.bfloat16), k, v.to(torch.bfloat16), sink), False)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, want_out)
    for name, g, t, want in zip(("dq", "dk", "dv", "dsink"), grads, (q, k, v, sink), want_grads):
        if path == "sdpa_dropin" and name == "dsink":
            continue
        assert g.dtype == t.dtype, name
        assert torch.equal(g, want.to(t.dtype)), name


def test_autocast_leaves_other_devices_to_the_usual_error():
    """Under autocast, a tensor on a device flashlite does not run (meta) still gets the error that names it, not
    autocast's complaint about the device type."""
    q = torch.empty(1, 4, 2, 8, device="meta")
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(ValueError, match="q is on meta"):
        flashlite.attention(q, q, q)


def test_only_some_inputs_require_grad():
    q, k, v, sink = _inputs(1, 16, 16, 4, 2, 32, seed=5, sinks=True)
    k.requires_grad_()
    out = flashlite.attention(q, k, v, causal=True, sink_logits=sink)
    (dk,) = torch.autograd.grad(out.sum(), [k])
    k2 = k.detach().double().requires_grad_()
    (want,) = torch.autograd.grad(ref_attention(q, k2, v, causal=True, sink_logits=sink)[0].sum(), [k2])
    torch.testing.assert_close(dk.double(), want, rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_fullgraph_forward_and_backward(backend):
    """torch.compile(fullgraph=True) traces the op and its backward (the backward op's fake implementation) and gives
    the eager gradients."""
    q, k, v, sink = _inputs(1, 20, 20, 4, 2, 32, seed=6, sinks=True)

    def f(q, k, v, s):
        return (fltorch.attention(q, k, v, causal=True, window=(6, -1), sink_logits=s) * 2.0).square().mean()

    def grads(fn):
        ts = [t.detach().clone().requires_grad_() for t in (q, k, v, sink)]
        return torch.autograd.grad(fn(*ts), ts)

    eager = grads(f)
    compiled = grads(torch.compile(f, fullgraph=True, backend=backend))
    for a, b in zip(compiled, eager):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_activation_checkpointing():
    q, k, v, sink = _inputs(1, 30, 30, 4, 2, 32, seed=8, sinks=True)

    def block(q, k, v, s):
        return flashlite.attention(q, k, v, causal=True, sink_logits=s).relu()

    def grads(run):
        ts = [t.detach().clone().requires_grad_() for t in (q, k, v, sink)]
        return torch.autograd.grad(run(*ts).sum(), ts)

    plain = grads(block)
    ckpt = grads(lambda *ts: torch.utils.checkpoint.checkpoint(block, *ts, use_reentrant=False))
    for a, b in zip(ckpt, plain):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.filterwarnings("ignore:Input #:UserWarning")
def test_gradcheck_float32():
    """torch.autograd.gradcheck on small fp32 inputs (flashlite takes fp32 / fp16 / bf16, not float64: the finite
    differences are taken in fp32, hence the tolerances)."""
    q, k, v, sink = _inputs(1, 5, 6, 2, 1, 8, seed=9, sinks=True)
    ts = [t.requires_grad_() for t in (q, k, v, sink)]

    def f(q, k, v, s):
        return flashlite.attention(q, k, v, causal=True, window=(3, -1), sink_logits=s, softcap=2.0)

    assert torch.autograd.gradcheck(f, ts, eps=1e-2, atol=5e-3, rtol=5e-2, fast_mode=False)


def test_numpy_attention_backward_matches_autograd():
    """flashlite.attention_backward on numpy arrays gives torch autograd's gradients (dlse included)."""
    import numpy as np
    q, k, v, sink = _inputs(1, 12, 15, 4, 2, 32, seed=10, sinks=True)
    opts = dict(causal=True, window=(5, -1), sink_tokens=1, softcap=4.0)
    ts = [t.clone().requires_grad_() for t in (q, k, v, sink)]
    out, lse = flashlite.attention(*ts[:3], sink_logits=ts[3], return_lse=True, **opts)
    g = torch.Generator().manual_seed(11)
    dout, dlse = torch.randn(out.shape, generator=g), torch.randn(lse.shape, generator=g)
    want = torch.autograd.grad((out * dout).sum() + (lse * dlse).sum(), ts)
    got = flashlite.attention_backward(q.numpy(), k.numpy(), v.numpy(), out.detach().numpy(), lse.detach().numpy(),
                                       dout.numpy(), dlse=dlse.numpy(), sink_logits=sink.numpy(), **opts)
    for a, b in zip(got, want):
        assert isinstance(a, np.ndarray)
        np.testing.assert_allclose(a, b.numpy(), rtol=1e-5, atol=1e-6)
