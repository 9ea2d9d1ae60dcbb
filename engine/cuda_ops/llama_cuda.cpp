#include "engine/llama_cuda.h"

#include <cuda_runtime.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "engine/cuda_ops/gemm.h"
#include "engine/cuda_ops/ops.h"
#include "engine/errors.h"
#include "flashlite/kv_cache.h"

namespace flashlite::engine {

namespace {

using cuda_ops::Elem;

void cuda_check(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess) fail_runtime("CUDA " + what + " failed: " + cudaGetErrorString(e));
}

// Owning device allocation.
struct DeviceBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr(o.ptr), bytes(o.bytes) {
    o.ptr = nullptr;
    o.bytes = 0;
  }
  ~DeviceBuffer() {
    if (ptr) cudaFree(ptr);
    allocated() -= bytes;
  }
  void reserve(size_t n, const char* what) {
    if (n <= bytes) return;
    if (ptr) cudaFree(ptr);
    allocated() -= bytes;
    ptr = nullptr;
    bytes = 0;
    cuda_check(cudaMalloc(&ptr, n), std::string("allocation of ") + std::to_string(n) + " bytes for " + what);
    bytes = n;
    allocated() += n;
    ++generation();
  }
  // Bumped by every allocation: a captured CUDA graph holds raw pointers and is stale once this moves.
  static uint64_t& generation() {
    static uint64_t g = 0;
    return g;
  }
  // Bytes held by all DeviceBuffers of the process (reported as the engine's device memory).
  static size_t& allocated() {
    static size_t total = 0;
    return total;
  }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr); }
  char* bytes_ptr() const { return static_cast<char*>(ptr); }
};

