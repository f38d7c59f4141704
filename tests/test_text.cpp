// The text corpus: UTF-8 decoding and its errors, the book preprocessing, the vocabulary, the split,
// and the batch offsets (known values that bench/peers/gpt.py must reproduce).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cli_util.h"
#include "error_text.h"
#include "mixprec/error.h"
#include "mixprec/text.h"

using namespace mixprec;
using namespace mixprec::data;
namespace fs = std::filesystem;
using mixprec::testutil::error_of;

namespace {

void write_file(const fs::path& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary);
  f << bytes;
}

}  // namespace

TEST(Text, DecodesUtf8AndRoundTrips) {
  const std::string s = "a\xC3\xA9\xE2\x80\x94\xF0\x9F\x90\x8B";  // a, e-acute, em dash, whale
  const std::u32string u = decode_utf8(s, "t");
  EXPECT_EQ(u, (std::u32string{U'a', U'\u00E9', U'\u2014', U'\U0001F40B'}));
  EXPECT_EQ(encode_utf8(u), s);
}

TEST(Text, InvalidUtf8NamesTheFileAndTheByte) {
  EXPECT_EQ(error_of([] { decode_utf8("ab\x80", "f.txt"); }),
            "f.txt: invalid UTF-8 at byte 2: byte 0x80 continues no character");
  EXPECT_EQ(error_of([] { decode_utf8("abc\xE2\x80", "f.txt"); }),
            "f.txt: invalid UTF-8 at byte 3: a 3-byte character cut by the end of the file");
  EXPECT_EQ(error_of([] { decode_utf8("\xC3x", "f.txt"); }),
            "f.txt: invalid UTF-8 at byte 0: a 2-byte character lacks continuation byte 1");
  EXPECT_EQ(error_of([] { decode_utf8("x\xC0\xAF", "f.txt"); }),
            "f.txt: invalid UTF-8 at byte 1: overlong encoding of U+002F");
  EXPECT_EQ(error_of([] { decode_utf8("\xED\xA0\x80", "f.txt"); }),
            "f.txt: invalid UTF-8 at byte 0: U+D800 is no Unicode scalar value");
  EXPECT_EQ(error_of([] { decode_utf8("\xF4\x90\x80\x80", "f.txt"); }),
            "f.txt: invalid UTF-8 at byte 0: U+110000 is no Unicode scalar value");
  EXPECT_EQ(error_of([] { decode_utf8("\xFF", "f.txt"); }),
            "f.txt: invalid UTF-8 at byte 0: byte 0xFF starts no character");
}

TEST(Text, PreprocessingKeepsTheBookBetweenTheMarkers) {
  const std::string book =
      "\xEF\xBB\xBFTitle\r\n*** START OF THE BOOK ***\r\nCall me\r\nIshmael.\r\n\r\n*** END OF THE BOOK "
      "***\r\nlicence\r\n";
  EXPECT_EQ(encode_utf8(preprocess_text(decode_utf8(book, "b"))), "Call me\nIshmael.\n\n");
  // No END line: to the end. No START line: everything (BOM dropped, CRLF -> LF, lone CR kept).
  EXPECT_EQ(encode_utf8(preprocess_text(decode_utf8("x\n*** START OF y\nab\r\ncd", "b"))), "ab\ncd");
  EXPECT_EQ(encode_utf8(preprocess_text(decode_utf8("\xEF\xBB\xBF"
                                                    "a\r\nb\rc",
                                                    "b"))),
            "a\nb\rc");
  // An END marker before START's line does not count; a START line that is the last leaves nothing.
  EXPECT_EQ(encode_utf8(preprocess_text(decode_utf8("*** END OF\n*** START OF\nz\n", "b"))), "z\n");
  EXPECT_EQ(preprocess_text(decode_utf8("a\n*** START OF", "b")), U"");
}

TEST(Text, VocabularyIsTheSortedCharacters) {
  const TextCorpus c = make_text_corpus("hello, w\xC3\xB6rld\nhello", "mem");
  EXPECT_EQ(c.vocab.chars(), U"\n ,dehlorw\u00F6");
  EXPECT_EQ(c.vocab.to_utf8(), "\n ,dehlorw\xC3\xB6");
  ASSERT_EQ(c.tokens.size(), 18u);
  EXPECT_EQ(c.tokens[0], 5);    // 'h'
  EXPECT_EQ(c.tokens[8], 10);   // U+00F6
  EXPECT_EQ(c.train_size, 16);  // 18 * 9 / 10 = int(0.9 * 18)
  EXPECT_EQ(c.split_size(TextSplit::val), 2);
  EXPECT_EQ(c.vocab.decode(c.vocab.encode(decode_utf8("w\xC3\xB6rld", "p"), "p")), "w\xC3\xB6rld");
  EXPECT_EQ(Vocabulary::from_utf8(c.vocab.to_utf8(), "meta"), c.vocab);
  EXPECT_EQ(error_of([&] { c.vocab.encode(U"hex", "--prompt"); }),
            "--prompt: character 2, 'x' (U+0078), is not in the vocabulary of 11 characters");
}

