// Kernels of the shape family (ops/shape.cpp: views, contiguous, cast, cat): copies between any strides and
// dtypes, fill, cast. Reference: ref/shape.cpp; fast: cpu/shape.cpp; dispatch: shape.cpp.
#pragma once
#include "kernels/backend.h"
#include "mixprec/tensor.h"

namespace mixprec::kernels {

// A contiguous version of t without recording autograd (kernels never record).
inline Tensor contig(const Tensor& t) { return t.is_contiguous() ? t.detach() : t.clone(); }
void copy(const Tensor& src, Tensor& dst);  // any strides, any dtypes, same shape
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
