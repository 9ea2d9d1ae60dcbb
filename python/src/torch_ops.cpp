// flashlite/_torch_C: the C++ kernels of the torch custom ops flashlite::attention and flashlite::attention_backward
// (CompositeExplicitAutograd: the forward and backward on CPU / CUDA tensors) and their Autograd-key kernels (a C++
// autograd function). flashlite/_torch_ops.py defines the ops' schemas, their fake implementations (torch.compile),
// their Autocast kernels and flashlite::attention_out, then loads this library when it was built against the torch
// that runs (CMake writes that torch's version beside it: _torch_C.version); otherwise it registers its Python
// kernels instead. The reason for C++ is host time: a call through the Python kernels cost 21.5 us against SDPA's
// 17.1 on the H100 machine, and one that autograd records 30.6 against 21.1 (a Python autograd.Function alone costs
// ~6 us). Errors are flashlite's, raised as ValueError / TypeError /
// RuntimeError with the same messages as the Python path.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros_like.h>
#include <c10/util/Exception.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "flashlite/attention.h"
#include "flashlite/backward.h"
#include "flashlite/errors.h"
#include "flashlite/tensor.h"
#include "bridge_common.h"

#if FLASHLITE_WITH_CUDA && FLASHLITE_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

namespace {

using flashlite::Device;
using flashlite::DType;
using flashlite::Error;
using flashlite::ErrorKind;
using flashlite::TensorView;
using at::Tensor;
using OptTensor = std::optional<Tensor>;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// A flashlite Error as the torch exception Python sees as ValueError / TypeError / RuntimeError, message unchanged.
[[noreturn]] void rethrow(const Error& e) {
  if (e.kind() == ErrorKind::invalid_value) TORCH_CHECK_VALUE(false, e.what());
  if (e.kind() == ErrorKind::invalid_type) TORCH_CHECK_TYPE(false, e.what());
  TORCH_CHECK(false, e.what());
}

// A dtype as DLPack (and so the Python path's messages) names it: float64, int64, bool, complex64, ...
std::string dtype_name(const Tensor& t) {
  const at::ScalarType s = t.scalar_type();
  const std::string bits = std::to_string(8 * t.element_size());
  if (s == at::kBool) return "bool";
  if (s == at::kBFloat16) return "bfloat16";
  if (at::isComplexType(s)) return "complex" + bits;
  if (at::isFloatingType(s)) return "float" + bits;
  return (at::isSignedType(s) ? "int" : "uint") + bits;
}

// A layout as Python names it.
std::string layout_name(c10::Layout layout) {
  switch (layout) {
    case c10::kSparse: return "torch.sparse_coo";
    case c10::kSparseCsr: return "torch.sparse_csr";
    case c10::kSparseCsc: return "torch.sparse_csc";
    case c10::kSparseBsr: return "torch.sparse_bsr";
    case c10::kSparseBsc: return "torch.sparse_bsc";
    case c10::kMkldnn: return "torch._mkldnn";
    case c10::kJagged: return "torch.jagged";
    default: return "non-strided";
  }
}

// A tensor's view for flashlite (no copy): dtype, device, shape and element strides; the refusals name the argument
// as flashlite/_check.py does for the DLPack path.
TensorView view(const Tensor& t, const char* name) {
  if (t.device().type() != c10::DeviceType::CPU && t.device().type() != c10::DeviceType::CUDA) {
    throw flashlite::py::device_error(name, t.device().str());
  }
  if (t.layout() != c10::kStrided) {
    throw Error(ErrorKind::invalid_type, std::string(name) + " is a " + layout_name(t.layout()) +
                                             " tensor; expected a dense (torch.strided) tensor");
  }
  if (t.is_neg() || t.is_conj()) {
    throw Error(ErrorKind::invalid_type, std::string(name) + " has its negative or conjugate bit set; call "
                                             "resolve_neg() / resolve_conj() on it first");
  }
  TensorView v;
  switch (t.scalar_type()) {
    case at::kFloat: v.dtype = DType::f32; break;
    case at::kHalf: v.dtype = DType::f16; break;
    case at::kBFloat16: v.dtype = DType::bf16; break;
    case at::kInt: v.dtype = DType::i32; break;
    default: throw flashlite::py::dtype_error(name, dtype_name(t));
  }
  v.device = t.is_cuda() ? Device::cuda(t.get_device()) : Device::cpu();
  flashlite::py::check_rank(t.dim(), name);
  v.data = t.data_ptr();
  v.rank = int(t.dim());
  for (int i = 0; i < v.rank; ++i) {
    v.shape[size_t(i)] = t.size(i);
    v.strides[size_t(i)] = t.stride(i);
  }
  return v;
}

TensorView opt_view(const OptTensor& t, const char* name) { return t && t->defined() ? view(*t, name) : TensorView{}; }

// The options every op takes after its tensors, as the schema lists them.
struct Options {
  bool causal = false;
  std::optional<double> scale;
  int64_t window_left = -1, window_right = -1, sink_tokens = 0;
  double softcap = 0.0;
  std::string backend;
};

// An option the API takes as an int (the op's schema: any int64).
int narrow(int64_t x, const char* name) {
  if (x < INT32_MIN || x > INT32_MAX) {
    throw Error(ErrorKind::invalid_value, std::string(name) + " is " + std::to_string(x) + "; expected an int32 value");
  }
  return int(x);
}

flashlite::AttentionOptions attention_options(const Options& o, const OptTensor& sink_logits, const OptTensor& cu_q,
                                              const OptTensor& cu_k) {
  flashlite::AttentionOptions a = flashlite::py::mask_options(o.causal, o.scale, narrow(o.window_left, "window_left"),
                                                              narrow(o.window_right, "window_right"),
                                                              narrow(o.sink_tokens, "sink_tokens"), o.softcap);
  a.sink_logits = opt_view(sink_logits, "sink_logits");
  a.cu_seqlens_q = opt_view(cu_q, "cu_seqlens_q");
  a.cu_seqlens_k = opt_view(cu_k, "cu_seqlens_k");
  return a;
}

// torch's current stream on q's device (CUDA), else null.
void* current_stream(const Tensor& q) {
#if FLASHLITE_WITH_CUDA && FLASHLITE_TORCH_CUDA
  if (q.is_cuda()) return c10::cuda::getCurrentCUDAStream(q.get_device()).stream();
#endif
  (void)q;
  return nullptr;
}

// Scratch of `bytes` from torch's caching allocator (so a CUDA graph captures it), except a small one outside a
// capture, which the backend allocates itself (backend_allocates); `hold` keeps it until the launches are queued.
template <class Args>
void attach_scratch(Args& a, size_t bytes, const Tensor& like, Tensor& hold, bool small_to_backend) {
  if (bytes == 0 || (small_to_backend && flashlite::py::backend_allocates(bytes, a.q.device, a.stream))) return;
  hold = at::empty({int64_t(bytes)}, like.options().dtype(at::kByte));
  a.workspace = hold.data_ptr();
  a.workspace_bytes = bytes;
}

// ---------------------------------------------------------------------------------------------------------- kernels

// What both ops' arguments share: q, k, v, the options, the stream.
template <class Args>
void set_inputs(Args& a, const Tensor& q, const Tensor& k, const Tensor& v, const OptTensor& sink_logits,
                const OptTensor& cu_q, const OptTensor& cu_k, const Options& o) {
  a.q = view(q, "q");
  a.k = view(k, "k");
  a.v = view(v, "v");
  a.options = attention_options(o, sink_logits, cu_q, cu_k);
  a.backend = flashlite::parse_backend(o.backend);
  a.stream = current_stream(q);
}

std::tuple<Tensor, Tensor> attention_kernel(const Tensor& q, const Tensor& k, const Tensor& v,
                                            const OptTensor& sink_logits, const OptTensor& cu_q, const OptTensor& cu_k,
                                            const Options& o) {
  try {
    flashlite::ForwardArgs a;
    set_inputs(a, q, k, v, sink_logits, cu_q, cu_k, o);
    // out like q, contiguous; lse [batch, q_heads, seq_q] (varlen: [1, q_heads, total_q]), empty for other ranks
    // (validation then names q's rank)
    Tensor out = at::empty_like(q, at::MemoryFormat::Contiguous);
    Tensor lse = q.dim() == 4 ? at::empty({q.size(0), q.size(2), q.size(1)}, q.options().dtype(at::kFloat))
                              : at::empty({0}, q.options().dtype(at::kFloat));
    a.out = view(out, "out");
    a.lse = view(lse, "lse");
    Tensor scratch;
    attach_scratch(a, flashlite::forward_workspace_bytes(a), q, scratch, true);
    flashlite::forward(a);
    return {std::move(out), std::move(lse)};
  } catch (const Error& e) {
    rethrow(e);
  }
}

std::tuple<Tensor, Tensor, Tensor, Tensor> attention_backward_kernel(
    const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse, const Tensor& dout,
    const OptTensor& dlse, const OptTensor& sink_logits, const OptTensor& cu_q, const OptTensor& cu_k,
    const Options& o) {
  try {
    flashlite::BackwardArgs a;
    set_inputs(a, q, k, v, sink_logits, cu_q, cu_k, o);
    a.out = view(out, "out");
    a.lse = view(lse, "lse");
    const Tensor dout_c = dout.contiguous();
    a.dout = view(dout_c, "dout");
    a.dlse = opt_view(dlse, "dlse");
    Tensor dq = at::empty_like(q, at::MemoryFormat::Contiguous);
    Tensor dk = at::empty_like(k, at::MemoryFormat::Contiguous);
    Tensor dv = at::empty_like(v, at::MemoryFormat::Contiguous);
    // dsink_logits: fp32 like sink_logits; empty without them (an op cannot return None)
    const bool sinks = sink_logits && sink_logits->defined();
    Tensor dsink = at::empty(sinks ? sink_logits->sizes() : at::IntArrayRef{0}, q.options().dtype(at::kFloat));
    a.dq = view(dq, "dq");
    a.dk = view(dk, "dk");
    a.dv = view(dv, "dv");
    if (sinks) a.dsink_logits = view(dsink, "dsink_logits");
    Tensor scratch;
    attach_scratch(a, flashlite::backward_workspace_bytes(a), q, scratch, false);
    flashlite::backward(a);
    return {std::move(dq), std::move(dk), std::move(dv), std::move(dsink)};
  } catch (const Error& e) {
    rethrow(e);
  }
}

// The schemas' trailing options. SymInt: concrete on real tensors; a symbolic one (torch.compile tracing a window
// made from a shape) is specialised, as the Python kernels' int() did.
#define FL_OPTION_PARAMS                                                                                 \
  bool causal, std::optional<double> scale, c10::SymInt window_left, c10::SymInt window_right,               \
      c10::SymInt sink_tokens, double softcap, c10::string_view backend
#define FL_OPTIONS                                                                                                  \
  Options {                                                                                                         \
    causal, scale, window_left.guard_int(__FILE__, __LINE__), window_right.guard_int(__FILE__, __LINE__),           \
        sink_tokens.guard_int(__FILE__, __LINE__), softcap, std::string(backend)                                    \
  }
#define FL_OPTION_ARGS(o)                                                                                            \
  o.causal, o.scale, c10::SymInt(o.window_left), c10::SymInt(o.window_right), c10::SymInt(o.sink_tokens), o.softcap, \
      c10::string_view(o.backend)

std::tuple<Tensor, Tensor> attention_composite(const Tensor& q, const Tensor& k, const Tensor& v,
                                               const OptTensor& sink_logits, const OptTensor& cu_q,
                                               const OptTensor& cu_k, FL_OPTION_PARAMS) {
  return attention_kernel(q, k, v, sink_logits, cu_q, cu_k, FL_OPTIONS);
}

std::tuple<Tensor, Tensor, Tensor, Tensor> attention_backward_composite(
    const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse, const Tensor& dout,
    const OptTensor& dlse, const OptTensor& sink_logits, const OptTensor& cu_q, const OptTensor& cu_k,
    FL_OPTION_PARAMS) {
  return attention_backward_kernel(q, k, v, out, lse, dout, dlse, sink_logits, cu_q, cu_k, FL_OPTIONS);
}

// ------------------------------------------------------------------------------------------ the ops, by dispatcher

using AttentionSig = std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, const OptTensor&,
                                                const OptTensor&, const OptTensor&, bool, std::optional<double>,
                                                c10::SymInt, c10::SymInt, c10::SymInt, double, c10::string_view);
