// ops::conv2d_max_pool2d on the CPU: the pool reading the convolution's output in oneDNN's layout
// (cpu/conv_pool.cpp: nChw8c on AVX2 hosts, nChw16c on AVX-512 ones for f32, NHWC for AMX's bf16),
// or a first layer's planes as mixprec's kernel computes them (cpu/conv_first_layer.cpp); a first
// layer's weight gradient reading the pool's gradient routed plane by plane (cpu/conv_small_k.cpp),
// and a wider layer's backward primitives reading it routed into their layout (cpu/conv_pool.cpp,
// max_unpool_to_layout); against the same op with the fusion off (the convolution's output
// reordered into NCHW, then kernels::max_pool2d_forward), bit for bit: the output, and every
// gradient (the argmax routes them). Channel counts that fill blocks of 8 or 16 and leave a partial
// one (20); a 2x2 pool on odd sizes (its own loop) and on even ones (the cnns' case, its own
// unpooling), overlapping, padded, ceil-mode and dilated windows (the general one); random values,
// integer ones (ties everywhere: the first tap must win), integers with noise below a 16-bit ulp
// (ties only once rounded: the values must be rounded before they are compared), and NaNs (a NaN
// wins, the last one).
// nn::Sequential runs Conv2d [, ReLU], MaxPool2d as this op, with the same results as the ops one
// after the other, and names the layer an error is about.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "kernels/activation.h"
#include "kernels/conv.h"
#include "kernels/cpu/dnnl_common.h"
#include "kernels/cpu/dnnl_conv.h"
#include "kernels/pool.h"
#include "mixprec/autocast.h"
#include "mixprec/cpu.h"
#include "mixprec/nn.h"
#include "mixprec/ops.h"
#include "mixprec/profile.h"
#include "tensor_bytes.h"

