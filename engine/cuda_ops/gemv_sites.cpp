#include "engine/cuda_ops/gemv_sites.h"

namespace flashlite::engine::cuda_ops {

namespace {

// y = rmsnorm(x[row_index]) W^T with the given epilogue (W: (out, dim); swiglu: (2 out, dim)).
GemvParams normed(const StepGemvs& s, const void* w, int out, const void* norm, const int32_t* row_index, int rows,
                  GemvOut epi, void* y) {
  GemvParams p;
  p.w = w;
  p.out = out;
  p.k = s.c.dim;
  p.rows = rows;
  p.in = GemvIn::rmsnorm;
  p.xf = s.x;
  p.norm_w = norm;
  p.row_index = row_index;
  p.eps = s.c.rms_eps;
  p.epi = epi;
  p.y = y;
  p.pdl = s.pdl;
  return p;
}

// x += in W^T (W: (dim, k), in: (rows, k) bf16).
GemvParams added(const StepGemvs& s, const void* w, int k, const void* in) {
  GemvParams p;
  p.w = w;
  p.out = s.c.dim;
  p.k = k;
  p.rows = s.rows;
  p.in = GemvIn::bf16;
  p.x = in;
  p.epi = s.sum ? GemvOut::sum_f32 : GemvOut::add_f32;
  p.y = s.sum_into && !s.sum ? s.sum_into : s.x;
  p.split = gemv_auto_split(p.out, k);
  p.pdl = s.pdl;
  if (s.sum) p.sum = *s.sum;
  return p;
}

int block_per_tile_at_one_row(int rows) { return rows == 1 ? kGemvBlockPerTile : 0; }

}  // namespace

bool gemv_takes(const ModelConfig& c, int rows) {
  return gemv_supported(rows, c.dim, true) && gemv_supported(rows, c.q_dim(), false) &&
         gemv_supported(rows, c.hidden_dim, false);
}

bool gemv_fuses_rope(const ModelConfig& c) { return c.head_dim % 8 == 0; }

void StepGemvs::qkv(const void* w, const void* norm, void* qkv, const GemvRope* rope) const {
  GemvParams p = normed(*this, w, c.q_dim() + 2 * c.kv_dim(), norm, nullptr, rows,
                        rope ? GemvOut::rope_bf16 : GemvOut::bf16, qkv);
  if (rope) p.rope = *rope;
  gemv(p, stream);
}

void StepGemvs::o(const void* w, const void* att) const { gemv(added(*this, w, c.q_dim(), att), stream); }

void StepGemvs::gate_up(const void* w, const void* norm, void* h) const {
  GemvParams p = normed(*this, w, c.hidden_dim, norm, nullptr, rows, GemvOut::swiglu_bf16, h);
  p.grid_blocks = block_per_tile_at_one_row(rows);
  gemv(p, stream);
}

void StepGemvs::down(const void* w, const void* h) const { gemv(added(*this, w, c.hidden_dim, h), stream); }

void StepGemvs::lm_head(const void* w, const void* norm, const int32_t* row_index, int lrows, float* logits,
                        uint64_t* argmax_keys) const {
  GemvParams p = normed(*this, w, c.vocab_size, norm, row_index, lrows,
                        argmax_keys ? GemvOut::f32_argmax : GemvOut::f32, logits);
  p.argmax_keys = argmax_keys;
  p.grid_blocks = block_per_tile_at_one_row(lrows);
  gemv(p, stream);
}

}  // namespace flashlite::engine::cuda_ops
