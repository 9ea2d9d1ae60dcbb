"""Strict checks of flashlite.attention's scalar arguments, shared by the array path (_api) and the torch path
(_torch_ops; plain Python on constants, so torch.compile traces through it). Python's own conversions are too
forgiving here: bool("no") is True, float("2") parses a string, and an int past C int reaches nanobind as an unclear
TypeError. Each check names the argument and the value."""
from __future__ import annotations

import operator

_INT32 = (-2**31, 2**31 - 1)


def _numpy_kind(x):
    """numpy scalar's or array's dtype kind ('b', 'i', 'u', 'f', ...), else None; numpy is never imported here. Plain
    type checks, no ABCs, so torch.compile evaluates them on its constants."""
    return x.dtype.kind if type(x).__module__ == "numpy" and hasattr(x, "dtype") else None


def _zero_dim(x):
    """A scalar or a 0-d array / tensor (numpy, torch, cupy: anything with ndim 0); plain numbers have no ndim."""
    return getattr(x, "ndim", 0) == 0


def _is_bool(x):
    if isinstance(x, bool) or _numpy_kind(x) == "b":
        return True
    dtype = getattr(x, "dtype", None)
    return dtype is not None and str(dtype) in ("bool", "torch.bool")


def _is_int(x):
    """int, numpy integer (scalar or 0-d array), or a 0-d integer tensor (operator.index takes it, not a float)."""
    if _is_bool(x) or isinstance(x, (str, bytes)) or not _zero_dim(x):
        return False
    if isinstance(x, int) or _numpy_kind(x) in ("i", "u"):
        return True
    if _numpy_kind(x) is None and hasattr(x, "__index__"):
        try:
            operator.index(x)
            return True
        except TypeError:
            return False
    return False


def show(x, limit=80):
    """repr(x) for a message, cut to `limit` characters (a 400-digit int, a long list)."""
    try:
        r = repr(x)
    except Exception:  # noqa: BLE001  (a broken __repr__ must not hide the real error)
        r = f"<{type(x).__module__}.{type(x).__qualname__}>"
    return r if len(r) <= limit else r[:limit - 3] + "..."


def flag(x, name):
    """bool, numpy bool (or 0-d bool array / tensor), or the ints 0 and 1 -- not a string ("no" is truthy) or None."""
    if x is True or x is False:
        return x
    if _is_bool(x) and _zero_dim(x):
        return bool(x)
    if _is_int(x) and int(x) in (0, 1):
        return bool(x)
    raise TypeError(f"{name} is {show(x)}; expected True or False")


def causal_flag(x):
    """bool, numpy bool (or 0-d bool array / tensor), or the ints 0 and 1."""
    return flag(x, "causal")


def int_value(x, name, lo=_INT32[0], hi=_INT32[1], expect="a value within int32"):
    """An int (not a bool or a float) within [lo, hi]."""
    if type(x) is not int and not _is_int(x):
        raise TypeError(f"{name} is {show(x)}; expected an int")
    v = int(x)
    if not lo <= v <= hi:
        raise ValueError(f"{name} is {show(v)}; expected {expect}")
    return v


def int32_value(x, name):
    """An int (not a bool or a float) within int32."""
    return int_value(x, name)


def real_value(x, name):
    """A real number: int, float, numpy integer / float (scalar or 0-d array), or a 0-d tensor of a real dtype (torch,
    cupy: through float()); not a string, a bool, a complex or an array of more than one value. An int too large for a
    float is a ValueError."""
    if type(x) is float:
        return x
    if isinstance(x, (str, bytes)) or _is_bool(x) or not _zero_dim(x):
        raise TypeError(f"{name} is {show(x)}; expected a number")
    try:
        if _is_int(x) or isinstance(x, float) or _numpy_kind(x) == "f":
            return float(x)
        if _numpy_kind(x) is None and hasattr(x, "__float__") and "complex" not in str(getattr(x, "dtype", "")):
            try:
                return float(x)
            except (TypeError, ValueError):
                pass
    except OverflowError:
        raise ValueError(f"{name} is {show(x)}; expected a finite number") from None
    raise TypeError(f"{name} is {show(x)}; expected a number")


def finite_value(x, name, *, positive=False):
    """real_value that is finite (and > 0 when asked)."""
    v = real_value(x, name)
    if v != v or v in (float("inf"), float("-inf")) or (positive and not v > 0):
        raise ValueError(f"{name} is {show(x)}; expected a finite number{' > 0' if positive else ''}")
    return v


def window_pair(window):
    """(left, right) ints, -1 = unlimited; None = (-1, -1). Any sequence of two ints: tuple, list, numpy array,
    tensor."""
    if window is None:
        return -1, -1
    try:
        ok = not isinstance(window, (str, bytes, dict)) and len(window) == 2
    except TypeError:  # no len(): a number, a 0-d array
        ok = False
    if not ok:
        raise TypeError(f"window is {show(window)}; expected a pair (left, right) of ints, -1 = unlimited")
    return int32_value(window[0], "window[0] (left)"), int32_value(window[1], "window[1] (right)")


def options(causal, scale, window, sink_tokens, softcap, backend):
    """The checked scalar options: (causal, scale or None, window_left, window_right, sink_tokens, softcap, backend)."""
    # Plain Python values (the usual call) pass with type tests alone: this runs on every attention call, and the
    # general checks below cost twice as much host time.
    if (type(window) is tuple and len(window) == 2 and type(window[0]) is int and type(window[1]) is int
            and type(sink_tokens) is int and (causal is True or causal is False) and type(softcap) is float
            and (scale is None or type(scale) is float) and type(backend) is str
            and _INT32[0] <= window[0] <= _INT32[1] and _INT32[0] <= window[1] <= _INT32[1]
            and _INT32[0] <= sink_tokens <= _INT32[1]):
        return causal, scale, window[0], window[1], sink_tokens, softcap, backend
    if not isinstance(backend, str):
        raise TypeError(f"backend is {show(backend)}; expected one of auto, reference, naive, cpu, cuda")
    left, right = window_pair(window)
    return (causal_flag(causal), None if scale is None else real_value(scale, "scale"), left, right,
            int32_value(sink_tokens, "sink_tokens"), real_value(softcap, "softcap"), backend)
