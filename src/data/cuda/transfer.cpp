// Pinned batch memory, asynchronous host-to-device copies of batches and their fences, on the
// CUDA runtime (CUDA builds only).
#include "data/transfer.h"

#include "core/cuda/cuda_util.h"

namespace mixprec::data::cuda {

using mixprec::cuda::detail::current_stream;
using mixprec::cuda::detail::DeviceGuard;

void* pinned_alloc(size_t bytes) {
  void* p = nullptr;
  // Portable: the block is pinned for every GPU of the process, not only the current one.
  if (cudaHostAlloc(&p, bytes, cudaHostAllocPortable) != cudaSuccess) {
    cudaGetLastError();  // clear the error: the caller falls back to pageable memory
    return nullptr;
  }
  return p;
}

// From destructors: an error here (a dead context at exit) is not worth terminating for.
void pinned_free(void* p) { cudaFreeHost(p); }

void copy_to_device_async(void* dst, const void* src, size_t bytes, int index) {
  if (bytes == 0) return;
  const DeviceGuard g(index);
  MIXPREC_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, current_stream(index)));
}

void* record_event(void* event, int index) {
  const DeviceGuard g(index);
  auto e = static_cast<cudaEvent_t>(event);
  // Timing off: the cheapest event, only ordering.
  if (e == nullptr) MIXPREC_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  MIXPREC_CUDA_CHECK(cudaEventRecord(e, current_stream(index)));
  return e;
}

void wait_event(void* event) { MIXPREC_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(event))); }

void destroy_event(void* event) { cudaEventDestroy(static_cast<cudaEvent_t>(event)); }

}  // namespace mixprec::data::cuda
