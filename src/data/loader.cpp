// BatchLoader: reproducible shuffling and a bounded prefetch queue filled by one background thread.
#include <algorithm>
#include <cmath>
#include <utility>

#include "mixprec/data.h"
#include "mixprec/error.h"
#include "mixprec/random.h"

namespace mixprec::data {

BatchLoader::BatchLoader(const Dataset& dataset, LoaderOptions options)
    : dataset_(dataset), options_(std::move(options)) {
  MIXPREC_CHECK(options_.batch_size >= 1, "BatchLoader: batch_size must be >= 1, got ", options_.batch_size);
  MIXPREC_CHECK(options_.prefetch >= 1, "BatchLoader: prefetch must be >= 1, got ", options_.prefetch);
  MIXPREC_CHECK(std::isfinite(options_.norm.mean) && std::isfinite(options_.norm.std) && options_.norm.std > 0,
                "BatchLoader: normalisation needs a finite mean and std > 0, got mean ", options_.norm.mean, " std ",
                options_.norm.std);
  const Dataset& d = dataset_;
  MIXPREC_CHECK(d.size >= 0 && d.rows >= 0 && d.cols >= 0 &&
                    d.images.size() == static_cast<size_t>(d.size * d.rows * d.cols) &&
                    d.labels.size() == static_cast<size_t>(d.size),
                "BatchLoader: dataset ", d.source, " is inconsistent: size ", d.size, " x ", d.rows, " x ", d.cols,
                " but ", d.images.size(), " image bytes and ", d.labels.size(), " labels");
  for (int v = 0; v < 256; ++v) lut_[v] = static_cast<float>((v / 255.0 - options_.norm.mean) / options_.norm.std);
}

BatchLoader::~BatchLoader() { stop(); }

int64_t BatchLoader::num_batches() const {
  const int64_t b = options_.batch_size;
  return options_.drop_last ? dataset_.size / b : (dataset_.size + b - 1) / b;
}

std::vector<int64_t> BatchLoader::epoch_order(int epoch) const {
  std::vector<int64_t> order(static_cast<size_t>(dataset_.size));
  for (int64_t i = 0; i < dataset_.size; ++i) order[i] = i;
  if (!options_.shuffle) return order;
  // One independent stream per epoch, and our own integer draw (not the standard library's
  // distributions, whose algorithms vary between implementations).
  Generator rng = Generator(options_.seed).split(static_cast<uint64_t>(epoch));
  for (int64_t i = dataset_.size - 1; i > 0; --i) {  // Fisher-Yates
    const auto j = static_cast<int64_t>(rng.uniform_below(static_cast<uint64_t>(i) + 1));
    std::swap(order[i], order[j]);
  }
  return order;
}

void BatchLoader::stop() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  if (producer_.joinable()) producer_.join();
  std::lock_guard lock(mutex_);
  for (auto& b : queue_) spare_.push_back(std::move(b));
  queue_.clear();
  error_ = nullptr;
  done_ = true;
}

void BatchLoader::begin_epoch(int epoch, int64_t first_batch) {
  MIXPREC_CHECK(first_batch >= 0 && first_batch <= num_batches(), "BatchLoader::begin_epoch: first batch ", first_batch,
                " of an epoch of ", num_batches());
  stop();
  std::vector<int64_t> order = epoch_order(epoch);
  {
    std::lock_guard lock(mutex_);
    stop_ = false;
    done_ = false;
    started_ = true;
  }
  producer_ =
      std::thread([this, order = std::move(order), first_batch]() mutable { produce(std::move(order), first_batch); });
}

void BatchLoader::fill_batch(HostBatch& batch, const int64_t* indices, int64_t n) const {
  const int64_t pixels = dataset_.rows * dataset_.cols;
  batch.n = n;
  batch.x.set_pinned(options_.pin_memory);
  batch.y.set_pinned(options_.pin_memory);
  batch.x.resize(static_cast<size_t>(n * pixels));
  batch.y.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* src = dataset_.images.data() + indices[i] * pixels;
    float* dst = batch.x.data() + i * pixels;
    for (int64_t p = 0; p < pixels; ++p) dst[p] = lut_[src[p]];
    batch.y[i] = dataset_.labels[indices[i]];
  }
}

void BatchLoader::produce(std::vector<int64_t> order, int64_t first_batch) {
  try {
    const int64_t batches = num_batches();
    for (int64_t b = first_batch; b < batches; ++b) {
      HostBatch batch;
      {
        std::lock_guard lock(mutex_);
        if (stop_) break;
        if (!spare_.empty()) {
          batch = std::move(spare_.back());
          spare_.pop_back();
        }
      }
      batch.fence.wait();  // a copy from a recycled batch may still be running
      const int64_t first = b * options_.batch_size;
      fill_batch(batch, order.data() + first, std::min(options_.batch_size, dataset_.size - first));
      if (options_.transform) options_.transform(batch, b);

      std::unique_lock lock(mutex_);
      cv_.wait(lock, [&] { return stop_ || queue_.size() < static_cast<size_t>(options_.prefetch); });
      if (stop_) break;
      queue_.push_back(std::move(batch));
      lock.unlock();
      cv_.notify_all();
    }
  } catch (...) {
    std::lock_guard lock(mutex_);
    error_ = std::current_exception();
  }
  {
    std::lock_guard lock(mutex_);
    done_ = true;
  }
  cv_.notify_all();
}

bool BatchLoader::next(HostBatch& batch) {
  MIXPREC_CHECK(started_, "BatchLoader::next called before begin_epoch");
  std::unique_lock lock(mutex_);
  cv_.wait(lock, [&] { return !queue_.empty() || done_; });
  if (!queue_.empty()) {
    std::swap(batch, queue_.front());
    // Keep the caller's old buffers for the producer; bounded so memory stays prefetch-sized.
    if (spare_.size() <= static_cast<size_t>(options_.prefetch) && queue_.front().x.capacity() > 0)
      spare_.push_back(std::move(queue_.front()));
    queue_.pop_front();
    lock.unlock();
    cv_.notify_all();
    return true;
  }
  std::exception_ptr error = std::exchange(error_, nullptr);
  lock.unlock();
  if (producer_.joinable()) producer_.join();  // done_ is set: the producer is exiting
  if (error) std::rethrow_exception(error);
  return false;
}

}  // namespace mixprec::data
