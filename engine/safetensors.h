#pragma once
// Safetensors checkpoints, memory-mapped: one file, or a sharded set through model.safetensors.index.json.
// Format: u64 little-endian header length N, N bytes of JSON {name: {dtype, shape, data_offsets: [begin, end]}},
// then the data; offsets are relative to the byte after the header. Everything is validated at open time.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/mapped_file.h"

namespace flashlite::engine {

enum class StDType { f32, f16, bf16 };
const char* st_dtype_name(StDType d);
size_t st_dtype_size(StDType d);

struct StTensor {
  std::string name;
  StDType dtype = StDType::f32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // inside the mapping
  size_t bytes = 0;
  std::string file;  // which file holds it (for messages)
  int64_t numel() const;
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

// All tensors of a checkpoint directory (model.safetensors, or the shards the index names).
class SafetensorsCheckpoint {
 public:
  explicit SafetensorsCheckpoint(const std::string& dir);
  bool has(const std::string& name) const { return index_.count(name) != 0; }
  // Throws Error naming the tensor (and the checkpoint) when it is absent.
  const StTensor& get(const std::string& name) const;
  // Checks the shape and returns the tensor converted to fp32 (row-major), appended to `out`.
  void read_f32(const std::string& name, const std::vector<int64_t>& expected_shape, float* out) const;
  size_t num_tensors() const { return index_.size(); }
  size_t total_bytes() const;

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const StTensor*> index_;
};

}  // namespace flashlite::engine
