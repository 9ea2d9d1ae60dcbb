"""The torch custom ops flashlite::attention, flashlite::attention_out and flashlite::attention_backward, with fake
implementations so torch.compile can trace them and CUDA graphs can capture them, and flashlite.attention for torch
tensors (its eager calls take the op when its kernels are C++, else skip the op's dispatch).

The ops are defined with torch.library.Library, not torch.library.custom_op: custom_op wraps every call in Python
layers (an autograd wrapper that redispatches, a backend wrapper that checks aliasing) which cost more host time than
the kernel of a small call. The kernels of flashlite::attention and flashlite::attention_backward, and their
Autograd-key kernels, are C++ (flashlite/_torch_C, python/src/torch_ops.cpp) when the build found the torch that runs
(NATIVE_OPS); otherwise the Python kernels below serve, with the same behaviour: on plain CPU / CUDA tensors with
nothing for autograd to record the kernel runs at once; fake and functional tensors and dispatch modes (torch.compile's
tracing) get the op below autograd, as custom_op does; recorded calls get the autograd formula.

CUDA-graph safety: the ops run on torch's current stream, allocate through torch (outputs and the workspace
forward_workspace_bytes() asks for: the CUDA naive backend's scores, the fused kernels' fold space for rows past 32768
keys, and under capture the Hopper kernel's 4-byte tile counter for causal / window / varlen calls, which outside a
capture the library allocates stream-ordered for less host time; so a capture holds no memory node), and never
synchronise with the host. Varlen batches read cu_seqlens from CPU tensors; the fused kernel keeps up to 128
sequences in its launch parameters (capturable), the naive backend copies them to the device with cudaMemcpyAsync
(not capturable).
"""

import pathlib
import warnings

import torch
from torch.utils import dlpack as _dlpack

from . import _C
from . import _args
from . import _check
from ._api import _lse_shape, _native_args

Tensor = torch.Tensor
_to_dlpack = _dlpack.to_dlpack
try:  # the raw cudaStream_t of torch's current stream on a device index (~1 us; the public API ~5 us)
    _raw_stream = torch._C._cuda_getCurrentRawStream
except AttributeError:  # a torch without the private binding (or without CUDA)
    def _raw_stream(index):
        return torch.cuda.current_stream(index).cuda_stream


def _dl(t):
    """A DLPack capsule of a tensor: a view, no copy, and no stream handshake (torch's __dlpack__ may record an
    event on the current stream and make the default stream wait on it, which a CUDA graph capture forbids).
    None and non-tensors (a numpy cu_seqlens) pass as they are."""
    if t is None or not isinstance(t, Tensor):
        return t
    return _to_dlpack(t.detach() if t.requires_grad else t)  # detach only when needed: it costs as much as the capsule


def _current_stream(device):
    """The raw cudaStream_t of torch's current stream on `device`."""
    return _raw_stream(device.index if device.index is not None else torch.cuda.current_device())


_ALLOCATORS = {}  # CUDA device index -> its allocate(nbytes), made once


def _allocator(index):
    """allocate(nbytes) for a backend's scratch on CUDA device `index`, from torch's caching allocator (so a CUDA
    graph captures it)."""
    allocate = _ALLOCATORS.get(index)
    if allocate is None:
        device = torch.device("cuda", index)

        def allocate(nbytes):
            return _dl(torch.empty(nbytes, dtype=torch.uint8, device=device))
        _ALLOCATORS[index] = allocate
    return allocate


def _stream_and_allocator(q):
    if q.is_cuda:
        index = q.get_device()
        return _raw_stream(index), _allocator(index)
    return 0, None


