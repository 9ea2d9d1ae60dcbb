"""Bad arguments at every public Python entry point, as a newcomer or an attacker passes them: wrong types (lists,
strings, None, floats), read-only outputs, strided head_dim, unsupported dtypes (int64, float64, bool, complex,
object), wrong ranks, mismatched devices, out-of-range ints, NaN scale, bad cu_seqlens, keyword typos, bad caches,
ropes and configs. Each call must raise ValueError / TypeError (RuntimeError for runtime failures) with a message
that names the argument -- never nanobind's "incompatible function arguments" signature dump, an AttributeError /
KeyError from inside the package, or a crash -- and must write nothing: every array of the case's inputs (outputs
poisoned with NaN, caches) is compared with its state before the call."""
from __future__ import annotations

import re
import types

import numpy as np
import pytest

import flashlite

torch = pytest.importorskip("torch")
import flashlite.torch as fl_torch  # noqa: E402  (needs torch)

B, SQ, SK, HQ, HKV, D, CAP, PAGE = 2, 4, 6, 4, 2, 16, 16, 16


def _ro(a):
    a = np.array(a, copy=True)
    a.flags.writeable = False
    return a


def _strided(a):
    """The same values with head_dim stride 2 (last dim not contiguous)."""
    if isinstance(a, np.ndarray):
        b = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), dtype=a.dtype)
    else:
        b = torch.zeros(a.shape[:-1] + (2 * a.shape[-1],), dtype=a.dtype)
    b[..., ::2] = a
    return b[..., ::2]


def _broadcast(a):
    """A writable view of a whose seq dimension has stride 0 (every row aliases row 0)."""
    return np.lib.stride_tricks.as_strided(a, shape=a.shape, strides=(a.strides[0], 0) + a.strides[2:],
                                           writeable=True)


def _object(a):
    o = np.empty(a.shape, dtype=object)
    o[...] = 1.0
    return o


def env():
    """Fresh inputs for one case: numpy and torch (CPU) attention inputs, NaN-poisoned outputs, KV caches."""
    rng = np.random.default_rng(0)
    f32 = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    e = types.SimpleNamespace()
    e.q, e.k, e.v = f32(B, SQ, HQ, D), f32(B, SK, HKV, D), f32(B, SK, HKV, D)
    e.out = np.full(e.q.shape, np.nan, np.float32)
    e.tq, e.tk, e.tv = (torch.from_numpy(x.copy()) for x in (e.q, e.k, e.v))
    e.tout = torch.full(e.q.shape, float("nan"))
    # contiguous caches holding 6 tokens per sequence, room for 16; a decode step appends one
    e.kc, e.vc = f32(B, CAP, HKV, D), f32(B, CAP, HKV, D)
    e.cache = flashlite.KVCache(e.kc, e.vc, seq_lens=[SK, SK])
    e.tkc, e.tvc = torch.from_numpy(e.kc.copy()), torch.from_numpy(e.vc.copy())
    e.tcache = flashlite.KVCache(e.tkc, e.tvc, seq_lens=[SK, SK])
    e.kp, e.vp = f32(3, PAGE, HKV, D), f32(3, PAGE, HKV, D)  # paged: sequence 0 in page 2, sequence 1 in page 0
    e.pcache = flashlite.KVCache(e.kp, e.vp, page_indptr=[0, 1, 2], page_indices=[2, 0], last_page_len=[SK, SK])
    e.qd, e.tqd = e.q[:, :1].copy(), e.tq[:, :1].clone()
    e.dout, e.tdout = np.full(e.qd.shape, np.nan, np.float32), torch.full(e.qd.shape, float("nan"))
    e.knew, e.vnew = f32(B, 1, HKV, D), f32(B, 1, HKV, D)
    e.tknew, e.tvnew = torch.from_numpy(e.knew.copy()), torch.from_numpy(e.vnew.copy())
    e.qout = np.full(e.qd.shape, np.nan, np.float32)
    e.rope = flashlite.Rope()
    return e


def _grown(e, lib="numpy"):
    """The contiguous cache with its lengths grown by the token append_kv is about to write."""
    return (e.cache if lib == "numpy" else e.tcache).update(seq_lens=[SK + 1, SK + 1])


