"""Attention masks that are flashlite calls, read from a boolean or additive (0 / -inf) mask and run as flashlite
calls: batch rows that each see one run of keys up to a causal position, optionally within a window (the masks
transformers builds for padding and static caches), and rows that pack several causal sequences (block-diagonal: the
masks of packed training batches), which run as one variable-length call. Used by the Hugging Face hook and the SDPA
drop-in."""
from __future__ import annotations

import itertools
import weakref

import torch


# An additive mask entry at or below this hides its key: exp(-32752 + any score difference below ~32000) is 0 in
# float32, so float16's lowest (transformers' eager masks of an fp16 model) hides as -inf does, in a mask of any dtype.
_HIDDEN = torch.finfo(torch.float16).min / 2


def visible(mask: torch.Tensor) -> torch.Tensor | None:
    """A boolean [B, q, kv] view of a 4-D mask (True = attend), or None when the mask is not a pure 0 / -inf pattern,
    differs between heads, or hides every key of a query with a finite value (SDPA then averages over all the keys,
    where flashlite's row without keys gives zeros)."""
    if mask.dim() != 4:
        return None
    if mask.dtype == torch.bool:
        vis = mask
    else:
        vis = mask == 0
        hidden = mask <= _HIDDEN
        if not bool(torch.all(vis | hidden)):  # a real additive bias (e.g. ALiBi)
            return None
        if not bool(torch.all(vis | (mask == float("-inf")))) and not bool(vis.any(-1).all()):
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
    Returns [(start, end, right) or None (a row without keys), ...] (one per batch row) or None."""
    vis = visible(mask)
    if vis is None or vis.shape[-2:] != (q_len, kv_len) or vis.shape[0] not in (1, batch):
        return None
    if q_len == 0 or kv_len == 0:
        return None
    idx = torch.arange(kv_len, device=vis.device)
    i = torch.arange(q_len, device=vis.device)[:, None]
    seen = vis.any(dim=1)  # [b, kv]: keys some query sees
    start = torch.where(seen, idx, kv_len).amin(-1)
    end = torch.where(seen, idx + 1, 0).amax(-1)
    # each query's first and last visible key (kv_len and -1: none), by argmax over bytes: no [b, q, kv] of int64
    sees = vis.any(-1)  # [b, q]
    byte = vis.to(torch.uint8)
    first = torch.where(sees, byte.argmax(-1), kv_len)
    last = torch.where(sees, kv_len - 1 - byte.flip(-1).argmax(-1), -1)
    del byte
    j, qi, never = idx[None, None, :], i[:, 0], -(2**31)

    def fits(off):  # [b]: whether the row is the form with this offset
        pos = i + off[:, None, None]  # [b, q, 1]
        expect = (j >= start[:, None, None]) & (j < end[:, None, None]) & (j <= pos)
        if window_left >= 0:
            expect &= j >= pos - window_left
        return (expect == vis).flatten(1).all(-1)

    # Offsets the row would have, each read off where it shows (the check holds every query to it): a query whose
    # last key is not the run's end; with a window, a query whose first key is past the run's start, and the last
    # query that sees a key; the first query that does; a static cache's prefix and decode (end - q_len); key padding
    # alone (every query sees the run).
    free = (last >= 0) & (last < end[:, None] - 1)
    candidates = [(torch.where(free, last - qi, never).amax(-1), free.any(-1))]
    if window_left >= 0:
        late = (first < kv_len) & (first > start[:, None])
        candidates += [(torch.where(late, first + window_left - qi, never).amax(-1), late.any(-1)),
                       (end - 1 + window_left - torch.where(sees, qi, -1).amax(-1), sees.any(-1))]
    candidates += [(start - torch.where(sees, qi, q_len).amin(-1), sees.any(-1)), (end - q_len, None), (end - 1, None)]
    off, found = torch.full_like(start, never), torch.zeros_like(start, dtype=torch.bool)
    for cand, valid in candidates:
        take = ~found & fits(cand) & (True if valid is None else valid)
        off, found = torch.where(take, cand, off), found | take
        if bool(found.all()):
            break
    else:
        return None
    rows = []
    for s, e, o in zip(start.tolist(), end.tolist(), off.tolist()):
        right = o + q_len - e
        if e <= s:
            rows.append(None)  # no query of the row sees a key: zeros
        elif right < 0:
            return None  # queries that stop short of the run's end
        else:
            rows.append((s, e, right))
    return rows * (batch if vis.shape[0] == 1 else 1)


def packed(mask: torch.Tensor, batch: int, q_len: int, kv_len: int, window_left: int):
    """Per batch row, the cumulative lengths of the causal sequences packed in it ([0, ..., q_len]), when the mask is
    block-diagonal causal (each query sees the keys of its own sequence up to itself, optionally within the window),
    else None."""
    vis = visible(mask)
    if vis is None or q_len != kv_len or q_len == 0 or vis.shape[-2:] != (q_len, kv_len) or \
            vis.shape[0] not in (1, batch):
        return None
    i = torch.arange(q_len, device=vis.device)
    first = vis.to(torch.uint8).argmax(-1)  # [b, q]; a query that sees nothing fails the check below
    begins = first == i  # a sequence begins at a query that sees no key before itself
    start = torch.cummax(torch.where(begins, i, 0), dim=-1).values  # [b, q]: where each query's sequence begins
    j, pos = i[None, None, :], i[None, :, None]
    expect = (j >= start[:, :, None]) & (j <= pos)
    if window_left >= 0:
        expect &= j >= pos - window_left
    if not bool(torch.equal(expect, vis)):
        return None
    bounds = [[int(x) for x in torch.nonzero(row).flatten().tolist()] + [q_len] for row in begins]
    return bounds * (batch if vis.shape[0] == 1 else 1)


def attend_packed(q, k, v, bounds, window_left, call):
    """The attention of q, k, v ([B, S, H, D]) under the mask that packed() read into `bounds`: one variable-length
    call over every row's sequences (the rows copied into one run when there are several; one call per row under CUDA
    graph capture), through call(q, k, v, causal, window, cu_seqlens_q, cu_seqlens_k)."""
    batch, seq = q.shape[:2]
    if batch > 1 and _capturing(q):
        return torch.cat([call(*qkv, True, (window_left, -1), cu, cu)
                          for *qkv, cu in zip(q.split(1), k.split(1), v.split(1), bounds)])
    cu = [b * seq + x for b, row in enumerate(bounds) for x in row[:-1]] + [batch * seq]
    return _as_batch(call(_one_run(q), _one_run(k), _one_run(v), True, (window_left, -1), cu, cu), q)


def _one_run(t):
    """[B, S, ...] as the one run [1, B * S, ...] of a variable-length call (a view for one row, else a copy)."""
    return t.reshape((1, t.shape[0] * t.shape[1]) + tuple(t.shape[2:]))


def _as_batch(out, q):
    """A variable-length call's output over all of q's rows in order, back in q's [B, S, H, D] shape (a view)."""
    return out.view(q.shape[:3] + out.shape[-1:])


