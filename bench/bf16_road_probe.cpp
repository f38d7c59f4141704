// Timing probe (not a test) behind the by_size rule of kernels/cpu/dnnl_common.h (Bf16Math): on
// this host, (1) one core's bf16 dot-product rate (VDPBF16PS) against its f32 FMA rate, in
// register-only loops; (2) a bf16 matmul through mixprec's kernel on each road (oneDNN's bf16
// kernel, or widened to f32 and rounded once), per shape; (3) the same for a bf16 convolution
// layer, forward and backward; (4) what the f32 road's casts cost: a bf16 or f16 product computed
// in f32 a block per thread (kernels/cpu/matmul_widened.h) and as whole tensors, against the same
// product on f32 operands; (5) its blocks of b's columns against what it took before them; (6) a
// bf16 convolution layer on the f32 road with its casts as passes (before) and fused with the
// reorders around oneDNN's primitives (kernels/cpu/dnnl_conv.h), against f32 operands. Roads
// interleaved, best of several, so that the machine's swings hit them alike. The shapes are the
// models' (docs/hosts.md, "Intel Xeon without AMX").
//
//   cmake --build build --target bf16_road_probe
//   OMP_WAIT_POLICY=passive build/bf16_road_probe [rates|matmul|conv|widened|columns|convwiden ...]   (default: all)
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include "bench/peak_rates.h"
#include "kernels/cpu/dnnl_common.h"
#include "kernels/cpu/dnnl_conv.h"
#include "kernels/cpu/matmul_widened.h"
#include "kernels/matmul.h"
#include "mixprec/autograd.h"
#include "mixprec/cpu.h"
#include "mixprec/ops.h"
#include "mixprec/random.h"

using namespace mixprec;
using Road = kernels::cpu::Bf16Products;

namespace {

using bench::seconds_since;

void rates() {
  if (!cpu::has_avx512_bf16()) {
    std::printf("rates: no AVX512-BF16 on this host\n");
    return;
  }
  for (int r = 0; r < 3; ++r)
    std::printf("one core: VDPBF16PS %.0f GFLOP/s, VFMADD231PS %.0f GFLOP/s\n", bench::dot_bf16_gflops(100000000),
                bench::fma_f32_gflops(100000000));
}

// Runs fn once per road per repeat, interleaved; returns the best seconds of each road.
template <class Fn>
std::pair<double, double> best_of_roads(int repeats, int reps, Fn fn) {
  double best[2] = {1e30, 1e30};
  for (int r = 0; r < repeats; ++r)
    for (int road = 0; road < 2; ++road) {
      kernels::cpu::set_bf16_products(road == 0 ? Road::native : Road::f32);
      fn();
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < reps; ++i) fn();
      best[road] = std::min(best[road], seconds_since(t0) / reps);
    }
  kernels::cpu::set_bf16_products(Road::host_rule);
  return {best[0], best[1]};
}

void matmuls() {
  struct S {
    int64_t m, k, n;
    bool ta, tb;
  };
  const std::vector<S> shapes = {
      {512, 784, 1024, false, true},    {512, 1024, 1024, false, true}, {512, 1024, 10, false, true},   // mlp forward
      {512, 1024, 784, false, false},   {1024, 512, 1024, true, false},                                 // mlp backward
      {256, 3136, 10, false, true},     {10, 256, 3136, true, false},                                   // cnn's fc
      {4096, 128, 384, false, true},    {4096, 128, 512, false, true},  {4096, 512, 128, false, true},  // gpt
      {4096, 128, 128, false, true},    {4096, 128, 81, false, true},   {128, 4096, 512, true, false},
      {1024, 1024, 1024, false, false}, {256, 256, 256, false, false},  {128, 128, 128, false, false}};
  Generator g(1);
  for (const S& s : shapes) {
    const Tensor a = Tensor::randn(s.ta ? Shape{s.k, s.m} : Shape{s.m, s.k}, g, DType::bf16);
    const Tensor b = Tensor::randn(s.tb ? Shape{s.n, s.k} : Shape{s.k, s.n}, g, DType::bf16);
    Tensor d = Tensor::empty({s.m, s.n}, DType::bf16);
    kernels::MatmulOpts o;
    o.trans_a = s.ta, o.trans_b = s.tb;
    const double flops = 2.0 * double(s.m) * double(s.k) * double(s.n);
    const double elements = double(s.m * s.k + s.k * s.n + s.m * s.n);
    const int reps = int(std::max(3.0, 2e8 / flops));
    const auto [native, f32] = best_of_roads(7, reps, [&] { kernels::matmul(a, b, d, o); });
    std::printf(
        "matmul %5lld x %5lld x %5lld  %4.0f flops/element  bf16 %7.3f ms (%4.0f GFLOP/s)  "
        "f32 %7.3f ms (%4.0f GFLOP/s)  f32/bf16 %.2f\n",
        (long long)s.m, (long long)s.k, (long long)s.n, flops / elements, native * 1e3, flops / native / 1e9, f32 * 1e3,
        flops / f32 / 1e9, f32 / native);
  }
}

