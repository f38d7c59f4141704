// Fast CPU attention: not yet written (every case falls back to the reference).
#include "kernels/attention.h"

namespace mixprec::kernels::cpu {

bool attention_forward(const Tensor&, const Tensor&, const Tensor&, const AttentionParams&, AttentionForward&) {
  return false;
}
bool attention_backward(const Tensor&, const Tensor&, const Tensor&, const AttentionForward&, const Tensor&,
                        const AttentionParams&, AttentionGrads&) {
  return false;
}

}  // namespace mixprec::kernels::cpu
