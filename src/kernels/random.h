// Kernels that draw random numbers (dispatch: random.cpp; reference: ref/random.cpp):
// counter-based, so one kernel serves every CPU backend, the draws do not depend on the thread
// count, and a GPU kernel computes element i from word i the same way.
#pragma once
#include "mixprec/random.h"
#include "mixprec/tensor.h"

namespace mixprec::kernels {

// Dropout's mask: 0 or 1/(1-p) in dtype; element i is dropped when word i of one use of gen, as a
// 24-bit uniform in [0, 1), is below p.
Tensor dropout_mask(const Shape& shape, DType dtype, double p, Generator& gen, const Device& device);

namespace ref {
Tensor dropout_mask(const Shape& shape, DType dtype, double p, Generator& gen);
}  // namespace ref

namespace cuda {  // src/kernels/cuda/random.cu: the same words and values as ref:: on the CPU
Tensor dropout_mask(const Shape& shape, DType dtype, double p, Generator& gen);
}  // namespace cuda

}  // namespace mixprec::kernels