// A product op(a) @ op(b) of m x k x n, transposes as flagged, its 16-bit result in `out`.
struct ProductShape {
  int64_t m, k, n;
  bool ta, tb;
  DType out;
};

// Seconds per call of `product(road)` for each of `roads` roads, over `repeats` rounds that take
// the roads in turn (one untimed call, then `reps` timed), each road's times sorted: [0] is the
// best, [repeats / 2] the median.
template <class F>
std::vector<std::vector<double>> interleaved(int roads, int repeats, int reps, F product) {
  std::vector<std::vector<double>> t(static_cast<size_t>(roads));
  for (int rep = 0; rep < repeats; ++rep)
    for (int r = 0; r < roads; ++r) {
      product(r);
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < reps; ++i) product(r);
      t[size_t(r)].push_back(seconds_since(t0) / reps);
    }
  for (auto& v : t) std::sort(v.begin(), v.end());
  return t;
}

// The f32 road's own cost: the same product with f32 operands (no casts) against bf16 and f16
// operands widened to f32 and the result rounded (f16 always takes this road), a block per thread
// (kernels/cpu/matmul_widened.h) and as whole tensors, interleaved.
void widened() {
  const std::vector<ProductShape> shapes = {
      {512, 784, 1024, false, true, DType::bf16},   {512, 1024, 784, false, false, DType::bf16},
      {512, 1024, 1024, false, true, DType::bf16},  {1024, 512, 1024, true, false, DType::f32},
      {4096, 128, 384, false, true, DType::bf16},   {4096, 128, 512, false, true, DType::bf16},
      {4096, 512, 128, false, false, DType::bf16},  {4096, 384, 128, false, false, DType::bf16},
      {128, 4096, 512, true, false, DType::f32},    {512, 4096, 128, true, false, DType::f16},
      {4096, 1024, 1024, false, true, DType::bf16}, {1024, 1024, 1024, false, false, DType::bf16},
      {1024, 512, 512, false, false, DType::bf16},  {2048, 1024, 1024, false, false, DType::bf16},
      {512, 1024, 10, false, true, DType::bf16},    {256, 3136, 10, false, true, DType::bf16},
      {10, 256, 3136, true, false, DType::bf16}};
  Generator g(1);
  kernels::cpu::set_bf16_products(Road::f32);
  for (const ProductShape& s : shapes) {
    const double flops = 2.0 * double(s.m) * double(s.k) * double(s.n);
    const int reps = int(std::max(3.0, 2e8 / flops));
    // f32 operands; bf16 in blocks, whole; f16 in blocks, whole. No f16 product leaves in f32 (an f16
    // gradient keeps f16's range): with an f32 result only bf16 is timed.
    const int roads = s.out == DType::f32 ? 3 : 5;
    std::vector<Tensor> as, bs, ds;
    for (DType t : {DType::f32, DType::bf16, DType::f16}) {
      if (t == DType::f16 && roads == 3) break;
      as.push_back(Tensor::randn(s.ta ? Shape{s.k, s.m} : Shape{s.m, s.k}, g, t));
      bs.push_back(Tensor::randn(s.tb ? Shape{s.n, s.k} : Shape{s.k, s.n}, g, t));
      ds.push_back(Tensor::empty({s.m, s.n}, t == DType::f32 || s.out == DType::f32 ? DType::f32 : t));
    }
    kernels::MatmulOpts o;
    o.trans_a = s.ta, o.trans_b = s.tb;
    const auto times = interleaved(roads, 7, reps, [&](int r) {
      const size_t t = size_t((r + 1) / 2);  // 0 f32, 1 bf16, 2 f16
      kernels::cpu::set_matmul_widened(r % 2 == 1);
      kernels::matmul(as[t], bs[t], ds[t], o);
    });
    kernels::cpu::set_matmul_widened(true);
    std::vector<double> best;
    for (const auto& v : times) best.push_back(v[0]);
    std::printf(
        "widened %5lld x %5lld x %5lld -> %-4s  f32 operands %6.3f ms (%3.0f GFLOP/s)  bf16 blocks %.2fx whole %.2fx",
        (long long)s.m, (long long)s.k, (long long)s.n, s.out == DType::f32 ? "f32" : "16", best[0] * 1e3,
        flops / best[0] / 1e9, best[1] / best[0], best[2] / best[0]);
    if (roads == 5) std::printf("  f16 blocks %.2fx whole %.2fx", best[3] / best[0], best[4] / best[0]);
    std::printf("\n");
  }
  kernels::cpu::set_bf16_products(Road::host_rule);
}

