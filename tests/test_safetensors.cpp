// safetensors files: round trips of every dtype, the bytes a save writes, files written by hand
// (any order, padding, extra metadata), and every bad file refused in one line naming the file,
// the tensor and the byte offset; a failed save leaves the previous file as it was.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "cli_util.h"
#include "error_text.h"
#include "mixprec/io.h"
#include "mixprec/state_dict.h"
#include "tensor_bytes.h"

namespace mixprec::io {
namespace {

namespace fs = std::filesystem;
using testutil::bytes_of;
using testutil::error_of;

class Safetensors : public clitest::TempDirTest {
 protected:
  std::string path(const std::string& name = "ck.st") const { return (dir_ / name).string(); }
  // Writes raw bytes to name and returns its path.
  std::string write(const std::string& bytes, const std::string& name = "ck.st") const {
    std::ofstream(path(name), std::ios::binary) << bytes;
    return path(name);
  }
  std::string read(const std::string& p) const { return clitest::slurp(p); }
  // The names in the directory (a failed save must leave no temporary behind).
  std::vector<std::string> listing() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename().string());
    return names;
  }
};

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  std::memcpy(s.data(), &v, 8);
  return s;
}

// A file by hand: the header length, the JSON and `pad` spaces, then the data.
std::string file_bytes(const std::string& json, const std::string& data, size_t pad = 0) {
  return le64(json.size() + pad) + json + std::string(pad, ' ') + data;
}

template <class T>
std::string raw(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

Tensor u8_tensor(const std::vector<uint8_t>& values) {
  Tensor t = Tensor::empty({int64_t(values.size())}, DType::u8);
  std::memcpy(t.data_ptr(), values.data(), values.size());
  return t;
}

TEST_F(Safetensors, RoundTripKeepsEveryDtypeBitForBit) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> values = {1.0f, -0.0f, 3.14159f, 1e-40f, -inf, 65504.0f};
  const Tensor matrix = Tensor::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
  const StateDict saved = {
      {"w64", Tensor::from_vector(std::vector<double>{1.0, -0.0, 1e-300, M_PI, -2.5, 7.0}, {2, 3})},
      {"w32", Tensor::from_vector(values, {3, 2})},
      {"w_bf16", Tensor::from_vector(values, {6}, DType::bf16)},
      {"w_f16", Tensor::from_vector(values, {1, 6}, DType::f16)},
      {"step", state_i64(-42)},
      {"mask", u8_tensor({0, 1, 255, 7})},
      {"empty", Tensor::zeros({0, 4})},
      {"transposed", matrix.t()},  // not contiguous: stored in logical order
  };
  const std::map<std::string, std::string> metadata = {{"precision", "amp-bf16"}, {"note", "préc ✓"}, {"empty", ""}};
  save_safetensors(path(), saved, metadata);
  const SafetensorsFile loaded = load_safetensors(path());

  EXPECT_EQ(loaded.metadata, metadata);
  ASSERT_EQ(loaded.tensors.size(), saved.size());
  for (size_t i = 0; i < saved.size(); ++i) {
    SCOPED_TRACE(saved[i].first);
    EXPECT_EQ(loaded.tensors[i].first, saved[i].first);  // the given order
    EXPECT_EQ(loaded.tensors[i].second.dtype(), saved[i].second.dtype());
    EXPECT_EQ(loaded.tensors[i].second.shape(), saved[i].second.shape());
    EXPECT_EQ(bytes_of(loaded.tensors[i].second), bytes_of(saved[i].second));
  }
  EXPECT_EQ(listing(), std::vector<std::string>{"ck.st"});
}

TEST_F(Safetensors, SavedBytesFollowTheFormat) {
  save_safetensors(path(), {{"a", Tensor::from_vector(std::vector<float>{1.0f, 2.0f}, {2})}, {"s", state_i64(5)}},
                   {{"k", "v"}});
  const std::string json = R"({"__metadata__":{"k":"v"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                           R"("s":{"dtype":"I64","shape":[],"data_offsets":[8,16]}})";
  const size_t pad = (8 - json.size() % 8) % 8;  // the header is padded so the data starts 8-byte aligned
  EXPECT_EQ(read(path()), file_bytes(json, raw(std::vector<float>{1, 2}) + raw(std::vector<int64_t>{5}), pad));
  EXPECT_EQ((8 + json.size() + pad) % 8, 0u);
}

