// Dispatch of the random kernels (random.h): the reference serves every CPU backend.
#include "kernels/random.h"

#include "kernels/backend.h"

namespace mixprec::kernels {

Tensor dropout_mask(const Shape& shape, DType dtype, double p, Generator& gen, const Device& device) {
  const DeviceScope on(device);
  return ref::dropout_mask(shape, dtype, p, gen);
}

}  // namespace mixprec::kernels
