// Pieces shared by the tokenizers: UTF-8 splitting, sequence decode, id checks, and the loader by path.
#include "engine/errors.h"
#include "engine/mapped_file.h"
#include "engine/tokenizer.h"

namespace flashlite::engine {

size_t utf8_char_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead & 0xE0) == 0xC0) return 2;
  if ((lead & 0xF0) == 0xE0) return 3;
  if ((lead & 0xF8) == 0xF0) return 4;
  return 1;
}

std::vector<std::string_view> utf8_chars(std::string_view s) {
  std::vector<std::string_view> out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    size_t n = utf8_char_length(static_cast<unsigned char>(s[i]));
    // A truncated or malformed sequence: take the lead byte alone.
    bool ok = i + n <= s.size();
    for (size_t k = 1; ok && k < n; ++k) ok = (static_cast<unsigned char>(s[i + k]) & 0xC0) == 0x80;
    if (!ok) n = 1;
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

uint32_t utf8_code_point(std::string_view ch) {
  if (ch.empty()) return 0xFFFFFFFF;
  const auto b0 = static_cast<unsigned char>(ch[0]);
  const size_t n = utf8_char_length(b0);
  if (n != ch.size()) return n == 1 ? b0 : 0xFFFFFFFF;
  if (n == 1) return b0 < 0x80 ? b0 : 0xFFFFFFFF;
  uint32_t cp = b0 & (0x7F >> n);
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(ch[k]) & 0x3F);
  return cp;
}

bool is_unicode_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

std::string Tokenizer::decode(const std::vector<int>& ids) const {
  std::string out;
  for (int id : ids) out += decode_token(id);
  if (adds_dummy_prefix()) {
    // SentencePiece: the dummy prefix belongs to the first text piece; drop it once.
    const size_t first = out.find_first_not_of('\0');
    if (first != std::string::npos && out[first] == ' ') out.erase(first, 1);
  }
  return out;
}

void Tokenizer::check_id(int id) const {
  if (id < 0 || id >= vocab_size()) {
    fail("token id " + std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(vocab_size()) + ")");
  }
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  if (is_directory(path)) {
    if (file_exists(path + "/tokenizer.json")) return load_hf_tokenizer_json(path + "/tokenizer.json");
    if (file_exists(path + "/encoder.json") && file_exists(path + "/vocab.bpe"))
      return load_gpt2_tokenizer(path + "/encoder.json", path + "/vocab.bpe");
    if (file_exists(path + "/vocab.json") && file_exists(path + "/merges.txt"))
      return load_gpt2_tokenizer(path + "/vocab.json", path + "/merges.txt");
    fail("directory '" + path + "' holds no tokenizer.json (nor encoder.json + vocab.bpe, nor vocab.json + merges.txt)");
  }
  if (!file_exists(path)) fail("tokenizer path '" + path + "' does not exist");
  const std::string ext = path.size() >= 5 ? path.substr(path.size() - 5) : "";
  if (ext == ".json") return load_hf_tokenizer_json(path);
  return load_llama2c_tokenizer(path);
}

}  // namespace flashlite::engine