using BackwardSig = std::tuple<Tensor, Tensor, Tensor, Tensor>(
    const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const OptTensor&,
    const OptTensor&, const OptTensor&, const OptTensor&, bool, std::optional<double>, c10::SymInt, c10::SymInt,
    c10::SymInt, double, c10::string_view);

const c10::TypedOperatorHandle<AttentionSig>& attention_op() {
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("flashlite::attention", "").typed<AttentionSig>();
  return op;
}
const c10::TypedOperatorHandle<BackwardSig>& backward_op() {
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("flashlite::attention_backward", "").typed<BackwardSig>();
  return op;
}

// The op below autograd: the kernel on plain tensors; fake and functional tensors and dispatch modes (torch.compile's
// tracing) get theirs.
std::tuple<Tensor, Tensor> call_attention(const Tensor& q, const Tensor& k, const Tensor& v, const OptTensor& sink,
                                          const OptTensor& cu_q, const OptTensor& cu_k, const Options& o) {
  at::AutoDispatchBelowADInplaceOrView below;
  return attention_op().call(q, k, v, sink, cu_q, cu_k, FL_OPTION_ARGS(o));
}

std::tuple<Tensor, Tensor, Tensor, Tensor> call_backward(const Tensor& q, const Tensor& k, const Tensor& v,
                                                         const Tensor& out, const Tensor& lse, const Tensor& dout,
                                                         const OptTensor& dlse, const OptTensor& sink,
                                                         const OptTensor& cu_q, const OptTensor& cu_k,
                                                         const Options& o) {
  at::AutoDispatchBelowADInplaceOrView below;
  return backward_op().call(q, k, v, out, lse, dout, dlse, sink, cu_q, cu_k, FL_OPTION_ARGS(o));
}