class LlamaCuda final : public LlamaModel {
 public:
  LlamaCuda(const ModelWeights& w, const RuntimeOptions& o) : c_(w.config), opt_(o) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
      cudaGetLastError();
      fail("device 'cuda': no CUDA device is available");
    }
    if (o.device_index < 0 || o.device_index >= count) fail("CUDA device " + std::to_string(o.device_index) + " does not exist");
    cuda_check(cudaSetDevice(o.device_index), "cudaSetDevice");
    if (o.precision == "fp32") elem_ = Elem::f32;
    else if (o.precision == "auto" || o.precision == "bf16") elem_ = Elem::bf16;
    else fail("precision '" + o.precision + "' is unknown; expected auto, bf16 or fp32");
    context_ = o.context > 0 ? o.context : c_.max_seq_len;
    if (context_ > c_.max_seq_len) fail("context " + std::to_string(context_) + " exceeds the model's maximum of " + std::to_string(c_.max_seq_len));
    if (o.slots < 1) fail("batch (slots) must be at least 1");
    slots_ = o.slots;
    lengths_.assign(slots_, 0);
    cuda_check(cudaStreamCreate(&stream_), "stream creation");
    gemm_ = std::make_unique<cuda_ops::Gemm>();  // after the device checks: it allocates on the device
    upload_weights(w);
    // RoPE tables, float64 math rounded once (the CPU path's numbers exactly).
    const std::vector<double> inv = rope_inv_freq(c_);
    const int half = c_.head_dim / 2;
    std::vector<float> cs(size_t(context_) * half), sn(cs.size());
    for (int p = 0; p < context_; ++p)
      for (int i = 0; i < half; ++i) {
        cs[size_t(p) * half + i] = float(std::cos(p * inv[i]));
        sn[size_t(p) * half + i] = float(std::sin(p * inv[i]));
      }
    cos_.reserve(cs.size() * 4, "RoPE cos");
    sin_.reserve(sn.size() * 4, "RoPE sin");
    cuda_check(cudaMemcpy(cos_.ptr, cs.data(), cs.size() * 4, cudaMemcpyHostToDevice), "RoPE upload");
    cuda_check(cudaMemcpy(sin_.ptr, sn.data(), sn.size() * 4, cudaMemcpyHostToDevice), "RoPE upload");
    const size_t kv_bytes = size_t(slots_) * context_ * c_.kv_dim() * esize();
    k_cache_.resize(c_.n_layers);
    v_cache_.resize(c_.n_layers);
    for (int l = 0; l < c_.n_layers; ++l) {
      k_cache_[l] = std::make_unique<DeviceBuffer>();
      v_cache_[l] = std::make_unique<DeviceBuffer>();
      k_cache_[l]->reserve(kv_bytes, "the K cache");
      v_cache_[l]->reserve(kv_bytes, "the V cache");
    }
    attention_ = choose_attention();
    decode_ok_ = probe_decode();
    const char* env = std::getenv("FLASHLITE_ENGINE_GRAPH");
    graphs_on_ = decode_ok_ && !(env && std::string(env) == "0");
  }

  ~LlamaCuda() override {
    for (auto& [rows, g] : graphs_)
      if (g.exec) cudaGraphExecDestroy(g.exec);
    if (stream_) cudaStreamDestroy(stream_);
  }

  const ModelConfig& config() const override { return c_; }
  int slots() const override { return slots_; }
  int context() const override { return context_; }
  int length(int slot) override { return lengths_.at(slot); }
  void reset(int slot) override { lengths_.at(slot) = 0; }
  std::string device() const override {
    cudaDeviceProp prop{};
    cudaGetDeviceProperties(&prop, opt_.device_index);
    return std::string("cuda:") + std::to_string(opt_.device_index) + " " + prop.name + " (" +
           (elem_ == Elem::bf16 ? "bf16" : "fp32") + ")";
  }
  std::string attention_kernel() override {
    if (!decode_ok_) return forward_kernel_name(attention_args(0, 0, 0, 1, 1));
    const int32_t one = 1;
    return decode_kernel_name(decode_args(0, 1, &one, nullptr));
  }
  size_t device_bytes() const override { return DeviceBuffer::allocated() + (size_t(32) << 20); }  // + GEMM workspace

  const std::vector<float>& forward(const std::vector<SequenceInput>& inputs) override;

 private:
  size_t esize() const { return cuda_ops::elem_size(elem_); }
  DType dtype() const { return elem_ == Elem::bf16 ? DType::bf16 : DType::f32; }

  void upload(DeviceBuffer& dst, const float* src, size_t n, const char* what) {
    dst.reserve(n * esize(), what);
    cuda_ops::upload(dst.ptr, src, n, elem_);
  }

  void upload_weights(const ModelWeights& w) {
    const size_t dim = c_.dim, hid = c_.hidden_dim, qd = c_.q_dim(), kvd = c_.kv_dim(), vocab = c_.vocab_size;
    upload(embedding_, w.embedding, vocab * dim, "the embedding");
    upload(rms_final_, w.rms_final, dim, "the final norm");
    if (!c_.tie_embeddings) upload(lm_head_, w.lm_head, vocab * dim, "the LM head");
    layers_.resize(c_.n_layers);
    for (int l = 0; l < c_.n_layers; ++l) {
      Layer& L = layers_[l];
      const LayerWeights& s = w.layers[l];
      upload(L.rms_att, s.rms_att, dim, "a norm");
      upload(L.wqkv, s.wqkv, (qd + 2 * kvd) * dim, "wqkv");
      upload(L.wo, s.wo, dim * qd, "wo");
      upload(L.rms_ffn, s.rms_ffn, dim, "a norm");
      upload(L.w13, s.w13, 2 * hid * dim, "w13");
      upload(L.w2, s.w2, dim * hid, "w2");
    }
  }

  // Device views of sequence `slot`: `n` new query rows starting at fused row `row0`, keys [0, len + n).
  ForwardArgs attention_args(int layer, int slot, int row0, int n, int kv_len) {
    const int D = c_.head_dim, qkv_w = c_.q_dim() + 2 * c_.kv_dim(), kvd = c_.kv_dim();
    const Device dev = Device::cuda(opt_.device_index);
    ForwardArgs a;
    a.q = TensorView::strided(qkv_.bytes_ptr() + size_t(row0) * qkv_w * esize(), dtype(), dev, {1, n, c_.n_heads, D},
                              {int64_t(n) * qkv_w, qkv_w, D, 1});
    const size_t slot_off = size_t(slot) * context_ * kvd * esize();
    a.k = TensorView::strided(k_cache_[layer]->bytes_ptr() + slot_off, dtype(), dev, {1, kv_len, c_.n_kv_heads, D},
                              {int64_t(context_) * kvd, kvd, D, 1});
    a.v = TensorView::strided(v_cache_[layer]->bytes_ptr() + slot_off, dtype(), dev, {1, kv_len, c_.n_kv_heads, D},
                              {int64_t(context_) * kvd, kvd, D, 1});
    a.out = TensorView::strided(att_.bytes_ptr() + size_t(row0) * c_.q_dim() * esize(), dtype(), dev,
                                {1, n, c_.n_heads, D}, {int64_t(n) * c_.q_dim(), c_.q_dim(), D, 1});
    a.options.causal = true;
    a.backend = attention_;
    a.stream = stream_;
    return a;
  }

  // The fused kernel when it takes this head_dim and dtype, else flashlite's split CUDA kernels.
  Backend choose_attention() {
    if (opt_.attention != Backend::automatic) return opt_.attention;
    ensure_scratch(1, 1);
    attention_ = Backend::cuda;
    try {
      forward_kernel_name(attention_args(0, 0, 0, 1, 1));
      return Backend::cuda;
    } catch (const Error&) {
      return Backend::naive;
    }
  }

  // Decode steps (one new token per sequence, slots 0..batch-1): flashlite's split-KV decode kernel over the batch in
  // one launch per layer. Lengths are those after this step's append (host copy for planning, device copy for the kernel).
  DecodeArgs decode_args(int layer, int batch, const int32_t* host_lens, const DecodePlan* plan) {
    const int D = c_.head_dim, qkv_w = c_.q_dim() + 2 * c_.kv_dim(), kvd = c_.kv_dim(), qd = c_.q_dim();
    const Device dev = Device::cuda(opt_.device_index);
    DecodeArgs a;
    a.q = TensorView::strided(qkv_.ptr, dtype(), dev, {batch, 1, c_.n_heads, D}, {qkv_w, qkv_w, D, 1});
    a.out = TensorView::strided(att_.ptr, dtype(), dev, {batch, 1, c_.n_heads, D}, {qd, qd, D, 1});
    a.cache.layout = KvLayout::contiguous;
    a.cache.k = TensorView::strided(k_cache_[layer]->ptr, dtype(), dev, {batch, context_, c_.n_kv_heads, D},
                                    {int64_t(context_) * kvd, kvd, D, 1});
    a.cache.v = TensorView::strided(v_cache_[layer]->ptr, dtype(), dev, {batch, context_, c_.n_kv_heads, D},
                                    {int64_t(context_) * kvd, kvd, D, 1});
    a.cache.host.seq_lens = TensorView::contiguous(const_cast<int32_t*>(host_lens), DType::i32, Device::cpu(), {batch});
    a.cache.device.seq_lens = TensorView::contiguous(seq_lens_dev_.ptr, DType::i32, dev, {batch});
    a.options.causal = true;
    a.backend = Backend::cuda;
    a.stream = stream_;
    a.plan = plan;
    a.workspace = decode_ws_.ptr;
    a.workspace_bytes = decode_ws_.bytes;
    return a;
  }

  // Whether the decode kernel takes this model (head_dim 64/128, bf16/f16; fp32 and tiny heads use the fused forward).
  bool probe_decode() {
    if (opt_.attention != Backend::automatic && opt_.attention != Backend::cuda) return false;
    seq_lens_dev_.reserve(size_t(slots_) * 4, "sequence lengths");
    const int32_t one = 1;
    try {
      decode_kernel_name(decode_args(0, 1, &one, nullptr));
      return true;
    } catch (const Error&) {
      return false;
    }
  }

  void ensure_scratch(int rows, int logit_rows) {
    const size_t r = size_t(rows), e = esize();
    x_.reserve(r * c_.dim * 4, "activations");
    xb_.reserve(r * c_.dim * e, "activations");
    qkv_.reserve(r * (c_.q_dim() + 2 * c_.kv_dim()) * e, "activations");
    att_.reserve(r * c_.q_dim() * e, "activations");
    h13_.reserve(r * 2 * c_.hidden_dim * e, "activations");
    hb_.reserve(r * c_.hidden_dim * e, "activations");
    xo_.reserve(r * c_.dim * e, "activations");
    tokens_.reserve(r * 4, "token ids");
    pos_.reserve(r * 4, "positions");
    cache_row_.reserve(r * 8, "cache rows");
    logit_index_.reserve(size_t(logit_rows) * 4, "row index");
    logits_dev_.reserve(size_t(logit_rows) * c_.vocab_size * 4, "logits");
  }

  struct Layer {
    DeviceBuffer rms_att, wqkv, wo, rms_ffn, w13, w2;
  };

  ModelConfig c_;
  RuntimeOptions opt_;
  Elem elem_ = Elem::bf16;
  int context_ = 0, slots_ = 1;
  Backend attention_ = Backend::cuda;
  bool decode_ok_ = false, graphs_on_ = false;
  // Decode steps replayed from a CUDA graph, one per batch size: captured the second time that size is seen (the
  // first runs eagerly: lazy module loading and cuBLASLt heuristics stay out of the capture).
  struct GraphEntry {
    cudaGraphExec_t exec = nullptr;
    uint64_t generation = 0;
    int seen = 0;
  };
  std::map<int, GraphEntry> graphs_;
  bool capture(GraphEntry& g, const std::function<void()>& body) {
    cudaGraph_t graph = nullptr;
    cuda_check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "graph capture");
    bool ok = true;
    try {
      body();
    } catch (const std::exception&) {
      ok = false;
    }
    cudaError_t e = cudaStreamEndCapture(stream_, &graph);
    if (ok && e == cudaSuccess) e = cudaGraphInstantiate(&g.exec, graph, 0);
    if (graph) cudaGraphDestroy(graph);
    if (!ok || e != cudaSuccess) {  // fall back to eager steps for good
      cudaGetLastError();
      g.exec = nullptr;
      graphs_on_ = false;
      return false;
    }
    g.generation = DeviceBuffer::generation();
    return true;
  }
  std::vector<int> lengths_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<cuda_ops::Gemm> gemm_;
  DeviceBuffer embedding_, rms_final_, lm_head_, cos_, sin_;
  std::vector<Layer> layers_;
  std::vector<std::unique_ptr<DeviceBuffer>> k_cache_, v_cache_;  // per layer (slots * context, kv_heads, head_dim)
  DeviceBuffer x_, xb_, qkv_, att_, h13_, hb_, xo_, tokens_, pos_, cache_row_, logit_index_, logits_dev_, seq_lens_dev_, decode_ws_;
  std::vector<float> logits_;
};

