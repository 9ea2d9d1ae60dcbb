"""Named errors for array arguments. flashlite._C takes arrays through nanobind, whose own message for an argument it
cannot take (a list, an object-dtype or read-only numpy array, a meta tensor that DLPack cannot export) is a dump of
every overload's signature that names nothing. The entry points check what is cheap up front (that an array comes from
q's library) and call explain() only after a native call failed -- nothing is added to a call that succeeds -- to
turn such a failure into a TypeError / ValueError naming the argument and what was expected."""
from __future__ import annotations

import sys

from ._args import show

ARRAY = {"numpy": "numpy.ndarray", "torch": "torch.Tensor", "cupy": "cupy.ndarray"}
FLOATS = "float32, float16 or bfloat16"
_NUMPY_KINDS = "biufc"  # what nanobind imports from numpy (dtype kinds); object, string, void, datetime are not


def typename(x):
    t = type(x)
    return f"{t.__module__}.{t.__qualname__}"


_KNOWN = {}  # array type -> its library (a memo: this runs on every argument of every call)


def library(x):
    """'numpy', 'torch' or 'cupy' when x is an array of that library (not a scalar or another object), else None."""
    t = type(x)
    lib = _KNOWN.get(t)
    if lib is not None:
        return lib
    root = t.__module__.split(".")[0]
    mod = sys.modules.get(root) if root in ARRAY else None
    if mod is None:
        return None
    if isinstance(x, mod.Tensor if root == "torch" else mod.ndarray):
        _KNOWN[t] = root
        return root
    return None


def require(x, name, lib, what="", *, optional=False):
    """x must be an array of library lib (the library of q or of the cache); returns x."""
    if x is None and optional:
        return x
    if library(x) != lib:
        raise TypeError(f"{name} is a {typename(x)}; expected a {ARRAY[lib]}{what}")
    return x


def problem(x, name, lib, writable=False, expect=FLOATS):
    """The error an array argument x would cause inside nanobind's conversion, or None when it converts."""
    if x is None or type(x).__name__ == "PyCapsule":
        return None
    kind = library(x)
    if kind == "numpy":
        if x.dtype.kind not in _NUMPY_KINDS:
            return TypeError(f"{name} has dtype {x.dtype}; expected {expect}")
        if not x.dtype.isnative:
            return TypeError(f"{name} has dtype {x.dtype.str} (non-native byte order); expected {expect} in native "
                             "byte order")
        if writable and not x.flags.writeable:
            return ValueError(f"{name} is read-only; expected a writable array (flashlite writes into it)")
        return None
    if kind == "torch":
        import torch
        if x.device.type not in ("cpu", "cuda"):
            return ValueError(f"{name} is on {x.device}; expected CPU or CUDA memory")
        if x.layout != torch.strided:
            return TypeError(f"{name} is a {x.layout} tensor; expected a dense (torch.strided) tensor")
        try:
            torch.utils.dlpack.to_dlpack(x.detach())
        except Exception as err:  # noqa: BLE001  (whatever DLPack refuses, say which argument)
            return TypeError(f"{name} cannot be passed through DLPack ({err}); expected a dense CPU or CUDA tensor "
                             f"of {expect}")
        return None
    if kind == "cupy":
        return None
    return TypeError(f"{name} is a {typename(x)}; expected a {ARRAY.get(lib, 'array')}")


def explain(err, what, lib, named):
    """After a native call of `what` raised err: raises a named error for the first argument in `named` -- (name,
    value, writable, expected dtypes) -- that nanobind cannot take; nanobind's signature dump becomes a TypeError that
    lists the arguments' types in any case. Returns when err is the native layer's own (already named) error, for the
    caller to re-raise."""
    for name, x, writable, expect in named:
        p = problem(x, name, lib, writable, expect)
        if p is not None:
            raise p from None
    if err is not None and "incompatible function arguments" in str(err):
        given = ", ".join(f"{name}: {typename(x)}" for name, x, _, _ in named)
        raise TypeError(f"{what}: an argument has a type the native module does not take ({given}); expected "
                        f"{ARRAY.get(lib, 'array')} arrays") from None


def int32_array(x, name, lib):
    """Index arrays (seq_lens, page tables, cu_seqlens) given as lists / tuples of ints: an int32 numpy array (lib
    numpy) or CPU tensor (lib torch). Floats (2.5 would become 2), values past int32 (2**32 + 3 would wrap to 3) and
    ragged or nested lists are errors naming the argument."""
    if all(type(i) is int for i in x):  # the common case, checked without numpy's conversions (update() per step)
        if x and (min(x) < -2**31 or max(x) > 2**31 - 1):
            raise ValueError(f"{name} has entries from {min(x)} to {max(x)}; expected int32 values")
        if lib == "torch":
            import torch
            return torch.tensor(x, dtype=torch.int32)
        import numpy as np
        return np.array(x, dtype=np.int32)
    import numpy as np
    try:
        a = np.asarray(x)
    except (ValueError, TypeError):
        raise TypeError(f"{name} is {show(x)}; expected a flat list of ints (int32 values)") from None
    if a.size and a.dtype.kind not in "iu":
        raise TypeError(f"{name} has entries of dtype {a.dtype}; expected ints (int32 values)")
    if a.ndim != 1:
        raise ValueError(f"{name} has rank {a.ndim} (shape {list(a.shape)}); expected rank 1 (a flat list of ints)")
    if a.size and (a.min() < -2**31 or a.max() > 2**31 - 1):
        raise ValueError(f"{name} has entries from {a.min()} to {a.max()}; expected int32 values")
    a = a.astype(np.int32)
    if lib == "torch":
        import torch
        return torch.from_numpy(a)
    return a


def index_array(x, name, lib, *, optional=True):
    """An index argument (cu_seqlens, seq_lens, page tables): None (when optional), a list / tuple of ints (made an
    int32 array of lib), or an array passed as it is (numpy, or a tensor for lib torch: the native layer checks its
    dtype, rank and device). Anything else -- a string, a number, another object -- is a TypeError naming it."""
    if x is None and optional:
        return None
    if isinstance(x, (list, tuple)):
        return int32_array(x, name, lib)
    found = library(x)
    if found is not None:
        if lib == "torch" and found == "numpy" and x.dtype.kind in _NUMPY_KINDS and x.dtype.isnative:
            import torch
            return torch.from_numpy(x)  # zero-copy on the CPU
        return x
    raise TypeError(f"{name} is a {typename(x)}; expected a list of ints or an int32 array")
