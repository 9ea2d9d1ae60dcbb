"""flashlite.KVCache / append_kv / decode from Python: multi-step generation (a prefill chunk, then decode steps of
q_len 1..3) into contiguous and paged caches, with RoPE (half-split, interleaved, Llama-3 scaling) and masks, against
an independent float64 numpy model (rotation, the concatenated cache, attention); error cases leave the cache
untouched. numpy and torch on the CPU here; torch CUDA (bf16, graph replay) on a GPU machine."""
import math

import numpy as np
import pytest

import flashlite
from pyattn_util import HALF_REL, assert_close, visible_mask

try:
    import torch
except ImportError:
    torch = None

LIBS = ["numpy"] + (["torch-cpu"] if torch is not None else []) + \
    (["torch-cuda"] if torch is not None and torch.cuda.is_available() and flashlite.with_cuda else [])


def inv_freq_ref(rope, d):
    """HF's rope_init (default and 'llama3'), written here independently of flashlite."""
    base = rope.theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    if not rope.llama3:
        return base
    low_wl = rope.original_max_position / rope.low_freq_factor
    high_wl = rope.original_max_position / rope.high_freq_factor
    wl = 2 * math.pi / base
    out = np.where(wl > low_wl, base / rope.factor, base)
    smooth = (rope.original_max_position / wl - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
    mid = (1 - smooth) * base / rope.factor + smooth * base
    return np.where((wl >= high_wl) & (wl <= low_wl), mid, out)


def rotate_ref(x, positions, rope, d):
    """x [n, h, d] float64 at the given positions."""
    ang = np.asarray(positions, dtype=np.float64)[:, None] * inv_freq_ref(rope, d)[None, :]  # [n, d/2]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    y = x.copy()
    if rope.layout == "half_split":
        a, b = x[..., : d // 2], x[..., d // 2:]
        y[..., : d // 2], y[..., d // 2:] = a * c - b * s, b * c + a * s
    else:
        a, b = x[..., 0::2], x[..., 1::2]
        y[..., 0::2], y[..., 1::2] = a * c - b * s, b * c + a * s
    return y


def attention_ref(q, k, v, causal, window, sink_tokens, scale=None):
    """q [sq, hq, d], k/v [sk, hkv, d] float64 -> [sq, hq, d]."""
    sq, hq, d = q.shape
    sk, hkv, _ = k.shape
    scale = 1 / math.sqrt(d) if scale is None else scale
    vis = visible_mask(sq, sk, causal, window, sink_tokens)
    out = np.zeros_like(q)
    for h in range(hq):
        g = h // (hq // hkv)
        s = (q[:, h] @ k[:, g].T) * scale
        s = np.where(vis, s, -np.inf)
        m = s.max(-1, keepdims=True)
        p = np.where(vis, np.exp(s - np.where(np.isfinite(m), m, 0)), 0)
        den = p.sum(-1, keepdims=True)
        out[:, h] = np.where(den > 0, (p @ v[:, g]) / np.where(den > 0, den, 1), 0)
    return out


class Lib:
    def __init__(self, name, dtype):
        self.name, self.dtype = name, dtype
        if name == "numpy":
            self.np_dtype = {"float32": np.float32}[dtype]
        else:
            self.t_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
            self.dev = "cuda" if name == "torch-cuda" else "cpu"

    def arr(self, x):
        if self.name == "numpy":
            return np.ascontiguousarray(x, dtype=self.np_dtype)
        return torch.tensor(np.asarray(x, dtype=np.float32)).to(self.t_dtype).to(self.dev)

    def poisoned(self, shape):
        if self.name == "numpy":
            return np.full(shape, np.nan, dtype=self.np_dtype)
        return torch.full(shape, float("nan"), dtype=self.t_dtype, device=self.dev)

    def host(self, x):
        if self.name == "numpy":
            return np.asarray(x, dtype=np.float64)
        return x.detach().float().cpu().numpy().astype(np.float64)


def dtypes_for(lib):
    return ["bfloat16", "float16"] if lib == "torch-cuda" else ["float32"]


CASES = [
    # layout, page_size, rope, (causal, window, sinks)
    ("contiguous", 0, flashlite.Rope(theta=10000.0), (True, (-1, -1), 0)),
    ("paged", 16, flashlite.Rope(theta=500000.0, llama3=True, factor=8.0, original_max_position=64.0),
     (True, (-1, -1), 0)),
    ("paged", 16, flashlite.Rope(theta=10000.0, layout="interleaved"), (True, (4, -1), 2)),
    ("contiguous", 0, flashlite.Rope(theta=10000.0, layout="interleaved"), (False, (3, 2), 1)),
]


@pytest.mark.parametrize("libname", LIBS)
@pytest.mark.parametrize("case", range(len(CASES)))
def test_generation_steps_match_float64(libname, case):
    layout, page, rope, (causal, window, sinks) = CASES[case]
    for dtype in dtypes_for(libname):
        run_generation(Lib(libname, dtype), layout, page, rope, causal, window, sinks, seed=case)


def run_generation(lib, layout, page, rope, causal, window, sinks, seed):
    rng = np.random.default_rng(seed)
    batch, hq, hkv, d, max_len = 3, 8, 2, 64, 80
    # new tokens per sequence per step (prompt chunks of up to 8, then decode steps): lengths cross 16-token pages
    steps = [[8, 1, 7], [8, 8, 8], [1, 1, 1], [3, 2, 1], [1, 3, 8], [1, 1, 1]]
    # Decode takes one q_len per call: steps with ragged counts are appended per sequence and decoded per sequence.
    total = [sum(s[b] for s in steps) for b in range(batch)]
    if layout == "contiguous":
        k_store, v_store = lib.arr(np.zeros((batch, max_len, hkv, d))), lib.arr(np.zeros((batch, max_len, hkv, d)))
    else:
        pages_per = [(t + page - 1) // page for t in total]
        num_pages = sum(pages_per) + 3
        perm = rng.permutation(num_pages)  # unordered, non-contiguous pages
        owned, at = [], 0
        for n in pages_per:
            owned.append([int(x) for x in perm[at:at + n]])
            at += n
        k_store = lib.arr(rng.standard_normal((num_pages, page, hkv, d)))  # garbage in unused slots
        v_store = lib.arr(rng.standard_normal((num_pages, page, hkv, d)))
    lens = [0] * batch
    ks, vs = [np.zeros((0, hkv, d)) for _ in range(batch)], [np.zeros((0, hkv, d)) for _ in range(batch)]

    def cache_for(seqs, lengths):
        if layout == "contiguous":
            sel = (lambda x: x[seqs[0]:seqs[-1] + 1])
            return flashlite.KVCache(sel(k_store), sel(v_store), seq_lens=lengths)
        indptr, indices, last = [0], [], []
        for b, n in zip(seqs, lengths):
            used = (n + page - 1) // page
            indices += owned[b][:used]
            indptr.append(len(indices))
            last.append(n - (used - 1) * page if used else 0)
        return flashlite.KVCache(k_store, v_store, page_indptr=indptr, page_indices=indices + [0], last_page_len=last)

    for step in steps:
        for b in range(batch):  # one sequence per call: each has its own q_len this step
            n = step[b]
            k_new = rng.standard_normal((1, n, hkv, d))
            v_new = rng.standard_normal((1, n, hkv, d))
            q_new = rng.standard_normal((1, n, hq, d))
            lens[b] += n
            cache = cache_for([b], [lens[b]])
            q_rot = flashlite.append_kv(cache, lib.arr(k_new), lib.arr(v_new), q=lib.arr(q_new), rope=rope)
            pos = np.arange(lens[b] - n, lens[b])
            # the stored (rounded) inputs are what the kernel sees: round through the dtype first
            k_in, v_in, q_in = (lib.host(lib.arr(x))[0] for x in (k_new, v_new, q_new))
            ks[b] = np.concatenate([ks[b], rotate_ref(k_in, pos, rope, d)])
            vs[b] = np.concatenate([vs[b], v_in])
            q_ref = rotate_ref(q_in, pos, rope, d)
            assert_close(lib.host(q_rot)[0], q_ref, lib.dtype, what=f"rotated q (seq {b})")
            out = lib.poisoned((1, n, hq, d))
            flashlite.decode(q_rot, cache, causal=causal, window=window, sink_tokens=sinks, out=out)
            ref = attention_ref(q_ref, ks[b], vs[b], causal, window, sinks)
            assert_close(lib.host(out)[0], ref, lib.dtype, what=f"decode (seq {b}, length {lens[b]})")
            if supports_prefill(lib, q_rot, cache):
                out = lib.poisoned((1, n, hq, d))
                flashlite.prefill(q_rot, cache, causal=causal, window=window, sink_tokens=sinks, out=out)
                assert_close(lib.host(out)[0], ref, lib.dtype, what=f"prefill (seq {b}, length {lens[b]})")
        # the whole batch at once when every sequence took one token this step
        if all(n == 1 for n in step):
            q_all = np.stack([lib.host(lib.arr(rng.standard_normal((1, hq, d)))) for _ in range(batch)])
            cache = cache_for(list(range(batch)), lens)
            out = flashlite.decode(lib.arr(q_all), cache, causal=causal, window=window, sink_tokens=sinks)
            for b in range(batch):
                ref = attention_ref(q_all[b], ks[b], vs[b], causal, window, sinks)
                assert_close(lib.host(out)[b], ref, lib.dtype, what=f"batched decode (seq {b})")


def supports_prefill(lib, q, cache):
    """prefill() on CUDA takes fp16/bf16 at head_dim 64/128; the CPU takes everything."""
    return lib.name != "torch-cuda" or q.shape[-1] in (64, 128)


@pytest.mark.parametrize("libname", LIBS)
@pytest.mark.parametrize("layout", ["contiguous", "paged"])
def test_prefill_ragged_chunks_match_float64(libname, layout):
    """Chunks longer than decode's 8 (and single tokens) in one ragged prefill call over caches that already hold
    earlier tokens, crossing 16-token pages."""
    rng = np.random.default_rng(11)
    for dtype in dtypes_for(libname):
        lib = Lib(libname, dtype)
        hq, hkv, d, page = 4, 2, 64, 16
        before, chunk = [0, 21, 5], [37, 1, 12]  # cached tokens, new tokens per sequence
        lens = [a + c for a, c in zip(before, chunk)]
        ks = [rng.standard_normal((n, hkv, d)) for n in lens]
        vs = [rng.standard_normal((n, hkv, d)) for n in lens]
        if layout == "contiguous":
            kc, vc = np.zeros((3, 64, hkv, d)), np.zeros((3, 64, hkv, d))
            for b, n in enumerate(lens):
                kc[b, :n], vc[b, :n] = ks[b], vs[b]
            cache = flashlite.KVCache(lib.arr(kc), lib.arr(vc), seq_lens=lens)
        else:
            need = [(n + page - 1) // page for n in lens]
            perm = [int(x) for x in rng.permutation(sum(need) + 2)]
            kc = rng.standard_normal((len(perm), page, hkv, d))
            vc = rng.standard_normal((len(perm), page, hkv, d))
            indptr, indices = [0], []
            for b, n in enumerate(lens):
                mine = perm[indptr[-1]:indptr[-1] + need[b]]
                for t in range(n):
                    kc[mine[t // page], t % page], vc[mine[t // page], t % page] = ks[b][t], vs[b][t]
                indices += mine
                indptr.append(len(indices))
            last = [n - (m - 1) * page for n, m in zip(lens, need)]
            cache = flashlite.KVCache(lib.arr(kc), lib.arr(vc), page_indptr=indptr, page_indices=indices,
                                      last_page_len=last)
        q = rng.standard_normal((1, sum(chunk), hq, d))
        cu = np.concatenate([[0], np.cumsum(chunk)]).astype(np.int32)
        for causal, window, sinks in ((True, (-1, -1), 0), (True, (6, -1), 3)):
            out = lib.poisoned(q.shape)
            flashlite.prefill(lib.arr(q), cache, causal=causal, window=window, sink_tokens=sinks,
                              cu_seqlens_q=[int(x) for x in cu], out=out)
            got = lib.host(out)[0]
            q_in = lib.host(lib.arr(q))[0]
            for b in range(3):
                k_in, v_in = lib.host(lib.arr(ks[b])), lib.host(lib.arr(vs[b]))
                ref = attention_ref(q_in[cu[b]:cu[b + 1]], k_in, v_in, causal, window, sinks)
                assert_close(got[cu[b]:cu[b + 1]], ref, lib.dtype, what=f"{layout} prefill seq {b} {window} {sinks}")


@pytest.mark.parametrize("libname", LIBS)
def test_errors_write_nothing(libname):
    lib = Lib(libname, dtypes_for(libname)[0])
    rng = np.random.default_rng(7)
    kc = lib.arr(rng.standard_normal((2, 16, 2, 64)))
    vc = lib.arr(rng.standard_normal((2, 16, 2, 64)))
    before = lib.host(kc).copy()
    k = lib.arr(rng.standard_normal((2, 4, 2, 64)))
    # lengths that do not include the new tokens
    with pytest.raises(ValueError, match="include the new tokens"):
        flashlite.append_kv(flashlite.KVCache(kc, vc, seq_lens=[4, 3]), k, k)
    # past max_len
    with pytest.raises(ValueError):
        flashlite.append_kv(flashlite.KVCache(kc, vc, seq_lens=[4, 17]), k, k)
    # bad page id (paged view of the same storage as 2 pages of 16)
    with pytest.raises(ValueError):
        flashlite.append_kv(flashlite.KVCache(kc, vc, page_indptr=[0, 1, 2], page_indices=[0, 5],
                                              last_page_len=[4, 4]), k, k)
    # shape mismatch: new k with another head_dim
    with pytest.raises(ValueError):
        flashlite.append_kv(flashlite.KVCache(kc, vc, seq_lens=[4, 4]), k[..., :32], k[..., :32])
    assert np.array_equal(lib.host(kc), before, equal_nan=True), "a failed append wrote into the cache"
    # q without rope, mixed layouts
    with pytest.raises(ValueError, match="without rope"):
        flashlite.append_kv(flashlite.KVCache(kc, vc, seq_lens=[4, 4]), k, k, q=k)
    with pytest.raises(ValueError, match="not both"):
        flashlite.KVCache(kc, vc, seq_lens=[1, 1], page_indptr=[0], page_indices=[0], last_page_len=[1])
    with pytest.raises(ValueError, match="together"):
        flashlite.KVCache(kc, vc, page_indptr=[0, 1])


def test_empty_arrays_and_read_only_inputs():
    """numpy arrays without elements (all-zero strides, possibly one shared address) are accepted; read-only caches and
    index arrays serve decode / prefill; append_kv names a read-only cache and a cache whose k and v are one array."""
    rng = np.random.default_rng(11)
    f32 = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    kc, vc = f32(2, 16, 2, 8), f32(2, 16, 2, 8)
    q = f32(2, 1, 4, 8)
    # batch 0, and a paged cache without pages (both sequences empty: zeros, LSE -inf)
    assert flashlite.decode(q[:0], flashlite.KVCache(kc[:0], vc[:0], seq_lens=np.zeros(0, np.int32))).shape == (0, 1, 4, 8)
    empty = np.zeros((0, 16, 2, 8), np.float32)
    out, lse = flashlite.decode(q, flashlite.KVCache(empty, empty.copy(), page_indptr=[0, 0, 0], page_indices=[],
                                                      last_page_len=[0, 0]), return_lse=True)
    assert np.all(out == 0) and np.all(np.isneginf(lse))
    # a ragged prefill whose chunks are all empty
    cache = flashlite.KVCache(kc, vc, seq_lens=[3, 5])
    out, lse = flashlite.prefill(f32(1, 0, 4, 8), cache, cu_seqlens_q=[0, 0, 0], return_lse=True)
    assert out.shape == (1, 0, 4, 8) and lse.shape == (1, 4, 0)
    # read-only cache and index arrays are fine for reading
    kr, vr, lens = kc.copy(), vc.copy(), np.array([3, 5], np.int32)
    for a in (kr, vr, lens):
        a.flags.writeable = False
    want = flashlite.decode(q, cache)
    assert np.array_equal(flashlite.decode(q, flashlite.KVCache(kr, vr, seq_lens=lens)), want)
    with pytest.raises(ValueError, match="cache k is read-only; append_kv writes the cache"):
        flashlite.append_kv(flashlite.KVCache(kr, vc, seq_lens=[3, 5]), f32(2, 1, 2, 8), f32(2, 1, 2, 8))
    # one array as both k and v: the V rows would overwrite the K rows
    before = kc.copy()
    with pytest.raises(ValueError, match="cache.v has the same data pointer as cache.k"):
        flashlite.append_kv(flashlite.KVCache(kc, kc, seq_lens=[3, 5]), f32(2, 1, 2, 8), f32(2, 1, 2, 8))
    assert np.array_equal(kc, before)
    # index lists: no silent truncation or int32 wrap-around
    with pytest.raises(ValueError, match="seq_lens has entries from 3 to 4294967299; expected int32"):
        flashlite.KVCache(kc, vc, seq_lens=[2**32 + 3, 3])
    with pytest.raises(TypeError, match="seq_lens has entries of dtype float64"):
        flashlite.KVCache(kc, vc, seq_lens=[2.7, 3])
    with pytest.raises(TypeError, match="cu_seqlens_q has entries of dtype float64"):
        flashlite.prefill(f32(1, 2, 4, 8), cache, cu_seqlens_q=[0, 1.5, 2])
    # scalar options as strictly as flashlite.attention's
    with pytest.raises(TypeError, match="causal is 'no'; expected True or False"):
        flashlite.decode(q, cache, causal="no")
    with pytest.raises(ValueError, match=r"window\[0\] \(left\) is -4294967296; expected a value within int32"):
        flashlite.decode(q, cache, window=(-2**32, -1))


def test_rope_inv_freq_matches_independent_rule():
    for rope in (flashlite.Rope(theta=10000.0), flashlite.Rope(theta=500000.0, llama3=True),
                 flashlite.Rope(theta=500000.0, llama3=True, factor=32.0, original_max_position=8192.0)):
        got = np.array(rope.inv_freq(128))
        np.testing.assert_allclose(got, inv_freq_ref(rope, 128), rtol=1e-12)


@pytest.mark.skipif("torch-cuda" not in LIBS, reason="needs torch with a CUDA device and flashlite built with CUDA")
def test_cuda_decode_replays_in_a_graph_as_lengths_grow():
    """One decode captured in a CUDA graph (plan bound = capacity), replayed after update() grows the lengths: each
    replay reads the new lengths from the device copies."""
    rng = np.random.default_rng(3)
    batch, hq, hkv, d, max_len = 2, 8, 2, 128, 1024
    kc = torch.randn(batch, max_len, hkv, d, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    cache = flashlite.KVCache(kc, vc, seq_lens=[300, 17])
    q = torch.randn(batch, 1, hq, d, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(q)
    flashlite.decode(q, cache, out=out, max_kv_len=max_len)  # warm-up outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        flashlite.decode(q, cache, out=out, max_kv_len=max_len)
    for lens in ([300, 17], [301, 18], [700, 1024], [1, 512]):
        cache.update(seq_lens=lens)
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        for b in range(batch):
            n = lens[b]
            ref = attention_ref(q[b].double().cpu().numpy(), kc[b, :n].double().cpu().numpy(),
                                vc[b, :n].double().cpu().numpy(), True, (-1, -1), 0)
            assert_close(out[b].float().cpu().numpy(), ref, "bfloat16", what=f"replay lens {lens} seq {b}")
    assert rng is not None