TEST(Text, VocabularyErrors) {
  const Vocabulary v = Vocabulary::of_text(U"abc");
  EXPECT_EQ(error_of([&] { v.encode(U"ab\u00E9", "--prompt"); }),
            "--prompt: character 2, '\xC3\xA9' (U+00E9), is not in the vocabulary of 3 characters");
  EXPECT_EQ(error_of([&] { v.encode(U"a\x01", "--prompt"); }),
            "--prompt: character 1, U+0001, is not in the vocabulary of 3 characters");
  EXPECT_EQ(error_of([&] { v.decode({0, 3}); }), "token 3 is outside the vocabulary of 3 characters");
  EXPECT_EQ(error_of([] { Vocabulary::from_utf8("ba", "ck.st"); }),
            "ck.st: the vocabulary is not sorted and distinct at character 1 ('a' (U+0061))");
  EXPECT_EQ(error_of([] { Vocabulary::from_utf8("", "ck.st"); }), "ck.st: the vocabulary is empty");
}

TEST(Text, MixIsSplitMix64) {
  // SplitMix64's reference outputs (seed 0: first output 0xe220a8397b1dcdaf).
  EXPECT_EQ(mix64(0), 0xe220a8397b1dcdafull);
  EXPECT_EQ(mix64(1), 0x910a2dec89025cc1ull);
  EXPECT_EQ(mix64(2674), 0x4b8ed06b0a8dbe83ull);
}

TEST(Text, BatchOffsetsForSeed1337) {
  // The numbers the PyTorch peer checks too (bench/peers/gpt.py): training rows 0..5 of seed 1337
  // in a split of 1,000,000 tokens at block size 128, and validation rows 0..5 (seed 0) of 100,000.
  const std::vector<int64_t> train = {643435, 148437, 285579, 390830, 101243, 3566};
  const std::vector<int64_t> val = {8190, 97507, 65771, 34519, 64131, 73746};
  for (uint64_t i = 0; i < 6; ++i) {
    EXPECT_EQ(batch_offset(1337, TextSplit::train, i, 1000000, 128), train[i]) << i;
    EXPECT_EQ(batch_offset(0, TextSplit::val, i, 100000, 128), val[i]) << i;
  }
}

TEST(Text, BatchesAreShiftedWindowsAtTheOffsets) {
  std::string text;
  for (int i = 0; i < 300; ++i) text += char('a' + (i * 7) % 26);
  const TextCorpus c = make_text_corpus(text, "mem");
  c.check_block_size(8);
  const TextBatch b = text_batch(c, TextSplit::val, 5, 3, 4, 8);
  ASSERT_EQ(b.x.shape(), (Shape{4, 8}));
  EXPECT_EQ(b.x.dtype(), DType::i64);
  const std::vector<int64_t> x = b.x.to_vector_i64(), y = b.y.to_vector_i64();
  const int32_t* val = c.split_begin(TextSplit::val);
  for (int64_t r = 0; r < 4; ++r) {
    const int64_t off = batch_offset(5, TextSplit::val, uint64_t(3 + r), c.split_size(TextSplit::val), 8);
    for (int64_t t = 0; t < 8; ++t) {
      EXPECT_EQ(x[size_t(r * 8 + t)], val[off + t]);
      EXPECT_EQ(y[size_t(r * 8 + t)], val[off + t + 1]);
    }
  }
}

class TextFiles : public mixprec::clitest::TempDirTest {};

TEST_F(TextFiles, FileErrorsNameTheFile) {
  const std::string missing = (dir_ / "none.txt").string();
  EXPECT_EQ(error_of([&] { load_text(missing); }),
            missing + ": cannot open the text file (missing? the default comes from scripts/dev.sh)");
  write_file(dir_ / "empty.txt", "");
  EXPECT_EQ(error_of([&] { load_text((dir_ / "empty.txt").string()); }),
            (dir_ / "empty.txt").string() + ": the file is empty");
  write_file(dir_ / "bad.txt", "fine text\n\xC3(");
  EXPECT_EQ(error_of([&] { load_text((dir_ / "bad.txt").string()); }),
            (dir_ / "bad.txt").string() + ": invalid UTF-8 at byte 10: a 2-byte character lacks continuation byte 1");
  write_file(dir_ / "short.txt", std::string(100, 'x'));
  const TextCorpus c = load_text((dir_ / "short.txt").string());
  c.check_block_size(9);  // 10 validation characters: rows of 9 + 1 fit
  EXPECT_EQ(error_of([&] { c.check_block_size(10); }),
            (dir_ / "short.txt").string() +
                ": its validation split holds 10 characters, fewer than --block-size 10 + 1 (the text has 100 "
                "characters: the first 90% train, the rest validate)");
}
