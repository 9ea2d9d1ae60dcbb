#pragma once
// The Llama forward pass on a CUDA GPU (engine/cuda_ops/llama_cuda.cpp, built when CUDA is on): weights and
// activations in bf16 (or fp32 for exactness checks), fp32 residual stream and accumulation, GEMMs through cuBLASLt,
// small kernels for embedding / RMSNorm / RoPE + cache append / SwiGLU / residual adds, attention through
// flashlite::forward on device tensors (the fused kernel; the split "naive" kernels for head dims it lacks).
// Decode steps of <= 8 rows take the fused GEMVs (engine/cuda_ops/gemv.h) and flashlite::decode, replayed from CUDA
// graphs; opt-in variants and profile modes are FLASHLITE_ENGINE_* switches read when the model is built (listed at
// read_variant_switches in engine/cuda_ops/llama_cuda.cpp; docs/perf-notes.md, Engine (CUDA), Round 3).
#include <memory>

#include "engine/model.h"
#include "engine/weights.h"

namespace flashlite::engine {

std::unique_ptr<LlamaModel> create_llama_cuda(const ModelWeights& weights, const RuntimeOptions& options);

}  // namespace flashlite::engine
