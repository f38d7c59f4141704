// Text corpora: UTF-8 decoding with byte offsets in errors, the book preprocessing, the
// character vocabulary, the split and the seeded batches (the rules are in mixprec/text.h).
#include "mixprec/text.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <sstream>

#include "mixprec/allocator.h"
#include "mixprec/error.h"

namespace mixprec::data {
namespace {

std::string hex(const char* prefix, unsigned v, int digits) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%s%0*X", prefix, digits, v);
  return buf;
}

}  // namespace

std::u32string decode_utf8(std::string_view bytes, const std::string& source) {
  std::u32string out;
  out.reserve(bytes.size());
  const auto* s = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char b = s[i];
    if (b < 0x80) {
      out.push_back(char32_t(b));
      ++i;
      continue;
    }
    // Lead byte: the sequence length, the value bits it carries and the smallest value that needs
    // that length (anything below is an overlong encoding).
    size_t len = 0;
    char32_t c = 0, min = 0;
    if ((b & 0xE0) == 0xC0) {
      len = 2, c = b & 0x1F, min = 0x80;
    } else if ((b & 0xF0) == 0xE0) {
      len = 3, c = b & 0x0F, min = 0x800;
    } else if ((b & 0xF8) == 0xF0) {
      len = 4, c = b & 0x07, min = 0x10000;
    } else {
      throw Error(detail::concat(source, ": invalid UTF-8 at byte ", i, ": byte ", hex("0x", b, 2),
                                 (b & 0xC0) == 0x80 ? " continues no character" : " starts no character"));
    }
    MIXPREC_CHECK(i + len <= n, source, ": invalid UTF-8 at byte ", i, ": a ", len,
                  "-byte character cut by the end of the file");
    for (size_t k = 1; k < len; ++k) {
      MIXPREC_CHECK((s[i + k] & 0xC0) == 0x80, source, ": invalid UTF-8 at byte ", i, ": a ", len,
                    "-byte character lacks continuation byte ", k);
      c = (c << 6) | (s[i + k] & 0x3F);
    }
    MIXPREC_CHECK(c >= min, source, ": invalid UTF-8 at byte ", i, ": overlong encoding of ", hex("U+", c, 4));
    MIXPREC_CHECK(c <= 0x10FFFF && (c < 0xD800 || c > 0xDFFF), source, ": invalid UTF-8 at byte ", i, ": ",
                  hex("U+", c, 4), " is no Unicode scalar value");
    out.push_back(c);
    i += len;
  }
  return out;
}

std::string encode_utf8(std::u32string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char32_t c : text) {
    if (c < 0x80) {
      out.push_back(char(c));
    } else if (c < 0x800) {
      out.push_back(char(0xC0 | (c >> 6)));
      out.push_back(char(0x80 | (c & 0x3F)));
    } else if (c < 0x10000) {
      out.push_back(char(0xE0 | (c >> 12)));
      out.push_back(char(0x80 | ((c >> 6) & 0x3F)));
      out.push_back(char(0x80 | (c & 0x3F)));
    } else {
      out.push_back(char(0xF0 | (c >> 18)));
      out.push_back(char(0x80 | ((c >> 12) & 0x3F)));
      out.push_back(char(0x80 | ((c >> 6) & 0x3F)));
      out.push_back(char(0x80 | (c & 0x3F)));
    }
  }
  return out;
}

std::u32string preprocess_text(std::u32string text) {
  if (!text.empty() && text[0] == U'\uFEFF') text.erase(0, 1);
  // CRLF -> LF (a lone CR stays).
  size_t w = 0;
  for (size_t r = 0; r < text.size(); ++r)
    if (!(text[r] == U'\r' && r + 1 < text.size() && text[r + 1] == U'\n')) text[w++] = text[r];
  text.resize(w);
  const size_t start_marker = text.find(U"*** START OF");
  if (start_marker == std::u32string::npos) return text;
  // The text begins after the START line's LF (nothing, if the START line is the last).
  const size_t start_eol = text.find(U'\n', start_marker);
  const size_t begin = start_eol == std::u32string::npos ? text.size() : start_eol + 1;
  const size_t end_marker = text.find(U"*** END OF", begin);
  size_t end = text.size();
  if (end_marker != std::u32string::npos) {
    // The END line starts after the last LF before its marker (it is a later line than START's).
    end = text.rfind(U'\n', end_marker);
    end = end == std::u32string::npos || end < begin ? begin : end + 1;
  }
  return text.substr(begin, end - begin);
}

Vocabulary Vocabulary::of_text(std::u32string_view text) {
  Vocabulary v;
  v.chars_.assign(text.begin(), text.end());
  std::sort(v.chars_.begin(), v.chars_.end());
  v.chars_.erase(std::unique(v.chars_.begin(), v.chars_.end()), v.chars_.end());
  return v;
}

