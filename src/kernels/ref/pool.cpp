// Reference 2-d pooling (max with argmax, average, adaptive average) over NCHW planes, in f64
// whatever the storage dtype. Window rules shared with the fast path live in pool_window.h.

#include "kernels/pool.h"
#include "kernels/pool_window.h"
#include "mixprec/convert.h"

namespace mixprec::kernels::ref {

MaxPoolResult max_pool2d_forward(const Tensor& x, const PoolGeometry& g) {
  const std::vector<double> xv = x.to_vector_f64();
  const int64_t planes = g.n * g.c, out_plane = g.oh * g.ow;
  std::vector<double> y(size_t(planes * out_plane));
  std::vector<int64_t> arg(y.size());
  for (int64_t p = 0; p < planes; ++p)
    max_plane_forward(xv.data() + p * g.h * g.w, g, y.data() + p * out_plane, arg.data() + p * out_plane);
  const Shape shape{g.n, g.c, g.oh, g.ow};
  MaxPoolResult r;
  r.dst = Tensor::from_vector(y, shape, x.dtype());
  r.argmax = Tensor::empty(shape, g.argmax_dtype());
  convert(arg.data(), DType::i64, r.argmax.data_ptr(), r.argmax.dtype(), arg.size());
  return r;
}

Tensor max_pool2d_backward(const Tensor& grad_y, const Tensor& argmax, const PoolGeometry& g) {
  const std::vector<double> gy = grad_y.to_vector_f64();
  const std::vector<int64_t> arg = argmax.to_vector_i64();
  const int64_t planes = g.n * g.c, out_plane = g.oh * g.ow;
  std::vector<double> gx(size_t(planes * g.h * g.w), 0.0);
  for (int64_t p = 0; p < planes; ++p)
    max_plane_backward(gy.data() + p * out_plane, arg.data() + p * out_plane, g, gx.data() + p * g.h * g.w);
  return Tensor::from_vector(gx, {g.n, g.c, g.h, g.w}, grad_y.dtype());
}

Tensor max_pool2d_backward_from_input(const Tensor& grad_y, const Tensor& x, const PoolGeometry& g) {
  const std::vector<double> gy = grad_y.to_vector_f64(), xv = x.to_vector_f64();
  const int64_t planes = g.n * g.c, out_plane = g.oh * g.ow;
  std::vector<double> gx(size_t(planes * g.h * g.w), 0.0), best(static_cast<size_t>(out_plane));
  std::vector<int64_t> arg(static_cast<size_t>(out_plane));
  for (int64_t p = 0; p < planes; ++p) {
    max_plane_forward(xv.data() + p * g.h * g.w, g, best.data(), arg.data());
    max_plane_backward(gy.data() + p * out_plane, arg.data(), g, gx.data() + p * g.h * g.w);
  }
  return Tensor::from_vector(gx, {g.n, g.c, g.h, g.w}, grad_y.dtype());
}

Tensor avg_pool2d_forward(const Tensor& x, const PoolGeometry& g) {
  const std::vector<double> xv = x.to_vector_f64();
  const int64_t planes = g.n * g.c;
  std::vector<double> y(size_t(planes * g.oh * g.ow));
  for (int64_t p = 0; p < planes; ++p) avg_plane_forward(xv.data() + p * g.h * g.w, g, y.data() + p * g.oh * g.ow);
  return Tensor::from_vector(y, {g.n, g.c, g.oh, g.ow}, x.dtype());
}

Tensor avg_pool2d_backward(const Tensor& grad_y, const PoolGeometry& g) {
  const std::vector<double> gy = grad_y.to_vector_f64();
  const int64_t planes = g.n * g.c;
  std::vector<double> gx(size_t(planes * g.h * g.w), 0.0);
  for (int64_t p = 0; p < planes; ++p) avg_plane_backward(gy.data() + p * g.oh * g.ow, g, gx.data() + p * g.h * g.w);
  return Tensor::from_vector(gx, {g.n, g.c, g.h, g.w}, grad_y.dtype());
}

Tensor pack_argmax_2bit(const Tensor& argmax) {
  const std::vector<int64_t> taps = argmax.to_vector_i64();
  const int64_t n = int64_t(taps.size());
  Tensor packed = Tensor::zeros({(n + 3) / 4}, DType::u8);
  auto* out = packed.data<uint8_t>();
  for (int64_t i = 0; i < n; ++i) {
    MIXPREC_CHECK(taps[size_t(i)] >= 0 && taps[size_t(i)] < 4, "pack_argmax_2bit: tap ", taps[size_t(i)], " of output ",
                  i, " does not fit in two bits");
    out[i / 4] = uint8_t(out[i / 4] | taps[size_t(i)] << (2 * (i % 4)));
  }
  return packed;
}

Tensor unpack_argmax_2bit(const Tensor& packed, const Shape& shape) {
  Tensor argmax = Tensor::empty(shape, DType::u8);
  const int64_t n = argmax.numel();
  MIXPREC_CHECK(packed.dtype() == DType::u8 && packed.numel() == (n + 3) / 4, "unpack_argmax_2bit: ", packed.numel(),
                " ", dtype_name(packed.dtype()), " bytes for ", n, " taps");
  const std::vector<int64_t> bytes = packed.to_vector_i64();
  auto* out = argmax.data<uint8_t>();
  for (int64_t i = 0; i < n; ++i) out[i] = uint8_t(bytes[size_t(i / 4)] >> (2 * (i % 4)) & 3);
  return argmax;
}

}  // namespace mixprec::kernels::ref
