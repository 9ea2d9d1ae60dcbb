"""flashlite's Python API on the CPU with numpy (runs in CI): DLPack views without copies, every keyword, out=,
return_lse, backends, errors as ValueError/TypeError with the C++ message."""
import numpy as np
import pytest

import flashlite
from pyattn_util import assert_close, assert_lse_close, numpy_inputs, visible_mask

CASES = [
    # (b, sq, sk, hq, hkv, d, options)
    (2, 17, 17, 4, 4, 64, {}),
    (1, 1, 33, 8, 2, 32, {"causal": True}),
    (2, 40, 25, 6, 2, 96, {"causal": True}),  # q_len > k_len: fully masked rows
    (1, 64, 100, 8, 1, 128, {"window": (16, 0), "sink_tokens": 4}),
    (2, 33, 33, 4, 2, 64, {"causal": True, "window": (8, -1), "softcap": 5.0, "scale": 0.2}),
    (1, 50, 70, 3, 3, 64, {"window": (10, 5)}),
]


@pytest.mark.parametrize("backend", ["cpu", "naive", "auto"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("strided", [False, True])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_matches_reference(case, strided, dtype, backend):
    b, sq, sk, hq, hkv, d, opts = CASES[case]
    rng = np.random.default_rng(case * 7 + int(strided))
    q, k, v = numpy_inputs(rng, b, sq, sk, hq, hkv, d, dtype, strided)
    ref, ref_lse = flashlite.reference(q, k, v, **opts)
    out = np.full(q.shape, np.nan, dtype=dtype)
    got, lse = flashlite.attention(q, k, v, out=out, return_lse=True, backend=backend, **opts)
    assert got is out, "out= must be written in place and returned"
    assert_close(out, ref, np.dtype(dtype).name)
    assert_lse_close(lse, ref_lse)


def test_sink_logits_and_fully_masked_rows():
    rng = np.random.default_rng(1)
    q, k, v = numpy_inputs(rng, 1, 12, 5, 4, 2, 64)
    sinks = rng.standard_normal(4).astype(np.float32)
    out, lse = flashlite.attention(q, k, v, causal=True, sink_logits=sinks, return_lse=True)
    ref, ref_lse = flashlite.reference(q, k, v, causal=True, sink_logits=sinks)
    assert_close(out, ref, "float32")
    assert_lse_close(lse, ref_lse)
    # Rows 0..6 see no key (causal, 12 queries on 5 keys): zeros, LSE = the head's sink logit.
    assert np.all(out[:, :7] == 0)
    np.testing.assert_allclose(lse[0, :, :7], np.repeat(sinks[:, None], 7, axis=1), rtol=1e-6)
    out2, lse2 = flashlite.attention(q, k, v, causal=True, return_lse=True)
    assert np.all(out2[:, :7] == 0) and np.all(np.isneginf(lse2[:, :, :7]))


def test_reference_matches_numpy_softmax():
    """The oracle itself, against a direct numpy float64 evaluation of the masked softmax."""
    rng = np.random.default_rng(2)
    q, k, v = numpy_inputs(rng, 1, 9, 13, 2, 1, 32)
    opts = dict(causal=True, window=(3, -1), sink_tokens=2)
    ref, ref_lse = flashlite.reference(q, k, v, **opts)
    vis = visible_mask(9, 13, True, (3, -1), 2)
    for h in range(2):
        s = q[0, :, h].astype(np.float64) @ k[0, :, 0].astype(np.float64).T / np.sqrt(32)
        s = np.where(vis, s, -np.inf)
        m = s.max(axis=1, keepdims=True)
        p = np.exp(s - m)
        l = p.sum(axis=1, keepdims=True)
        np.testing.assert_allclose(ref[0, :, h], (p / l) @ v[0, :, 0].astype(np.float64), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(ref_lse[0, h], (m + np.log(l))[:, 0], rtol=1e-10)


def test_varlen_with_lists_and_arrays():
    rng = np.random.default_rng(3)
    cu_q, cu_k = [0, 3, 3, 20, 21], [0, 10, 12, 30, 31]  # an empty query sequence and a length-1 one
    q, k, v = numpy_inputs(rng, 1, 21, 31, 4, 2, 64)
    out = np.full(q.shape, np.nan, dtype=np.float32)
    _, lse = flashlite.attention(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=np.array(cu_k, dtype=np.int32),
                                 causal=True, out=out, return_lse=True)
    ref, ref_lse = flashlite.reference(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=True)
    assert lse.shape == (1, 4, 21)
    assert_close(out, ref, "float32")
    assert_lse_close(lse, ref_lse)


def test_no_copies_of_inputs():
    """Strided views are passed as views: the result equals that of the contiguous copy, and read-only inputs work."""
    rng = np.random.default_rng(4)
    q, k, v = numpy_inputs(rng, 2, 20, 20, 4, 4, 64, strided=True)
    assert not q.flags.c_contiguous
    for a in (q, k, v):
        a.flags.writeable = False
    a = flashlite.attention(q, k, v, causal=True)
    b = flashlite.attention(np.ascontiguousarray(q), np.ascontiguousarray(k), np.ascontiguousarray(v), causal=True)
    np.testing.assert_array_equal(a, b)


def test_kernel_name_and_workspace():
    rng = np.random.default_rng(5)
    q, k, v = numpy_inputs(rng, 1, 8, 8, 2, 2, 64)
    assert flashlite.kernel_name(q, k, v).startswith("cpu_tiled_")
    assert flashlite.kernel_name(q, k, v, backend="naive") == "cpu_naive_three_step"
    assert flashlite.kernel_name(q, k, v, backend="reference") == "reference_f64"
    assert flashlite.workspace_bytes(q, k, v) == 0


def _expect(exc, match, q, k, v, **kw):
    with pytest.raises(exc, match=match):
        flashlite.attention(q, k, v, **kw)


def test_errors_arrive_as_python_exceptions():
    rng = np.random.default_rng(6)
    q, k, v = numpy_inputs(rng, 1, 8, 8, 4, 2, 64)
    _expect(ValueError, "window_left is -2", q, k, v, window=(-2, 0))
    _expect(ValueError, "sink_tokens is -1", q, k, v, sink_tokens=-1)
    _expect(ValueError, "backend 'gpu' is unknown", q, k, v, backend="gpu")
    _expect(ValueError, "q has rank 3", q[0], k, v)
    _expect(ValueError, "not divisible", q[:, :, :3], k, v)
    _expect(TypeError, "k has dtype float16 but q has float32", q, k.astype(np.float16), v)
    _expect(ValueError, "head_dim stride", q[..., ::2], k[..., ::2], v[..., ::2])
    _expect(ValueError, "scale is", q, k, v, scale=float("nan"))
    _expect(ValueError, "needs CUDA tensors", q, k, v, backend="cuda")
    _expect(ValueError, "cu_seqlens_q is not monotone", q, k, v, cu_seqlens_q=[0, 5, 3], cu_seqlens_k=[0, 4, 8])
    _expect(TypeError, "cu_seqlens_q has dtype int64", q, k, v, cu_seqlens_q=np.array([0, 8], dtype=np.int64),
            cu_seqlens_k=np.array([0, 8], dtype=np.int32))
    _expect(TypeError, "window is", q, k, v, window=4)
    _expect(TypeError, "expected a torch.Tensor, numpy.ndarray or cupy.ndarray", [[1.0]], k, v)
    with pytest.raises(TypeError, match="q has dtype float64; expected float32"):
        flashlite.attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64))


def test_scalar_arguments_are_checked_strictly():
    """bool("no") is True and float("2") parses: causal, scale, window, sink_tokens and softcap take only their own
    types, and ints past int32 are a ValueError naming the argument (not nanobind's unclear TypeError). numpy scalars
    and the ints 0 / 1 for causal are accepted and mean what the Python values mean."""
    rng = np.random.default_rng(10)
    q, k, v = numpy_inputs(rng, 1, 8, 8, 2, 2, 16)
    _expect(TypeError, "causal is 'no'; expected True or False", q, k, v, causal="no")
    _expect(TypeError, "causal is 2; expected True or False", q, k, v, causal=2)
    _expect(TypeError, "scale is '0.1'; expected a number", q, k, v, scale="0.1")
    _expect(TypeError, "softcap is '1'; expected a number", q, k, v, softcap="1")
    _expect(TypeError, r"window\[0\] \(left\) is 2.5; expected an int", q, k, v, window=(2.5, 0))
    _expect(ValueError, r"window\[1\] \(right\) is 4294967296; expected a value within int32", q, k, v,
            window=(-1, 2**32))
    _expect(ValueError, "sink_tokens is 2147483648; expected a value within int32", q, k, v, sink_tokens=2**31)
    _expect(TypeError, "sink_tokens is True; expected an int", q, k, v, sink_tokens=True)
    want = flashlite.attention(q, k, v, causal=True, window=(4, 0), sink_tokens=1, scale=0.25, backend="cpu")
    for causal in (1, np.bool_(True)):
        got = flashlite.attention(q, k, v, causal=causal, window=(np.int64(4), np.int32(0)), sink_tokens=np.int16(1),
                                  scale=np.float64(0.25), backend="cpu")
        assert np.array_equal(got, want)
    assert not np.array_equal(flashlite.attention(q, k, v, causal=0, backend="cpu"), want)
    with pytest.raises(TypeError, match="causal is 'yes'"):
        flashlite.kernel_name(q, k, v, causal="yes")


def test_scalar_arguments_accept_arrays_and_zero_dim_values():
    """The strict checks still take what numpy / torch code passes: window as any pair (numpy array, list), scale and
    softcap as 0-d arrays or tensors and other real numbers (Fraction); they refuse arrays of more than one value,
    complex numbers and bools, naming the argument."""
    import fractions
    rng = np.random.default_rng(11)
    q, k, v = numpy_inputs(rng, 1, 8, 8, 2, 2, 16)
    want = flashlite.attention(q, k, v, causal=True, window=(3, 0), sink_tokens=1, scale=0.125, softcap=2.0,
                               backend="cpu")
    for window in (np.array([3, 0]), [3, 0], (np.int32(3), np.array(0))):
        for scale in (np.array(0.125), np.float32(0.125), fractions.Fraction(1, 8)):
            got = flashlite.attention(q, k, v, causal=np.array(True), window=window, sink_tokens=np.array(1),
                                      scale=scale, softcap=np.array(2.0), backend="cpu")
            assert np.array_equal(got, want), (window, scale)
    assert not np.array_equal(flashlite.attention(q, k, v, causal=True, window=np.array([2, 0]), sink_tokens=1,
                                                  scale=0.125, softcap=2.0, backend="cpu"), want)
    _expect(TypeError, "window is array\\(\\[1, 2, 3\\]\\); expected a pair", q, k, v, window=np.array([1, 2, 3]))
    _expect(TypeError, "window is array\\(5\\); expected a pair", q, k, v, window=np.array(5))
    _expect(TypeError, "window is 'ab'; expected a pair", q, k, v, window="ab")
    _expect(TypeError, r"window\[0\] \(left\) is .*2\.0.*; expected an int", q, k, v, window=np.array([2.0, 0.0]))
    _expect(TypeError, "scale is array\\(\\[0.1\\]\\); expected a number", q, k, v, scale=np.array([0.1]))
    _expect(TypeError, "scale is .*True.*; expected a number", q, k, v, scale=np.bool_(True))
    _expect(TypeError, "softcap is .*1j.*; expected a number", q, k, v, softcap=np.complex64(1j))
    _expect(TypeError, "causal is array", q, k, v, causal=np.array([True, False]))
    torch = pytest.importorskip("torch")
    got = flashlite.attention(q, k, v, causal=torch.tensor(True), window=torch.tensor([3, 0]),
                              sink_tokens=torch.tensor(1), scale=torch.tensor(0.125), softcap=torch.tensor(2.0),
                              backend="cpu")
    assert np.array_equal(got, want)
    _expect(TypeError, "sink_tokens is tensor\\(1.5000\\); expected an int", q, k, v, sink_tokens=torch.tensor(1.5))
    _expect(TypeError, "scale is tensor\\(True\\); expected a number", q, k, v, scale=torch.tensor(True))


def test_empty_arrays_are_accepted():
    """numpy gives arrays without elements all-zero strides: no query rows, no keys or no batch must not be refused
    as "head_dim stride 0"; rows without keys get zeros and LSE -inf."""
    rng = np.random.default_rng(8)
    q, k, v = numpy_inputs(rng, 2, 3, 4, 4, 2, 16)
    assert np.zeros((1, 0, 2, 8)).strides == (0, 0, 0, 0)  # what the fix is about
    for backend in ("cpu", "naive", "reference"):
        out, lse = flashlite.attention(q[:, :0], k, v, return_lse=True, backend=backend)
        assert out.shape == (2, 0, 4, 16) and lse.shape == (2, 4, 0)
        out, lse = flashlite.attention(q, k[:, :0], v[:, :0], return_lse=True, backend=backend)
        assert np.all(out == 0) and np.all(np.isneginf(lse))
        assert flashlite.attention(q[:0], k[:0], v[:0], backend=backend).shape == (0, 3, 4, 16)


def test_offset_lists_must_hold_int32_values():
    """Lists of offsets are not truncated (2.5 -> 2) or wrapped (2**32 + 5 -> 5) into int32 silently."""
    rng = np.random.default_rng(9)
    q, k, v = numpy_inputs(rng, 1, 8, 8, 2, 2, 16)
    _expect(TypeError, "cu_seqlens_q has entries of dtype float64", q, k, v, cu_seqlens_q=[0, 2.5, 8],
            cu_seqlens_k=[0, 4, 8])
    _expect(ValueError, "cu_seqlens_k has entries from 0 to 4294967301; expected int32", q, k, v,
            cu_seqlens_q=[0, 5], cu_seqlens_k=[0, 2**32 + 5])
    assert flashlite.attention(q, k, v, cu_seqlens_q=(0, 3, 8), cu_seqlens_k=[0, 4, 8]).shape == q.shape


def test_nothing_written_on_error():
    rng = np.random.default_rng(7)
    q, k, v = numpy_inputs(rng, 1, 8, 8, 2, 2, 64)
    out = np.full(q.shape, np.nan, dtype=np.float32)
    with pytest.raises(ValueError):
        flashlite.attention(q, k, v, out=out, window=(-5, -1))
    assert np.isnan(out).all()
    with pytest.raises(ValueError, match="out overlaps q"):
        flashlite.attention(q, k, v, out=q)


def test_module_exports_none_of_the_library():
    """The module links flashlite statically and exports none of its C++ symbols, so a second copy in the process (a
    C++ extension that links flashlite too) keeps its own state: with exported symbols, GCC's process-wide unique
    statics let one copy's kernel set-up flags stand for the other's kernels, whose launches then fail."""
    import shutil
    import subprocess
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (binutils) is not installed")
    from flashlite import _C
    out = subprocess.run([nm, "-DC", "--defined-only", _C.__file__], capture_output=True, text=True, check=True).stdout
    leaked = [line for line in out.splitlines() if "flashlite::" in line]
    assert not leaked, f"{len(leaked)} flashlite symbols exported, e.g. {leaked[:3]}"
