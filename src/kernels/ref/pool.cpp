// Reference 2-d pooling (max with argmax, average, adaptive average) over NCHW planes, in f64
// whatever the storage dtype. Window rules shared with the fast path live in pool_window.h.
#include <cmath>
#include <limits>

#include "kernels/kernels.h"
#include "kernels/pool_window.h"
#include "mixprec/convert.h"

namespace mixprec::kernels::ref {

MaxPoolResult max_pool2d_forward(const Tensor& x, const PoolGeometry& g) {
  const std::vector<double> xv = x.to_vector_f64();
  const int64_t planes = g.n * g.c, out_plane = g.oh * g.ow;
  std::vector<double> y(size_t(planes * out_plane));
  std::vector<int64_t> arg(y.size());
  for (int64_t p = 0; p < planes; ++p)
    for (int64_t oy = 0; oy < g.oh; ++oy)
      for (int64_t ox = 0; ox < g.ow; ++ox) {
        const auto [best, best_k] = window_max(xv.data() + p * g.h * g.w, g, oy, ox);
        const size_t o = size_t(p * out_plane + oy * g.ow + ox);
        y[o] = best;
        arg[o] = best_k;
      }
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
    for (int64_t oy = 0; oy < g.oh; ++oy)
      for (int64_t ox = 0; ox < g.ow; ++ox) {
        const size_t o = size_t(p * out_plane + oy * g.ow + ox);
        const int64_t ky = arg[o] / g.kw, kx = arg[o] % g.kw;
        const int64_t iy = oy * g.stride_h - g.pad_h + ky * g.dil_h, ix = ox * g.stride_w - g.pad_w + kx * g.dil_w;
        gx[size_t((p * g.h + iy) * g.w + ix)] += gy[o];
      }
  return Tensor::from_vector(gx, {g.n, g.c, g.h, g.w}, grad_y.dtype());
}

Tensor avg_pool2d_forward(const Tensor& x, const PoolGeometry& g) {
  const std::vector<double> xv = x.to_vector_f64();
  const int64_t planes = g.n * g.c;
  std::vector<double> y(size_t(planes * g.oh * g.ow));
  for (int64_t p = 0; p < planes; ++p)
    for (int64_t oy = 0; oy < g.oh; ++oy)
      for (int64_t ox = 0; ox < g.ow; ++ox) {
        const AvgWindow win = avg_window(g, oy, ox);
        double s = 0;
        for (int64_t iy = win.y0; iy < win.y1; ++iy)
          for (int64_t ix = win.x0; ix < win.x1; ++ix) s += xv[size_t((p * g.h + iy) * g.w + ix)];
        y[size_t((p * g.oh + oy) * g.ow + ox)] = s / double(win.divisor);
      }
  return Tensor::from_vector(y, {g.n, g.c, g.oh, g.ow}, x.dtype());
}

Tensor avg_pool2d_backward(const Tensor& grad_y, const PoolGeometry& g) {
  const std::vector<double> gy = grad_y.to_vector_f64();
  const int64_t planes = g.n * g.c;
  std::vector<double> gx(size_t(planes * g.h * g.w), 0.0);
  for (int64_t p = 0; p < planes; ++p)
    for (int64_t oy = 0; oy < g.oh; ++oy)
      for (int64_t ox = 0; ox < g.ow; ++ox) {
        const AvgWindow win = avg_window(g, oy, ox);
        const double share = gy[size_t((p * g.oh + oy) * g.ow + ox)] / double(win.divisor);
        for (int64_t iy = win.y0; iy < win.y1; ++iy)
          for (int64_t ix = win.x0; ix < win.x1; ++ix) gx[size_t((p * g.h + iy) * g.w + ix)] += share;
      }
  return Tensor::from_vector(gx, {g.n, g.c, g.h, g.w}, grad_y.dtype());
}

}  // namespace mixprec::kernels::ref