A = flashlite.attention
CASES = [
    # ---- flashlite.attention, numpy ----
    ("attn-q-list", lambda e: A(e.q.tolist(), e.k, e.v), TypeError, r"\bq is a builtins.list"),
    ("attn-q-str", lambda e: A("q", e.k, e.v), TypeError, r"\bq is a builtins.str"),
    ("attn-q-none", lambda e: A(None, e.k, e.v), TypeError, r"\bq is a builtins.NoneType"),
    ("attn-q-float", lambda e: A(1.5, e.k, e.v), TypeError, r"\bq is a builtins.float"),
    ("attn-k-list", lambda e: A(e.q, e.k.tolist(), e.v), TypeError, r"\bk is a builtins.list"),
    ("attn-v-none", lambda e: A(e.q, e.k, None), TypeError, r"\bv is a builtins.NoneType"),
    ("attn-k-str", lambda e: A(e.q, "k", e.v), TypeError, r"\bk is a builtins.str"),
    ("attn-k-torch", lambda e: A(e.q, e.tk, e.v), TypeError, r"\bk is a torch.Tensor.*numpy"),
    ("attn-out-readonly", lambda e: A(e.q, e.k, e.v, out=_ro(e.out)), ValueError, r"\bout is read-only"),
    ("attn-out-list", lambda e: A(e.q, e.k, e.v, out=e.out.tolist()), TypeError, r"\bout is a builtins.list"),
    ("attn-out-float64", lambda e: A(e.q, e.k, e.v, out=e.out.astype(np.float64)), TypeError,
     r"\bout has dtype float64"),
    ("attn-out-shape", lambda e: A(e.q, e.k, e.v, out=e.out[:, :2]), ValueError, r"\bout has seq_q 2"),
    ("attn-out-strided", lambda e: A(e.q, e.k, e.v, out=_strided(e.out)), ValueError, r"\bout has head_dim stride"),
    ("attn-out-torch", lambda e: A(e.q, e.k, e.v, out=e.tout), TypeError, r"\bout is a torch.Tensor.*numpy"),
    ("attn-out-object", lambda e: A(e.q, e.k, e.v, out=_object(e.out)), TypeError, r"\bout has dtype object"),
    ("attn-q-int64", lambda e: A(e.q.astype(np.int64), e.k, e.v), TypeError, r"\bq has dtype int64"),
    ("attn-q-float64", lambda e: A(e.q.astype(np.float64), e.k, e.v), TypeError, r"\bq has dtype float64"),
    ("attn-q-bool", lambda e: A(e.q > 0, e.k, e.v), TypeError, r"\bq has dtype bool"),
    ("attn-q-complex", lambda e: A(e.q.astype(np.complex64), e.k, e.v), TypeError, r"\bq has dtype complex"),
    ("attn-q-object", lambda e: A(_object(e.q), e.k, e.v), TypeError, r"\bq has dtype object"),
    ("attn-q-str-array", lambda e: A(np.full(e.q.shape, "x"), e.k, e.v), TypeError, r"\bq has dtype <U1"),
    ("attn-v-object", lambda e: A(e.q, e.k, _object(e.v)), TypeError, r"\bv has dtype object"),
    ("attn-q-bigendian", lambda e: A(e.q.astype(">f4"), e.k, e.v), TypeError, r"\bq has dtype >f4"),
    ("attn-out-bigendian", lambda e: A(e.q, e.k, e.v, out=np.zeros(e.q.shape, ">f4")), TypeError,
     r"\bout has dtype >f4"),
    ("attn-q-memoryview", lambda e: A(memoryview(e.q), e.k, e.v), TypeError, r"\bq is a builtins.memoryview"),
    ("attn-out-broadcast", lambda e: A(e.q, e.k, e.v, out=_broadcast(e.out)), ValueError, r"\bout has stride 0"),
    ("attn-out-broadcast-readonly", lambda e: A(e.q, e.k, e.v, out=np.broadcast_to(e.out[:, :1], e.q.shape)),
     ValueError, r"\bout is read-only"),
    ("attn-q-rank3", lambda e: A(e.q[0], e.k, e.v), ValueError, r"\bq has rank 3"),
    ("attn-q-rank5", lambda e: A(e.q[None], e.k, e.v), ValueError, r"\bq has rank 5"),
    ("attn-k-rank2", lambda e: A(e.q, e.k[0, 0], e.v), ValueError, r"\bk has rank 2"),
    ("attn-q-0d", lambda e: A(np.float32(1.0), e.k, e.v), TypeError, r"\bq is a numpy.float32"),
    ("attn-q-strided", lambda e: A(_strided(e.q), e.k, e.v), ValueError, r"\bq has head_dim stride"),
    ("attn-v-strided", lambda e: A(e.q, e.k, _strided(e.v)), ValueError, r"\bv has head_dim stride"),
    ("attn-k-dtype-mix", lambda e: A(e.q, e.k.astype(np.float16), e.v), TypeError, r"\bk has dtype float16"),
    ("attn-head-dim-mix", lambda e: A(e.q, e.k[..., :8], e.v), ValueError, r"\bk has head_dim|\bk\b.*head"),
    ("attn-scale-nan", lambda e: A(e.q, e.k, e.v, scale=float("nan")), ValueError, r"\bscale is nan"),
    ("attn-scale-inf", lambda e: A(e.q, e.k, e.v, scale=float("inf")), ValueError, r"\bscale is inf"),
    ("attn-scale-str", lambda e: A(e.q, e.k, e.v, scale="0.1"), TypeError, r"\bscale is '0.1'"),
    ("attn-scale-list", lambda e: A(e.q, e.k, e.v, scale=[0.1]), TypeError, r"\bscale is \[0.1\]"),
    ("attn-scale-complex", lambda e: A(e.q, e.k, e.v, scale=1j), TypeError, r"\bscale is 1j"),
    ("attn-scale-huge-int", lambda e: A(e.q, e.k, e.v, scale=10**400), ValueError, r"\bscale is"),
    ("attn-softcap-neg", lambda e: A(e.q, e.k, e.v, softcap=-1.0), ValueError, r"\bsoftcap is -1"),
    ("attn-softcap-nan", lambda e: A(e.q, e.k, e.v, softcap=float("nan")), ValueError, r"\bsoftcap is nan"),
    ("attn-softcap-none", lambda e: A(e.q, e.k, e.v, softcap=None), TypeError, r"\bsoftcap is None"),
    ("attn-window-neg", lambda e: A(e.q, e.k, e.v, window=(-7, 0)), ValueError, r"\bwindow_left is -7"),
    ("attn-window-huge", lambda e: A(e.q, e.k, e.v, window=(2**40, 0)), ValueError, r"\bwindow\[0\] \(left\)"),
    ("attn-window-float", lambda e: A(e.q, e.k, e.v, window=(1.5, 0)), TypeError, r"\bwindow\[0\] \(left\)"),
    ("attn-window-triple", lambda e: A(e.q, e.k, e.v, window=(1, 2, 3)), TypeError, r"\bwindow is \(1, 2, 3\)"),
    ("attn-window-str", lambda e: A(e.q, e.k, e.v, window="-1,-1"), TypeError, r"\bwindow is '-1,-1'"),
    ("attn-window-int", lambda e: A(e.q, e.k, e.v, window=3), TypeError, r"\bwindow is 3"),
    ("attn-sink-neg", lambda e: A(e.q, e.k, e.v, sink_tokens=-1), ValueError, r"\bsink_tokens is -1"),
    ("attn-sink-huge", lambda e: A(e.q, e.k, e.v, sink_tokens=2**63), ValueError, r"\bsink_tokens is"),
    ("attn-sink-float", lambda e: A(e.q, e.k, e.v, sink_tokens=2.0), TypeError, r"\bsink_tokens is 2.0"),
    ("attn-sink-none", lambda e: A(e.q, e.k, e.v, sink_tokens=None), TypeError, r"\bsink_tokens is None"),
    ("attn-causal-str", lambda e: A(e.q, e.k, e.v, causal="no"), TypeError, r"\bcausal is 'no'"),
    ("attn-causal-none", lambda e: A(e.q, e.k, e.v, causal=None), TypeError, r"\bcausal is None"),
    ("attn-return-lse-str", lambda e: A(e.q, e.k, e.v, return_lse="no"), TypeError, r"\breturn_lse is 'no'"),
    ("attn-backend-none", lambda e: A(e.q, e.k, e.v, backend=None), TypeError, r"\bbackend is None"),
    ("attn-backend-unknown", lambda e: A(e.q, e.k, e.v, backend="gpu"), ValueError, r"\bbackend 'gpu'"),
    ("attn-backend-cuda", lambda e: A(e.q, e.k, e.v, backend="cuda"), ValueError, r"\bbackend|CUDA"),
    ("attn-sink-logits-list", lambda e: A(e.q, e.k, e.v, sink_logits=[0.5] * HQ), TypeError,
     r"\bsink_logits is a builtins.list"),
    ("attn-sink-logits-str", lambda e: A(e.q, e.k, e.v, sink_logits="x"), TypeError,
     r"\bsink_logits is a builtins.str"),
    ("attn-sink-logits-f64", lambda e: A(e.q, e.k, e.v, sink_logits=np.zeros(HQ)), TypeError,
     r"\bsink_logits has dtype float64"),
    ("attn-sink-logits-shape", lambda e: A(e.q, e.k, e.v, sink_logits=np.zeros(HQ + 1, np.float32)), ValueError,
     r"\bsink_logits has shape"),
    ("attn-sink-logits-object", lambda e: A(e.q, e.k, e.v, sink_logits=_object(np.zeros(HQ))), TypeError,
     r"\bsink_logits has dtype object"),
    ("attn-cu-unsorted", lambda e: A(e.q[:1], e.k[:1], e.v[:1], cu_seqlens_q=[0, 3, 2], cu_seqlens_k=[0, 3, 6]),
     ValueError, r"\bcu_seqlens_q is not monotone"),
    ("attn-cu-negative", lambda e: A(e.q[:1], e.k[:1], e.v[:1], cu_seqlens_q=[-1, 4], cu_seqlens_k=[0, 6]),
     ValueError, r"\bcu_seqlens_q"),
    ("attn-cu-length", lambda e: A(e.q[:1], e.k[:1], e.v[:1], cu_seqlens_q=[0, 2, 4], cu_seqlens_k=[0, 6]),
     ValueError, r"\bcu_seqlens_k|\bcu_seqlens_q"),
    ("attn-cu-past-end", lambda e: A(e.q[:1], e.k[:1], e.v[:1], cu_seqlens_q=[0, 9], cu_seqlens_k=[0, 6]),
     ValueError, r"\bcu_seqlens_q"),
    ("attn-cu-int64", lambda e: A(e.q[:1], e.k[:1], e.v[:1], cu_seqlens_q=np.array([0, 4]),
                                  cu_seqlens_k=np.array([0, 6], np.int32)), TypeError,
     r"\bcu_seqlens_q has dtype int64"),
    ("attn-cu-float-list", lambda e: A(e.q[:1], e.k[:1], e.v[:1], cu_seqlens_q=[0, 4.0], cu_seqlens_k=[0, 6]),
     TypeError, r"\bcu_seqlens_q has entries of dtype float64"),
    ("attn-cu-str", lambda e: A(e.q[:1], e.k[:1], e.v[:1], cu_seqlens_q="0,4", cu_seqlens_k=[0, 6]), TypeError,
     r"\bcu_seqlens_q is a builtins.str"),
    ("attn-cu-nested", lambda e: A(e.q[:1], e.k[:1], e.v[:1], cu_seqlens_q=[[0, 4]], cu_seqlens_k=[0, 6]),
     ValueError, r"\bcu_seqlens_q has rank 2"),
    ("attn-cu-ragged-list", lambda e: A(e.q[:1], e.k[:1], e.v[:1], cu_seqlens_q=[0, [4]], cu_seqlens_k=[0, 6]),
     TypeError, r"\bcu_seqlens_q"),
    ("attn-cu-only-q", lambda e: A(e.q[:1], e.k[:1], e.v[:1], cu_seqlens_q=[0, 4]), ValueError,
     r"\bcu_seqlens_k|\bcu_seqlens_q"),
    ("attn-cu-batch2", lambda e: A(e.q, e.k, e.v, cu_seqlens_q=[0, 4], cu_seqlens_k=[0, 6]), ValueError,
     r"\bq\b|\bcu_seqlens"),
    ("attn-cu-scalar", lambda e: A(e.q[:1], e.k[:1], e.v[:1], cu_seqlens_q=4, cu_seqlens_k=[0, 6]), TypeError,
     r"\bcu_seqlens_q is a builtins.int"),
    ("attn-typo-kw", lambda e: A(e.q, e.k, e.v, casual=True), TypeError, r"'casual'"),
    ("attn-positional-extra", lambda e: A(e.q, e.k, e.v, True), TypeError, r"positional"),
    # ---- flashlite.attention, torch ----
    ("tattn-k-list", lambda e: A(e.tq, e.tk.tolist(), e.tv), TypeError, r"\bk is a builtins.list"),
    ("tattn-k-numpy", lambda e: A(e.tq, e.k, e.tv), TypeError, r"\bk is a numpy.ndarray"),
    ("tattn-out-numpy", lambda e: A(e.tq, e.tk, e.tv, out=e.out), TypeError, r"\bout is a numpy.ndarray"),
    ("tattn-out-f64", lambda e: A(e.tq, e.tk, e.tv, out=e.tout.double()), TypeError, r"\bout has dtype float64"),
    ("tattn-out-strided", lambda e: A(e.tq, e.tk, e.tv, out=_strided(e.tout)), ValueError,
     r"\bout has head_dim stride"),
    ("tattn-q-int64", lambda e: A(e.tq.long(), e.tk, e.tv), TypeError, r"\bq has dtype int64"),
    ("tattn-q-bool", lambda e: A(e.tq > 0, e.tk, e.tv), TypeError, r"\bq has dtype bool"),
    ("tattn-q-f64", lambda e: A(e.tq.double(), e.tk.double(), e.tv.double()), TypeError, r"\bq has dtype float64"),
    ("tattn-q-complex", lambda e: A(e.tq.to(torch.complex64), e.tk, e.tv), TypeError, r"\bq has dtype complex"),
    ("tattn-q-rank3", lambda e: A(e.tq[0], e.tk, e.tv), ValueError, r"\bq has rank 3"),
    ("tattn-k-meta", lambda e: A(e.tq, e.tk.to("meta"), e.tv), ValueError, r"\bk is on meta"),
    ("tattn-q-meta", lambda e: A(e.tq.to("meta"), e.tk, e.tv), ValueError, r"\bq is on meta"),
    ("tattn-out-meta", lambda e: A(e.tq, e.tk, e.tv, out=e.tout.to("meta")), ValueError, r"\bout is on meta"),
    ("tattn-out-expanded", lambda e: A(e.tq, e.tk, e.tv, out=e.tout[:, :1].expand(e.tq.shape)), ValueError,
     r"\bout has stride 0"),
    ("tattn-q-sparse", lambda e: A(e.tq.to_sparse(), e.tk, e.tv), TypeError, r"\bq is a torch.sparse_coo tensor"),
    ("tattn-sink-logits-2d", lambda e: A(e.tq, e.tk, e.tv, sink_logits=torch.zeros(1, HQ)), ValueError,
     r"\bsink_logits has shape"),
    ("tattn-sink-logits-list-float", lambda e: A(e.tq, e.tk, e.tv, sink_logits=[0.5] * HQ), TypeError,
     r"\bsink_logits is a builtins.list"),
    ("tattn-sink-logits-str", lambda e: A(e.tq, e.tk, e.tv, sink_logits="x"), TypeError,
     r"\bsink_logits is a builtins.str"),
    ("tattn-sink-logits-meta", lambda e: A(e.tq, e.tk, e.tv, sink_logits=torch.zeros(HQ, device="meta")), ValueError,
     r"\bsink_logits is on meta"),
    ("tattn-cu-float-list", lambda e: A(e.tq[:1], e.tk[:1], e.tv[:1], cu_seqlens_q=[0, 4.5], cu_seqlens_k=[0, 6]),
     TypeError, r"\bcu_seqlens_q has entries of dtype float64"),
    ("tattn-cu-huge-list", lambda e: A(e.tq[:1], e.tk[:1], e.tv[:1], cu_seqlens_q=[0, 2**40], cu_seqlens_k=[0, 6]),
     ValueError, r"\bcu_seqlens_q has entries"),
    ("tattn-cu-int64", lambda e: A(e.tq[:1], e.tk[:1], e.tv[:1], cu_seqlens_q=torch.tensor([0, 4]),
                                   cu_seqlens_k=torch.tensor([0, 6], dtype=torch.int32)), TypeError,
     r"\bcu_seqlens_q has dtype int64"),
    ("tattn-cu-unsorted", lambda e: A(e.tq[:1], e.tk[:1], e.tv[:1], cu_seqlens_q=[0, 3, 2], cu_seqlens_k=[0, 3, 6]),
     ValueError, r"\bcu_seqlens_q is not monotone"),
    ("tattn-cu-str", lambda e: A(e.tq[:1], e.tk[:1], e.tv[:1], cu_seqlens_q="04", cu_seqlens_k=[0, 6]), TypeError,
     r"\bcu_seqlens_q is a builtins.str"),
    ("tattn-cu-meta", lambda e: A(e.tq[:1], e.tk[:1], e.tv[:1], cu_seqlens_q=torch.tensor([0, 4], dtype=torch.int32,
                                                                                         device="meta"),
                                  cu_seqlens_k=[0, 6]), ValueError, r"\bcu_seqlens_q is on meta"),
    ("tattn-scale-nan", lambda e: A(e.tq, e.tk, e.tv, scale=float("nan")), ValueError, r"\bscale is nan"),
    ("tattn-window-huge", lambda e: A(e.tq, e.tk, e.tv, window=(-1, -2**31 - 1)), ValueError, r"\bwindow\[1\]"),
    ("tattn-return-lse-str", lambda e: A(e.tq, e.tk, e.tv, return_lse="yes"), TypeError, r"\breturn_lse is 'yes'"),
    ("tattn-backend-int", lambda e: A(e.tq, e.tk, e.tv, backend=3), TypeError, r"\bbackend is 3"),
    ("tattn-typo-kw", lambda e: A(e.tq, e.tk, e.tv, windows=(1, 1)), TypeError, r"'windows'"),
    # ---- reference / kernel_name / workspace_bytes ----
    ("ref-q-list", lambda e: flashlite.reference(e.q.tolist(), e.k, e.v), TypeError, r"\bq is a builtins.list"),
    ("ref-k-list", lambda e: flashlite.reference(e.q, e.k.tolist(), e.v), TypeError, r"\bk is a builtins.list"),
    ("ref-v-object", lambda e: flashlite.reference(e.q, e.k, _object(e.v)), TypeError, r"\bv has dtype object"),
    ("ref-typo-kw", lambda e: flashlite.reference(e.q, e.k, e.v, casual=True), TypeError, r"\bcasual\b"),
    ("ref-out-kw", lambda e: flashlite.reference(e.q, e.k, e.v, out=e.out), TypeError, r"\bout\b"),
    ("ref-scale-nan", lambda e: flashlite.reference(e.q, e.k, e.v, scale=float("nan")), ValueError, r"\bscale is nan"),
    ("ref-sink-logits-list", lambda e: flashlite.reference(e.q, e.k, e.v, sink_logits=[0.0] * HQ), TypeError,
     r"\bsink_logits is a builtins.list"),
    ("ref-torch-k-numpy", lambda e: flashlite.reference(e.tq, e.k, e.tv), TypeError, r"\bk is a numpy.ndarray"),
    ("ref-cu-unsorted", lambda e: flashlite.reference(e.q[:1], e.k[:1], e.v[:1], cu_seqlens_q=[0, 3, 2],
                                                      cu_seqlens_k=[0, 3, 6]), ValueError, r"\bcu_seqlens_q"),
    ("kname-k-str", lambda e: flashlite.kernel_name(e.q, "k", e.v), TypeError, r"\bk is a builtins.str"),
    ("kname-typo-kw", lambda e: flashlite.kernel_name(e.q, e.k, e.v, sink_token=1), TypeError, r"\bsink_token\b"),
    ("kname-return-lse", lambda e: flashlite.kernel_name(e.q, e.k, e.v, return_lse=True), TypeError, r"\breturn_lse\b"),
    ("wsb-v-none", lambda e: flashlite.workspace_bytes(e.q, e.k, None), TypeError, r"\bv is a builtins.NoneType"),
    ("wsb-torch-meta", lambda e: flashlite.workspace_bytes(e.tq, e.tk.to("meta"), e.tv), ValueError, r"\bk is on meta"),
    # ---- KVCache ----
    ("kv-k-list", lambda e: flashlite.KVCache(e.kc.tolist(), e.vc, seq_lens=[1, 1]), TypeError, r"\bk is a builtins"),
    ("kv-k-none", lambda e: flashlite.KVCache(None, e.vc, seq_lens=[1, 1]), TypeError, r"\bk is a builtins.NoneType"),
    ("kv-mixed-libs", lambda e: flashlite.KVCache(e.kc, e.tvc, seq_lens=[1, 1]), TypeError, r"\bk and v\b"),
    ("kv-k-rank3", lambda e: flashlite.KVCache(e.kc[0], e.vc[0], seq_lens=[1]), ValueError, r"\bk has rank 3"),
    ("kv-k-object", lambda e: flashlite.KVCache(_object(e.kc), e.vc, seq_lens=[1, 1]), TypeError,
     r"\bk has dtype object"),
    ("kv-k-int64", lambda e: flashlite.KVCache(e.kc.astype(np.int64), e.vc, seq_lens=[1, 1]), TypeError,
     r"\bk has dtype int64"),
    ("kv-tk-meta", lambda e: flashlite.KVCache(e.tkc.to("meta"), e.tvc.to("meta"), seq_lens=[1, 1]), ValueError,
     r"\bk is on meta"),
    ("kv-tk-v-devices", lambda e: flashlite.KVCache(e.tkc, e.tvc.to("meta"), seq_lens=[1, 1]), ValueError,
     r"\bv is on meta"),
    ("kv-seq-lens-str", lambda e: flashlite.KVCache(e.kc, e.vc, seq_lens="12"), TypeError, r"\bseq_lens is a"),
    ("kv-seq-lens-int", lambda e: flashlite.KVCache(e.kc, e.vc, seq_lens=3), TypeError, r"\bseq_lens is a"),
    ("kv-seq-lens-float", lambda e: flashlite.KVCache(e.kc, e.vc, seq_lens=[1.5, 2]), TypeError,
     r"\bseq_lens has entries of dtype float64"),
    ("kv-seq-lens-int64", lambda e: flashlite.KVCache(e.kc, e.vc, seq_lens=np.array([1, 2])), TypeError,
     r"\bseq_lens has dtype int64"),
    ("kv-seq-lens-2d", lambda e: flashlite.KVCache(e.kc, e.vc, seq_lens=[[1, 2]]), ValueError,
     r"\bseq_lens has rank 2"),
    ("kv-tseq-lens-str", lambda e: flashlite.KVCache(e.tkc, e.tvc, seq_lens="12"), TypeError, r"\bseq_lens is a"),
    ("kv-tseq-lens-int", lambda e: flashlite.KVCache(e.tkc, e.tvc, seq_lens=3), TypeError, r"\bseq_lens is a"),
    ("kv-tseq-lens-float", lambda e: flashlite.KVCache(e.tkc, e.tvc, seq_lens=[1.5, 2]), TypeError,
     r"\bseq_lens has entries of dtype float64"),
    ("kv-tseq-lens-huge", lambda e: flashlite.KVCache(e.tkc, e.tvc, seq_lens=[2**40, 2]), ValueError,
     r"\bseq_lens has entries"),
    ("kv-tseq-lens-float-tensor", lambda e: flashlite.KVCache(e.tkc, e.tvc, seq_lens=torch.tensor([1.0, 2.0])),
     TypeError, r"\bseq_lens has dtype torch.float32"),
    ("kv-tseq-lens-numpy", lambda e: flashlite.KVCache(e.tkc, e.tvc, seq_lens=np.array([1.5, 2.0])), TypeError,
     r"\bseq_lens has"),
    ("kv-tseq-lens-meta", lambda e: flashlite.KVCache(e.tkc, e.tvc, seq_lens=torch.zeros(2, dtype=torch.int32,
                                                                                         device="meta")),
     ValueError, r"\bseq_lens is on meta"),
    ("kv-k-bigendian", lambda e: flashlite.KVCache(e.kc.astype(">f4"), e.vc, seq_lens=[1, 1]), TypeError,
     r"\bk has dtype >f4"),
    ("kv-k-memoryview", lambda e: flashlite.KVCache(memoryview(e.kc), e.vc, seq_lens=[1, 1]), TypeError,
     r"\bk is a builtins.memoryview"),
    ("kv-k-bool", lambda e: flashlite.KVCache(e.tkc > 0, e.tvc > 0, seq_lens=[1, 1]), TypeError,
     r"\bk has dtype torch.bool"),
    ("kv-page-missing", lambda e: flashlite.KVCache(e.kp, e.vp, page_indptr=[0, 1, 2]), ValueError,
     r"\bpage_indptr, page_indices and last_page_len"),
    ("kv-both-layouts", lambda e: flashlite.KVCache(e.kp, e.vp, seq_lens=[1, 1], page_indptr=[0, 1, 2],
                                                    page_indices=[2, 0], last_page_len=[1, 1]), ValueError,
     r"seq_lens"),
    ("kv-nothing", lambda e: flashlite.KVCache(e.kc, e.vc), ValueError, r"\bseq_lens\b"),
    ("kv-typo-kw", lambda e: flashlite.KVCache(e.kc, e.vc, seqlens=[1, 1]), TypeError, r"'seqlens'"),
    ("kv-page-indices-float", lambda e: flashlite.KVCache(e.kp, e.vp, page_indptr=[0, 1, 2], page_indices=[2.0, 0],
                                                          last_page_len=[1, 1]), TypeError,
     r"\bpage_indices has entries"),
    ("kv-update-unknown", lambda e: e.cache.update(seq_len=[1, 1]), TypeError, r"'seq_len'"),
    ("kv-update-wrong-layout", lambda e: e.cache.update(page_indptr=[0, 1, 2]), ValueError, r"\bpage_indptr\b"),
    ("kv-update-str", lambda e: e.cache.update(seq_lens="77"), TypeError, r"\bseq_lens is a"),
    ("kv-update-float", lambda e: e.tcache.update(seq_lens=[7.5, 7]), TypeError, r"\bseq_lens has entries"),
    ("kv-update-none-obj", lambda e: e.cache.update(seq_lens=object()), TypeError, r"\bseq_lens is a"),
    ("kv-update-positional", lambda e: e.cache.update([7, 7]), TypeError, r"positional"),
    # ---- append_kv ----
    ("append-cache-none", lambda e: flashlite.append_kv(None, e.knew, e.vnew), TypeError, r"\bcache is a"),
    ("append-cache-tuple", lambda e: flashlite.append_kv((e.kc, e.vc), e.knew, e.vnew), TypeError, r"\bcache is a"),
    ("append-k-list", lambda e: flashlite.append_kv(_grown(e), e.knew.tolist(), e.vnew), TypeError,
     r"\bk is a builtins.list"),
    ("append-v-none", lambda e: flashlite.append_kv(_grown(e), e.knew, None), TypeError, r"\bv is None"),
    ("append-k-torch", lambda e: flashlite.append_kv(_grown(e), e.tknew, e.vnew), TypeError, r"\bk is a torch"),
    ("append-tk-numpy", lambda e: flashlite.append_kv(_grown(e, "torch"), e.knew, e.tvnew), TypeError,
     r"\bk is a numpy"),
    ("append-k-object", lambda e: flashlite.append_kv(_grown(e), _object(e.knew), e.vnew), TypeError,
     r"\bk has dtype object"),
    ("append-k-f64", lambda e: flashlite.append_kv(_grown(e), e.knew.astype(np.float64), e.vnew), TypeError,
     r"\bk has dtype float64"),
    ("append-k-strided", lambda e: flashlite.append_kv(_grown(e), _strided(e.knew), e.vnew), ValueError, r"\bk has"),
    ("append-k-rank3", lambda e: flashlite.append_kv(_grown(e), e.knew[0], e.vnew), ValueError, r"\bk has rank 3"),
    ("append-cache-readonly", lambda e: flashlite.append_kv(
        flashlite.KVCache(_ro(e.kc), e.vc, seq_lens=[SK + 1, SK + 1]), e.knew, e.vnew), ValueError,
     r"\bcache k is read-only"),
    ("append-q-out-readonly", lambda e: flashlite.append_kv(_grown(e), e.knew, e.vnew, q=e.qd, q_out=_ro(e.qout),
                                                            rope=e.rope), ValueError, r"\bq_out is read-only"),
    ("append-q-out-list", lambda e: flashlite.append_kv(_grown(e), e.knew, e.vnew, q=e.qd, q_out=e.qout.tolist(),
                                                        rope=e.rope), TypeError, r"\bq_out is a builtins.list"),
    ("append-q-list", lambda e: flashlite.append_kv(_grown(e), e.knew, e.vnew, q=e.qd.tolist(), rope=e.rope),
     TypeError, r"\bq is a builtins.list"),
    ("append-q-out-without-q", lambda e: flashlite.append_kv(_grown(e), e.knew, e.vnew, q_out=e.qout, rope=e.rope),
     ValueError, r"\bq_out\b"),
    ("append-q-without-rope", lambda e: flashlite.append_kv(_grown(e), e.knew, e.vnew, q=e.qd), ValueError,
     r"\bq is given without rope"),
    ("append-rope-str", lambda e: flashlite.append_kv(_grown(e), e.knew, e.vnew, rope="llama"), TypeError,
     r"\brope is 'llama'"),
    ("append-rope-dict", lambda e: flashlite.append_kv(_grown(e), e.knew, e.vnew, rope={"theta": 1e4}), TypeError,
     r"\brope is"),
    ("append-backend-none", lambda e: flashlite.append_kv(_grown(e), e.knew, e.vnew, backend=None), TypeError,
     r"\bbackend is None"),
    ("append-backend-unknown", lambda e: flashlite.append_kv(_grown(e), e.knew, e.vnew, backend="tpu"), ValueError,
     r"\bbackend 'tpu'"),
    ("append-overflow", lambda e: flashlite.append_kv(e.cache.update(seq_lens=[CAP + 1, 1]), e.knew, e.vnew),
     ValueError, r"seq_lens"),
    ("append-not-grown", lambda e: flashlite.append_kv(e.cache.update(seq_lens=[0, 0]), e.knew, e.vnew), ValueError,
     r"seq_lens"),
    ("append-neg-len", lambda e: flashlite.append_kv(e.cache.update(seq_lens=[-1, 7]), e.knew, e.vnew), ValueError,
     r"seq_lens"),
    ("append-typo-kw", lambda e: flashlite.append_kv(_grown(e), e.knew, e.vnew, roped=e.rope), TypeError, r"'roped'"),
    ("append-bad-page", lambda e: flashlite.append_kv(
        e.pcache.update(page_indptr=[0, 1, 2], page_indices=[2, 9], last_page_len=[SK + 1, SK + 1]), e.knew, e.vnew),
     ValueError, r"\bpage_indices\b"),
    # ---- Rope ----
    ("rope-theta-str", lambda e: flashlite.Rope(theta="1e4"), TypeError, r"\btheta is '1e4'"),
    ("rope-theta-nan", lambda e: flashlite.Rope(theta=float("nan")), ValueError, r"\btheta is nan"),
    ("rope-theta-neg", lambda e: flashlite.Rope(theta=-1.0), ValueError, r"\btheta is -1"),
    ("rope-layout", lambda e: flashlite.Rope(layout="neox"), ValueError, r"\blayout is 'neox'"),
    ("rope-layout-none", lambda e: flashlite.Rope(layout=None), TypeError, r"\blayout is None"),
    ("rope-llama3-str", lambda e: flashlite.Rope(llama3="yes"), TypeError, r"\bllama3 is 'yes'"),
    ("rope-factor-str", lambda e: flashlite.Rope(llama3=True, factor="8"), TypeError, r"\bfactor is '8'"),
    ("rope-factor-zero", lambda e: flashlite.Rope(llama3=True, factor=0.0), ValueError, r"\bfactor is 0"),
    ("rope-freq-order", lambda e: flashlite.Rope(llama3=True, low_freq_factor=4.0, high_freq_factor=1.0), ValueError,
     r"\blow_freq_factor\b"),
    ("rope-orig-neg", lambda e: flashlite.Rope(llama3=True, original_max_position=-5), ValueError,
     r"\boriginal_max_position is -5"),
    ("rope-inv-freq-str", lambda e: flashlite.Rope().inv_freq("64"), TypeError, r"\bhead_dim is '64'"),
    ("rope-inv-freq-odd", lambda e: flashlite.Rope().inv_freq(7), ValueError, r"\bhead_dim\b"),
    ("rope-inv-freq-neg", lambda e: flashlite.Rope().inv_freq(-4), ValueError, r"\bhead_dim is -4"),
    ("rope-hf-none", lambda e: flashlite.Rope.from_hf_config(None), TypeError, r"\bconfig is None"),
    ("rope-hf-str", lambda e: flashlite.Rope.from_hf_config("llama"), TypeError, r"\bconfig is 'llama'"),
    ("rope-hf-theta-str", lambda e: flashlite.Rope.from_hf_config(types.SimpleNamespace(rope_theta="abc")), TypeError,
     r"\brope_theta is 'abc'"),
    ("rope-hf-theta-neg", lambda e: flashlite.Rope.from_hf_config(types.SimpleNamespace(rope_theta=-3.0)), ValueError,
     r"\brope_theta is -3"),
    ("rope-hf-scaling-str", lambda e: flashlite.Rope.from_hf_config(types.SimpleNamespace(rope_scaling="llama3")),
     TypeError, r"\brope_scaling is 'llama3'"),
    ("rope-hf-type-yarn", lambda e: flashlite.Rope.from_hf_config(types.SimpleNamespace(
        rope_scaling={"rope_type": "yarn", "factor": 4.0})), ValueError, r"\brope_type 'yarn'"),
    ("rope-hf-llama3-missing", lambda e: flashlite.Rope.from_hf_config(types.SimpleNamespace(
        rope_theta=5e5, rope_scaling={"rope_type": "llama3", "factor": 8.0})), ValueError, r"\blow_freq_factor\b"),
    ("rope-hf-llama3-str", lambda e: flashlite.Rope.from_hf_config(types.SimpleNamespace(
        rope_theta=5e5, rope_scaling={"rope_type": "llama3", "factor": "8", "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})), TypeError,
     r"\['factor'\] is '8'"),
    # ---- decode / prefill / decode_kernel_name ----
    ("decode-cache-none", lambda e: flashlite.decode(e.qd, None), TypeError, r"\bcache is a"),
    ("decode-cache-array", lambda e: flashlite.decode(e.qd, e.kc), TypeError, r"\bcache is a"),
    ("decode-q-list", lambda e: flashlite.decode(e.qd.tolist(), e.cache), TypeError, r"\bq is a builtins.list"),
    ("decode-q-torch", lambda e: flashlite.decode(e.tqd, e.cache), TypeError, r"\bq is a torch"),
    ("decode-q-object", lambda e: flashlite.decode(_object(e.qd), e.cache), TypeError, r"\bq has dtype object"),
    ("decode-q-f64", lambda e: flashlite.decode(e.qd.astype(np.float64), e.cache), TypeError, r"\bq has dtype float64"),
    ("decode-q-rank3", lambda e: flashlite.decode(e.qd[0], e.cache), ValueError, r"\bq has rank 3"),
    ("decode-q-strided", lambda e: flashlite.decode(_strided(e.qd), e.cache), ValueError, r"\bq has head_dim stride"),
    ("decode-out-readonly", lambda e: flashlite.decode(e.qd, e.cache, out=_ro(e.dout)), ValueError,
     r"\bout is read-only"),
    ("decode-out-list", lambda e: flashlite.decode(e.qd, e.cache, out=e.dout.tolist()), TypeError,
     r"\bout is a builtins.list"),
    ("decode-out-torch", lambda e: flashlite.decode(e.qd, e.cache, out=e.tdout), TypeError, r"\bout is a torch"),
    ("decode-out-f64", lambda e: flashlite.decode(e.qd, e.cache, out=e.dout.astype(np.float64)), TypeError,
     r"\bout has dtype float64"),
    ("decode-out-shape", lambda e: flashlite.decode(e.qd, e.cache, out=e.out), ValueError, r"\bout has q_len 4"),
    ("decode-tout-numpy", lambda e: flashlite.decode(e.tqd, e.tcache, out=e.dout), TypeError, r"\bout is a numpy"),
    ("decode-tout-meta", lambda e: flashlite.decode(e.tqd, e.tcache, out=e.tdout.to("meta")), ValueError,
     r"\bout is on meta"),
    ("decode-tq-meta", lambda e: flashlite.decode(e.tqd.to("meta"), e.tcache), ValueError, r"\bq is on meta"),
    ("decode-readonly-cache-ok-but-bad-out", lambda e: flashlite.decode(
        e.qd, flashlite.KVCache(_ro(e.kc), _ro(e.vc), seq_lens=[SK, SK]), out=_ro(e.dout)), ValueError,
     r"\bout is read-only"),
    ("decode-q-rank3-lse", lambda e: flashlite.decode(e.qd[0], e.cache, return_lse=True), ValueError,
     r"\bq has rank 3"),
    ("decode-seq-lens-length", lambda e: flashlite.decode(e.qd, e.cache.update(seq_lens=[SK, SK, SK])), ValueError,
     r"\bseq_lens has shape"),
    ("decode-max-kv-len-short", lambda e: flashlite.decode(e.qd, e.cache, max_kv_len=2), ValueError,
     r"\bmax_kv_len 2\b"),
    ("decode-num-splits-bool", lambda e: flashlite.decode(e.qd, e.cache, num_splits=True), TypeError,
     r"\bnum_splits is True"),
    ("decode-scale-nan", lambda e: flashlite.decode(e.qd, e.cache, scale=float("nan")), ValueError, r"\bscale is nan"),
    ("decode-window-huge", lambda e: flashlite.decode(e.qd, e.cache, window=(2**31, -1)), ValueError, r"\bwindow\[0\]"),
    ("decode-sink-neg", lambda e: flashlite.decode(e.qd, e.cache, sink_tokens=-3), ValueError, r"\bsink_tokens is -3"),
    ("decode-softcap-str", lambda e: flashlite.decode(e.qd, e.cache, softcap="1"), TypeError, r"\bsoftcap is '1'"),
    ("decode-causal-str", lambda e: flashlite.decode(e.qd, e.cache, causal="yes"), TypeError, r"\bcausal is 'yes'"),
    ("decode-sink-logits-list", lambda e: flashlite.decode(e.qd, e.cache, sink_logits=[0.0] * HQ), TypeError,
     r"\bsink_logits is a builtins.list"),
    ("decode-sink-logits-f64", lambda e: flashlite.decode(e.qd, e.cache, sink_logits=np.zeros(HQ)), TypeError,
     r"\bsink_logits has dtype float64"),
    ("decode-max-kv-len-str", lambda e: flashlite.decode(e.qd, e.cache, max_kv_len="64"), TypeError,
     r"\bmax_kv_len is '64'"),
    ("decode-max-kv-len-float", lambda e: flashlite.decode(e.qd, e.cache, max_kv_len=64.5), TypeError,
     r"\bmax_kv_len is 64.5"),
    ("decode-max-kv-len-huge", lambda e: flashlite.decode(e.qd, e.cache, max_kv_len=2**70), ValueError,
     r"\bmax_kv_len is"),
    ("decode-max-kv-len-neg", lambda e: flashlite.decode(e.qd, e.cache, max_kv_len=-5), ValueError,
     r"\bmax_kv_len is -5"),
    ("decode-num-splits-str", lambda e: flashlite.decode(e.qd, e.cache, num_splits="4"), TypeError,
     r"\bnum_splits is '4'"),
    ("decode-num-splits-neg", lambda e: flashlite.decode(e.qd, e.cache, num_splits=-2), ValueError,
     r"\bnum_splits is -2"),
    ("decode-num-splits-huge", lambda e: flashlite.decode(e.qd, e.cache, num_splits=2**40), ValueError,
     r"\bnum_splits is"),
    ("decode-return-lse-str", lambda e: flashlite.decode(e.qd, e.cache, return_lse="no"), TypeError,
     r"\breturn_lse is 'no'"),
    ("decode-backend-none", lambda e: flashlite.decode(e.qd, e.cache, backend=None), TypeError, r"\bbackend is None"),
    ("decode-cu-kw", lambda e: flashlite.decode(e.qd, e.cache, cu_seqlens_q=[0, 1, 2]), TypeError, r"'cu_seqlens_q'"),
    ("decode-heads", lambda e: flashlite.decode(e.qd[:, :, :3], e.cache), ValueError, r"\bq_heads 3|\bq\b"),
    ("decode-batch", lambda e: flashlite.decode(e.qd[:1], e.cache), ValueError, r"\bq\b|seq_lens"),
    ("decode-neg-len", lambda e: flashlite.decode(e.qd, e.cache.update(seq_lens=[-1, 3])), ValueError, r"seq_lens"),
    ("decode-len-past-cap", lambda e: flashlite.decode(e.qd, e.cache.update(seq_lens=[CAP + 1, 3])), ValueError,
     r"seq_lens"),
    ("decode-paged-bad-indptr", lambda e: flashlite.decode(e.qd, e.pcache.update(
        page_indptr=[0, 2, 1], page_indices=[2, 0], last_page_len=[SK, SK])), ValueError, r"\bpage_indptr\b"),
    ("decode-paged-bad-last", lambda e: flashlite.decode(e.qd, e.pcache.update(
        page_indptr=[0, 1, 2], page_indices=[2, 0], last_page_len=[PAGE + 1, SK])), ValueError, r"\blast_page_len\b"),
    ("decode-paged-neg-page", lambda e: flashlite.decode(e.qd, e.pcache.update(
        page_indptr=[0, 1, 2], page_indices=[-1, 0], last_page_len=[SK, SK])), ValueError, r"\bpage_indices\b"),
    ("decode-tsink-logits-meta", lambda e: flashlite.decode(e.tqd, e.tcache,
                                                            sink_logits=torch.zeros(HQ, device="meta")),
     ValueError, r"\bsink_logits is on meta"),
    ("decode-tsink-logits-list", lambda e: flashlite.decode(e.tqd, e.tcache, sink_logits=[0.0] * HQ), TypeError,
     r"\bsink_logits is a"),
    ("prefill-cache-none", lambda e: flashlite.prefill(e.q, None), TypeError, r"\bcache is a"),
    ("prefill-out-readonly", lambda e: flashlite.prefill(e.q, e.cache, out=_ro(e.out)), ValueError,
     r"\bout is read-only"),
    ("prefill-out-object", lambda e: flashlite.prefill(e.q, e.cache, out=_object(e.out)), TypeError,
     r"\bout has dtype object"),
    ("prefill-q-int64", lambda e: flashlite.prefill(e.q.astype(np.int64), e.cache), TypeError, r"\bq has dtype int64"),
    ("prefill-q-rank5", lambda e: flashlite.prefill(e.q[None], e.cache), ValueError, r"\bq has rank 5"),
    ("prefill-tq-meta", lambda e: flashlite.prefill(e.tq.to("meta"), e.tcache), ValueError, r"\bq is on meta"),
    ("prefill-cu-str", lambda e: flashlite.prefill(e.q[:1], e.cache, cu_seqlens_q="0,2,4"), TypeError,
     r"\bcu_seqlens_q is a builtins.str"),
    ("prefill-cu-unsorted", lambda e: flashlite.prefill(e.q[:1], e.cache, cu_seqlens_q=[0, 3, 2]), ValueError,
     r"\bcu_seqlens_q\b"),
    ("prefill-cu-negative", lambda e: flashlite.prefill(e.q[:1], e.cache, cu_seqlens_q=[-2, 2, 4]), ValueError,
     r"\bcu_seqlens_q\b"),
    ("prefill-cu-length", lambda e: flashlite.prefill(e.q[:1], e.cache, cu_seqlens_q=[0, 4]), ValueError,
     r"\bcu_seqlens_q\b"),
    ("prefill-cu-int64", lambda e: flashlite.prefill(e.q[:1], e.cache, cu_seqlens_q=np.array([0, 2, 4])), TypeError,
     r"\bcu_seqlens_q has dtype int64"),
    ("prefill-cu-float", lambda e: flashlite.prefill(e.q[:1], e.cache, cu_seqlens_q=[0, 2.5, 4]), TypeError,
     r"\bcu_seqlens_q has entries of dtype float64"),
    ("prefill-tcu-float", lambda e: flashlite.prefill(e.tq[:1], e.tcache, cu_seqlens_q=[0, 2.5, 4]), TypeError,
     r"\bcu_seqlens_q has entries of dtype float64"),
    ("prefill-tcu-huge", lambda e: flashlite.prefill(e.tq[:1], e.tcache, cu_seqlens_q=[0, 2, 2**33]), ValueError,
     r"\bcu_seqlens_q has entries"),
    ("prefill-tcu-numpy-f64", lambda e: flashlite.prefill(e.tq[:1], e.tcache, cu_seqlens_q=np.array([0., 2., 4.])),
     TypeError, r"\bcu_seqlens_q has dtype"),
    ("prefill-tcu-str", lambda e: flashlite.prefill(e.tq[:1], e.tcache, cu_seqlens_q="x"), TypeError,
     r"\bcu_seqlens_q is a"),
    ("prefill-chunk-too-long", lambda e: flashlite.prefill(e.q[:, :SK + 1].repeat(2, 1), e.cache), ValueError,
     r"\bq\b|seq_lens|chunk"),
    ("prefill-return-lse-str", lambda e: flashlite.prefill(e.q, e.cache, return_lse="no"), TypeError,
     r"\breturn_lse is 'no'"),
    ("prefill-typo-kw", lambda e: flashlite.prefill(e.q, e.cache, cu_seqlens=[0, 1]), TypeError, r"'cu_seqlens'"),
    ("dkname-cache-none", lambda e: flashlite.decode_kernel_name(e.qd, None), TypeError, r"\bcache is a"),
    ("dkname-q-list", lambda e: flashlite.decode_kernel_name(e.qd.tolist(), e.cache), TypeError,
     r"\bq is a builtins.list"),
    ("dkname-q-object", lambda e: flashlite.decode_kernel_name(_object(e.qd), e.cache), TypeError,
     r"\bq has dtype object"),
    ("dkname-sink-logits-list", lambda e: flashlite.decode_kernel_name(e.qd, e.cache, sink_logits=[0.0] * HQ),
     TypeError, r"\bsink_logits is a builtins.list"),
    # ---- flashlite.torch.scaled_dot_product_attention ----
    ("sdpa-query-numpy", lambda e: fl_torch.scaled_dot_product_attention(e.q, e.tk, e.tv), TypeError,
     r"\bquery is a numpy.ndarray"),
    ("sdpa-key-list", lambda e: fl_torch.scaled_dot_product_attention(e.tq, [1.0], e.tv), TypeError,
     r"\bkey is a builtins.list"),
    ("sdpa-value-none", lambda e: fl_torch.scaled_dot_product_attention(e.tq, e.tk, None), TypeError,
     r"\bvalue is a builtins.NoneType"),
    ("sdpa-rank3", lambda e: fl_torch.scaled_dot_product_attention(e.tq[0], e.tk[0], e.tv[0]), ValueError,
     r"\bquery has shape"),
    ("sdpa-mask", lambda e: fl_torch.scaled_dot_product_attention(e.tq, e.tq, e.tq, attn_mask=torch.ones(SQ, SQ)),
     ValueError, r"\battn_mask\b"),
    ("sdpa-dropout", lambda e: fl_torch.scaled_dot_product_attention(e.tq, e.tq, e.tq, dropout_p=0.1), ValueError,
     r"\bdropout_p is 0.1"),
    ("sdpa-dropout-str", lambda e: fl_torch.scaled_dot_product_attention(e.tq, e.tq, e.tq, dropout_p="0"), TypeError,
     r"\bdropout_p is '0'"),
    ("sdpa-dropout-nan", lambda e: fl_torch.scaled_dot_product_attention(e.tq, e.tq, e.tq, dropout_p=float("nan")),
     ValueError, r"\bdropout_p is nan"),
    ("sdpa-is-causal-str", lambda e: fl_torch.scaled_dot_product_attention(e.tq, e.tq, e.tq, is_causal="no"),
     TypeError, r"\bis_causal is 'no'"),
    ("sdpa-is-causal-none", lambda e: fl_torch.scaled_dot_product_attention(e.tq, e.tq, e.tq, is_causal=None),
     TypeError, r"\bis_causal is None"),
    ("sdpa-enable-gqa-str", lambda e: fl_torch.scaled_dot_product_attention(e.tq, e.tq, e.tq, enable_gqa="no"),
     TypeError, r"\benable_gqa is 'no'"),
    ("sdpa-gqa", lambda e: fl_torch.scaled_dot_product_attention(e.tq.transpose(1, 2), e.tk.transpose(1, 2),
                                                                  e.tv.transpose(1, 2)), ValueError, r"\benable_gqa\b"),
    ("sdpa-scale-str", lambda e: fl_torch.scaled_dot_product_attention(e.tq, e.tq, e.tq, scale="1"), TypeError,
     r"\bscale is '1'"),
    ("sdpa-scale-nan", lambda e: fl_torch.scaled_dot_product_attention(e.tq, e.tq, e.tq, scale=float("nan")),
     ValueError, r"\bscale is nan"),
    ("sdpa-top-left", lambda e: fl_torch.scaled_dot_product_attention(e.tq[:, :, :2], e.tq, e.tq, is_causal=True),
     ValueError, r"\bis_causal\b"),
    ("sdpa-key-meta", lambda e: fl_torch.scaled_dot_product_attention(e.tq, e.tq.to("meta"), e.tq), ValueError,
     r"\bk(ey)? is on meta"),
    ("sdpa-query-int", lambda e: fl_torch.scaled_dot_product_attention(e.tq.long(), e.tq.long(), e.tq.long()),
     TypeError, r"\bq(uery)? has dtype int64"),
    ("sdpa-key-sparse", lambda e: fl_torch.scaled_dot_product_attention(e.tq, e.tq.to_sparse(), e.tq), TypeError,
     r"\bkey is a torch.sparse_coo tensor"),
    # the custom op itself: torch's dispatcher checks the schema (a RuntimeError naming the argument)
    ("op-k-list", lambda e: fl_torch.attention_op(e.tq, [1.0], e.tv, None, None, None, False, None, -1, -1, 0, 0.0,
                                                  "auto"), RuntimeError, r"\bargument 'k'"),
    ("op-backend-none", lambda e: fl_torch.attention_op(e.tq, e.tk, e.tv, None, None, None, False, None, -1, -1, 0,
                                                        0.0, None), RuntimeError, r"\bargument 'backend'"),
    ("op-scale-nan", lambda e: fl_torch.attention_op(e.tq, e.tk, e.tv, None, None, None, False, float("nan"), -1,
                                                     -1, 0, 0.0, "auto"), ValueError, r"\bscale is nan"),
    ("op-out-numpy", lambda e: fl_torch.attention_out_op(e.tq, e.tk, e.tv, e.out, None, None, None, False, None, -1,
                                                         -1, 0, 0.0, "auto"), RuntimeError, r"\bargument 'out'"),
    ("sdpa-typo-kw", lambda e: fl_torch.scaled_dot_product_attention(e.tq, e.tq, e.tq, causal=True), TypeError,
     r"'causal'"),
    ("sdpa-backend-none", lambda e: fl_torch.scaled_dot_product_attention(e.tq, e.tq, e.tq, backend=None), TypeError,
     r"\bbackend is None"),
]


def _hf_cases():
    try:
        import flashlite.hf as hf  # imports transformers only inside register()
        import transformers  # noqa: F401
    except ImportError:
        return []
    return [
        ("hf-register-name-none", lambda e: hf.register(None), TypeError, r"\bname is None"),
        ("hf-register-name-int", lambda e: hf.register(3), TypeError, r"\bname is 3"),
        ("hf-register-name-empty", lambda e: hf.register(""), ValueError, r"\bname is ''"),
        ("hf-register-name-flash", lambda e: hf.register("flash_x"), ValueError, r"\bname 'flash_x'"),
            ("hf-register-name-blank", lambda e: hf.register("  "), ValueError, r"\bname is '  '"),
    ("hf-register-strict-str", lambda e: hf.register(strict="no"), TypeError, r"\bstrict is 'no'"),
        ("hf-register-typo-kw", lambda e: hf.register(strcit=True), TypeError, r"'strcit'"),
        ("hf-forward-sliding-str", lambda e: hf.attention_forward(None, *_bhsd(e), None, sliding_window="4"),
         TypeError, r"\bsliding_window is '4'"),
        ("hf-forward-sliding-neg", lambda e: hf.attention_forward(None, *_bhsd(e), None, sliding_window=-3),
         ValueError, r"\bsliding_window is -3"),
        ("hf-forward-softcap-str", lambda e: hf.attention_forward(None, *_bhsd(e), None, softcap="x"),
         TypeError, r"\bsoftcap is 'x'"),
        ("hf-forward-softcap-neg", lambda e: hf.attention_forward(None, *_bhsd(e), None, softcap=-1.0),
         ValueError, r"\bsoftcap is -1"),
        ("hf-forward-dropout", lambda e: hf.attention_forward(None, *_bhsd(e), None, dropout=0.1), ValueError,
         r"\bdropout is 0.1"),
        ("hf-forward-dropout-str", lambda e: hf.attention_forward(None, *_bhsd(e), None, dropout="0.1"), TypeError,
         r"\bdropout is '0.1'"),
        ("hf-forward-query-numpy", lambda e: hf.attention_forward(None, e.q, *_bhsd(e)[1:], None), TypeError,
         r"\bquery is a numpy.ndarray"),
        ("hf-forward-key-rank3", lambda e: hf.attention_forward(None, _bhsd(e)[0], e.tk[0], e.tv, None), ValueError,
         r"\bkey has shape"),
        ("hf-forward-sinks-list", lambda e: hf.attention_forward(None, *_bhsd(e), None, s_aux=[0.0] * HQ),
         TypeError, r"\bs_aux is a builtins.list"),
        ("hf-forward-sinks-shape", lambda e: hf.attention_forward(None, *_bhsd(e), None, s_aux=torch.zeros(HQ + 1)),
         ValueError, r"\bsink_logits has shape"),
        ("hf-forward-mask-strict", lambda e: _strict_mask(hf, e), ValueError, r"\battention_mask\b"),
    ]


def _bhsd(e):
    """query, key, value in transformers' [batch, heads, seq, head_dim] layout (views of the torch inputs)."""
    return e.tq.transpose(1, 2), e.tk.transpose(1, 2), e.tv.transpose(1, 2)


def _strict_mask(hf, e):
    """register(strict=True), then a mask flashlite cannot express (an additive bias): ValueError, no fallback."""
    hf.register(strict=True)
    try:
        mask = torch.randn(B, 1, SQ, SK)
        return hf.attention_forward(types.SimpleNamespace(is_causal=True), *_bhsd(e), mask)
    finally:
        hf.register(strict=False)


CASES += _hf_cases()


def _arrays(e):
    """Every array / tensor the case could write: the env's own and the caches' host index copies."""
    found = {n: x for n, x in vars(e).items() if isinstance(x, (np.ndarray, torch.Tensor))}
    for cname in ("cache", "tcache", "pcache"):
        for n, x in getattr(e, cname).host.items():
            if x is not None:
                found[f"{cname}.host.{n}"] = x
    return found


def _snapshot(e):
    """name -> (the array itself, a copy of it): the same objects are compared after the call (update() replaces the
    caches' index arrays, it never writes into the old ones)."""
    return {n: (x, x.detach().clone() if isinstance(x, torch.Tensor) else x.copy()) for n, x in _arrays(e).items()}


def _same(a, b):
    if isinstance(a, torch.Tensor):
        return a.shape == b.shape and bool(torch.equal(torch.nan_to_num(a, 7.0), torch.nan_to_num(b, 7.0)))
    return np.array_equal(a, b, equal_nan=True)


def test_case_ids_are_unique():
    ids = [c[0] for c in CASES]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_argument_is_named(case):
    _, call, exc, pattern = case
    e = env()
    before = _snapshot(e)
    try:
        call(e)
    except Exception as err:  # noqa: BLE001  (the type is asserted below)
        raised = err
    else:
        pytest.fail("no exception")
    msg = str(raised)
    assert type(raised) is exc or (exc is RuntimeError and isinstance(raised, RuntimeError)), \
        f"{type(raised).__name__}: {msg}"
    assert "incompatible function arguments" not in msg, msg
    assert re.search(pattern, msg), f"{type(raised).__name__}: {msg!r} does not match {pattern!r}"
    changed = [n for n, (x, copy) in before.items() if not _same(x, copy)]
    assert not changed, f"written on error: {changed}"


def test_nanobind_dump_never_reaches_the_user():
    """The last resort of _check.explain: a native call refused for a reason no check above knows still comes back as
    a TypeError that lists the arguments, never nanobind's signature dump."""
    from flashlite import _check
    e = env()
    dump = TypeError("forward(): incompatible function arguments. The following argument types are supported: ...")
    with pytest.raises(TypeError) as info:
        _check.explain(dump, "flashlite.attention", "numpy", [("q", e.q, False, _check.FLOATS),
                                                              ("out", e.out, True, _check.FLOATS)])
    msg = str(info.value)
    assert "incompatible function arguments" not in msg
    assert "flashlite.attention" in msg and "q: numpy.ndarray" in msg and "out: numpy.ndarray" in msg
    assert _check.explain(ValueError("q has rank 3"), "flashlite.attention", "numpy",
                          [("q", e.q, False, _check.FLOATS)]) is None  # the native layer's own errors pass through


def test_accepted_variants_still_work():
    """The checks refuse only what cannot work: numpy bools and 0 / 1 for flags, numpy index arrays for a torch cache
    (and torch ones for a numpy cache), numpy sink_logits with torch inputs, a dict config, numpy scalars for Rope."""
    e = env()
    want = A(e.q, e.k, e.v, causal=True)
    out, lse = A(e.q, e.k, e.v, causal=True, return_lse=np.bool_(True))
    assert np.array_equal(out, want) and lse.shape == (B, HQ, SQ)
    assert isinstance(A(e.q, e.k, e.v, return_lse=0), np.ndarray)
    assert torch.equal(A(e.tq, e.tk, e.tv, causal=True, sink_logits=np.zeros(HQ, np.float32)),
                       A(e.tq, e.tk, e.tv, causal=True, sink_logits=torch.zeros(HQ)))
    tcache = flashlite.KVCache(e.tkc, e.tvc, seq_lens=np.array([SK, SK], np.int32))
    ncache = flashlite.KVCache(e.kc, e.vc, seq_lens=torch.tensor([SK, SK], dtype=torch.int32))
    got_t, got_n = flashlite.decode(e.tqd, tcache), flashlite.decode(e.qd, ncache)
    assert np.allclose(got_t.numpy(), got_n, atol=1e-6)
    assert np.allclose(flashlite.decode(e.qd, ncache, max_kv_len=np.int64(CAP), num_splits=np.int32(1),
                                        return_lse=1)[0], got_n, atol=1e-6)
    assert flashlite.prefill(e.q[:1], ncache, cu_seqlens_q=(0, 2, 4)).shape == (1, SQ, HQ, D)
    assert flashlite.prefill(e.tq[:1], tcache, cu_seqlens_q=np.array([0, 2, 4], np.int32)).shape == (1, SQ, HQ, D)
    rope = flashlite.Rope.from_hf_config({"rope_theta": 5e5, "rope_scaling": {
        "rope_type": "llama3", "factor": 8, "low_freq_factor": 1, "high_freq_factor": 4,
        "original_max_position_embeddings": 8192}})
    assert rope == flashlite.Rope(theta=np.float64(5e5), llama3=np.bool_(True), factor=8, low_freq_factor=1,
                                  high_freq_factor=4, original_max_position=8192)
    assert type(rope.theta) is float and len(rope.inv_freq(np.int64(D))) == D // 2
    assert fl_torch.scaled_dot_product_attention(e.tq, e.tq, e.tq, is_causal=np.bool_(True), dropout_p=0).shape == \
        e.tq.shape
