// A CUDA build without NCCL: tensor parallelism on GPUs is unavailable, and says so.
#include "engine/errors.h"
#include "engine/parallel/nccl_group.h"

namespace flashlite::engine {

std::unique_ptr<CollectiveGroup> create_nccl_group(int, int ranks, bool, bool) {
  fail("tensor parallelism over " + std::to_string(ranks) +
       " GPUs needs NCCL, and this flashlite was built without it (nccl.h and libnccl from the CUDA toolkit or the "
       "nvidia-nccl package)");
}

std::string nccl_description() { return "no NCCL in this build: --tp on GPUs is unavailable"; }

}  // namespace flashlite::engine
