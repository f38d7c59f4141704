// Dispatch of the shape family (shape.h): fast CPU copy where it supports the case, else the reference.
#include "kernels/shape.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "kernels/ref/access.h"

namespace mixprec::kernels {

void copy(const Tensor& src, Tensor& dst) {
  MIXPREC_ASSERT(src.shape() == dst.shape(), "copy ", shape_str(src.shape()), " -> ", shape_str(dst.shape()));
  MIXPREC_CHECK(src.device() == dst.device(), "copy_: source on ", src.device().str(), ", destination on ",
                dst.device().str(), "; move the source with .to(device) first");
  const DeviceScope on({&src, &dst});
#ifdef MIXPREC_WITH_CUDA
  if (on.cuda()) return cuda::copy(src, dst);
#endif
  if (use_fast() && cpu::copy(src, dst)) return;
  note_reference();
  ref::copy(src, dst);
}

void fill(Tensor& dst, double value) {  // memset/memcpy already: no fast variant
  const DeviceScope on(dst);
#ifdef MIXPREC_WITH_CUDA
  if (on.cuda()) return cuda::fill(dst, value);
#endif
  ref::fill(dst, value);
}

Tensor cast(const Tensor& src, DType dtype) {
  const DeviceScope on(src);
  Tensor dst = Tensor::empty(src.shape(), dtype);
  copy(src, dst);
  return dst;
}

namespace {
std::atomic<int64_t> g_device_to_host{0};
}  // namespace

int64_t device_to_host_copies() { return g_device_to_host.load(); }

Tensor to_device(const Tensor& src, const Device& device) {
  // A CPU kernel serving the fenced device runs with its memory open and may copy what a GPU
  // kernel would read in place (the labels of nll_loss): not a host sync, not counted.
  if (device.is_cpu() && !src.device().is_cpu() && !(src.device().is_fenced() && detail::fenced_access_open())) {
    ++g_device_to_host;
    if (std::getenv("MIXPREC_DEBUG_TRAP_D2H")) __builtin_trap();
  }
  const Tensor c = contig(src);
  Tensor dst = Tensor::empty(c.shape(), c.dtype(), device);
  if (c.device().is_cuda() || device.is_cuda()) {
#ifdef MIXPREC_WITH_CUDA
    cuda::copy_between_devices(c, dst);
    return dst;
#else
    MIXPREC_ASSERT(false, "a CUDA tensor in a build without CUDA");
#endif
  }
  // cpu and fenced: host memory both, the fenced one opened for the copy.
  const detail::FencedAccess access;
  std::memcpy(dst.data_ptr(), c.data_ptr(), c.nbytes());
  return dst;
}

}  // namespace mixprec::kernels
