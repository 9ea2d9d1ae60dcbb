"""Every GPU backend (naive split kernels, fused) against the float64 reference and against torch SDPA on the same
inputs; the torch op under torch.compile and inside a captured CUDA graph. Skips without torch or a CUDA device."""
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import flashlite  # noqa: E402
import flashlite.torch as fltorch  # noqa: E402
from flashlite import _torch_ops  # noqa: E402
from pyattn_util import HALF_REL, assert_close, assert_lse_close, rel_err, visible_mask  # noqa: E402

if not flashlite.with_cuda:
    pytest.skip("flashlite was built without CUDA", allow_module_level=True)

DEV = torch.device("cuda")
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def fused_unsupported(q, k, v, **opts):
    try:
        flashlite.kernel_name(q, k, v, backend="cuda", **opts)
        return None
    except (ValueError, RuntimeError) as e:
        return str(e)


def make(b, s, h, d, dtype, strided, g):
    if not strided:
        return torch.randn(b, s, h, d, generator=g).to(dtype).to(DEV)
    base = torch.randn(b, h + 1, s, d, generator=g).to(dtype).to(DEV)  # [b, h+1, s, d]
    return base[:, 1:].transpose(1, 2)  # [b, s, h, d] view: batch, seq and head strides all non-trivial


# (b, sq, sk, hq, hkv, d, options). GQA ratios 1, 4, 8 and 3; seq 1, 17, 1000-ish; q_len != k_len both ways.
GRID = [
    (2, 17, 17, 4, 4, 64, {}),
    (1, 1, 300, 8, 1, 128, {}),
    (2, 128, 128, 8, 2, 64, {"causal": True}),
    (1, 200, 77, 6, 2, 128, {"causal": True}),  # q_len > k_len: fully masked rows
    (1, 77, 300, 32, 4, 64, {"causal": True}),
    (2, 96, 160, 4, 1, 64, {"window": (32, 8)}),
    (1, 257, 391, 8, 8, 64, {"causal": True, "window": (40, -1), "sink_tokens": 4}),
    (1, 64, 64, 4, 2, 128, {"softcap": 10.0, "scale": 0.3}),
    (1, 100, 100, 6, 3, 64, {"causal": True, "sink_logits": True}),
    (1, 1000, 1000, 2, 1, 64, {"causal": True}),
    (1, 130, 130, 2, 2, 32, {"window": (16, 16)}),
    (1, 65, 70, 2, 1, 256, {"causal": True}),
    (1, 50, 50, 4, 2, 96, {}),
]


def _opts(case_opts, hq, g):
    opts = dict(case_opts)
    if opts.pop("sink_logits", False):
        opts["sink_logits"] = torch.randn(hq, generator=g).to(DEV)
    return opts


def _cpu_opts(opts):
    return {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in opts.items()}


def _sdpa_err(q, k, v, ref, opts, dtype_name):
    """Relative error of torch SDPA (default backends, same dtype, same inputs) vs the reference on rows that see at
    least one key; None when SDPA cannot express the options (softcap, sink logits)."""
    if "softcap" in opts or "sink_logits" in opts:
        return None
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    vis = visible_mask(sq, sk, opts.get("causal", False), opts.get("window", (-1, -1)), opts.get("sink_tokens", 0))
    rows = vis.any(axis=1)
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    kt, vt = kt.repeat_interleave(hq // hkv, 1), vt.repeat_interleave(hq // hkv, 1)
    mask = torch.from_numpy(vis).to(DEV)
    out = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, scale=opts.get("scale"))
    out = out.transpose(1, 2).float().cpu().numpy()
    return rel_err(out[:, rows], ref[:, rows])


def _run_poisoned(backend, q, k, v, opts):
    """Runs through the op's implementation with NaN-poisoned out and LSE, so an unwritten element fails."""
    out = torch.full(q.shape, float("nan"), dtype=q.dtype, device=DEV)
    lse = torch.full((q.shape[0], q.shape[2], q.shape[1]), float("nan"), dtype=torch.float32, device=DEV)
    left, right = opts.get("window", (-1, -1))
    _torch_ops._run(q, k, v, out, lse, opts.get("sink_logits"), opts.get("cu_seqlens_q"), opts.get("cu_seqlens_k"),
                    opts.get("causal", False), opts.get("scale"), left, right, opts.get("sink_tokens", 0),
                    opts.get("softcap", 0.0), backend)
    torch.cuda.synchronize()
    return out, lse


