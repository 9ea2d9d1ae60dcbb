// The Llama model on a CUDA GPU: weights, KV cache and scratch on the device, and one forward call (a prefill, a
// decode step, or a mix) as a sequence of launches: embedding, per layer QKV + RoPE + cache append, attention, O,
// gate/up + SwiGLU, down, then the LM head and the selection the sampler asked for. The KV cache is a flashlite KV
// cache on the device (engine/kv_cache.h): contiguous, per layer [slots, context, kv_heads, head_dim], or paged
// (RuntimeOptions::kv_page_size: per layer a pool [pages, page_size, kv_heads, head_dim], pages taken as sequences
// grow, the server's cache; then a decode step batches any slots, a mixed step of short prompt chunks runs as a row
// step (Step::row_step: a decode step with one row per new token), and longer chunks read the cache through
// flashlite::prefill). Its index (lengths, pages) is a KvBook on the host. Steps of few rows take the fused GEMVs
// (gemv_sites.h; the QKV one rotates with the library's device RoPE and appends to the cache in its epilogue), the
// others cuBLASLt (gemm.h), flashlite::append_kv and the small kernels of ops.h; decode and row steps attend through
// flashlite::decode and are replayed from CUDA graphs (step_graphs.h), the rest through flashlite::forward or
// flashlite::prefill, launched one by one.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/cuda_ops/device_buffer.h"
#include "engine/cuda_ops/gemm.h"
#include "engine/cuda_ops/gemv_sites.h"
#include "engine/cuda_ops/ops.h"
#include "engine/cuda_ops/select.h"
#include "engine/cuda_ops/step_graphs.h"
#include "engine/cuda_ops/step_profile.h"
#include "engine/errors.h"
#include "engine/kv_cache.h"
#include "engine/llama_cuda.h"
#include "engine/parallel/collective.h"
#include "flashlite/kv_cache.h"
#include "flashlite/version.h"

namespace flashlite::engine {

namespace {

using cuda_ops::cuda_check;
using cuda_ops::DeviceBuffer;
using cuda_ops::Elem;
using cuda_ops::PinnedBuffer;

// Mixed steps (prompt chunks, with or without decode rows) of at most this many rows (after padding), each chunk
// of at most kRowStepMaxChunk tokens whose rows read at most kRowStepMaxChunkKeys keys in all, run as row steps on a
// paged cache (see Step::row_step). Each row of a chunk reads its sequence's keys again (from the L2); a longer chunk,
// or one late in a long prompt, takes flashlite::prefill, which reads them once.
constexpr int kRowStepMaxRows = 256;
constexpr int kRowStepMaxChunk = 128;
constexpr int64_t kRowStepMaxChunkKeys = 65536;  // keys one chunk's rows read in all (n rows x its length, about)
constexpr int kRowStepBucket = 32;  // past the GEMVs' row counts, row steps run multiples of this many rows

// Selections made from the rows' argmax keys (8 bytes a row back, the greedy one fused into the LM-head GEMV): the
// greedy token, and a tensor-parallel rank's single best candidate of its vocabulary slice (ParallelModel's greedy
// merge), which the key holds whole: value and id.
bool by_keys(const LogitsRequest& r) {
  return r.kind == LogitsRequest::Kind::argmax || (r.kind == LogitsRequest::Kind::top_k && r.k == 1 && r.shard);
}

// What one forward call runs, worked out on the host before anything is launched.
struct Step {
  int rows = 0;               // activation rows: new tokens over all inputs, then a row step's padding
  int lrows = 0;              // logit rows computed: those asked for, then a row step's padding
  int lrows_out = 0;          // logit rows asked for (the first lrows_out of lrows)
  std::vector<int> row0;      // first activation row of each input
  bool gemv = false;          // through the fused GEMVs
  bool decode = false;        // one batched decode launch per layer over the rows, replayed from a CUDA graph: one
                              // new token per input (any slots when paged, else slots 0..rows-1), or a row step
  bool row_step = false;      // paged, short chunks: every new token is a decode row of its own, attending its
                              // sequence up to its position (KvBook::position_table), the rows padded to a bucket
                              // (pad rows append to and read the pool's spare pages) so that one graph serves every
                              // mixed step of the bucket
  bool fused_argmax = false;  // the greedy argmax folded into the LM-head GEMV
  std::vector<int32_t> lens_after;  // each input's sequence length after this step (host; device: step_in(3))
  std::vector<int32_t> lens_before;  // ... before it (restored when the step fails)
  std::vector<int32_t> cu_rows;      // paged prefill: the inputs' first rows and the total (host, ragged q)
  std::vector<KvGroup> groups;      // the inputs as runs of slots (append_kv calls); a row step: its rows
  DecodePlan plan;                  // decode
};

// A step's graph: its rows, logit rows and what it selects on the device. A rank's single best candidate is the greedy
// step's work (the argmax keys), so it replays the greedy step's graph.
cuda_ops::StepGraphs::Key graph_key(const Step& st, const LogitsRequest& r) {
  if (by_keys(r)) return {st.rows, st.lrows, int(LogitsRequest::Kind::argmax), 0};
  return {st.rows, st.lrows, int(r.kind), r.k};
}

class LlamaCuda final : public LlamaModel {
 public:
  LlamaCuda(const ModelWeights& w, const RuntimeOptions& o, Collective* collective)
      : c_(w.rank_config()), vocab_in_(w.config.vocab_size), opt_(o), collective_(collective), graphs_(o.cuda.graphs) {
    const int ranks = collective ? collective->ranks() : 1;
    w.shard.require_ranks(ranks);
    for (int r = 0; r < ranks; ++r) {  // every rank's shape (they differ only in FFN width: uneven splits)
      rank_shapes_.push_back(c_);
      rank_shapes_.back().hidden_dim = ranks == 1 ? c_.hidden_dim : TensorShard::of(w.config, r, ranks).hidden;
    }
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
    cuda_check(cudaStreamCreate(&stream_owner_.s), "stream creation");
    stream_ = stream_owner_.s;
    if (collective_) graphs_.set_launch_guard([c = collective_](const std::function<void()>& f) { c->guarded(f); });
    gemm_ = std::make_unique<cuda_ops::Gemm>();  // after the device checks: it allocates on the device
    if (o.cuda.profile) profile_.emplace(stream_);
    // RoPE: the library's (append_kv; the fused QKV epilogue reads its cos / sin from tables of the same values).
    rope_ = rope_options(c_);
    const size_t table = size_t(context_) * (c_.head_dim / 2) * 4;
    cos_.reserve(table, "RoPE cos");
    sin_.reserve(table, "RoPE sin");
    cuda_ops::rope_tables(cos_.as<float>(), sin_.as<float>(), rope_, context_, c_.head_dim);
    const int page = std::max(0, o.kv_page_size);
    const auto refuse_paged = [](const std::string& why) {
      throw PagedCacheUnsupported(ErrorKind::invalid_value, "a paged KV cache on CUDA needs flashlite's decode and "
                                                            "prefill kernels (bf16, head_dim 64 or 128): " + why);
    };
    if (page > 0 && elem_ == Elem::f32) {  // before the pools are allocated (an fp32 pool may not even fit)
      refuse_paged("this model runs in fp32 (precision bf16 or auto, or the contiguous cache)");
    }
    const int pages = page == 0 ? 0 : o.kv_pages > 0 ? o.kv_pages : slots_ * ((context_ + page - 1) / page);
    kv_shape_ = {c_.n_layers, slots_, context_, c_.n_kv_heads, c_.head_dim, page, pages};
    book_ = KvBook(kv_shape_);
    pool_shape_ = kv_shape_;
    if (page) pool_shape_.pages = pages + spare_pages();  // + the row steps' pad rows, outside the book
    table_indices_ = size_t(pages);
    const size_t rows_per_layer = page ? size_t(pool_shape_.pages) * page : size_t(slots_) * context_;
    const size_t kv_bytes = rows_per_layer * c_.kv_dim() * esize();
    if (paged()) table_ = PageTable{{0, 1}, {0}, {1}};  // one token on page 0: what the probes plan with
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
    if (paged() && !decode_ok_) {
      const int32_t one = 1;
      const bool forced = opt_.attention != Backend::automatic && opt_.attention != Backend::cuda;
      refuse_paged(forced ? std::string("the attention backend was set to another")
                          : plan_decode(decode_args(0, 1, &one, nullptr)).unsupported);
    }
    upload_weights(w);  // last: a model the paged cache refuses falls back without uploading its weights twice
    if (o.cuda.verbose) print_plan();
  }

