#pragma once
// Tensor-parallel ranks on the GPUs of one node, one thread each in this process, summing device arrays with NCCL
// (built when CUDA and NCCL are found; otherwise create_nccl_group says so).
#include <memory>

#include "engine/parallel/collective.h"

namespace flashlite::engine {

// Ranks on GPUs first_device .. first_device + ranks - 1, one NCCL communicator each (ncclCommInitAll). Throws Error
// when the GPUs are fewer, or NCCL fails (its own message included).
std::unique_ptr<CollectiveGroup> create_nccl_group(int first_device, int ranks);

}  // namespace flashlite::engine