def _run(q, k, v, out, lse, sink_logits, cu_seqlens_q, cu_seqlens_k, causal, scale, window_left, window_right,
         sink_tokens, softcap, backend, heads_first=False):
    """The native call. heads_first: q, k, v and out in SDPA's [B, H, S, D] (any strides, head_dim contiguous), whose
    seq and head dimensions the native layer swaps, so the SDPA drop-in transposes nothing."""
    stream, allocate = _stream_and_allocator(q)
    try:
        _C.forward(_dl(q), _dl(k), _dl(v), _dl(out), _dl(lse), _dl(sink_logits), _dl(cu_seqlens_q),
                   _dl(cu_seqlens_k), causal=causal, scale=scale, window_left=window_left, window_right=window_right,
                   sink_tokens=sink_tokens, softcap=softcap, backend=backend, stream=stream, allocate=allocate,
                   heads_first=heads_first)
    except (TypeError, ValueError, BufferError, RuntimeError) as err:  # name what DLPack / nanobind refused
        _check.explain(err, "flashlite.attention", "torch",
                       _native_args(q, k, v, out, lse, sink_logits, cu_seqlens_q, cu_seqlens_k))
        raise


def _new_heads_first(q):
    """An empty [B, H, S, D] tensor of q's dtype and device laid out as [B, S, H, D] (the transpose of a contiguous
    one), for q [B, H, S, D]: new_empty_strided, ~half the host time of torch.empty(...).transpose(1, 2)."""
    b, h, s, d = q.shape
    if q.layout is torch.strided:
        return q.new_empty_strided((b, h, s, d), (s * h * d, d, h * d, 1))
    return torch.empty(b, s, h, d, dtype=q.dtype, device=q.device).transpose(1, 2)  # the native call refuses q


def _new_like(x):
    """An empty contiguous tensor of x's shape, dtype and device (empty_like: ~half the host time of
    torch.empty(x.shape, ...)); a sparse x gets a dense one, and the kernel call then refuses x by name."""
    if x.layout is torch.strided:
        return torch.empty_like(x, memory_format=torch.contiguous_format)
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def _new_lse(q):
    """An fp32 LSE of _lse_shape(q) on q's device (torch.empty of ints: faster than of a tuple or torch.Size)."""
    shape = q.shape
    if len(shape) != 4:
        return torch.empty(0, dtype=torch.float32, device=q.device)
    return torch.empty(shape[0], shape[2], shape[1], dtype=torch.float32, device=q.device)


def _forward(q, k, v, sink_logits, cu_seqlens_q, cu_seqlens_k, *options):
    """(out, lse) of a forward call: the op's kernel, and the eager paths'."""
    out = _new_like(q)
    lse = _new_lse(q)
    _run(q, k, v, out, lse, sink_logits, cu_seqlens_q, cu_seqlens_k, *options)
    return out, lse


def _attention_out(q, k, v, out, sink_logits, cu_seqlens_q, cu_seqlens_k, *options):
    """Writes the attention into `out`; returns the fp32 LSE (the kernel of flashlite::attention_out)."""
    lse = _new_lse(q)
    _run(q, k, v, out, lse, sink_logits, cu_seqlens_q, cu_seqlens_k, *options)
    torch.autograd.graph.increment_version(out)  # written behind torch's back: autograd's checks must see it
    return lse


def _run_backward(q, k, v, out, lse, dout, dlse, sink_logits, cu_seqlens_q, cu_seqlens_k, causal, scale,
                  window_left, window_right, sink_tokens, softcap, backend, deterministic):
    dq, dk, dv = _new_like(q), _new_like(k), _new_like(v)
    dsink = None if sink_logits is None else torch.empty(sink_logits.shape, dtype=torch.float32, device=q.device)
    stream, allocate = _stream_and_allocator(q)
    try:
        _C.backward(_dl(q), _dl(k), _dl(v), _dl(out), _dl(lse), _dl(dout), _dl(dlse), _dl(dq), _dl(dk), _dl(dv),
                    _dl(dsink), _dl(sink_logits), _dl(cu_seqlens_q), _dl(cu_seqlens_k), causal=causal, scale=scale,
                    window_left=window_left, window_right=window_right, sink_tokens=sink_tokens, softcap=softcap,
                    backend=backend, stream=stream, deterministic=deterministic, allocate=allocate)
    except (TypeError, ValueError, BufferError, RuntimeError) as err:
        _check.explain(err, "flashlite.attention (backward)", "torch",
                       _native_args(q, k, v, out, lse, sink_logits, cu_seqlens_q, cu_seqlens_k))
        raise
    return dq, dk, dv, dsink


