#include "engine/safetensors.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "engine/errors.h"
#include "flashlite/dtype.h"

namespace flashlite::engine {

using json = nlohmann::json;

const char* st_dtype_name(StDType d) {
  switch (d) {
    case StDType::f32: return "F32";
    case StDType::f16: return "F16";
    case StDType::bf16: return "BF16";
    case StDType::unsupported: return "unsupported";
  }
  return "?";
}

size_t st_dtype_size(StDType d) {
  switch (d) {
    case StDType::f32: return 4;
    case StDType::f16:
    case StDType::bf16: return 2;
    case StDType::unsupported: return 0;
  }
  return 0;
}

std::string StTensor::shape_string() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

namespace {

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the reference implementation's limit
constexpr size_t kMaxJsonDepth = 127;              // serde_json's recursion limit, counted in objects and arrays

// Every dtype of the format (safetensors 0.8) and its size in bits; sub-byte dtypes must fill whole bytes.
struct DTypeInfo {
  const char* name;
  uint64_t bits;
  StDType engine;
};
constexpr DTypeInfo kDTypes[] = {
    {"BOOL", 8, StDType::unsupported},        {"F4", 4, StDType::unsupported},
    {"F6_E2M3", 6, StDType::unsupported},     {"F6_E3M2", 6, StDType::unsupported},
    {"U8", 8, StDType::unsupported},          {"I8", 8, StDType::unsupported},
    {"F8_E5M2", 8, StDType::unsupported},     {"F8_E4M3", 8, StDType::unsupported},
    {"F8_E8M0", 8, StDType::unsupported},     {"F8_E4M3FNUZ", 8, StDType::unsupported},
    {"F8_E5M2FNUZ", 8, StDType::unsupported}, {"I16", 16, StDType::unsupported},
    {"U16", 16, StDType::unsupported},        {"F16", 16, StDType::f16},
    {"BF16", 16, StDType::bf16},              {"I32", 32, StDType::unsupported},
    {"U32", 32, StDType::unsupported},        {"F32", 32, StDType::f32},
    {"C64", 64, StDType::unsupported},        {"F64", 64, StDType::unsupported},
    {"I64", 64, StDType::unsupported},        {"U64", 64, StDType::unsupported},
};

int find_dtype(const std::string& name) {
  for (size_t i = 0; i < std::size(kDTypes); ++i)
    if (name == kDTypes[i].name) return int(i);
  return -1;
}

struct HeaderTensor {
  std::string name;
  int dtype = -1;  // index into kDTypes
  std::vector<uint64_t> shape;
  uint64_t offsets[2] = {0, 0};
};

// The header's JSON, validated while it streams by (nlohmann SAX). A DOM would not do: nlohmann keeps only the last
// of duplicate keys, while the reference validates every occurrence (a later tensor of the same name replaces an
// earlier one, both must be well-formed) and rejects duplicate fields inside a tensor. Nothing is stored but the
// tensors, so a 100 MB header of nested arrays costs no more than its own bytes. The reference's TensorInfo may also
// be an array [dtype, shape, data_offsets], and a dtype may be {"F32": null}; unknown fields of a tensor are ignored.
class HeaderParser {
 public:
  std::vector<HeaderTensor> tensors;
  std::string error;  // the syntax error if there is one, else the first breach of the format

  // After a breach the rest is only checked for syntax (a syntax error is the more useful message).
  bool null() { return failed_ || scalar(Kind::null); }
  bool boolean(bool) { return failed_ || scalar(Kind::other); }
  bool number_integer(json::number_integer_t) { return failed_ || scalar(Kind::other); }  // negative (or -0)
  bool number_unsigned(json::number_unsigned_t v) { return failed_ || scalar(Kind::unsigned_int, v); }
  bool number_float(json::number_float_t, const std::string&) { return failed_ || scalar(Kind::other); }
  bool string(std::string& s) { return failed_ || scalar(Kind::string, 0, &s); }
  bool binary(json::binary_t&) { return failed_ || scalar(Kind::other); }
  bool start_object(size_t) { return failed_ || open(Ctx::object); }
  bool start_array(size_t) { return failed_ || open(Ctx::array); }
  bool key(std::string& k) { return failed_ || on_key(k); }
  bool end_object() { return failed_ || close(); }
  bool end_array() { return failed_ || close(); }
  bool parse_error(size_t, const std::string&, const json::exception& e) {
    error = "is not valid JSON: " + json_error_text(e);
    return false;
  }