namespace mixprec {
namespace {

using testutil::bytes_of;

struct Geometry {
  const char* name;
  Shape x;
  int64_t oc;
  ops::Conv2dOptions conv;
  ops::IntPair k;
  ops::Pool2dOptions pool;
};

const std::vector<Geometry>& geometries() {
  static const std::vector<Geometry> g = {
      {"k2_odd_sizes", {2, 16, 13, 11}, 24, {.padding = 1}, 2, {}},
      // The 2x2 pool tiling its input exactly (the cnns' case; its own unpooling into the layout).
      {"k2_even_sizes", {2, 8, 8, 6}, 20, {.padding = 1}, 2, {}},
      {"k3_s2_p1_ceil", {2, 8, 9, 9}, 16, {}, 3, {.stride = 2, .padding = 1, .ceil_mode = true}},
      {"k2_s1_overlapping", {1, 8, 8, 7}, 8, {.padding = 1}, 2, {.stride = 1}},
      {"k2_dilated_after_strided_conv", {2, 12, 10, 10}, 20, {.stride = 2, .padding = 1}, 2, {.dilation = 2}},
      // First layers (1 to 4 input channels), where mixprec's kernel computes them: the pool runs on
      // each image's planes while they are in cache; output channels not a multiple of its four.
      {"first_layer_k2_odd", {3, 1, 11, 10}, 6, {.padding = 1}, 2, {}},
      {"first_layer_k3_s2_p1_ceil", {2, 3, 9, 9}, 5, {.padding = 1}, 3, {.stride = 2, .padding = 1, .ceil_mode = true}},
  };
  return g;
}

enum class Values { random, integers, near_ties, nans };

// x, weight, bias in t: uniform in [-1, 1]; or small integers (many equal sums: ties in the windows);
// or random with a NaN planted in some images' channels.
std::vector<Tensor> operands(const Geometry& g, DType t, Values v) {
  Generator gen(7);
  const Shape ws{g.oc, g.x[1], 3, 3};
  Tensor x = Tensor::uniform(g.x, gen, -1, 1), w = Tensor::uniform(ws, gen, -0.5, 0.5);
  Tensor b = Tensor::uniform({g.oc}, gen, -0.5, 0.5);
  // Integers: x in -2 .. 2, w in -1 .. 1, b in -1 .. 1; for near ties x plus 2^-12 of its value.
  const auto rounded = [](const Tensor& u, float scale, float noise) {
    std::vector<float> h = u.to_vector();
    for (float& e : h) e = std::round(scale * e) + noise * e;
    return Tensor::from_vector(h, u.shape());
  };
  if (v == Values::integers || v == Values::near_ties) {
    // near ties: distinct in f32, equal once rounded to 16 bits
    x = rounded(x, 2, v == Values::near_ties ? std::ldexp(1.0f, -12) : 0.0f);
    w = rounded(w, 2, 0), b = rounded(b, 1, 0);
  }
  x = x.to(t).contiguous();
  if (v == Values::nans) {
    // A NaN input spreads to a 3x3 patch of every output channel: some windows hold one NaN,
    // some several.
    const int64_t plane = g.x[2] * g.x[3];
    std::vector<float> h = x.to_vector();
    h[size_t(3 * g.x[3] + 4)] = std::numeric_limits<float>::quiet_NaN();
    h[size_t((g.x[0] * g.x[1] - 1) * plane + plane / 2)] = std::numeric_limits<float>::quiet_NaN();
    x = Tensor::from_vector(h, g.x, DType::f32).to(t);
  }
  return {x, w.to(t), b.to(t)};
}

struct Result {
  std::vector<uint8_t> y, gx, gw, gb;
  bool fused = false, fused_backward = false;  // whether the pool ran fused with the convolution
};

// The case's first layers take data (no gradient for x), as a network's first layer does: then
// their weight gradient reads the pool's gradient routed plane by plane.
bool is_first(const Geometry& g) { return g.x[1] <= kernels::cpu::kFirstLayerChannels; }

// The op with the fusion on or off, or the two ops it stands for (with a ReLU: on the convolution,
// its mask the full-size output's).
enum class Path { fused, separate, composed };

Result run(const Geometry& g, DType t, Values v, Path path, bool relu) {
  kernels::set_conv_pool_fused(path == Path::fused);
  std::vector<Tensor> in = operands(g, t, v);
  for (size_t i = is_first(g) ? 1 : 0; i < in.size(); ++i) in[i].set_requires_grad(true);
  ops::Conv2dOptions conv = g.conv;
  conv.relu = relu;
  profile::start();
  const Tensor y = path == Path::composed ? ops::max_pool2d(ops::conv2d(in[0], in[1], in[2], conv), g.k, g.pool)
                                          : ops::conv2d_max_pool2d(in[0], in[1], in[2], conv, g.k, g.pool);
  // A gradient of distinct values, so that a winner moved shows in every gradient.
  Generator gen(11);
  const Tensor gy = Tensor::uniform(y.shape(), gen, 0.5, 1.5).to(y.dtype());
  y.backward(gy);
  profile::stop();
  Result r;
  for (const profile::Row& row : profile::rows()) {
    const bool noted = row.impl.find("pool_fused") != std::string::npos;
    r.fused |= row.kernel == "conv2d_max_pool2d_forward" && noted;
    r.fused_backward |= row.kernel == "conv2d_max_pool2d_backward" && noted;
  }
  kernels::set_conv_pool_fused(true);
  r.y = bytes_of(y);
  r.gx = in[0].grad().defined() ? bytes_of(in[0].grad()) : std::vector<uint8_t>{};
  r.gw = bytes_of(in[1].grad());
  r.gb = bytes_of(in[2].grad());
  return r;
}

class ConvPool : public ::testing::TestWithParam<DType> {};

kernels::ConvGeometry conv_geometry(const Geometry& g) {
  kernels::ConvGeometry c;
  c.n = g.x[0], c.c = g.x[1], c.h = g.x[2], c.w = g.x[3], c.oc = g.oc, c.kh = 3, c.kw = 3;
  c.stride_h = g.conv.stride.h, c.stride_w = g.conv.stride.w;
  c.pad_h = g.conv.padding.h, c.pad_w = g.conv.padding.w;
  c.oh = (c.h + 2 * c.pad_h - c.kh) / c.stride_h + 1, c.ow = (c.w + 2 * c.pad_w - c.kw) / c.stride_w + 1;
  return c;
}
// Whether mixprec's first-layer kernel computes g's convolution in t on this host (its forward),
// and its small-K kernel the weight gradient (the backward).
bool first_layer(const Geometry& g, DType t) { return kernels::cpu::first_layer_applies(conv_geometry(g), t); }
bool small_k(const Geometry& g, DType t) { return kernels::cpu::small_k_wgrad(conv_geometry(g), t); }
// Whether a wider layer's backward must read the pool's gradient routed into its primitives' layout:
// on oneDNN's f32 primitives (f32, or a 16-bit layer on the f32 road), where backward-data reads
// grad_y channel-blocked (nChw8c with AVX2, nChw16c with AVX-512) and backward-weights takes it in
// the same layout (split over the batch, or one primitive), not as a forward convolution or as
// matmuls (hosts with a bf16 unit run those).
// On AVX-512 hosts oneDNN runs the backward-weights of a narrow layer (the geometries' 8 and 12
// input channels) with its AVX2 kernel, which reads grad_y in nChw8c where backward-data reads
// nChw16c: one routing cannot serve both, and the backward runs unfused there (both primitives'
// vector width, from the implementations oneDNN names, must agree).
bool layout_backward(const Geometry& g, DType t) {
  const kernels::ConvGeometry c = conv_geometry(g);
  if (is_first(g) || !mixprec::cpu::has_avx2_fma() || !(t == DType::f32 || kernels::cpu::conv_in_f32(c, t)) ||
      kernels::cpu::wgrad_as_forward(c, DType::f32) || kernels::cpu::wgrad_as_gemm(c, DType::f32))
    return false;
  const auto avx512 = [&](kernels::cpu::ConvPass pass) {
    return kernels::cpu::conv_impl_name(c, DType::f32, pass).find("avx512") != std::string::npos;
  };
  return avx512(kernels::cpu::ConvPass::backward_data) == avx512(kernels::cpu::ConvPass::backward_weights);
}

TEST_P(ConvPool, FusedMatchesSeparateBitForBit) {
  const DType t = GetParam();
  int fused_cases = 0, fused_backward_cases = 0, cases = 0;
  for (const Geometry& g : geometries())
    for (Values v : {Values::random, Values::integers, Values::near_ties, Values::nans})
      for (bool relu : {false, true}) {
        SCOPED_TRACE(std::string(g.name) +
                     (v == Values::random      ? " random"
                      : v == Values::integers  ? " ties"
                      : v == Values::near_ties ? " ties once rounded"
                                               : " nan") +
                     (relu ? ", ReLU" : ""));
        const Result fused = run(g, t, v, Path::fused, relu), separate = run(g, t, v, Path::separate, relu);
        if (relu) {  // the mask taken from the pooled output, against the convolution's own
          const Result composed = run(g, t, v, Path::composed, relu);
          EXPECT_EQ(fused.y, composed.y);
          EXPECT_EQ(fused.gx, composed.gx);
          EXPECT_EQ(fused.gw, composed.gw);
          EXPECT_EQ(fused.gb, composed.gb);
        }
        EXPECT_FALSE(separate.fused);
        // oneDNN's f32 convolutions of 8 or more input channels write a channel-blocked layout on
        // every x86 host with AVX2 (nChw8c) or AVX-512 (nChw16c), which the pool reads, and a first
        // layer that mixprec's kernel computes is pooled by it; elsewhere (a 16-bit primitive's
        // layout, oneDNN's first layers) the fusion may not apply, and the comparison below is then
        // of a path with itself.
        if (first_layer(g, t) || (t == DType::f32 && g.x[1] >= 8)) {
          EXPECT_TRUE(fused.fused) << "not fused";
        }
        EXPECT_FALSE(separate.fused_backward);
        if (is_first(g)) {
          EXPECT_EQ(fused.fused_backward, small_k(g, t));
        } else if (layout_backward(g, t)) {
          EXPECT_TRUE(fused.fused_backward) << "backward not fused";
        }
        fused_cases += fused.fused;
        fused_backward_cases += fused.fused_backward;
        ++cases;
        EXPECT_EQ(fused.y, separate.y);
        EXPECT_EQ(fused.gx, separate.gx);
        EXPECT_EQ(fused.gw, separate.gw);
        EXPECT_EQ(fused.gb, separate.gb);
      }
  if (fused_cases == 0) GTEST_SKIP() << "no " << dtype_name(t) << " case was fused on this host";
  if (fused_cases < cases || fused_backward_cases < cases)
    std::printf("[ NOTE     ] %d of %d cases fused on this host, %d in their backward\n", fused_cases, cases,
                fused_backward_cases);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ConvPool, ::testing::Values(DType::f32, DType::bf16, DType::f16),
                         [](const ::testing::TestParamInfo<DType>& p) { return std::string(dtype_name(p.param)); });

// max_unpool_to_layout on its own, on every host: each layout a primitive may read grad_y in
// (nChw8c, nChw16c, NHWC), each gradient dtype into the layouts' dtypes it writes (f32 from f32,
// bf16 or f16; bf16 from bf16), the cnns' exact 2x2 pool (its vector kernel where the host has
// AVX2) and the general windows, channel counts that leave a partial block, with a ReLU's mask
// (relu_y: the pooled integers' ReLU, zeros and negatives among them) or without, the argmax in
// bytes or (2x2 windows) packed two bits a tap, planes starting mid-byte; against
// max_pool2d_backward's NCHW gradient (after activation_grad's mask) reordered into the layout by
// oneDNN, byte for byte (padded channels zero, the destination filled with 0xff before).
TEST(ConvPool, UnpoolIntoEachLayoutIsThePoolsBackwardReordered) {
  using dnnl::memory;
  struct Pool {
    const char* name;
    int64_t h, w, k, stride, pad;
  };
  const Pool pools[] = {{"2x2/2 exact", 6, 10, 2, 2, 0}, {"2x2/2 odd", 7, 7, 2, 2, 0}, {"3x3/2 pad 1", 9, 8, 3, 2, 1}};
  int cases = 0;
  for (const Pool& p : pools)
    for (int64_t c : {16, 20, 8})
      for (DType t : {DType::f32, DType::bf16, DType::f16})
        for (memory::format_tag tag :
             {memory::format_tag::nChw8c, memory::format_tag::nChw16c, memory::format_tag::nhwc})
          for (DType layout_t : {DType::f32, DType::bf16})
            for (bool relu : {false, true}) {
              if (layout_t == DType::bf16 && t != DType::bf16) continue;
              SCOPED_TRACE(std::string(p.name) + ", " + std::to_string(c) + " channels, " + std::string(dtype_name(t)) +
                           " into " + std::string(dtype_name(layout_t)) + " tag " + std::to_string(int(tag)) +
                           (relu ? ", ReLU" : ""));
              kernels::PoolGeometry g;
              g.n = 2, g.c = c, g.h = p.h, g.w = p.w, g.kh = g.kw = p.k, g.stride_h = g.stride_w = p.stride;
              g.pad_h = g.pad_w = p.pad;
              g.oh = (p.h + 2 * p.pad - p.k) / p.stride + 1, g.ow = (p.w + 2 * p.pad - p.k) / p.stride + 1;
              Generator gen(uint64_t(13 + c));
              // Integers: ties in the windows (the first tap's), as the argmax of a real pool.
              std::vector<float> xs = Tensor::uniform({g.n, c, p.h, p.w}, gen, -3, 3).to_vector();
              for (float& e : xs) e = std::round(e);
              const Tensor x = Tensor::from_vector(xs, {g.n, c, p.h, p.w}).to(t);
              const kernels::MaxPoolResult fwd = kernels::max_pool2d_forward(x, g);
              const Tensor grad = Tensor::uniform({g.n, c, g.oh, g.ow}, gen, -1, 1).to(t);
              const memory::dims dims{g.n, c, p.h, p.w};
              const memory::desc md(dims, kernels::cpu::to_dnnl(layout_t), tag);
              ASSERT_TRUE(kernels::cpu::unpool_writes_layout(md, g, t));
              std::vector<uint8_t> want(md.get_size(), 0xff);
              const Tensor relu_y = relu ? kernels::activation(kernels::Activation::relu, fwd.dst) : Tensor();
              const Tensor masked = relu ? kernels::activation_grad(kernels::Activation::relu, grad, relu_y) : grad;
              const Tensor nchw = kernels::max_pool2d_backward(masked, fwd.argmax, g);
              memory from(memory::desc(dims, kernels::cpu::to_dnnl(t), memory::format_tag::nchw),
                          kernels::cpu::dnnl_engine(), const_cast<void*>(nchw.data_ptr()));
              memory to(md, kernels::cpu::dnnl_engine(), want.data());
              dnnl::reorder(from, to).execute(kernels::cpu::dnnl_stream(), from, to);
              kernels::cpu::dnnl_stream().wait();
              for (bool two_bit : {false, true}) {
                if (two_bit && !g.argmax_fits_two_bits()) continue;
                SCOPED_TRACE(two_bit ? "argmax in two bits a tap" : "argmax in bytes");
                const Tensor taps = two_bit ? kernels::pack_argmax_2bit(fwd.argmax) : fwd.argmax;
                std::vector<uint8_t> got(md.get_size(), 0xff);
                kernels::cpu::max_unpool_to_layout(grad, {taps.data<uint8_t>(), two_bit}, g, md, got.data(),
                                                   relu ? &relu_y : nullptr);
                EXPECT_EQ(got, want);
                ++cases;
              }
            }
  // Per pool: 3 channel counts, 4 dtype pairs, 3 layouts, with and without the mask; the 2x2 pools
  // with both argmax forms.
  EXPECT_EQ(cases, (2 * 2 + 1) * 3 * 4 * 3 * 2);
}

// Under autocast (the training step's case): x f32, the op lowered to bf16, the weight's and the
// bias's gradients in f32 from the convolution's accumulation.
TEST(ConvPool, AutocastBf16MatchesSeparate) {
  const Geometry& g = geometries()[0];
  std::vector<std::vector<uint8_t>> got[2];
  for (bool on : {true, false}) {
    kernels::set_conv_pool_fused(on);
    std::vector<Tensor> in = operands(g, DType::f32, Values::random);
    for (Tensor& p : in) p.set_requires_grad(true);
    Tensor y;
    {
      amp::Autocast ac(DType::bf16);
      y = ops::conv2d_max_pool2d(in[0], in[1], in[2], g.conv, g.k, g.pool);
    }
    EXPECT_EQ(y.dtype(), DType::bf16);
    ops::sum(ops::cast(y, DType::f32)).backward();
    EXPECT_EQ(in[1].grad().dtype(), DType::f32);
    got[on] = {bytes_of(y), bytes_of(in[0].grad()), bytes_of(in[1].grad()), bytes_of(in[2].grad())};
  }
  kernels::set_conv_pool_fused(true);
  EXPECT_EQ(got[1], got[0]);
}

// The containers' rewrite: Conv2d [, ReLU], MaxPool2d [, ReLU] as one op, the ReLU on the
// convolution, the same bits as the ops one after the other (ReLU after the pool or before: the
// same values).
TEST(ConvPool, SequentialMatchesTheOpsComposed) {
  enum class Relu { none, before_pool, after_pool };
  for (Relu where : {Relu::none, Relu::before_pool, Relu::after_pool}) {
    const bool relu = where != Relu::none;
    SCOPED_TRACE(where == Relu::none ? "without ReLU" : where == Relu::before_pool ? "ReLU, pool" : "pool, ReLU");
    default_generator().manual_seed(3);
    nn::Sequential m;
    auto conv = std::make_shared<nn::Conv2d>(16, 24, 3, nn::Conv2dOptions{.padding = 1});
    m.push_back(conv);
    if (where == Relu::before_pool) m.push_back(std::make_shared<nn::ReLU>());
    m.push_back(std::make_shared<nn::MaxPool2d>(2));
    if (where == Relu::after_pool) m.push_back(std::make_shared<nn::ReLU>());
    Generator gen(5);
    const Tensor x = Tensor::uniform({2, 16, 9, 9}, gen, -1, 1);
    profile::start();
    const Tensor y = m.forward(x);
    profile::stop();
    bool fused = false, activation = false;
    for (const profile::Row& row : profile::rows()) {
      fused |= row.kernel == "conv2d_max_pool2d_forward";
      activation |= row.kernel == "activation";
    }
    EXPECT_TRUE(fused) << "Sequential did not run conv2d_max_pool2d";
    EXPECT_FALSE(activation) << "the ReLU ran on its own";
    ops::sum(y).backward();
    const std::vector<uint8_t> gw = bytes_of(conv->weight.grad()), gb = bytes_of(conv->bias.grad());
    conv->weight.set_grad(Tensor()), conv->bias.set_grad(Tensor());

    Tensor ref = ops::max_pool2d(ops::conv2d(x, conv->weight, conv->bias, {.padding = 1}), 2);
    if (relu) ref = ops::relu(ref);
    EXPECT_EQ(bytes_of(y), bytes_of(ref));
    ops::sum(ref).backward();
    EXPECT_EQ(gw, bytes_of(conv->weight.grad()));
    EXPECT_EQ(gb, bytes_of(conv->bias.grad()));
  }
}

// An error names the layer it is about: the pool's window too large for the convolution's output,
// or the input's channels wrong for the convolution.
TEST(ConvPool, SequentialErrorsNameTheirLayer) {
  nn::Sequential m;
  m.push_back(std::make_shared<nn::Conv2d>(2, 4, 3));
  m.push_back(std::make_shared<nn::MaxPool2d>(5));
  Generator gen(1);
  try {
    m.forward(Tensor::uniform({1, 2, 5, 5}, gen, -1, 1));  // conv output 3x3: the 5x5 window does not fit
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("MaxPool2d(kernel_size=5", 0), 0u) << e.what();
    EXPECT_NE(std::string(e.what()).find("max_pool2d: kernel 5x5 is larger than the padded input 3x3"),
              std::string::npos)
        << e.what();
  }
  try {
    m.forward(Tensor::uniform({1, 3, 8, 8}, gen, -1, 1));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("Conv2d(2, 4", 0), 0u) << e.what();
  }
}

}  // namespace
}  // namespace mixprec
