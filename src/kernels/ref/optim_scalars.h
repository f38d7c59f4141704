// The 0-d operands of the optimizer kernels (step count, lr, scale, found_inf, norm) as the host
// kernels read and write them: in place, inside the dispatch's DeviceScope. Internal.
#pragma once
#include "kernels/optim.h"

namespace mixprec::kernels {

// The one element of a 0-d (or one-element) tensor of dtype T.
template <class T>
T& scalar(const Tensor& t) {
  return *static_cast<T*>(t.data_ptr());
}
// Whether a step's found_inf flag says to skip it.
inline bool skipped(const OptimStep& s) { return s.found_inf.defined() && scalar<float>(s.found_inf) != 0; }

}  // namespace mixprec::kernels
