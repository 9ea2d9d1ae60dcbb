// The CUDA split-kernel ("naive") backend is not written yet (issue 3). Until it is, asking for it on CUDA tensors
// is a clear error rather than a link failure or a silent fallback.
#include "backends.h"
#include "flashlite/errors.h"

namespace flashlite {

size_t cuda_naive_workspace_bytes(const AttentionProblem&) { return 0; }

void run_cuda_naive(const AttentionProblem&, void*, void*, size_t) {
  throw Error(ErrorKind::invalid_value,
              "backend 'naive' on CUDA tensors is not available in this build yet; use backend 'cuda' (fused) or CPU tensors");
}

}  // namespace flashlite
