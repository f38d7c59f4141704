// Kernels of the shape family (ops/shape.cpp: views, contiguous, cast, cat): copies between any strides and
// dtypes, fill, cast. Reference: ref/shape.cpp; fast: cpu/shape.cpp; dispatch: shape.cpp.
#pragma once
#include "kernels/backend.h"
#include "mixprec/tensor.h"

namespace mixprec::kernels {

// A contiguous version of t without recording autograd (kernels never record).
inline Tensor contig(const Tensor& t) { return t.is_contiguous() ? t.detach() : t.clone(); }
void copy(const Tensor& src, Tensor& dst);  // any strides, any dtypes, same shape

// Channels-last: an [N, C, H, W] tensor whose bytes are laid out [N, H, W, C] (PyTorch's
// torch.channels_last memory format), the layout cuDNN's tensor-core convolutions run natively.
// Only 4-d tensors have it; ops that know it keep it (conv2d, max_pool2d, the activations),
// the rest read such a tensor through its strides or a contiguous copy (docs/design.md).
// The [N, H, W, C] view of a 4-d t, and back: no copy; contiguous when t is NHWC-dense.
Tensor nhwc_view(const Tensor& t);
Tensor nchw_view(const Tensor& t);
// Whether t's bytes are NHWC-dense: its nhwc_view is contiguous (true for a contiguous t whose C,
// or H and W, are 1: both layouts at once).
bool nhwc_dense(const Tensor& t);
// Channels-last and not contiguous: the layout an op must keep (the ambiguous case counts as contiguous).
bool is_channels_last(const Tensor& t);
// t itself (detached) when NHWC-dense, else an NHWC-dense copy.
Tensor channels_last(const Tensor& t);
// A new NHWC-dense [N, C, H, W] tensor.
Tensor empty_channels_last(const Shape& nchw, DType dtype, const Device& device);
// t in the layout of `like`: channels-last where `like` is, else contiguous.
Tensor in_layout_of(const Tensor& t, const Tensor& like);
void fill(Tensor& dst, double value);
Tensor cast(const Tensor& src, DType dtype);  // new contiguous tensor
// A contiguous copy of src on `device` (any pair of devices; from a GPU it waits for the copy).
Tensor to_device(const Tensor& src, const Device& device);
// How many to_device copies from a device (GPU, fenced) to the CPU host code has made: each is a
// host sync on a GPU (item(), to_vector() and .to(Device::cpu()) all come here). Copies made
// inside a CPU kernel serving the fenced device are not counted (a GPU kernel reads in place).
// Tests count them around a training step, which must make none; MIXPREC_DEBUG_TRAP_D2H=1 traps
// at each counted copy, so a debugger's backtrace names the code that syncs.
int64_t device_to_host_copies();

namespace ref {
void copy(const Tensor& src, Tensor& dst);
void fill(Tensor& dst, double value);
}  // namespace ref

namespace cpu {
bool copy(const Tensor& src, Tensor& dst);  // contiguous src and dst
}  // namespace cpu

namespace cuda {
void copy(const Tensor& src, Tensor& dst);  // src/kernels/cuda/shape.cu
void fill(Tensor& dst, double value);
// Contiguous src and dst of one dtype and size, at least one of them on a GPU (src/kernels/cuda/).
void copy_between_devices(const Tensor& src, Tensor& dst);
}  // namespace cuda

}  // namespace mixprec::kernels
