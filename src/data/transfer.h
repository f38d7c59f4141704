// The CUDA side of moving batches to a GPU (internal; defined in src/data/cuda/, CUDA builds only):
// pinned host blocks, the asynchronous host-to-device copy on the device's stream, and the events
// that fence a batch's arrays until the copy is done.
#pragma once
#include <cstddef>

namespace mixprec::data::cuda {

// Page-locked host memory (cudaHostAlloc); nullptr where the runtime refuses. The one place the
// caching allocator's pinned pool (branch alloc) is to be plugged in.
void* pinned_alloc(size_t bytes);
void pinned_free(void* p);

// Queues a copy of `bytes` from host memory to GPU `index` on its stream and returns at once.
void copy_to_device_async(void* dst, const void* src, size_t bytes, int index);
// Records `event` (made when null) on GPU `index`'s stream; returns it.
void* record_event(void* event, int index);
void wait_event(void* event);  // blocks the calling thread until the event completed
void destroy_event(void* event);

}  // namespace mixprec::data::cuda
