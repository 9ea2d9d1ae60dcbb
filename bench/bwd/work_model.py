"""Counted work of the Hopper backward: the score pairs each kernel's products cover, against the pairs the mask
leaves visible, from the kernels' tile rules (no GPU). Useful work is the 5 products of the benchmark's FLOP count
(2.5x the forward's two) over the visible pairs; the kernels run 7 (dK / dV: S^T, dP^T, dV, dK; dQ: S, dP, dQ), each
over the pairs of the tiles they walk:
  dK / dV  per consumer warpgroup (64 keys), the q blocks of BM rows that see one of its keys (q_blocks_seeing_keys);
  dQ       per warpgroup (64 rows), the key tiles of BC keys that one of its rows sees, the sink tile over its first
           16 keys when the rows see none past them, a 128-key tile over its first 64 keys when they see none of its
           last 64 (--cta-walk: the rule before both, every warpgroup walking every tile one of the CTA's 128 rows
           sees, each at BC keys).
BM = BC = 64 at head_dim 128, 128 at 64. The ratio useful / computed bounds what a shape's mask lets the kernels
reach relative to the full mask's 5 / 7.

    python3 bench/bwd/work_model.py [--cta-walk]
"""
import argparse

import numpy as np


def visible(s, causal, window, sinks):
    i = np.arange(s)[:, None]
    j = np.arange(s)[None, :]
    v = np.ones((s, s), bool)
    if causal:
        v &= j <= i
    if window >= 0:
        v &= j >= i - window
    return v | ((j < sinks) & ((j <= i) if causal else True))


def blocks_any(v, rows, cols):
    """[row block, col block] -> whether any pair of the block is visible."""
    s = v.shape[0]
    return v.reshape(s // rows, rows, s // cols, cols).any(axis=(1, 3))


def work(s, d, causal, window, sinks, cta_walk, dkdv_halves=False):
    v = visible(s, causal, window, sinks)
    bm = bc = 64 if d == 128 else 128
    dkdv = blocks_any(v, bm, 64).sum() * bm * 64  # (q block, warpgroup's 64 keys) items
    if bm == 128 and dkdv_halves:  # items whose keys only one 64-row half of the q block sees: that half alone
        halves = blocks_any(v, 64, 64).reshape(s // 128, 2, s // 64)
        dkdv -= (halves[:, 0] != halves[:, 1]).sum() * 64 * 64
    cta = blocks_any(v, 128, bc)                  # the dQ CTA's key tiles
    wg = blocks_any(v, 64, bc)                    # ... those each warpgroup's 64 rows see
    if cta_walk:
        dq = cta.sum() * 2 * 64 * bc
    else:
        dq = wg.sum() * 64 * bc
        if bc == 128:  # rows that see none of a tile's last 64 keys: n64 products
            upper = v.reshape(s // 64, 64, s // bc, bc)[:, :, :, 64:].any(axis=(1, 3))
            dq -= (wg & ~upper).sum() * 64 * 64
        if sinks:  # a sink tile whose rows see nothing past its first 16 keys: n16 products
            past16 = v[:, 16:bc].reshape(s // 64, 64, bc - 16).any(axis=(1, 2))
            narrow = wg[:, 0] & ~past16
            dq -= narrow.sum() * 64 * (bc - 16)
    return v.sum(), dkdv, dq


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cta-walk", action="store_true", help="dQ's rule before the per-warpgroup skip and narrow sink")
    ap.add_argument("--dkdv-halves", action="store_true",
                    help="bench/bwd/pending/dkdv_halves.patch: D64 dK / dV items over the one 64-row half that sees")
    args = ap.parse_args()
    print(f"{'shape':40s} {'dK/dV':>7s} {'dQ':>7s} {'useful / computed':>18s}")
    for d in (64, 128):
        for causal, s, window, sinks in [(False, 2048, -1, 0), (True, 2048, -1, 0), (True, 8192, -1, 0),
                                         (True, 8192, 1024, 4)]:
            if window >= 0 and d != 128:
                continue  # the benchmark's window + sinks case is D128
            vis, dkdv, dq = work(s, d, causal, window, sinks, args.cta_walk, args.dkdv_halves)
            name = f"D{d} {'causal' if causal else 'full'} S{s}" + (f" window {window} + {sinks} sinks"
                                                                    if window >= 0 else "")
            print(f"{name:40s} {dkdv / vis:7.3f} {dq / vis:7.3f} {5 * vis / (4 * dkdv + 3 * dq):18.3f}")


if __name__ == "__main__":
    main()