// Where b is the larger operand (n > m), the f32 road's blocks of b's columns against what it took
// before (blocks of rows, or whole tensors for a weight gradient), both as multiples of the same
// product on f32 operands; 15 interleaved repeats, best and median.
void columns() {
  // The mlp 512's and mlp 256 (2048, 512)'s products with n > m; the weight gradients with m >= n
  // (which stay off columns) as a control.
  const std::vector<ProductShape> shapes = {
      {512, 784, 1024, false, true, DType::bf16},  {512, 1024, 1024, false, true, DType::bf16},
      {512, 1024, 784, false, false, DType::bf16}, {256, 784, 2048, false, true, DType::bf16},
      {256, 2048, 512, false, true, DType::bf16},  {256, 512, 2048, false, false, DType::bf16},
      {512, 256, 2048, true, false, DType::f32},   {1024, 512, 784, true, false, DType::f32},
      {10, 256, 3136, true, false, DType::bf16}};
  Generator g(1);
  kernels::cpu::set_bf16_products(Road::f32);
  for (const ProductShape& s : shapes) {
    const double flops = 2.0 * double(s.m) * double(s.k) * double(s.n);
    const int reps = int(std::max(3.0, 2e8 / flops)), repeats = 15;
    const Tensor a32 = Tensor::randn(s.ta ? Shape{s.k, s.m} : Shape{s.m, s.k}, g);
    const Tensor b32 = Tensor::randn(s.tb ? Shape{s.n, s.k} : Shape{s.k, s.n}, g);
    const Tensor a = a32.to(DType::bf16), b = b32.to(DType::bf16);
    Tensor d32 = Tensor::empty({s.m, s.n}, DType::f32), d = Tensor::empty({s.m, s.n}, s.out);
    kernels::MatmulOpts o;
    o.trans_a = s.ta, o.trans_b = s.tb;
    // f32 operands, bf16 as before, bf16 by columns
    const auto t = interleaved(3, repeats, reps, [&](int r) {
      kernels::cpu::set_matmul_widened_columns(r == 2);
      if (r == 0)
        kernels::matmul(a32, b32, d32, o);
      else
        kernels::matmul(a, b, d, o);
    });
    kernels::cpu::set_matmul_widened_columns(true);
    const size_t mid = repeats / 2;
    std::printf(
        "columns %5lld x %5lld x %5lld %s%s  f32 operands %6.3f ms (%3.0f GFLOP/s)  bf16 before %.2fx / %.2fx"
        "  by columns %.2fx / %.2fx (best / median)\n",
        (long long)s.m, (long long)s.k, (long long)s.n, s.ta ? "T" : "N", s.tb ? "T" : "N", t[0][0] * 1e3,
        flops / t[0][0] / 1e9, t[1][0] / t[0][0], t[1][mid] / t[0][mid], t[2][0] / t[0][0], t[2][mid] / t[0][mid]);
  }
  kernels::cpu::set_bf16_products(Road::host_rule);
}

