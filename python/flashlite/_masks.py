"""Attention masks that are flashlite calls: a boolean or additive (0 / -inf) mask whose batch rows each see one run
of keys up to a causal position, optionally within a window (the masks transformers builds for padding and static
caches), read into per-row (start, end, right) and run as flashlite calls. Used by the Hugging Face hook and the SDPA
drop-in."""
from __future__ import annotations

import torch


def visible(mask: torch.Tensor) -> torch.Tensor | None:
    """A boolean [B, q, kv] view of a 4-D mask (True = attend), or None when the mask is not a pure 0/-inf pattern
    or differs between heads."""
    if mask.dim() != 4:
        return None
    if mask.dtype == torch.bool:
        vis = mask
    else:
        lowest = torch.finfo(mask.dtype).min
        vis = mask == 0
        if not bool(torch.all(vis | (mask <= lowest / 2))):  # a real additive bias (e.g. ALiBi)
            return None
    if vis.shape[1] != 1 and not bool(torch.all(vis == vis[:, :1])):
        return None
    return vis[:, 0]


def analyse(mask: torch.Tensor, batch: int, q_len: int, kv_len: int, window_left: int):
    """Per batch row, the flashlite call that the mask is, or None when it is not one.

    The masks flashlite expresses: row b's valid keys are one run start..end-1, and query i sees key j in it iff
    j <= i + off (optionally j >= i + off - window_left too). transformers' padded masks are all of this form: a static
    cache's unwritten tail (off = L - q_len), left padding (start > 0) and right padding (end < q_len, off = 0); so is
    key padding alone, without a causal order (off >= end - 1: every query sees the whole run). Keys
    start..end-1 become flashlite's keys, so its bottom-right position is p = i + (end - start) - q_len and query i
    sees local keys up to p + right, right = off + q_len - end: causal when right is 0, else the window (left, right).
    Returns [(start, end, right), ...] (one per batch row) or None."""
    vis = visible(mask)
    if vis is None or vis.shape[-2:] != (q_len, kv_len) or vis.shape[0] not in (1, batch):
        return None
    idx = torch.arange(kv_len, device=vis.device)
    i = torch.arange(q_len, device=vis.device)[:, None]
    seen = vis.any(dim=1)  # [b, kv]: keys some query sees
    start = torch.where(seen, idx, kv_len).amin(-1)
    end = torch.where(seen, idx + 1, 0).amax(-1)
    last = torch.where(vis, idx, -1).amax(-1)  # [b, q]: each query's last visible key (-1: none)
    # off from a query whose last key is not the run's end (any such query gives it; the check below holds them all
    # to it), else the alignment of a static cache's prefix and of decode, end - q_len
    free = (last >= 0) & (last < end[:, None] - 1)
    any_free = free.any(-1)
    off = torch.where(any_free, torch.where(free, last - i[:, 0], -(2**31)).amax(-1), end - q_len)
    j = idx[None, None, :]

    def matches(off):
        pos = i + off[:, None, None]  # [b, q, 1]
        expect = (j >= start[:, None, None]) & (j < end[:, None, None]) & (j <= pos)
        if window_left >= 0:
            expect &= j >= pos - window_left
        return bool(torch.equal(expect, vis))
    if not matches(off):
        # without a window, a row whose every query sees the whole run is not causal at all (key padding alone,
        # or no mask): each query's position at or past the run's end
        off = torch.where(any_free, off, end - 1)
        if window_left >= 0 or not matches(off):
            return None
    rows = []
    for s, e, o in zip(start.tolist(), end.tolist(), off.tolist()):
        right = o + q_len - e
        if e <= s or right < 0 or (0 <= window_left < right and right >= q_len):
            return None  # a row without keys, queries that stop short of the run's end, or all past it
        rows.append((s, e, right))
    return rows * (batch if vis.shape[0] == 1 else 1)


def attend_rows(q, k, v, rows, window_left, call):
    """The attention of q, k, v ([B, S, H, D]) under the mask that analyse() read into `rows`, through
    call(q, k, v, causal, window) (a flashlite.attention call with the caller's other options)."""
    def run(q, k, v, start, end, right):
        k, v = k[:, start:end], v[:, start:end]
        if window_left < 0 or right <= window_left:  # one window: (left, right) around the bottom-right position
            return call(q, k, v, not right, (window_left - right if window_left >= 0 else -1, right if right else -1))
        # Right padding longer than the window: the first q_len - right queries are causal over the run, the next
        # window_left see the band that ends at the run's last key (a window left of their position: their own
        # call), the rest see no key (zeros, as every kernel gives a row without keys).
        inside, band = q.shape[1] - right, window_left
        parts = [call(q[:, :inside], k, v, True, (window_left, -1)),
                 call(q[:, inside:inside + band], k, v, False, (0, band))]
        parts.append(parts[0].new_zeros((q.shape[0], right - band) + tuple(parts[0].shape[2:])))
        return torch.cat(parts, dim=1)
    if all(r == rows[0] for r in rows):
        return run(q, k, v, *rows[0])
    # rows with different valid keys (padding, a static cache's lengths) run one at a time
    return torch.cat([run(q[b:b + 1], k[b:b + 1], v[b:b + 1], *r) for b, r in enumerate(rows)])
