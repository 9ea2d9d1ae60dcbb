// A C entry point to flashlite::forward for bench/fwd/side_by_side.py (ctypes), so that flashlite and torch SDPA are
// timed in one process on the same tensors. Bench-only; the Python package is the product's binding.
#include <cstdint>
#include <cstdio>
#include <exception>

#include "flashlite/attention.h"

namespace {
char g_error[512];
}

extern "C" {

// q/out: (batch, seq_q, q_heads, head_dim) contiguous; k/v: (batch, seq_k, kv_heads, head_dim); lse optional
// (batch, q_heads, seq_q) fp32; dtype 1 = fp16, 2 = bf16; ctas: ForwardOverrides::persistent_ctas (0: the planner's).
// Returns 0, or -1 with fl_last_error() set.
int fl_forward(void* q, void* k, void* v, void* out, float* lse, int dtype, int batch, int seq_q, int seq_k,
               int q_heads, int kv_heads, int head_dim, int causal, int window_left, int sink_tokens, int ctas,
               void* stream) {
  using namespace flashlite;
  try {
    const DType t = dtype == 1 ? DType::f16 : DType::bf16;
    const Device dev = Device::cuda(0);
    ForwardArgs a;
    a.q = TensorView::contiguous(q, t, dev, {batch, seq_q, q_heads, head_dim});
    a.k = TensorView::contiguous(k, t, dev, {batch, seq_k, kv_heads, head_dim});
    a.v = TensorView::contiguous(v, t, dev, {batch, seq_k, kv_heads, head_dim});
    a.out = TensorView::contiguous(out, t, dev, {batch, seq_q, q_heads, head_dim});
    if (lse) a.lse = TensorView::contiguous(lse, DType::f32, dev, {batch, q_heads, seq_q});
    a.options.causal = causal != 0;
    a.options.window_left = window_left;
    a.options.sink_tokens = sink_tokens;
    a.backend = Backend::cuda;
    a.stream = stream;
    ForwardPlan plan;
    if (ctas != 0) {  // a plan only when the override asks for one (forward() plans again under it)
      plan = plan_forward(a, {ForwardKernel::automatic, ctas});
      a.plan = &plan;
    }
    forward(a);
    return 0;
  } catch (const std::exception& e) {
    std::snprintf(g_error, sizeof(g_error), "%s", e.what());
    return -1;
  }
}

const char* fl_last_error() { return g_error; }
}
