#include "engine/parallel/parallel_model.h"

#include <omp.h>

#include <algorithm>

#include "engine/errors.h"
#include "engine/parallel/local_group.h"
#include "engine/sampler.h"
#if FLASHLITE_ENGINE_CUDA
#include "engine/parallel/nccl_group.h"
#endif

namespace flashlite::engine {

ParallelModel::ParallelModel(int ranks, const RankLoader& load, const RuntimeOptions& options, const std::string& device)
    : device_(device) {
  if (ranks < 1) fail("--tp " + std::to_string(ranks) + ": expected at least 1 rank");
  if (device == "cpu") {
    group_ = std::make_unique<LocalGroup>(ranks);
  } else if (device == "cuda") {
#if FLASHLITE_ENGINE_CUDA
    group_ = create_nccl_group(options.device_index, ranks, options.cuda.one_shot_allreduce, options.cuda.pdl);
#else
    fail("device 'cuda': this flashlite was built without CUDA; use --device cpu");
#endif
  } else {
    fail("device '" + device + "' is unknown; expected cpu or cuda");
  }
  weights_.resize(ranks);
  shards_.resize(ranks);
  ranks_.resize(ranks);
  rank_logits_.assign(ranks, nullptr);
  threads_ = std::make_unique<RankThreads>(ranks, device != "cpu");  // GPU ranks: spinning hand-offs
  // Each rank loads its shard and builds its model on its own thread (its GPU, its OpenMP team), all at once.
  on_all_ranks([&](int r) {
    weights_[r] = load(r, ranks);
    if (r == 0) config_ = weights_[0].config;
    shards_[r] = weights_[r].shard;
    RuntimeOptions o = options;
    o.tp = 1;
    o.device_index = options.device_index + r;
    if (device == "cpu" && o.threads <= 0) o.threads = std::max(1, omp_get_num_procs() / ranks);  // cores shared
    ranks_[r] = create_model_rank(weights_[r], o, device, &group_->member(r));
    if (device != "cpu") weights_[r] = ModelWeights{};  // uploaded
  });
}

ParallelModel::~ParallelModel() {
  if (threads_) threads_->run([&](int r) { ranks_[r].reset(); });  // each on the thread (and GPU) that made it
}

void ParallelModel::on_all_ranks(const std::function<void(int)>& fn, std::chrono::milliseconds deadline) {
  if (broken_) fail("the tensor-parallel group failed earlier and cannot run again; restart the model");
  const std::vector<std::exception_ptr> errors =
      threads_->run(fn, [&](int) { group_->abort(); }, deadline, [&] { group_->abort(); });
  if (threads_->timed_out()) {
    if (!group_->recover()) broken_ = true;
    fail_runtime("a tensor-parallel step did not finish on every rank within " + std::to_string(deadline.count()) +
                 " ms; the group was aborted" + (broken_ ? " and the model must be restarted" : ""));
  }
  int first = -1;  // the first rank's own error, not the CollectiveAborted that the abort gave the others
  for (int r = 0; r < int(errors.size()) && first < 0; ++r) {
    if (!errors[r]) continue;
    try {
      std::rethrow_exception(errors[r]);
    } catch (const CollectiveAborted&) {
    } catch (...) {
      first = r;
    }
  }
  if (first < 0) {
    for (int r = 0; r < int(errors.size()) && first < 0; ++r)
      if (errors[r]) first = r;
  }
  if (first < 0) return;
  if (!group_->recover()) broken_ = true;
  std::rethrow_exception(errors[first]);
}

void ParallelModel::step(const std::vector<SequenceInput>& inputs, const std::function<void(int)>& fn) {
  try {
    on_all_ranks(fn, step_deadline_);
  } catch (...) {
    // A failure after some ranks appended (possible only past the last collective) must not leave the ranks
    // disagreeing about a sequence: such a sequence is dropped on every rank.
    for (const SequenceInput& in : inputs) {
      if (in.slot < 0 || in.slot >= slots()) continue;
      bool same = true;
      for (const auto& m : ranks_) same = same && m->length(in.slot) == ranks_[0]->length(in.slot);
      if (!same) reset(in.slot);
    }
    throw;
  }
}

const std::vector<float>& ParallelModel::forward(const std::vector<SequenceInput>& inputs) {
  step(inputs, [&](int r) { rank_logits_[r] = &ranks_[r]->forward(inputs); });
  // Rank r's logits are columns [vocab0, vocab0 + its vocab) of each row.
  const int vocab = config_.vocab_size, R = ranks();
  const size_t rows = rank_logits_[0]->size() / size_t(ranks_[0]->config().vocab_size);
  logits_.resize(rows * vocab);
  for (int r = 0; r < R; ++r) {
    const TensorShard& s = shards_[r];
    const float* src = rank_logits_[r]->data();
    for (size_t i = 0; i < rows; ++i) std::copy_n(src + i * s.vocab, s.vocab, logits_.data() + i * vocab + s.vocab0);
  }
  return logits_;
}

LogitsOutput ParallelModel::forward_select(const std::vector<SequenceInput>& inputs, const LogitsRequest& request) {
  const int R = ranks();
  int narrowest = config_.vocab_size;  // the fewest vocabulary columns a rank holds
  for (const TensorShard& s : shards_) narrowest = std::min(narrowest, s.vocab);
  const int k = request.kind == LogitsRequest::Kind::argmax ? 1 : request.k;
  if (request.kind == LogitsRequest::Kind::logits || k >= narrowest) return LlamaModel::forward_select(inputs, request);
  if (k <= 0 || k >= config_.vocab_size) {
    fail("top-k request for " + std::to_string(k) + " candidates; expected 0 < k < " + std::to_string(config_.vocab_size));
  }
  // Each rank's k best (top-k's tie rule: the lowest ids at the k-th value), then the k best of those.
  rank_selected_.resize(R);
  LogitsRequest rank_request{LogitsRequest::Kind::top_k, k};
  rank_request.shard = true;
  step(inputs, [&](int r) { rank_selected_[r] = ranks_[r]->forward_select(inputs, rank_request); });
  const int rows = rank_selected_[0].rows;
  select_ids_.resize(size_t(rows) * k);
  select_values_.resize(size_t(rows) * k);
  std::vector<std::pair<float, int>> cand(size_t(R) * k);
  std::vector<float> cand_values(cand.size());
  std::vector<int32_t> cand_ids(cand.size());
  for (int i = 0; i < rows; ++i) {
    for (int r = 0; r < R; ++r) {
      const LogitsOutput& o = rank_selected_[r];
      const int vocab0 = shards_[r].vocab0;
      for (int j = 0; j < k; ++j) cand[size_t(r) * k + j] = {o.values[size_t(i) * k + j], vocab0 + o.ids[size_t(i) * k + j]};
    }
    // The whole row's refusal, as one model gives it: each rank's candidates start with its lowest-id NaN (then its
    // +inf), and its k best are all -inf only when its whole slice is, so the candidates decide it exactly.
    for (size_t c = 0; c < cand.size(); ++c) cand_values[c] = cand[c].first, cand_ids[c] = cand[c].second;
    if (std::string why = unsampleable(cand_values.data(), int(cand.size()), "logit", cand_ids.data()); !why.empty()) {
      fail("logits row " + std::to_string(i) + ": " + why);
    }
    std::partial_sort(cand.begin(), cand.begin() + k, cand.end(), Sampler::before);
    for (int j = 0; j < k; ++j) {
      select_values_[size_t(i) * k + j] = cand[j].first;
      select_ids_[size_t(i) * k + j] = cand[j].second;
    }
  }
  LogitsOutput out;
  out.kind = request.kind;
  out.rows = rows;
  out.vocab = config_.vocab_size;
  out.ids = select_ids_.data();
  if (request.kind == LogitsRequest::Kind::top_k) {
    out.k = k;
    out.values = select_values_.data();
  }
  return out;
}

void ParallelModel::reset(int slot) {
  for (auto& m : ranks_) m->reset(slot);
}

int ParallelModel::threads() const {
  int n = 0;
  for (const auto& m : ranks_) n += m->threads();
  return n;
}

std::string ParallelModel::device() const {
  return ranks_[0]->device() + ", tensor parallel over " + std::to_string(ranks()) + " ranks (" + group_->name() + ")";
}

size_t ParallelModel::device_bytes() const {
  size_t n = 0;
  for (const auto& m : ranks_) n += m->device_bytes();
  return n;
}

std::string tensor_parallel_support() {
#if FLASHLITE_ENGINE_CUDA
  return "cpu (in-process); cuda (" + nccl_description() + ")";
#else
  return "cpu (in-process); cuda: not in this build";
#endif
}

std::unique_ptr<LlamaModel> load_parallel_model(const std::string& path, const RuntimeOptions& options,
                                                const std::string& device) {
  return std::make_unique<ParallelModel>(
      options.tp, [path](int rank, int ranks) { return load_checkpoint(path, {}, rank, ranks); }, options, device);
}

}  // namespace flashlite::engine
