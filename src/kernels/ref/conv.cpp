// Reference 2-d convolution: direct loops over NCHW activations and OIHW weights, in f64 whatever
// the storage dtype (rounded once on store). The oracle for the oneDNN path and the f64 fallback.
#include <algorithm>
#include <cmath>

#include "kernels/conv.h"
#include "kernels/pool_window.h"
#include "kernels/ref/access.h"

namespace mixprec::kernels::ref {
namespace {

// Flat f64 copies of the operands; the result is rounded to `dtype` once.
std::vector<double> values(const Tensor& t) { return t.defined() ? t.to_vector_f64() : std::vector<double>{}; }
Tensor from_values(const std::vector<double>& v, const Shape& shape, DType dtype) {
  return Tensor::from_vector(v, shape, dtype);
}

// Calls f(n, o, ci, c, oy, ox, iy, ix, ky, kx) for every product term of the convolution: output
// (n, o, oy, ox) takes x(n, c, iy, ix) * w(o, ci, ky, kx).
template <class F>
void for_each_term(const ConvGeometry& g, F&& f) {
  const int64_t cg = g.c / g.groups, ocg = g.oc / g.groups;
  for (int64_t n = 0; n < g.n; ++n)
    for (int64_t o = 0; o < g.oc; ++o) {
      const int64_t grp = o / ocg;
      for (int64_t oy = 0; oy < g.oh; ++oy)
        for (int64_t ox = 0; ox < g.ow; ++ox)
          for (int64_t ci = 0; ci < cg; ++ci)
            for_each_tap(g, oy, ox, [&](int64_t ky, int64_t kx, int64_t iy, int64_t ix) {
              f(n, o, ci, grp * cg + ci, oy, ox, iy, ix, ky, kx);
            });
    }
}

}  // namespace

Tensor conv2d_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const ConvGeometry& g, bool relu) {
  const std::vector<double> xv = values(x), wv = values(weight), bv = values(bias);
  std::vector<double> y(size_t(shape_numel(g.y_shape())), 0.0);
  const int64_t cg = g.c / g.groups;
  for_each_term(g, [&](int64_t n, int64_t o, int64_t ci, int64_t c, int64_t oy, int64_t ox, int64_t iy, int64_t ix,
                       int64_t ky, int64_t kx) {
    y[size_t(((n * g.oc + o) * g.oh + oy) * g.ow + ox)] +=
        xv[size_t(((n * g.c + c) * g.h + iy) * g.w + ix)] * wv[size_t(((o * cg + ci) * g.kh + ky) * g.kw + kx)];
  });
  const int64_t plane = g.oh * g.ow;
  for (size_t i = 0; i < y.size(); ++i) {
    if (!bv.empty()) y[i] += bv[size_t(int64_t(i) / plane % g.oc)];
    if (relu && y[i] < 0) y[i] = 0;  // NaN stays NaN
  }
  return from_values(y, g.y_shape(), x.dtype());
}

ConvGrads conv2d_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight, const ConvGeometry& g,
                          bool need_x, bool need_weight, bool need_bias, DType bias_dtype, DType weight_dtype) {
  const std::vector<double> gy = values(grad_y), xv = need_weight ? values(x) : std::vector<double>{},
                            wv = need_x ? values(weight) : std::vector<double>{};
  std::vector<double> gx(need_x ? size_t(shape_numel(g.x_shape())) : 0, 0.0);
  std::vector<double> gw(need_weight ? size_t(shape_numel(g.w_shape())) : 0, 0.0);
  const int64_t cg = g.c / g.groups;
  if (need_x || need_weight)
    for_each_term(g, [&](int64_t n, int64_t o, int64_t ci, int64_t c, int64_t oy, int64_t ox, int64_t iy, int64_t ix,
                         int64_t ky, int64_t kx) {
      const size_t xi = size_t(((n * g.c + c) * g.h + iy) * g.w + ix),
                   wi = size_t(((o * cg + ci) * g.kh + ky) * g.kw + kx);
      const double dy = gy[size_t(((n * g.oc + o) * g.oh + oy) * g.ow + ox)];
      if (need_x) gx[xi] += dy * wv[wi];
      if (need_weight) gw[wi] += dy * xv[xi];
    });
  ConvGrads out;
  if (need_x) out.x = from_values(gx, g.x_shape(), grad_y.dtype());
  if (need_weight) out.weight = from_values(gw, g.w_shape(), weight_dtype);
  if (need_bias) {
    std::vector<double> gb(size_t(g.oc), 0.0);
    const int64_t plane = g.oh * g.ow;
    for (size_t i = 0; i < gy.size(); ++i) gb[size_t(int64_t(i) / plane % g.oc)] += gy[i];
    out.bias = from_values(gb, {g.oc}, bias_dtype);
  }
  return out;
}

}  // namespace mixprec::kernels::ref
