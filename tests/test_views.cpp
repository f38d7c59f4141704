// reshape as a view wherever the strides allow (ATen's rule), and the element-wise binary ops on
// a mixed-dtype pair without a widened copy: values, gradients and bytes, fast against reference.
#include <gtest/gtest.h>

#include <string>

#include "conv_test_util.h"
#include "kernels/binary.h"
#include "mixprec/allocator.h"
#include "mixprec/autocast.h"
#include "mixprec/ops.h"

namespace mixprec {
namespace {

using convtest::BackendGuard;

TEST(ReshapeView, ASliceSplitAlongAWholeDimensionIsAView) {
  Generator g(31);
  const Tensor x = Tensor::randn({2, 3, 12}, g).set_requires_grad();
  // q/k/v of a fused projection: the last dim's thirds, each split into heads.
  const Tensor s = x.slice(2, 4, 8);
  const Tensor v = s.reshape({2, 3, 2, 2});
  EXPECT_EQ(v.storage(), x.storage()) << "a view, not a copy";
  EXPECT_EQ(v.strides(), (Shape{36, 12, 2, 1}));
  EXPECT_EQ(v.to_vector(), s.contiguous().reshape({2, 3, 2, 2}).to_vector());
  // Merging dimensions the slice does not keep contiguous needs a copy.
  const Tensor c = s.reshape({24});
  EXPECT_NE(c.storage(), x.storage());
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_EQ(c.to_vector(), s.contiguous().reshape({24}).to_vector());
  // A transpose merged back: a copy; split along its own dims with size-1 dims: a view.
  const Tensor t = x.transpose(0, 1);
  EXPECT_NE(t.reshape({6, 12}).storage(), x.storage());
  EXPECT_EQ(t.reshape({3, 1, 2, 1, 12}).storage(), x.storage());
  // Gradients through the view land on the slice's elements only.
  const Tensor w = Tensor::randn({2, 3, 2, 2}, g);
  ops::sum(ops::mul(v, w)).backward();
  const std::vector<float> gx = x.grad().to_vector(), wv = w.to_vector();
  for (int64_t i = 0; i < 6; ++i)
    for (int64_t j = 0; j < 12; ++j) {
      const float want = j >= 4 && j < 8 ? wv[size_t(i * 4 + (j - 4))] : 0.f;
      EXPECT_EQ(gx[size_t(i * 12 + j)], want) << i << "," << j;
    }
}

// A mixed pair computes as if the narrower operand were widened first (exact), in the fast kernel
// (which reads each operand in its own dtype) and the reference alike, bit for bit; the result is
// in the promoted dtype and each gradient in its input's dtype.
TEST(MixedBinary, EqualsWideningFirstBitForBitFastAndReference) {
  Generator g(32);
  for (DType narrow : {DType::bf16, DType::f16})
    for (kernels::BinaryOp op :
         {kernels::BinaryOp::add, kernels::BinaryOp::sub, kernels::BinaryOp::mul, kernels::BinaryOp::div})
      for (const Shape& bs : {Shape{5, 7, 16}, Shape{16}}) {  // same shape, and a broadcast row
        SCOPED_TRACE(std::string(dtype_name(narrow)) + " op " + std::to_string(int(op)) + " " + shape_str(bs));
        const Tensor a = convtest::rand(g, {5, 7, 16}, DType::f32, 0.5, 2);
        const Tensor b = convtest::rand(g, bs, narrow, 0.5, 2);
        const Tensor want = kernels::ref::binary(op, a, b.to(DType::f32));
        for (kernels::Backend be : {kernels::Backend::ref, kernels::Backend::cpu}) {
          BackendGuard guard(be);
          const Tensor ab = kernels::binary(op, a, b), ba = kernels::binary(op, b.to(DType::f32), a);
          EXPECT_EQ(ab.dtype(), DType::f32);
          EXPECT_EQ(ab.to_vector(), want.to_vector());
          EXPECT_EQ(kernels::binary(op, b, a).to_vector(), ba.to_vector());
        }
      }
}

TEST(MixedBinary, ResidualAddKeepsNoWidenedCopyAndGivesEachInputItsDtype) {
  Generator g(33);
  const Tensor x = Tensor::randn({64, 128}, g).set_requires_grad();                  // f32 stream
  const Tensor y = Tensor::randn({64, 128}, g).to(DType::bf16).set_requires_grad();  // a 16-bit branch
  const int64_t before = allocator::stats().live_total;
  allocator::reset_peak();
  Tensor out;
  {
    amp::Autocast ac(DType::bf16);
    out = ops::add(x, y);
  }
  EXPECT_EQ(out.dtype(), DType::f32);
  EXPECT_EQ(allocator::stats().peak_total - before, int64_t(out.nbytes())) << "only the result was allocated";
  EXPECT_EQ(out.to_vector(), ops::add(x.detach(), y.detach().to(DType::f32)).to_vector());
  ops::sum(out).backward();
  EXPECT_EQ(x.grad().dtype(), DType::f32);
  EXPECT_EQ(y.grad().dtype(), DType::bf16);
}

}  // namespace
}  // namespace mixprec
