// Every class of bad input is rejected before any work, with a message that names the argument, the value and the
// expectation, and with no byte of any buffer written (out and lse keep their poison, inputs their values).
#include <gtest/gtest.h>

#include <functional>

#include "test_util.h"

namespace fltest {
namespace {

using flashlite::Error;
using flashlite::ErrorKind;

Spec valid_spec() {
  Spec s;
  s.batch = 2, s.seq_q = 5, s.seq_k = 7, s.hq = 4, s.hkv = 2, s.d = 16;
  return s;
}

// Runs f, expects an Error of `kind` whose message contains every part, and checks no buffer changed.
void expect_rejected(Problem& p, const std::function<void()>& f, ErrorKind kind, std::vector<std::string> parts) {
  const Snapshot before = snapshot(p);
  try {
    f();
    ADD_FAILURE() << "expected an error containing '" << parts.front() << "', but the call succeeded";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(int(e.kind()), int(kind)) << what;
    for (const std::string& part : parts) EXPECT_NE(what.find(part), std::string::npos) << "'" << part << "' not in: " << what;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected flashlite::Error, got another exception: " << e.what();
  }
  EXPECT_TRUE(p.outbuf.bytes == before.out) << "out was written";
  EXPECT_TRUE(p.lsebuf.bytes == before.lse) << "lse was written";
  EXPECT_TRUE(p.qbuf.bytes == before.q && p.kbuf.bytes == before.k && p.vbuf.bytes == before.v) << "an input was written";
}

// The same rejection from every entry point that validates: forward on each CPU backend, the float64 oracle, and the
// two query functions.
void expect_rejected_everywhere(Problem& p, ErrorKind kind, std::vector<std::string> parts) {
  const ForwardArgs args = p.args;
  for (Backend b : {Backend::automatic, Backend::reference, Backend::naive, Backend::cpu}) {
    SCOPED_TRACE(flashlite::backend_name(b));
    ForwardArgs a = args;
    a.backend = b;
    expect_rejected(p, [&] { flashlite::forward(a); }, kind, parts);
  }
  std::vector<double> out(64), lse(64);
  expect_rejected(p, [&] { flashlite::reference_forward_f64(args, out.data(), lse.data()); }, kind, parts);
  expect_rejected(p, [&] { (void)flashlite::forward_kernel_name(args); }, kind, parts);
  expect_rejected(p, [&] { (void)flashlite::forward_workspace_bytes(args); }, kind, parts);
}

// One bad-input case: a name, how to break a valid problem, and what the error must say.
struct BadCase {
  std::string name;
  std::function<void(Problem&)> breaker;
  ErrorKind kind;
  std::vector<std::string> parts;
};

std::vector<BadCase> bad_cases() {
  const ErrorKind V = ErrorKind::invalid_value, T = ErrorKind::invalid_type;
  return {
      // Rank and shapes.
      {"q_rank3", [](Problem& p) { p.args.q.rank = 3; }, V, {"q has rank 3", "expected rank 4"}},
      {"out_rank2", [](Problem& p) { p.args.out.rank = 2; }, V, {"out has rank 2", "expected rank 4"}},
      {"k_batch", [](Problem& p) { p.args.k.shape[0] = 3; }, V, {"k has batch 3", "expected 2"}},
      {"v_seq", [](Problem& p) { p.args.v.shape[1] = 6; }, V, {"v has seq_k 6", "expected 7"}},
      {"k_head_dim", [](Problem& p) { p.args.k.shape[3] = 8; }, V, {"k has head_dim 8", "expected 16"}},
      {"v_heads", [](Problem& p) { p.args.v.shape[2] = 1; }, V, {"v has kv_heads 1", "expected 2"}},
      {"out_seq", [](Problem& p) { p.args.out.shape[1] = 4; }, V, {"out has seq_q 4", "expected 5"}},
      {"out_heads", [](Problem& p) { p.args.out.shape[2] = 2; }, V, {"out has q_heads 2", "expected 4"}},
      {"negative_size", [](Problem& p) { p.args.q.shape[1] = -5; }, V, {"q has negative size -5"}},
      {"heads_not_divisible",
       [](Problem& p) {
         p.args.k.shape[2] = p.args.v.shape[2] = 3;
       },
       V, {"q_heads 4 is not divisible by kv_heads 3"}},
      {"zero_kv_heads", [](Problem& p) { p.args.k.shape[2] = p.args.v.shape[2] = 0; }, V, {"k has 0 heads", "at least 1"}},
      {"head_dim_0",
       [](Problem& p) {
         for (TensorView* t : {&p.args.q, &p.args.k, &p.args.v, &p.args.out}) t->shape[3] = 0;
       },
       V, {"head_dim 0 is unsupported", "at least 1"}},
      {"head_dim_stride",
       [](Problem& p) {
         p.args.q.shape[3] = p.args.k.shape[3] = p.args.v.shape[3] = p.args.out.shape[3] = 8;
         p.args.q.strides[3] = 2;
       },
       V, {"q has head_dim stride 2", "expected 1"}},
      // Types and devices.
      {"q_int32", [](Problem& p) { p.args.q.dtype = DType::i32; }, T, {"q has dtype int32", "expected float32, float16 or bfloat16"}},
      {"v_dtype_mismatch", [](Problem& p) { p.args.v.dtype = DType::f16; }, T, {"v has dtype float16", "q has float32"}},
      {"out_dtype_mismatch", [](Problem& p) { p.args.out.dtype = DType::bf16; }, T, {"out has dtype bfloat16"}},
      {"k_on_cuda", [](Problem& p) { p.args.k.device = Device::cuda(0); }, V, {"k is on cuda:0", "q is on cpu"}},
      {"out_on_cuda1", [](Problem& p) { p.args.out.device = Device::cuda(1); }, V, {"out is on cuda:1", "same device"}},
      {"q_on_cuda", [](Problem& p) { p.args.q.device = Device::cuda(0); }, V, {"k is on cpu but q is on cuda:0"}},
      {"lse_on_cuda", [](Problem& p) { p.args.lse.device = Device::cuda(0); }, V, {"lse is on cuda:0"}},
      // Null and missing tensors.
      {"q_null_data", [](Problem& p) { p.args.q.data = nullptr; }, V, {"q has a null data pointer"}},
      // Pointers off their element size (a fault on the GPU, undefined behaviour on the CPU).
      {"q_misaligned", [](Problem& p) { p.args.q.data = static_cast<char*>(p.args.q.data) + 2; }, V,
       {"q's data pointer is not aligned to its 4-byte float32 elements"}},
      // Outputs whose elements share memory (expanded / broadcast views): racing writes, no defined result.
      {"out_broadcast", [](Problem& p) { p.args.out.strides[2] = 0; }, V, {"out has stride 0 in dimension 2", "must not broadcast"}},
      {"lse_broadcast", [](Problem& p) { p.args.lse.strides[2] = 0; }, V, {"lse has stride 0 in dimension 2"}},
      {"lse_misaligned", [](Problem& p) { p.args.lse.data = static_cast<char*>(p.args.lse.data) + 1; }, V,
       {"lse's data pointer is not aligned"}},
      {"v_null_data", [](Problem& p) { p.args.v.data = nullptr; }, V, {"v has a null data pointer"}},
      {"out_missing", [](Problem& p) { p.args.out = TensorView{}; }, V, {"out is missing"}},
      {"k_missing", [](Problem& p) { p.args.k = TensorView{}; }, V, {"k is missing"}},
      // Aliasing.
      {"out_is_q", [](Problem& p) { p.args.out = p.args.q; }, V, {"out overlaps q"}},
      {"out_overlaps_v_partly",
       [](Problem& p) {
         p.args.out.data = static_cast<float*>(p.args.v.data) + 7;  // v is 2*7*2*16 floats, out 2*5*4*16: overlap
       },
       V, {"out overlaps v"}},
      {"lse_in_out",
       [](Problem& p) { p.args.lse.data = static_cast<float*>(p.args.out.data) + 3; }, V, {"lse overlaps out"}},
      {"lse_in_k", [](Problem& p) { p.args.lse.data = p.args.k.data; }, V, {"lse overlaps k"}},
      {"lse_on_sink_logits", [](Problem& p) { p.args.lse.data = p.args.options.sink_logits.data; }, V, {"lse overlaps sink_logits"}},
      {"out_on_sink_logits",
       [](Problem& p) {
         p.args.options.sink_logits.data = static_cast<float*>(p.args.out.data) + 100;
       },
       V, {"out overlaps sink_logits"}},
      // LSE shape and type.
      {"lse_dtype", [](Problem& p) { p.args.lse.dtype = DType::f16; }, T, {"lse has dtype float16", "expected float32"}},
      {"lse_rank", [](Problem& p) { p.args.lse.rank = 2; }, V, {"lse has rank 2", "[batch, q_heads, seq_q]"}},
      {"lse_seq", [](Problem& p) { p.args.lse.shape[2] = 4; }, V, {"lse has seq_q 4", "expected 5"}},
      {"lse_heads", [](Problem& p) { p.args.lse.shape[1] = 2; }, V, {"lse has q_heads 2", "expected 4"}},
      // Options.
      {"window_left", [](Problem& p) { p.args.options.window_left = -2; }, V, {"window_left is -2", "-1 (unlimited) or >= 0"}},
      {"window_right", [](Problem& p) { p.args.options.window_right = -7; }, V, {"window_right is -7"}},
      {"sink_tokens", [](Problem& p) { p.args.options.sink_tokens = -1; }, V, {"sink_tokens is -1", "expected >= 0"}},
      {"scale_nan", [](Problem& p) { p.args.options.scale = std::nan(""); }, V, {"scale is", "finite"}},
      {"scale_inf", [](Problem& p) { p.args.options.scale = kInf; }, V, {"scale is inf", "finite"}},
      {"softcap_negative", [](Problem& p) { p.args.options.softcap = -1.0; }, V, {"softcap is -1", ">= 0"}},
      {"softcap_nan", [](Problem& p) { p.args.options.softcap = std::nan(""); }, V, {"softcap is", "finite"}},
      // Sink logits.
      {"sink_logits_shape",
       [](Problem& p) { p.args.options.sink_logits.shape[0] = 3; }, V, {"sink_logits has shape [3]", "expected [4]"}},
      {"sink_logits_rank2",
       [](Problem& p) {
         p.args.options.sink_logits.rank = 2;
         p.args.options.sink_logits.shape[1] = 1;
         p.args.options.sink_logits.strides[1] = 1;
       },
       V, {"sink_logits has shape [4, 1]", "expected [4]"}},
      {"sink_logits_dtype", [](Problem& p) { p.args.options.sink_logits.dtype = DType::f16; }, T, {"sink_logits has dtype float16", "expected float32"}},
      {"sink_logits_device", [](Problem& p) { p.args.options.sink_logits.device = Device::cuda(0); }, V, {"sink_logits is on cuda:0"}},
      {"sink_logits_null", [](Problem& p) { p.args.options.sink_logits.data = nullptr; }, V, {"sink_logits has a null data pointer"}},
  };
}

void PrintTo(const BadCase& c, std::ostream* os) { *os << c.name; }

class Rejects : public ::testing::TestWithParam<BadCase> {};

TEST_P(Rejects, WithMessageAndNothingWritten) {
  const BadCase& c = GetParam();
  Spec s = valid_spec();
  s.sink_logits = true;  // so that the sink_logits cases have something to break
  Problem p(s, 1);
  c.breaker(p);
  expect_rejected_everywhere(p, c.kind, c.parts);
}

INSTANTIATE_TEST_SUITE_P(BadInput, Rejects, ::testing::ValuesIn(bad_cases()),
                         [](const ::testing::TestParamInfo<BadCase>& info) { return info.param.name; });

// ---------------------------------------------------------------- cu_seqlens

Spec varlen_spec() {
  Spec s = valid_spec();
  s.varlen_q = {2, 3};
  s.varlen_k = {4, 3};
  s.extra_rows = 1;  // q has 6 rows, k 8
  return s;
}

struct CuCase {
  std::string name;
  std::vector<int32_t> cu_q, cu_k;
  std::vector<std::string> parts;
};

void PrintTo(const CuCase& c, std::ostream* os) { *os << c.name; }

class RejectsCuSeqlens : public ::testing::TestWithParam<CuCase> {};

TEST_P(RejectsCuSeqlens, WithMessageAndNothingWritten) {
  const CuCase& c = GetParam();
  Problem p(varlen_spec(), 2);
  std::vector<int32_t> cu_q = c.cu_q, cu_k = c.cu_k;
  p.args.options.cu_seqlens_q = view_n(cu_q.data(), DType::i32, {int64_t(cu_q.size())}, {1});
  p.args.options.cu_seqlens_k = view_n(cu_k.data(), DType::i32, {int64_t(cu_k.size())}, {1});
  expect_rejected_everywhere(p, ErrorKind::invalid_value, c.parts);
}

INSTANTIATE_TEST_SUITE_P(BadInput, RejectsCuSeqlens,
                         ::testing::Values(CuCase{"q_not_monotone", {0, 3, 2}, {0, 4, 7}, {"cu_seqlens_q is not monotone", "entry 2 is 2 after 3"}},
                                           CuCase{"k_not_monotone", {0, 2, 5}, {0, 5, 4}, {"cu_seqlens_k is not monotone"}},
                                           CuCase{"q_first_not_zero", {1, 2, 5}, {0, 4, 7}, {"cu_seqlens_q[0] is 1", "expected 0"}},
                                           CuCase{"k_first_not_zero", {0, 2, 5}, {2, 4, 7}, {"cu_seqlens_k[0] is 2"}},
                                           CuCase{"q_past_tensor", {0, 2, 7}, {0, 4, 7}, {"cu_seqlens_q ends at 7", "past the tensor's 6 rows"}},
                                           CuCase{"k_past_tensor", {0, 2, 5}, {0, 4, 9}, {"cu_seqlens_k ends at 9", "8 rows"}},
                                           CuCase{"k_wrong_length", {0, 2, 5}, {0, 4}, {"cu_seqlens_k has 2 entries", "expected 3"}},
                                           CuCase{"q_empty", {}, {0}, {"cu_seqlens_q has shape [0]", "at least one entry"}}),
                         [](const ::testing::TestParamInfo<CuCase>& info) { return info.param.name; });

TEST(RejectsVarlen, OnlyOneOfTheOffsetsGiven) {
  for (bool drop_q : {true, false}) {
    Problem p(varlen_spec(), 3);
    (drop_q ? p.args.options.cu_seqlens_q : p.args.options.cu_seqlens_k) = TensorView{};
    expect_rejected_everywhere(p, ErrorKind::invalid_value, {"cu_seqlens_q and cu_seqlens_k must be given together"});
  }
}

TEST(RejectsVarlen, OffsetsOfTheWrongTypeOrPlace) {
  {
    Problem p(varlen_spec(), 4);
    std::vector<float> f = {0, 2, 5};
    p.args.options.cu_seqlens_q = view_n(f.data(), DType::f32, {3}, {1});
    expect_rejected_everywhere(p, ErrorKind::invalid_type, {"cu_seqlens_q has dtype float32", "expected int32"});
  }
  {
    Problem p(varlen_spec(), 5);
    p.args.options.cu_seqlens_k.device = Device::cuda(0);  // must be refused before it is read
    expect_rejected_everywhere(p, ErrorKind::invalid_value, {"cu_seqlens_k is on cuda:0", "expected CPU memory"});
  }
  {
    Problem p(varlen_spec(), 6);
    p.args.options.cu_seqlens_q.rank = 2;
    expect_rejected_everywhere(p, ErrorKind::invalid_value, {"cu_seqlens_q has shape", "expected rank 1"});
  }
}

TEST(RejectsVarlen, OutputsOverlappingTheOffsets) {
  for (bool lse : {false, true}) {
    Problem p(varlen_spec(), 7);
    int32_t* cu = static_cast<int32_t*>((lse ? p.args.lse : p.args.out).data) + 1;  // a valid cu_seqlens_k inside it
    cu[0] = 0, cu[1] = 4, cu[2] = 7;
    p.args.options.cu_seqlens_k.data = cu;
    expect_rejected_everywhere(p, ErrorKind::invalid_value, {lse ? "lse overlaps cu_seqlens_k" : "out overlaps cu_seqlens_k"});
  }
}

TEST(RejectsVarlen, BatchedTensors) {
  Problem p(varlen_spec(), 7);
  for (TensorView* t : {&p.args.q, &p.args.k, &p.args.v, &p.args.out}) {  // the same rows seen as 2 sequences
    t->shape[1] /= 2;
    t->shape[0] = 2;
    t->strides[0] = t->shape[1] * t->strides[1];
  }
  p.args.lse = TensorView{};
  expect_rejected_everywhere(p, ErrorKind::invalid_value, {"q has batch 2 with cu_seqlens", "[1, total_tokens, heads, head_dim]"});
}

TEST(RejectsVarlen, LseInPaddedLayout) {
  Problem p(varlen_spec(), 8);  // lse must be [1, q_heads, total_q] = [1, 4, 6]
  p.args.lse.shape[2] = 3;
  expect_rejected_everywhere(p, ErrorKind::invalid_value, {"lse has seq_q 3", "expected 6"});
}

// ---------------------------------------------------------------- backend-specific rejections

TEST(RejectsBackend, HeadDimTooLargeForCpu) {
  Spec s = valid_spec();
  s.d = 513;
  Problem p(s, 9);
  for (Backend b : {Backend::cpu, Backend::automatic}) {
    p.args.backend = b;
    expect_rejected(p, [&] { flashlite::forward(p.args); }, ErrorKind::invalid_value, {"head_dim 513 is unsupported", "at most 512"});
  }
}

TEST(RejectsBackend, CudaBackendOnCpuTensors) {
  Problem p(valid_spec(), 10);
  p.args.backend = Backend::cuda;
  expect_rejected(p, [&] { flashlite::forward(p.args); }, ErrorKind::invalid_value, {"backend 'cuda' needs CUDA tensors", "on cpu"});
}

// Tensors marked CUDA (here backed by host memory, which must never be touched) with CPU-only backends.
TEST(RejectsBackend, CpuBackendsOnCudaTensors) {
  Problem p(valid_spec(), 11);
  p.args.lse = TensorView{};
  for (TensorView* t : {&p.args.q, &p.args.k, &p.args.v, &p.args.out}) t->device = Device::cuda(0);
  p.args.backend = Backend::cpu;
  expect_rejected(p, [&] { flashlite::forward(p.args); }, ErrorKind::invalid_value, {"backend 'cpu' needs CPU tensors", "cuda:0"});
  p.args.backend = Backend::reference;
  expect_rejected(p, [&] { flashlite::forward(p.args); }, ErrorKind::invalid_value, {"backend 'reference' runs on CPU tensors only"});
  std::vector<double> out(1024);
  expect_rejected(p, [&] { flashlite::reference_forward_f64(p.args, out.data(), nullptr); }, ErrorKind::invalid_value,
                  {"backend 'reference' runs on CPU tensors only"});
#if !FLASHLITE_WITH_CUDA
  p.args.backend = Backend::automatic;
  expect_rejected(p, [&] { flashlite::forward(p.args); }, ErrorKind::invalid_value, {"built without CUDA"});
#endif
}

TEST(RejectsBackend, ParseBackend) {
  EXPECT_EQ(flashlite::parse_backend("cpu"), Backend::cpu);
  EXPECT_EQ(flashlite::parse_backend("auto"), Backend::automatic);
  EXPECT_EQ(flashlite::parse_backend("reference"), Backend::reference);
  EXPECT_EQ(flashlite::parse_backend("naive"), Backend::naive);
  EXPECT_EQ(flashlite::parse_backend("cuda"), Backend::cuda);
  try {
    flashlite::parse_backend("bogus");
    ADD_FAILURE() << "parse_backend accepted 'bogus'";
  } catch (const Error& e) {
    EXPECT_EQ(int(e.kind()), int(ErrorKind::invalid_value));
    EXPECT_NE(std::string(e.what()).find("backend 'bogus' is unknown"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("auto, reference, naive, cpu, cuda"), std::string::npos) << e.what();
  }
}

// Views without elements carry any strides (numpy reports all-zero strides for them): no query rows, no keys, no
// batch are accepted, not refused as "head_dim stride 0"; rows without keys get zeros and LSE -inf.
TEST(Accepts, EmptyViewsWithZeroStrides) {
  for (int which : {0, 1, 2}) {  // seq_q 0, seq_k 0, batch 0
    Spec s = valid_spec();
    (which == 0 ? s.seq_q : which == 1 ? s.seq_k : s.batch) = 0;
    Problem p(s, 13);
    for (TensorView* t : {&p.args.q, &p.args.k, &p.args.v, &p.args.out, &p.args.lse}) {
      if (t->numel() == 0) t->strides = {0, 0, 0, 0};
    }
    for (Backend b : {Backend::automatic, Backend::reference, Backend::naive, Backend::cpu}) {
      p.args.backend = b;
      EXPECT_NO_THROW(flashlite::forward(p.args)) << flashlite::backend_name(b) << " case " << which;
    }
    if (which == 1) {
      EXPECT_EQ(get4(p.args.out, 1, 4, 3, 15), 0.0f);
      EXPECT_EQ(*static_cast<const float*>(p.args.lse.data), -kInf);
    }
  }
}

// A valid problem goes through every entry point (guards against the cases above failing for another reason).
TEST(Accepts, TheValidBaseProblem) {
  Spec s = valid_spec();
  s.sink_logits = true;
  for (Spec spec : {s, varlen_spec()}) {
    Problem p(spec, 12);
    for (Backend b : {Backend::automatic, Backend::reference, Backend::naive, Backend::cpu}) {
      p.args.backend = b;
      EXPECT_NO_THROW(flashlite::forward(p.args)) << flashlite::backend_name(b);
    }
  }
}

}  // namespace
}  // namespace fltest
