"""The torch custom ops flashlite::attention and flashlite::attention_out (torch.library), with fake implementations
so torch.compile can trace them and CUDA graphs can capture them.

CUDA-graph safety: the ops run on torch's current stream, allocate only through torch (outputs, the CUDA naive
backend's workspace and the fused kernels' fold space for rows past 32768 keys), and never synchronise with the
host. Varlen batches read cu_seqlens from CPU tensors; the fused kernel keeps up to 128 sequences in its launch
parameters (capturable), the naive backend copies them to the device with cudaMemcpyAsync (not capturable).
"""

from typing import List, Optional, Tuple

import torch
from torch.utils import dlpack as _dlpack

from . import _C
from . import _args
from . import _check
from ._api import _lse_shape, _native_args

Tensor = torch.Tensor


def _dl(t):
    """A DLPack capsule of a tensor: a view, no copy, and no stream handshake (torch's __dlpack__ may record an
    event on the current stream and make the default stream wait on it, which a CUDA graph capture forbids)."""
    if t is None or not isinstance(t, torch.Tensor):
        return t
    return _dlpack.to_dlpack(t.detach())


def _current_stream(device):
    """The raw cudaStream_t of torch's current stream on `device` (the private call costs ~1 us, the public
    torch.cuda.current_stream(device).cuda_stream ~5 us: it matters at one call per layer and token)."""
    try:
        return torch._C._cuda_getCurrentRawStream(device.index if device.index is not None else
                                                  torch.cuda.current_device())
    except AttributeError:  # a torch without the private binding
        return torch.cuda.current_stream(device).cuda_stream


def _run(q, k, v, out, lse, sink_logits, cu_seqlens_q, cu_seqlens_k, causal, scale, window_left, window_right,
         sink_tokens, softcap, backend):
    if q.is_cuda:
        stream = _current_stream(q.device)
        device = q.device

        def allocate(nbytes):  # a backend's workspace (forward_workspace_bytes), from torch's caching allocator
            return _dl(torch.empty(nbytes, dtype=torch.uint8, device=device))
    else:
        stream, allocate = 0, None
    try:
        _C.forward(_dl(q), _dl(k), _dl(v), _dl(out), _dl(lse), _dl(sink_logits), _dl(cu_seqlens_q),
                   _dl(cu_seqlens_k), causal=causal, scale=scale, window_left=window_left, window_right=window_right,
                   sink_tokens=sink_tokens, softcap=softcap, backend=backend, stream=stream, allocate=allocate)
    except (TypeError, ValueError, BufferError, RuntimeError) as err:  # name what DLPack / nanobind refused
        _check.explain(err, "flashlite.attention", "torch",
                       _native_args(q, k, v, out, lse, sink_logits, cu_seqlens_q, cu_seqlens_k))
        raise


@torch.library.custom_op("flashlite::attention", mutates_args=())
def attention_op(q: Tensor, k: Tensor, v: Tensor, sink_logits: Optional[Tensor], cu_seqlens_q: Optional[Tensor],
                 cu_seqlens_k: Optional[Tensor], causal: bool, scale: Optional[float], window_left: int,
                 window_right: int, sink_tokens: int, softcap: float, backend: str) -> Tuple[Tensor, Tensor]:
    """out [B, Sq, Hq, D] (q's dtype) and lse [B, Hq, Sq] fp32 for q [B, Sq, Hq, D], k/v [B, Sk, Hkv, D]."""
    return _forward(q, k, v, sink_logits, cu_seqlens_q, cu_seqlens_k, causal, scale, window_left, window_right,
                    sink_tokens, softcap, backend)


def _forward(q, k, v, sink_logits, cu_seqlens_q, cu_seqlens_k, *options):
    """(out, lse) of a forward call: the op's body, and the eager autograd path's."""
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(_lse_shape(q), dtype=torch.float32, device=q.device)
    _run(q, k, v, out, lse, sink_logits, cu_seqlens_q, cu_seqlens_k, *options)
    return out, lse


@attention_op.register_fake
def _attention_fake(q, k, v, sink_logits, cu_seqlens_q, cu_seqlens_k, causal, scale, window_left, window_right,
                    sink_tokens, softcap, backend):
    return q.new_empty(q.shape), q.new_empty(_lse_shape(q), dtype=torch.float32)


@torch.library.custom_op("flashlite::attention_out", mutates_args=("out",))
def attention_out_op(q: Tensor, k: Tensor, v: Tensor, out: Tensor, sink_logits: Optional[Tensor],
                     cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor], causal: bool,
                     scale: Optional[float], window_left: int, window_right: int, sink_tokens: int, softcap: float,
                     backend: str) -> Tensor:
    """Writes the attention into `out`; returns the fp32 LSE."""
    lse = torch.empty(_lse_shape(q), dtype=torch.float32, device=q.device)
    _run(q, k, v, out, lse, sink_logits, cu_seqlens_q, cu_seqlens_k, causal, scale, window_left, window_right,
         sink_tokens, softcap, backend)
    return lse


