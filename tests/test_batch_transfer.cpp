// Batches from the loader to a device: pinned arrays (where a GPU can be had) hold the same
// batches as pageable ones, to_device gives the batch's exact values on every device, and the
// arrays keep their contents when they grow.
#include <gtest/gtest.h>

#include <cstring>

#include "mixprec/allocator.h"
#include "mixprec/data.h"
#include "mixprec/device.h"
#include "mixprec/error.h"

namespace mixprec::data {
namespace {

Dataset small_dataset(int64_t n) {
  Dataset d;
  d.size = n, d.rows = 4, d.cols = 3;
  d.images.resize(size_t(n * 12));
  d.labels.resize(size_t(n));
  for (size_t i = 0; i < d.images.size(); ++i) d.images[i] = uint8_t(i * 37 % 251);
  for (int64_t i = 0; i < n; ++i) d.labels[size_t(i)] = uint8_t(i % 10);
  return d;
}

std::vector<Device> devices_here() {
  std::vector<Device> d = {Device::cpu(), Device::fenced()};
  if (cuda::device_count() > 0) d.push_back(Device::cuda(0));
  return d;
}

TEST(BatchTransfer, PinnedBatchesEqualPageableOnes) {
  const Dataset d = small_dataset(50);
  LoaderOptions pageable{.batch_size = 8, .seed = 3};
  LoaderOptions pinned = pageable;
  pinned.pin_memory = true;
  BatchLoader a(d, pageable), b(d, pinned);
  a.begin_epoch(1), b.begin_epoch(1);
  HostBatch x, y;
  int batches = 0;
  while (a.next(x)) {
    ASSERT_TRUE(b.next(y));
    EXPECT_EQ(x.n, y.n);
    EXPECT_EQ(x.x.to_vector(), y.x.to_vector());
    EXPECT_EQ(x.y.to_vector(), y.y.to_vector());
    EXPECT_FALSE(x.x.pinned());
    // Page-locked exactly where a GPU can be had (cudaHostAlloc needs one).
    EXPECT_EQ(y.x.pinned(), cuda::device_count() > 0);
    EXPECT_EQ(y.y.pinned(), cuda::device_count() > 0);
    ++batches;
  }
  EXPECT_FALSE(b.next(y));
  EXPECT_EQ(batches, 7);
}

TEST(BatchTransfer, ToDeviceGivesTheBatchValuesOnEveryDevice) {
  const Dataset d = small_dataset(20);
  LoaderOptions o{.batch_size = 6, .shuffle = false};
  o.pin_memory = true;
  BatchLoader loader(d, o);
  for (const Device& dev : devices_here()) {
    loader.begin_epoch(0);
    HostBatch b;
    int64_t seen = 0;
    while (loader.next(b)) {
      const DeviceBatch t = to_device(b, d.rows, d.cols, dev);
      EXPECT_EQ(t.x.device(), dev);
      EXPECT_EQ(t.x.shape(), (Shape{b.n, 1, 4, 3}));
      EXPECT_EQ(t.y.dtype(), DType::i64);
      EXPECT_EQ(t.x.to_vector(), b.x.to_vector()) << dev.str();  // to_vector waits for the copy
      EXPECT_EQ(t.y.to_vector_i64(), b.y.to_vector()) << dev.str();
      EXPECT_EQ(b.fence.pending(), dev.is_cuda());
      b.fence.wait();
      EXPECT_FALSE(b.fence.pending());
      seen += b.n;
    }
    EXPECT_EQ(seen, 20) << dev.str();
  }
}

TEST(BatchTransfer, ToDeviceStoresImagesIn16BitsAsACastWould) {
  const Dataset d = small_dataset(20);
  LoaderOptions o{.batch_size = 20, .shuffle = false};
  o.norm = Normalize{0.3f, 0.7f};  // values a 16-bit type must round
  BatchLoader loader(d, o);
  for (const Device& dev : devices_here())
    for (DType t : {DType::bf16, DType::f16}) {
      loader.begin_epoch(0);
      HostBatch b;
      ASSERT_TRUE(loader.next(b));
      const DeviceBatch f = to_device(b, d.rows, d.cols, dev);
      const DeviceBatch h = to_device(b, d.rows, d.cols, dev, t);
      EXPECT_EQ(h.x.dtype(), t);
      EXPECT_EQ(h.x.device(), dev);
      EXPECT_EQ(h.x.storage()->category(), MemCategory::data);
      EXPECT_EQ(h.x.to_vector(), f.x.to(t).to_vector()) << dev.str() << " " << dtype_name(t);
      EXPECT_EQ(h.y.to_vector_i64(), b.y.to_vector());
      b.fence.wait();
    }
  HostBatch b;
  b.n = 1;
  b.x.resize(12);
  b.y.resize(1);
  EXPECT_THROW(to_device(b, 4, 3, Device::cpu(), DType::i64), Error);
}

TEST(BatchTransfer, ToDeviceRejectsAMismatchedBatch) {
  HostBatch b;
  b.n = 2;
  b.x.resize(2 * 12);
  b.y.resize(2);
  EXPECT_NO_THROW(to_device(b, 4, 3, Device::cpu()));
  EXPECT_THROW(to_device(b, 4, 4, Device::cpu()), Error);
  b.y.resize(3);
  EXPECT_THROW(to_device(b, 4, 3, Device::fenced()), Error);
}

TEST(BatchTransfer, HostArrayKeepsItsContentsWhenItGrowsAndMoves) {
  HostArray<int64_t> a;
  a.resize(3);
  for (size_t i = 0; i < 3; ++i) a[i] = int64_t(i * 11);
  a.set_pinned(true);  // the next block is pinned where it can be
  a.resize(1000);
  EXPECT_EQ(a.size(), 1000u);
  EXPECT_EQ(a[0], 0);
  EXPECT_EQ(a[2], 22);
  EXPECT_EQ(a.pinned(), cuda::device_count() > 0);
  a.resize(2);
  EXPECT_EQ(a.capacity(), 1000u);  // shrinking keeps the block
  HostArray<int64_t> b = std::move(a);
  EXPECT_EQ(b.size(), 2u);
  EXPECT_EQ(b[1], 11);
  EXPECT_EQ(a.size(), 0u);  // NOLINT(bugprone-use-after-move): moved-from is empty by contract
  EXPECT_EQ(a.data(), nullptr);
}

}  // namespace
}  // namespace mixprec::data
