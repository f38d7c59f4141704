// Data layer: idx (MNIST / Fashion-MNIST) files, raw or gzip, and a batch loader with a prefetch thread.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace mixprec::data {

// Debian's dataset-fashion-mnist installs here; the CLI's default --data.
constexpr const char* kDefaultDataDir = "/usr/share/datasets/fashion-mnist";

// idx element type codes (http://yann.lecun.com/exdb/mnist/); only kIdxUint8 is read.
constexpr uint8_t kIdxUint8 = 0x08;

// One idx file: dims as stored (big-endian on disk), elements in row-major order.
struct IdxArray {
  uint8_t type_code = kIdxUint8;
  std::vector<int64_t> dims;
  std::vector<uint8_t> data;
};

// Reads an idx file, gzip-compressed or raw (detected from the content, not the name).
// Throws mixprec::Error naming the file (and the byte offset, in the decompressed stream for
// gzip) on a missing file, bad magic, unsupported type, zero/absurd dims, truncation,
// trailing bytes or a corrupt gzip stream.
IdxArray read_idx(const std::string& path);

// Writes an unsigned-byte idx file (gzip if asked) via a temp file and rename, so a failed write
// leaves nothing behind. For tests and tools.
void write_idx(const std::string& path, const IdxArray& array, bool gzip);

// An image-classification set held as bytes: images are size x rows x cols, labels size.
struct Dataset {
  int64_t size = 0;
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> images;
  std::vector<uint8_t> labels;
  int num_classes = 10;
  std::string source;  // "<dir> (<split>)", for logs
};

// Loads {split}-images-idx3-ubyte[.gz] and {split}-labels-idx1-ubyte[.gz] from dir; split is
// "train" or "t10k". Checks ranks, that counts agree and that every label is < 10.
Dataset load_idx_dataset(const std::string& dir, const std::string& split);

// x -> (x/255 - mean) / std.
struct Normalize {
  float mean = 0.0f;
  float std = 1.0f;
};
// Training-set statistics of pixel/255, as the PyTorch examples use them.
constexpr Normalize kFashionMnistNorm{0.2860f, 0.3530f};
constexpr Normalize kMnistNorm{0.1307f, 0.3081f};

// Mean and (population) standard deviation of pixel/255 over the whole dataset.
Normalize compute_normalize(const Dataset& dataset);

// One batch on the host: x is n x rows x cols normalised floats, y the n labels.
struct HostBatch {
  int64_t n = 0;
  std::vector<float> x;
  std::vector<int64_t> y;
};

struct LoaderOptions {
  int64_t batch_size = 64;
  bool shuffle = true;
  bool drop_last = false;
  uint64_t seed = 0;  // epoch e shuffles with Generator(seed).split(e) (mixprec/random.h)
  Normalize norm{};   // identity unless given: the loader never guesses the data set
  int prefetch = 2;   // batches the producer may run ahead of the consumer
  // Optional, runs in the prefetch thread after normalisation (e.g. augmentation). An exception
  // it throws ends the epoch and is rethrown by next().
  std::function<void(HostBatch& batch, int64_t batch_index)> transform{};
};

// Produces the batches of one epoch in a background thread, at most `prefetch` ahead.
// One consumer thread calls begin_epoch/next/stop. The dataset must outlive the loader.
class BatchLoader {
 public:
  BatchLoader(const Dataset& dataset, LoaderOptions options);
  BatchLoader(Dataset&&, LoaderOptions) = delete;  // would dangle: the loader keeps a reference
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;
  ~BatchLoader();

  // Starts (or restarts, abandoning the current one) epoch `epoch` at batch `first_batch` (a
  // resumed run continues where its checkpoint stopped). The sample order is a function of
  // (seed, epoch) only, identical across standard libraries.
  void begin_epoch(int epoch, int64_t first_batch = 0);
  // Fills `batch` with the next batch; false at the end of the epoch. Rethrows an exception
  // raised in the producer thread. The previous contents of `batch` are recycled.
  bool next(HostBatch& batch);
  // Ends the current epoch early and joins the producer. Safe to call at any time.
  void stop();

  int64_t num_batches() const;
  int64_t num_samples() const { return dataset_.size; }
  const LoaderOptions& options() const { return options_; }

  // The sample order of an epoch (exposed for tests and for resuming mid-epoch).
  std::vector<int64_t> epoch_order(int epoch) const;

 private:
  void produce(std::vector<int64_t> order, int64_t first_batch);
  void fill_batch(HostBatch& batch, const int64_t* indices, int64_t n) const;

  const Dataset& dataset_;
  LoaderOptions options_;
  float lut_[256];  // normalised value of each byte: one lookup per pixel in the producer

  std::thread producer_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<HostBatch> queue_;   // ready batches, at most options_.prefetch
  std::vector<HostBatch> spare_;  // recycled buffers, so steady state allocates nothing
  std::exception_ptr error_;
  bool stop_ = false;
  bool done_ = true;  // producer has finished the epoch (or none was started)
  bool started_ = false;
};

}  // namespace mixprec::data