  const ModelConfig& config() const override { return c_; }
  int slots() const override { return slots_; }
  int context() const override { return context_; }
  int length(int slot) override { return book_.length(slot); }
  void reset(int slot) override { book_.set_length(slot, 0); }  // a paged slot's pages go back
  KvUsage kv_usage() override {
    if (!paged()) return LlamaModel::kv_usage();
    return {kv_shape_.page_size, book_.pages().total(), book_.pages().used()};
  }
  std::string device() const override {
    return std::string("cuda:") + std::to_string(opt_.device_index) + " " +
           ::flashlite::cuda_device_info(opt_.device_index).name + " (" +
           (elem_ == Elem::bf16 ? "bf16" : "fp32") + ")";
  }
  std::string attention_kernel() override {
    if (!decode_ok_) return forward_kernel_name(attention_args(0, 0, 0, 1, 1));
    const int32_t one = 1;
    return decode_kernel_name(decode_args(0, 1, &one, nullptr));
  }
  std::vector<int> warm_up_rows(int max_rows) const override {  // the GEMVs (no search) take the fewest rows
    int from = 1;
    while (from <= max_rows && use_gemv(from)) ++from;
    return cuda_ops::Gemm::search_rows(from, max_rows);
  }
  StepStats step_stats() const override { return stats_; }
  size_t device_bytes() const override {  // + the GEMM workspace
    return DeviceBuffer::allocated(opt_.device_index) + (size_t(32) << 20);
  }

  const std::vector<float>& forward(const std::vector<SequenceInput>& inputs) override {
    run(inputs, LogitsRequest{});
    return logits_;
  }
  LogitsOutput forward_select(const std::vector<SequenceInput>& inputs, const LogitsRequest& request) override {
    return run(inputs, request);
  }

 private:
  struct Layer {
    DeviceBuffer rms_att, wqkv, wo, rms_ffn, w13, w2;  // norms (dim); wqkv (q_dim + 2 kv_dim, dim); wo (dim, q_dim);
                                                       // w13 (2 hidden, dim): gate rows then up rows; w2 (dim, hidden)
  };

  size_t esize() const { return cuda_ops::elem_size(elem_); }
  DType dtype() const { return elem_ == Elem::bf16 ? DType::bf16 : DType::f32; }
  // The fused GEMVs take bf16 weights and few rows (CudaEngineOptions::gemv off: never).
  // The fused GEMVs when every rank's shard takes them: the ranks must agree on the path, since it decides their
  // collectives (an uneven FFN split may leave one rank a width the GEMVs refuse).
  bool use_gemv(int rows) const {
    if (!opt_.cuda.gemv || elem_ != Elem::bf16) return false;
    return std::all_of(rank_shapes_.begin(), rank_shapes_.end(),
                       [rows](const ModelConfig& c) { return cuda_ops::gemv_takes(c, rows); });
  }

