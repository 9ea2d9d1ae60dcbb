"""A small driver for compute-sanitizer (memcheck, racecheck, initcheck; scripts/gpu-check.sh runs it): the CUDA
backends through the Python module on cupy arrays (cupy rather than torch keeps foreign kernels out of the tools'
reports) over a small grid of odd shapes, masks, GQA and varlen, each result checked against the float64 reference.
Not collected by pytest (no test_ prefix). Exit status 1 on a wrong result, 0 when cupy is missing (skipped)."""
import sys

import numpy as np

try:
    import cupy as cp
except ImportError:
    print("sanitize_driver: cupy is not installed; skipped")
    sys.exit(0)

import flashlite

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from pyattn_util import assert_close, assert_lse_close  # noqa: E402

CASES = [
    # (b, sq, sk, hq, hkv, d, options)
    (1, 17, 17, 2, 1, 64, {"causal": True}),
    (2, 33, 70, 4, 2, 128, {"window": (16, 4), "sink_tokens": 2}),
    (1, 40, 20, 3, 3, 64, {"causal": True, "softcap": 8.0}),  # fully masked rows
    (1, 65, 65, 2, 2, 32, {"sink_logits": True}),
]
VARLEN = ([0, 5, 5, 30], [0, 9, 13, 40])  # an empty sequence among them


def run_case(backend, dtype, b, sq, sk, hq, hkv, d, opts, rng, cu=None):
    q = rng.standard_normal((b, sq, hq, d)).astype(dtype)
    k = rng.standard_normal((b, sk, hkv, d)).astype(dtype)
    v = rng.standard_normal((b, sk, hkv, d)).astype(dtype)
    opts = dict(opts)
    if opts.pop("sink_logits", False):
        opts["sink_logits"] = rng.standard_normal(hq).astype(np.float32)
    if cu is not None:
        opts["cu_seqlens_q"], opts["cu_seqlens_k"] = (np.array(c, dtype=np.int32) for c in cu)
    ref, ref_lse = flashlite.reference(q, k, v, **opts)
    dev_opts = {key: (cp.asarray(val) if key == "sink_logits" else val) for key, val in opts.items()}
    out = cp.asarray(np.full(q.shape, np.nan, dtype=dtype))
    _, lse = flashlite.attention(cp.asarray(q), cp.asarray(k), cp.asarray(v), out=out, return_lse=True,
                                 backend=backend, **dev_opts)
    cp.cuda.Device().synchronize()
    assert_close(cp.asnumpy(out), ref, np.dtype(dtype).name)
    assert_lse_close(cp.asnumpy(lse), ref_lse)


def main():
    rng = np.random.default_rng(0)
    n = 0
    for backend in ("naive", "cuda"):
        for dtype in (np.float32, np.float16):
            for b, sq, sk, hq, hkv, d, opts in CASES:
                try:
                    run_case(backend, dtype, b, sq, sk, hq, hkv, d, opts, rng)
                except ValueError as e:  # e.g. a head_dim the fused kernel does not take
                    print(f"skip {backend} {np.dtype(dtype).name} d{d}: {e}")
                    continue
                n += 1
            run_case(backend, dtype, 1, VARLEN[0][-1], VARLEN[1][-1], 4, 2, 64, {"causal": True}, rng, VARLEN)
            n += 1
    print(f"sanitize_driver: {n} cases passed")


if __name__ == "__main__":
    main()
