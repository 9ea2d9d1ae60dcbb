// flashlite._C: the nanobind bridge from Python array objects (anything with DLPack or the buffer protocol: torch,
// numpy, cupy, jax) to flashlite::forward. Arrays are viewed in place (no copies); flashlite::Error kinds become
// ValueError / TypeError / RuntimeError with the same message. The Python package (flashlite/__init__.py) allocates
// outputs and picks the stream; this layer only converts and calls.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "flashlite/attention.h"
#include "flashlite/backward.h"
#include "flashlite/errors.h"
#include "flashlite/tensor.h"
#include "flashlite/version.h"
#include "bridge_common.h"
#include "views.h"

namespace nb = nanobind;
using namespace flashlite;

namespace {

using py::backend_allocates;
using py::InArray;
using py::OutArray;
using py::opt_view;
using py::to_view;

// The arguments of one call, as Python passes them (keyword names match flashlite.attention's).
ForwardArgs make_args(const InArray& q, const InArray& k, const InArray& v, const OutArray& out,
                      const std::optional<OutArray>& lse, const std::optional<InArray>& sink_logits,
                      const std::optional<InArray>& cu_seqlens_q, const std::optional<InArray>& cu_seqlens_k,
                      bool causal, std::optional<double> scale, int window_left, int window_right, int sink_tokens,
                      double softcap, const std::string& backend, uintptr_t stream) {
  ForwardArgs a;
  a.q = to_view(q, "q");
  a.k = to_view(k, "k");
  a.v = to_view(v, "v");
  a.out = to_view(out, "out");
  a.lse = opt_view(lse, "lse");
  a.options = py::mask_options(causal, scale, window_left, window_right, sink_tokens, softcap);
  a.options.sink_logits = opt_view(sink_logits, "sink_logits");
  a.options.cu_seqlens_q = opt_view(cu_seqlens_q, "cu_seqlens_q");
  a.options.cu_seqlens_k = opt_view(cu_seqlens_k, "cu_seqlens_k");
  a.backend = parse_backend(backend);
  a.stream = reinterpret_cast<void*>(stream);
  return a;
}

#define FL_PY_PARAMS                                                                                           \
  const InArray &q, const InArray &k, const InArray &v, const OutArray &out, const std::optional<OutArray> &lse, \
      const std::optional<InArray> &sink_logits, const std::optional<InArray> &cu_seqlens_q,                   \
      const std::optional<InArray> &cu_seqlens_k, bool causal, std::optional<double> scale, int window_left,   \
      int window_right, int sink_tokens, double softcap, const std::string &backend, uintptr_t stream
#define FL_PY_ARGS                                                                                              \
  q, k, v, out, lse, sink_logits, cu_seqlens_q, cu_seqlens_k, causal, scale, window_left, window_right, sink_tokens, \
      softcap, backend, stream
#define FL_PY_ARG_NAMES                                                                                         \
  nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("lse").none(), nb::arg("sink_logits").none(), \
      nb::arg("cu_seqlens_q").none(), nb::arg("cu_seqlens_k").none(), nb::arg("causal"), nb::arg("scale").none(), \
      nb::arg("window_left"), nb::arg("window_right"), nb::arg("sink_tokens"), nb::arg("softcap"),              \
      nb::arg("backend"), nb::arg("stream")

// A workspace array must live on the tensors' device.
void check_on_device(const OutArray& w, Device dev, const char* what) {
  if (dev.type == DeviceType::cuda && (w.device_type() != nb::device::cuda::value || w.device_id() != dev.index)) {
    throw Error(ErrorKind::invalid_value, std::string(what) + " is not on " + device_name(dev) +
                                              "; the workspace must live on the tensors' device");
  }
}

// Scratch of `bytes` from `allocate(nbytes)` (e.g. torch's caching allocator, so CUDA graphs can capture the call),
// kept alive in `hold` until the launches are queued; sets workspace / workspace_bytes of args. Nothing when bytes is 0
// or there is no allocator (the backend then allocates itself, cudaMallocAsync).
template <class Args>
void attach_allocated(Args& a, size_t bytes, nb::object allocate, Device dev, std::optional<OutArray>& hold) {
  if (bytes == 0 || allocate.is_none()) return;
  hold = nb::cast<OutArray>(allocate(bytes));
  check_on_device(*hold, dev, "the allocated workspace");
  a.workspace = hold->data();
  a.workspace_bytes = hold->nbytes();
}

// A 4-D view of SDPA's [batch, heads, seq, head_dim] as flashlite's [batch, seq, heads, head_dim]: dimensions 1 and 2
// swapped, strides with them (a transpose of the view; no copy, the API takes any batch / seq / head strides).
void swap_seq_and_heads(TensorView& t) {
  if (t.rank != 4) return;  // validation names the rank
  std::swap(t.shape[1], t.shape[2]);
  std::swap(t.strides[1], t.strides[2]);
}

// Runs the attention. Scratch memory (the CUDA naive backend's; the fused kernels' for rows past 32768 keys; the
// Hopper kernel's tile counter) comes from `workspace` (a byte array on the device) when given, else from `allocate`
// (attach_allocated), except a small one outside graph capture (backend_allocates). heads_first: q, k, v and out come
// as [batch, heads, seq, head_dim] (the SDPA drop-in's tensors, which then need no transpose in Python); lse is
// [batch, q_heads, seq_q] either way.
void py_forward(FL_PY_PARAMS, const std::optional<OutArray>& workspace, nb::object allocate, bool heads_first) {
  ForwardArgs a = make_args(FL_PY_ARGS);
  if (heads_first) {
    for (TensorView* t : {&a.q, &a.k, &a.v, &a.out}) swap_seq_and_heads(*t);
  }
  std::optional<OutArray> allocated;
  if (workspace) {
    check_on_device(*workspace, a.q.device, "workspace");
    a.workspace = workspace->data();
    a.workspace_bytes = workspace->nbytes();
  } else if (!allocate.is_none()) {
    const size_t bytes = forward_workspace_bytes(a);
    if (!backend_allocates(bytes, a.q.device, a.stream)) attach_allocated(a, bytes, allocate, a.q.device, allocated);
  }
  nb::gil_scoped_release release;
  forward(a);
}

// The backward of one call: the forward's arguments (q, k, v, out, lse, options) plus dout (and dlse) in, dq, dk, dv
// (and dsink_logits) written in place. Scratch memory as py_forward's.
void py_backward(const InArray& q, const InArray& k, const InArray& v, const InArray& out, const InArray& lse,
                 const InArray& dout, const std::optional<InArray>& dlse, const OutArray& dq, const OutArray& dk,
                 const OutArray& dv, const std::optional<OutArray>& dsink_logits,
                 const std::optional<InArray>& sink_logits, const std::optional<InArray>& cu_seqlens_q,
                 const std::optional<InArray>& cu_seqlens_k, bool causal, std::optional<double> scale, int window_left,
                 int window_right, int sink_tokens, double softcap, const std::string& backend, uintptr_t stream,
                 bool deterministic, nb::object allocate) {
  BackwardArgs a;
  a.q = to_view(q, "q");
  a.k = to_view(k, "k");
  a.v = to_view(v, "v");
  a.out = to_view(out, "out");
  a.lse = to_view(lse, "lse");
  a.dout = to_view(dout, "dout");
  a.dlse = opt_view(dlse, "dlse");
  a.dq = to_view(dq, "dq");
  a.dk = to_view(dk, "dk");
  a.dv = to_view(dv, "dv");
  a.dsink_logits = opt_view(dsink_logits, "dsink_logits");
  a.options = py::mask_options(causal, scale, window_left, window_right, sink_tokens, softcap);
  a.options.sink_logits = opt_view(sink_logits, "sink_logits");
  a.options.cu_seqlens_q = opt_view(cu_seqlens_q, "cu_seqlens_q");
  a.options.cu_seqlens_k = opt_view(cu_seqlens_k, "cu_seqlens_k");
  a.backend = parse_backend(backend);
  a.stream = reinterpret_cast<void*>(stream);
  a.deterministic = deterministic;
  std::optional<OutArray> allocated;
  if (!allocate.is_none()) attach_allocated(a, backward_workspace_bytes(a), allocate, a.q.device, allocated);
  nb::gil_scoped_release release;
  backward(a);
}

void translate(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (const Error& e) {
    PyObject* type = e.kind() == ErrorKind::invalid_value  ? PyExc_ValueError
                     : e.kind() == ErrorKind::invalid_type ? PyExc_TypeError
                                                           : PyExc_RuntimeError;
    PyErr_SetString(type, e.what());
  }
}

}  // namespace

