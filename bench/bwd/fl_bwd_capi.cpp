// A C entry point to flashlite::backward with a forced kernel, for bench/bwd/side_by_side.py (ctypes): the CUDA
// backward families (mma.sync, Hopper) timed beside torch's on the same tensors in one process, whichever the planner
// would pick. Bench-only; the Python package is the product's binding.
#include <cstdint>
#include <cstdio>
#include <exception>

#include "flashlite/backward.h"

namespace {
char g_error[512];
}

extern "C" {

// q, out, dout, dq: (batch, seq_q, q_heads, head_dim) contiguous; k, v, dk, dv: (batch, seq_k, kv_heads, head_dim);
// lse (batch, q_heads, seq_q) fp32 as forward wrote it; dtype 1 = fp16, 2 = bf16; kernel 0 = the planner's choice,
// 1 = mma.sync, 2 = Hopper. Returns 0, or -1 with fl_last_error() set.
int fl_backward(void* q, void* k, void* v, void* out, float* lse, void* dout, void* dq, void* dk, void* dv, int dtype,
                int batch, int seq_q, int seq_k, int q_heads, int kv_heads, int head_dim, int causal, int window_left,
                int sink_tokens, int kernel, void* stream) {
  using namespace flashlite;
  try {
    const DType t = dtype == 1 ? DType::f16 : DType::bf16;
    const Device dev = Device::cuda(0);
    const auto rows_q = [&](void* p) { return TensorView::contiguous(p, t, dev, {batch, seq_q, q_heads, head_dim}); };
    const auto rows_k = [&](void* p) { return TensorView::contiguous(p, t, dev, {batch, seq_k, kv_heads, head_dim}); };
    BackwardArgs a;
    a.q = rows_q(q), a.k = rows_k(k), a.v = rows_k(v), a.out = rows_q(out), a.dout = rows_q(dout);
    a.lse = TensorView::contiguous(lse, DType::f32, dev, {batch, q_heads, seq_q});
    a.dq = rows_q(dq), a.dk = rows_k(dk), a.dv = rows_k(dv);
    a.options.causal = causal != 0;
    a.options.window_left = window_left;
    a.options.sink_tokens = sink_tokens;
    a.backend = Backend::cuda;
    a.stream = stream;
    BackwardOverrides o;
    if (kernel == 1) o.kernel = BackwardKernel::cuda_mma;
    if (kernel == 2) o.kernel = BackwardKernel::cuda_hopper;
    backward(a, o);
    return 0;
  } catch (const std::exception& e) {
    std::snprintf(g_error, sizeof(g_error), "%s", e.what());
    return -1;
  }
}

const char* fl_last_error() { return g_error; }
}
