#pragma once
// What the generation loop needs from a model, whatever runs it (CPU: LlamaCpu; CUDA: LlamaCuda).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/config.h"
#include "flashlite/attention.h"
#include "flashlite/errors.h"

namespace flashlite::engine {

// New tokens of one sequence, appended at its current cache length.
struct SequenceInput {
  int slot = 0;
  std::vector<int> tokens;
  bool all_logits = false;  // logits for every new position (teacher forcing); else only the last
};

// How much of each logits row a forward call hands back: the sampler needs all of it only for plain temperature or
// top-p sampling. A model may compute the reduction where the logits live (the GPU) so that only ids come back.
struct LogitsRequest {
  enum class Kind { logits, argmax, top_k };
  Kind kind = Kind::logits;
  int k = 0;  // top_k: candidates per row, 0 < k < vocab
  // A tensor-parallel rank's top-k over its vocabulary slice (ParallelModel): the slice is part of a row, so the rank
  // does not refuse what would make the whole row unsampleable (the merge does, on every rank's candidates); NaN
  // ranks first (lowest id), as on the device, so the merge sees it.
  bool shard = false;
};

// The result of forward_select, valid until the next call: per logits row (input order) either the full fp32 row,
// the greedy token (first index of the maximum, as engine::argmax), or the k largest logits with their ids (as a set,
// in no particular order; ties at the k-th value keep the lowest ids, as Sampler's partial sort does).
struct LogitsOutput {
  LogitsRequest::Kind kind = LogitsRequest::Kind::logits;
  int rows = 0, k = 0, vocab = 0;
  const float* logits = nullptr;   // logits: (rows, vocab)
  const int32_t* ids = nullptr;    // argmax: (rows); top_k: (rows, k)
  const float* values = nullptr;   // top_k: (rows, k), the logits of `ids`
};

// Settings of the CUDA model (flashlite generate / chat / score: --no-graphs, --profile, --verbose). The defaults are
// what the engine measured fastest; turning one off keeps the results (tests compare the tokens) and exists for
// debugging and so that tests reach, on one GPU, the paths other models and devices take.
struct CudaEngineOptions {
  bool graphs = true;    // decode steps replayed from CUDA graphs; off: launched one by one (debugging)
  bool gemv = true;      // steps of <= 8 rows through the fused GEMVs (bf16); off: cuBLASLt and separate small kernels,
                         // the path of fp32, of larger batches and of models the GEMVs do not fit
  bool pdl = true;       // programmatic dependent launch (sm_90+); off: plain stream order, as on older GPUs
  bool one_shot_allreduce = true;  // --tp: small sums in one kernel over NVLink peer memory; off: NCCL for all
  bool profile = false;  // per-kernel-group times of decode steps on stderr (those steps run eagerly)
  bool verbose = false;  // the model's plan on stderr when it is built
};

// What a model's constructor throws when RuntimeOptions ask for a paged KV cache its device cannot serve for this
// model (CUDA: fp32, or a head_dim flashlite's decode kernels lack); the contiguous cache (kv_page_size 0) serves it.
struct PagedCacheUnsupported : Error {
  using Error::Error;
};

struct RuntimeOptions {
  int slots = 1;          // sequences held at once (batch)
  int context = 0;        // KV capacity per sequence; 0 = the model's max_seq_len
  int threads = 0;        // CPU: 0 = automatic (1 for models under ~5M parameters, else every core)
  Backend attention = Backend::automatic;  // flashlite backend; automatic = cpu on the CPU, cuda on the GPU
  std::string precision = "auto";          // CUDA: "bf16", "fp32", or auto (= bf16); the CPU path is fp32
  int device_index = 0;                    // CUDA device
  // A paged KV cache (flashlite's paged layout) of kv_pages pages of kv_page_size tokens shared by the slots (0 pages:
  // enough for every slot at full context); kv_page_size 0 = contiguous, one region per slot. CUDA: bf16 only.
  int kv_page_size = 0;
  int kv_pages = 0;
  // Tensor parallelism (docs/parallel.md): the model split over this many ranks, on the CPU threads of one process
  // or on GPUs device_index .. device_index + tp - 1 (NCCL). 1: one model.
  int tp = 1;
  CudaEngineOptions cuda;
};

// What the KV cache holds, in pages: a paged cache's pages, or for a contiguous one each slot as one page of
// context() positions (used when the slot holds a token). The server admits requests by it.
struct KvUsage {
  int page_size = 0;
  int pages_total = 0;
  int pages_used = 0;
};

// How a model's forward calls ran (the CUDA model counts them; zeros elsewhere).
struct StepStats {
  int64_t steps = 0;      // forward calls that ran
  int64_t row_steps = 0;  // of them, mixed steps run as one decode row per new token (the paged CUDA cache)
  int64_t replayed = 0;   // of them, replayed from a CUDA graph
};

class LlamaModel {
 public:
  virtual ~LlamaModel() = default;
  // Runs every sequence's new tokens in one pass and appends them to the KV cache. Returns fp32 logits on the host,
  // (sum over inputs of n or 1, vocab), in input order. Throws Error on a bad token or a context overflow.
  virtual const std::vector<float>& forward(const std::vector<SequenceInput>& inputs) = 0;
  // forward(), reduced as `request` asks. The default reduces the host logits; the CUDA model reduces on the device
  // and copies back only the ids (and top-k values) into pinned memory.
  virtual LogitsOutput forward_select(const std::vector<SequenceInput>& inputs, const LogitsRequest& request);
  virtual const ModelConfig& config() const = 0;
  virtual int slots() const = 0;
  virtual int context() const = 0;     // KV positions per sequence
  virtual int length(int slot) = 0;    // cached positions of a sequence
  virtual void reset(int slot) = 0;    // forget a sequence
  virtual KvUsage kv_usage();
  virtual int threads() const { return 1; }
  virtual std::string device() const = 0;
  virtual size_t device_bytes() const { return 0; }  // accelerator memory held (weights, KV cache, scratch)
  virtual std::string attention_kernel() = 0;  // flashlite's kernel name for a decode step
  // Row counts (one sequence's new tokens per forward call) up to max_rows whose first step pays one-time work that
  // later steps of nearby row counts then share (CUDA: cuBLASLt's algorithm searches, gemm.h), so that a server can
  // pay it before its first request; empty where there is none (the CPU).
  virtual std::vector<int> warm_up_rows(int /*max_rows*/) const { return {}; }
  virtual StepStats step_stats() const { return {}; }