 private:
  enum class Kind { null, unsigned_int, string, other };
  enum class Ctx { object, array };  // what was opened (for start_*)
  // What a frame is: the root object, __metadata__, a tensor as object or array, its dtype map, its shape, its
  // offsets, or a value nobody reads (unknown fields).
  enum class Role { root, metadata, tensor_object, tensor_array, dtype_map, shape, offsets, ignored };
  struct Frame {
    Role role;
    int slot = 0;  // tensor_object: the field whose value comes next (-1 unknown); others: values seen so far
  };

  bool bad(const std::string& why) {
    error = why;
    failed_ = true;
    return true;
  }
  std::string tensor_name() const { return "tensor '" + name_ + "'"; }
  // The field a value in the current frame belongs to: 0 dtype, 1 shape, 2 data_offsets, -1 ignored.
  int field_of_next_value() {
    Frame& f = stack_.back();
    if (f.role == Role::tensor_object) return f.slot;
    return f.slot++;  // tensor_array: position
  }
  bool on_key(std::string& k);
  bool open(Ctx c);
  bool scalar(Kind k, uint64_t u = 0, const std::string* s = nullptr);
  bool close();
  bool finish_tensor() {
    cur_.name = name_;
    tensors.push_back(std::move(cur_));
    cur_ = HeaderTensor();
    return true;
  }

