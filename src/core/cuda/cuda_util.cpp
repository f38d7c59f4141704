// CUDA error reporting, device guard and per-device streams (cuda_util.h).
#include "core/cuda/cuda_util.h"

#include <array>
#include <mutex>

namespace mixprec::cuda::detail {
namespace {
constexpr int kMaxDevices = 64;
std::array<cudaStream_t, kMaxDevices> g_streams{};  // created once, never destroyed
std::once_flag g_stream_once[kMaxDevices];
thread_local std::array<cudaStream_t, kMaxDevices> tl_override{};
}  // namespace

void throw_cuda_error(cudaError_t e, const char* call, const char* file, int line) {
  cudaGetLastError();  // clear a non-sticky error so the process can go on
  throw Error(mixprec::detail::concat("CUDA error in ", call, " at ", file, ":", line, ": ", cudaGetErrorString(e)));
}

DeviceGuard::DeviceGuard(int index) {
  MIXPREC_CUDA_CHECK(cudaGetDevice(&prev_));
  if (prev_ != index) MIXPREC_CUDA_CHECK(cudaSetDevice(index));
}
DeviceGuard::~DeviceGuard() {
  int cur = 0;
  if (cudaGetDevice(&cur) == cudaSuccess && cur != prev_) cudaSetDevice(prev_);
}

cudaStream_t current_stream(int index) {
  MIXPREC_CHECK(index >= 0 && index < kMaxDevices, "cuda:", index, " is beyond the ", kMaxDevices, " GPUs supported");
  if (tl_override[size_t(index)] != nullptr) return tl_override[size_t(index)];
  std::call_once(g_stream_once[index], [index] {
    DeviceGuard g(index);
    MIXPREC_CUDA_CHECK(cudaStreamCreateWithFlags(&g_streams[size_t(index)], cudaStreamNonBlocking));
  });
  return g_streams[size_t(index)];
}

void refuse_in_capture(cudaStream_t stream, const char* what) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  MIXPREC_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  MIXPREC_CHECK(status == cudaStreamCaptureStatusNone, what,
                " in a CUDA graph capture: its random offset would be fixed when queued, so every replay would draw "
                "the same mask; capture a step without it (or capture with cuda::Graph: dropout then draws through "
                "the graph's device offsets)");
}

StreamGuard::StreamGuard(int index, cudaStream_t s) : index_(index), prev_(tl_override.at(size_t(index))) {
  tl_override[size_t(index)] = s;
}
StreamGuard::~StreamGuard() { tl_override[size_t(index_)] = prev_; }

}  // namespace mixprec::cuda::detail
