// Batches from the loader's host arrays to a device: the arrays' (pinned or pageable) memory, the
// copy, and the fence that keeps the loader from refilling an array a GPU is still reading.
#include <cstdlib>
#include <new>

#include "core/fenced.h"
#include "data/transfer.h"
#include "mixprec/allocator.h"
#include "mixprec/autograd.h"
#include "mixprec/convert.h"
#include "mixprec/data.h"
#include "mixprec/error.h"

namespace mixprec::detail {

void* host_alloc(size_t bytes, bool pinned, bool& got_pinned) {
  got_pinned = false;
#ifdef MIXPREC_WITH_CUDA
  if (pinned && mixprec::cuda::device_count() > 0) {
    if (void* p = data::cuda::pinned_alloc(bytes)) {
      got_pinned = true;
      return p;
    }
  }
#else
  (void)pinned;
#endif
  constexpr size_t kAlign = 64;  // a cache line: the vector loops' loads never straddle two
  void* p = std::aligned_alloc(kAlign, (bytes + kAlign - 1) / kAlign * kAlign);
  if (p == nullptr && bytes > 0) throw std::bad_alloc();
  return p;
}

void host_free(void* p, bool pinned) {
#ifdef MIXPREC_WITH_CUDA
  if (pinned) return data::cuda::pinned_free(p);
#endif
  MIXPREC_ASSERT(!pinned, "a pinned block in a build without CUDA");
  std::free(p);
}

}  // namespace mixprec::detail

namespace mixprec::data {

CopyFence::~CopyFence() {
#ifdef MIXPREC_WITH_CUDA
  if (event_ == nullptr) return;
  if (pending_) cuda::wait_event(event_);
  cuda::destroy_event(event_);
#endif
}

void CopyFence::record(const Device& device) {
  if (!device.is_cuda()) return;
#ifdef MIXPREC_WITH_CUDA
  event_ = cuda::record_event(event_, device.index);
  pending_ = true;
#endif
}

void CopyFence::wait() {
  if (!pending_) return;
#ifdef MIXPREC_WITH_CUDA
  cuda::wait_event(event_);
#endif
  pending_ = false;
}

namespace {

DeviceBatch to_device_f32(HostBatch& batch, int64_t rows, int64_t cols, const Device& device) {
  MemoryScope scope(MemCategory::data);
  DeviceBatch d{Tensor::empty({batch.n, 1, rows, cols}, DType::f32, device),
                Tensor::empty({batch.n}, DType::i64, device)};
  const size_t x_bytes = batch.x.size() * sizeof(float), y_bytes = batch.y.size() * sizeof(int64_t);
  if (device.is_cuda()) {
#ifdef MIXPREC_WITH_CUDA
    batch.fence.wait();  // the arrays were filled after any earlier copy from them was done
    cuda::copy_to_device_async(d.x.data_ptr(), batch.x.data(), x_bytes, device.index);
    cuda::copy_to_device_async(d.y.data_ptr(), batch.y.data(), y_bytes, device.index);
    batch.fence.record(device);
    return d;
#endif
  }
  // cpu and fenced: host memory both, the fenced one opened for the copy.
  const mixprec::detail::FencedAccess access;
  if (x_bytes > 0) std::memcpy(d.x.data_ptr(), batch.x.data(), x_bytes);
  if (y_bytes > 0) std::memcpy(d.y.data_ptr(), batch.y.data(), y_bytes);
  return d;
}

}  // namespace

DeviceBatch to_device(HostBatch& batch, int64_t rows, int64_t cols, const Device& device, DType x_dtype) {
  MIXPREC_CHECK(batch.x.size() == size_t(batch.n * rows * cols) && batch.y.size() == size_t(batch.n),
                "to_device: a batch of ", batch.n, " images of ", rows, "x", cols, " holds ", batch.x.size(),
                " pixels and ", batch.y.size(), " labels");
  MIXPREC_CHECK(x_dtype == DType::f32 || x_dtype == DType::bf16 || x_dtype == DType::f16,
                "to_device: images can be f32, bf16 or f16, not ", dtype_name(x_dtype));
  if (x_dtype == DType::f32 || !device.is_cpu()) {
    DeviceBatch d = to_device_f32(batch, rows, cols, device);
    if (x_dtype != DType::f32) {
      MemoryScope scope(MemCategory::data);
      autograd::NoGradGuard no_grad;
      d.x = d.x.to(x_dtype);  // on the device, after the copy (a GPU queues both)
    }
    return d;
  }
  // The CPU: converted straight from the host array, no f32 copy in between.
  MemoryScope scope(MemCategory::data);
  DeviceBatch d{Tensor::empty({batch.n, 1, rows, cols}, x_dtype, device), Tensor::empty({batch.n}, DType::i64, device)};
  convert(batch.x.data(), DType::f32, d.x.data_ptr(), x_dtype, batch.x.size());
  if (!batch.y.empty()) std::memcpy(d.y.data_ptr(), batch.y.data(), batch.y.size() * sizeof(int64_t));
  return d;
}

}  // namespace mixprec::data
