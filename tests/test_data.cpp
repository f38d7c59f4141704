// Tests for the data layer: idx reading/writing and every error it reports, dataset loading, BatchLoader.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <initializer_list>
#include <numeric>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "mixprec/data.h"
#include "mixprec/error.h"

namespace mixprec::data {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;

// A fresh directory per test, removed afterwards.
class DataTest : public ::testing::Test {
 public:
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

 protected:
  void SetUp() override {
    static std::atomic<int> counter{0};
    dir_ = fs::temp_directory_path() /
           ("mixprec_test_data_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  fs::path dir_;
};

// The bytes of an idx file: magic (0, 0, type, ndims), big-endian dims, then payload as given.
Bytes idx_bytes(uint8_t type, std::initializer_list<uint32_t> dims, const Bytes& payload, int ndims = -1) {
  Bytes b = {0, 0, type, static_cast<uint8_t>(ndims >= 0 ? ndims : static_cast<int>(dims.size()))};
  for (uint32_t d : dims)
    for (int shift = 24; shift >= 0; shift -= 8) b.push_back(static_cast<uint8_t>(d >> shift));
  b.insert(b.end(), payload.begin(), payload.end());
  return b;
}

Bytes iota_bytes(size_t n, int start = 0) {
  Bytes b(n);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<uint8_t>(start + static_cast<int>(i) * 7);
  return b;
}

void write_bytes(const std::string& path, const Bytes& bytes, bool gzip) {
  if (!gzip) {
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    return;
  }
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  if (!bytes.empty()) {
    ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
  }
  ASSERT_EQ(gzclose(f), Z_OK);
}

Bytes read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), {});
}

// Runs fn, expecting a one-line mixprec::Error containing every one of `parts`; returns it.
std::string expect_error(const std::function<void()>& fn, std::initializer_list<std::string> parts) {
  try {
    fn();
  } catch (const mixprec::Error& e) {
    const std::string msg = e.what();
    for (const std::string& part : parts)
      EXPECT_NE(msg.find(part), std::string::npos) << "missing \"" << part << "\" in: " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    return msg;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected mixprec::Error, got: " << e.what();
    return {};
  }
  ADD_FAILURE() << "expected mixprec::Error, nothing thrown";
  return {};
}

// ---- idx reading ----

TEST_F(DataTest, RoundTripRawAndGzip) {
  for (bool gzip : {false, true}) {
    IdxArray a;
    a.dims = {3, 4, 5};
    a.data = iota_bytes(60);
    const std::string p = path(gzip ? "a.gz" : "a");
    write_idx(p, a, gzip);
    EXPECT_FALSE(fs::exists(p + ".tmp"));
    const Bytes on_disk = read_bytes(p);
    EXPECT_EQ(on_disk.size() == 76, !gzip);  // 16-byte header + 60 bytes
    if (gzip) {
      EXPECT_EQ(on_disk[0], 0x1F);
    }
    const IdxArray b = read_idx(p);
    EXPECT_EQ(b.type_code, 0x08);
    EXPECT_EQ(b.dims, a.dims);
    EXPECT_EQ(b.data, a.data);
  }
  IdxArray one;
  one.dims = {7};
  one.data = iota_bytes(7);
  write_idx(path("one"), one, false);
  EXPECT_EQ(read_idx(path("one")).dims, std::vector<int64_t>{7});
}

TEST_F(DataTest, FormatComesFromContentNotName) {
  write_bytes(path("raw.gz"), idx_bytes(0x08, {2}, {5, 6}), false);
  write_bytes(path("packed"), idx_bytes(0x08, {2}, {5, 6}), true);
  EXPECT_EQ(read_idx(path("raw.gz")).data, (Bytes{5, 6}));
  EXPECT_EQ(read_idx(path("packed")).data, (Bytes{5, 6}));
}

TEST_F(DataTest, WriteIdxValidates) {
  IdxArray bad;
  bad.dims = {2, 2};
  bad.data = {1, 2, 3};
  expect_error([&] { write_idx(path("w"), bad, false); }, {path("w"), "4 elements", "3"});
  EXPECT_FALSE(fs::exists(path("w")));
}

