#include "engine/safetensors.h"

#include <cstring>
#include <nlohmann/json.hpp>

#include "engine/errors.h"
#include "src/common/half.h"

namespace flashlite::engine {

using json = nlohmann::json;

const char* st_dtype_name(StDType d) {
  switch (d) {
    case StDType::f32: return "F32";
    case StDType::f16: return "F16";
    case StDType::bf16: return "BF16";
  }
  return "?";
}

size_t st_dtype_size(StDType d) { return d == StDType::f32 ? 4 : 2; }

int64_t StTensor::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

std::string StTensor::shape_string() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

SafetensorsFile::SafetensorsFile(const std::string& path) : file_(path) {
  const std::string where = "safetensors file '" + path + "'";
  if (file_.size() < 8) fail(where + " is " + std::to_string(file_.size()) + " bytes; expected at least 8 (truncated?)");
  uint64_t header_len = 0;
  std::memcpy(&header_len, file_.data(), 8);
  if (header_len > file_.size() - 8) {
    fail(where + " declares a " + std::to_string(header_len) + "-byte JSON header but only " +
         std::to_string(file_.size() - 8) + " bytes follow (truncated or not a safetensors file)");
  }
  json header;
  try {
    header = json::parse(reinterpret_cast<const char*>(file_.data()) + 8,
                         reinterpret_cast<const char*>(file_.data()) + 8 + header_len);
  } catch (const json::exception& e) {
    fail(where + " has a header that is not valid JSON: " + e.what());
  }
  if (!header.is_object()) fail(where + " has a JSON header that is not an object");
  const uint8_t* base = file_.data() + 8 + header_len;
  const uint64_t data_size = file_.size() - 8 - header_len;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const std::string tname = where + " tensor '" + it.key() + "'";
    const json& info = it.value();
    if (!info.is_object() || !info.contains("dtype") || !info.contains("shape") || !info.contains("data_offsets")) {
      fail(tname + " lacks dtype, shape or data_offsets");
    }
    StTensor t;
    t.name = it.key();
    t.file = path;
    if (!info["dtype"].is_string()) fail(tname + " has a dtype that is not a string");
    const std::string dt = info["dtype"].get<std::string>();
    if (dt == "F32") t.dtype = StDType::f32;
    else if (dt == "F16") t.dtype = StDType::f16;
    else if (dt == "BF16") t.dtype = StDType::bf16;
    else fail(tname + " has dtype '" + dt + "'; expected F32, F16 or BF16");
    const json& shape = info["shape"];
    const json& off = info["data_offsets"];
    if (!shape.is_array()) fail(tname + " has a shape that is not an array");
    for (const json& s : shape) {
      if (!s.is_number_integer() || s.get<int64_t>() < 0) fail(tname + " has a shape entry that is not a non-negative integer");
      t.shape.push_back(s.get<int64_t>());
    }
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
      fail(tname + " has data_offsets that are not two non-negative integers");
    }
    const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    if (begin > end || end > data_size) {
      fail(tname + " has data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
           "] outside the " + std::to_string(data_size) + " data bytes (truncated file or corrupt header)");
    }
    t.bytes = end - begin;
    if (uint64_t(t.numel()) * st_dtype_size(t.dtype) != t.bytes) {
      fail(tname + " has shape " + t.shape_string() + " of " + dt + " (" +
           std::to_string(uint64_t(t.numel()) * st_dtype_size(t.dtype)) + " bytes) but its offsets span " +
           std::to_string(t.bytes) + " bytes");
    }
    t.data = base + begin;
    tensors_.emplace(t.name, std::move(t));
  }
}

SafetensorsCheckpoint::SafetensorsCheckpoint(const std::string& dir) : dir_(dir) {
  const std::string single = dir + "/model.safetensors", index = dir + "/model.safetensors.index.json";
  if (file_exists(index)) {
    json j;
    try {
      j = json::parse(read_text_file(index));
    } catch (const json::exception& e) {
      fail("'" + index + "' is not valid JSON: " + e.what());
    }
    if (!j.contains("weight_map") || !j["weight_map"].is_object()) fail("'" + index + "' has no weight_map object");
    std::map<std::string, size_t> file_ids;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string()) fail("'" + index + "' maps '" + it.key() + "' to something that is not a file name");
      const std::string f = it.value().get<std::string>();
      if (f.find('/') != std::string::npos) fail("'" + index + "' names shard '" + f + "'; expected a file name in the same directory");
      if (!file_ids.count(f)) {
        file_ids[f] = files_.size();
        files_.push_back(std::make_unique<SafetensorsFile>(dir + "/" + f));
      }
      const auto& ts = files_[file_ids[f]]->tensors();
      auto t = ts.find(it.key());
      if (t == ts.end()) fail("'" + index + "' says tensor '" + it.key() + "' is in '" + f + "' but that shard lacks it");
      index_[it.key()] = &t->second;
    }
  } else if (file_exists(single)) {
    files_.push_back(std::make_unique<SafetensorsFile>(single));
    for (const auto& [name, t] : files_.back()->tensors()) index_[name] = &t;
  } else {
    fail("'" + dir + "' holds neither model.safetensors nor model.safetensors.index.json");
  }
}

const StTensor& SafetensorsCheckpoint::get(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) fail("checkpoint '" + dir_ + "' has no tensor '" + name + "'");
  return *it->second;
}

size_t SafetensorsCheckpoint::total_bytes() const {
  size_t n = 0;
  for (const auto& [name, t] : index_) n += t->bytes;
  return n;
}

void SafetensorsCheckpoint::read_f32(const std::string& name, const std::vector<int64_t>& expected_shape,
                                     float* out) const {
  const StTensor& t = get(name);
  if (t.shape != expected_shape) {
    StTensor e;
    e.shape = expected_shape;
    fail("tensor '" + name + "' in '" + t.file + "' has shape " + t.shape_string() + "; the config implies " +
         e.shape_string());
  }
  const int64_t n = t.numel();
  switch (t.dtype) {
    case StDType::f32: std::memcpy(out, t.data, size_t(n) * 4); break;
    case StDType::f16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, t.data + 2 * i, 2);
        out[i] = fp16_to_float(h);
      }
      break;
    case StDType::bf16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, t.data + 2 * i, 2);
        out[i] = bf16_to_float(h);
      }
      break;
  }
}

}  // namespace flashlite::engine
