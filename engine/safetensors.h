#pragma once
// Safetensors checkpoints, memory-mapped: one file, or a sharded set through model.safetensors.index.json.
// Format: u64 little-endian header length N, N bytes of JSON {name: {dtype, shape, data_offsets: [begin, end]}},
// then the data; offsets are relative to the byte after the header. Everything is validated at open time, by the
// rules of the reference implementation (huggingface/safetensors 0.8): header at most 100 MB of UTF-8 JSON, an
// object whose "__metadata__" (at most one) maps strings to strings; every tensor a known dtype, a shape of
// non-negative integers whose byte size (checked, no overflow) is exactly end - begin; and the tensors, ordered by
// offset, tile the data section exactly: no gap, no overlap, no trailing byte. A file the `safetensors` package
// rejects is rejected here, and one it accepts is accepted (tests/engine/test_safetensors_diff.py checks both).
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "engine/mapped_file.h"

namespace flashlite::engine {

// The dtypes the engine converts; `unsupported` is any other dtype of the format (I8, F64, F8_E4M3, ...), valid in a
// file but an error when the model reads that tensor.
enum class StDType { f32, f16, bf16, unsupported };
const char* st_dtype_name(StDType d);
size_t st_dtype_size(StDType d);  // 0 for unsupported

struct StTensor {
  std::string name;
  StDType dtype = StDType::f32;
  std::string dtype_name;  // as the header spells it
  std::vector<uint64_t> shape;
  uint64_t numel = 0;
  const uint8_t* data = nullptr;  // inside the mapping
  size_t bytes = 0;
  std::string file;  // which file holds it (for messages)
  std::string shape_string() const;
};

class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);  // maps and validates; throws Error on any inconsistency
  const std::map<std::string, StTensor>& tensors() const { return tensors_; }
  const std::string& path() const { return file_.path(); }

 private:
  MappedFile file_;
  std::map<std::string, StTensor> tensors_;
};

// One dimension of a shape the config implies, with the config.json field it comes from (named in messages).
struct ExpectedDim {
  int64_t size;
  const char* field;
};

// All tensors of a checkpoint directory (model.safetensors, or the shards the index names).
class SafetensorsCheckpoint {
 public:
  explicit SafetensorsCheckpoint(const std::string& dir);
  bool has(const std::string& name) const { return index_.count(name) != 0; }
  // Throws Error naming the tensor (and the checkpoint) when it is absent.
  const StTensor& get(const std::string& name) const;
  // The tensor, after checking that the engine can convert its dtype and that its shape is `expected`; the
  // message names the config fields behind a mismatched dimension.
  const StTensor& expect(const std::string& name, const std::vector<ExpectedDim>& expected) const;
  // Tensors of the checkpoint's files other than `used` (shard tensors the index does not name included).
  std::vector<std::string> unused(const std::set<std::string>& used) const;
  size_t num_tensors() const { return index_.size(); }
  size_t total_bytes() const;
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const StTensor*> index_;
};

// The tensor's values converted to fp32 (row-major) into out[0, numel); its dtype must be F32, F16 or BF16.
void read_f32(const StTensor& t, float* out);
// Rows [row0, row0 + rows) x columns [col0, col0 + cols) of a tensor read as 2-D (a 1-D tensor is one row), converted
// to fp32 into out (rows x cols, row-major). Only those bytes of the mapping are touched. Throws Error when the
// block is outside the tensor.
void read_f32_block(const StTensor& t, int64_t row0, int64_t rows, int64_t col0, int64_t cols, float* out);

}  // namespace flashlite::engine