Vocabulary Vocabulary::from_utf8(std::string_view chars, const std::string& source) {
  Vocabulary v;
  v.chars_ = decode_utf8(chars, source);
  MIXPREC_CHECK(!v.chars_.empty(), source, ": the vocabulary is empty");
  for (size_t i = 1; i < v.chars_.size(); ++i)
    MIXPREC_CHECK(v.chars_[i - 1] < v.chars_[i], source, ": the vocabulary is not sorted and distinct at character ", i,
                  " (", describe_char(v.chars_[i]), ")");
  return v;
}

int64_t Vocabulary::index(char32_t c) const {
  const auto it = std::lower_bound(chars_.begin(), chars_.end(), c);
  return it != chars_.end() && *it == c ? int64_t(it - chars_.begin()) : -1;
}

std::vector<int64_t> Vocabulary::encode(std::u32string_view text, const std::string& what) const {
  std::vector<int64_t> out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const int64_t t = index(text[i]);
    MIXPREC_CHECK(t >= 0, what, ": character ", i, ", ", describe_char(text[i]), ", is not in the vocabulary of ",
                  size(), " characters");
    out.push_back(t);
  }
  return out;
}

std::string Vocabulary::decode(const std::vector<int64_t>& tokens) const {
  std::u32string text;
  text.reserve(tokens.size());
  for (const int64_t t : tokens) {
    MIXPREC_CHECK(t >= 0 && t < size(), "token ", t, " is outside the vocabulary of ", size(), " characters");
    text.push_back(chars_[size_t(t)]);
  }
  return encode_utf8(text);
}

std::string describe_char(char32_t c) {
  std::string code = hex("U+", c, 4);
  // Control characters are shown by their code point alone: they would break the line.
  if (c < 0x20 || c == 0x7F || (c >= 0x80 && c < 0xA0)) return code;
  return detail::concat("'", encode_utf8(std::u32string(1, c)), "' (", code, ")");
}

void TextCorpus::check_block_size(int64_t block_size) const {
  for (const TextSplit s : {TextSplit::train, TextSplit::val})
    MIXPREC_CHECK(split_size(s) >= block_size + 1, source, ": its ", s == TextSplit::train ? "training" : "validation",
                  " split holds ", split_size(s), " characters, fewer than --block-size ", block_size,
                  " + 1 (the text has ", tokens.size(), " characters: the first 90% train, the rest validate)");
}

TextCorpus make_text_corpus(std::string_view utf8, const std::string& source) {
  const std::u32string text = preprocess_text(decode_utf8(utf8, source));
  MIXPREC_CHECK(!text.empty(), source, utf8.empty() ? ": the file is empty" : ": no text left after preprocessing");
  TextCorpus c;
  c.source = source;
  c.vocab = Vocabulary::of_text(text);
  c.tokens.reserve(text.size());
  for (const char32_t ch : text) c.tokens.push_back(int32_t(c.vocab.index(ch)));
  c.train_size = int64_t(text.size()) * 9 / 10;
  return c;
}

TextCorpus load_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  MIXPREC_CHECK(f.is_open(), path, ": cannot open the text file (missing? the default comes from scripts/dev.sh)");
  std::ostringstream bytes;
  bytes << f.rdbuf();
  MIXPREC_CHECK(!f.bad(), path, ": reading the text file failed");
  return make_text_corpus(bytes.str(), path);
}

uint64_t mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

int64_t batch_offset(uint64_t seed, TextSplit split, uint64_t i, int64_t split_size, int64_t block_size) {
  MIXPREC_CHECK(split_size > block_size, "batch_offset: a split of ", split_size, " tokens holds no row of ",
                block_size, " + 1");
  return int64_t(mix64(mix64(seed * 2 + uint64_t(split)) + i) % uint64_t(split_size - block_size));
}

TextBatch text_batch(const TextCorpus& corpus, TextSplit split, uint64_t seed, uint64_t first_index, int64_t batch_size,
                     int64_t block_size, const Device& device) {
  const int32_t* tokens = corpus.split_begin(split);
  const int64_t n = corpus.split_size(split), T = block_size;
  std::vector<int64_t> x(size_t(batch_size * T)), y(size_t(batch_size * T));
  for (int64_t b = 0; b < batch_size; ++b) {
    const int64_t off = batch_offset(seed, split, first_index + uint64_t(b), n, T);
    for (int64_t t = 0; t < T; ++t) {
      x[size_t(b * T + t)] = tokens[off + t];
      y[size_t(b * T + t)] = tokens[off + t + 1];
    }
  }
  const MemoryScope scope(MemCategory::data);
  return {Tensor::from_vector(x, {batch_size, T}).to(device), Tensor::from_vector(y, {batch_size, T}).to(device)};
}

}  // namespace mixprec::data