def _capturing(t):
    """Whether t's stream is being captured into a CUDA graph. Variable-length calls copy their offsets from the host
    (the backward always, the forward past 128 sequences), which a graph cannot capture, so there the batch keeps one
    call per row, as before it was merged."""
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def attend_rows(q, k, v, rows, window_left, call):
    """The attention of q, k, v ([B, S, H, D]) under the mask that analyse() read into `rows`, through
    call(q, k, v, causal, window, cu_seqlens_q=None, cu_seqlens_k=None) (a flashlite.attention call with the caller's
    other options)."""
    def run(q, k, v, start, end, right):
        k, v = k[:, start:end], v[:, start:end]
        if window_left < 0 or right <= window_left:  # one window: (left, right) around the bottom-right position
            return call(q, k, v, not right, (window_left - right if window_left >= 0 else -1, right if right else -1))
        # Right padding longer than the window: the queries whose causal position is inside the run (the first
        # q_len - right) are causal over it, the next window_left see a band that ends at the run's last key (a
        # window left of their position: a call of its own), the rest see no key (zeros, as every kernel gives a row
        # without keys).
        q_len = q.shape[1]
        inside = q_len - right
        a, b = max(0, inside), min(q_len, inside + window_left)
        parts = [call(q[:, :inside], k, v, True, (window_left, -1))] if inside > 0 else []
        if b > a:
            parts.append(call(q[:, a:b], k, v, False, (inside - a + window_left - (b - a), b - a)))
        if q_len > b:
            parts.append(parts[0].new_zeros((q.shape[0], q_len - max(a, b)) + tuple(parts[0].shape[2:])))
        return torch.cat(parts, dim=1)
    # Batch rows with different valid keys (padding, a static cache's lengths): one or two variable-length calls
    # where they express the rows, else one call per stretch of neighbouring rows alike (views, no copies); rows
    # without keys are zeros.
    if len(set(rows)) > 1:
        out = _varlen_rows(q, k, v, rows, window_left, call)
        if out is not None:
            return out
    stretches, b0 = [], 0
    for b in range(1, len(rows) + 1):
        if b == len(rows) or rows[b] != rows[b0]:
            stretches.append((b0, b, rows[b0]))
            b0 = b
    if len(stretches) == 1 and rows[0] is not None:
        return run(q, k, v, *rows[0])
    # (split, not a slice per stretch: split's backward is one concatenation, where each slice's backward makes a
    # zero tensor of the whole batch that autograd then adds up)
    pieces = zip(*(t.split([b - a for a, b, _ in stretches]) for t in (q, k, v)))
    outs = [None if r is None else run(*qkv, *r) for (_, _, r), qkv in zip(stretches, pieces)]
    like = next((o for o in outs if o is not None), q[:1])
    return torch.cat([like.new_zeros((b - a,) + tuple(like.shape[1:])) if o is None else o
                      for (a, b, _), o in zip(stretches, outs)])