TEST_F(DataTest, MissingFile) {
  expect_error([&] { read_idx(path("nope-idx3-ubyte.gz")); }, {path("nope-idx3-ubyte.gz"), "no such file"});
  expect_error([&] { read_idx(dir_.string()); }, {dir_.string(), "directory"});
}

TEST_F(DataTest, TruncatedHeader) {
  for (bool gzip : {false, true}) {
    const std::string where = gzip ? " of the decompressed stream" : "";
    write_bytes(path("h2"), {0, 0}, gzip);
    expect_error([&] { read_idx(path("h2")); }, {path("h2"), "truncated idx header", "file ends at byte 2" + where});
    Bytes partial = idx_bytes(0x08, {10, 28, 28}, {});
    partial.resize(10);
    write_bytes(path("h10"), partial, gzip);
    expect_error([&] { read_idx(path("h10")); },
                 {path("h10"), "truncated idx header: expected 16 bytes", "file ends at byte 10" + where});
  }
  write_bytes(path("empty"), {}, false);
  expect_error([&] { read_idx(path("empty")); }, {path("empty"), "file ends at byte 0"});
}

TEST_F(DataTest, TruncatedData) {
  const Bytes short_file = idx_bytes(0x08, {3, 4, 5}, iota_bytes(40));
  write_bytes(path("raw"), short_file, false);
  const std::string raw_msg = expect_error([&] { read_idx(path("raw")); }, {});
  EXPECT_EQ(raw_msg, path("raw") +
                         ": truncated: expected 60 bytes of data after the 16-byte header, "
                         "file ends at byte 56");
  write_bytes(path("gz"), short_file, true);
  const std::string gz_msg = expect_error([&] { read_idx(path("gz")); }, {});
  EXPECT_EQ(gz_msg, path("gz") +
                        ": truncated: expected 60 bytes of data after the 16-byte header, "
                        "file ends at byte 56 of the decompressed stream");
}

TEST_F(DataTest, GzipFileCutShort) {
  write_bytes(path("full.gz"), idx_bytes(0x08, {100, 10, 10}, iota_bytes(10000)), true);
  const Bytes gz = read_bytes(path("full.gz"));
  // Cut in the deflate data, then cut only the 8-byte trailer (CRC + size) off.
  write_bytes(path("cut.gz"), Bytes(gz.begin(), gz.begin() + static_cast<long>(gz.size() / 2)), false);
  expect_error([&] { read_idx(path("cut.gz")); },
               {path("cut.gz"), "truncated", "of the decompressed stream", "cut short"});
  write_bytes(path("notrailer.gz"), Bytes(gz.begin(), gz.end() - 8), false);
  expect_error([&] { read_idx(path("notrailer.gz")); }, {path("notrailer.gz"), "truncated", "trailer"});
}

TEST_F(DataTest, BadMagic) {
  write_bytes(path("train-images-idx3-ubyte.gz"), {0x12, 0x34, 0x56, 0x78, 0, 0, 0, 1, 9}, true);
  const std::string msg = expect_error([&] { read_idx(path("train-images-idx3-ubyte.gz")); }, {});
  EXPECT_EQ(
      msg.rfind(path("train-images-idx3-ubyte.gz") + ": bad idx magic 0x12345678 at byte 0 (expected 0x0000080N", 0),
      0u)
      << msg;
}

TEST_F(DataTest, WrongTypeCode) {
  write_bytes(path("float"), idx_bytes(0x0D, {2}, Bytes(8)), false);
  expect_error([&] { read_idx(path("float")); }, {path("float"), "0x0D", "float32", "byte 2", "not supported"});
  write_bytes(path("weird"), idx_bytes(0x07, {2}, Bytes(2)), false);
  expect_error([&] { read_idx(path("weird")); },
               {path("weird"), "bad idx magic 0x00000701", "unknown element type 0x07"});
}

