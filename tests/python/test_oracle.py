"""flashlite.attention (every CPU backend, numpy and torch inputs) and flashlite.reference against an oracle written
here, in float64 numpy, one query row at a time, from the documented semantics (include/flashlite/attention.h):

    p = i + seq_k - seq_q                      (the key index of query i: causal is bottom-right aligned)
    visible(j) = (!causal || j <= p) && ((left < 0 || j >= p - left) && (right < 0 || j <= p + right) || j < sinks)
    s = scale * q.k  (scale defaults to 1/sqrt(head_dim)),  then softcap * tanh(s / softcap) when softcap > 0
    kv_head = q_head / (q_heads / kv_heads)
    out = sum_visible exp(s) v / (sum_visible exp(s) + exp(sink_logit))
    lse = log(sum_visible exp(s) + exp(sink_logit))
    a row that sees no key: out = 0, lse = -inf (or the sink logit)

The oracle calls nothing of flashlite: the other Python tests compare against flashlite.reference, which shares the
argument handling (flashlite/_args.py) with the code under test, so an option lost there would pass them. Every case
also checks that leaving its option out changes the answer by far more than the tolerance, so losing any option on
the way to the kernel fails here.
"""
import math

import numpy as np
import pytest

import flashlite

F32_TOL = 1e-4  # fp32 inputs: max abs error (DESIGN.md's correctness protocol), out and lse


def _visible(j, p, causal, left, right, sink_tokens):
    in_window = (left < 0 or j >= p - left) and (right < 0 or j <= p + right)
    return (in_window or j < sink_tokens) and (not causal or j <= p)