void convs() {
  struct S {
    int64_t n, c, oc, hw;
  };
  const std::vector<S> shapes = {{64, 8, 16, 14},    {256, 16, 32, 14},  {256, 32, 32, 28},
                                 {256, 32, 64, 14},  {64, 64, 64, 14},   {64, 128, 128, 14},
                                 {64, 128, 256, 14}, {64, 256, 256, 14}, {64, 420, 1000, 14}};
  Generator g(1);
  for (const S& s : shapes) {
    const Tensor x = Tensor::randn({s.n, s.c, s.hw, s.hw}, g, DType::bf16).set_requires_grad();
    const Tensor w = Tensor::randn({s.oc, s.c, 3, 3}, g, DType::bf16).set_requires_grad();
    const double flops = 3 * 2.0 * double(s.n * s.oc * s.c * 9 * s.hw * s.hw);  // forward and two gradients
    const int reps = int(std::max(2.0, 3e9 / flops));
    const auto [native, f32] =
        best_of_roads(5, reps, [&] { ops::sum(ops::conv2d(x, w, Tensor(), {.padding = 1})).backward(); });
    std::printf(
        "conv %3lld images %4lld -> %4lld at %lldx%lld  bf16 %8.2f ms (%4.0f GFLOP/s)  f32 %8.2f ms "
        "(%4.0f GFLOP/s)  f32/bf16 %.2f\n",
        (long long)s.n, (long long)s.c, (long long)s.oc, (long long)s.hw, (long long)s.hw, native * 1e3,
        flops / native / 1e9, f32 * 1e3, flops / f32 / 1e9, f32 / native);
  }
}

// A conv layer (forward, both gradients) on the f32 road: f32 operands, bf16 with its casts as
// passes (before), bf16 with them fused with the reorders; 11 interleaved repeats, best and median.
void conv_fused_casts() {
  struct S {
    int64_t n, c, oc, hw;
  };
  const std::vector<S> shapes = {
      {256, 32, 64, 14}, {64, 64, 64, 14}, {64, 128, 128, 14}, {64, 256, 256, 14}, {64, 420, 1000, 14}};
  Generator g(1);
  kernels::cpu::set_bf16_products(Road::f32);
  for (const S& s : shapes) {
    const Tensor x32 = Tensor::randn({s.n, s.c, s.hw, s.hw}, g).set_requires_grad();
    const Tensor w32 = Tensor::randn({s.oc, s.c, 3, 3}, g).set_requires_grad();
    const Tensor x = x32.detach().to(DType::bf16).set_requires_grad();
    const Tensor w = w32.detach().to(DType::bf16).set_requires_grad();
    const double flops = 3 * 2.0 * double(s.n * s.oc * s.c * 9 * s.hw * s.hw);
    const int reps = int(std::max(2.0, 3e9 / flops)), repeats = 11;
    const auto t = interleaved(3, repeats, reps, [&](int r) {
      kernels::cpu::set_conv_fused_casts(r == 2);
      const bool f32 = r == 0;
      ops::sum(ops::conv2d(f32 ? x32 : x, f32 ? w32 : w, Tensor(), {.padding = 1})).backward();
    });
    kernels::cpu::set_conv_fused_casts(true);
    const size_t mid = repeats / 2;
    std::printf(
        "convwiden %3lld images %4lld -> %4lld at %lldx%lld  f32 operands %8.2f ms (%4.0f GFLOP/s)  bf16 casts as "
        "passes "
        "%.2fx / %.2fx  fused %.2fx / %.2fx (best / median)\n",
        (long long)s.n, (long long)s.c, (long long)s.oc, (long long)s.hw, (long long)s.hw, t[0][0] * 1e3,
        flops / t[0][0] / 1e9, t[1][0] / t[0][0], t[1][mid] / t[0][mid], t[2][0] / t[0][0], t[2][mid] / t[0][mid]);
  }
  kernels::cpu::set_bf16_products(Road::host_rule);
}

}  // namespace

int main(int argc, char** argv) {
  std::printf("%s (%s)\n", cpu::describe().c_str(), cpu::describe_bf16_products().c_str());
  auto wanted = [&](const char* what) {
    if (argc < 2) return true;
    for (int i = 1; i < argc; ++i)
      if (std::strcmp(argv[i], what) == 0) return true;
    return false;
  };
  if (!(cpu::has_avx512_bf16() || cpu::has_amx_bf16())) {
    std::printf("no bf16 unit: both roads are f32 here (only widened runs)\n");
  } else {
    if (wanted("rates")) rates();
    if (wanted("matmul")) matmuls();
    if (wanted("conv")) convs();
  }
  if (wanted("widened")) widened();
  if (wanted("columns")) columns();
  if (wanted("convwiden")) conv_fused_casts();
  return 0;
}
