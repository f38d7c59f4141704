// Error probe (not a test) behind test_attention.cpp's rms bound: for each of the CPU blocking
// shapes and a 65 x 65 causal one, over `seeds` draws of the test's inputs (uniform in [-2, 2],
// rounded to bf16), the rms error of the fast bf16 attention against the f64 reference, over the
// rms error of the reference kernel run in bf16: mean and worst per result (output, dq, dk, dv).
// The bf16 tiles round P and dS to bf16 before their products, which the reference does not.
//
//   cmake --build build --target attention_error_probe
//   build/attention_error_probe [seeds=40]
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "../tests/error_norms.h"
#include "kernels/kernels.h"
#include "mixprec/ops.h"

namespace {

using namespace mixprec;

struct Shape4 {
  int64_t b, h, tq, tk, e, ev;
  bool causal;
};

std::vector<Tensor> run(const std::vector<Tensor>& in, DType t, const Shape4& s, kernels::Backend be) {
  const kernels::BackendGuard guard(be);
  std::vector<Tensor> x;
  for (int i = 0; i < 3; ++i) x.push_back(in[size_t(i)].to(t).detach().set_requires_grad());
  Tensor o = ops::scaled_dot_product_attention(x[0], x[1], x[2], {.causal = s.causal});
  o.backward(in[3].to(t));
  return {o.detach(), x[0].grad(), x[1].grad(), x[2].grad()};
}

}  // namespace

int main(int argc, char** argv) {
  const int seeds = argc > 1 ? std::atoi(argv[1]) : 40;
  if (seeds < 1) {
    std::fprintf(stderr, "attention_error_probe: seeds must be at least 1, got %s\n", argv[1]);
    return 2;
  }
  const std::vector<Shape4> shapes = {{1, 1, 21, 23, 24, 40, false},
                                      {1, 2, 30, 30, 8, 8, true},
                                      {2, 1, 23, 21, 40, 24, true},
                                      {1, 2, 14, 17, 20, 12, true},
                                      {2, 1, 65, 65, 32, 32, true}};
  const char* names[] = {"output", "dq", "dk", "dv"};
  for (const Shape4& s : shapes) {
    double worst[4] = {}, sum[4] = {};
    for (int seed = 0; seed < seeds; ++seed) {
      Generator g(0xa77e + uint64_t(s.tq * 131 + s.tk) + 1000003ull * uint64_t(seed));
      std::vector<Tensor> in;
      for (const Shape& sh : {Shape{s.b, s.h, s.tq, s.e}, Shape{s.b, s.h, s.tk, s.e}, Shape{s.b, s.h, s.tk, s.ev},
                              Shape{s.b, s.h, s.tq, s.ev}})
        in.push_back(Tensor::uniform(sh, g, -2, 2, DType::f64).to(DType::bf16).to(DType::f64));
      const auto truth = run(in, DType::f64, s, kernels::Backend::ref);
      const auto ref = run(in, DType::bf16, s, kernels::Backend::ref);
      const auto fast = run(in, DType::bf16, s, kernels::Backend::cpu);
      for (size_t i = 0; i < 4; ++i) {
        const double r = testing::error_of(fast[i], truth[i]).rms / testing::error_of(ref[i], truth[i]).rms;
        worst[i] = std::max(worst[i], r);
        sum[i] += r;
      }
    }
    std::printf("{\"shape\":\"%ldx%ld Tq %ld Tk %ld E %ld/%ld%s\",\"seeds\":%d", long(s.b), long(s.h), long(s.tq),
                long(s.tk), long(s.e), long(s.ev), s.causal ? " causal" : "", seeds);
    for (size_t i = 0; i < 4; ++i)
      std::printf(",\"%s\":{\"mean\":%.3f,\"worst\":%.3f}", names[i], sum[i] / seeds, worst[i]);
    std::printf("}\n");
  }
}
