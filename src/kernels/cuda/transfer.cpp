// Copies between a GPU and the host or another GPU (kernels::to_device), on the device's stream;
// a copy to the host waits for it, so the host sees the bytes when this returns (and reports a bad
// nll_loss target recorded on the device since the last wait: loss.h).
#include "core/cuda/cuda_util.h"
#include "kernels/loss.h"
#include "kernels/shape.h"

namespace mixprec::kernels::cuda {

void copy_between_devices(const Tensor& src, Tensor& dst) {
  MIXPREC_ASSERT(src.nbytes() == dst.nbytes() && src.is_contiguous() && dst.is_contiguous(), "copy_between_devices");
  if (src.nbytes() == 0) return;
  const Device on = src.device().is_cuda() ? src.device() : dst.device();
  mixprec::cuda::detail::DeviceGuard g(on.index);
  cudaStream_t s = mixprec::cuda::detail::current_stream(on.index);
  // The fenced device is host memory: open it for the copy.
  const mixprec::detail::FencedAccess access;
  if (src.device().is_cuda() && dst.device().is_cuda() && !(src.device() == dst.device())) {
    MIXPREC_CUDA_CHECK(
        cudaMemcpyPeerAsync(dst.data_ptr(), dst.device().index, src.data_ptr(), src.device().index, src.nbytes(), s));
  } else {
    MIXPREC_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), src.nbytes(), cudaMemcpyDefault, s));
  }
  if (!dst.device().is_cuda()) {
    MIXPREC_CUDA_CHECK(cudaStreamSynchronize(s));
    report_bad_targets(on.index);  // the host waited anyway: surface a bad nll_loss target now
  }
}

}  // namespace mixprec::kernels::cuda
