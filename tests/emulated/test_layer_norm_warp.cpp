// Layer norm's warp-a-row kernels (src/kernels/cuda/layer_norm_warp.cuh) on the CPU under
// cuda_shim.h, against the f64 reference kernels with the bound the GPU test of norm.cu uses
// (tests/test_cuda_lib.cpp, CudaNorm): y, mean, rstd and x̂ forward; grad_x and the weight and bias
// gradients backward, from x and mean and from x̂ alone, with and without weight and bias, in f32,
// bf16 and f16, on widths at every columns-per-lane step (1 to 2048 forward, to 1024 backward) and
// on rows that leave a block's last warps and a block's last rows idle. The weight and bias
// gradients' pass 2 (norm.cu: the blocks' partials added in f64 in block order) is done here by
// the test in the same order. What this cannot show: the GPU's speed.
#include "cuda_shim.h"  // first: the CUDA keywords the kernel header uses

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kernels/cuda/layer_norm_warp.cuh"
#include "kernels/norm.h"
#include "mixprec/random.h"
#include "tensor_bytes.h"  // tests/
#include "within_bound.h"  // tests/

namespace mixprec::testing {
namespace {

namespace lw = kernels::cuda::ln_warp;

struct Case {
  int64_t rows, cols;
};

// The launches' shared memory (cuda_shim.h fills it before each block; the kernels use none of it).
alignas(16) unsigned char shared_memory[emulated::kSharedBytes];

template <class T>
T* data(const Tensor& t) {
  return t.defined() ? static_cast<T*>(t.data_ptr()) : nullptr;
}

// Forward in T (x̂ in bf16 when `with_xhat`), against the reference.
template <class T, int kPerLane>
void check_forward(const Case& c, DType t, bool affine, bool with_xhat, Generator& gen) {
  SCOPED_TRACE(std::string(dtype_name(t)) + " " + std::to_string(c.rows) + "x" + std::to_string(c.cols) +
               (affine ? " affine" : "") + (with_xhat ? " xhat" : ""));
  const Tensor x = Tensor::uniform({c.rows, c.cols}, gen, -3, 5, DType::f64).to(t);
  const Tensor w = affine ? Tensor::uniform({c.cols}, gen, -2, 2) : Tensor();
  const Tensor b = affine ? Tensor::uniform({c.cols}, gen, -1, 1) : Tensor();
  Tensor mean_ref, rstd_ref;
  const Tensor xhat_ref = with_xhat ? Tensor::empty({c.rows, c.cols}, DType::bf16) : Tensor();
  const Tensor y_ref = kernels::ref::layer_norm_forward(x, w, b, 1e-5, mean_ref, rstd_ref, xhat_ref);
  Tensor y = Tensor::empty({c.rows, c.cols}, t), mean = Tensor::empty({c.rows}), rstd = Tensor::empty({c.rows});
  const Tensor xhat = with_xhat ? Tensor::empty({c.rows, c.cols}, DType::bf16) : Tensor();
  const unsigned blocks = unsigned((c.rows + lw::kWarps - 1) / lw::kWarps);
  emulated::launch(blocks, 1, lw::kThreads, shared_memory, 0, [&] {
    lw::forward_kernel<T, T, bf16_t, kPerLane>(data<T>(x), c.rows, int(c.cols), 1e-5, data<float>(w), data<float>(b),
                                               data<T>(y), data<float>(mean), data<float>(rstd), data<bf16_t>(xhat));
  });
  EXPECT_TRUE(agree_within_bound(y, y_ref, 2 * c.cols, 2, "y"));
  EXPECT_TRUE(agree_within_bound(mean, mean_ref, c.cols, 0, "mean"));
  EXPECT_TRUE(agree_within_bound(rstd, rstd_ref, 2 * c.cols, 1, "rstd"));
  if (with_xhat) {
    EXPECT_TRUE(agree_within_bound(xhat, xhat_ref, 2 * c.cols, 2, "xhat"));
  }
}

// Backward in T from x and the reference's mean and rstd (or from x̂ and rstd alone), in blocks of
// rows_per_block rows, against the reference.
template <class T, int kPerLane>
void check_backward(const Case& c, DType t, bool affine, bool from_xhat, int64_t rows_per_block, Generator& gen) {
  SCOPED_TRACE(std::string(dtype_name(t)) + " " + std::to_string(c.rows) + "x" + std::to_string(c.cols) +
               (affine ? " affine" : "") + (from_xhat ? " from xhat" : "") + ", " + std::to_string(rows_per_block) +
               " rows a block");
  const Tensor x0 = Tensor::uniform({c.rows, c.cols}, gen, -3, 5, DType::f64).to(t);
  const Tensor gy = Tensor::uniform({c.rows, c.cols}, gen, -1, 1, DType::f64).to(t);
  const Tensor w = affine ? Tensor::uniform({c.cols}, gen, -2, 2) : Tensor();
  Tensor mean, rstd;
  const Tensor xh = Tensor::empty({c.rows, c.cols}, t);
  (void)kernels::ref::layer_norm_forward(x0, w, Tensor(), 1e-5, mean, rstd, xh);
  const Tensor x = from_xhat ? xh : x0, m = from_xhat ? Tensor() : mean;
  const kernels::NormGrads want = kernels::ref::layer_norm_backward(gy, x, m, rstd, w, true, true, true);
  const int64_t blocks = (c.rows + rows_per_block - 1) / rows_per_block;
  Tensor gx = Tensor::empty({c.rows, c.cols}, t), part = Tensor::empty({2, blocks, c.cols});
  float* pw = data<float>(part);
  emulated::launch(unsigned(blocks), 1, lw::kThreads, shared_memory, 0, [&] {
    lw::backward_kernel<T, T, T, kPerLane>(data<T>(gy), data<T>(x), c.rows, int(c.cols), rows_per_block, data<float>(m),
                                           data<float>(rstd), data<float>(w), data<T>(gx), pw, pw + blocks * c.cols);
  });
  // norm.cu's pass 2: the blocks' partials in block order, in f64.
  std::vector<double> gw(size_t(c.cols), 0.0), gb(size_t(c.cols), 0.0);
  for (int64_t k = 0; k < blocks; ++k)
    for (int64_t j = 0; j < c.cols; ++j) {
      gw[size_t(j)] += double(pw[k * c.cols + j]);
      gb[size_t(j)] += double(pw[(blocks + k) * c.cols + j]);
    }
  EXPECT_TRUE(agree_within_bound(gx, want.x, 2 * c.cols, 2, "grad x"));
  EXPECT_TRUE(
      agree_within_bound(Tensor::from_vector(gw, {c.cols}, DType::f32), want.weight, 2 * c.rows, 1, "grad weight"));
  EXPECT_TRUE(agree_within_bound(Tensor::from_vector(gb, {c.cols}, DType::f32), want.bias, c.rows, 0, "grad bias"));
}

template <class F>
void with_type(DType t, F&& f) {
  if (t == DType::f32) f(float{});
  if (t == DType::bf16) f(bf16_t{});
  if (t == DType::f16) f(f16_t{});
}
TEST(EmulatedLayerNormWarp, ColumnsPerLane) {
  EXPECT_EQ(lw::per_lane(0, lw::kMaxColsForward), 0);
  EXPECT_EQ(lw::per_lane(1, lw::kMaxColsForward), 4);
  EXPECT_EQ(lw::per_lane(128, lw::kMaxColsForward), 4);
  EXPECT_EQ(lw::per_lane(129, lw::kMaxColsForward), 8);
  EXPECT_EQ(lw::per_lane(768, lw::kMaxColsForward), 32);
  EXPECT_EQ(lw::per_lane(2048, lw::kMaxColsForward), 64);
  EXPECT_EQ(lw::per_lane(2049, lw::kMaxColsForward), 0);
  EXPECT_EQ(lw::per_lane(1024, lw::kMaxColsBackward), 32);
  EXPECT_EQ(lw::per_lane(1025, lw::kMaxColsBackward), 0);
}

// Rows: 1; 5 (a block's last three warps idle); 9; 13. Widths: 1, 7, 128 (4 a lane, whole), 129
// (8, one column in the last step), 500, 768 (GPT-2's), 2048 forward only.
TEST(EmulatedLayerNormWarp, ForwardMatchesTheReference) {
  Generator gen(0x1a7);
  for (const Case& c : {Case{1, 1}, Case{5, 7}, Case{9, 128}, Case{6, 129}, Case{5, 500}, Case{13, 768}, Case{3, 2048}})
    for (DType t : {DType::f32, DType::bf16, DType::f16})
      for (int variant = 0; variant < 3; ++variant)
        with_type(t, [&](auto tag) {
          lw::with_per_lane<lw::kMaxColsForward>(c.cols, [&](auto k) {
            check_forward<decltype(tag), decltype(k)::value>(c, t, variant != 1, variant == 2, gen);
          });
        });
}

// Blocks of 4, 8 and 12 rows (norm.cu's multiples of the warps), and of 6: whole blocks, a last
// block of fewer rows than warps, warps whose last row lies past their block's.
TEST(EmulatedLayerNormWarp, BackwardMatchesTheReference) {
  Generator gen(0x1a8);
  for (const Case& c : {Case{1, 1}, Case{5, 7}, Case{9, 129}, Case{14, 768}, Case{6, 1024}})
    for (DType t : {DType::f32, DType::bf16, DType::f16})
      for (int variant = 0; variant < 3; ++variant)
        for (int64_t rows_per_block : {4, 6, 8, 12})
          with_type(t, [&](auto tag) {
            lw::with_per_lane<lw::kMaxColsBackward>(c.cols, [&](auto k) {
              check_backward<decltype(tag), decltype(k)::value>(c, t, variant != 1, variant == 2, rows_per_block, gen);
            });
          });
}

// Autocast's dtypes: a 16-bit y over an f32 x (what a pre-norm's Linear reads) has the bits of the
// f32 y rounded once; the backward from a 16-bit x̂ with a 16-bit or f32 gy into an f32 grad_x has
// the bits of the f32 kernel run on the operands widened (exact), grad_x and the partial sums.
template <class Y, int kPerLane>
void check_forward_16bit_y(const Case& c, DType yt, Generator& gen) {
  SCOPED_TRACE(std::string("f32 x, y ") + std::string(dtype_name(yt)) + " " + std::to_string(c.rows) + "x" +
               std::to_string(c.cols));
  const Tensor x = Tensor::uniform({c.rows, c.cols}, gen, -3, 5);
  const Tensor w = Tensor::uniform({c.cols}, gen, -2, 2), b = Tensor::uniform({c.cols}, gen, -1, 1);
  Tensor y32 = Tensor::empty({c.rows, c.cols}), y = Tensor::empty({c.rows, c.cols}, yt);
  Tensor m32 = Tensor::empty({c.rows}), r32 = Tensor::empty({c.rows}), m = Tensor::empty({c.rows}),
         r = Tensor::empty({c.rows});
  const Tensor xh32 = Tensor::empty({c.rows, c.cols}, DType::bf16), xh = Tensor::empty({c.rows, c.cols}, DType::bf16);
  const unsigned blocks = unsigned((c.rows + lw::kWarps - 1) / lw::kWarps);
  emulated::launch(blocks, 1, lw::kThreads, shared_memory, 0, [&] {
    lw::forward_kernel<float, float, bf16_t, kPerLane>(data<float>(x), c.rows, int(c.cols), 1e-5, data<float>(w),
                                                       data<float>(b), data<float>(y32), data<float>(m32),
                                                       data<float>(r32), data<bf16_t>(xh32));
  });
  emulated::launch(blocks, 1, lw::kThreads, shared_memory, 0, [&] {
    lw::forward_kernel<float, Y, bf16_t, kPerLane>(data<float>(x), c.rows, int(c.cols), 1e-5, data<float>(w),
                                                   data<float>(b), data<Y>(y), data<float>(m), data<float>(r),
                                                   data<bf16_t>(xh));
  });
  EXPECT_EQ(testutil::bytes_of(y), testutil::bytes_of(y32.to(yt))) << "y: the f32 y rounded once";
  EXPECT_EQ(testutil::bytes_of(m), testutil::bytes_of(m32)) << "mean";
  EXPECT_EQ(testutil::bytes_of(r), testutil::bytes_of(r32)) << "rstd";
  EXPECT_EQ(testutil::bytes_of(xh), testutil::bytes_of(xh32)) << "xhat";
}

template <class G, class X, int kPerLane>
void check_backward_mixed(const Case& c, DType gt, DType xt, Generator& gen) {
  SCOPED_TRACE(std::string("gy ") + std::string(dtype_name(gt)) + ", x̂ " + std::string(dtype_name(xt)) + " " +
               std::to_string(c.rows) + "x" + std::to_string(c.cols));
  const Tensor gy = Tensor::uniform({c.rows, c.cols}, gen, -1, 1).to(gt);
  const Tensor xh = Tensor::uniform({c.rows, c.cols}, gen, -3, 3).to(xt);
  const Tensor w = Tensor::uniform({c.cols}, gen, -2, 2), rstd = Tensor::uniform({c.rows}, gen, 0.5, 2);
  const Tensor gy32 = gy.to(DType::f32), xh32 = xh.to(DType::f32);
  const int64_t rows_per_block = 8, blocks = (c.rows + rows_per_block - 1) / rows_per_block;
  Tensor gx = Tensor::empty({c.rows, c.cols}), gx32 = Tensor::empty({c.rows, c.cols});
  Tensor part = Tensor::empty({2, blocks, c.cols}), part32 = Tensor::empty({2, blocks, c.cols});
  emulated::launch(unsigned(blocks), 1, lw::kThreads, shared_memory, 0, [&] {
    lw::backward_kernel<float, float, float, kPerLane>(
        data<float>(gy32), data<float>(xh32), c.rows, int(c.cols), rows_per_block, nullptr, data<float>(rstd),
        data<float>(w), data<float>(gx32), data<float>(part32), data<float>(part32) + blocks * c.cols);
  });
  emulated::launch(unsigned(blocks), 1, lw::kThreads, shared_memory, 0, [&] {
    lw::backward_kernel<G, X, float, kPerLane>(data<G>(gy), data<X>(xh), c.rows, int(c.cols), rows_per_block, nullptr,
                                               data<float>(rstd), data<float>(w), data<float>(gx), data<float>(part),
                                               data<float>(part) + blocks * c.cols);
  });
  EXPECT_EQ(testutil::bytes_of(gx), testutil::bytes_of(gx32)) << "grad x";
  EXPECT_EQ(testutil::bytes_of(part), testutil::bytes_of(part32)) << "weight and bias partial sums";
}

TEST(EmulatedLayerNormWarp, AutocastDtypesGiveTheF32KernelsBits) {
  Generator gen(0x1a9);
  for (const Case& c : {Case{5, 7}, Case{9, 128}, Case{13, 768}, Case{3, 2048}}) {
    lw::with_per_lane<lw::kMaxColsForward>(c.cols, [&](auto k) {
      check_forward_16bit_y<bf16_t, decltype(k)::value>(c, DType::bf16, gen);
      check_forward_16bit_y<f16_t, decltype(k)::value>(c, DType::f16, gen);
    });
    lw::with_per_lane<lw::kMaxColsBackward>(c.cols, [&](auto k) {
      check_backward_mixed<bf16_t, bf16_t, decltype(k)::value>(c, DType::bf16, DType::bf16, gen);
      check_backward_mixed<float, bf16_t, decltype(k)::value>(c, DType::f32, DType::bf16, gen);
      check_backward_mixed<f16_t, f16_t, decltype(k)::value>(c, DType::f16, DType::f16, gen);
      check_backward_mixed<float, f16_t, decltype(k)::value>(c, DType::f32, DType::f16, gen);
    });
  }
}

}  // namespace
}  // namespace mixprec::testing
