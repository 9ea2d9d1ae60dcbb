"""Helpers of the Python test suite (tests/python): inputs, the mask predicate for torch SDPA's attn_mask, error
measures. Inputs are random (never zeros); outputs are poisoned with NaN before a call."""
from __future__ import annotations

import numpy as np

# fp32: max abs error; fp16/bf16: relative error (DESIGN.md's correctness protocol).
F32_MAX_ABS = 1e-4
HALF_REL = 1e-2


def rel_err(a, ref):
    a = np.asarray(a, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    den = np.linalg.norm(ref)
    return float(np.linalg.norm(a - ref) / (den if den > 0 else 1.0))


def max_abs(a, ref):
    a = np.asarray(a, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    return float(np.max(np.abs(a - ref))) if a.size else 0.0


def assert_close(out, ref, dtype_name, what="out"):
    out = np.asarray(out, dtype=np.float64)
    assert np.isfinite(out).all(), f"{what}: {int((~np.isfinite(out)).sum())} non-finite values (unwritten?)"
    if dtype_name == "float32":
        err = max_abs(out, ref)
        assert err < F32_MAX_ABS, f"{what}: max abs error {err:.3g} >= {F32_MAX_ABS}"
    else:
        err = rel_err(out, ref)
        assert err < HALF_REL, f"{what}: relative error {err:.3g} >= {HALF_REL}"
    return err


def assert_lse_close(lse, ref):
    lse = np.asarray(lse, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    same_inf = np.isneginf(lse) == np.isneginf(ref)
    assert same_inf.all(), f"lse: -inf pattern differs in {int((~same_inf).sum())} rows"
    fin = np.isfinite(ref)
    assert np.isfinite(lse[fin]).all(), "lse: non-finite where the reference is finite"
    if fin.any():
        err = float(np.max(np.abs(lse[fin] - ref[fin])))
        assert err < 1e-3, f"lse: max abs error {err:.3g} >= 1e-3"


def numpy_inputs(rng, b, sq, sk, hq, hkv, d, dtype=np.float32, strided=False):
    """q [b, sq, hq, d], k/v [b, sk, hkv, d]. strided: views into bigger buffers ([b, h, s, d] transposed, and a
    padded head dimension), so batch/seq/head strides are all non-trivial while head_dim stays contiguous."""
    def make(s, h):
        if not strided:
            return rng.standard_normal((b, s, h, d)).astype(dtype)
        base = rng.standard_normal((b, h + 1, s, d)).astype(dtype)  # [b, h+1, s, d]
        return base[:, 1:].transpose(0, 2, 1, 3)  # [b, s, h, d] view
    return make(sq, hq), make(sk, hkv), make(sk, hkv)


def visible_mask(sq, sk, causal=False, window=(-1, -1), sink_tokens=0):
    """The mask predicate of include/flashlite/attention.h as a [sq, sk] boolean numpy array."""
    i = np.arange(sq)[:, None]
    j = np.arange(sk)[None, :]
    p = i + (sk - sq)
    left, right = window
    vis = np.ones((sq, sk), dtype=bool)
    in_win = np.ones((sq, sk), dtype=bool)
    if left >= 0:
        in_win &= j >= p - left
    if right >= 0:
        in_win &= j <= p + right
    vis = in_win | (j < sink_tokens)
    if causal:
        vis &= j <= p
    return vis