TEST_F(Safetensors, ReadsAFileWrittenByHandInAnyOrderWithPaddingAndExtraMetadata) {
  // The header lists the tensors out of file order, metadata last with keys we do not use, and
  // ends in 13 spaces of padding; "e" is empty and shares its offset with the end of "b".
  const std::string json = R"({"b": {"shape": [1], "dtype": "F16", "data_offsets": [8, 10]},)"
                           R"( "e": {"dtype": "F32", "shape": [2, 0], "data_offsets": [10, 10]},)"
                           R"( "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
                           R"( "__metadata__": {"format": "pt", "anything": "else"}})";
  const std::string data = raw(std::vector<float>{1.5f, -2.0f}) + raw(std::vector<uint16_t>{0x3C00});  // f16 1.0
  const SafetensorsFile f = load_safetensors(write(file_bytes(json, data, 13)));

  ASSERT_EQ(f.tensors.size(), 3u);
  EXPECT_EQ(f.tensors[0].first, "a");  // file order: by data offset
  EXPECT_EQ(f.tensors[1].first, "b");
  EXPECT_EQ(f.tensors[2].first, "e");
  EXPECT_EQ(f.tensors[0].second.to_vector(), (std::vector<float>{1.5f, -2.0f}));
  EXPECT_EQ(f.tensors[1].second.dtype(), DType::f16);
  EXPECT_EQ(f.tensors[1].second.to_vector(), std::vector<float>{1.0f});
  EXPECT_EQ(f.tensors[2].second.shape(), (Shape{2, 0}));
  EXPECT_EQ(f.metadata, (std::map<std::string, std::string>{{"format", "pt"}, {"anything", "else"}}));

  // No tensors at all, as the reference writer makes it for an empty dict.
  EXPECT_TRUE(load_safetensors(write(file_bytes("{}", "", 6))).tensors.empty());
}

// Two f32 tensors, a [2] at data bytes 0..7 and b [1] at 8..11, in a file that is valid as given.
const std::string kJsonA = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
std::string two_tensors(const std::string& b_entry) { return kJsonA.substr(0, kJsonA.size() - 1) + "," + b_entry; }
const std::string kData12 = raw(std::vector<float>{1, 2, 3});

// An expected message for a file whose header is json: "@N" stands for the file offset of data offset
// N, "{D}" for the first data byte, "{H}" for the header's last byte.
std::string expected_text(const std::string& json, std::string what) {
  for (size_t at; (at = what.find('@')) != std::string::npos;) {
    const size_t end = what.find_first_not_of("0123456789", at + 1);
    const uint64_t offset = std::stoull(what.substr(at + 1, end - at - 1));
    what.replace(at, end - at, std::to_string(8 + json.size() + offset));
  }
  for (size_t at; (at = what.find("{H}")) != std::string::npos;) what.replace(at, 3, std::to_string(7 + json.size()));
  for (size_t at; (at = what.find("{D}")) != std::string::npos;) what.replace(at, 3, std::to_string(8 + json.size()));
  return what;
}

TEST_F(Safetensors, TruncatedFilesAreRefusedNamingTheTensorAndTheOffset) {
  const std::string json = two_tensors(R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})");
  const std::string start = std::to_string(8 + json.size());
  const std::string cut = write(file_bytes(json, kData12.substr(0, 10)));
  EXPECT_EQ(error_of([&] { load_safetensors(cut); }),
            cut + ": tensor 'b' at byte " + std::to_string(8 + json.size() + 8) +
                ": data_offsets [8, 12] run past the end of the data (10 bytes from byte " + start + "; the file is " +
                std::to_string(8 + json.size() + 10) + " bytes): truncated file?");

  const std::string in_header = write(file_bytes(json, kData12).substr(0, 20));
  EXPECT_EQ(error_of([&] { load_safetensors(in_header); }),
            in_header + ": header length " + std::to_string(json.size()) +
                " at byte 0 runs past the end of the file (20 bytes): truncated file?");
  const std::string tiny = write(std::string("\x10\x00\x00", 3), "tiny.st");
  EXPECT_EQ(error_of([&] { load_safetensors(tiny); }),
            tiny + ": truncated safetensors file: 3 bytes, shorter than the 8-byte header length at byte 0");
  const std::string empty = write("", "empty.st");
  EXPECT_NE(error_of([&] { load_safetensors(empty); }).find("0 bytes, shorter than the 8-byte header length"),
            std::string::npos);
}

TEST_F(Safetensors, HeaderLengthsBeyondTheFileOrTheLimitAreRefused) {
  const std::string longer = write(le64(1000) + "{}");
  EXPECT_EQ(error_of([&] { load_safetensors(longer); }),
            longer + ": header length 1000 at byte 0 runs past the end of the file (10 bytes): truncated file?");
  const std::string huge = write(le64(uint64_t{1} << 40) + "{}");
  EXPECT_EQ(error_of([&] { load_safetensors(huge); }),
            huge +
                ": header length 1099511627776 at byte 0 is larger than the limit of 100000000 bytes "
                "(not a safetensors file?)");
  const std::string not_object = write(file_bytes("[1,2]", ""));
  EXPECT_EQ(error_of([&] { load_safetensors(not_object); }),
            not_object + ": the header at byte 8 does not start with '{' (not a safetensors file?)");
}