const std::vector<float>& LlamaCuda::forward(const std::vector<SequenceInput>& inputs) {
  const int dim = c_.dim, qd = c_.q_dim(), kvd = c_.kv_dim(), hid = c_.hidden_dim, qkv_w = qd + 2 * kvd;
  std::vector<int32_t> tokens, pos, logit_index;
  std::vector<int64_t> cache_row;
  std::vector<int> row0;
  for (const SequenceInput& in : inputs) {
    if (in.slot < 0 || in.slot >= slots_) fail("slot " + std::to_string(in.slot) + " is outside [0, " + std::to_string(slots_) + ")");
    const int n = int(in.tokens.size()), len = lengths_[in.slot];
    if (n == 0) fail("an input sequence has no new tokens");
    if (len + n > context_) {
      fail("sequence would reach " + std::to_string(len + n) + " tokens (" + std::to_string(len) + " cached + " +
           std::to_string(n) + " new); the context holds " + std::to_string(context_));
    }
    for (const SequenceInput& other : inputs)
      if (&other != &in && other.slot == in.slot) fail("slot " + std::to_string(in.slot) + " appears twice in one forward call");
    row0.push_back(int(tokens.size()));
    for (int i = 0; i < n; ++i) {
      const int t = in.tokens[i];
      if (t < 0 || t >= c_.vocab_size) {
        fail("token id " + std::to_string(t) + " is outside the model's vocabulary [0, " + std::to_string(c_.vocab_size) + ")");
      }
      if (in.all_logits || i == n - 1) logit_index.push_back(int32_t(tokens.size()));
      tokens.push_back(t);
      pos.push_back(len + i);
      cache_row.push_back(int64_t(in.slot) * context_ + len + i);
    }
  }
  const int rows = int(tokens.size()), lrows = int(logit_index.size());
  ensure_scratch(rows, lrows);
  // A decode step over slots 0..rows-1, one token each: one batched decode launch per layer.
  bool batched_decode = decode_ok_ && rows == int(inputs.size());
  for (size_t q = 0; batched_decode && q < inputs.size(); ++q) batched_decode = inputs[q].slot == int(q);
  std::vector<int32_t> lens_after;
  DecodePlan plan;
  if (batched_decode) {
    for (const SequenceInput& in : inputs) lens_after.push_back(int32_t(lengths_[in.slot] + 1));
    cuda_check(cudaMemcpyAsync(seq_lens_dev_.ptr, lens_after.data(), rows * 4, cudaMemcpyHostToDevice, stream_), "upload");
    plan = plan_decode(decode_args(0, rows, lens_after.data(), nullptr), context_);  // graph-stable: any length
    if (plan.workspace_bytes > decode_ws_.bytes) {
      cuda_check(cudaStreamSynchronize(stream_), "decode workspace");
      decode_ws_.reserve(plan.workspace_bytes, "the decode workspace");
    }
  }
  cuda_check(cudaMemcpyAsync(tokens_.ptr, tokens.data(), rows * 4, cudaMemcpyHostToDevice, stream_), "token upload");
  cuda_check(cudaMemcpyAsync(pos_.ptr, pos.data(), rows * 4, cudaMemcpyHostToDevice, stream_), "position upload");
  cuda_check(cudaMemcpyAsync(cache_row_.ptr, cache_row.data(), rows * 8, cudaMemcpyHostToDevice, stream_), "upload");
  cuda_check(cudaMemcpyAsync(logit_index_.ptr, logit_index.data(), lrows * 4, cudaMemcpyHostToDevice, stream_), "upload");

  void* s = stream_;
  auto compute = [&] {
    cuda_ops::embed(x_.as<float>(), embedding_.ptr, tokens_.as<int32_t>(), rows, dim, elem_, s);
    for (int l = 0; l < c_.n_layers; ++l) {
      const Layer& L = layers_[l];
      cuda_ops::rmsnorm(xb_.ptr, x_.as<float>(), L.rms_att.ptr, nullptr, rows, dim, c_.rms_eps, elem_, s);
      gemm_->run(qkv_.ptr, xb_.ptr, L.wqkv.ptr, rows, dim, qkv_w, elem_, false, s);
      cuda_ops::RopeAppendParams rp;
      rp.qkv = qkv_.ptr;
      rp.cos = cos_.as<float>();
      rp.sin = sin_.as<float>();
      rp.pos = pos_.as<int32_t>();
      rp.cache_row = cache_row_.as<int64_t>();
      rp.k_cache = k_cache_[l]->ptr;
      rp.v_cache = v_cache_[l]->ptr;
      rp.rows = rows;
      rp.heads = c_.n_heads;
      rp.kv_heads = c_.n_kv_heads;
      rp.head_dim = c_.head_dim;
      rp.interleaved = c_.rope_style == RopeStyle::interleaved;
      rp.elem = elem_;
      cuda_ops::rope_append(rp, s);
      if (batched_decode) {
        flashlite::decode(decode_args(l, rows, lens_after.data(), &plan));
      } else {
        for (size_t q = 0; q < inputs.size(); ++q) {
          const int n = int(inputs[q].tokens.size());
          flashlite::forward(attention_args(l, inputs[q].slot, row0[q], n, lengths_[inputs[q].slot] + n));
        }
      }
      gemm_->run(xo_.ptr, att_.ptr, L.wo.ptr, rows, qd, dim, elem_, false, s);
      cuda_ops::residual_add(x_.as<float>(), xo_.ptr, size_t(rows) * dim, elem_, s);
      cuda_ops::rmsnorm(xb_.ptr, x_.as<float>(), L.rms_ffn.ptr, nullptr, rows, dim, c_.rms_eps, elem_, s);
      gemm_->run(h13_.ptr, xb_.ptr, L.w13.ptr, rows, dim, 2 * hid, elem_, false, s);
      cuda_ops::swiglu(hb_.ptr, h13_.ptr, rows, hid, elem_, s);
      gemm_->run(xo_.ptr, hb_.ptr, L.w2.ptr, rows, hid, dim, elem_, false, s);
      cuda_ops::residual_add(x_.as<float>(), xo_.ptr, size_t(rows) * dim, elem_, s);
    }
    cuda_ops::rmsnorm(xb_.ptr, x_.as<float>(), rms_final_.ptr, logit_index_.as<int32_t>(), lrows, dim, c_.rms_eps, elem_, s);
    const void* head = c_.tie_embeddings ? embedding_.ptr : lm_head_.ptr;
    gemm_->run(logits_dev_.ptr, xb_.ptr, head, lrows, dim, c_.vocab_size, elem_, true, s);
  };
  GraphEntry* g = nullptr;
  if (batched_decode && graphs_on_) {
    g = &graphs_[rows];
    if (g->exec && g->generation != DeviceBuffer::generation()) {  // a buffer moved since the capture
      cudaGraphExecDestroy(g->exec);
      g->exec = nullptr;
    }
    if (!g->exec && ++g->seen >= 2 && !capture(*g, compute)) g = nullptr;
  }
  if (g && g->exec) cuda_check(cudaGraphLaunch(g->exec, stream_), "decode graph launch");
  else compute();
  logits_.resize(size_t(lrows) * c_.vocab_size);
  cuda_check(cudaMemcpyAsync(logits_.data(), logits_dev_.ptr, logits_.size() * 4, cudaMemcpyDeviceToHost, stream_), "logits download");
  cuda_check(cudaStreamSynchronize(stream_), "forward");
  for (const SequenceInput& in : inputs) lengths_[in.slot] += int(in.tokens.size());
  return logits_;
}

}  // namespace

std::unique_ptr<LlamaModel> create_llama_cuda(const ModelWeights& weights, const RuntimeOptions& options) {
  return std::make_unique<LlamaCuda>(weights, options);
}

}  // namespace flashlite::engine