 protected:
  // Host reduction of `logits` (rows, vocab) into select_ids_ / select_values_ (the default forward_select).
  LogitsOutput select_on_host(const float* logits, int rows, const LogitsRequest& request);
  std::vector<int32_t> select_ids_;
  std::vector<float> select_values_;
};

// Candidates per row that the host sampler needs for `params` (argmax when greedy, the top k when 0 < top_k < vocab,
// else every logit). Declared here so the model and the generation loop agree.
struct SamplingParams;
LogitsRequest logits_request_for(const SamplingParams& params, int vocab);

struct ModelWeights;
class Collective;
// A model on `device` ("cpu" or "cuda"); throws Error when the device is unavailable in this build or machine. With
// options.tp > 1, a ParallelModel whose ranks each take their slice of `weights` (which need not outlive it).
// Otherwise the CPU model reads `weights` in place: they must outlive it.
std::unique_ptr<LlamaModel> create_model(const ModelWeights& weights, const RuntimeOptions& options,
                                         const std::string& device);
// One tensor-parallel rank's model over `weights` (one shard), its row-parallel sums through `collective`.
std::unique_ptr<LlamaModel> create_model_rank(const ModelWeights& weights, const RuntimeOptions& options,
                                              const std::string& device, Collective* collective);

}  // namespace flashlite::engine
