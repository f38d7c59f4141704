// What every CUDA source of mixprec shares (internal, CUDA builds only): error checks that throw
// one line naming the call, the device guard, and the stream each device's work goes to.
#pragma once
#include <cuda_runtime.h>

#include "mixprec/error.h"
#include "mixprec/random.h"
#include "mixprec/tensor.h"

namespace mixprec::cuda::detail {

[[noreturn]] void throw_cuda_error(cudaError_t e, const char* call, const char* file, int line);

// Throws mixprec::Error ("CUDA error in cudaMalloc(...) at file:line: out of memory") on failure.
#define MIXPREC_CUDA_CHECK(call)                                                               \
  do {                                                                                         \
    const cudaError_t mixprec_cuda_err_ = (call);                                              \
    if (mixprec_cuda_err_ != cudaSuccess)                                                      \
      ::mixprec::cuda::detail::throw_cuda_error(mixprec_cuda_err_, #call, __FILE__, __LINE__); \
  } while (0)
// After a kernel launch: a bad launch configuration is reported here, not at the next sync.
#define MIXPREC_CUDA_CHECK_LAUNCH() MIXPREC_CUDA_CHECK(cudaGetLastError())

// Makes `index` the current GPU for the scope (cudaSetDevice), restoring the previous one.
class DeviceGuard {
 public:
  explicit DeviceGuard(int index);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = 0;
};

// The stream all of a device's work goes to, on this thread: one non-blocking stream per GPU,
// created on first use (never the legacy default stream, which CUDA graphs cannot capture), or
// the stream a StreamGuard set.
cudaStream_t current_stream(int index);
class StreamGuard {
 public:
  StreamGuard(int index, cudaStream_t s);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  int index_;
  cudaStream_t prev_;
};

// The stream of a tensor's device.
inline cudaStream_t stream_of(const Tensor& t) { return current_stream(t.device().index); }

// Throws mixprec::Error (one line naming `what`) when `stream` is being captured into a CUDA graph:
// for work whose random offset is fixed on the host when it is queued (attention's dropout), which
// every replay would repeat with the same mask.
void refuse_in_capture(cudaStream_t stream, const char* what);

// A random draw inside a CUDA graph (PyTorch's Philox state for graphs). While a cuda::Graph of this
// thread captures `stream`, the first draw from `gen` registers it with the graph: `base` is a
// device word that holds, at the start of each replay, the Philox block where gen's first draw of
// the captured work begins, and `start` the block where it began in the capture; a captured kernel
// reading blocks from `first` (gen.reserve's answer in the capture) reads *base + (first - start).
// The graph advances *base on the device at the end of each replay and moves gen's host offset as
// the eager work would, so replays draw what eager steps draw. Call it before gen.reserve. Not
// capturing: {nullptr, 0}. A capture this thread's cuda::Graph did not begin: throws (one line).
// The generators a graph draws from must outlive it.
struct CapturedOffset {
  const uint64_t* base = nullptr;
  uint64_t start = 0;
};
CapturedOffset captured_offset(cudaStream_t stream, Generator& gen, const char* what);

// The generators one graph may draw from, and the kernel that ends each replay: base[i] += inc[i]
// for i < n (core/cuda/graph_offsets.cu).
constexpr int kMaxGraphGenerators = 16;
void advance_graph_offsets(cudaStream_t stream, uint64_t* base, const uint64_t* inc, int n);

}  // namespace mixprec::cuda::detail