TEST_F(DataTest, BadDimensionCount) {
  write_bytes(path("nd0"), idx_bytes(0x08, {}, {1, 2, 3}), false);
  expect_error([&] { read_idx(path("nd0")); }, {path("nd0"), "bad idx magic 0x00000800", "0 dimensions at byte 3"});
  write_bytes(path("nd5"), idx_bytes(0x08, {1, 1, 1, 1, 1}, {1}), false);
  expect_error([&] { read_idx(path("nd5")); }, {path("nd5"), "5 dimensions", "expected 1..4"});
}

TEST_F(DataTest, ZeroOrAbsurdDimension) {
  write_bytes(path("dim0"), idx_bytes(0x08, {3, 0, 4}, {}), false);
  expect_error([&] { read_idx(path("dim0")); }, {path("dim0"), "dimension 1 is 0 at byte 8"});
  write_bytes(path("huge"), idx_bytes(0x08, {65536, 65536}, {1, 2, 3}), false);
  expect_error([&] { read_idx(path("huge")); }, {path("huge"), "more than 2^31 elements"});
  write_bytes(path("max"), idx_bytes(0x08, {0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF}, {}), false);
  expect_error([&] { read_idx(path("max")); }, {path("max"), "more than 2^31 elements"});
}

TEST_F(DataTest, TrailingBytes) {
  Bytes b = idx_bytes(0x08, {3, 4, 5}, iota_bytes(63));  // 3 bytes too many
  write_bytes(path("raw"), b, false);
  expect_error([&] { read_idx(path("raw")); }, {path("raw"), "3 trailing bytes", "at byte 76"});
  write_bytes(path("gz"), b, true);
  expect_error([&] { read_idx(path("gz")); },
               {path("gz"), "3 trailing bytes", "at byte 76 of the decompressed stream"});
}

TEST_F(DataTest, CorruptGzipIsAnErrorNeverACrash) {
  // Image-like data: runs and gradients compress with dynamic Huffman blocks, as real idx.gz do.
  Bytes payload(64 * 64 * 8);
  for (size_t i = 0; i < payload.size(); ++i)
    payload[i] = static_cast<uint8_t>((i % 64) < 20 ? 0 : (i * 37 + i / 64) % 256);
  write_bytes(path("good.gz"), idx_bytes(0x08, {8, 64, 64}, payload), true);
  const Bytes gz = read_bytes(path("good.gz"));
  ASSERT_GT(gz.size(), 200u);
  int corrupt_messages = 0;
  for (size_t pos = 20; pos + 20 < gz.size(); pos += gz.size() / 23) {
    Bytes bad = gz;
    for (size_t k = 0; k < 4; ++k) bad[pos + k] ^= 0x5A;
    const std::string p = path("bad" + std::to_string(pos) + ".gz");
    write_bytes(p, bad, false);
    const std::string msg = expect_error([&] { read_idx(p); }, {p});
    if (msg.find("corrupt gzip stream") != std::string::npos) {
      ++corrupt_messages;
      EXPECT_NE(msg.find(" of the file, byte "), std::string::npos) << msg;
      EXPECT_NE(msg.find(" of the decompressed stream"), std::string::npos) << msg;
    }
  }
  EXPECT_GT(corrupt_messages, 10);
}

TEST_F(DataTest, ConcatenatedGzipMembersButNoJunk) {
  // gzip -d accepts concatenated members, so we do too; anything else after the stream is damage.
  const Bytes whole = idx_bytes(0x08, {2, 3}, iota_bytes(6));
  write_bytes(path("a.gz"), Bytes(whole.begin(), whole.begin() + 9), true);
  write_bytes(path("b.gz"), Bytes(whole.begin() + 9, whole.end()), true);
  Bytes two = read_bytes(path("a.gz"));
  const Bytes b = read_bytes(path("b.gz"));
  two.insert(two.end(), b.begin(), b.end());
  write_bytes(path("two.gz"), two, false);
  EXPECT_EQ(read_idx(path("two.gz")).data, iota_bytes(6));
  write_bytes(path("whole.gz"), whole, true);
  Bytes junk = read_bytes(path("whole.gz"));
  const size_t gz_bytes = junk.size();
  junk.insert(junk.end(), {'j', 'u', 'n', 'k'});
  write_bytes(path("junk.gz"), junk, false);
  expect_error([&] { read_idx(path("junk.gz")); }, {path("junk.gz"), "non-gzip bytes after the end of the gzip stream",
                                                    "at byte " + std::to_string(gz_bytes) + " of the file"});
}

