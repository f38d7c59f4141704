// Character-level text corpora for language models: a UTF-8 file preprocessed as a Project
// Gutenberg book, its vocabulary of code points, the 90/10 train/validation split, and the seeded
// batch offsets that the PyTorch peer (bench/peers/gpt.py) computes the same way, bit for bit.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "mixprec/device.h"
#include "mixprec/tensor.h"

namespace mixprec::data {

// Moby Dick (Project Gutenberg #2701), unpacked from Debian's golang-github-colinmarc-hdfs-dev by
// scripts/dev.sh: the default of `train --model gpt --text`.
constexpr const char* kDefaultTextPath = "/usr/local/share/mixprec/mobydick.txt";

// Decodes UTF-8 into code points. Throws one line naming `source` and the byte offset of the first
// invalid sequence (a stray continuation byte, a truncated or overlong sequence, a surrogate, a
// value above U+10FFFF).
std::u32string decode_utf8(std::string_view bytes, const std::string& source);
std::string encode_utf8(std::u32string_view text);

// The preprocessing of a book: a leading BOM (U+FEFF) is dropped, CRLF becomes LF, and when a line
// contains "*** START OF", only the lines after it are kept, up to (not including) the first later
// line that contains "*** END OF" (or to the end). Every kept line keeps its LF, so the text ends
// with the LF before the END line. Text without the START marker is kept whole.
std::u32string preprocess_text(std::u32string text);

// The characters of a corpus, sorted by code point; a token is a character's index.
class Vocabulary {
 public:
  Vocabulary() = default;
  // The distinct code points of `text`, sorted.
  static Vocabulary of_text(std::u32string_view text);
  // From the characters themselves as UTF-8 (a checkpoint's metadata): they must be sorted and
  // distinct; errors name `source`.
  static Vocabulary from_utf8(std::string_view chars, const std::string& source);

  int64_t size() const { return int64_t(chars_.size()); }
  const std::u32string& chars() const { return chars_; }
  std::string to_utf8() const { return encode_utf8(chars_); }
  // The token of `c`, or -1 when it is not in the vocabulary.
  int64_t index(char32_t c) const;
  // Throws one line naming `what` and the first character outside the vocabulary.
  std::vector<int64_t> encode(std::u32string_view text, const std::string& what) const;
  // Tokens outside [0, size) throw.
  std::string decode(const std::vector<int64_t>& tokens) const;

  bool operator==(const Vocabulary&) const = default;

 private:
  std::u32string chars_;
};

// "'x' (U+0078)", for messages: the character, and its code point.
std::string describe_char(char32_t c);

enum class TextSplit { train = 0, val = 1 };

// A tokenized corpus: the first 90% of the tokens (n * 9 / 10, which equals Python's int(0.9 * n))
// train, the rest validate.
struct TextCorpus {
  std::string source;
  Vocabulary vocab;
  std::vector<int32_t> tokens;
  int64_t train_size = 0;  // tokens [0, train_size) train, [train_size, size) validate

  const int32_t* split_begin(TextSplit s) const { return tokens.data() + (s == TextSplit::train ? 0 : train_size); }
  int64_t split_size(TextSplit s) const {
    return s == TextSplit::train ? train_size : int64_t(tokens.size()) - train_size;
  }
  // Throws one line naming the file when a split holds fewer than block_size + 1 tokens (a batch
  // row needs block_size inputs and the next token of each).
  void check_block_size(int64_t block_size) const;
};

// Reads and preprocesses a UTF-8 file. Throws one line naming the file when it is missing or
// unreadable, invalid UTF-8 (with the byte offset), or empty after preprocessing.
TextCorpus load_text(const std::string& path);
// The same from text in memory (`source` names it in errors).
TextCorpus make_text_corpus(std::string_view utf8, const std::string& source);

// The batch order, shared with the peer (all arithmetic in uint64, wrapping):
//   mix(z): z += 0x9E3779B97F4A7C15; z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9;
//           z = (z ^ (z >> 27)) * 0x94D049BB133111EB; return z ^ (z >> 31)       (SplitMix64's)
//   offset(seed, split, i) = mix(mix(seed * 2 + split) + i) % (n_split - block_size)
// Training step s (0-based), row b: i = s * batch_size + b, the train split, seed = --seed.
// Validation batch j, row b: i = j * kValBatchSize + b, the val split, seed 0 (whatever --seed).
constexpr int64_t kValBatchSize = 32;
uint64_t mix64(uint64_t z);
int64_t batch_offset(uint64_t seed, TextSplit split, uint64_t i, int64_t split_size, int64_t block_size);

// Rows first_index .. first_index + batch_size - 1 of a split's sequence: x = tokens[off, off + T),
// y = tokens[off + 1, off + T + 1), as i64 [batch_size, T] tensors on `device` (memory category
// data). The corpus must pass check_block_size(block_size).
struct TextBatch {
  Tensor x, y;
};
TextBatch text_batch(const TextCorpus& corpus, TextSplit split, uint64_t seed, uint64_t first_index, int64_t batch_size,
                     int64_t block_size, const Device& device = default_device());

}  // namespace mixprec::data
