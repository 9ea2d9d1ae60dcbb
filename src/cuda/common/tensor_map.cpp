// TMA tensor maps for the sm_90a kernels (tensor_map.h). Host code only: part of every CUDA build.
#include "cuda/common/tensor_map.h"

#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <string>

#include "flashlite/errors.h"

namespace flashlite::cuda {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 encoder(const char* who) {
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
  if (fn == nullptr) throw Error(ErrorKind::runtime, std::string(who) + ": the driver does not provide cuTensorMapEncodeTiled");
  return fn;
}

}  // namespace

// Strides of dimensions of extent 1 never step: they get the row stride (a valid 16-byte multiple).
CUtensorMap make_tile_map(const void* base, DType dtype, int64_t head_dim, int64_t rows, int64_t heads, int64_t batch,
                          const RowStrides& s, int box_rows, const char* name, const char* who) {
  CUtensorMap map{};
  const cuuint64_t dims[4] = {cuuint64_t(head_dim), cuuint64_t(rows), cuuint64_t(heads), cuuint64_t(batch)};
  const auto stride = [&](int64_t elems, int64_t extent) { return cuuint64_t((extent <= 1 ? s.seq : elems) * 2); };
  const cuuint64_t strides[3] = {cuuint64_t(s.seq * 2), stride(s.head, heads), stride(s.batch, batch)};
  const cuuint32_t box[4] = {64, cuuint32_t(box_rows), 1, 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  const CUresult r = encoder(who)(&map, dtype == DType::f16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                                  4, const_cast<void*>(base), dims, strides, box, elem_strides,
                                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                  CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    // The arguments in the message: the first device run has no other way to see what the driver refused.
    std::string what = who;
    what += ": cuTensorMapEncodeTiled failed for ";
    what += name;
    // (appended piece by piece: GCC 12 warns, wrongly, about `"literal" + std::string&&`)
    const auto add = [&what](const char* text, uint64_t number) {
      what += text;
      what += std::to_string(number);
    };
    add(" (CUresult ", uint64_t(r));
    what += "; dims";
    for (const cuuint64_t d : dims) add(" ", d);
    what += ", byte strides";
    for (const cuuint64_t st : strides) add(" ", st);
    add(", box 64 x ", uint64_t(box_rows));
    add(", base address mod 16 = ", reinterpret_cast<uintptr_t>(base) % 16);
    what += ")";
    throw Error(ErrorKind::runtime, what);
  }
  return map;
}

MapRows map_rows(const AttentionProblem& p) {
  if (!p.varlen()) return {p.batch, p.seq_q, p.seq_k};
  return {1, p.cu_seqlens_q[p.batch], p.cu_seqlens_k[p.batch]};
}

AttentionMaps make_attention_maps(const AttentionProblem& p, int q_box, int kv_box, const char* who) {
  const MapRows r = map_rows(p);
  return {make_tile_map(p.q, p.dtype, p.head_dim, r.q, p.q_heads, r.batch, p.q_stride, q_box, "q", who),
          make_tile_map(p.k, p.dtype, p.head_dim, r.k, p.kv_heads, r.batch, p.k_stride, kv_box, "k", who),
          make_tile_map(p.v, p.dtype, p.head_dim, r.k, p.kv_heads, r.batch, p.v_stride, kv_box, "v", who)};
}

}  // namespace flashlite::cuda
