#include "engine/cuda_ops/gemm.h"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <string>

#include "engine/errors.h"

namespace flashlite::engine::cuda_ops {

namespace {

void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) fail_runtime(std::string("cuBLASLt ") + what + " failed with status " + std::to_string(int(s)));
}

}  // namespace

struct Gemm::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  ~Plan() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

struct Gemm::Impl {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  using Key = std::tuple<int, int, int, int, bool>;  // (rows, in, out, element, fp32 output)
  std::map<Key, std::unique_ptr<Plan>> plans;
  std::map<Key, cublasLtMatmulAlgo_t> bucket_algos;  // by algo_rows(rows)
  // cuBLASLt's choice for the problem with `rows` rows, from the plan's descriptors.
  cublasLtMatmulAlgo_t search(Plan& plan, int rows, int in, int out);
};

namespace {

// Prompt lengths differ from request to request, and a row count not seen before cost a serving step cuBLASLt's
// algorithm search and, where it picks a kernel not used before, that kernel's loading (milliseconds). Row counts past
// 16 therefore share one algorithm per bucket (up to the next power of two): the bucket's first shape's, or the power
// of two's own once that is seen, run on the exact shape (a shape it refuses gets its own search). Up to 16 rows the
// search is the shape's own.
int algo_rows(int rows) {
  if (rows <= 16) return rows;
  int b = 32;
  while (b < rows) b *= 2;
  return b;
}

}  // namespace

cublasLtMatmulAlgo_t Gemm::Impl::search(Plan& plan, int rows, int in, int out) {
  cublasLtMatmulPreference_t pref = nullptr;
  check(cublasLtMatmulPreferenceCreate(&pref), "preference");
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                       sizeof workspace_bytes);
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t s =
      cublasLtMatmulAlgoGetHeuristic(handle, plan.desc, plan.a, plan.b, plan.c, plan.c, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (s != CUBLAS_STATUS_SUCCESS || found == 0) {
    fail_runtime("cuBLASLt has no algorithm for a " + std::to_string(rows) + "x" + std::to_string(in) + " by " +
                 std::to_string(out) + "x" + std::to_string(in) + " matmul");
  }
  return result.algo;
}

Gemm::Gemm(size_t workspace_bytes) : impl_(std::make_unique<Impl>()) {
  check(cublasLtCreate(&impl_->handle), "handle creation");
  impl_->workspace_bytes = workspace_bytes;
  if (cudaMalloc(&impl_->workspace, workspace_bytes) != cudaSuccess) fail_runtime("cannot allocate the cuBLASLt workspace");
}

Gemm::~Gemm() {
  impl_->plans.clear();
  if (impl_->workspace) cudaFree(impl_->workspace);
  if (impl_->handle) cublasLtDestroy(impl_->handle);
}

// Column-major view: Y^T (out x rows, ld out) = W (out x in: the row-major [out, in] buffer read transposed, ld in)
//                                             * X^T (in x rows: the row-major [rows, in] buffer, ld in).
void Gemm::run(void* y, const void* x, const void* w, int rows, int in, int out, Elem e, bool y_f32, void* stream) {
  if (rows == 0) return;
  const Impl::Key key{rows, in, out, int(e), y_f32};
  auto it = impl_->plans.find(key);
  bool from_bucket = false;
  if (it == impl_->plans.end()) {
    auto plan = std::make_unique<Plan>();
    const cudaDataType_t ab = e == Elem::f32 ? CUDA_R_32F : CUDA_R_16BF;
    const cudaDataType_t cd = y_f32 || e == Elem::f32 ? CUDA_R_32F : CUDA_R_16BF;
    check(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "descriptor");
    const cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
    check(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t), "transa");
    check(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &n, sizeof n), "transb");
    check(cublasLtMatrixLayoutCreate(&plan->a, ab, in, out, in), "layout A");
    check(cublasLtMatrixLayoutCreate(&plan->b, ab, in, rows, in), "layout B");
    check(cublasLtMatrixLayoutCreate(&plan->c, cd, out, rows, out), "layout C");
    const Impl::Key bucket{algo_rows(rows), in, out, int(e), y_f32};
    const auto b = impl_->bucket_algos.find(bucket);
    if (algo_rows(rows) != rows && b != impl_->bucket_algos.end()) {
      plan->algo = b->second;
      from_bucket = true;
    } else {  // the bucket's first shape, or its own row count: searched, and the bucket's from now on
      plan->algo = impl_->search(*plan, rows, in, out);
      impl_->bucket_algos[bucket] = plan->algo;
    }
    it = impl_->plans.emplace(key, std::move(plan)).first;
  }
  Plan& p = *it->second;
  const float alpha = 1.f, beta = 0.f;
  const auto matmul = [&] {
    return cublasLtMatmul(impl_->handle, p.desc, &alpha, w, p.a, x, p.b, &beta, y, p.c, y, p.c, &p.algo,
                          impl_->workspace, impl_->workspace_bytes, static_cast<cudaStream_t>(stream));
  };
  cublasStatus_t s = matmul();
  if (s == CUBLAS_STATUS_NOT_SUPPORTED && from_bucket) {  // the bucket's algorithm does not take this shape
    p.algo = impl_->search(p, rows, in, out);
    s = matmul();
  }
  check(s, "matmul");
}

}  // namespace flashlite::engine::cuda_ops
