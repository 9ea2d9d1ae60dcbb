#pragma once
// Tensor parallelism (docs/parallel.md): the model split over `ranks` workers, one thread each, every rank a CPU or
// CUDA model holding its shard (ModelWeights::shard). Each forward call runs on all ranks at once; inside, the O and
// down projections' partial sums are all-reduced (a Collective: in-process on the CPU, NCCL between GPUs), and the
// ranks' logits columns are gathered here, so that callers see one model of the whole vocabulary.
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/model.h"
#include "engine/parallel/collective.h"
#include "engine/parallel/rank_threads.h"
#include "engine/weights.h"

namespace flashlite::engine {

class ParallelModel final : public LlamaModel {
 public:
  // Rank r's weights: load(r, ranks). device "cpu" (ranks share the cores) or "cuda" (rank r on GPU
  // options.device_index + r). Throws Error when the model does not split into `ranks` (KV heads) or the GPUs are
  // too few.
  using RankLoader = std::function<ModelWeights(int rank, int ranks)>;
  ParallelModel(int ranks, const RankLoader& load, const RuntimeOptions& options, const std::string& device);
  // How long one forward call may take on all ranks before the group is aborted (no collective waits forever).
  static constexpr std::chrono::milliseconds kStepDeadline{300'000};
  void set_step_deadline(std::chrono::milliseconds d) { step_deadline_ = d; }  // tests
  ~ParallelModel() override;

  const std::vector<float>& forward(const std::vector<SequenceInput>& inputs) override;
  // Greedy and top-k: each rank selects among its own vocabulary columns (on its GPU, for CUDA ranks) and only the
  // candidates come back; the merge keeps the one model's tie rule (the lowest id among equal logits).
  LogitsOutput forward_select(const std::vector<SequenceInput>& inputs, const LogitsRequest& request) override;
  const ModelConfig& config() const override { return config_; }
  int slots() const override { return ranks_[0]->slots(); }
  int context() const override { return ranks_[0]->context(); }
  int length(int slot) override { return ranks_[0]->length(slot); }
  void reset(int slot) override;
  KvUsage kv_usage() override { return ranks_[0]->kv_usage(); }
  int threads() const override;
  std::string device() const override;
  size_t device_bytes() const override;
  std::string attention_kernel() override { return ranks_[0]->attention_kernel(); }
  std::vector<int> warm_up_rows(int max_rows) const override { return ranks_[0]->warm_up_rows(max_rows); }
  int ranks() const { return int(ranks_.size()); }

 private:
  // fn(r) on every rank's thread; on a failure, the group is aborted (so no rank waits for the failed one) and the
  // first rank's own error is rethrown. With a deadline, ranks not all done by then abort the group too (a rank that
  // never reached a collective: a hung device, say) and the call fails saying so.
  void on_all_ranks(const std::function<void(int)>& fn, std::chrono::milliseconds deadline = std::chrono::milliseconds(0));
  // on_all_ranks for a forward call over `inputs`: after a failure no sequence is left cached on some ranks only.
  void step(const std::vector<SequenceInput>& inputs, const std::function<void(int)>& fn);

  ModelConfig config_;                    // the whole model's
  std::vector<TensorShard> shards_;       // each rank's part (its vocabulary columns, for the logits)
  std::string device_;
  std::vector<ModelWeights> weights_;     // per rank (a CPU rank reads them in place; CUDA ranks drop them after upload)
  std::unique_ptr<CollectiveGroup> group_;
  bool broken_ = false;                   // the group could not recover from a failure
  std::chrono::milliseconds step_deadline_ = kStepDeadline;
  std::vector<std::unique_ptr<LlamaModel>> ranks_;
  std::vector<const std::vector<float>*> rank_logits_;
  std::vector<LogitsOutput> rank_selected_;
  std::unique_ptr<RankThreads> threads_;  // last: its threads stop before what they use goes
  std::vector<float> logits_;
};

// What --tp can run on in this build, e.g. "cpu (in-process); cuda (NCCL 2.28.9, one-shot kernel over NVLink)".
std::string tensor_parallel_support();

// The model of the checkpoint at `path` split over options.tp ranks, each loading only its blocks of the files
// (load_checkpoint(path, {}, rank, tp)), all at once.
std::unique_ptr<LlamaModel> load_parallel_model(const std::string& path, const RuntimeOptions& options,
                                                const std::string& device);

}  // namespace flashlite::engine