// ---- datasets ----

void write_pair(const DataTest& t, const std::string& split, const Bytes& images, const Bytes& labels, bool gzip) {
  const std::string ext = gzip ? ".gz" : "";
  write_bytes(t.path(split + "-images-idx3-ubyte" + ext), images, gzip);
  write_bytes(t.path(split + "-labels-idx1-ubyte" + ext), labels, gzip);
}

class DatasetTest : public DataTest {};

TEST_F(DatasetTest, LoadsRawAndGzip) {
  write_pair(*this, "train", idx_bytes(0x08, {5, 4, 3}, iota_bytes(60)), idx_bytes(0x08, {5}, {0, 9, 3, 3, 1}), true);
  write_pair(*this, "t10k", idx_bytes(0x08, {2, 4, 3}, iota_bytes(24)), idx_bytes(0x08, {2}, {7, 8}), false);
  const Dataset train = load_idx_dataset(dir_.string(), "train");
  EXPECT_EQ(train.size, 5);
  EXPECT_EQ(train.rows, 4);
  EXPECT_EQ(train.cols, 3);
  EXPECT_EQ(train.images, iota_bytes(60));
  EXPECT_EQ(train.labels, (Bytes{0, 9, 3, 3, 1}));
  EXPECT_EQ(train.num_classes, 10);
  EXPECT_NE(train.source.find(dir_.string()), std::string::npos);
  const Dataset test = load_idx_dataset(dir_.string(), "t10k");
  EXPECT_EQ(test.size, 2);
  EXPECT_EQ(test.labels, (Bytes{7, 8}));
}

TEST_F(DatasetTest, LabelOutOfRange) {
  write_pair(*this, "train", idx_bytes(0x08, {5, 2, 2}, iota_bytes(20)), idx_bytes(0x08, {5}, {0, 1, 2, 10, 4}), false);
  expect_error([&] { load_idx_dataset(dir_.string(), "train"); },
               {path("train-labels-idx1-ubyte"), "label 10 at index 3", "0..9"});
}

TEST_F(DatasetTest, CountMismatchAndRanks) {
  write_pair(*this, "train", idx_bytes(0x08, {5, 2, 2}, iota_bytes(20)), idx_bytes(0x08, {4}, {0, 1, 2, 3}), false);
  expect_error([&] { load_idx_dataset(dir_.string(), "train"); },
               {path("train-images-idx3-ubyte"), "5 images", path("train-labels-idx1-ubyte"), "4 labels"});
  write_pair(*this, "t10k", idx_bytes(0x08, {5, 4}, iota_bytes(20)), idx_bytes(0x08, {5}, Bytes(5)), false);
  expect_error([&] { load_idx_dataset(dir_.string(), "t10k"); }, {path("t10k-images-idx3-ubyte"), "expected 3 dims"});
}

TEST_F(DatasetTest, MissingDirAndFiles) {
  const std::string missing = path("no-such-dir");
  expect_error([&] { load_idx_dataset(missing, "train"); }, {"no idx data in " + missing, "no such directory"});
  expect_error([&] { load_idx_dataset(dir_.string(), "train"); },
               {"no idx data in " + dir_.string(), "train-images-idx3-ubyte[.gz]"});
  write_bytes(path("train-labels-idx1-ubyte.gz"), idx_bytes(0x08, {1}, {0}), true);
  expect_error([&] { load_idx_dataset(dir_.string(), "train"); }, {"train-images-idx3-ubyte[.gz]", "but no"});
  expect_error([&] { load_idx_dataset(dir_.string(), "test"); }, {"\"train\" or \"t10k\"", "\"test\""});
}

