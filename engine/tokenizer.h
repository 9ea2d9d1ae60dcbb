#pragma once
// Tokenizers: one interface, two families.
//  - SentencePiece-style BPE by piece scores with byte fallback (llama2.c tokenizer .bin files).
//  - BPE with merge ranks (Hugging Face tokenizer.json; GPT-2 encoder.json + vocab.bpe): byte-level with a
//    regex pre-tokenizer (GPT-2, Llama 3), or Llama-2 style (U+2581 for spaces, <0xXX> byte fallback).
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace flashlite::engine {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Token ids for `text` (no BOS added). When parse_special is true, special-token strings in the text
  // (e.g. "<|eot_id|>") become their ids; otherwise they are tokenized as plain text.
  virtual std::vector<int> encode(std::string_view text, bool parse_special) const = 0;
  // The bytes one token stands for (special tokens: their text; llama2.c control tokens: empty).
  virtual std::string decode_token(int id) const = 0;
  // The text of a sequence. Drops the space a SentencePiece-style tokenizer prepended to the first piece.
  virtual std::string decode(const std::vector<int>& ids) const;
  virtual int vocab_size() const = 0;
  // Id of an exact token string (special tokens included); nullopt when absent.
  virtual std::optional<int> token_id(std::string_view token) const = 0;
  virtual bool is_special(int id) const = 0;
  virtual std::string kind() const = 0;
  // BOS the model expects at the start of a sequence, if the tokenizer knows one (-1: none).
  virtual int bos_id() const { return -1; }
  // True when the first text piece gets a leading space (SentencePiece dummy prefix) that decode removes.
  virtual bool adds_dummy_prefix() const { return false; }
  void check_id(int id) const;  // throws Error when id is outside [0, vocab_size)
};

// Loads from a llama2.c tokenizer .bin file, a tokenizer.json file, or a directory holding tokenizer.json
// (or encoder.json + vocab.bpe, or vocab.json + merges.txt). Throws Error naming the path otherwise.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path);

std::unique_ptr<Tokenizer> load_llama2c_tokenizer(const std::string& path);
std::unique_ptr<Tokenizer> load_hf_tokenizer_json(const std::string& path);
std::unique_ptr<Tokenizer> load_gpt2_tokenizer(const std::string& encoder_json, const std::string& merges_txt);

// Token ids must be below this (16M; the largest real vocabularies hold about 260k tokens). A file that claims a
// larger id is rejected, naming the field and this limit, before anything is sized by it.
inline constexpr int kMaxVocabSize = 1 << 24;

// UTF-8 helpers shared by the tokenizers.
size_t utf8_char_length(unsigned char lead);  // 1..4 for a valid lead byte, 1 for an invalid one
// Splits into UTF-8 characters; an invalid byte is its own "character".
std::vector<std::string_view> utf8_chars(std::string_view s);
// The code point of one character as utf8_chars splits them (an invalid byte: 0xFFFFFFFF).
uint32_t utf8_code_point(std::string_view ch);
// Unicode White_Space (what Rust's char::is_whitespace and regex \s mean, which Hugging Face uses).
bool is_unicode_space(uint32_t cp);

}  // namespace flashlite::engine
