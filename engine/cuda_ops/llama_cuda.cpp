#include "engine/llama_cuda.h"

#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "engine/cuda_ops/env_switch.h"
#include "engine/cuda_ops/gemm.h"
#include "engine/cuda_ops/gemv.h"
#include "engine/cuda_ops/ops.h"
#include "engine/cuda_ops/select.h"
#include "engine/cuda_ops/step_timeline.h"
#include "engine/errors.h"
#include "flashlite/kv_cache.h"
#include "src/cuda/decode/decode_timeline.h"

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

// Page-locked host memory for what comes back each step (ids, top-k candidates): no staging copy, no pageable fault.
struct PinnedBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  PinnedBuffer() = default;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer() {
    if (ptr) cudaFreeHost(ptr);
  }
  void reserve(size_t n) {
    if (n <= bytes) return;
    if (ptr) cudaFreeHost(ptr);
    ptr = nullptr;
    bytes = 0;
    cuda_check(cudaMallocHost(&ptr, n), "pinned allocation of " + std::to_string(n) + " bytes");
    bytes = n;
  }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr); }
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
    read_variant_switches();  // FLASHLITE_ENGINE_*: a bad value fails before anything is allocated
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
    if (timeline_on_) {
      timeline_layout_.layers = c_.n_layers;
      timeline_.reserve(timeline_layout_.words() * 8, "the timeline");
      cuda_check(cudaMemset(timeline_.ptr, 0, timeline_.bytes), "zeroing the timeline");
    }
    if (stream_gemv_) {
      stream_counters_.reserve(size_t(c_.n_layers) * 4 * 2 * sizeof(uint32_t), "the streamed GEMV's counters");
      cuda_check(cudaMemset(stream_counters_.ptr, 0, stream_counters_.bytes), "zeroing the streamed GEMV's counters");
    }
    attention_ = choose_attention();
    decode_ok_ = probe_decode();
    graphs_on_ = decode_ok_ && graph_env_;  // FLASHLITE_ENGINE_GRAPH=0: decode steps run eagerly
  }

  ~LlamaCuda() override {
    print_timeline();
    for (auto& [rows, g] : graphs_)
      if (g.exec) cudaGraphExecDestroy(g.exec);
    for (cudaEvent_t e : prof_events_) cudaEventDestroy(e);
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

  const std::vector<float>& forward(const std::vector<SequenceInput>& inputs) override {
    run(inputs, LogitsRequest{});
    return logits_;
  }
  LogitsOutput forward_select(const std::vector<SequenceInput>& inputs, const LogitsRequest& request) override {
    return run(inputs, request);
  }

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
    a.cache.device.seq_lens = TensorView::contiguous(step_in(3), DType::i32, dev, {batch});
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
    // q and out must point at real buffers (an explicit --attention skips choose_attention's scratch): with null ones
    // the library rejects the probe and batched decode and graphs would be off for no reason.
    ensure_scratch(1, 1);  // covers the step inputs (slots_ rows) too
    const int32_t one = 1;
    try {
      decode_kernel_name(decode_args(0, 1, &one, nullptr));
      return true;
    } catch (const Error&) {
      return false;
    }
  }

  LogitsOutput run(const std::vector<SequenceInput>& inputs, const LogitsRequest& request);

  // Variants of the decode step (docs/perf-notes.md, Engine (CUDA), Round 3), read once when the model is built,
  // before anything is allocated. The defaults are the combination measured fastest at batch 1 on the H100 (1.295 ->
  // 1.208 ms per step, bench/results/h100/e2e_variants.json): split-K auto, fused RoPE, fused argmax, preload
  // everywhere with no L2 prefetch lines. Parsed strictly (env_switch.h): unset or empty is the default; a flag takes
  // 0/off/false/no or 1/on/true/yes (any case); any other value, or one outside what is listed here, is an error.
  //   FLASHLITE_ENGINE_GRAPH=1         (default; a flag) decode steps replayed from CUDA graphs;
  //   FLASHLITE_ENGINE_GEMV=1          (default; a flag) few-row steps through the fused GEMVs (bf16 only);
  //   FLASHLITE_ENGINE_PDL=1           (default; a flag) programmatic dependent launch on sm_90 (pdl.cuh; read once
  //                                    per process there, validated here for every model);
  //   FLASHLITE_ENGINE_SPLITK=1        (default) split-K for the residual-adding GEMVs (O, down) with gemv_auto_split's
  //                          =0        off; =2|4|8 that many warps per output row for both;
  //   FLASHLITE_ENGINE_FUSE_ROPE=1     (default; a flag) RoPE + KV-cache append in the QKV GEMV's epilogue (no
  //                                    rope_append launch);
  //   FLASHLITE_ENGINE_FUSE_ARGMAX=1   (default; a flag) greedy argmax in the LM-head GEMV's epilogue, the keys zeroed
  //                                    by the embedding kernel (no memset and argmax launches);
  //   FLASHLITE_ENGINE_PRELOAD=1       (default; a flag, or small) each GEMV warp loads its first batch of weights
  //                                    before griddepcontrol.wait;
  //                          =small    only the QKV, O and down GEMVs (gate/up and the LM head keep the default
  //                                    kernel: 4 blocks per SM where a preloading RMSNorm GEMV holds 3);
  //                          =after    every GEMV, but the RMSNorm ones (QKV, gate/up, LM head) issue theirs after
  //                                    the wait, behind the prologue's activation loads;
  //   FLASHLITE_ENGINE_GATEUP_GRID=auto (default) the gate/up GEMV launched as a block per tile (8 of its 8192 row
  //                                    pairs) in one-row steps (batch 1, prompt 512 on the H100: 918-924 against
  //                                    885-909 tok/s in three paired runs), as one resident wave otherwise;
  //                          =tiles    a block per tile at every GEMV row count (<= 8);
  //                          =wave     one resident wave (the old launch);
  //   FLASHLITE_ENGINE_LMHEAD_GRID=auto (default) the LM-head GEMV as a block per tile (8 of its vocabulary rows) in
  //                                    one-row steps (batch 1, prompt 512 on the H100, four calls: mean 922.5
  //                                    against 917.6 tok/s, +0.5%), as one resident wave otherwise;
  //                          =tiles    a block per tile at every GEMV row count (<= 8);
  //                          =wave     one resident wave (the old launch);
  //   FLASHLITE_ENGINE_DOWN_GRID=auto  (default) the down GEMV as one resident wave of looping blocks;
  //                          =tiles    a block per tile; =wave  the same as auto;
  //   FLASHLITE_ENGINE_PREFETCH=N      N >= 0 weight lines per row prefetched into L2 before the wait (default 0 with
  //                                    preload on, 4 with it off);
  //   FLASHLITE_ENGINE_NORM_EARLY=1    (default; a flag) the RMSNorm GEMVs load their norm weight before the wait
  //                                    (a weight: read once per step, so a DRAM miss; =0 loads it after, beside x);
  //   FLASHLITE_ENGINE_WEIGHT_EVICT_FIRST=1 (default; a flag) the GEMVs' weight loads marked evict-first in L2, so
  //                                    the weights (read once per step) leave the KV cache, activations, norm
  //                                    weights and kernel code in L2 (=0: the default policy);
  //   FLASHLITE_ENGINE_PDL_TRIGGER=late  GEMVs let their dependents launch after their main loop, not at their start
  //                          =early    (default) at their start;
  //   FLASHLITE_ENGINE_STREAM=0        (default; a flag) one-row QKV, O, gate/up and down GEMVs through the streamed
  //                                    kernel (gemv_stream.cu: bulk copies into a shared-memory ring, the first ring
  //                                    issued before griddepcontrol.wait; sm_90);
  //   FLASHLITE_ENGINE_STREAM_STAGES=N its 8 KB ring slots: 16 (default) or 8;
  //   FLASHLITE_ENGINE_STREAM_BLOCKS=N its blocks per SM, 1..4 (default 1);
  //   FLASHLITE_ENGINE_DECODE_SPLITS=N the decode plan's KV splits forced to N >= 1 (0, the default: flashlite's choice);
  //   FLASHLITE_ENGINE_PROFILE=1       (a flag, default off, or range) decode steps run eagerly, queued behind a flag,
  //                                    with an event after each kernel group: per-kernel times on stderr every 16
  //                                    steps per batch size;
  //                          =range    the 8th decode step runs eagerly between cudaProfilerStart/Stop (for
  //                                    `ncu --profile-from-start off`);
  //   FLASHLITE_ENGINE_VERBOSE=1       (a flag, default off) the variants in effect on stderr (also printed whenever
  //                                    PDL_TRIGGER, DECODE_SPLITS or PROFILE is not its default).
  void read_variant_switches() {
    namespace es = env_switch;
    graph_env_ = es::flag("FLASHLITE_ENGINE_GRAPH", true);
    gemv_on_ = es::flag("FLASHLITE_ENGINE_GEMV", true) && elem_ == Elem::bf16;
    es::flag("FLASHLITE_ENGINE_PDL", true);  // pdl_enabled() reads it (once per process); an error here, not mid-step
    splitk_ = es::integer_in("FLASHLITE_ENGINE_SPLITK", 1, {0, 1, 2, 4, 8}, "0, 1 (automatic), 2, 4 or 8");
    fuse_rope_ = es::flag("FLASHLITE_ENGINE_FUSE_ROPE", true) && c_.head_dim % 8 == 0;
    fuse_argmax_ = es::flag("FLASHLITE_ENGINE_FUSE_ARGMAX", true);
    preload_ = es::choice("FLASHLITE_ENGINE_PRELOAD", 1, es::flag_names(0, 1, {{"small", 2}, {"after", 3}}),
                          "a flag (0, off, false, no; 1, on, true, yes), small or after");
    // Lines per weight row prefetched before the wait.
    prefetch_lines_ = es::integer("FLASHLITE_ENGINE_PREFETCH", preload_ == 1 ? 0 : 4, 0, INT_MAX,
                                  "a number of lines >= 0");
    late_trigger_ = es::choice("FLASHLITE_ENGINE_PDL_TRIGGER", 0, {{"early", 0}, {"late", 1}}, "early or late") != 0;
    norm_early_ = es::flag("FLASHLITE_ENGINE_NORM_EARLY", true);
    const std::vector<es::Name> grids = {
        {"auto", int(GemvGrid::automatic)}, {"tiles", int(GemvGrid::tiles)}, {"wave", int(GemvGrid::wave)}};
    const auto grid = [&](const char* var) {
      return GemvGrid(es::choice(var, int(GemvGrid::automatic), grids, "auto, tiles or wave"));
    };
    gateup_grid_ = grid("FLASHLITE_ENGINE_GATEUP_GRID");
    lmhead_grid_ = grid("FLASHLITE_ENGINE_LMHEAD_GRID");
    down_grid_ = grid("FLASHLITE_ENGINE_DOWN_GRID");
    weight_evict_first_ = es::flag("FLASHLITE_ENGINE_WEIGHT_EVICT_FIRST", true);
    stream_gemv_ = es::flag("FLASHLITE_ENGINE_STREAM", false);
    stream_stages_ = es::integer_in("FLASHLITE_ENGINE_STREAM_STAGES", 16, {8, 16}, "8 or 16");
    stream_blocks_ = es::integer("FLASHLITE_ENGINE_STREAM_BLOCKS", 1, 1, 4, "1 to 4 blocks per SM");
    decode_splits_ = es::integer("FLASHLITE_ENGINE_DECODE_SPLITS", 0, 0, INT_MAX, "0 (automatic) or a split count >= 1");
    profile_ = Profile(es::choice("FLASHLITE_ENGINE_PROFILE", int(Profile::off),
                                  es::flag_names(int(Profile::off), int(Profile::events), {{"range", int(Profile::range)}}),
                                  "a flag (0, off, false, no; 1, on, true, yes: events) or range"));
    timeline_on_ = es::flag("FLASHLITE_ENGINE_TIMELINE", false);
#if !FLASHLITE_DECODE_TIMELINE
    if (timeline_on_) fail("FLASHLITE_ENGINE_TIMELINE=1 needs a diagnostic build (-DFLASHLITE_DECODE_TIMELINE=1)");
#endif
    const bool verbose = es::flag("FLASHLITE_ENGINE_VERBOSE", false);
    if (verbose || late_trigger_ || decode_splits_ || stream_gemv_ || profile_ != Profile::off) {
      auto env = [](const char* name) -> std::string {
        const char* v = std::getenv(name);
        return v ? v : "";
      };
      const std::string pr = env("FLASHLITE_ENGINE_PROFILE"), pdl = env("FLASHLITE_ENGINE_PDL");
      std::fprintf(stderr,
                   "flashlite engine variants: splitk %d, fuse_rope %d, fuse_argmax %d, preload %d, pdl_trigger %s, "
                   "decode_splits %d, profile %s, gemv %d, pdl env %s, prefetch %d, stream %d (stages %d, blocks %d), "
                   "norm_early %d, weight_evict_first %d, gateup_grid %s, lmhead_grid %s, down_grid %s\n",
                   splitk_, int(fuse_rope_), int(fuse_argmax_), int(preload_), late_trigger_ ? "late" : "early",
                   decode_splits_, pr.empty() ? "off" : pr.c_str(), int(gemv_on_), pdl.empty() ? "default" : pdl.c_str(),
                   prefetch_lines_, int(stream_gemv_), stream_stages_, stream_blocks_, int(norm_early_),
                   int(weight_evict_first_),
                   grid_name(gateup_grid_), grid_name(lmhead_grid_), grid_name(down_grid_));
    }
  }

  // Profile mode (events): one event after each kernel group of an eagerly run step; names[i] ends at event i + 1.
  struct StepProfile {
    int steps = 0;
    std::map<std::string, std::pair<double, int>> by_name;  // us summed over steps, launches (groups) over steps
    std::vector<std::string> order;
    double total_us = 0;
  };
  void profile_mark(const char* name) {
    if (!prof_active_) return;
    if (prof_used_ >= prof_events_.size()) {
      cudaEvent_t e;
      cuda_check(cudaEventCreate(&e), "profile event");
      prof_events_.push_back(e);
    }
    cuda_check(cudaEventRecord(prof_events_[prof_used_++], stream_), "profile event");
    prof_names_.emplace_back(name);
  }
  void profile_collect(int rows) {
    StepProfile& sp = prof_steps_[rows];
    for (size_t i = 1; i < prof_used_; ++i) {
      float ms = 0;
      cuda_check(cudaEventElapsedTime(&ms, prof_events_[i - 1], prof_events_[i]), "profile timing");
      const std::string& n = prof_names_[i];
      auto [it, fresh] = sp.by_name.try_emplace(n, 0.0, 0);
      if (fresh) sp.order.push_back(n);
      it->second.first += ms * 1e3;
      it->second.second += 1;
      sp.total_us += ms * 1e3;
    }
    if (++sp.steps < 16) return;
    std::fprintf(stderr, "flashlite engine profile: rows %d, %d eager decode steps queued behind a flag, %.1f us per step "
                         "(events between kernel groups; PDL overlap and graph replay absent)\n", rows, sp.steps,
                 sp.total_us / sp.steps);
    for (const std::string& n : sp.order) {
      const auto& [us, count] = sp.by_name[n];
      std::fprintf(stderr, "  %-12s %9.1f us/step %5.1f launches/step %8.2f us each\n", n.c_str(), us / sp.steps,
                   double(count) / sp.steps, us / count);
    }
    std::fflush(stderr);
    sp = StepProfile{};
  }

  // y = rmsnorm(x[row_index]) W^T with the given epilogue (W: (out, dim), swiglu: (2 out, dim)).
  cuda_ops::GemvParams normed_gemv(const void* w, int out, const void* norm_w, const int32_t* row_index, int rows,
                                   cuda_ops::GemvOut epi, void* y) {
    cuda_ops::GemvParams p;
    p.w = w;
    p.out = out;
    p.k = c_.dim;
    p.rows = rows;
    p.in = cuda_ops::GemvIn::rmsnorm;
    p.xf = x_.as<float>();
    p.norm_w = norm_w;
    p.row_index = row_index;
    p.eps = c_.rms_eps;
    p.epi = epi;
    p.y = y;
    p.prefetch_lines = prefetch_lines_;
    p.preload = preload_ == 1 || preload_ == 3;  // QKV sets its own (preload=small)
    p.preload_after_x = preload_ == 3;
    p.norm_early = norm_early_;
    p.weight_evict_first = weight_evict_first_;
    p.late_trigger = late_trigger_;
    return p;
  }
  // The streamed kernel for GEMV `site` (0 QKV, 1 O, 2 gate/up, 3 down) of layer l, where enabled (gemv falls back
  // to the register kernel for shapes it does not take).
  cuda_ops::GemvParams streamed(cuda_ops::GemvParams p, int l, int site) const {
    if (!stream_gemv_) return p;
    p.stream = true;
    p.stream_stages = stream_stages_;
    p.stream_blocks_per_sm = stream_blocks_;
    p.counters = stream_counters_.as<uint32_t>() + (size_t(l) * 4 + site) * 2;
    return p;
  }
  // x += in W^T (the residual stream; W: (dim, k), in: (rows, k) bf16).
  cuda_ops::GemvParams added_gemv(const void* w, int out, int k, const void* in, int rows) {
    cuda_ops::GemvParams p;
    p.w = w;
    p.out = out;
    p.k = k;
    p.rows = rows;
    p.in = cuda_ops::GemvIn::bf16;
    p.x = in;
    p.epi = cuda_ops::GemvOut::add_f32;
    p.y = x_.as<float>();
    p.prefetch_lines = prefetch_lines_;
    p.preload = preload_ != 0;
    p.weight_evict_first = weight_evict_first_;
    p.late_trigger = late_trigger_;
    p.split = splitk_ == 1 ? cuda_ops::gemv_auto_split(out, k) : std::max(1, splitk_);
    return p;
  }

  // Whether a forward over `rows` rows takes the fused GEMVs (every reduction length they see fits; only the
  // RMSNorm-prologue ones, k = dim, stage their input in shared memory).
  bool use_gemv(int rows) const {
    return gemv_on_ && cuda_ops::gemv_supported(rows, c_.dim, true) && cuda_ops::gemv_supported(rows, c_.q_dim(), false) &&
           cuda_ops::gemv_supported(rows, c_.hidden_dim, false);
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
    ensure_step_inputs(std::max({rows, logit_rows, slots_}));
    logits_dev_.reserve(size_t(logit_rows) * c_.vocab_size * 4, "logits");
    keys_dev_.reserve(size_t(logit_rows) * 8, "argmax keys");
    keys_host_.reserve(size_t(logit_rows) * 8);
  }

  // A step's small inputs go up in one copy from pinned memory, laid out for `cap` rows: [0] token ids, [1] positions,
  // [2] logit row index, [3] sequence lengths after the step (int32, cap each), then the cache rows (int64, cap).
  void ensure_step_inputs(int cap) {
    if (cap <= step_cap_) return;
    step_in_dev_.reserve(size_t(cap) * 24, "step inputs");
    step_in_host_.reserve(size_t(cap) * 24);
    step_cap_ = cap;
  }
  int32_t* step_in(int i) const { return step_in_dev_.as<int32_t>() + size_t(i) * step_cap_; }
  int32_t* step_in_host(int i) const { return step_in_host_.as<int32_t>() + size_t(i) * step_cap_; }
  int64_t* cache_rows_dev() const { return reinterpret_cast<int64_t*>(step_in(4)); }

  struct Layer {
    DeviceBuffer rms_att, wqkv, wo, rms_ffn, w13, w2;
  };

  ModelConfig c_;
  RuntimeOptions opt_;
  Elem elem_ = Elem::bf16;
  int context_ = 0, slots_ = 1;
  Backend attention_ = Backend::cuda;
  bool decode_ok_ = false, graphs_on_ = false, gemv_on_ = false;
  bool graph_env_ = true;  // FLASHLITE_ENGINE_GRAPH (graphs_on_ also needs the batched decode kernel)
  int prefetch_lines_ = 0;
  // Round-3 variants (read_variant_switches).
  int splitk_ = 0, decode_splits_ = 0;
  int preload_ = 0;  // 0 off, 1 every GEMV, 2 QKV / O / down
  bool fuse_rope_ = false, fuse_argmax_ = false, late_trigger_ = false;
  bool stream_gemv_ = false;  // the streamed GEMV (one-row QKV, O, gate/up, down)
  int stream_stages_ = 16, stream_blocks_ = 1;
  bool norm_early_ = true;  // FLASHLITE_ENGINE_NORM_EARLY
  enum class GemvGrid { automatic, tiles, wave };
  static const char* grid_name(GemvGrid g) {
    return g == GemvGrid::automatic ? "auto" : g == GemvGrid::tiles ? "tiles" : "wave";
  }
  // GemvParams::grid_blocks under a grid switch: a block per tile when forced, or under auto in one-row steps for the
  // GEMVs where that measured faster (auto_per_tile); otherwise one resident wave of looping blocks.
  static int grid_blocks(GemvGrid g, int rows, bool auto_per_tile) {
    const bool per_tile = g == GemvGrid::tiles || (g == GemvGrid::automatic && auto_per_tile && rows == 1);
    return per_tile ? cuda_ops::kGemvBlockPerTile : 0;
  }
  GemvGrid gateup_grid_ = GemvGrid::automatic;  // FLASHLITE_ENGINE_GATEUP_GRID
  GemvGrid lmhead_grid_ = GemvGrid::automatic;  // FLASHLITE_ENGINE_LMHEAD_GRID
  GemvGrid down_grid_ = GemvGrid::automatic;    // FLASHLITE_ENGINE_DOWN_GRID
  bool weight_evict_first_ = true;  // FLASHLITE_ENGINE_WEIGHT_EVICT_FIRST
  // FLASHLITE_ENGINE_TIMELINE (diagnostic builds): per-block %globaltimer stamps of the last decode step (layout:
  // step_timeline.h), printed when the model is destroyed.
  bool timeline_on_ = false;
  cuda_ops::StepTimeline timeline_layout_;
  DeviceBuffer timeline_;
  unsigned long long* gemv_timeline(int l, int site) const {
    return timeline_on_ ? timeline_.as<unsigned long long>() + timeline_layout_.gemv_offset(l, site) : nullptr;
  }
  void print_timeline() {
    if (!timeline_on_ || !timeline_.ptr) return;
    std::vector<unsigned long long> h(timeline_layout_.words());
    if (cudaDeviceSynchronize() != cudaSuccess ||
        cudaMemcpy(h.data(), timeline_.ptr, h.size() * 8, cudaMemcpyDeviceToHost) != cudaSuccess) {
      std::fprintf(stderr, "timeline: copy failed\n");
      return;
    }
    cuda_ops::print_step_timeline(timeline_layout_, h.data(), stderr);
  }
  DeviceBuffer stream_counters_;  // (layers, 4 GEMVs, 2) work counters of the streamed GEMV, zeroed once
  enum class Profile { off, events, range } profile_ = Profile::off;
  bool prof_active_ = false;
  int decode_steps_seen_ = 0;
  std::map<int, int> prof_seen_rows_;  // events: decode steps seen per batch size
  std::vector<cudaEvent_t> prof_events_;
  size_t prof_used_ = 0;
  std::vector<std::string> prof_names_;
  std::map<int, StepProfile> prof_steps_;
  PinnedBuffer prof_flag_;
  // Decode steps replayed from a CUDA graph, one per batch size: captured the second time that size is seen (the
  // first runs eagerly: lazy module loading and cuBLASLt heuristics stay out of the capture).
  struct GraphEntry {
    cudaGraphExec_t exec = nullptr;
    uint64_t generation = 0;
    int seen = 0;
  };
  std::map<std::tuple<int, int, int>, GraphEntry> graphs_;  // (rows, selection kind, k)
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
  DeviceBuffer x_, xb_, qkv_, att_, h13_, hb_, xo_, logits_dev_, decode_ws_;
  DeviceBuffer step_in_dev_;  // see ensure_step_inputs
  PinnedBuffer step_in_host_;
  int step_cap_ = 0;
  DeviceBuffer keys_dev_, topk_values_dev_, topk_ids_dev_;  // (logit rows) argmax keys; (logit rows, k) candidates
  PinnedBuffer keys_host_, topk_values_host_, topk_ids_host_;
  std::vector<float> logits_;
};