TEST(DefaultDataDir, MessageNamesTheDebianPackage) {
  if (fs::exists(kDefaultDataDir)) GTEST_SKIP() << kDefaultDataDir << " is installed";
  const std::string msg = expect_error([] { load_idx_dataset(kDefaultDataDir, "train"); }, {});
  EXPECT_EQ(msg,
            "no Fashion-MNIST data in /usr/share/datasets/fashion-mnist: install it with "
            "`apt-get install dataset-fashion-mnist`, or pass --data DIR with MNIST-format idx files");
}

TEST(FashionMnist, RealDataLoadsWithKnownStatistics) {
  if (!fs::exists(kDefaultDataDir)) GTEST_SKIP() << kDefaultDataDir << " not installed";
  const Dataset train = load_idx_dataset(kDefaultDataDir, "train");
  const Dataset test = load_idx_dataset(kDefaultDataDir, "t10k");
  EXPECT_EQ(train.size, 60000);
  EXPECT_EQ(test.size, 10000);
  EXPECT_EQ(train.rows, 28);
  EXPECT_EQ(train.cols, 28);
  EXPECT_EQ(test.rows, 28);
  std::vector<int> per_class(10);
  for (uint8_t l : train.labels) ++per_class[l];
  for (int c : per_class) EXPECT_EQ(c, 6000);  // Fashion-MNIST is balanced
  const Normalize n = compute_normalize(train);
  EXPECT_NEAR(n.mean, kFashionMnistNorm.mean, 5e-4);
  EXPECT_NEAR(n.std, kFashionMnistNorm.std, 5e-4);
}

// ---- normalisation and loader ----

// size samples of rows x cols; sample i's first two pixels encode i, its label is i % 10.
Dataset synthetic(int64_t size, int64_t rows = 2, int64_t cols = 3) {
  Dataset d;
  d.size = size;
  d.rows = rows;
  d.cols = cols;
  d.images.assign(static_cast<size_t>(size * rows * cols), 200);
  d.labels.resize(static_cast<size_t>(size));
  for (int64_t i = 0; i < size; ++i) {
    d.images[i * rows * cols] = static_cast<uint8_t>(i % 256);
    d.images[i * rows * cols + 1] = static_cast<uint8_t>(i / 256);
    d.labels[i] = static_cast<uint8_t>(i % 10);
  }
  d.source = "synthetic";
  return d;
}

// The sample indices of one epoch, read back from the pixels (needs the identity normalisation).
std::vector<int64_t> run_epoch(BatchLoader& loader, int epoch, std::vector<int64_t>* batch_sizes = nullptr) {
  std::vector<int64_t> seen;
  loader.begin_epoch(epoch);
  HostBatch b;
  while (loader.next(b)) {
    if (batch_sizes) batch_sizes->push_back(b.n);
    EXPECT_EQ(static_cast<int64_t>(b.y.size()), b.n);
    const int64_t per = static_cast<int64_t>(b.x.size()) / b.n;
    for (int64_t i = 0; i < b.n; ++i) {
      const auto lo = std::lround(b.x[i * per] * 255), hi = std::lround(b.x[i * per + 1] * 255);
      const int64_t idx = lo + 256 * hi;
      seen.push_back(idx);
      EXPECT_EQ(b.y[i], idx % 10);
    }
  }
  return seen;
}

TEST(Normalize, ComputesMeanAndStd) {
  Dataset d = synthetic(4, 1, 2);
  d.images = {0, 255, 0, 255, 0, 255, 0, 255};
  const Normalize n = compute_normalize(d);
  EXPECT_NEAR(n.mean, 0.5, 1e-6);
  EXPECT_NEAR(n.std, 0.5, 1e-6);
}

