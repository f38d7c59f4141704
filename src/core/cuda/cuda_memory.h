// The CUDA memory of the process: each GPU's caching allocator (cudaMalloc and CUDA events under
// core/caching_allocator.h) and the pinned host allocator for batches copied to a GPU. Defined in
// cuda_memory.cpp in CUDA builds; a build without CUDA throws mixprec::Error from both accessors.
#pragma once
#include "core/caching_allocator.h"

namespace mixprec::detail {

// The caching allocator of GPU `device`, created on first use and never destroyed (tensors may
// outlive static destruction). Throws mixprec::Error (one line) where there is no such GPU.
CachingAllocator& cuda_caching_allocator(int device);

// Page-locked host memory (cudaHostAlloc) through the same caching allocator, for the loader's
// batches: cudaMemcpyAsync from it overlaps compute. Its blocks belong to no stream, so a freed
// block is reused at once unless record_stream(ptr, copy_stream) was called after queuing a copy
// from it: then it waits until the copy has run. Throws mixprec::Error where there is no GPU.
CachingAllocator& cuda_pinned_allocator();

}  // namespace mixprec::detail
