#pragma once
// The Llama forward pass on a CUDA GPU (engine/cuda_ops/llama_cuda.cpp, built when CUDA is on): weights and
// activations in bf16 (or fp32 for exactness checks), fp32 residual stream and accumulation, GEMMs through cuBLASLt,
// small kernels for embedding / RMSNorm / RoPE + cache append / SwiGLU / residual adds, attention through
// flashlite::forward on device tensors (the fused kernel; the split "naive" kernels for head dims it lacks).
// Decode steps of <= 8 rows take the fused GEMVs (engine/cuda_ops/gemv_sites.h) and flashlite::decode, replayed from
// CUDA graphs; RuntimeOptions::cuda (CudaEngineOptions) turns graphs, GEMVs or PDL off and the profiler on.
#include <memory>

#include "engine/model.h"
#include "engine/weights.h"

namespace flashlite::engine {

class Collective;
// With `collective`, one tensor-parallel rank over its shard of the weights (engine/parallel/parallel_model.h).
std::unique_ptr<LlamaModel> create_llama_cuda(const ModelWeights& weights, const RuntimeOptions& options,
                                             Collective* collective = nullptr);

}  // namespace flashlite::engine