TEST(Loader, NormalisesPixels) {
  Dataset d = synthetic(1, 1, 4);
  d.images = {0, 51, 128, 255};
  BatchLoader loader(d, {.batch_size = 1, .shuffle = false, .norm = kFashionMnistNorm});
  loader.begin_epoch(0);
  HostBatch b;
  ASSERT_TRUE(loader.next(b));
  ASSERT_EQ(b.x.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(b.x[i], (d.images[i] / 255.0f - 0.2860f) / 0.3530f, 1e-5) << i;
  EXPECT_FALSE(loader.next(b));
}

TEST(Loader, EverySampleOncePerEpochWithPartialLastBatch) {
  const Dataset d = synthetic(103);
  BatchLoader loader(d, {.batch_size = 10, .shuffle = true, .seed = 42});
  EXPECT_EQ(loader.num_batches(), 11);
  for (int epoch = 0; epoch < 3; ++epoch) {
    std::vector<int64_t> sizes;
    std::vector<int64_t> seen = run_epoch(loader, epoch, &sizes);
    EXPECT_EQ(seen, loader.epoch_order(epoch));
    std::sort(seen.begin(), seen.end());
    std::vector<int64_t> all(103);
    std::iota(all.begin(), all.end(), 0);
    EXPECT_EQ(seen, all);
    ASSERT_EQ(sizes.size(), 11u);
    EXPECT_EQ(sizes.back(), 3);
    EXPECT_EQ(sizes.front(), 10);
  }
}

// A resumed run starts an epoch at the batch its checkpoint stopped at: the same batches, in the
// same order, as the rest of the uninterrupted epoch.
TEST(Loader, BeginEpochAtABatchContinuesTheSameOrder) {
  const Dataset d = synthetic(103);
  BatchLoader loader(d, {.batch_size = 10, .shuffle = true, .seed = 7});
  const std::vector<int64_t> order = loader.epoch_order(2);
  for (int64_t first : {0, 4, 10, 11}) {
    loader.begin_epoch(2, first);
    std::vector<int64_t> seen;
    HostBatch b;
    while (loader.next(b))
      for (int64_t i = 0; i < b.n; ++i)
        seen.push_back(std::lround(b.x[i * 6] * 255) + 256 * std::lround(b.x[i * 6 + 1] * 255));
    EXPECT_EQ(seen, std::vector<int64_t>(order.begin() + std::min<int64_t>(first * 10, 103), order.end())) << first;
  }
  expect_error([&] { loader.begin_epoch(0, 12); }, {"first batch 12 of an epoch of 11"});
}

TEST(Loader, DropLast) {
  const Dataset d = synthetic(103);
  BatchLoader loader(d, {.batch_size = 10, .shuffle = true, .drop_last = true, .seed = 1});
  EXPECT_EQ(loader.num_batches(), 10);
  std::vector<int64_t> sizes;
  const std::vector<int64_t> seen = run_epoch(loader, 0, &sizes);
  EXPECT_EQ(seen.size(), 100u);
  EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()).size(), 100u);
  EXPECT_EQ(sizes, std::vector<int64_t>(10, 10));
  const Dataset tiny = synthetic(5);
  BatchLoader none(tiny, {.batch_size = 10, .drop_last = true});
  EXPECT_EQ(none.num_batches(), 0);
  EXPECT_TRUE(run_epoch(none, 0).empty());
}

TEST(Loader, OrderIsAFunctionOfSeedAndEpoch) {
  const Dataset d = synthetic(200);
  BatchLoader a(d, {.batch_size = 16, .seed = 7}), b(d, {.batch_size = 16, .seed = 7});
  BatchLoader c(d, {.batch_size = 16, .seed = 8});
  const auto a0 = run_epoch(a, 0), a1 = run_epoch(a, 1);
  EXPECT_NE(a0, a1);
  EXPECT_EQ(run_epoch(b, 1), a1);  // b never ran epoch 0
  EXPECT_EQ(run_epoch(b, 0), a0);
  EXPECT_EQ(run_epoch(a, 0), a0);
  EXPECT_NE(run_epoch(c, 0), a0);
  // Golden values: Philox is fully specified and the Fisher-Yates is ours, so this order is the
  // same with every standard library (cross-checked with an independent Python Philox 4x32-10 of
  // Generator(1234).split(3)). A change here breaks the reproducibility of old runs.
  const Dataset ten = synthetic(10);
  BatchLoader g(ten, {.batch_size = 4, .seed = 1234});
  const std::vector<int64_t> order = g.epoch_order(3);
  EXPECT_EQ(order, (std::vector<int64_t>{5, 3, 8, 4, 1, 0, 9, 6, 2, 7}));
}