TEST_F(Safetensors, OverlapsGapsTrailingBytesAndOutOfRangeOffsetsAreRefused) {
  const auto expect = [&](const std::string& b_entry, const std::string& data, const std::string& what) {
    const std::string json = two_tensors(b_entry);
    const std::string p = write(file_bytes(json, data));
    const std::string what_is = error_of([&] { load_safetensors(p); });
    const std::string expected = p + ": " + expected_text(json, what);
    EXPECT_EQ(what_is.substr(0, expected.size()), expected);
  };
  expect(R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", kData12.substr(0, 8),
         "tensor 'b' at byte @4: data_offsets [4, 8] overlap tensor 'a' [0, 8]");
  expect(R"("b":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}})", kData12 + "abcd",
         "bytes @8..@11 (data_offsets 8..11) before tensor 'b' are not part of any tensor (the format allows no "
         "gaps)");
  expect(R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})", kData12 + "tail",
         "4 bytes at byte @12 after the last tensor 'b' are not part of any tensor (the data must end where the "
         "last tensor ends)");
  expect(R"("b":{"dtype":"F32","shape":[1],"data_offsets":[18446744073709551612,18446744073709551615]}})", kData12,
         "tensor 'b' at byte {D} + 18446744073709551612: data_offsets [18446744073709551612, 18446744073709551615] run "
         "past the end of the data");  // (message continues; the prefix is what matters)
}

TEST_F(Safetensors, DtypeOrShapeThatDoNotMatchTheByteCountAreRefused) {
  const std::string json = two_tensors(R"("b":{"dtype":"F32","shape":[2,2],"data_offsets":[8,12]}})");
  const std::string p = write(file_bytes(json, kData12));
  EXPECT_EQ(
      error_of([&] { load_safetensors(p); }),
      p + ": " +
          expected_text(
              json,
              "tensor 'b' at byte @8: dtype F32 and shape [2, 2] take 16 bytes, but data_offsets [8, 12] hold 4"));
  const std::string j2 = two_tensors(R"("b":{"dtype":"F64","shape":[1],"data_offsets":[8,12]}})");
  const std::string p2 = write(file_bytes(j2, kData12), "f64.st");
  EXPECT_NE(error_of([&] { load_safetensors(p2); }).find("dtype F64 and shape [1] take 8 bytes, but"),
            std::string::npos);
}

TEST_F(Safetensors, BadHeadersAreRefusedInOneLine) {
  const std::string p = path();
  const auto expect = [&](const std::string& json, const std::string& what) {
    EXPECT_EQ(error_of([&] { load_safetensors(write(file_bytes(json, kData12))); }),
              p + ": " + expected_text(json, what));
  };
  const std::string a_and = kJsonA.substr(0, kJsonA.size() - 1) + ",";
  const std::string b = R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]})";
  const std::string reads = " (mixprec reads F64, F32, BF16, F16, I64, U8)";
  expect(a_and + b + ",\"a\":" + kJsonA.substr(5), "tensor 'a' appears twice in the header (bytes 8..{H})");
  expect(R"({"a":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
         "tensor 'a': field 'dtype' appears twice in the header (bytes 8..{H})");
  expect(a_and + b + R"(,"__metadata__":{"k":"1","k":"2"}})",
         "__metadata__ key 'k' appears twice in the header (bytes 8..{H})");
  // Found by the fuzzer: nlohmann throws out_of_range, not parse_error, for a number beyond a double.
  expect(R"({"a":{"dtype":"F32","shape":[1e999],"data_offsets":[0,12]}})",
         "the header (bytes 8..{H}) is not valid JSON: number overflow parsing '1e999'");
  expect(R"({"a":{"dtype":"F32",})",
         "the header is not valid JSON at byte 28: syntax error while parsing object key - unexpected '}'; expected "
         "string literal");
  expect(two_tensors(R"("b":{"dtype":"F33","shape":[1],"data_offsets":[8,12]}})"),
         "tensor 'b' at byte @8: unknown dtype 'F33'" + reads);
  expect(two_tensors(R"("b":{"dtype":"F8_E4M3","shape":[4],"data_offsets":[8,12]}})"),
         "tensor 'b' at byte @8: dtype F8_E4M3 is not supported yet" + reads);
  expect(two_tensors(R"("b":{"dtype":"F8_E5M2","shape":[4],"data_offsets":[8,12]}})"),
         "tensor 'b' at byte @8: dtype F8_E5M2 is not supported yet" + reads);
  expect(two_tensors(R"("b":{"dtype":"F32","shape":[-1],"data_offsets":[8,12]}})"),
         "tensor 'b' at byte @8: shape entry 0 is not a non-negative integer");
  expect(two_tensors(R"("b":{"dtype":"F32","shape":[1.0],"data_offsets":[8,12]}})"),
         "tensor 'b' at byte @8: shape entry 0 is not a non-negative integer");
  expect(two_tensors(R"("b":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[8,12]}})"),
         "tensor 'b' at byte @8: shape entry 1 (4294967296) makes the element count overflow 64 bits");
  expect(two_tensors(R"("b":{"dtype":"F32","shape":[1],"data_offsets":[12,8]}})"),
         "tensor 'b' at byte @12: data_offsets [12, 8] end before they begin");
  expect(two_tensors(R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8]}})"),
         "tensor 'b' in the header (bytes 8..{H}): data_offsets is not [begin, end] with non-negative integers");
  expect(two_tensors(R"("b":{"dtype":"F32","data_offsets":[8,12]}})"),
         "tensor 'b' in the header (bytes 8..{H}): no \"shape\"");
  expect(two_tensors(R"("b":[1]})"), "tensor 'b' in the header (bytes 8..{H}): the entry is not an object");
  expect(a_and + b + R"(,"__metadata__":{"k":1}})", "__metadata__ 'k' in the header (bytes 8..{H}) is not a string");
  expect(a_and + b + R"(,"__metadata__":"v"})",
         "__metadata__ in the header (bytes 8..{H}) is not an object of strings");
  // A name with a line break and a quote is escaped: the message stays one line.
  expect(R"({"a\n'x":{"dtype":"F33","shape":[3],"data_offsets":[0,12]}})",
         "tensor 'a\\x0A\\x27x' at byte @0: unknown dtype 'F33'" + reads);
}

