// The op-case table of the table-driven drivers (test_op_backends.cpp: fast vs reference;
// test_op_autocast.cpp: autocast classes): at least one case per op of src/ops/ops.def, each
// with its inputs described (shape, sign, targets) so a driver can make them in any dtypes.
// test_op_coverage.cpp fails when an op in ops.def has no case in some driver.
#pragma once
#include <gtest/gtest.h>

#include <functional>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "mixprec/random.h"
#include "mixprec/tensor.h"
#include "within_bound.h"

namespace mixprec {
// gtest names a failing parameter with these, not its bytes.
inline void PrintTo(DType t, std::ostream* os) { *os << dtype_name(t); }
inline void PrintTo(const Device& d, std::ostream* os) { *os << d.str(); }
namespace kernels {
inline void PrintTo(Backend b, std::ostream* os) { *os << (b == Backend::cpu ? "cpu" : "ref"); }
}  // namespace kernels
}  // namespace mixprec

namespace mixprec::testing {

using In = std::vector<Tensor>;

struct InputSpec {
  enum class Kind { any_sign, positive, targets, constant };
  Shape shape;
  Kind kind = Kind::any_sign;
  int64_t classes = 0;       // targets: i64 class indices in [0, classes)
  int64_t ignore_every = 0;  // targets: when > 0, every such one (from the second) is -100 (ignore_index)
};

struct OpCase {
  std::string op;       // the ops.def name this case covers
  std::string variant;  // test-name suffix
  std::vector<InputSpec> inputs;
  std::function<Tensor(const In&)> f;
  // The most terms one element of the output or of a gradient sums (1 for element-wise ops).
  int64_t k = 1;
  // Values inside the op that may differ by about an ulp of the dtype between backends: roundings
  // of intermediates (composite ops), saved forward results the backward reads (softmax's y), or
  // a fast kernel's polynomial in place of libm's function (silu, sigmoid, tanh).
  int rounds = 0;
};

const std::vector<OpCase>& op_cases();

// Values of magnitude in [0.25, 2] (never zero), of random sign unless `positive`, in dtype t.
Tensor nonzero_values(const Shape& shape, DType t, bool positive, Generator& g);

// Inputs for c: floating ones are leaves in dtype_of(i) that require grad (except `constant`),
// magnitudes in [0.25, 2] (never zero), random sign unless `positive`; targets are i64.
In make_inputs(const OpCase& c, Generator& g, const std::function<DType(size_t)>& dtype_of);

// One run of a case: its output, then each input's gradient (undefined for constants).
struct Outcome {
  std::vector<Tensor> tensors;
};
// Runs c forward and backward on backend b, with the inputs (host tensors) moved to `device`
// first and the output gradient drawn on the host from a generator seeded with `seed`: the
// same on every backend and device. The outcome stays on `device`.
Outcome run_case(const OpCase& c, const In& inputs, uint64_t seed, kernels::Backend b,
                 const Device& device = Device::cpu());

// The ops each driver has cases for (test_op_coverage.cpp checks them against ops.def).
std::set<std::string> gradcheck_ops();
std::set<std::string> backend_driver_ops();
std::set<std::string> autocast_driver_ops();

}  // namespace mixprec::testing