def oracle(q, k, v, causal=False, scale=None, window=(-1, -1), sink_tokens=0, sink_logits=None, softcap=0.0,
           cu_seqlens_q=None, cu_seqlens_k=None):
    """(out [B, Sq, Hq, D], lse [B, Hq, Sq]) in float64; varlen (cu_seqlens): [1, total, H, D] packed sequences."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    if cu_seqlens_q is not None:
        cu_q, cu_k = list(cu_seqlens_q), list(cu_seqlens_k)
        out = np.zeros(q.shape)
        lse = np.zeros((1, q.shape[2], q.shape[1]))
        for s in range(len(cu_q) - 1):
            a, b, c, d = cu_q[s], cu_q[s + 1], cu_k[s], cu_k[s + 1]
            o, l_ = oracle(q[:, a:b], k[:, c:d], v[:, c:d], causal, scale, window, sink_tokens, sink_logits, softcap)
            out[:, a:b], lse[:, :, a:b] = o, l_
        return out, lse
    batch, sq, hq, dim = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(dim) if scale is None else float(scale)
    left, right = window
    out = np.zeros((batch, sq, hq, dim))
    lse = np.zeros((batch, hq, sq))
    for b in range(batch):
        for h in range(hq):
            kh = h // (hq // hkv)
            sink = None if sink_logits is None else float(np.asarray(sink_logits, dtype=np.float64)[h])
            for i in range(sq):
                p = i + sk - sq
                keys = [j for j in range(sk) if _visible(j, p, causal, left, right, sink_tokens)]
                s = np.array([scale * float(np.dot(q[b, i, h], k[b, j, kh])) for j in keys])
                if softcap > 0:
                    s = softcap * np.tanh(s / softcap)
                logits = list(s) + ([sink] if sink is not None else [])
                if not logits:
                    out[b, i, h], lse[b, h, i] = 0.0, -np.inf
                    continue
                m = max(logits)
                w = np.exp(s - m)
                denom = w.sum() + (math.exp(sink - m) if sink is not None else 0.0)
                out[b, i, h] = (w[:, None] * v[b, keys, kh]).sum(0) / denom if keys else 0.0
                lse[b, h, i] = m + math.log(denom)
    return out, lse


# (batch, seq_q, seq_k, q_heads, kv_heads, head_dim, options); sink_logits=True means random ones.
CASES = {
    "plain": (2, 17, 17, 4, 4, 32, {}),
    "scale": (1, 13, 19, 4, 4, 32, {"scale": 0.41}),
    "causal": (2, 23, 23, 4, 4, 32, {"causal": True}),
    "causal_q_lt_k": (1, 9, 30, 4, 2, 32, {"causal": True}),  # bottom-right: query i sees keys <= i + 21
    "causal_q_gt_k": (1, 30, 11, 4, 2, 32, {"causal": True}),  # the first 19 rows see no key
    "window_left": (1, 25, 25, 4, 4, 32, {"window": (5, -1)}),
    "window_right": (1, 25, 25, 4, 4, 32, {"window": (-1, 3)}),
    "window_both": (1, 20, 31, 4, 2, 32, {"window": (4, 2)}),
    "window_diagonal": (1, 12, 12, 2, 2, 32, {"window": (0, 0)}),
    "causal_window": (2, 27, 27, 4, 2, 32, {"causal": True, "window": (6, -1)}),
    "sink_tokens": (1, 26, 26, 4, 2, 32, {"causal": True, "window": (4, -1), "sink_tokens": 3}),
    "sink_tokens_two_sided": (1, 21, 29, 2, 2, 32, {"window": (3, 3), "sink_tokens": 2}),
    "sink_logits": (2, 15, 15, 4, 2, 32, {"causal": True, "sink_logits": True}),
    "sink_logits_empty_rows": (1, 12, 5, 4, 2, 32, {"causal": True, "sink_logits": True}),
    "softcap": (1, 19, 19, 4, 4, 32, {"softcap": 1.5}),
    "softcap_scale": (1, 16, 21, 4, 2, 32, {"softcap": 3.0, "scale": 0.5}),
    "gqa4": (1, 14, 14, 8, 2, 32, {"causal": True}),
    "gqa3": (1, 14, 18, 6, 2, 64, {}),  # a group of 3 q heads per kv head
    "mqa": (2, 10, 10, 4, 1, 32, {}),
    "everything": (2, 33, 40, 6, 2, 64, {"causal": True, "window": (9, -1), "sink_tokens": 2, "sink_logits": True,
                                         "softcap": 2.5, "scale": 0.3}),
}

# What "leaving the option out" means, for the sensitivity check.
DEFAULTS = {"causal": False, "scale": None, "window": (-1, -1), "sink_tokens": 0, "sink_logits": None, "softcap": 0.0}


def _inputs(case, seed):
    batch, sq, sk, hq, hkv, d, opts = CASES[case]
    rng = np.random.default_rng(seed)
    # Scores of a few units, so softcap (tanh) and the sink logits move the answer well past the tolerance.
    q = (2.0 * rng.standard_normal((batch, sq, hq, d))).astype(np.float32)
    k = rng.standard_normal((batch, sk, hkv, d)).astype(np.float32)
    v = rng.standard_normal((batch, sk, hkv, d)).astype(np.float32)
    opts = dict(opts)
    if opts.get("sink_logits") is True:
        opts["sink_logits"] = (1.5 * rng.standard_normal(hq)).astype(np.float32)
    return q, k, v, opts


def _check(out, lse, want, want_lse, tol=F32_TOL):
    out, lse = np.asarray(out, dtype=np.float64), np.asarray(lse, dtype=np.float64)
    assert np.isfinite(out).all(), "non-finite values in out"
    err = np.max(np.abs(out - want))
    assert err < tol, f"out: max abs error {err:.3g} against the independent oracle"
    assert (np.isneginf(lse) == np.isneginf(want_lse)).all(), "lse: the -inf rows differ"
    fin = np.isfinite(want_lse)
    lse_err = np.max(np.abs(lse[fin] - want_lse[fin])) if fin.any() else 0.0
    assert lse_err < tol, f"lse: max abs error {lse_err:.3g} against the independent oracle"


_ORACLE = {}


def _oracle_for(case, q, k, v, opts):
    if case not in _ORACLE:
        _ORACLE[case] = oracle(q, k, v, **opts)
    return _ORACLE[case]


@pytest.mark.parametrize("case", list(CASES))
def test_every_option_matters(case):
    """Leaving out any one option of the case changes the oracle's answer by > 100x the tolerance (so a test below
    fails when flashlite loses that option)."""
    q, k, v, opts = _inputs(case, seed=len(case))
    want, _ = _oracle_for(case, q, k, v, opts)
    for name in opts:
        if name == "sink_tokens" and "window" in opts:
            without = dict(opts, sink_tokens=0)
        else:
            without = dict(opts, **{name: DEFAULTS[name]})
        other, _ = oracle(q, k, v, **without)
        assert np.max(np.abs(other - want)) > 100 * F32_TOL, f"{case}: option {name} does not change the answer"


@pytest.mark.parametrize("backend", ["reference", "cpu", "naive", "auto"])
@pytest.mark.parametrize("case", list(CASES))
def test_numpy_matches_oracle(case, backend):
    q, k, v, opts = _inputs(case, seed=len(case))
    want, want_lse = _oracle_for(case, q, k, v, opts)
    out = np.full(q.shape, np.nan, dtype=np.float32)
    got, lse = flashlite.attention(q, k, v, return_lse=True, backend=backend, out=out, **opts)
    _check(got, lse, want, want_lse)


@pytest.mark.parametrize("case", list(CASES))
def test_reference_function_matches_oracle(case):
    """flashlite.reference (the float64 oracle of the other tests) agrees to float64 rounding."""
    q, k, v, opts = _inputs(case, seed=len(case))
    want, want_lse = _oracle_for(case, q, k, v, opts)
    got, lse = flashlite.reference(q, k, v, **opts)
    _check(got, lse, want, want_lse, tol=1e-9)


@pytest.mark.parametrize("backend", ["reference", "cpu", "auto"])
@pytest.mark.parametrize("case", list(CASES))
def test_torch_matches_oracle(case, backend):
    """The torch path (its own argument handling in flashlite/_torch_ops.py, the custom op or the eager fast path)."""
    torch = pytest.importorskip("torch")
    q, k, v, opts = _inputs(case, seed=len(case))
    want, want_lse = _oracle_for(case, q, k, v, opts)
    topts = {n: (torch.from_numpy(x) if isinstance(x, np.ndarray) else x) for n, x in opts.items()}
    got, lse = flashlite.attention(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v), return_lse=True,
                                   backend=backend, **topts)
    _check(got.numpy(), lse.numpy(), want, want_lse)
    # And through the custom op itself (what torch.compile and autograd-recording calls run).
    import flashlite.torch as fltorch
    with torch.enable_grad():
        qg = torch.from_numpy(q).requires_grad_()
        got = fltorch.attention(qg, torch.from_numpy(k), torch.from_numpy(v), backend=backend, **topts)
    assert got.grad_fn is not None
    _check(got.detach().numpy(), lse.numpy(), want, want_lse)


@pytest.mark.parametrize("backend", ["reference", "cpu", "naive"])
@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_varlen_matches_oracle(lib, backend):
    """Packed sequences (cu_seqlens): every sequence has its own bottom-right causal alignment, window and sinks."""
    rng = np.random.default_rng(5)
    seq_q, seq_k = [4, 0, 1, 19, 12], [9, 3, 1, 15, 30]
    cu_q, cu_k = np.cumsum([0] + seq_q).astype(np.int32), np.cumsum([0] + seq_k).astype(np.int32)
    q = (2.0 * rng.standard_normal((1, int(cu_q[-1]), 6, 32))).astype(np.float32)
    k = rng.standard_normal((1, int(cu_k[-1]), 2, 32)).astype(np.float32)
    v = rng.standard_normal((1, int(cu_k[-1]), 2, 32)).astype(np.float32)
    sinks = rng.standard_normal(6).astype(np.float32)
    opts = dict(causal=True, window=(5, -1), sink_tokens=2, softcap=4.0, scale=0.25)
    want, want_lse = oracle(q, k, v, sink_logits=sinks, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, **opts)
    if lib == "torch":
        torch = pytest.importorskip("torch")
        conv = torch.from_numpy
    else:
        conv = np.asarray
    got, lse = flashlite.attention(conv(q), conv(k), conv(v), sink_logits=conv(sinks), cu_seqlens_q=conv(cu_q),
                                   cu_seqlens_k=conv(cu_k), return_lse=True, backend=backend, **opts)
    _check(np.asarray(got), np.asarray(lse), want, want_lse)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_matches_oracle(dtype):
    """fp16 / bf16 through the torch CPU path: relative error < 1e-2 against the oracle on the rounded inputs."""
    torch = pytest.importorskip("torch")
    q, k, v, opts = _inputs("everything", seed=11)
    tdt = getattr(torch, dtype)
    qt, kt, vt = (torch.from_numpy(x).to(tdt) for x in (q, k, v))
    want, _ = oracle(qt.double().numpy(), kt.double().numpy(), vt.double().numpy(), **opts)
    topts = dict(opts, sink_logits=torch.from_numpy(opts["sink_logits"]))
    got = flashlite.attention(qt, kt, vt, **topts).double().numpy()
    rel = np.linalg.norm(got - want) / np.linalg.norm(want)
    assert rel < 1e-2, rel
