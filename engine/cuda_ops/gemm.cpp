#include "engine/cuda_ops/gemm.h"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
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
  std::map<Key, cublasLtMatmulAlgo_t> bucket_algos;  // keyed by the bucket's row count (algo_rows)
  // A plan's descriptors for this shape (no algorithm yet).
  std::unique_ptr<Plan> describe(int rows, int in, int out, Elem e, bool y_f32) const;
  // cuBLASLt's choice for the plan's problem.
  cublasLtMatmulAlgo_t search(const Plan& plan, int rows, int in, int out) const;
  // Whether cuBLASLt runs `algo` on the plan's problem within the workspace (host-side check, no launch).
  bool takes(const Plan& plan, const cublasLtMatmulAlgo_t& algo) const;
};

namespace {

// Prompt lengths differ from request to request, and a row count not seen before cost a serving step cuBLASLt's
// algorithm search and, where it picked a kernel not used before, that kernel's loading (milliseconds). Row counts
// past 16 therefore take the algorithm cuBLASLt picks for their bucket, searched once per bucket on the bucket's top
// row count (so the choice never depends on which row counts came first), wherever a host-side check finds that it
// takes the exact shape within the workspace; otherwise, and up to 16 rows, the shape gets its own search. Buckets:
// powers of two to 128, then steps of 64 to 512 (a server's steps: a decode batch of up to a few hundred rows plus
// joining prompts; on the H100 the 1B-shaped step at 160 rows under the 256-row algorithm took 2.55 ms against 2.16
// at 128), then powers of two.
int next_bucket(int b) { return b < 128 || b >= 512 ? 2 * b : b + 64; }

int algo_rows(int rows) {
  if (rows <= 16) return rows;
  int b = 32;
  while (b < rows) b = next_bucket(b);
  return b;
}

}  // namespace

std::unique_ptr<Gemm::Plan> Gemm::Impl::describe(int rows, int in, int out, Elem e, bool y_f32) const {
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
  return plan;
}

cublasLtMatmulAlgo_t Gemm::Impl::search(const Plan& plan, int rows, int in, int out) const {
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

bool Gemm::Impl::takes(const Plan& plan, const cublasLtMatmulAlgo_t& algo) const {
  cublasLtMatmulHeuristicResult_t result{};
  return cublasLtMatmulAlgoCheck(handle, plan.desc, plan.a, plan.b, plan.c, plan.c, &algo, &result) ==
             CUBLAS_STATUS_SUCCESS &&
         result.workspaceSize <= workspace_bytes;
}

std::vector<int> Gemm::search_rows(int from, int max_rows) {
  std::vector<int> rows;
  for (int n = std::max(from, 1); n <= std::min(max_rows, 16); ++n) rows.push_back(n);
  for (int prev = 16, b = 32; prev < max_rows; prev = b, b = next_bucket(b)) {  // bucket b: row counts (prev, b]
    if (b >= from) rows.push_back(std::min(b, max_rows));
  }
  return rows;
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
  if (it == impl_->plans.end()) {
    std::unique_ptr<Plan> plan = impl_->describe(rows, in, out, e, y_f32);
    const int bucket_rows = algo_rows(rows);
    bool found = false;
    if (bucket_rows != rows) {
      const Impl::Key bucket{bucket_rows, in, out, int(e), y_f32};
      auto b = impl_->bucket_algos.find(bucket);
      if (b == impl_->bucket_algos.end()) {
        b = impl_->bucket_algos.emplace(bucket, impl_->search(*impl_->describe(bucket_rows, in, out, e, y_f32),
                                                              bucket_rows, in, out)).first;
      }
      if (impl_->takes(*plan, b->second)) {
        plan->algo = b->second;
        found = true;
      }
    }
    if (!found) plan->algo = impl_->search(*plan, rows, in, out);
    it = impl_->plans.emplace(key, std::move(plan)).first;
  }
  const Plan& p = *it->second;
  const float alpha = 1.f, beta = 0.f;
  check(cublasLtMatmul(impl_->handle, p.desc, &alpha, w, p.a, x, p.b, &beta, y, p.c, y, p.c, &p.algo, impl_->workspace,
                       impl_->workspace_bytes, static_cast<cudaStream_t>(stream)),
        "matmul");
}

}  // namespace flashlite::engine::cuda_ops