namespace flashlite::py {
void bind_kv(nb::module_& m);  // kv.cpp
}

NB_MODULE(_C, m) {
  m.doc() = "flashlite native module (see the flashlite package)";
  nb::register_exception_translator(translate);
  m.attr("__version__") = version();
  m.attr("with_cuda") = bool(FLASHLITE_WITH_CUDA);

  m.def("forward", &py_forward, FL_PY_ARG_NAMES, nb::arg("workspace").none() = nb::none(),
        nb::arg("allocate").none() = nb::none(), nb::arg("heads_first") = false,
        "Validates the arguments and runs flashlite::forward in place (heads_first: q, k, v, out are [batch, heads, "
        "seq, head_dim]).");
  m.def(
      "workspace_bytes", [](FL_PY_PARAMS) { return forward_workspace_bytes(make_args(FL_PY_ARGS)); }, FL_PY_ARG_NAMES,
      "Bytes of scratch memory the chosen backend needs (forward_workspace_bytes; 0 on CPU). Validates the arguments.");
  m.def(
      "kernel_name", [](FL_PY_PARAMS) { return forward_kernel_name(make_args(FL_PY_ARGS)); }, FL_PY_ARG_NAMES,
      "Which kernel forward() would run for these arguments. Validates the arguments.");
  m.def(
      "reference_f64",
      [](FL_PY_PARAMS, OutArray out64, std::optional<OutArray> lse64) {
        ForwardArgs a = make_args(FL_PY_ARGS);
        a.backend = Backend::reference;
        (void)forward_kernel_name(a);  // validates q/k/v/out first, so their errors come before ours
        // Contiguous float64 CPU arrays of exactly the oracle's sizes (q's shape; [q.shape[0], q_heads, q.shape[1]]).
        const auto check64 = [](const OutArray& x, const char* name, size_t numel) {
          size_t expect_stride = 1;
          bool contiguous = true;
          for (size_t i = x.ndim(); i-- > 0;) {
            if (x.shape(i) > 1 && size_t(x.stride(i)) != expect_stride) contiguous = false;
            expect_stride *= x.shape(i);
          }
          if (x.dtype() != nb::dtype<double>() || x.device_type() != nb::device::cpu::value || !contiguous ||
              x.size() != numel) {
            throw Error(ErrorKind::invalid_type, std::string(name) + " must be a contiguous float64 CPU array of " +
                                                     std::to_string(numel) + " elements");
          }
        };
        const size_t rows = size_t(a.q.shape[0] * a.q.shape[1] * a.q.shape[2]);
        check64(out64, "out64", rows * size_t(a.q.shape[3]));
        if (lse64) check64(*lse64, "lse64", rows);
        nb::gil_scoped_release release;
        reference_forward_f64(a, static_cast<double*>(out64.data()), lse64 ? static_cast<double*>(lse64->data()) : nullptr);
      },
      FL_PY_ARG_NAMES, nb::arg("out64"), nb::arg("lse64").none(),
      "The float64 oracle on CPU arrays: writes contiguous out64 shaped like q and lse64 [batch, q_heads, seq_q].");
  m.def("backward", &py_backward, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("lse"),
        nb::arg("dout"), nb::arg("dlse").none(), nb::arg("dq"), nb::arg("dk"), nb::arg("dv"),
        nb::arg("dsink_logits").none(), nb::arg("sink_logits").none(), nb::arg("cu_seqlens_q").none(),
        nb::arg("cu_seqlens_k").none(), nb::arg("causal"), nb::arg("scale").none(), nb::arg("window_left"),
        nb::arg("window_right"), nb::arg("sink_tokens"), nb::arg("softcap"), nb::arg("backend"), nb::arg("stream"),
        nb::arg("deterministic") = false, nb::arg("allocate").none() = nb::none(),
        "Validates the arguments and runs flashlite::backward, writing dq, dk, dv (and dsink_logits) in place.");
  py::bind_kv(m);
}