@attention_out_op.register_fake
def _attention_out_fake(q, k, v, out, sink_logits, cu_seqlens_q, cu_seqlens_k, causal, scale, window_left,
                        window_right, sink_tokens, softcap, backend):
    return q.new_empty(_lse_shape(q), dtype=torch.float32)


def _run_backward(q, k, v, out, lse, dout, dlse, sink_logits, cu_seqlens_q, cu_seqlens_k, causal, scale,
                  window_left, window_right, sink_tokens, softcap, backend, deterministic):
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    dsink = None if sink_logits is None else torch.empty(sink_logits.shape, dtype=torch.float32, device=q.device)
    if q.is_cuda:
        stream, device = _current_stream(q.device), q.device

        def allocate(nbytes):  # the CUDA backward's scratch, from torch's caching allocator
            return _dl(torch.empty(nbytes, dtype=torch.uint8, device=device))
    else:
        stream, allocate = 0, None
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
    """(dq, dk, dv, dsink or None) of one forward call: the backward op's body, and the eager autograd path's."""
    return _run_backward(q, k, v, out, lse, dout.contiguous(), dlse, *rest, False)


@torch.library.custom_op("flashlite::attention_backward", mutates_args=())
def attention_backward_op(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, dout: Tensor,
                          dlse: Optional[Tensor], sink_logits: Optional[Tensor], cu_seqlens_q: Optional[Tensor],
                          cu_seqlens_k: Optional[Tensor], causal: bool, scale: Optional[float], window_left: int,
                          window_right: int, sink_tokens: int, softcap: float,
                          backend: str) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dq, dk, dv, dsink_logits) of flashlite::attention for the gradients dout (and dlse) of its outputs;
    dsink_logits is empty without sink logits (an op cannot return None)."""
    dq, dk, dv, dsink = _backward(q, k, v, out, lse, dout, dlse, sink_logits, cu_seqlens_q, cu_seqlens_k, causal,
                                  scale, window_left, window_right, sink_tokens, softcap, backend)
    return dq, dk, dv, q.new_empty((0,), dtype=torch.float32) if dsink is None else dsink


@attention_backward_op.register_fake
def _attention_backward_fake(q, k, v, out, lse, dout, dlse, sink_logits, cu_seqlens_q, cu_seqlens_k, causal, scale,
                             window_left, window_right, sink_tokens, softcap, backend):
    dsink = q.new_empty((0,) if sink_logits is None else sink_logits.shape, dtype=torch.float32)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dsink


def _attention_setup_context(ctx, inputs, output):
    q, k, v, sink_logits, cu_seqlens_q, cu_seqlens_k = inputs[:6]
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, sink_logits, cu_seqlens_q, cu_seqlens_k)
    ctx.options = inputs[6:]  # causal, scale, window_left, window_right, sink_tokens, softcap, backend


def _gradients(ctx, grad_out, grad_lse, backward):
    """The autograd formula of flashlite::attention (its 13 inputs' gradients) with `backward` running the kernels:
    the backward op (traced by torch.compile) or _run_backward (eager)."""
    q, k, v, out, lse, sink_logits, cu_seqlens_q, cu_seqlens_k = ctx.saved_tensors
    if grad_out is None:  # only lse was used
        grad_out = torch.zeros_like(out)
    dq, dk, dv, dsink = backward(q, k, v, out, lse, grad_out, grad_lse, sink_logits, cu_seqlens_q, cu_seqlens_k,
                                 *ctx.options)
    return (dq, dk, dv, dsink if ctx.needs_input_grad[3] and sink_logits is not None else None) + (None,) * 9


def _attention_backward(ctx, grad_out, grad_lse):
    return _gradients(ctx, grad_out, grad_lse, attention_backward_op)


attention_op.register_autograd(_attention_backward, setup_context=_attention_setup_context)


class _Attention(torch.autograd.Function):
    """flashlite::attention and its autograd formula without the custom ops' dispatch, for eager calls that autograd
    records (the dispatch of a Python custom op costs ~65 us of host time per call, more than the kernels of a small
    layer): the same kernels forward and backward, the same saved tensors and gradients. torch.compile traces the op."""

    @staticmethod
    def forward(ctx, q, k, v, sink_logits, cu_seqlens_q, cu_seqlens_k, *options):
        out, lse = _forward(q, k, v, sink_logits, cu_seqlens_q, cu_seqlens_k, *options)
        _attention_setup_context(ctx, (q, k, v, sink_logits, cu_seqlens_q, cu_seqlens_k, *options), (out, lse))
        ctx.set_materialize_grads(False)  # an unused output's gradient stays None, as the op's formula expects
        return out, lse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out, grad_lse):
        return _gradients(ctx, grad_out, grad_lse, _backward)

# flashlite.decode / prefill and attention(out=...) stay forward-only.
BACKWARD_ERROR = ("is forward-only: gradients cannot flow through it. Run it under torch.no_grad() / "
                  "torch.inference_mode() or on detached inputs; to train, call flashlite.attention (without out=), "
                  "which is differentiable.")


def needs_grad(*tensors):
    """Whether autograd would record a call on these tensors (None entries allowed)."""
    return torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in tensors)


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


def _check_no_grad_for_out(q, k, v, sink_logits):
    """out= writes into a caller's tensor, which autograd cannot record (torch's own out= functions refuse the same
    way): with grad mode on and an input that requires grad, say so rather than return a result without a grad_fn."""
    if needs_grad(q, k, v, sink_logits):
        raise RuntimeError("flashlite.attention(out=...) does not support automatic differentiation, but an input "
                           "requires grad: flashlite.attention(out=...) " + BACKWARD_ERROR)


def _as_tensor(x, name):
    """sink_logits: a tensor, or a numpy array (viewed as a CPU tensor, zero-copy); a list or a number is refused
    (float32 is not guessed from Python values)."""
    if x is None or isinstance(x, torch.Tensor):
        return x
    if _check.library(x) is not None:
        try:
            return torch.as_tensor(x)
        except Exception:  # noqa: BLE001  (e.g. a numpy object array)
            pass
    raise TypeError(f"{name} is a {_check.typename(x)}; expected a torch.Tensor (float32 [q_heads])")


def _index_tensor(x, name):
    """cu_seqlens: a tensor, a numpy array (zero-copy) or a list / tuple of ints (checked, made int32)."""
    if x is None or isinstance(x, torch.Tensor):
        return x
    return _check.index_array(x, name, "torch")


def attention(q, k, v, *, causal=False, scale=None, window=(-1, -1), sink_tokens=0, sink_logits=None, softcap=0.0,
              cu_seqlens_q=None, cu_seqlens_k=None, return_lse=False, backend="auto", out=None):
    """flashlite.attention for torch tensors, written so torch.compile traces it whole (fullgraph=True): it only
    checks argument types and calls the custom ops torch.ops.flashlite.attention / attention_out -- or, in eager
    mode with nothing for autograd to record, the same kernel call directly (the op's dispatch costs more host time
    than the kernel at decode sizes). Differentiable: when an input requires grad the result comes from the op, whose
    autograd formula runs flashlite's backward (gradients for q, k, v and sink_logits); out= with such inputs raises
    RuntimeError at once (autograd cannot record a write into a caller's tensor)."""
    for name, t in (("q", q), ("k", k), ("v", v), ("out", out)):
        if t is not None and not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} is a {_check.typename(t)}; expected a torch.Tensor (pass tensors of one "
                            "library)")
    if return_lse is not True and return_lse is not False:
        return_lse = _args.flag(return_lse, "return_lse")
    args = (_as_tensor(sink_logits, "sink_logits"), _index_tensor(cu_seqlens_q, "cu_seqlens_q"),
            _index_tensor(cu_seqlens_k, "cu_seqlens_k"),
            *_args.options(causal, scale, window, sink_tokens, softcap, backend))
    if out is not None:
        _check_no_grad_for_out(q, k, v, args[0])
    # Eager calls skip the custom ops' dispatch (~65 us of host time): the kernel directly when autograd records
    # nothing, else the same formula as an autograd.Function. torch.compile (and tensor subclasses) see the ops.
    eager = _eager(q, k, v)
    if eager and out is None and needs_grad(q, k, v, args[0]):
        out, lse = _Attention.apply(q, k, v, *args)
    elif eager and not needs_grad(q, k, v, args[0]):
        if out is None:
            out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        lse = torch.empty(_lse_shape(q), dtype=torch.float32, device=q.device)
        _run(q, k, v, out, lse, *args)
    elif out is None:
        out, lse = attention_op(q, k, v, *args)
    else:
        lse = attention_out_op(q, k, v, out, *args)
    return (out, lse) if return_lse else out


def _eager(q, k, v):
    """Whether this is an eager call on plain tensors: not while torch.compile traces (it must see the ops), and not
    for tensor subclasses (fake, functional), which go through the ops."""
    if torch.compiler.is_compiling():
        return False
    return all(type(t) is torch.Tensor for t in (q, k, v))
