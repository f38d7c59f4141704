// Dispatch of the random kernels (random.h): the reference serves every CPU backend, random.cu a GPU.
#include "kernels/random.h"

#include "kernels/backend.h"

namespace mixprec::kernels {

Tensor dropout_mask(const Shape& shape, DType dtype, double p, Generator& gen, const Device& device) {
  const DeviceScope on(device);
#ifdef MIXPREC_WITH_CUDA
  if (on.cuda()) return cuda::dropout_mask(shape, dtype, p, gen);
#endif
  return ref::dropout_mask(shape, dtype, p, gen);
}

}  // namespace mixprec::kernels
