#pragma once
// A read-only memory-mapped file (RAII). Checkpoints are mapped, not read, so a 2 GB safetensors shard costs
// no copy until a tensor is touched.
#include <cstddef>
#include <cstdint>
#include <string>

namespace flashlite::engine {

class MappedFile {
 public:
  MappedFile() = default;
  explicit MappedFile(const std::string& path);  // throws Error naming the path when it cannot be opened or mapped
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  void release();
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

// Whole file into a string (small text/JSON files); throws Error naming the path when unreadable, not a regular
// file, or larger than kMaxTextFileBytes (the largest tokenizer.json files are tens of MB).
inline constexpr uint64_t kMaxTextFileBytes = uint64_t(1) << 30;
std::string read_text_file(const std::string& path);
bool file_exists(const std::string& path);
bool is_directory(const std::string& path);

}  // namespace flashlite::engine