TEST(Loader, NoShuffleIsSequential) {
  const Dataset d = synthetic(25);
  BatchLoader loader(d, {.batch_size = 4, .shuffle = false});
  std::vector<int64_t> all(25);
  std::iota(all.begin(), all.end(), 0);
  EXPECT_EQ(run_epoch(loader, 0), all);
  EXPECT_EQ(run_epoch(loader, 5), all);
}

TEST(Loader, ValidatesOptions) {
  const Dataset d = synthetic(10);
  expect_error([&] { BatchLoader l(d, {.batch_size = 0}); }, {"batch_size must be >= 1", "0"});
  expect_error([&] { BatchLoader l(d, {.prefetch = 0}); }, {"prefetch"});
  expect_error([&] { BatchLoader l(d, {.norm = {0.5f, 0.0f}}); }, {"std > 0"});
  Dataset broken = d;
  broken.labels.pop_back();
  expect_error([&] { BatchLoader l(broken, {}); }, {"inconsistent", "synthetic"});
  BatchLoader l(d, {});
  HostBatch b;
  expect_error([&] { l.next(b); }, {"before begin_epoch"});
}

// Runs fn on a thread and fails the whole binary if it has not finished within 20 s: a deadlock
// must show up as a failure, not as a test run that never ends.
void within_deadline(const std::function<void()>& fn) {
  std::packaged_task<void()> task(fn);
  std::future<void> done = task.get_future();
  std::thread t(std::move(task));
  if (done.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
    std::fprintf(stderr, "FATAL: loader shutdown deadlocked\n");
    std::_Exit(1);
  }
  t.join();
  done.get();
}

TEST(Loader, StopsCleanlyMidEpoch) {
  const Dataset d = synthetic(2000, 28, 28);
  within_deadline([&] {
    for (int round = 0; round < 20; ++round) {
      BatchLoader loader(d, {.batch_size = 1, .seed = 3, .prefetch = 2});
      loader.begin_epoch(0);
      HostBatch b;
      for (int i = 0; i < round % 4; ++i) ASSERT_TRUE(loader.next(b));
      if (round % 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));  // let the queue fill
    }  // destroyed with the producer blocked on a full queue, or still filling
    BatchLoader loader(d, {.batch_size = 7});
    loader.begin_epoch(0);
    HostBatch b;
    ASSERT_TRUE(loader.next(b));
    loader.begin_epoch(1);  // abandon epoch 0 midway: epoch 1 must still be complete
    int64_t count = 0;
    while (loader.next(b)) count += b.n;
    EXPECT_EQ(count, 2000);
    loader.stop();
    loader.stop();
    EXPECT_FALSE(loader.next(b));
  });
}

TEST(Loader, StopsCleanlyWhenTheConsumerThrows) {
  const Dataset d = synthetic(500);
  within_deadline([&] {
    try {
      BatchLoader loader(d, {.batch_size = 2, .prefetch = 1});
      loader.begin_epoch(0);
      HostBatch b;
      loader.next(b);
      throw std::runtime_error("training step failed");
    } catch (const std::runtime_error&) {
    }
  });
}

TEST(Loader, ProducerExceptionReachesTheConsumer) {
  const Dataset d = synthetic(50);
  LoaderOptions opts{.batch_size = 5, .shuffle = false};
  opts.transform = [](HostBatch& batch, int64_t index) {
    if (index == 3) throw std::runtime_error("augmentation failed at batch 3");
    batch.x[0] += 0;  // transforms may edit the batch in place
  };
  BatchLoader loader(d, opts);
  within_deadline([&] {
    for (int epoch = 0; epoch < 2; ++epoch) {
      loader.begin_epoch(epoch);
      HostBatch b;
      for (int i = 0; i < 3; ++i) ASSERT_TRUE(loader.next(b));
      try {
        loader.next(b);
        ADD_FAILURE() << "no exception";
      } catch (const std::runtime_error& e) {
        EXPECT_STREQ(e.what(), "augmentation failed at batch 3");
      }
      EXPECT_FALSE(loader.next(b));
    }
  });
}

}  // namespace
}  // namespace mixprec::data