def _backward(q, k, v, out, lse, dout, dlse, *rest):
    """(dq, dk, dv, dsink or None) of one forward call: the eager autograd path's backward."""
    return _run_backward(q, k, v, out, lse, dout.contiguous(), dlse, *rest, False)


def _attention_backward(q, k, v, out, lse, dout, dlse, sink_logits, *rest):
    """The kernel of flashlite::attention_backward: dsink_logits is empty without sink logits (an op cannot return
    None)."""
    dq, dk, dv, dsink = _backward(q, k, v, out, lse, dout, dlse, sink_logits, *rest)
    return dq, dk, dv, q.new_empty((0,), dtype=torch.float32) if dsink is None else dsink


# --- the ops -------------------------------------------------------------------------------------------------------
# Schemas as torch.library.custom_op inferred them before (graphs and checkpoints that name the ops keep working).
_lib = torch.library.Library("flashlite", "DEF")  # module-level: the registrations live as long as the module
_TENSORS = "Tensor? sink_logits, Tensor? cu_seqlens_q, Tensor? cu_seqlens_k"
_OPTIONS = ("bool causal, float? scale, SymInt window_left, SymInt window_right, SymInt sink_tokens, float softcap, "
            "str backend")
_PT2 = (torch.Tag.pt2_compliant_tag,)
_lib.define(f"attention(Tensor q, Tensor k, Tensor v, {_TENSORS}, {_OPTIONS}) -> (Tensor, Tensor)", tags=_PT2)
# (a3!): out is written in place; the alias set's name is custom_op's (argument 3), so the schema reads the same.
_lib.define(f"attention_out(Tensor q, Tensor k, Tensor v, Tensor(a3!) out, {_TENSORS}, {_OPTIONS}) -> Tensor",
            tags=_PT2)
_lib.define(f"attention_backward(Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor dout, Tensor? dlse, "
            f"{_TENSORS}, {_OPTIONS}) -> (Tensor, Tensor, Tensor, Tensor)", tags=_PT2)
attention_op = torch.ops.flashlite.attention.default  # out [B, Sq, Hq, D] (q's dtype), lse [B, Hq, Sq] fp32
attention_out_op = torch.ops.flashlite.attention_out.default  # writes out; returns lse
attention_backward_op = torch.ops.flashlite.attention_backward.default  # (dq, dk, dv, dsink_logits or empty)


def _load_native_ops():
    """Loads flashlite/_torch_C (the C++ kernels and autograd of attention and attention_backward) when the build
    made it for this torch (its version in _torch_C.version); True when loaded. A build without torch made none: the
    Python kernels serve, silently. A library built for another torch is never loaded (its ABI may differ), and one
    that fails to load is not used: the Python kernels serve, with a warning saying why and how to get the C++ ones."""
    here = pathlib.Path(__file__).parent
    try:
        built_for = (here / "_torch_C.version").read_text().strip()
    except OSError:
        return False
    lib = here / "_torch_C.so"
    if built_for != torch.__version__:
        why = f"{lib.name} was built for torch {built_for}, this is torch {torch.__version__}"
    else:
        try:
            torch.ops.load_library(str(lib))
            return True
        except OSError as err:
            why = f"{lib} failed to load ({err})"
    warnings.warn(f"flashlite: {why}; the torch ops run their Python kernels (the same results, more host time per "
                  "call). Rebuild flashlite against this torch (pip install --no-build-isolation) for the C++ ones.",
                  RuntimeWarning, stacklevel=2)
    return False


NATIVE_OPS = _load_native_ops()
if not NATIVE_OPS:
    _lib.impl("attention", _forward, "CompositeExplicitAutograd")
    _lib.impl("attention_backward", _attention_backward, "CompositeExplicitAutograd")
_lib.impl("attention_out", _attention_out, "CompositeExplicitAutograd")


@torch.library.register_fake("flashlite::attention", lib=_lib)
def _attention_fake(q, k, v, sink_logits, cu_seqlens_q, cu_seqlens_k, causal, scale, window_left, window_right,
                    sink_tokens, softcap, backend):
    return q.new_empty(q.shape), q.new_empty(_lse_shape(q), dtype=torch.float32)