_REF_CACHE = {}


@pytest.mark.parametrize("strided", [False, True])
@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("backend", ["naive", "cuda"])
@pytest.mark.parametrize("case", range(len(GRID)))
def test_grid(case, backend, dtype_name, strided):
    b, sq, sk, hq, hkv, d, case_opts = GRID[case]
    g = torch.Generator().manual_seed(1000 * case + 10 * int(strided) + len(dtype_name))
    dtype = DTYPES[dtype_name]
    q, k, v = make(b, sq, hq, d, dtype, strided, g), make(b, sk, hkv, d, dtype, strided, g), make(b, sk, hkv, d, dtype, strided, g)
    opts = _opts(case_opts, hq, g)
    if backend == "cuda" and (why := fused_unsupported(q, k, v, **opts)):
        pytest.skip(why)
    key = (case, dtype_name, strided)  # the inputs do not depend on the backend: one reference for both
    if key not in _REF_CACHE:
        _REF_CACHE[key] = flashlite.reference(q.cpu(), k.cpu(), v.cpu(), **_cpu_opts(opts))
    ref, ref_lse = _REF_CACHE[key]
    out, lse = _run_poisoned(backend, q, k, v, opts)
    err = assert_close(out.float().cpu().numpy(), ref, dtype_name)
    assert_lse_close(lse.cpu().numpy(), ref_lse)
    if dtype_name != "float32":
        sdpa = _sdpa_err(q, k, v, ref, opts, dtype_name)
        if sdpa is not None:
            assert err <= 2 * sdpa + 1e-5, f"relative error {err:.3g} is worse than 2x torch SDPA's {sdpa:.3g}"


@pytest.mark.parametrize("backend", ["naive", "cuda"])
@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
def test_varlen(backend, dtype_name):
    g = torch.Generator().manual_seed(7)
    seq_q, seq_k = [5, 0, 1, 300, 64], [9, 4, 1, 250, 129]  # an empty query sequence, length 1, q > k and q < k
    cu_q = torch.tensor(np.cumsum([0] + seq_q), dtype=torch.int32)
    cu_k = torch.tensor(np.cumsum([0] + seq_k), dtype=torch.int32)
    dtype = DTYPES[dtype_name]
    q = make(1, int(cu_q[-1]), 8, 64, dtype, True, g)
    k, v = make(1, int(cu_k[-1]), 2, 64, dtype, True, g), make(1, int(cu_k[-1]), 2, 64, dtype, True, g)
    opts = dict(causal=True, window=(100, -1), sink_tokens=3, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    if backend == "cuda" and (why := fused_unsupported(q, k, v, **opts)):
        pytest.skip(why)
    ref, ref_lse = flashlite.reference(q.cpu(), k.cpu(), v.cpu(), **opts)
    out, lse = _run_poisoned(backend, q, k, v, opts)
    assert_close(out.float().cpu().numpy(), ref, dtype_name)
    assert_lse_close(lse.cpu().numpy(), ref_lse)
    # And per sequence against torch SDPA on the same inputs (bottom-right causal + window as a boolean mask).
    if dtype_name != "float32":
        for i in range(len(seq_q)):
            if seq_q[i] == 0:
                continue
            a, bq, c, bk = int(cu_q[i]), int(cu_q[i + 1]), int(cu_k[i]), int(cu_k[i + 1])
            one = dict(causal=True, window=(100, -1), sink_tokens=3)
            sdpa = _sdpa_err(q[:, a:bq], k[:, c:bk], v[:, c:bk], ref[:, a:bq], one, dtype_name)
            mine = rel_err(out[:, a:bq].float().cpu().numpy(), ref[:, a:bq])
            assert mine <= max(2 * sdpa, HALF_REL / 4), f"sequence {i}: {mine:.3g} vs SDPA {sdpa:.3g}"


def test_public_api_on_cuda():
    g = torch.Generator().manual_seed(3)
    q, k, v = (make(2, 64, 4, 64, torch.bfloat16, False, g) for _ in range(3))
    ref, ref_lse = flashlite.reference(q.cpu(), k.cpu(), v.cpu(), causal=True)
    for backend in ("auto", "naive"):
        out, lse = flashlite.attention(q, k, v, causal=True, return_lse=True, backend=backend)
        assert out.device == q.device and out.dtype == torch.bfloat16
        assert_close(out.float().cpu().numpy(), ref, "bfloat16")
        assert_lse_close(lse.cpu().numpy(), ref_lse)
        buf = torch.full_like(q, float("nan"))
        assert flashlite.attention(q, k, v, causal=True, out=buf, backend=backend) is buf
        assert_close(buf.float().cpu().numpy(), ref, "bfloat16")
    # SDPA layout wrapper vs torch SDPA.
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    want = torch.nn.functional.scaled_dot_product_attention(qt.float(), kt.float(), vt.float(), is_causal=True)
    got = fltorch.scaled_dot_product_attention(qt, kt, vt, is_causal=True)
    assert rel_err(got.float().cpu().numpy(), want.cpu().numpy()) < HALF_REL
    assert flashlite.workspace_bytes(q, k, v, backend="naive") >= 2 * 4 * 64 * 64 * 4


def test_runs_on_the_current_stream():
    g = torch.Generator().manual_seed(4)
    q, k, v = (make(1, 512, 8, 64, torch.float16, False, g) for _ in range(3))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        outs = [flashlite.attention(q, k, v, backend=b) for b in ("naive", "auto")]
    side.synchronize()
    ref, _ = flashlite.reference(q.cpu(), k.cpu(), v.cpu())
    for out in outs:
        assert_close(out.float().cpu().numpy(), ref, "float16")


def _skip_without_fused(q, k, v, **opts):
    why = fused_unsupported(q, k, v, **opts)
    if why:
        pytest.skip(f"the fused CUDA kernel is not available: {why}")


def test_torch_compile_fullgraph():
    g = torch.Generator().manual_seed(5)
    q, k, v = (make(2, 256, 8, 64, torch.bfloat16, False, g) for _ in range(3))
    _skip_without_fused(q, k, v)

    def block(q, k, v):
        return fltorch.attention(q, k, v, causal=True).float().square().mean(-1) + 1.0

    compiled = torch.compile(block, fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v), block(q, k, v))
    sdpa = torch.compile(lambda a, b, c: fltorch.scaled_dot_product_attention(a, b, c, is_causal=True) * 2,
                         fullgraph=True)
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    torch.testing.assert_close(sdpa(qt, kt, vt), fltorch.scaled_dot_product_attention(qt, kt, vt, is_causal=True) * 2)
    # The generic entry point compiles too (graph breaks allowed there).
    torch.testing.assert_close(torch.compile(lambda a, b, c: flashlite.attention(a, b, c) + 0)(q, k, v),
                               flashlite.attention(q, k, v))


