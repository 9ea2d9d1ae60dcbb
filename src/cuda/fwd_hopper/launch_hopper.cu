// Host launch of the Hopper forward kernel (sm_90a objects only): the TMA tensor maps of q, k, v and the choice of
// the variant (dtype, head_dim). Tensor maps are encoded per call on the host (cuTensorMapEncodeTiled, reached
// through the runtime's driver entry-point query, so the library does not link libcuda) and passed by value in
// the kernel parameters: no device allocation, no host sync, graph-capturable like the mma.sync kernel.
#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <cstdint>
#include <string>

#include "cuda/fwd_hopper/hopper_fwd.h"
#include "cuda/fwd_hopper/hopper_kernel.cuh"
#include "flashlite/errors.h"

namespace flashlite::cuda_fwd_hopper {

// The tensor maps' boxes (kBlockRows / kBlockKeys rows, 64 columns) are what the kernel's expect_tx byte counts and
// descriptors assume (HopperTile); the FwdParams' query tiles are made for kBlockRows too (launch.cu).
static_assert(kBlockRows == HopperTile<64>::BR && kBlockRows == HopperTile<128>::BR, "Q box rows != kernel tile rows");
static_assert(kBlockKeys == HopperTile<64>::BC && kBlockKeys == HopperTile<128>::BC, "K/V box rows != kernel tile keys");
static_assert(HopperTile<128>::SMEM_BYTES <= 227u * 1024u, "over the sm_90 opt-in shared memory per block");

namespace {

[[noreturn]] void fail(const std::string& what) {
  throw Error(ErrorKind::runtime, "Hopper attention kernel: " + what);
}

PFN_cuTensorMapEncodeTiled_v12000 encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      f = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  if (fn == nullptr) fail("the driver does not provide cuTensorMapEncodeTiled");
  return fn;
}

// A 4-D map (head_dim, rows, heads, batch) of a [batch, seq, heads, head_dim] view; boxes of 64 columns x box_rows
// rows of one head of one batch entry, 128-byte swizzle (the wgmma descriptors' layout), rows past `rows` read as
// zeros. Strides of dimensions of extent 1 never step: they get the row stride (a valid 16-byte multiple).
CUtensorMap make_map(const void* base, DType dtype, int64_t head_dim, int64_t rows, int64_t heads, int64_t batch,
                     const RowStrides& s, int box_rows, const char* name) {
  CUtensorMap map{};
  const cuuint64_t dims[4] = {cuuint64_t(head_dim), cuuint64_t(rows), cuuint64_t(heads), cuuint64_t(batch)};
  const auto stride = [&](int64_t elems, int64_t extent) { return cuuint64_t((extent <= 1 ? s.seq : elems) * 2); };
  const cuuint64_t strides[3] = {cuuint64_t(s.seq * 2), stride(s.head, heads), stride(s.batch, batch)};
  const cuuint32_t box[4] = {64, cuuint32_t(box_rows), 1, 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  const CUresult r = encoder()(&map, dtype == DType::f16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                               4, const_cast<void*>(base), dims, strides, box, elem_strides,
                               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                               CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    // The arguments in the message: the first device run has no other way to see what the driver refused.
    std::string what = std::string("cuTensorMapEncodeTiled failed for ") + name + " (CUresult " + std::to_string(int(r)) +
                       "; dims";
    for (const cuuint64_t d : dims) what += " " + std::to_string(d);
    what += ", byte strides";
    for (const cuuint64_t st : strides) what += " " + std::to_string(st);
    what += ", box 64 x " + std::to_string(box_rows) + ", base address mod 16 = " +
            std::to_string(reinterpret_cast<uintptr_t>(base) % 16) + ")";
    fail(what);
  }
  return map;
}

}  // namespace

void launch_fwd_hopper(const AttentionProblem& p, const cuda_fwd::FwdParams& f, cudaStream_t stream) {
  HopperParams hp;
  hp.f = f;
  const int64_t tb = p.varlen() ? 1 : p.batch;
  // Varlen: one tensor "batch"; the maps end at the last sequence's end (rows past it read as zeros).
  const int64_t rows_q = p.varlen() ? p.cu_seqlens_q[p.batch] : p.seq_q;
  const int64_t rows_k = p.varlen() ? p.cu_seqlens_k[p.batch] : p.seq_k;
  hp.tq = make_map(p.q, p.dtype, p.head_dim, rows_q, p.q_heads, tb, p.q_stride, kBlockRows, "q");
  hp.tk = make_map(p.k, p.dtype, p.head_dim, rows_k, p.kv_heads, tb, p.k_stride, kBlockKeys, "k");
  hp.tv = make_map(p.v, p.dtype, p.head_dim, rows_k, p.kv_heads, tb, p.v_stride, kBlockKeys, "v");
  const bool f16 = p.dtype == DType::f16;
  cudaError_t e;
  if (p.head_dim == 64) {
    e = f16 ? launch_hopper_variant<__half, 64>(hp, stream) : launch_hopper_variant<__nv_bfloat16, 64>(hp, stream);
  } else {
    e = f16 ? launch_hopper_variant<__half, 128>(hp, stream) : launch_hopper_variant<__nv_bfloat16, 128>(hp, stream);
  }
  if (e != cudaSuccess) fail(std::string("launch failed: ") + cudaGetErrorString(e));
}

}  // namespace flashlite::cuda_fwd_hopper