@torch.library.register_fake("flashlite::attention_out", lib=_lib)
def _attention_out_fake(q, k, v, out, sink_logits, cu_seqlens_q, cu_seqlens_k, causal, scale, window_left,
                        window_right, sink_tokens, softcap, backend):
    return q.new_empty(_lse_shape(q), dtype=torch.float32)


@torch.library.register_fake("flashlite::attention_backward", lib=_lib)
def _attention_backward_fake(q, k, v, out, lse, dout, dlse, sink_logits, cu_seqlens_q, cu_seqlens_k, causal, scale,
                             window_left, window_right, sink_tokens, softcap, backend):
    dsink = q.new_empty((0,) if sink_logits is None else sink_logits.shape, dtype=torch.float32)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dsink


# --- autograd --------------------------------------------------------------------------------------------------------

def _setup_context(ctx, tensors, options, output):
    """Saves what the backward needs. tensors: (q, k, v, sink_logits, cu_seqlens_q, cu_seqlens_k); options: causal,
    scale, window_left, window_right, sink_tokens, softcap, backend."""
    out, lse = output
    ctx.save_for_backward(*tensors[:3], out, lse, *tensors[3:])
    ctx.options = options


def _gradients(ctx, grad_out, grad_lse, backward, sink_needs_grad):
    """(dq, dk, dv, dsink_logits or None): the autograd formula of flashlite::attention with `backward` running the
    kernels: the backward op (the op's formula, which torch.compile traces) or _backward (eager)."""
    q, k, v, out, lse, sink_logits, cu_seqlens_q, cu_seqlens_k = ctx.saved_tensors
    if grad_out is None:  # only lse was used
        grad_out = torch.zeros_like(out)
    dq, dk, dv, dsink = backward(q, k, v, out, lse, grad_out, grad_lse, sink_logits, cu_seqlens_q, cu_seqlens_k,
                                 *ctx.options)
    return dq, dk, dv, dsink if sink_needs_grad and sink_logits is not None else None


class _Attention(torch.autograd.Function):
    """flashlite.attention's eager calls that autograd records: the kernels forward and backward, without the op's
    dispatch. The options come as one tuple: each argument of apply() costs ~0.15 us."""

    @staticmethod
    def forward(ctx, q, k, v, sink_logits, cu_seqlens_q, cu_seqlens_k, options):
        out, lse = _forward(q, k, v, sink_logits, cu_seqlens_q, cu_seqlens_k, *options)
        _setup_context(ctx, (q, k, v, sink_logits, cu_seqlens_q, cu_seqlens_k), options, (out, lse))
        ctx.set_materialize_grads(False)  # an unused output's gradient stays None, as the formula expects
        return out, lse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out, grad_lse):
        grads = _gradients(ctx, grad_out, grad_lse, _backward, ctx.needs_input_grad[3])
        return grads + (None,) * 3  # q, k, v, sink_logits; cu_seqlens_q, cu_seqlens_k, options


_AFTER_AUTOGRAD = torch._C._after_autograd_keyset
# A call's dispatch keys below ADInplaceOrView, as raw bits (an int test costs a fifth of DispatchKeySet methods):
# CPU or CUDA alone means plain tensors and no mode, nothing between autograd and the kernel.
_BELOW_INPLACE_BITS = torch._C._after_ADInplaceOrView_keyset.raw_repr()
_PLAIN_BITS = frozenset(torch._C.DispatchKeySet(key).raw_repr()
                        for key in (torch._C.DispatchKey.CPU, torch._C.DispatchKey.CUDA))


def _plain(keyset):
    """Whether a call with these dispatch keys may run the kernel at once instead of the op below autograd (fake and
    functional tensors and dispatch modes, i.e. torch.compile's tracing, must get the op)."""
    return keyset.raw_repr() & _BELOW_INPLACE_BITS in _PLAIN_BITS


def _redispatch(op, keyset, args):
    """The op below autograd (what it runs when autograd records nothing)."""
    with torch._C._AutoDispatchBelowAutograd():
        return op.redispatch(keyset & _AFTER_AUTOGRAD, *args)


