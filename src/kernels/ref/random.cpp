// Random kernels: dropout's mask from the Philox words of one generator use (parallel, the same
// for any thread count; a GPU kernel computes element i from word i the same way).
#include "mixprec/random.h"
#include "core/philox.h"
#include "core/random_fill.h"
#include "kernels/kernels.h"

namespace mixprec::kernels::ref {

Tensor dropout_mask(const Shape& shape, DType dtype, double p, Generator& gen) {
  Tensor mask = Tensor::empty(shape, dtype);
  const int64_t n = mask.numel();
  // Inverted dropout, as PyTorch: kept values are scaled by 1/(1-p), computed in f64 and rounded
  // once to dtype (an f64 mask gets it exactly).
  const double keep_scale = 1.0 / (1.0 - p);
  detail::fill_from_blocks<4>(mask.data_ptr(), dtype, n, gen.reserve(uint64_t(n)), gen,
                              [&](const std::array<uint32_t, 4>& w, double* out) {
                                for (int j = 0; j < 4; ++j) out[j] = detail::dropout_drops(w[j], p) ? 0.0 : keep_scale;
                              });
  return mask;
}

}  // namespace mixprec::kernels::ref
