// Fast vs reference for every op of ops.def (the cases of op_cases.h), in f32, bf16 and f16,
// forward and backward: each case runs once on the reference backend and once on the backend
// under test with the same inputs and output gradient, and every output and input gradient must
// agree within a bound derived from the dtype and the case's reduction length k:
//   |fast - ref| <= 2 ulp_t(ref) + (k + 2) u32 S + rounds * ulp_t(S)
// with u32 = 2^-24 (both backends accumulate in f32 or wider), S the largest |ref| of that
// tensor (the scale of its terms), and `rounds` the values inside the op whose last bit may
// differ between backends (op_cases.h). The backend is a parameter: the CUDA backend of the next
// issue joins the list below.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <tuple>

#include "kernels/backend.h"
#include "op_cases.h"
#include "ulp.h"

namespace mixprec::testing {
namespace {

constexpr double kU32 = 0x1p-24;

struct Outcome {
  std::vector<Tensor> tensors;  // output, then each input's gradient (undefined for constants)
};

// The output gradient comes from a generator seeded with `seed`: the same on every backend.
Outcome run(const OpCase& c, const In& inputs, uint64_t seed, kernels::Backend b) {
  const kernels::BackendGuard guard(b);
  In leaves;
  for (const Tensor& t : inputs) leaves.push_back(t.requires_grad() ? t.detach().set_requires_grad() : t);
  Tensor y = c.f(leaves);
  Generator g(seed);
  y.backward(nonzero_values(y.shape(), y.dtype(), false, g));
  Outcome r{{y.detach()}};
  for (const Tensor& l : leaves) r.tensors.push_back(l.requires_grad() ? l.grad() : Tensor());
  return r;
}

::testing::AssertionResult agree(const Tensor& fast, const Tensor& ref, int64_t k, int rounds,
                                 const std::string& what) {
  if (!ref.defined())
    return fast.defined() ? ::testing::AssertionFailure() << what << ": fast defined, ref not"
                          : ::testing::AssertionSuccess();
  if (!fast.defined() || fast.dtype() != ref.dtype() || fast.shape() != ref.shape())
    return ::testing::AssertionFailure() << what << ": fast "
                                         << (fast.defined() ? shape_str(fast.shape()) : "undefined") << " vs ref "
                                         << shape_str(ref.shape()) << " " << dtype_name(ref.dtype());
  const std::vector<double> f = fast.to_vector_f64(), r = ref.to_vector_f64();
  double scale = 0;
  for (double v : r) scale = std::max(scale, std::fabs(v));
  const DType t = ref.dtype();
  std::ostringstream msg;
  msg.precision(10);
  int bad = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    const double tol =
        2 * testutil::ulp_of(t, r[i]) + double(k + 2) * kU32 * scale + rounds * testutil::ulp_of(t, scale);
    const bool ok =
        std::isfinite(r[i]) ? std::fabs(f[i] - r[i]) <= tol : (std::isnan(r[i]) ? std::isnan(f[i]) : f[i] == r[i]);
    if (!ok && bad++ < 4) msg << "\n  element " << i << ": fast " << f[i] << " ref " << r[i] << " tol " << tol;
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << bad << " of " << r.size() << " elements differ ("
                                       << dtype_name(t) << " " << shape_str(ref.shape()) << ")" << msg.str();
}

using Param = std::tuple<size_t, kernels::Backend, DType>;  // case index, backend, dtype
class OpBackends : public ::testing::TestWithParam<Param> {};

TEST_P(OpBackends, MatchReferenceForwardAndBackward) {
  const auto [index, backend, dtype] = GetParam();
  const OpCase& c = op_cases()[index];
  Generator g(0xbac0 + index);
  const In inputs = make_inputs(c, g, [dt = dtype](size_t) { return dt; });
  const Outcome ref = run(c, inputs, 0x5eed + index, kernels::Backend::ref);
  const Outcome fast = run(c, inputs, 0x5eed + index, backend);
  for (size_t i = 0; i < ref.tensors.size(); ++i) {
    const std::string what = i == 0 ? "output" : "gradient of input " + std::to_string(i - 1);
    EXPECT_TRUE(agree(fast.tensors[i], ref.tensors[i], c.k, c.rounds, what));
  }
}

std::string backend_name(kernels::Backend b) { return b == kernels::Backend::cpu ? "cpu" : "ref"; }

INSTANTIATE_TEST_SUITE_P(Ops, OpBackends,
                         ::testing::Combine(::testing::Range(size_t(0), op_cases().size()),
                                            ::testing::Values(kernels::Backend::cpu),
                                            ::testing::Values(DType::f32, DType::bf16, DType::f16)),
                         [](const ::testing::TestParamInfo<Param>& p) {
                           const OpCase& c = op_cases()[std::get<0>(p.param)];
                           return c.op + "_" + c.variant + "_" + backend_name(std::get<1>(p.param)) + "_" +
                                  std::string(dtype_name(std::get<2>(p.param)));
                         });

}  // namespace

std::set<std::string> backend_driver_ops() {
  std::set<std::string> ops;
  for (const OpCase& c : op_cases()) ops.insert(c.op);
  return ops;
}

}  // namespace mixprec::testing
