// Kernels of the reduce family (ops/reduce.cpp): sums over dims, accumulated in f32 (f64 for
// f64), and the finiteness check of anomaly mode and the loss scaler. Reference: ref/reduce.cpp;
// fast: cpu/reduce.cpp; dispatch: reduce.cpp.
#pragma once
#include <string_view>
#include <vector>

#include "kernels/backend.h"
#include "mixprec/tensor.h"

namespace mixprec::kernels {

// x's shape without `dims` (with 1 in their place when keepdim): the shape of sum's result.
Shape reduced_shape(const Shape& shape, const std::vector<int64_t>& dims, bool keepdim);
// Sum over `dims` (sorted, unique), result in out_dtype.
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, DType out_dtype);
bool all_finite(const Tensor& x);
// Anomaly mode: throws mixprec::Error naming the op if x has NaN/inf.
void check_finite_or_throw(const Tensor& x, std::string_view op, bool backward = false);

namespace ref {
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, DType out_dtype);
bool all_finite(const Tensor& x);
}  // namespace ref

namespace cpu {
// Sums over leading dims or everything; dst preallocated.
bool sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, Tensor& dst);
// finite = no NaN/inf in x (floating x).
bool all_finite(const Tensor& x, bool& finite);
}  // namespace cpu

namespace cuda {  // src/kernels/cuda/reduce.cu
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, DType out_dtype);
// Waits for the GPU (the answer is a host bool): for anomaly mode, which checks every op's
// output and is a debugging mode; the loss scaler's check stays on the device (issue 17, item 5).
bool all_finite(const Tensor& x);
}  // namespace cuda

}  // namespace mixprec::kernels
