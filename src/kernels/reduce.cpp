// Dispatch of the reduce family (reduce.h): the fast CPU kernel where it supports the case, else the reference.
#include "kernels/reduce.h"

#include <algorithm>

#include "mixprec/error.h"

namespace mixprec::kernels {

Shape reduced_shape(const Shape& shape, const std::vector<int64_t>& dims, bool keepdim) {
  Shape out;
  for (int64_t d = 0; d < int64_t(shape.size()); ++d) {
    if (std::find(dims.begin(), dims.end(), d) == dims.end())
      out.push_back(shape[size_t(d)]);
    else if (keepdim)
      out.push_back(1);
  }
  return out;
}

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, DType out_dtype) {
  const DeviceScope on(x);
#ifdef MIXPREC_WITH_CUDA
  if (on.cuda()) return cuda::sum(x, dims, keepdim, out_dtype);
#endif
  if (use_fast()) {
    Tensor dst = Tensor::empty(reduced_shape(x.shape(), dims, keepdim), out_dtype);
    if (cpu::sum(x, dims, keepdim, dst)) return dst;
  }
  note_reference();
  return ref::sum(x, dims, keepdim, out_dtype);
}

bool all_finite(const Tensor& x) {
  const DeviceScope on(x);
  if (!is_floating(x.dtype())) return true;
#ifdef MIXPREC_WITH_CUDA
  if (on.cuda()) return cuda::all_finite(x);
#endif
  bool finite = true;
  if (use_fast() && cpu::all_finite(x, finite)) return finite;
  note_reference();
  return ref::all_finite(x);
}

void check_finite_or_throw(const Tensor& x, std::string_view op, bool backward) {
  if (all_finite(x)) return;
  throw Error(detail::concat("anomaly: ", op, backward ? " backward" : "", " produced NaN or inf (output ",
                             shape_str(x.shape()), " ", dtype_name(x.dtype()), ")"));
}

}  // namespace mixprec::kernels
