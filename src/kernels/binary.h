// Kernels of the binary family (ops/binary.cpp): element-wise add/sub/mul/div with numpy
// broadcasting, inputs of any floating dtypes (a mixed pair computes in the promoted dtype, as if
// the narrower were cast first), computed in f32 (f64 for f64).
// Reference: ref/binary.cpp; fast: cpu/binary.cpp; dispatch: binary.cpp.
#pragma once
#include <string_view>

#include "kernels/backend.h"
#include "mixprec/tensor.h"

namespace mixprec::kernels {

enum class BinaryOp { add, sub, mul, div };

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b);  // broadcasting; result in the promoted dtype
Tensor add(const Tensor& a, const Tensor& b);                  // same shape
void add_inplace(Tensor& acc, const Tensor& g);                // acc += g, same shape, acc contiguous

// Shape of broadcasting a with b (numpy rules); throws naming `op` when they do not broadcast.
Shape broadcast_shapes(const Shape& a, const Shape& b, std::string_view op);

namespace ref {  // one dtype
Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b);
}  // namespace ref

namespace cpu {
// Same-shape contiguous operands, or one broadcast as a suffix row or scalar, each of its own dtype;
// dst preallocated in the promoted dtype.
bool binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& dst);
}  // namespace cpu

namespace cuda {  // src/kernels/cuda/binary.cu
Tensor binary(    // one dtype
    BinaryOp op, const Tensor& a, const Tensor& b);
void add_inplace(Tensor& acc, const Tensor& g);
}  // namespace cuda

}  // namespace mixprec::kernels
