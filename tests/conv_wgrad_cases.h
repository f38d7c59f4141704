// What the weight-gradient path tests share (test_conv_wgrad.cpp: the matmuls per tap;
// test_conv_wgrad_amx.cpp: the AMX kernel): a stride-1 case and its geometry, the f64 reference's
// gradient, and the implementation the profile names for a layer's backward through ops::conv2d.
#pragma once
#include <string>
#include <vector>

#include "conv_test_util.h"
#include "kernels/conv.h"
#include "mixprec/ops.h"
#include "mixprec/profile.h"

namespace mixprec::wgradtest {

struct WgradCase {
  std::string name;
  Shape x, w;
  int64_t pad_h, pad_w;
};

// The geometries every weight-gradient path must hold: padding on both sides, on one axis, none;
// 1x1, 3x3 and 5x3 kernels; odd sizes; one image. Each test file adds its own chunked cases.
inline std::vector<WgradCase> stride1_cases() {
  return {
      {"3x3_pad1", {4, 16, 12, 12}, {32, 16, 3, 3}, 1, 1},
      {"3x3_no_pad_one_image", {1, 24, 7, 9}, {20, 24, 3, 3}, 0, 0},
      {"5x3_pad_2x0_odd", {17, 6, 9, 8}, {10, 6, 5, 3}, 2, 0},
      {"5x3_pad_1x1", {3, 8, 11, 5}, {12, 8, 5, 3}, 1, 1},
      {"1x1", {2, 32, 7, 7}, {48, 32, 1, 1}, 0, 0},
  };
}

inline kernels::ConvGeometry geometry_of(const WgradCase& c, int64_t stride = 1) {
  kernels::ConvGeometry g{.n = c.x[0], .c = c.x[1], .h = c.x[2], .w = c.x[3], .oc = c.w[0], .kh = c.w[2], .kw = c.w[3]};
  g.pad_h = c.pad_h, g.pad_w = c.pad_w;
  g.oh = (g.h + 2 * c.pad_h - g.kh) / stride + 1;
  g.ow = (g.w + 2 * c.pad_w - g.kw) / stride + 1;
  return g;
}

// The weight gradient of conv2d(x, w) for grad_y gy on the reference backend, in x's dtype.
inline Tensor reference_wgrad(const Tensor& x, const Tensor& w, const Tensor& gy, const WgradCase& c) {
  convtest::BackendGuard guard(kernels::Backend::ref);
  Tensor wl = w.clone().set_requires_grad();
  ops::conv2d(x, wl, Tensor(), {.padding = {c.pad_h, c.pad_w}}).backward(gy);
  return wl.grad();
}

// The implementation the profile names for the layer's conv2d_backward on the CPU backend.
inline std::string backward_impl(const WgradCase& c, DType t, uint64_t seed, int64_t stride = 1) {
  convtest::BackendGuard guard(kernels::Backend::cpu);
  Generator gen(seed);
  const kernels::ConvGeometry g = geometry_of(c, stride);
  const Tensor x = convtest::rand(gen, c.x, t);
  Tensor w = convtest::rand(gen, c.w, t, -0.5, 0.5).set_requires_grad();
  const Tensor gy = convtest::rand(gen, {g.n, g.oc, g.oh, g.ow}, t);
  profile::start();
  ops::conv2d(x, w, Tensor(), {.stride = stride, .padding = {c.pad_h, c.pad_w}}).backward(gy);
  profile::stop();
  std::string impl;
  for (const auto& r : profile::rows())
    if (r.kernel == "conv2d_backward") impl = r.impl;
  return impl;
}

}  // namespace mixprec::wgradtest
