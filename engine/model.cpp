#include "engine/model.h"

#include "engine/errors.h"
#include "engine/llama_cpu.h"
#if FLASHLITE_ENGINE_CUDA
#include "engine/llama_cuda.h"
#endif

namespace flashlite::engine {

std::unique_ptr<LlamaModel> create_model(const ModelWeights& weights, const RuntimeOptions& options,
                                         const std::string& device) {
  if (device == "cpu") {
    if (options.precision != "auto" && options.precision != "fp32") {
      fail("precision '" + options.precision + "' is unavailable on the CPU; the CPU path computes in fp32");
    }
    return std::make_unique<LlamaCpu>(weights, options);
  }
  if (device == "cuda") {
#if FLASHLITE_ENGINE_CUDA
    return create_llama_cuda(weights, options);
#else
    fail("device 'cuda': this flashlite was built without CUDA; use --device cpu");
#endif
  }
  fail("device '" + device + "' is unknown; expected cpu or cuda");
}

}  // namespace flashlite::engine
