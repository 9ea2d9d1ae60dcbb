"""Strict checks of flashlite.attention's scalar arguments, shared by the array path (_api) and the torch path
(_torch_ops; plain Python on constants, so torch.compile traces through it). Python's own conversions are too
forgiving here: bool("no") is True, float("2") parses a string, and an int past C int reaches nanobind as an unclear
TypeError. Each check names the argument and the value."""
from __future__ import annotations

import numbers

_INT32 = (-2**31, 2**31 - 1)


def _is_bool(x):
    t = type(x)  # numpy's bool scalar (numpy.bool, numpy.bool_ before numpy 2) without importing numpy
    return isinstance(x, bool) or (t.__module__ == "numpy" and t.__name__ in ("bool", "bool_"))


def causal_flag(x):
    """bool, numpy.bool_, or the ints 0 and 1."""
    if _is_bool(x):
        return bool(x)
    if isinstance(x, numbers.Integral) and int(x) in (0, 1):
        return bool(x)
    raise TypeError(f"causal is {x!r}; expected True or False")


def int32_value(x, name):
    """An int (not a bool or a float) within int32."""
    if _is_bool(x) or not isinstance(x, numbers.Integral):
        raise TypeError(f"{name} is {x!r}; expected an int")
    v = int(x)
    if not _INT32[0] <= v <= _INT32[1]:
        raise ValueError(f"{name} is {v}; expected a value within int32")
    return v


def real_value(x, name):
    """A real number (not a string or a bool)."""
    if _is_bool(x) or not isinstance(x, numbers.Real):
        raise TypeError(f"{name} is {x!r}; expected a number")
    return float(x)


def window_pair(window):
    """(left, right) ints, -1 = unlimited; None = (-1, -1)."""
    if window is None:
        return -1, -1
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise TypeError(f"window is {window!r}; expected a pair (left, right) of ints, -1 = unlimited")
    return int32_value(window[0], "window[0] (left)"), int32_value(window[1], "window[1] (right)")


def options(causal, scale, window, sink_tokens, softcap, backend):
    """The checked scalar options: (causal, scale or None, window_left, window_right, sink_tokens, softcap, backend)."""
    if not isinstance(backend, str):
        raise TypeError(f"backend is {backend!r}; expected one of auto, reference, naive, cpu, cuda")
    left, right = window_pair(window)
    return (causal_flag(causal), None if scale is None else real_value(scale, "scale"), left, right,
            int32_value(sink_tokens, "sink_tokens"), real_value(softcap, "softcap"), backend)
