#include "engine/parallel/nccl_group.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include "engine/errors.h"
#include "engine/parallel/one_shot.h"

namespace flashlite::engine {

namespace {

void nccl_check(ncclResult_t r, const std::string& what) {
  if (r != ncclSuccess && r != ncclInProgress) {
    fail_runtime("NCCL " + what + " failed: " + ncclGetErrorString(r) + " (" + ncclGetLastError(nullptr) + ")");
  }
}

ncclDataType_t nccl_type(DType d) {
  switch (d) {
    case DType::f32: return ncclFloat32;
    case DType::f16: return ncclFloat16;
    case DType::bf16: return ncclBfloat16;
    default: break;
  }
  fail("an all-reduce of dtype " + std::string(dtype_name(d)) + " is not supported");
}

class NcclGroup final : public CollectiveGroup {
 public:
  NcclGroup(int first_device, int ranks, bool one_shot, bool pdl) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
      cudaGetLastError();
      count = 0;
    }
    if (first_device < 0 || first_device + ranks > count) {
      fail("tensor parallelism over " + std::to_string(ranks) + " GPUs from device " + std::to_string(first_device) +
           " needs devices " + std::to_string(first_device) + ".." + std::to_string(first_device + ranks - 1) +
           "; this machine has " + std::to_string(count));
    }
    std::vector<int> devices(ranks);
    for (int r = 0; r < ranks; ++r) devices[r] = first_device + r;
    // Connections made at setup, not by each algorithm's first collective: with runtime connection (NCCL 2.22+'s
    // default where cuMem is supported) a rank's first ncclAllReduce blocks on the host until its peers join, and a
    // rank that failed before joining would leave it there, holding the lock abort() needs. A user's setting wins.
    setenv("NCCL_RUNTIME_CONNECT", "0", 0);
    comms_.assign(ranks, nullptr);
    nccl_check(ncclCommInitAll(comms_.data(), ranks, devices.data()), "communicator setup (ncclCommInitAll)");
    if (one_shot) one_shot_ = OneShotSum::create(devices, pdl);  // null on any failure: NCCL alone
    for (int r = 0; r < ranks; ++r) members_.push_back(std::make_unique<Member>(*this, r));
  }

  int ranks() const override { return int(comms_.size()); }
  std::string name() const override { return one_shot_ ? "NCCL + one-shot over NVLink" : "NCCL"; }
  Collective& member(int r) override { return *members_.at(r); }
  // Kernels of an aborted communicator return, and one-shot kernels stop waiting (their abort word is set first,
  // without the lock: a rank may be blocked in its stream's synchronisation behind them), so a rank whose peer failed
  // is not left spinning on the GPU.
  void abort() override {
    if (one_shot_) one_shot_->abort();
    std::unique_lock<std::shared_mutex> lock(mu_);  // no rank is inside ncclAllReduce or a graph launch meanwhile
    if (aborted_) return;
    aborted_ = true;
    for (ncclComm_t& c : comms_.c) {
      ncclCommAbort(c);
      c = nullptr;
    }
  }
  bool recover() override { return !aborted_; }

 private:
  class Member final : public Collective {
   public:
    Member(NcclGroup& g, int rank) : g_(g), rank_(rank) {}
    int rank() const override { return rank_; }
    int ranks() const override { return g_.ranks(); }
    void all_reduce_sum(void* data, size_t n, DType dtype, void* stream) override {
      std::shared_lock<std::shared_mutex> lock(g_.mu_);
      if (g_.aborted_) throw CollectiveAborted();
      nccl_check(ncclAllReduce(data, data, n, nccl_type(dtype), ncclSum, g_.comms_[rank_], cudaStream_t(stream)),
                 "all-reduce");
    }
    bool sum_into(float* x, float* partial, size_t n, void* stream) override {
      if (!g_.one_shot_ || !OneShotSum::takes(x, partial, n)) return false;  // (the same answer on every rank)
      std::shared_lock<std::shared_mutex> lock(g_.mu_);
      if (g_.aborted_) throw CollectiveAborted();
      g_.one_shot_->sum_into(rank_, x, partial, n, stream);
      return true;
    }
    bool fused_sum(const float* x, size_t n, PeerSum* sum) override {
      if (!g_.one_shot_ || !OneShotSum::takes(x, x, n)) return false;
      if (g_.aborted_) throw CollectiveAborted();  // nothing queued that would only wait for the abort poll
      *sum = g_.one_shot_->fused_target(rank_);
      return true;
    }
    void check() override {
      if (g_.one_shot_) g_.one_shot_->check(rank_);
    }
    void guarded(const std::function<void()>& launch) override {
      std::shared_lock<std::shared_mutex> lock(g_.mu_);
      if (g_.aborted_) throw CollectiveAborted();
      launch();
    }

   private:
    NcclGroup& g_;
    int rank_;
  };

  // The communicators: destroyed with the group, and also when the constructor throws after creating them.
  struct Comms {
    std::vector<ncclComm_t> c;
    ~Comms() {
      for (ncclComm_t x : c)
        if (x) ncclCommDestroy(x);
    }
    ncclComm_t* data() { return c.data(); }
    size_t size() const { return c.size(); }
    void assign(size_t n, ncclComm_t v) { c.assign(n, v); }
    ncclComm_t operator[](size_t i) const { return c[i]; }
  } comms_;
  std::unique_ptr<OneShotSum> one_shot_;  // null: NCCL for everything
  std::vector<std::unique_ptr<Member>> members_;
  std::shared_mutex mu_;
  std::atomic<bool> aborted_{false};
};

}  // namespace

std::string nccl_description() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "NCCL (version unknown)";
  return "NCCL " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100) +
         ", one-shot kernel over NVLink where the GPUs have peer access";
}

std::unique_ptr<CollectiveGroup> create_nccl_group(int first_device, int ranks, bool one_shot, bool pdl) {
  return std::make_unique<NcclGroup>(first_device, ranks, one_shot, pdl);
}

}  // namespace flashlite::engine