@pytest.mark.parametrize("backend", ["auto", "naive"])
def test_cuda_graph_capture(backend):
    g = torch.Generator().manual_seed(6)
    q, k, v = (make(2, 384, 8, 128, torch.bfloat16, False, g) for _ in range(3))
    if backend == "auto":
        _skip_without_fused(q, k, v)
    run = lambda: flashlite.attention(q, k, v, causal=True, backend=backend, return_lse=True)  # noqa: E731
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture, as torch recommends
        run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = run()
    for seed in (11, 12):  # new inputs into the captured buffers, then replay
        g2 = torch.Generator().manual_seed(seed)
        for t in (q, k, v):
            t.copy_(torch.randn(t.shape, generator=g2).to(t.dtype))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref, ref_lse = flashlite.reference(q.cpu(), k.cpu(), v.cpu(), causal=True)
        assert_close(out.float().cpu().numpy(), ref, "bfloat16")
        assert_lse_close(lse.cpu().numpy(), ref_lse)


def test_errors_on_cuda():
    g = torch.Generator().manual_seed(8)
    q, k, v = (make(1, 16, 4, 64, torch.float16, False, g) for _ in range(3))
    with pytest.raises(ValueError, match="k is on cpu but q is on cuda"):
        flashlite.attention(q, k.cpu(), v)
    with pytest.raises(ValueError, match="backend 'reference' runs on CPU tensors only"):
        flashlite.attention(q, k, v, backend="reference")
    with pytest.raises(ValueError, match="cu_seqlens_q is on cuda"):
        cu = torch.tensor([0, 16], dtype=torch.int32)
        flashlite.attention(q, k, v, cu_seqlens_q=cu.to(DEV), cu_seqlens_k=cu)
    assert math.isfinite(flashlite.attention(q, k, v).float().sum().item())
