// The helpers of cpu/conv_paths.cpp that the convolution paths share: the flipped, transposed
// weight of the input gradient as a forward convolution, element for element against its
// definition (kernels of 1 to 31 taps: the VPERMW road on hosts with AVX-512BW, the scalar loop
// elsewhere).
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "conv_test_util.h"
#include "kernels/cpu/dnnl_conv.h"

namespace mixprec {
namespace {

TEST(ConvPaths, FlippedTransposedReversesEveryKernel) {
  struct Case {
    int64_t oc, c, kh, kw;
  };
  for (const Case k : {Case{3, 5, 1, 1}, Case{7, 4, 3, 3}, Case{33, 17, 5, 3}, Case{2, 3, 5, 5}, Case{4, 2, 1, 31}}) {
    SCOPED_TRACE(std::to_string(k.oc) + "x" + std::to_string(k.c) + "x" + std::to_string(k.kh) + "x" +
                 std::to_string(k.kw));
    Generator gen(51);
    const Tensor w = convtest::rand(gen, {k.oc, k.c, k.kh, k.kw}, DType::bf16);
    kernels::ConvGeometry g{
        .n = 1, .c = k.c, .h = k.kh, .w = k.kw, .oc = k.oc, .kh = k.kh, .kw = k.kw, .oh = 1, .ow = 1};
    const Tensor f = kernels::cpu::flipped_transposed(w, g);
    ASSERT_EQ(f.shape(), (Shape{k.c, k.oc, k.kh, k.kw}));
    const auto* s = static_cast<const uint16_t*>(w.data_ptr());
    const auto* d = static_cast<const uint16_t*>(f.data_ptr());
    const int64_t taps = k.kh * k.kw;
    int64_t wrong = 0;
    for (int64_t i = 0; i < k.c; ++i)
      for (int64_t o = 0; o < k.oc; ++o)
        for (int64_t t = 0; t < taps; ++t)
          wrong += d[(i * k.oc + o) * taps + t] != s[(o * k.c + i) * taps + taps - 1 - t];
    EXPECT_EQ(wrong, 0);
  }
}

}  // namespace
}  // namespace mixprec