LogitsOutput LlamaCuda::run(const std::vector<SequenceInput>& inputs, const LogitsRequest& request) {
  const int dim = c_.dim, qd = c_.q_dim(), kvd = c_.kv_dim(), hid = c_.hidden_dim, qkv_w = qd + 2 * kvd;
  std::vector<int32_t> tokens, pos, logit_index;
  std::vector<int64_t> cache_row;
  std::vector<int> row0;
  // Nothing to run: zero rows would reach the kernels as zero-block launches (and, inside a graph capture, turn the
  // graphs off for good). Rejected before anything is uploaded or launched.
  if (inputs.empty()) fail("forward needs at least one input sequence; got none");
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
  const int rows = int(tokens.size()), lrows = int(logit_index.size()), vocab = c_.vocab_size;
  if (request.kind == LogitsRequest::Kind::top_k && (request.k <= 0 || request.k >= vocab)) {
    fail("top-k request for " + std::to_string(request.k) + " candidates; expected 0 < k < " + std::to_string(vocab));
  }
  ensure_scratch(rows, lrows);
  if (request.kind == LogitsRequest::Kind::top_k) {
    const size_t n = size_t(lrows) * request.k;
    topk_values_dev_.reserve(n * 4, "top-k values");
    topk_ids_dev_.reserve(n * 4, "top-k ids");
    topk_values_host_.reserve(n * 4);
    topk_ids_host_.reserve(n * 4);
  }
  const bool gemv = use_gemv(rows);
  // A decode step over slots 0..rows-1, one token each: one batched decode launch per layer.
  bool batched_decode = decode_ok_ && rows == int(inputs.size());
  for (size_t q = 0; batched_decode && q < inputs.size(); ++q) batched_decode = inputs[q].slot == int(q);
  std::vector<int32_t> lens_after;
  DecodePlan plan;
  if (batched_decode) {
    for (const SequenceInput& in : inputs) lens_after.push_back(int32_t(lengths_[in.slot] + 1));
    std::copy(lens_after.begin(), lens_after.end(), step_in_host(3));
    plan = plan_decode(decode_args(0, rows, lens_after.data(), nullptr), context_, decode_splits_);  // graph-stable
    if (plan.workspace_bytes > decode_ws_.bytes) {
      cuda_check(cudaStreamSynchronize(stream_), "decode workspace");
      decode_ws_.reserve(plan.workspace_bytes, "the decode workspace");
    }
  }
  std::copy(tokens.begin(), tokens.end(), step_in_host(0));
  std::copy(pos.begin(), pos.end(), step_in_host(1));
  std::copy(logit_index.begin(), logit_index.end(), step_in_host(2));
  std::copy(cache_row.begin(), cache_row.end(), reinterpret_cast<int64_t*>(step_in_host(4)));
  cuda_check(cudaMemcpyAsync(step_in_dev_.ptr, step_in_host_.ptr, size_t(step_cap_) * 16 + size_t(rows) * 8,
                             cudaMemcpyHostToDevice, stream_), "step input upload");

  void* s = stream_;
  // Variants that change the step's kernels (read_variant_switches): RoPE + append in the QKV GEMV, argmax in the LM head.
  const bool fused_rope = gemv && fuse_rope_;
  const bool fused_argmax = gemv && fuse_argmax_ && request.kind == LogitsRequest::Kind::argmax && lrows <= 256;
  auto mark = [&](const char* name) { profile_mark(name); };
#if FLASHLITE_DECODE_TIMELINE
  if (timeline_on_ && batched_decode) {  // layer l's decode launch stamps slot l
    cuda_decode_set_timeline(timeline_.as<unsigned long long>(), cuda_ops::StepTimeline::kBlocks, size_t(c_.n_layers));
  }
#endif
  auto compute = [&] {
    mark("start");
    cuda_ops::embed(x_.as<float>(), embedding_.ptr, step_in(0), rows, dim, elem_, s,
                    fused_argmax ? keys_dev_.as<uint64_t>() : nullptr, fused_argmax ? lrows : 0);
    mark("embed");
    for (int l = 0; l < c_.n_layers; ++l) {
      const Layer& L = layers_[l];
      if (fused_rope) {  // qkv = rmsnorm(x) Wqkv^T; q, k rotated; k, v appended to the cache
        cuda_ops::GemvParams p = normed_gemv(L.wqkv.ptr, qkv_w, L.rms_att.ptr, nullptr, rows, cuda_ops::GemvOut::rope_bf16,
                                             qkv_.ptr);
        p.rope.cos = cos_.as<float>();
        p.rope.sin = sin_.as<float>();
        p.rope.pos = step_in(1);
        p.rope.cache_row = cache_rows_dev();
        p.rope.k_cache = k_cache_[l]->ptr;
        p.rope.v_cache = v_cache_[l]->ptr;
        p.rope.heads = c_.n_heads;
        p.rope.kv_heads = c_.n_kv_heads;
        p.rope.head_dim = c_.head_dim;
        p.rope.interleaved = c_.rope_style == RopeStyle::interleaved;
        p.preload = preload_ != 0;
        p.timeline = gemv_timeline(l, 0);
        cuda_ops::gemv(streamed(p, l, 0), s);
        mark("qkv+rope");
      } else if (gemv) {  // qkv = rmsnorm(x) Wqkv^T
        cuda_ops::GemvParams p = normed_gemv(L.wqkv.ptr, qkv_w, L.rms_att.ptr, nullptr, rows, cuda_ops::GemvOut::bf16, qkv_.ptr);
        p.preload = preload_ != 0;
        cuda_ops::gemv(streamed(p, l, 0), s);
        mark("qkv");
      } else {
        cuda_ops::rmsnorm(xb_.ptr, x_.as<float>(), L.rms_att.ptr, nullptr, rows, dim, c_.rms_eps, elem_, s);
        gemm_->run(qkv_.ptr, xb_.ptr, L.wqkv.ptr, rows, dim, qkv_w, elem_, false, s);
        mark("qkv");
      }
      if (!fused_rope) {
        cuda_ops::RopeAppendParams rp;
        rp.qkv = qkv_.ptr;
        rp.cos = cos_.as<float>();
        rp.sin = sin_.as<float>();
        rp.pos = step_in(1);
        rp.cache_row = cache_rows_dev();
        rp.k_cache = k_cache_[l]->ptr;
        rp.v_cache = v_cache_[l]->ptr;
        rp.rows = rows;
        rp.heads = c_.n_heads;
        rp.kv_heads = c_.n_kv_heads;
        rp.head_dim = c_.head_dim;
        rp.interleaved = c_.rope_style == RopeStyle::interleaved;
        rp.elem = elem_;
        cuda_ops::rope_append(rp, s);
        mark("rope");
      }
      if (batched_decode) {
        flashlite::decode(decode_args(l, rows, lens_after.data(), &plan));
      } else {
        for (size_t q = 0; q < inputs.size(); ++q) {
          const int n = int(inputs[q].tokens.size());
          flashlite::forward(attention_args(l, inputs[q].slot, row0[q], n, lengths_[inputs[q].slot] + n));
        }
      }
      mark("attention");
      if (gemv) {  // x += att Wo^T; h = swiglu(rmsnorm(x) W13^T); x += h W2^T
        cuda_ops::GemvParams po = added_gemv(L.wo.ptr, dim, qd, att_.ptr, rows);
        po.timeline = gemv_timeline(l, 1);
        cuda_ops::gemv(streamed(po, l, 1), s);
        mark("o");
        cuda_ops::GemvParams pg = normed_gemv(L.w13.ptr, hid, L.rms_ffn.ptr, nullptr, rows, cuda_ops::GemvOut::swiglu_bf16, hb_.ptr);
        pg.timeline = gemv_timeline(l, 2);
        pg.grid_blocks = grid_blocks(gateup_grid_, rows, true);
        cuda_ops::gemv(streamed(pg, l, 2), s);
        mark("gate_up");
        cuda_ops::GemvParams pd = added_gemv(L.w2.ptr, dim, hid, hb_.ptr, rows);
        pd.timeline = gemv_timeline(l, 3);
        pd.grid_blocks = grid_blocks(down_grid_, rows, false);
        cuda_ops::gemv(streamed(pd, l, 3), s);
        mark("down");
        continue;
      }
      gemm_->run(xo_.ptr, att_.ptr, L.wo.ptr, rows, qd, dim, elem_, false, s);
      cuda_ops::residual_add(x_.as<float>(), xo_.ptr, size_t(rows) * dim, elem_, s);
      mark("o");
      cuda_ops::rmsnorm(xb_.ptr, x_.as<float>(), L.rms_ffn.ptr, nullptr, rows, dim, c_.rms_eps, elem_, s);
      gemm_->run(h13_.ptr, xb_.ptr, L.w13.ptr, rows, dim, 2 * hid, elem_, false, s);
      cuda_ops::swiglu(hb_.ptr, h13_.ptr, rows, hid, elem_, s);
      mark("gate_up");
      gemm_->run(xo_.ptr, hb_.ptr, L.w2.ptr, rows, hid, dim, elem_, false, s);
      cuda_ops::residual_add(x_.as<float>(), xo_.ptr, size_t(rows) * dim, elem_, s);
      mark("down");
    }
    const void* head = c_.tie_embeddings ? embedding_.ptr : lm_head_.ptr;
    if (gemv) {
      cuda_ops::GemvParams p = normed_gemv(head, vocab, rms_final_.ptr, step_in(2), lrows,
                                           fused_argmax ? cuda_ops::GemvOut::f32_argmax : cuda_ops::GemvOut::f32,
                                           logits_dev_.ptr);
      p.argmax_keys = fused_argmax ? keys_dev_.as<uint64_t>() : nullptr;
      p.grid_blocks = grid_blocks(lmhead_grid_, lrows, true);
      cuda_ops::gemv(p, s);
    } else {
      cuda_ops::rmsnorm(xb_.ptr, x_.as<float>(), rms_final_.ptr, step_in(2), lrows, dim, c_.rms_eps, elem_, s);
      gemm_->run(logits_dev_.ptr, xb_.ptr, head, lrows, dim, vocab, elem_, true, s);
    }
    mark("lm_head");
    if (request.kind == LogitsRequest::Kind::argmax && !fused_argmax) {
      cuda_ops::argmax_rows(keys_dev_.as<uint64_t>(), logits_dev_.as<float>(), lrows, vocab, s);
    } else if (request.kind == LogitsRequest::Kind::top_k) {
      cuda_ops::top_k_rows(topk_values_dev_.as<float>(), topk_ids_dev_.as<int32_t>(), logits_dev_.as<float>(), lrows,
                           vocab, request.k, s);
    }
    mark("select");
  };
  // Profile modes: decode steps run eagerly (events), or the 8th one between cudaProfilerStart/Stop (range).
  // Events: the first decode step of each batch size runs unprofiled: its kernels (new GEMV instantiations, the decode
  // kernels) load lazily on first launch, and a module load may wait for the context to go idle, i.e. for the
  // wait_flag kernel, which only the host releases after the whole step is queued: a 2 s stall (its timeout) and host
  // gaps inside the first table otherwise (review 2026-11-23).
  bool profiled = false, ranged = false;
  if (batched_decode && profile_ != Profile::off) {
    ++decode_steps_seen_;
    profiled = profile_ == Profile::events && ++prof_seen_rows_[rows] > 1;
    ranged = profile_ == Profile::range && decode_steps_seen_ == 8;
  }
  // From here the step input copy may be in flight from the pinned staging buffer: when anything below throws, the
  // stream is drained (a second error ignored) before the error leaves, so the next call cannot rewrite the buffer
  // under a pending copy, and the profile state is reset (the wait_flag kernel released).
  volatile int* flag = nullptr;  // profiled steps: the host flag the queued step waits for
  LogitsOutput out;
  out.kind = request.kind;
  out.rows = lrows;
  out.vocab = vocab;
  try {
    GraphEntry* g = nullptr;
    if (batched_decode && graphs_on_ && !profiled && !ranged) {
      g = &graphs_[{rows, int(request.kind), request.k}];
      if (g->exec && g->generation != DeviceBuffer::generation()) {  // a buffer moved since the capture
        cudaGraphExecDestroy(g->exec);
        g->exec = nullptr;
      }
      if (!g->exec && ++g->seen >= 2 && !capture(*g, compute)) g = nullptr;
    }
    if (g && g->exec) {
      cuda_check(cudaGraphLaunch(g->exec, stream_), "decode graph launch");
    } else if (profiled) {
      // The whole step queued behind a flag so the GPU runs it without waiting for the host's launches.
      prof_flag_.reserve(sizeof(int));
      flag = prof_flag_.as<int>();
      *flag = 0;
      int* flag_dev = nullptr;  // the mapped pointer; under unified addressing the host pointer itself
      if (cudaHostGetDevicePointer(reinterpret_cast<void**>(&flag_dev), prof_flag_.ptr, 0) != cudaSuccess) {
        cudaGetLastError();
        flag_dev = prof_flag_.as<int>();
      }
      cuda_ops::wait_flag(flag_dev, 2000, s);
      prof_used_ = 0;
      prof_names_.clear();
      prof_active_ = true;
      compute();
      prof_active_ = false;
      *flag = 1;
    } else {
      if (ranged) {
        cudaProfilerStart();
        cudaGetLastError();  // no profiler attached: nothing to start, and no error left behind for the launches
      }
      compute();
      if (ranged) {
        cuda_check(cudaStreamSynchronize(stream_), "profiled step");
        cudaProfilerStop();
        cudaGetLastError();
      }
    }
    // Only what the sampler needs comes back: 8 bytes per row for argmax, k pairs for top-k, else the full rows.
    if (request.kind == LogitsRequest::Kind::argmax) {
      cuda_check(cudaMemcpyAsync(keys_host_.ptr, keys_dev_.ptr, size_t(lrows) * 8, cudaMemcpyDeviceToHost, stream_), "ids download");
    } else if (request.kind == LogitsRequest::Kind::top_k) {
      const size_t n = size_t(lrows) * request.k * 4;
      cuda_check(cudaMemcpyAsync(topk_values_host_.ptr, topk_values_dev_.ptr, n, cudaMemcpyDeviceToHost, stream_), "top-k download");
      cuda_check(cudaMemcpyAsync(topk_ids_host_.ptr, topk_ids_dev_.ptr, n, cudaMemcpyDeviceToHost, stream_), "top-k download");
    } else {
      logits_.resize(size_t(lrows) * vocab);
      cuda_check(cudaMemcpyAsync(logits_.data(), logits_dev_.ptr, logits_.size() * 4, cudaMemcpyDeviceToHost, stream_), "logits download");
    }
    cuda_check(cudaStreamSynchronize(stream_), "forward");
  } catch (...) {
    prof_active_ = false;
    if (flag) *flag = 1;
    cudaStreamSynchronize(stream_);
    cudaGetLastError();
    throw;
  }
  if (profiled) profile_collect(rows);
  for (const SequenceInput& in : inputs) lengths_[in.slot] += int(in.tokens.size());
  if (request.kind == LogitsRequest::Kind::argmax) {
    select_ids_.resize(lrows);
    for (int r = 0; r < lrows; ++r) {
      const uint64_t key = keys_host_.as<uint64_t>()[r];
      select_ids_[r] = cuda_ops::argmax_key_index(key);
      if (std::string why = cuda_ops::argmax_key_problem(key); !why.empty())  // the host path's refusal (model.cpp)
        fail("logits row " + std::to_string(r) + ": " + why);
    }
    out.ids = select_ids_.data();
  } else if (request.kind == LogitsRequest::Kind::top_k) {
    out.k = request.k;
    out.values = topk_values_host_.as<float>();
    out.ids = topk_ids_host_.as<int32_t>();
  } else {
    out.logits = logits_.data();
  }
  return out;
}

}  // namespace

std::unique_ptr<LlamaModel> create_llama_cuda(const ModelWeights& weights, const RuntimeOptions& options) {
  return std::make_unique<LlamaCuda>(weights, options);
}

}  // namespace flashlite::engine