class _AttentionOp(torch.autograd.Function):
    """flashlite::attention as autograd records it (what register_autograd would generate): the op below autograd
    (or the kernel, on plain tensors) forward, the backward op backward, so torch.compile traces both."""

    @staticmethod
    def forward(ctx, keyset, q, k, v, sink_logits, cu_seqlens_q, cu_seqlens_k, options):
        tensors = (q, k, v, sink_logits, cu_seqlens_q, cu_seqlens_k)
        if _plain(keyset):
            out, lse = _forward(*tensors, *options)
        else:
            out, lse = _redispatch(attention_op, keyset, tensors + options)
        _setup_context(ctx, tensors, options, (out, lse))
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        grads = _gradients(ctx, grad_out, grad_lse, attention_backward_op, ctx.needs_input_grad[4])
        return (None,) + grads + (None,) * 3  # keyset; q, k, v, sink_logits; cu_seqlens_q, cu_seqlens_k, options


def _record_attention(keyset, q, k, v, sink_logits, cu_seqlens_q, cu_seqlens_k, *options):
    return _AttentionOp.apply(keyset, q, k, v, sink_logits, cu_seqlens_q, cu_seqlens_k, options)


class _NoDoubleBackward(torch.autograd.Function):
    """flashlite::attention_backward as autograd records it (create_graph=True): its outputs' backward raises."""

    @staticmethod
    def forward(ctx, keyset, *args):
        return _redispatch(attention_backward_op, keyset, args)

    @staticmethod
    def backward(ctx, *grads):
        raise NotImplementedError("flashlite::attention_backward has no backward: flashlite.attention is "
                                  "differentiable once (no double backward)")


def _refuse_out_grad(keyset, *args):
    raise RuntimeError("flashlite::attention_out does not support automatic differentiation, but an input requires "
                       "grad: flashlite.attention(out=...) " + BACKWARD_ERROR)


def _autograd_kernel(op, kernel, recorded, grad_inputs):
    """The op's Autograd-key kernel. When autograd records the call (an input at `grad_inputs` requires grad):
    recorded(keyset, *args). Else on plain CPU / CUDA tensors `kernel` at once, skipping a second trip through the
    dispatcher (the op's dispatch costs more host time than a small call's kernel); else the op below autograd."""
    def autograd_kernel(keyset, *args):
        if torch.is_grad_enabled():
            for i in grad_inputs:
                if getattr(args[i], "requires_grad", False):
                    return recorded(keyset, *args)
        if _plain(keyset):
            return kernel(*args)
        return _redispatch(op, keyset, args)
    return autograd_kernel


if not NATIVE_OPS:
    _lib.impl("attention", _autograd_kernel(attention_op, _forward, _record_attention, (0, 1, 2, 3)), "Autograd",
              with_keyset=True)
    _lib.impl("attention_backward", _autograd_kernel(attention_backward_op, _attention_backward,
                                                     _NoDoubleBackward.apply, range(8)), "Autograd", with_keyset=True)
_lib.impl("attention_out", _autograd_kernel(attention_out_op, _attention_out, _refuse_out_grad, (0, 1, 2, 3, 4)),
          "Autograd", with_keyset=True)


# --- autocast ---------------------------------------------------------------------------------------------------------
# Under torch.autocast, flashlite.attention runs in the autocast dtype, as SDPA does (torch's "lower precision" list):
# q, k and v in float32 (or the other 16-bit type) are cast to it, so mixed inputs -- a Llama's rotated q and k in
# float32 beside its bfloat16 v under mixed-precision training -- work, and the gradients flow back through the casts.
# sink_logits stay float32 (the kernels take them so) and cu_seqlens are integers. Eager calls cast in
# flashlite.attention itself (they skip the dispatcher); the op gets it from an Autocast kernel. A call with out= runs
# as given, as torch's out= functions do.
_any_autocast = getattr(torch._C, "_is_any_autocast_enabled", None) or (
    lambda: torch.is_autocast_enabled("cuda") or torch.is_autocast_enabled("cpu"))


