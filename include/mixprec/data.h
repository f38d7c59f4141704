// Data layer: idx (MNIST / Fashion-MNIST) files, raw or gzip, and a batch loader with a prefetch thread.
#pragma once
#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "mixprec/device.h"
#include "mixprec/tensor.h"

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

}  // namespace mixprec::data

namespace mixprec::detail {
// A batch array's memory: page-locked (cudaHostAlloc) when `pinned` is asked and a GPU can be had,
// pageable otherwise; `got_pinned` says which. The pinned blocks come from one narrow place
// (src/data/host_memory.cpp) so the caching allocator's pinned pool can serve them later.
void* host_alloc(size_t bytes, bool pinned, bool& got_pinned);
void host_free(void* p, bool pinned);
}  // namespace mixprec::detail

namespace mixprec::data {

// A resizable array of a batch on the host (trivially copyable elements), in pinned memory when
// asked for (set_pinned): a GPU copies pinned memory by DMA, without the host waiting. Move-only;
// a moved-from array is empty.
template <class T>
class HostArray {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  HostArray() = default;
  HostArray(HostArray&& o) noexcept { swap(o); }
  HostArray& operator=(HostArray&& o) noexcept {
    HostArray(std::move(o)).swap(*this);
    return *this;
  }
  HostArray(const HostArray&) = delete;
  HostArray& operator=(const HostArray&) = delete;
  ~HostArray() {
    if (data_) mixprec::detail::host_free(data_, pinned_);
  }

  // Keeps the first min(size, n) elements; new ones are uninitialised.
  void resize(size_t n) {
    if (n > capacity_ || (want_pinned_ && !pinned_ && n > 0 && !pin_failed_)) reallocate(std::max(n, capacity_));
    size_ = n;
  }
  // Later allocations are pinned (where a GPU can be had) or pageable.
  void set_pinned(bool on) { want_pinned_ = on; }
  bool pinned() const { return pinned_; }  // the current block is page-locked

  size_t size() const { return size_; }
  size_t capacity() const { return capacity_; }
  bool empty() const { return size_ == 0; }
  T* data() { return data_; }
  const T* data() const { return data_; }
  T& operator[](size_t i) { return data_[i]; }
  const T& operator[](size_t i) const { return data_[i]; }
  T* begin() { return data_; }
  T* end() { return data_ + size_; }
  const T* begin() const { return data_; }
  const T* end() const { return data_ + size_; }
  std::vector<T> to_vector() const { return std::vector<T>(begin(), end()); }

 private:
  void swap(HostArray& o) noexcept {
    std::swap(data_, o.data_), std::swap(size_, o.size_), std::swap(capacity_, o.capacity_);
    std::swap(pinned_, o.pinned_), std::swap(want_pinned_, o.want_pinned_), std::swap(pin_failed_, o.pin_failed_);
  }
  void reallocate(size_t capacity) {
    bool got = false;
    T* fresh = static_cast<T*>(mixprec::detail::host_alloc(capacity * sizeof(T), want_pinned_, got));
    if (size_ > 0) std::memcpy(fresh, data_, size_ * sizeof(T));
    if (data_) mixprec::detail::host_free(data_, pinned_);
    data_ = fresh, capacity_ = capacity, pinned_ = got;
    pin_failed_ = want_pinned_ && !got;  // no GPU: do not retry at every resize
  }
  T* data_ = nullptr;
  size_t size_ = 0, capacity_ = 0;
  bool pinned_ = false, want_pinned_ = false, pin_failed_ = false;
};

// The copies from a batch's arrays still in flight on a GPU's stream: whoever refills the arrays
// waits for them first (the loader does, in its thread). Nothing to wait for off CUDA.
class CopyFence {
 public:
  CopyFence() = default;
  CopyFence(CopyFence&& o) noexcept
      : event_(std::exchange(o.event_, nullptr)), pending_(std::exchange(o.pending_, false)) {}
  CopyFence& operator=(CopyFence&& o) noexcept {
    std::swap(event_, o.event_), std::swap(pending_, o.pending_);
    return *this;
  }
  CopyFence(const CopyFence&) = delete;
  CopyFence& operator=(const CopyFence&) = delete;
  ~CopyFence();
  void record(const Device& device);  // after the copies were queued on device's stream
  void wait();                        // returns once they are done
  bool pending() const { return pending_; }

 private:
  void* event_ = nullptr;  // cudaEvent_t, made on first use
  bool pending_ = false;
};

// One batch on the host: x is n x rows x cols normalised floats, y the n labels.
struct HostBatch {
  int64_t n = 0;
  HostArray<float> x;
  HostArray<int64_t> y;
  CopyFence fence;  // destroyed first: the arrays outlive any copy from them
};

// A batch as tensors on a device: x [n, 1, rows, cols] (f32, or the 16-bit type asked for) and y [n] i64.
struct DeviceBatch {
  Tensor x, y;
};
// Copies `batch` to `device` (in the data memory category), x in x_dtype (f32, bf16 or f16, rounded
// to nearest even as a cast is: a model whose first layer casts its input to that type under
// autocast computes the same, from half the bytes). On a GPU the copy is queued on the device's
// stream, after the work queued before it, and from pinned arrays returns at once; the batch's fence
// records it (a 16-bit x is converted there after an f32 copy). On the CPU and the fenced device it is
// a plain copy, converted as it goes.
DeviceBatch to_device(HostBatch& batch, int64_t rows, int64_t cols, const Device& device, DType x_dtype = DType::f32);

struct LoaderOptions {
  int64_t batch_size = 64;
  bool shuffle = true;
  bool drop_last = false;
  uint64_t seed = 0;  // epoch e shuffles with Generator(seed).split(e) (mixprec/random.h)
  Normalize norm{};   // identity unless given: the loader never guesses the data set
  int prefetch = 2;   // batches the producer may run ahead of the consumer
  // Batches in page-locked memory (PyTorch's pin_memory), for asynchronous copies to a GPU;
  // pageable where no GPU can be had.
  bool pin_memory = false;
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
