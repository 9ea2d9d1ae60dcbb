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

// What the device offers the decode kernels of a problem (cuda_decode_device).
struct CudaDecodeDevice {
  int64_t slots = 1;       // resident split blocks: SM count x blocks per SM
  int sms = 1;
  int l2_bytes = 1;
  int cluster_splits = 0;  // the largest cluster of split blocks that fits (0: no cluster launch)
  bool sm90_code = false;  // sm_90 device running code with griddepcontrol (PDL) and clusters
};

// A decode plan's CUDA launch parameters.
struct CudaDecodeLaunch {
  int splits = 1;
  bool cluster_merge = false;   // splits merge in a cluster (no partials in memory, no combine kernel)
  bool kv_evict_first = false;  // K/V read with an L2 evict-first policy
  bool pdl = false;             // programmatic dependent launches
};
// THE CUDA decode choice (pure: tested on the CPU): split count for the length bound, how the splits merge, the L2
// policy and PDL, under the overrides; empty, or why the overrides cannot be honoured on this device.
std::string plan_cuda_decode(const DecodeProblem& p, int64_t bound, const DecodeOverrides& o, const CudaDecodeDevice& d,
                             CudaDecodeLaunch& out);

// ---------------------------------------------------------------- CPU (src/cpu/kv_*.cpp)
void cpu_kv_append(const AppendProblem& p);
void cpu_decode(const DecodeProblem& p);

// ---------------------------------------------------------------- CUDA
#if FLASHLITE_WITH_CUDA
// Empty when the CUDA kernels support p, else why not.
std::string cuda_append_unsupported_reason(const AppendProblem& p);
void run_cuda_append(const AppendProblem& p, void* stream);

std::string cuda_decode_unsupported_reason(const DecodeProblem& p);
// Cached per device and kernel; the first call also sets the kernels' attributes and asks for the cluster size, so
// later calls (e.g. inside a graph capture) are launches only.
CudaDecodeDevice cuda_decode_device(const DecodeProblem& p);
void run_cuda_decode(const DecodeProblem& p, const CudaDecodeLaunch& plan, void* stream, void* workspace);
// "cuda_decode_split_<dtype>_d<D>_<layout> (splits N, cluster merge | combine kernel[, K/V evict-first])".
std::string cuda_decode_kernel_name(const DecodeProblem& p, const CudaDecodeLaunch& plan);
#endif

}  // namespace flashlite