def _autocast_cast(t, dtype):
    """t in the autocast dtype when autocast would cast it: floating, not float64 (as torch's cast policy)."""
    if t.dtype != dtype and t.is_floating_point() and t.dtype != torch.float64:
        return t.to(dtype)
    return t


def autocast_inputs(q, k, v):
    """(q, k, v) as an eager call under torch.autocast for their device runs them: in the autocast dtype."""
    if _any_autocast():
        device_type = q.device.type  # flashlite's devices (autocast refuses to be asked about e.g. "meta")
        if device_type in ("cpu", "cuda") and torch.is_autocast_enabled(device_type):
            dtype = torch.get_autocast_dtype(device_type)
            return _autocast_cast(q, dtype), _autocast_cast(k, dtype), _autocast_cast(v, dtype)
    return q, k, v


def _autocast_kernel(op, device_type):
    """The op's Autocast kernel for `device_type`: q, k, v (its first three arguments) cast to the autocast dtype,
    then the op with autocast excluded (what torch.library.register_autocast does, with the dtype autocast was
    entered with instead of one fixed at registration)."""
    key = torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, "Autocast" + device_type.upper()))

    def autocast_kernel(keyset, q, k, v, *rest):
        dtype = torch.get_autocast_dtype(device_type)
        with torch._C._ExcludeDispatchKeyGuard(key):
            return op(_autocast_cast(q, dtype), _autocast_cast(k, dtype), _autocast_cast(v, dtype), *rest)
    return autocast_kernel


for _device_type in ("cpu", "cuda"):  # attention_out runs as given, as torch's out= functions do under autocast
    _lib.impl("attention", _autocast_kernel(attention_op, _device_type), "Autocast" + _device_type.upper(),
              with_keyset=True)


# --- flashlite.attention for torch tensors ---------------------------------------------------------------------------
# flashlite.decode / prefill and attention(out=...) stay forward-only.
BACKWARD_ERROR = ("is forward-only: gradients cannot flow through it. Run it under torch.no_grad() / "
                  "torch.inference_mode() or on detached inputs; to train, call flashlite.attention (without out=), "
                  "which is differentiable.")


def eager_plain(q, k, v):
    """Whether a call may skip the op's dispatch: plain tensors (not fake or functional subclasses), outside
    torch.compile, which must see the ops."""
    return type(q) is Tensor and type(k) is Tensor and type(v) is Tensor and not torch.compiler.is_compiling()


def needs_grad(*tensors):
    """Whether autograd would record a call on these tensors (None entries allowed)."""
    if torch.is_grad_enabled():
        for t in tensors:
            if getattr(t, "requires_grad", False):
                return True
    return False


class _ForwardOnly(torch.autograd.Function):
    """Runs run() (a forward-only flashlite call, grad mode off inside) so that its outputs carry a grad_fn whose
    backward raises, instead of coming back silently detached: flashlite.decode / prefill with inputs that require
    grad."""

    @staticmethod
    def forward(ctx, what, run, *tensors):
        ctx.what = what
        return run()

    @staticmethod
    def backward(ctx, *grads):
        raise NotImplementedError(f"{ctx.what} {BACKWARD_ERROR}")


def forward_only(what, run, *tensors):
    """run()'s result, recorded by autograd as a function of `tensors` that has no backward (see _ForwardOnly)."""
    return _ForwardOnly.apply(what, run, *tensors)


def _as_tensor(x, name):
    """sink_logits: a tensor, or a numpy array (viewed as a CPU tensor, zero-copy); a list or a number is refused
    (float32 is not guessed from Python values)."""
    if x is None or isinstance(x, Tensor):
        return x
    if _check.library(x) is not None:
        try:
            return torch.as_tensor(x)
        except Exception:  # noqa: BLE001  (e.g. a numpy object array)
            pass
    raise TypeError(f"{name} is a {_check.typename(x)}; expected a torch.Tensor (float32 [q_heads])")


def _index_tensor(x, name):
    """cu_seqlens: a tensor, a numpy array (zero-copy) or a list / tuple of ints (checked, made int32)."""
    if x is None or isinstance(x, Tensor):
        return x
    return _check.index_array(x, name, "torch")


