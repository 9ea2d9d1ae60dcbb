#pragma once
// Entry points of the KV-cache backends (CPU in src/cpu/kv_*.cpp, CUDA in src/cuda/kv and src/cuda/decode) and the
// pieces of validation / planning shared by src/kv/*.cpp. Each backend receives a validated problem and trusts it.
#include <cstddef>
#include <cstdint>
#include <string>

#include "cuda/decode/decode_timeline.h"  // cuda_decode_set_timeline (diagnostic builds)
#include "kv/kv_problem.h"

namespace flashlite {

// ---------------------------------------------------------------- validation (src/kv/kv_validate.cpp)
AppendProblem validate_append(const AppendArgs& args);
// stand_ins: args.q / args.out only stand in for a ragged prefill's shapes (validate_prefill checks the real views'
// overlaps itself; the stand-ins' addresses mean nothing, e.g. for empty arrays that share one address).
DecodeProblem validate_decode(const DecodeArgs& args, bool stand_ins = false);

// ---------------------------------------------------------------- planning (src/kv/kv_plan.cpp)

// Keys a decode step may have to visit for a sequence of `kv_len` tokens under the mask (window + sinks bound it).
int64_t decode_visible_keys_bound(const MaskParams& mask, int64_t q_len, int64_t kv_len);

// Split count for `units` independent (sequence, kv head, row chunk) work items of at most `max_keys` keys each,
// on `slots` resident blocks (SMs x blocks per SM), tiles of `tile_keys` keys: minimises waves x (tiles per split +
// a fixed per-block cost). Pure function (tested on the CPU).
int choose_num_splits(int64_t units, int64_t max_keys, int64_t slots, int tile_keys, int max_splits);

// Rows of one (sequence, kv head) pair = group * q_len; the CUDA kernel takes them in chunks of this many.
inline constexpr int kDecodeRowsPerBlock = 64;
inline constexpr int kDecodeTileKeys = 64;
inline constexpr int kDecodeMaxSplits = 256;

// Workspace of a split decode: partial outputs (fp32) and LSEs, 256-byte aligned parts.
size_t decode_workspace_bytes(const DecodeProblem& p, int num_splits);

// ---------------------------------------------------------------- CPU (src/cpu/kv_*.cpp)
void cpu_kv_append(const AppendProblem& p);
void cpu_decode(const DecodeProblem& p);

// ---------------------------------------------------------------- CUDA
#if FLASHLITE_WITH_CUDA
// Empty when the CUDA kernels support p, else why not.
std::string cuda_append_unsupported_reason(const AppendProblem& p);
void run_cuda_append(const AppendProblem& p, void* stream);

std::string cuda_decode_unsupported_reason(const DecodeProblem& p);
// Resident blocks of the kernel decode() would run for p: SM count x blocks per SM (cached per device; the first
// call also sets the kernels' attributes and asks for the cluster size, so later calls are launches only).
int64_t cuda_decode_slots(const DecodeProblem& p);
void run_cuda_decode(const DecodeProblem& p, int num_splits, void* stream, void* workspace, size_t workspace_bytes);
// "cuda_decode_split_<dtype>_d<D>_<layout>"; with num_splits > 0 also how the splits merge (cluster or combine kernel).
std::string cuda_decode_kernel_name(const DecodeProblem& p, int num_splits = 0);
// Split merge in a thread-block cluster (sm_90; src/cuda/decode/cluster_merge.cuh) instead of the combine kernel:
// when the splits fit one cluster (<= 16) and the grid is at most one block per SM. FLASHLITE_DECODE_CLUSTER, read
// once per process: 1 / on (the default) or 0 / off (always the combine kernel); anything else is an error naming
// the variable.
int parse_decode_cluster_mode(const char* value);
bool cuda_decode_merges_in_cluster(const DecodeProblem& p, int num_splits);
// The split kernel's L2 policy for K/V. FLASHLITE_DECODE_KV_POLICY, read once per process: auto (the default:
// evict-first for calls whose K/V is at least half the L2), evict_first or normal; returns 0, 1, 2; anything else is
// an error naming the variable.
int parse_decode_kv_policy(const char* value);
#endif

}  // namespace flashlite
