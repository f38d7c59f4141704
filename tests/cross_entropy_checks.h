// cross_entropy's kernels (kernels/loss.h) against the f64 reference with per-element bounds, for
// the CPU's fast kernels (test_cross_entropy.cpp) and the GPU's (test_cuda_kernels.cpp). lse and
// the losses: an f32 sum of C exponentials (each within 2 ulp) and the roundings around it, (C + 8)
// units of f32 plus one of the value, and for a reduced loss that times the rows. The gradient:
// one unit of its dtype for the final rounding, plus the f32 error of e^(x - lse) (lse's and the
// subtraction's, 4 units for exp and the product) times |e^(x - lse) * s|, plus one unit of s for
// the target's subtraction. f64 logits compute in f64: the same bounds hold with room.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernel_checks.h"
#include "kernels/loss.h"

namespace mixprec::testutil {

inline void expect_cross_entropy_near_reference(const Tensor& logits_in, const Tensor& target_in, const Tensor& gy_in,
                                                kernels::LossReduce red, int64_t ignore_index,
                                                const kernels::CrossEntropyResult& got_in, const Tensor& got_dx_in) {
  const Device cpu = Device::cpu();
  const Tensor logits = logits_in.to(cpu), target = target_in.to(cpu), gy = gy_in.to(cpu);
  const Tensor got_lse = got_in.lse.to(cpu), got_loss = got_in.loss.to(cpu), got_dx = got_dx_in.to(cpu);
  kernels::CrossEntropyResult want;
  Tensor want_dx;
  {
    const kernels::BackendGuard ref(kernels::Backend::ref);
    want = kernels::cross_entropy_forward(logits, target, red, ignore_index);
    want_dx = kernels::cross_entropy_backward(gy, logits, want.lse, target, red, ignore_index);
  }
  const double cols = double(logits.size(-1));
  const std::vector<double> lse = want.lse.to_vector_f64(), x = logits.to_vector_f64();
  const std::vector<double> dx = want_dx.to_vector_f64(), loss = want.loss.to_vector_f64();
  const std::vector<int64_t> tg = target.to_vector_i64();
  const double lse_unit = (cols + 8) * kU32;
  auto lse_tol = [&](size_t i) { return lse_unit * (1 + std::fabs(lse[i])); };
  EXPECT_TRUE(close(got_lse, want.lse, lse_tol)) << "lse";
  double max_lse = 0;
  for (double v : lse) max_lse = std::max(max_lse, std::fabs(v));
  const double rows = double(tg.size());
  EXPECT_TRUE(close(got_loss, want.loss, [&](size_t i) {
    const double per_row = lse_unit * (1 + max_lse) + kU32 * (max_lse + std::fabs(loss[i]));
    return red == kernels::LossReduce::none ? per_row : per_row * rows;
  })) << "loss";
  const std::vector<double> gv = gy.to_vector_f64();
  double kept = 0;
  for (int64_t v : tg) kept += v != ignore_index;
  const DType t = logits.dtype();
  EXPECT_TRUE(close(got_dx, want_dx, [&](size_t i) {
    const size_t row = i / size_t(cols);
    if (tg[row] == ignore_index) return 0.0;
    const double s = std::fabs(red == kernels::LossReduce::none   ? gv[row]
                               : red == kernels::LossReduce::mean ? gv[0] / kept
                                                                  : gv[0]);
    const double d = x[i] - lse[row], p = std::exp(d) * s;
    return ulp_of(t, dx[i]) + p * (lse_tol(row) + kU32 * (std::fabs(d) + 4)) + kU32 * s;
  })) << "gradient";
}

}  // namespace mixprec::testutil