def _refuse_non_tensors(**arrays):
    """The TypeError for an argument that is not a tensor (off the hot path)."""
    for name, t in arrays.items():
        if t is not None and not isinstance(t, Tensor):
            raise TypeError(f"{name} is a {_check.typename(t)}; expected a torch.Tensor (pass tensors of one "
                            "library)")


def attention(q, k, v, *, causal=False, scale=None, window=(-1, -1), sink_tokens=0, sink_logits=None, softcap=0.0,
              cu_seqlens_q=None, cu_seqlens_k=None, return_lse=False, backend="auto", out=None):
    """flashlite.attention for torch tensors, written so torch.compile traces it whole (fullgraph=True): it only
    checks argument types and calls the custom ops torch.ops.flashlite.attention / attention_out -- or, in eager
    mode, the same kernels without the op's dispatch. Differentiable: when an input requires grad the result's
    autograd formula runs flashlite's backward (gradients for q, k, v and sink_logits); out= with such inputs raises
    RuntimeError at once (autograd cannot record a write into a caller's tensor)."""
    if not (isinstance(q, Tensor) and isinstance(k, Tensor) and isinstance(v, Tensor)
            and (out is None or isinstance(out, Tensor))):
        _refuse_non_tensors(q=q, k=k, v=v, out=out)
    if return_lse is not True and return_lse is not False:
        return_lse = _args.flag(return_lse, "return_lse")
    out, lse = _attention_checked(q, k, v, out, _as_tensor(sink_logits, "sink_logits"),
                                  _index_tensor(cu_seqlens_q, "cu_seqlens_q"),
                                  _index_tensor(cu_seqlens_k, "cu_seqlens_k"),
                                  _args.options(causal, scale, window, sink_tokens, softcap, backend), return_lse)
    return (out, lse) if return_lse else out


def _on_cpu_or_cuda(*tensors):
    """Whether every tensor given (None entries allowed) is in CPU or CUDA memory."""
    for t in tensors:
        if t is not None and not (t.is_cuda or t.is_cpu):
            return False
    return True


def _attention_checked(q, k, v, out, sink_logits, cu_seqlens_q, cu_seqlens_k, options, want_lse):
    """(out, lse) for checked arguments (options: _args.options's tuple); lse may be None when not wanted.
    flashlite.attention's and the SDPA drop-in's common path."""
    if out is not None and needs_grad(q, k, v, sink_logits):
        # out= writes into a caller's tensor, which autograd cannot record (torch's own out= functions refuse the
        # same way): say so rather than return a result without a grad_fn.
        raise RuntimeError("flashlite.attention(out=...) does not support automatic differentiation, but an input "
                           "requires grad: flashlite.attention(out=...) " + BACKWARD_ERROR)
    if eager_plain(q, k, v):
        if out is None:  # with out= the call runs as given (torch's out= functions are not autocast either)
            q, k, v = autocast_inputs(q, k, v)
            # The op's C++ kernels and autograd: less host time than either path below. (A meta tensor would take
            # the op's fake and pass; the paths below name its device.)
            if NATIVE_OPS and _on_cpu_or_cuda(q, k, v, sink_logits, cu_seqlens_q, cu_seqlens_k):
                return attention_op(q, k, v, sink_logits, cu_seqlens_q, cu_seqlens_k, *options)
        if needs_grad(q, k, v, sink_logits):
            return _Attention.apply(q, k, v, sink_logits, cu_seqlens_q, cu_seqlens_k, options)
        lse = _new_lse(q) if want_lse else None  # the kernels skip the LSE when given none
        if out is None:
            out = _new_like(q)
            _run(q, k, v, out, lse, sink_logits, cu_seqlens_q, cu_seqlens_k, *options)
        else:
            _run(q, k, v, out, lse, sink_logits, cu_seqlens_q, cu_seqlens_k, *options)
            torch.autograd.graph.increment_version(out)
        return out, lse
    if out is None:
        return attention_op(q, k, v, sink_logits, cu_seqlens_q, cu_seqlens_k, *options)
    return out, attention_out_op(q, k, v, out, sink_logits, cu_seqlens_q, cu_seqlens_k, *options)