# Fewer queries per row (decode steps) keep one call per stretch: a memory-bound call would read K and V three times
# with the gather.
VARLEN_MIN_QUERIES = 64


def _varlen_rows(q, k, v, rows, window_left, call):
    """analyse()'s rows, when they differ, as variable-length calls over the batch's real keys (gathered: one copy of
    K and V), or None where they do not express them. One call per row would leave the GPU idle on short rows (a
    row's K / V blocks per kv head are few), and autograd would add up a full-size gradient per row.
    - Every row with the same `right` (left padding, a static cache's lengths, an encoder's key padding): one call,
      sequence b the row's q_len queries (q copied into one run) over its keys start..end-1.
    - Right padding (start 0, off 0, no window): the rows up to the run's end are causal over it, the rest (pads) see
      all of it: one causal call over the real rows and one over the pad rows, both gathered; their outputs
      interleaved back."""
    batch, q_len = q.shape[:2]
    if q_len < VARLEN_MIN_QUERIES or any(r is None for r in rows) or _capturing(q):
        return None
    starts, ends, rights = zip(*rows)
    right = rights[0]
    same_right = all(r == right for r in rights) and (window_left < 0 or right <= window_left)
    right_padded = window_left < 0 and q_len == k.shape[1] and all(s == 0 and r == q_len - e for s, e, r in rows)
    if not (same_right or right_padded):
        return None
    keys = [e - s for s, e in zip(starts, ends)]
    cu_k = _cumulative(keys)
    gather = lambda t, lo, hi: torch.cat([x[a:b] for x, a, b in zip(t.unbind(0), lo, hi)])[None]  # noqa: E731
    kr, vr = gather(k, starts, ends), gather(v, starts, ends)
    if same_right:
        window = (window_left - right if window_left >= 0 else -1, right if right else -1)
        return _as_batch(call(_one_run(q), kr, vr, not right, window, _cumulative([q_len] * batch), cu_k), q)
    pads = [q_len - e for e in ends]
    real = call(gather(q, [0] * batch, ends), kr, vr, True, (-1, -1), cu_k, cu_k)[0].split(keys)
    pad = call(gather(q, ends, [q_len] * batch), kr, vr, False, (-1, -1), _cumulative(pads), cu_k)[0].split(pads)
    return _as_batch(torch.cat([x for pair in zip(real, pad) for x in pair]), q)


def _cumulative(lengths):
    """cu_seqlens of these lengths: [0, l0, l0 + l1, ...]."""
    return list(itertools.accumulate(lengths, initial=0))


_memo = []  # [(weakref to a mask, its key, its plan)], the last two: a forward's layers share a mask, and models that
# alternate sliding and full layers (gpt-oss, Gemma 2) share one of each


def plan(mask: torch.Tensor, batch: int, q_len: int, kv_len: int, window_left: int):
    """("rows", analyse()'s rows) or ("packed", packed()'s bounds) for a mask of up to 4 dimensions broadcast to
    [batch, heads, q_len, kv_len], or None when it is neither. Reading a mask syncs with the host, so the last two
    plans are remembered (by tensor and version: a mask written in place is read again)."""
    global _memo
    key = (mask._version, batch, q_len, kv_len, window_left)
    for ref, k, p in _memo:
        if ref() is mask and k == key:
            return p
    p = None
    if mask.dim() <= 4 and (mask.dtype == torch.bool or mask.is_floating_point()):
        full = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
        try:
            full = full.expand(full.shape[0], full.shape[1], q_len, kv_len)
        except RuntimeError:  # does not broadcast to the call's queries and keys
            full = None
        if full is not None:
            rows = analyse(full, batch, q_len, kv_len, window_left)
            bounds = None if rows is not None else packed(full, batch, q_len, kv_len, window_left)
            p = ("rows", rows) if rows is not None else ("packed", bounds) if bounds is not None else None
    _memo = [(weakref.ref(mask), key, p)] + _memo[:1]
    return p


def attend(q, k, v, plan, window_left, call):
    """The attention of q, k, v ([B, S, H, D]) under a mask's plan(), through call(q, k, v, causal, window,
    cu_seqlens_q=None, cu_seqlens_k=None) (a flashlite.attention call with the caller's other options)."""
    kind, how = plan
    return (attend_rows if kind == "rows" else attend_packed)(q, k, v, how, window_left, call)