  void upload(DeviceBuffer& dst, const float* src, size_t n, const char* what) {
    try {
      dst.reserve(n * esize(), what);
    } catch (const Error& e) {  // the KV cache is allocated before the weights: a failure here may be its doing
      const size_t cache = 2 * size_t(c_.n_layers) * (k_cache_.empty() ? 0 : k_cache_[0]->bytes);
      fail_runtime(std::string(e.what()) + " (the KV cache already holds " + std::to_string(cache) +
                   " bytes of the device: a smaller cache, i.e. fewer slots, context or pages, leaves more room)");
    }
    cuda_ops::upload(dst.ptr, src, n, elem_);
  }

  void upload_weights(const ModelWeights& w) {
    const size_t dim = c_.dim, hid = c_.hidden_dim, qd = c_.q_dim(), kvd = c_.kv_dim(), vocab = c_.vocab_size;
    upload(embedding_, w.embedding, size_t(vocab_in_) * dim, "the embedding");  // whole, also under TP
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

  // Layer `layer`'s flashlite KV cache over the `count` slots from slot0, holding host_lens / device_lens tokens.
  // Paged: the step's inputs [slot0, slot0 + count) of its page table (the lengths are the table's).
  KvCacheView cache_view(int layer, int slot0, int count, const int32_t* host_lens, const int32_t* device_lens) const {
    if (paged()) {
      return kv_paged_view(pool_shape_, k_cache_[layer]->ptr, v_cache_[layer]->ptr, dtype(),
                           Device::cuda(opt_.device_index), slot0, count, int64_t(table_.indices.size()),
                           pointers(table_), table_device());
    }
    return kv_cache_view(kv_shape_, k_cache_[layer]->ptr, v_cache_[layer]->ptr, dtype(), Device::cuda(opt_.device_index),
                         slot0, count, host_lens, device_lens);
  }

  bool paged() const { return kv_shape_.page_size > 0; }
  // Paged: the pool's pages past the book's, one position for each pad row of a row step (pad j appends position
  // j % pad_span() of spare page j / pad_span() and attends that page up to it: no two write one position, and no
  // pad row is longer than the context the decode plan is made for).
  int pad_span() const { return std::min(kv_shape_.page_size, context_); }
  int spare_pages() const { return (kRowStepBucket - 1 + pad_span() - 1) / pad_span(); }
  int spare_page(int pad) const { return kv_shape_.pages + pad / pad_span(); }
  // The rows a mixed step of `rows` rows runs as a row step (0: it cannot), its longest chunk `longest_chunk` tokens
  // and the most keys one chunk's rows read `chunk_keys`: the GEMVs' row counts as they are, then multiples of 32.
  int row_step_rows(int rows, int longest_chunk, int64_t chunk_keys) const {
    if (!paged() || !decode_ok_ || longest_chunk > kRowStepMaxChunk || chunk_keys > kRowStepMaxChunkKeys) return 0;
    const int r = rows <= cuda_ops::kGemvMaxRows ? rows : (rows + kRowStepBucket - 1) / kRowStepBucket * kRowStepBucket;
    return r <= kRowStepMaxRows ? r : 0;
  }
  // The page table's arrays on the device (paged; see ensure_step_inputs): indptr, then last_page_len, then indices.
  PageTablePointers table_device() const {
    const int32_t* t = step_table(step_in_dev_);
    return {t, t + 2 * size_t(step_cap_) + 1, t + step_cap_ + 1};
  }
  int32_t* step_table(const DeviceBuffer& b) const { return b.as<int32_t>() + size_t(step_cap_) * 6; }
  int32_t* step_table(const PinnedBuffer& b) const { return b.as<int32_t>() + size_t(step_cap_) * 6; }
  // Page table ints: indptr (cap + 1), last_page_len (cap), indices (every page, or a row step's position table).
  size_t table_ints(int cap, size_t indices) const { return paged() ? 2 * size_t(cap) + 1 + indices : 0; }

  // [count, n, heads, head_dim] device view of `heads` heads from column `col` of the fused QKV rows from `row0`
  // (sequence i's n rows follow sequence i - 1's).
  TensorView qkv_rows(int row0, int col, int count, int n, int heads) const {
    const int qkv_w = c_.q_dim() + 2 * c_.kv_dim();
    return TensorView::strided(qkv_.bytes_ptr() + (size_t(row0) * qkv_w + col) * esize(), dtype(),
                               Device::cuda(opt_.device_index), {count, n, heads, c_.head_dim},
                               {int64_t(n) * qkv_w, qkv_w, c_.head_dim, 1});
  }

  // Device views of sequence `slot`: `n` new query rows starting at fused row `row0`, keys [0, kv_len) of its cache.
  ForwardArgs attention_args(int layer, int slot, int row0, int n, int kv_len) {
    if (paged()) fail("internal error: a forward() view of a paged cache was asked for (paged steps use prefill)");
    const int D = c_.head_dim;
    const Device dev = Device::cuda(opt_.device_index);
    ForwardArgs a;
    a.q = qkv_rows(row0, 0, 1, n, c_.n_heads);
    const KvCacheView cache = cache_view(layer, slot, 1, &kv_len, nullptr);
    a.k = cache.k;
    a.v = cache.v;
    a.k.shape[1] = a.v.shape[1] = kv_len;
    a.out = TensorView::strided(att_.bytes_ptr() + size_t(row0) * c_.q_dim() * esize(), dtype(), dev,
                                {1, n, c_.n_heads, D}, {int64_t(n) * c_.q_dim(), c_.q_dim(), D, 1});
    a.options.causal = true;
    a.backend = attention_;
    a.stream = stream_;
    return a;
  }

  // Paged: every input's new rows (a ragged batch) over its cached sequence, one flashlite::prefill call.
  PrefillArgs prefill_args(int layer, const Step& st) {
    const int D = c_.head_dim, qd = c_.q_dim();
    PrefillArgs a;
    a.q = qkv_rows(0, 0, 1, st.rows, c_.n_heads);
    a.out = TensorView::strided(att_.ptr, dtype(), Device::cuda(opt_.device_index), {1, st.rows, c_.n_heads, D},
                                {int64_t(st.rows) * qd, qd, D, 1});
    const int count = int(st.row0.size());
    a.cache = cache_view(layer, 0, count, st.lens_after.data(), step_in(3));
    a.options.causal = true;
    a.options.cu_seqlens_q = TensorView::contiguous(const_cast<int32_t*>(st.cu_rows.data()), DType::i32, Device::cpu(),
                                                    {count + 1});
    a.backend = Backend::cuda;
    a.stream = stream_;
    return a;
  }

  // The fused kernel when it takes this head_dim and dtype, else flashlite's split CUDA kernels. Paged: no forward()
  // call ever runs (decode and prefill attend), so nothing to probe.
  Backend choose_attention() {
    if (opt_.attention != Backend::automatic) return opt_.attention;
    if (paged()) return Backend::cuda;
    ensure_scratch(1, 1);
    attention_ = Backend::cuda;
    return plan_forward(attention_args(0, 0, 0, 1, 1)).supported() ? Backend::cuda : Backend::naive;
  }

  // Decode steps (one new token per sequence, slots 0..batch-1): flashlite's split-KV decode kernel over the batch in
  // one launch per layer. Lengths are those after this step's append (host copy for planning, device copy for the kernel).
  DecodeArgs decode_args(int layer, int batch, const int32_t* host_lens, const DecodePlan* plan) {
    const int D = c_.head_dim, qd = c_.q_dim();
    const Device dev = Device::cuda(opt_.device_index);
    DecodeArgs a;
    a.q = qkv_rows(0, 0, batch, 1, c_.n_heads);
    a.out = TensorView::strided(att_.ptr, dtype(), dev, {batch, 1, c_.n_heads, D}, {qd, qd, D, 1});
    a.cache = cache_view(layer, 0, batch, host_lens, step_in(3));
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
    return plan_decode(decode_args(0, 1, &one, nullptr)).supported();
  }

  // CudaEngineOptions::verbose: how this model's steps run.
  void print_plan() {
    const bool gemv = use_gemv(1);
    std::fprintf(stderr, "flashlite engine: %s; decode steps of <= %d rows: %s%s; CUDA graphs %s; PDL %s; profile %s; "
                         "attention %s\n",
                 device().c_str(), cuda_ops::kGemvMaxRows, gemv ? "fused GEMVs" : "cuBLASLt",
                 gemv ? (cuda_ops::gemv_fuses_rope(c_) ? " (RoPE fused)" : " (RoPE apart: head_dim % 8 != 0)") : "",
                 decode_ok_ && opt_.cuda.graphs ? "on" : "off", opt_.cuda.pdl ? "on (sm_90+)" : "off",
                 opt_.cuda.profile ? "on" : "off", attention_kernel().c_str());
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
    if (collective_) partial_.reserve(r * c_.dim * 4, "activations");
    ensure_step_inputs(std::max({rows, logit_rows, slots_}), table_indices_);
    logits_dev_.reserve(size_t(logit_rows) * c_.vocab_size * 4, "logits");
    keys_dev_.reserve(size_t(logit_rows) * 8, "argmax keys");
    keys_host_.reserve(size_t(logit_rows) * 8);
  }

  // A step's small inputs go up in one copy from pinned memory, laid out for `cap` rows: [0] token ids, [1] positions,
  // [2] logit row index, [3] sequence lengths after the step (int32, cap each), then the cache rows (int64, cap),
  // then (paged) the step's page table for up to `indices` page ids. Both only grow; a larger cap moves the table,
  // and always grows the allocation, which re-captures the graphs (DeviceBuffer::generation).
  void ensure_step_inputs(int cap, size_t indices) {
    cap = std::max(cap, step_cap_);
    indices = std::max(indices, table_indices_);
    if (cap == step_cap_ && indices == table_indices_ && step_in_dev_.ptr && step_in_host_.ptr) return;
    const size_t bytes = size_t(cap) * 24 + table_ints(cap, indices) * 4;
    step_in_host_.reserve(bytes);  // either may throw (then the next step tries again: a null buffer never passes)
    step_in_dev_.reserve(bytes, "step inputs");
    if (cap != step_cap_) ++DeviceBuffer::generation(opt_.device_index);  // the layout moved: re-capture the graphs
    step_cap_ = cap;
    table_indices_ = indices;
  }
  int32_t* step_in(int i) const { return step_in_dev_.as<int32_t>() + size_t(i) * step_cap_; }
  int32_t* step_in_host(int i) const { return step_in_host_.as<int32_t>() + size_t(i) * step_cap_; }
  int64_t* cache_rows_dev() const { return reinterpret_cast<int64_t*>(step_in(4)); }

  LogitsOutput run(const std::vector<SequenceInput>& inputs, const LogitsRequest& request);
  Step stage(const std::vector<SequenceInput>& inputs, const LogitsRequest& request);
  void restore(const Step& st, const std::vector<SequenceInput>& inputs);  // the lengths before the step
  void queue(const Step& st, const std::vector<SequenceInput>& inputs, const LogitsRequest& request);
  void download(const Step& st, const LogitsRequest& request);
  LogitsOutput selected(const Step& st, const LogitsRequest& request);
  void mark(const char* name) {
    if (profile_) profile_->mark(name);
  }

  // The model's stream, destroyed after every other member (declared first) and also when the constructor throws.
  struct OwnedStream {
    cudaStream_t s = nullptr;
    ~OwnedStream() {
      if (s) cudaStreamDestroy(s);
    }
  } stream_owner_;
  ModelConfig c_;     // the rank's shape (ModelWeights::rank_config)
  std::vector<ModelConfig> rank_shapes_;  // every rank's (c_ with that rank's FFN width); one entry without TP
  int vocab_in_ = 0;  // token ids the embedding takes (the whole vocabulary)
  RuntimeOptions opt_;
  Collective* collective_ = nullptr;  // tensor parallelism: sums the O and down projections' partial outputs
  Elem elem_ = Elem::bf16;
  int context_ = 0, slots_ = 1;
  Backend attention_ = Backend::cuda;
  bool decode_ok_ = false;  // the batched decode kernel takes this model
  RopeOptions rope_;        // the model's RoPE as the library applies it
  KvCacheShape kv_shape_;   // the flashlite KV cache of every layer (contiguous or paged)
  KvCacheShape pool_shape_;  // its storage: paged, spare_pages() more
  KvBook book_;             // its lengths and pages
  PageTable table_;         // paged: the current step's page table (its inputs in order), uploaded with the step inputs
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<cuda_ops::Gemm> gemm_;
  cuda_ops::StepGraphs graphs_;
  std::optional<cuda_ops::StepProfile> profile_;  // CudaEngineOptions::profile
  DeviceBuffer embedding_, rms_final_, lm_head_;  // (vocab, dim), (dim), (vocab, dim) unless tied
  DeviceBuffer cos_, sin_;                        // (context, head_dim / 2) fp32: rope_cos_sin of the library
  std::vector<Layer> layers_;
  std::vector<std::unique_ptr<DeviceBuffer>> k_cache_, v_cache_;  // per layer: [slots, context, ...] or [pages, page_size, ...]
  // Activations for `rows` rows: x (rows, dim) fp32 residual stream; xb (rows, dim) normed; qkv (rows, q_dim + 2 kv_dim);
  // att (rows, q_dim); h13 (rows, 2 hidden); hb (rows, hidden); xo (rows, dim) a projection before its residual add.
  DeviceBuffer x_, xb_, qkv_, att_, h13_, hb_, xo_;
  DeviceBuffer partial_;  // tensor parallelism: (rows, dim) fp32, a fused GEMV's partial output before its all-reduce
  DeviceBuffer logits_dev_, decode_ws_;  // (logit rows, vocab) fp32; the decode plan's workspace
  DeviceBuffer step_in_dev_;  // see ensure_step_inputs
  PinnedBuffer step_in_host_;
  int step_cap_ = 0;
  size_t table_indices_ = 0;  // page ids the step inputs' table holds
  DeviceBuffer keys_dev_, topk_values_dev_, topk_ids_dev_;  // (logit rows) argmax keys; (logit rows, k) candidates
  PinnedBuffer keys_host_, topk_values_host_, topk_ids_host_;
  std::vector<float> logits_;
  StepStats stats_;
};

// Validates the inputs, lays out the step (rows, logit rows, decode plan) and starts the step inputs' upload.
Step LlamaCuda::stage(const std::vector<SequenceInput>& inputs, const LogitsRequest& request) {
  std::vector<int32_t> tokens, pos, logit_index;
  std::vector<int> slots;
  Step st;
  int longest_chunk = 0;
  int64_t chunk_keys = 0;  // the most keys one chunk's rows read
  // Nothing to run: zero rows would reach the kernels as zero-block launches (and, inside a graph capture, turn the
  // graphs off for good). Rejected before anything is uploaded or launched.
  if (inputs.empty()) fail("forward needs at least one input sequence; got none");
  for (const SequenceInput& in : inputs) {
    if (in.slot < 0 || in.slot >= slots_) fail("slot " + std::to_string(in.slot) + " is outside [0, " + std::to_string(slots_) + ")");
    const int n = int(in.tokens.size()), len = book_.length(in.slot);
    if (n == 0) fail("an input sequence has no new tokens");
    if (len + n > context_) {
      fail("sequence would reach " + std::to_string(len + n) + " tokens (" + std::to_string(len) + " cached + " +
           std::to_string(n) + " new); the context holds " + std::to_string(context_));
    }
    for (const SequenceInput& other : inputs)
      if (&other != &in && other.slot == in.slot) fail("slot " + std::to_string(in.slot) + " appears twice in one forward call");
    st.row0.push_back(int(tokens.size()));
    slots.push_back(in.slot);
    longest_chunk = std::max(longest_chunk, n);
    if (n > 1) chunk_keys = std::max(chunk_keys, int64_t(n) * (len + n));
    for (int i = 0; i < n; ++i) {
      const int t = in.tokens[i];
      if (t < 0 || t >= vocab_in_) {  // the embedding's rows (c_.vocab_size: this rank's logits)
        fail("token id " + std::to_string(t) + " is outside the model's vocabulary [0, " + std::to_string(vocab_in_) + ")");
      }
      if (in.all_logits || i == n - 1) logit_index.push_back(int32_t(tokens.size()));
      tokens.push_back(t);
      pos.push_back(len + i);
    }
    st.lens_before.push_back(int32_t(len));
    st.lens_after.push_back(int32_t(len + n));
  }
  st.rows = int(tokens.size());
  st.lrows = st.lrows_out = int(logit_index.size());
  if (request.kind == LogitsRequest::Kind::top_k && (request.k <= 0 || request.k >= c_.vocab_size)) {
    fail("top-k request for " + std::to_string(request.k) + " candidates; expected 0 < k < " + std::to_string(c_.vocab_size));
  }
  // The library's order: the lengths (a paged slot's pages) grow before the appends. Restored when anything from
  // here on fails, here or in run().
  try {
    for (size_t q = 0; q < inputs.size(); ++q) book_.set_length(inputs[q].slot, st.lens_after[q]);
    std::vector<int64_t> cache_row;  // where each new token's K / V go: a row of the layer's storage
    for (size_t q = 0; q < inputs.size(); ++q)
      for (int p = st.lens_before[q]; p < st.lens_after[q]; ++p) cache_row.push_back(book_.row(inputs[q].slot, p));
    // One batched decode launch per layer: one new token per input, on any slots when paged (the page table lists
    // them in input order), else on slots 0..rows-1; or a row step.
    st.decode = decode_ok_ && st.rows == int(inputs.size());
    for (size_t q = 0; st.decode && !paged() && q < inputs.size(); ++q) st.decode = inputs[q].slot == int(q);
    const int padded = st.decode ? 0 : row_step_rows(st.rows, longest_chunk, chunk_keys);
    if (padded > 0) {
      st.decode = st.row_step = true;
      // One page-table entry per row; pad row j: token 0 at position j % span of spare_page(j), reading that page
      // up to it.
      book_.position_table(slots.data(), st.lens_before.data(), st.lens_after.data(), int(slots.size()), table_);
      const int page = kv_shape_.page_size, span = pad_span();
      for (int j = 0; st.rows + j < padded; ++j) {
        tokens.push_back(0);
        pos.push_back(j % span);
        cache_row.push_back(int64_t(spare_page(j)) * page + j % span);
        table_.indices.push_back(spare_page(j));
        table_.indptr.push_back(int32_t(table_.indices.size()));
        table_.last_page_len.push_back(j % span + 1);
      }
      ensure_step_inputs(padded, table_.indices.size());
      st.rows = padded;
      st.lrows = 1;  // logit rows: a power of two, at most the rows (row 0's logits stand in for the padding)
      while (st.lrows < st.lrows_out) st.lrows *= 2;
      st.lrows = std::min(st.lrows, padded);
      logit_index.resize(size_t(st.lrows), 0);
    }
    ensure_scratch(st.rows, st.lrows);
    if (request.kind == LogitsRequest::Kind::top_k) {
      const size_t n = size_t(st.lrows) * request.k;
      topk_values_dev_.reserve(n * 4, "top-k values");
      topk_ids_dev_.reserve(n * 4, "top-k ids");
      topk_values_host_.reserve(n * 4);
      topk_ids_host_.reserve(n * 4);
    }
    st.gemv = use_gemv(st.rows);
    st.fused_argmax = st.gemv && by_keys(request);
    if (st.row_step) st.groups = {KvGroup{0, st.rows, 0, 1}};
    else st.groups = kv_groups(inputs, paged());
    if (paged() && !st.row_step) {  // (a row step's table is made above)
      book_.page_table(slots.data(), int(slots.size()), table_);
      st.cu_rows = st.row0;
      st.cu_rows.push_back(st.rows);
    }
    if (st.decode) {
      st.plan = plan_decode(decode_args(0, st.rows, st.lens_after.data(), nullptr), context_);  // graph-stable
      if (st.plan.workspace_bytes > decode_ws_.bytes) {
        cuda_check(cudaStreamSynchronize(stream_), "decode workspace");
        decode_ws_.reserve(st.plan.workspace_bytes, "the decode workspace");
      }
    }
    std::copy(tokens.begin(), tokens.end(), step_in_host(0));  // after the last ensure_step_inputs (ensure_scratch)
    std::copy(st.lens_after.begin(), st.lens_after.end(), step_in_host(3));
    std::copy(pos.begin(), pos.end(), step_in_host(1));
    std::copy(logit_index.begin(), logit_index.end(), step_in_host(2));
    std::copy(cache_row.begin(), cache_row.end(), reinterpret_cast<int64_t*>(step_in_host(4)));
    size_t bytes = size_t(step_cap_) * 16 + size_t(st.rows) * 8;
    if (paged()) {  // after the cache rows: one copy for everything
      int32_t* h = step_table(step_in_host_);
      std::copy(table_.indptr.begin(), table_.indptr.end(), h);
      std::copy(table_.last_page_len.begin(), table_.last_page_len.end(), h + step_cap_ + 1);
      std::copy(table_.indices.begin(), table_.indices.end(), h + 2 * size_t(step_cap_) + 1);
      bytes = size_t(step_cap_) * 24 + table_ints(step_cap_, table_.indices.size()) * 4;
    }
    cuda_check(cudaMemcpyAsync(step_in_dev_.ptr, step_in_host_.ptr, bytes, cudaMemcpyHostToDevice, stream_),
               "step input upload");
  } catch (...) {
    restore(st, inputs);
    throw;
  }
  return st;
}

void LlamaCuda::restore(const Step& st, const std::vector<SequenceInput>& inputs) {
  for (size_t q = 0; q < st.lens_before.size(); ++q) book_.set_length(inputs[q].slot, st.lens_before[q]);
}

// Queues the whole step on the stream (also what a graph captures): nothing here waits for the device.
void LlamaCuda::queue(const Step& st, const std::vector<SequenceInput>& inputs, const LogitsRequest& request) {
  const int dim = c_.dim, qd = c_.q_dim(), hid = c_.hidden_dim, qkv_w = qd + 2 * c_.kv_dim(), rows = st.rows;
  void* s = stream_;
  // Under tensor parallelism, where the one-shot sum takes the step's size, the O and down GEMVs sum their outputs
  // over the ranks themselves and add them to x (peer_sum.h). Otherwise (more rows, no peer access, and in --profile,
  // which times the all-reduce as its own group) they add into partial_, which is summed over the ranks and then
  // added to x; alone they add into x itself. partial_ is zeroed once per step (below) and again by each sum (the
  // one-shot kernel zeroes it as it reads it; after NCCL, a memset), so no memset stands between a sum and the next
  // GEMV.
  const size_t n_residual = size_t(rows) * dim;
  PeerSum sum;
  const bool profiling = profile_ && profile_->active();
  const bool fused = collective_ && st.gemv && !profiling && collective_->fused_sum(x_.as<float>(), n_residual, &sum);
  const cuda_ops::StepGemvs gemvs{c_, x_.as<float>(), rows, opt_.cuda.pdl, s,
                                  collective_ ? partial_.as<float>() : nullptr, fused ? &sum : nullptr};
  // The all-reduce is its own group in --profile (the time per step it reports).
  auto gemv_added = [&](auto&& add, const char* name) {  // O or down through the GEMVs
    add();
    mark(name);
    if (collective_ && !fused) {
      if (!collective_->sum_into(x_.as<float>(), partial_.as<float>(), n_residual, s)) {  // one-shot: sum and add
        collective_->all_reduce_sum(partial_.ptr, n_residual, DType::f32, s);
        cuda_ops::residual_add(x_.as<float>(), partial_.ptr, n_residual, Elem::f32, s);
        cuda_check(cudaMemsetAsync(partial_.ptr, 0, n_residual * 4, stream_), "memset");
      }
      mark("all-reduce");
    }
  };
  // O or down through cuBLASLt: x += in W^T (k inputs). Under TP the ranks' fp32 partial outputs are summed first,
  // as on the GEMV path (one rounding of the sum, not one per rank and per NCCL step in bf16).
  auto gemm_added = [&](const void* in, const void* w, int k) {
    if (collective_) {
      gemm_->run(partial_.ptr, in, w, rows, k, dim, elem_, true, s);
      collective_->all_reduce_sum(partial_.ptr, n_residual, DType::f32, s);
      cuda_ops::residual_add(x_.as<float>(), partial_.ptr, n_residual, Elem::f32, s);
    } else {
      gemm_->run(xo_.ptr, in, w, rows, k, dim, elem_, false, s);
      cuda_ops::residual_add(x_.as<float>(), xo_.ptr, n_residual, elem_, s);
    }
  };
  const bool fused_rope = st.gemv && cuda_ops::gemv_fuses_rope(c_);
  uint64_t* keys = keys_dev_.as<uint64_t>();
  mark("start");
  if (collective_ && st.gemv && !fused) cuda_check(cudaMemsetAsync(partial_.ptr, 0, n_residual * 4, stream_), "memset");
  cuda_ops::embed(x_.as<float>(), embedding_.ptr, step_in(0), rows, dim, elem_, s, st.fused_argmax ? keys : nullptr,
                  st.fused_argmax ? st.lrows : 0);
  mark("embed");
  for (int l = 0; l < c_.n_layers; ++l) {
    const Layer& L = layers_[l];
    // qkv = rmsnorm(x) Wqkv^T; q and k rotated; k and v appended to the cache
    if (fused_rope) {
      cuda_ops::GemvRope rope{cos_.as<float>(), sin_.as<float>(), step_in(1), cache_rows_dev(), k_cache_[l]->ptr,
                              v_cache_[l]->ptr, c_.n_heads, c_.n_kv_heads, c_.head_dim,
                              c_.rope_style == RopeStyle::interleaved};
      gemvs.qkv(L.wqkv.ptr, L.rms_att.ptr, qkv_.ptr, &rope);
      mark("qkv+rope");
    } else {
      if (st.gemv) {
        gemvs.qkv(L.wqkv.ptr, L.rms_att.ptr, qkv_.ptr, nullptr);
      } else {
        cuda_ops::rmsnorm(xb_.ptr, x_.as<float>(), L.rms_att.ptr, nullptr, rows, dim, c_.rms_eps, elem_, s);
        gemm_->run(qkv_.ptr, xb_.ptr, L.wqkv.ptr, rows, dim, qkv_w, elem_, false, s);
      }
      mark("qkv");
      // q rotated in place, k rotated and v appended to the cache: flashlite::append_kv, one launch per run of slots.
      for (const KvGroup& g : st.groups) {
        AppendArgs ap;
        ap.cache = cache_view(l, paged() ? g.first : g.slot0, g.count, st.lens_after.data() + g.first, step_in(3) + g.first);
        const int row0 = st.row0[g.first];
        ap.k = qkv_rows(row0, qd, g.count, g.n, c_.n_kv_heads);
        ap.v = qkv_rows(row0, qd + c_.kv_dim(), g.count, g.n, c_.n_kv_heads);
        ap.q = qkv_rows(row0, 0, g.count, g.n, c_.n_heads);
        ap.q_out = ap.q;
        ap.rope = rope_;
        ap.backend = Backend::cuda;
        ap.stream = s;
        append_kv(ap);
      }
      mark("rope");
    }
    // att = attention(q, the cache)
    if (st.decode) {
      flashlite::decode(decode_args(l, rows, st.lens_after.data(), &st.plan));
    } else if (paged()) {
      flashlite::prefill(prefill_args(l, st));
    } else {
      for (size_t q = 0; q < inputs.size(); ++q) {
        const int n = int(inputs[q].tokens.size());
        flashlite::forward(attention_args(l, inputs[q].slot, st.row0[q], n, st.lens_after[q]));
      }
    }
    mark("attention");
    // x += att Wo^T; h = swiglu(rmsnorm(x) W13^T); x += h W2^T
    if (st.gemv) {
      gemv_added([&] { gemvs.o(L.wo.ptr, att_.ptr); }, "o");
      gemvs.gate_up(L.w13.ptr, L.rms_ffn.ptr, hb_.ptr);
      mark("gate_up");
      gemv_added([&] { gemvs.down(L.w2.ptr, hb_.ptr); }, "down");
    } else {
      gemm_added(att_.ptr, L.wo.ptr, qd);
      mark("o");
      cuda_ops::rmsnorm(xb_.ptr, x_.as<float>(), L.rms_ffn.ptr, nullptr, rows, dim, c_.rms_eps, elem_, s);
      gemm_->run(h13_.ptr, xb_.ptr, L.w13.ptr, rows, dim, 2 * hid, elem_, false, s);
      cuda_ops::swiglu(hb_.ptr, h13_.ptr, rows, hid, elem_, s);
      mark("gate_up");
      gemm_added(hb_.ptr, L.w2.ptr, hid);
      mark("down");
    }
  }
  // logits = rmsnorm(x[logit rows]) head^T, then what the sampler asked for
  const void* head = c_.tie_embeddings ? embedding_.ptr : lm_head_.ptr;
  const int vocab = c_.vocab_size;
  if (st.gemv) {
    gemvs.lm_head(head, rms_final_.ptr, step_in(2), st.lrows, logits_dev_.as<float>(), st.fused_argmax ? keys : nullptr);
  } else {
    cuda_ops::rmsnorm(xb_.ptr, x_.as<float>(), rms_final_.ptr, step_in(2), st.lrows, dim, c_.rms_eps, elem_, s);
    gemm_->run(logits_dev_.ptr, xb_.ptr, head, st.lrows, dim, vocab, elem_, true, s);
  }
  mark("lm_head");
  if (by_keys(request)) {
    if (!st.fused_argmax) cuda_ops::argmax_rows(keys, logits_dev_.as<float>(), st.lrows, vocab, s);
  } else if (request.kind == LogitsRequest::Kind::top_k) {
    cuda_ops::top_k_rows(topk_values_dev_.as<float>(), topk_ids_dev_.as<int32_t>(), logits_dev_.as<float>(), st.lrows,
                         vocab, request.k, s);
  }
  mark("select");
}

// Only what the sampler needs comes back: 8 bytes per row for argmax, k pairs for top-k, else the full rows.
void LlamaCuda::download(const Step& st, const LogitsRequest& request) {
  if (by_keys(request)) {
    cuda_check(cudaMemcpyAsync(keys_host_.ptr, keys_dev_.ptr, size_t(st.lrows_out) * 8, cudaMemcpyDeviceToHost,
                               stream_),
               "ids download");
  } else if (request.kind == LogitsRequest::Kind::top_k) {
    const size_t n = size_t(st.lrows_out) * request.k * 4;
    cuda_check(cudaMemcpyAsync(topk_values_host_.ptr, topk_values_dev_.ptr, n, cudaMemcpyDeviceToHost, stream_), "top-k download");
    cuda_check(cudaMemcpyAsync(topk_ids_host_.ptr, topk_ids_dev_.ptr, n, cudaMemcpyDeviceToHost, stream_), "top-k download");
  } else {
    logits_.resize(size_t(st.lrows_out) * c_.vocab_size);
    cuda_check(cudaMemcpyAsync(logits_.data(), logits_dev_.ptr, logits_.size() * 4, cudaMemcpyDeviceToHost, stream_),
               "logits download");
  }
  cuda_check(cudaStreamSynchronize(stream_), "forward");
  if (collective_) collective_->check();
}

LogitsOutput LlamaCuda::selected(const Step& st, const LogitsRequest& request) {
  LogitsOutput out;
  out.kind = request.kind;
  out.rows = st.lrows_out;
  out.vocab = c_.vocab_size;
  if (request.kind == LogitsRequest::Kind::argmax) {
    select_ids_.resize(st.lrows_out);
    for (int r = 0; r < st.lrows_out; ++r) {
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
    if (by_keys(request)) {  // a rank's best logit and its id, from its argmax key (no refusal: the merge decides)
      for (int r = 0; r < st.lrows_out; ++r) {
        const uint64_t key = keys_host_.as<uint64_t>()[r];
        topk_values_host_.as<float>()[r] = cuda_ops::argmax_key_value(key);
        topk_ids_host_.as<int32_t>()[r] = cuda_ops::argmax_key_index(key);
      }
    }
  } else {
    out.logits = logits_.data();
  }
  return out;
}

LogitsOutput LlamaCuda::run(const std::vector<SequenceInput>& inputs, const LogitsRequest& request) {
  const Step st = stage(inputs, request);
  const auto step = [&] { queue(st, inputs, request); };
  const bool profiled = st.decode && profile_ && profile_->wants(st.rows);
  bool replayed = false;
  // From here the step input copy may be in flight from the pinned staging buffer: when anything below throws, the
  // stream is drained (a second error ignored) before the error leaves, so the next call cannot rewrite the buffer
  // under a pending copy.
  try {
    if (profiled) profile_->run(step);
    else if (st.decode) replayed = graphs_.run(graph_key(st, request), stream_, step);
    else step();
    download(st, request);
  } catch (...) {
    cudaStreamSynchronize(stream_);
    cudaGetLastError();
    restore(st, inputs);
    throw;
  }
  if (profiled) profile_->collect(st.rows);
  ++stats_.steps;
  stats_.row_steps += st.row_step;
  stats_.replayed += replayed;
  return selected(st, request);
}

}  // namespace

std::unique_ptr<LlamaModel> create_llama_cuda(const ModelWeights& weights, const RuntimeOptions& options,
                                             Collective* collective) {
  return std::make_unique<LlamaCuda>(weights, options, collective);
}

}  // namespace flashlite::engine