// ------------------------------------------------------------------------------------------------------- autograd

OptTensor defined_or_none(const Tensor& t) { return t.defined() ? OptTensor(t) : std::nullopt; }

bool requires_grad(const OptTensor& t) { return t && t->defined() && t->requires_grad(); }

// flashlite::attention as autograd records it: the op below autograd forward, the backward op backward (so
// torch.compile traces both). Gradients for q, k, v and sink_logits; an unused output's gradient stays undefined
// (materialize_grads off): only lse used means dout = 0, only out used means no dlse term.
class AttentionFunction : public torch::autograd::Function<AttentionFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                               const OptTensor& sink, const OptTensor& cu_q, const OptTensor& cu_k,
                               const Options& o) {
    auto [out, lse] = call_attention(q, k, v, sink, cu_q, cu_k, o);
    ctx->save_for_backward({q, k, v, out, lse, sink.value_or(Tensor()), cu_q.value_or(Tensor()),
                            cu_k.value_or(Tensor())});
    ctx->saved_data["causal"] = o.causal;
    ctx->saved_data["scale"] = o.scale ? c10::IValue(*o.scale) : c10::IValue();
    ctx->saved_data["window"] = std::vector<int64_t>{o.window_left, o.window_right, o.sink_tokens};
    ctx->saved_data["softcap"] = o.softcap;
    ctx->saved_data["backend"] = o.backend;
    ctx->set_materialize_grads(false);
    return {out, lse};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list s = ctx->get_saved_variables();
    const std::vector<int64_t> w = ctx->saved_data["window"].toIntVector();
    const c10::IValue& scale = ctx->saved_data["scale"];
    const Options o{ctx->saved_data["causal"].toBool(), scale.isNone() ? std::nullopt : std::optional(scale.toDouble()),
                    w[0], w[1], w[2], ctx->saved_data["softcap"].toDouble(),
                    ctx->saved_data["backend"].toStringRef()};
    const Tensor& out = s[3];
    const Tensor dout = grads[0].defined() ? grads[0] : at::zeros_like(out);
    // Through autograd: grad mode is on here only under create_graph=True, and then the backward op records a
    // function whose own backward raises (no double backward).
    auto [dq, dk, dv, dsink] =
        backward_op().call(s[0], s[1], s[2], out, s[4], dout, defined_or_none(grads[1]), defined_or_none(s[5]),
                           defined_or_none(s[6]), defined_or_none(s[7]), FL_OPTION_ARGS(o));
    const bool sink_grad = s[5].defined() && ctx->needs_input_grad(3);
    return {dq, dk, dv, sink_grad ? dsink : Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

std::tuple<Tensor, Tensor> attention_autograd(const Tensor& q, const Tensor& k, const Tensor& v,
                                              const OptTensor& sink_logits, const OptTensor& cu_q,
                                              const OptTensor& cu_k, FL_OPTION_PARAMS) {
  const Options o = FL_OPTIONS;
  if (at::GradMode::is_enabled() &&
      (q.requires_grad() || k.requires_grad() || v.requires_grad() || requires_grad(sink_logits))) {
    variable_list r = AttentionFunction::apply(q, k, v, sink_logits, cu_q, cu_k, o);
    return {std::move(r[0]), std::move(r[1])};
  }
  return call_attention(q, k, v, sink_logits, cu_q, cu_k, o);
}

// flashlite::attention_backward as autograd records it (create_graph=True): its outputs' backward raises.
class NoDoubleBackward : public torch::autograd::Function<NoDoubleBackward> {
 public:
  static variable_list forward(AutogradContext*, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                               const Tensor& lse, const Tensor& dout, const OptTensor& dlse, const OptTensor& sink,
                               const OptTensor& cu_q, const OptTensor& cu_k, const Options& o) {
    auto [dq, dk, dv, dsink] = call_backward(q, k, v, out, lse, dout, dlse, sink, cu_q, cu_k, o);
    return {dq, dk, dv, dsink};
  }
  static variable_list backward(AutogradContext*, variable_list) {
    TORCH_CHECK_NOT_IMPLEMENTED(false, "flashlite::attention_backward has no backward: flashlite.attention is "
                                       "differentiable once (no double backward)");
  }
};

std::tuple<Tensor, Tensor, Tensor, Tensor> attention_backward_autograd(
    const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse, const Tensor& dout,
    const OptTensor& dlse, const OptTensor& sink_logits, const OptTensor& cu_q, const OptTensor& cu_k,
    FL_OPTION_PARAMS) {
  const Options o = FL_OPTIONS;
  if (at::GradMode::is_enabled()) {
    for (const OptTensor& t : {OptTensor(q), OptTensor(k), OptTensor(v), OptTensor(out), OptTensor(lse),
                               OptTensor(dout), dlse, sink_logits}) {
      if (requires_grad(t)) {
        variable_list r = NoDoubleBackward::apply(q, k, v, out, lse, dout, dlse, sink_logits, cu_q, cu_k, o);
        return {std::move(r[0]), std::move(r[1]), std::move(r[2]), std::move(r[3])};
      }
    }
  }
  return call_backward(q, k, v, out, lse, dout, dlse, sink_logits, cu_q, cu_k, o);
}

}  // namespace

// The schemas are flashlite/_torch_ops.py's (defined before this library loads).
TORCH_LIBRARY_IMPL(flashlite, CompositeExplicitAutograd, m) {
  m.impl("attention", TORCH_FN(attention_composite));
  m.impl("attention_backward", TORCH_FN(attention_backward_composite));
}

TORCH_LIBRARY_IMPL(flashlite, Autograd, m) {
  m.impl("attention", TORCH_FN(attention_autograd));
  m.impl("attention_backward", TORCH_FN(attention_backward_autograd));
}
