// Dispatch of the shape family (shape.h): fast CPU copy where it supports the case, else the reference.
#include "kernels/shape.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "kernels/ref/access.h"

namespace mixprec::kernels {

namespace {
// A copy between NCHW and NHWC bytes of one 4-d shape (the channels-last conversions) as 3-d views
// of the same bytes, dst contiguous: per image an [C, H*W] <-> [H*W, C] transpose, which the CPU's
// tiled copy and the GPU's transpose kernel take once H and W are merged (with W alone as the
// tiles' other side, a 7-wide plane was too thin for the CPU's tiles). Nothing for other copies.
bool across_layouts(const Tensor& src, const Tensor& dst, Tensor& s3, Tensor& d3) {
  if (src.dim() != 4 || src.is_contiguous() == dst.is_contiguous()) return false;
  const bool to_nhwc = src.is_contiguous() && nhwc_dense(dst), to_nchw = dst.is_contiguous() && nhwc_dense(src);
  if (!to_nhwc && !to_nchw) return false;
  const int64_t n = src.size(0), c = src.size(1), hw = src.size(2) * src.size(3);
  const auto planes = [&](const Tensor& t) { return t.detach().reshape({n, c, hw}); };  // NCHW bytes
  const auto rows = [&](const Tensor& t) { return nhwc_view(t).reshape({n, hw, c}); };  // NHWC bytes
  s3 = to_nhwc ? planes(src).transpose(1, 2) : rows(src).transpose(1, 2);
  d3 = to_nhwc ? rows(dst) : planes(dst);
  return true;
}
}  // namespace

void copy(const Tensor& src, Tensor& dst) {
  MIXPREC_ASSERT(src.shape() == dst.shape(), "copy ", shape_str(src.shape()), " -> ", shape_str(dst.shape()));
  MIXPREC_CHECK(src.device() == dst.device(), "copy_: source on ", src.device().str(), ", destination on ",
                dst.device().str(), "; move the source with .to(device) first");
  const DeviceScope on({&src, &dst});
  Tensor s3, d3;  // the 3-d views of a copy across layouts, made only where a direct copy is not taken
#ifdef MIXPREC_WITH_CUDA
  if (on.cuda()) return across_layouts(src, dst, s3, d3) ? cuda::copy(s3, d3) : cuda::copy(src, dst);
#endif
  if (use_fast() && (cpu::copy(src, dst) || (across_layouts(src, dst, s3, d3) && cpu::copy(s3, d3)))) return;
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

Tensor nhwc_view(const Tensor& t) {
  MIXPREC_ASSERT(t.dim() == 4, "nhwc_view of ", shape_str(t.shape()));
  return t.detach().transpose(1, 2).transpose(2, 3);
}
Tensor nchw_view(const Tensor& t) {
  MIXPREC_ASSERT(t.dim() == 4, "nchw_view of ", shape_str(t.shape()));
  return t.detach().transpose(2, 3).transpose(1, 2);
}
bool nhwc_dense(const Tensor& t) { return t.dim() == 4 && nhwc_view(t).is_contiguous(); }
bool is_channels_last(const Tensor& t) { return t.dim() == 4 && !t.is_contiguous() && nhwc_dense(t); }
Tensor channels_last(const Tensor& t) {
  if (nhwc_dense(t)) return t.detach();
  Tensor out = empty_channels_last(t.shape(), t.dtype(), t.device());
  copy(t, out);
  return out;
}
Tensor empty_channels_last(const Shape& s, DType dtype, const Device& device) {
  MIXPREC_ASSERT(s.size() == 4, "empty_channels_last ", shape_str(s));
  return nchw_view(Tensor::empty({s[0], s[2], s[3], s[1]}, dtype, device));
}
Tensor in_layout_of(const Tensor& t, const Tensor& like) {
  return is_channels_last(like) ? channels_last(t) : contig(t);
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