  bool failed_ = false;
  std::vector<Frame> stack_;
  std::string name_;  // the current top-level key
  int metadata_seen_ = 0;
  unsigned fields_seen_ = 0;  // bit per field of the current tensor object
  HeaderTensor cur_;
};

bool HeaderParser::on_key(std::string& k) {
  Frame& f = stack_.back();
  switch (f.role) {
    case Role::root:
      name_ = k;
      if (k == "__metadata__" && ++metadata_seen_ > 1) return bad("has two \"__metadata__\" entries");
      return true;
    case Role::tensor_object: {
      f.slot = k == "dtype" ? 0 : k == "shape" ? 1 : k == "data_offsets" ? 2 : -1;
      if (f.slot < 0) return true;
      if (fields_seen_ & (1u << f.slot)) return bad(tensor_name() + " has a duplicate field '" + k + "'");
      fields_seen_ |= 1u << f.slot;
      return true;
    }
    case Role::dtype_map:
      if (f.slot++ > 0) return bad(tensor_name() + " has a dtype map with more than one key");
      cur_.dtype = find_dtype(k);
      if (cur_.dtype < 0) return bad(tensor_name() + " has unknown dtype '" + k + "'");
      return true;
    default: return true;  // __metadata__ keys and ignored objects: any key
  }
}

bool HeaderParser::open(Ctx c) {
  if (stack_.size() >= kMaxJsonDepth) return bad("nests JSON deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  const bool obj = c == Ctx::object;
  if (stack_.empty()) {
    if (!obj) return bad("is a JSON array; expected an object");
    stack_.push_back({Role::root});
    return true;
  }
  Frame& f = stack_.back();
  Role role = Role::ignored;
  switch (f.role) {
    case Role::root:
      if (name_ == "__metadata__") {
        if (!obj) return bad("has a \"__metadata__\" that is not an object of strings");
        role = Role::metadata;
      } else {
        fields_seen_ = 0;
        role = obj ? Role::tensor_object : Role::tensor_array;
      }
      break;
    case Role::metadata: return bad("has a \"__metadata__\" value that is not a string");
    case Role::tensor_object:
    case Role::tensor_array: {
      const int field = field_of_next_value();
      if (field == 0 && obj) role = Role::dtype_map;
      else if (field == 1 && !obj) role = Role::shape;
      else if (field == 2 && !obj) role = Role::offsets;
      else if (field == 0) return bad(tensor_name() + " has a dtype that is not a string");
      else if (field == 1) return bad(tensor_name() + " has a shape that is not a list");
      else if (field == 2) return bad(tensor_name() + " has data_offsets that are not a list");
      else if (f.role == Role::tensor_array) return bad(tensor_name() + " is a list of more than 3 entries");
      break;
    }
    case Role::dtype_map: return bad(tensor_name() + " has a dtype map whose value is not null");
    case Role::shape: return bad(tensor_name() + " has a shape entry that is not a non-negative integer");
    case Role::offsets: return bad(tensor_name() + " has data_offsets that are not two non-negative integers");
    case Role::ignored: break;
  }
  stack_.push_back({role});
  return true;
}

bool HeaderParser::scalar(Kind k, uint64_t u, const std::string* s) {
  if (stack_.empty()) return bad("is not a JSON object");
  Frame& f = stack_.back();
  switch (f.role) {
    case Role::root:
      if (name_ == "__metadata__") return k == Kind::null || bad("has a \"__metadata__\" that is not an object of strings");
      return bad(tensor_name() + " is not an object with dtype, shape and data_offsets");
    case Role::metadata: return k == Kind::string || bad("has a \"__metadata__\" value that is not a string");
    case Role::tensor_object:
    case Role::tensor_array: {
      const int field = field_of_next_value();
      if (field == 0) {
        if (k != Kind::string) return bad(tensor_name() + " has a dtype that is not a string");
        cur_.dtype = find_dtype(*s);
        return cur_.dtype >= 0 || bad(tensor_name() + " has unknown dtype '" + *s + "'");
      }
      if (field == 1) return bad(tensor_name() + " has a shape that is not a list");
      if (field == 2) return bad(tensor_name() + " has data_offsets that are not a list");
      return f.role == Role::tensor_object || bad(tensor_name() + " is a list of more than 3 entries");
    }
    case Role::dtype_map: return k == Kind::null || bad(tensor_name() + " has a dtype map whose value is not null");
    case Role::shape:
      if (k != Kind::unsigned_int) return bad(tensor_name() + " has a shape entry that is not a non-negative integer");
      cur_.shape.push_back(u);
      return true;
    case Role::offsets:
      if (k != Kind::unsigned_int || f.slot >= 2) {
        return bad(tensor_name() + " has data_offsets that are not two non-negative integers");
      }
      cur_.offsets[f.slot++] = u;
      return true;
    case Role::ignored: return true;
  }
  return true;
}

bool HeaderParser::close() {
  const Frame f = stack_.back();
  stack_.pop_back();
  switch (f.role) {
    case Role::tensor_object:
      if (fields_seen_ != 7u) return bad(tensor_name() + " lacks dtype, shape or data_offsets");
      return finish_tensor();
    case Role::tensor_array:
      if (f.slot != 3) return bad(tensor_name() + " is a list of " + std::to_string(f.slot) + " entries; expected 3");
      return finish_tensor();
    case Role::dtype_map: return f.slot == 1 || bad(tensor_name() + " has an empty dtype map");
    case Role::offsets:
      return f.slot == 2 || bad(tensor_name() + " has data_offsets that are not two non-negative integers");
    default: return true;
  }
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path) : file_(path) {
  const std::string where = "safetensors file '" + path + "'";
  if (file_.size() < 8) fail(where + " is " + std::to_string(file_.size()) + " bytes; expected at least 8 (truncated?)");
  uint64_t header_len = 0;
  std::memcpy(&header_len, file_.data(), 8);
  if (header_len > kMaxHeaderBytes) {
    fail(where + " declares a " + std::to_string(header_len) + "-byte JSON header; the format allows at most " +
         std::to_string(kMaxHeaderBytes) + " (corrupt, or not a safetensors file)");
  }
  if (header_len > file_.size() - 8) {
    fail(where + " declares a " + std::to_string(header_len) + "-byte JSON header but only " +
         std::to_string(file_.size() - 8) + " bytes follow (truncated or not a safetensors file)");
  }
  const char* text = reinterpret_cast<const char*>(file_.data()) + 8;
  // nlohmann would end the text at a NUL byte and skip a leading byte-order mark; JSON allows neither.
  if (std::memchr(text, 0, header_len)) fail(where + " has a NUL byte in its JSON header (is the header length right?)");
  if (header_len >= 3 && std::memcmp(text, "\xEF\xBB\xBF", 3) == 0) {
    fail(where + " has a JSON header starting with a byte-order mark");
  }
  HeaderParser parser;
  bool ok = false;
  try {
    ok = json::sax_parse(text, text + header_len, &parser);
  } catch (const json::exception& e) {
    parser.error = "is not valid JSON: " + json_error_text(e);
  }
  if (!ok || !parser.error.empty()) fail(where + "'s header " + (parser.error.empty() ? "is invalid" : parser.error));

  // A later tensor of the same name replaces an earlier one (the reference reads the header into a hash map).
  std::map<std::string, const HeaderTensor*> latest;
  for (const HeaderTensor& h : parser.tensors) latest[h.name] = &h;
  const uint8_t* base = file_.data() + 8 + header_len;
  const uint64_t data_size = file_.size() - 8 - header_len;
  std::vector<const StTensor*> by_offset;
  for (const auto& [name, h] : latest) {
    const std::string tname = where + " tensor '" + name + "'";
    StTensor t;
    t.name = name;
    t.file = path;
    t.dtype = kDTypes[h->dtype].engine;
    t.dtype_name = kDTypes[h->dtype].name;
    t.shape = h->shape;
    const uint64_t begin = h->offsets[0], end = h->offsets[1];
    if (begin > end || end > data_size) {
      fail(tname + " has data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) + "] outside the " +
           std::to_string(data_size) + " data bytes (truncated file or corrupt header)");
    }
    // Left to right, as the reference does: [2^33, 2^33, 0] overflows even though it holds nothing.
    const std::string what = tname + " of shape " + t.shape_string() + ": its size";
    CheckedSize n(1, what);
    for (uint64_t d : t.shape) n = n * d;
    const uint64_t bits = (n * kDTypes[h->dtype].bits).value();
    if (bits % 8 != 0) {
      fail(tname + " of dtype '" + t.dtype_name + "' has " + std::to_string(n.value()) +
           " elements, not a whole number of bytes");
    }
    t.numel = n.value();
    t.bytes = bits / 8;
    if (t.bytes != end - begin) {
      fail(tname + " has shape " + t.shape_string() + " of dtype '" + t.dtype_name + "' (" + std::to_string(t.bytes) +
           " bytes) but its offsets span " + std::to_string(end - begin) + " bytes");
    }
    t.data = base + begin;
    by_offset.push_back(&tensors_.emplace(name, std::move(t)).first->second);
  }
  // The tensors, in offset order, must tile the data section: a gap or trailing bytes would be unread data (a
  // header length off by one lands here), an overlap two tensors sharing bytes.
  std::sort(by_offset.begin(), by_offset.end(), [&](const StTensor* a, const StTensor* b) {
    return std::make_pair(a->data, a->data + a->bytes) < std::make_pair(b->data, b->data + b->bytes);
  });
  uint64_t covered = 0;
  const StTensor* prev = nullptr;
  for (const StTensor* t : by_offset) {
    const uint64_t begin = uint64_t(t->data - base);
    if (begin != covered) {
      fail(where + " tensor '" + t->name + "' starts at data byte " + std::to_string(begin) + " but " +
           (prev ? "tensor '" + prev->name + "' ends" : std::string("the data starts")) + " at byte " +
           std::to_string(covered) + (begin < covered ? ": the tensors overlap" : ": the bytes between are unused") +
           " (the format requires the tensors to tile the data section)");
    }
    covered = begin + t->bytes;
    prev = t;
  }
  if (covered != data_size) {
    fail(where + " has " + std::to_string(data_size - covered) + " data bytes after its last tensor (the tensors cover " +
         std::to_string(covered) + " of " + std::to_string(data_size) + "; is the header length right?)");
  }
}

SafetensorsCheckpoint::SafetensorsCheckpoint(const std::string& dir) : dir_(dir) {
  const std::string single = dir + "/model.safetensors", index = dir + "/model.safetensors.index.json";
  if (file_exists(index)) {
    json j;
    try {
      j = json::parse(read_text_file(index));
    } catch (const json::exception& e) {
      fail("'" + index + "' is not valid JSON: " + json_error_text(e));
    }
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
      fail("'" + index + "' has no weight_map object");
    }
    std::map<std::string, size_t> file_ids;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string()) fail("'" + index + "' maps '" + it.key() + "' to something that is not a file name");
      const std::string f = it.value().get<std::string>();
      if (f.empty() || f == "." || f == ".." || f.find('/') != std::string::npos) {
        fail("'" + index + "' names shard '" + f + "'; expected a file name in the same directory");
      }
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

const StTensor& SafetensorsCheckpoint::expect(const std::string& name, const std::vector<ExpectedDim>& expected) const {
  const StTensor& t = get(name);
  if (t.dtype == StDType::unsupported) {
    fail("tensor '" + name + "' in '" + t.file + "' has dtype '" + t.dtype_name + "'; expected F32, F16 or BF16");
  }
  bool same = t.shape.size() == expected.size();
  for (size_t i = 0; same && i < expected.size(); ++i) {
    same = expected[i].size >= 0 && t.shape[i] == uint64_t(expected[i].size);
  }
  if (!same) {
    std::string want = "[", fields = "[";
    for (size_t i = 0; i < expected.size(); ++i) {
      const char* sep = i ? ", " : "";
      want.append(sep).append(std::to_string(expected[i].size));
      fields.append(sep).append(expected[i].field);
    }
    fail("tensor '" + name + "' in '" + t.file + "' has shape " + t.shape_string() + "; the config implies " + want +
         "] (" + fields + "]); does config.json belong to this checkpoint?");
  }
  return t;
}

std::vector<std::string> SafetensorsCheckpoint::unused(const std::set<std::string>& used) const {
  std::vector<std::string> out;
  for (const auto& f : files_)
    for (const auto& [name, t] : f->tensors()) {
      auto it = index_.find(name);
      if (!used.count(name) || it == index_.end() || it->second != &t) out.push_back(name);
    }
  return out;
}

size_t SafetensorsCheckpoint::total_bytes() const {
  size_t n = 0;
  for (const auto& [name, t] : index_) n += t->bytes;
  return n;
}

namespace {

// n values from `src` (the tensor's dtype) to fp32.
void convert_f32(const StTensor& t, const uint8_t* src, uint64_t n, float* out) {
  switch (t.dtype) {
    case StDType::f32: std::memcpy(out, src, size_t(n) * 4); break;
    case StDType::f16:
      for (uint64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        out[i] = fp16_to_float(h);
      }
      break;
    case StDType::bf16:
      for (uint64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        out[i] = bf16_to_float(h);
      }
      break;
    case StDType::unsupported:
      fail("tensor '" + t.name + "' in '" + t.file + "' has dtype '" + t.dtype_name + "'; expected F32, F16 or BF16");
  }
}

}  // namespace

void read_f32(const StTensor& t, float* out) { convert_f32(t, t.data, t.numel, out); }

void read_f32_block(const StTensor& t, int64_t row0, int64_t rows, int64_t col0, int64_t cols, float* out) {
  const uint64_t width = t.shape.empty() ? 1 : t.shape.back();
  const uint64_t height = width ? t.numel / width : 0;
  if (row0 < 0 || rows < 0 || col0 < 0 || cols < 0 || uint64_t(row0) + uint64_t(rows) > height ||
      uint64_t(col0) + uint64_t(cols) > width) {
    fail("tensor '" + t.name + "' in '" + t.file + "' (shape " + t.shape_string() + ") has no block of rows [" +
         std::to_string(row0) + ", " + std::to_string(row0 + rows) + ") x columns [" + std::to_string(col0) + ", " +
         std::to_string(col0 + cols) + ")");
  }
  if (t.dtype == StDType::unsupported) convert_f32(t, t.data, 0, out);  // its error, before the threads (none may throw)
  const size_t esize = st_dtype_size(t.dtype);
  // Rows in parallel: an 8B checkpoint converts 16 GB (the reads are page faults of the mapping as much as math).
#pragma omp parallel for schedule(static) if (uint64_t(rows) * uint64_t(cols) >= (uint64_t(1) << 20))
  for (int64_t r = 0; r < rows; ++r) {
    convert_f32(t, t.data + ((uint64_t(row0) + r) * width + col0) * esize, uint64_t(cols), out + r * cols);
  }
}

}  // namespace flashlite::engine