TEST_F(Safetensors, MissingFilesAndDirectoriesAreRefused) {
  const std::string missing = path("missing.st");
  EXPECT_EQ(error_of([&] { load_safetensors(missing); }),
            missing + ": cannot open safetensors file: No such file or directory");
  EXPECT_EQ(error_of([&] { load_safetensors(dir_.string()); }),
            dir_.string() + ": cannot open safetensors file: is a directory");
}

TEST_F(Safetensors, AFailedSaveLeavesThePreviousFileAndNoTemporary) {
  const StateDict good = {{"a", Tensor::from_vector(std::vector<float>{1.0f, 2.0f}, {2})}};
  save_safetensors(path(), good);
  const std::string before = read(path());
  const Tensor one = Tensor::ones({1});
  const std::string p = path();
  EXPECT_EQ(error_of([&] {
              save_safetensors(p, {{"a", one}, {"b", one}, {"a", one}});
            }),
            p + ": cannot save: tensor 'a' is named twice");
  EXPECT_EQ(error_of([&] {
              save_safetensors(p, {{"__metadata__", one}});
            }),
            p + ": cannot save a tensor named '__metadata__': the format keeps that name for the metadata");
  EXPECT_EQ(error_of([&] { save_safetensors(p, {{"a", Tensor()}}); }), p + ": cannot save tensor 'a': it is undefined");
  EXPECT_EQ(error_of([&] {
              save_safetensors(p, {{"bad\xFF", one}});
            }),
            p + ": cannot save: tensor name 'bad\xFF' is not valid UTF-8");
  EXPECT_EQ(error_of([&] {
              save_safetensors(p, {{"a", one}}, {{"k", "\xC3"}});
            }),
            p + ": cannot save: the value of metadata key '\xC3' is not valid UTF-8");
  EXPECT_EQ(read(p), before);
  EXPECT_EQ(listing(), std::vector<std::string>{"ck.st"});

  EXPECT_EQ(error_of([&] { save_safetensors(dir_.string(), good); }), dir_.string() + ": cannot write: is a directory");
  const std::string nowhere = (dir_ / "no" / "ck.st").string();
  EXPECT_EQ(error_of([&] { save_safetensors(nowhere, good); }),
            nowhere + ": cannot write: no directory " + (dir_ / "no").string());
}

TEST_F(Safetensors, SavingOverAnExistingFileReplacesIt) {
  save_safetensors(path(), {{"a", Tensor::from_vector(std::vector<float>{1.0f}, {1})}});
  save_safetensors(path(), {{"b", Tensor::from_vector(std::vector<float>{2.0f, 3.0f}, {2})}});
  const SafetensorsFile f = load_safetensors(path());
  ASSERT_EQ(f.tensors.size(), 1u);
  EXPECT_EQ(f.tensors[0].first, "b");
  EXPECT_EQ(f.tensors[0].second.to_vector(), (std::vector<float>{2.0f, 3.0f}));
  EXPECT_EQ(listing(), std::vector<std::string>{"ck.st"});
}

}  // namespace
}  // namespace mixprec::io
