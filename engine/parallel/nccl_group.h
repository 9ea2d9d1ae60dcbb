#pragma once
// Tensor-parallel ranks on the GPUs of one node, one thread each in this process, summing device arrays with NCCL
// (built when CUDA and NCCL are found; otherwise create_nccl_group says so).
#include <memory>
#include <string>

#include "engine/parallel/collective.h"

namespace flashlite::engine {

// Ranks on GPUs first_device .. first_device + ranks - 1, one NCCL communicator each (ncclCommInitAll). With
// `one_shot` and peer access between every pair, small sums take the GEMV's own sum (Collective::fused_sum) or the
// one-shot kernel (Collective::sum_into; engine/parallel/one_shot.h); otherwise everything goes through NCCL. Throws
// Error when the GPUs are fewer, or NCCL fails (its own message included).
std::unique_ptr<CollectiveGroup> create_nccl_group(int first_device, int ranks, bool one_shot = true, bool pdl = true);
// "NCCL 2.28.9, one-shot kernel over NVLink", or why there is none ("no NCCL in this build").
std::string nccl_description();

}  // namespace flashlite::engine
