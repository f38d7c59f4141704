// Timing probe (not a test) of ops::conv2d_max_pool2d on the CPU: the pool fused with the
// convolution (kernels::set_conv_pool_fused(true), the default: a first layer's planes pooled as
// mixprec's kernel computes them, another layer's output read in oneDNN's layout) against the two
// kernels one after the other (false: the output written in NCHW, then pooled), interleaved so
// that machine-wide speed swings hit both alike; best and median of the repeats. The layers are
// the cnns' two convolutions with their 2x2 pools (`first`: the cnn 32/64's first alone).
// `backward` times the op's backward instead (a first layer's weight and bias gradients, another
// layer's input gradient too, as in the cnns): fused, the pool's gradient routed where the
// convolution's backward reads grad_y; separate, the pool's backward into NCHW, then the
// convolution's. `relu` gives the layers their ReLU (the cnns' Conv2d, ReLU, MaxPool2d): on the
// convolution, its mask applied as the gradient is routed (fused) or by its own pass (separate).
//
//   cmake --build build --target conv_pool_probe
//   OMP_NUM_THREADS=2 build/conv_pool_probe [reps=20] [f32|bf16|f16|all] [small|first|wide|all] [forward|backward]
//                                           [relu]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "kernels/conv.h"
#include "mixprec/autograd.h"
#include "mixprec/ops.h"

using namespace mixprec;

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

struct Layer {
  const char* name;
  int64_t n, c, oc, hw;
};

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 20;
  const std::string dtypes = argc > 2 ? argv[2] : "all", layers = argc > 3 ? argv[3] : "small";
  const bool backward = argc > 4 && std::string(argv[4]) == "backward";
  const bool relu = argc > 5 && std::string(argv[5]) == "relu";
  std::vector<Layer> ls;
  if (layers != "wide") {
    ls.push_back({"cnn 32/64 first layer, batch 256", 256, 1, 32, 28});
    if (layers != "first") ls.push_back({"cnn 32/64 second layer, batch 256", 256, 32, 64, 14});
  }
  if (layers == "wide" || layers == "all") {
    ls.push_back({"cnn 420/1000 first layer, batch 64", 64, 1, 420, 28});
    ls.push_back({"cnn 420/1000 second layer, batch 64", 64, 420, 1000, 14});
  }
  for (const Layer& l : ls)
    for (DType t : {DType::f32, DType::bf16, DType::f16}) {
      if (dtypes != "all" && dtypes != dtype_name(t)) continue;
      Generator gen(1);
      Tensor x = Tensor::uniform({l.n, l.c, l.hw, l.hw}, gen, -1, 1).to(t);
      Tensor w = Tensor::uniform({l.oc, l.c, 3, 3}, gen, -0.1, 0.1).to(t);
      Tensor b = Tensor::uniform({l.oc}, gen, -0.1, 0.1).to(t);
      if (backward) {
        if (l.c > 1) x.set_requires_grad(true);
        w.set_requires_grad(true), b.set_requires_grad(true);
      }
      const Tensor gy = Tensor::uniform({l.n, l.oc, l.hw / 2, l.hw / 2}, gen, -1, 1).to(t);
      std::vector<double> fused, separate;
      for (int r = 0; r < reps + 2; ++r)
        for (bool on : {true, false}) {
          kernels::set_conv_pool_fused(on);
          std::optional<autograd::NoGradGuard> no_grad;
          if (!backward) no_grad.emplace();
          auto t0 = std::chrono::steady_clock::now();
          const Tensor y = ops::conv2d_max_pool2d(x, w, b, {.padding = 1, .relu = relu}, 2);
          if (backward) {
            t0 = std::chrono::steady_clock::now();
            y.backward(gy);
          }
          const double ms = ms_since(t0);
          if (r >= 2) (on ? fused : separate).push_back(ms);  // two warm-up rounds
        }
      kernels::set_conv_pool_fused(true);
      for (auto* v : {&fused, &separate}) std::sort(v->begin(), v->end());
      const auto med = [](const std::vector<double>& v) { return v[v.size() / 2]; };
      std::printf(
          "{\"layer\":\"%s\",\"pass\":\"%s%s\",\"dtype\":\"%s\",\"reps\":%d,\"fused_ms\":{\"best\":%.3f,\"median\":%."
          "3f},"
          "\"separate_ms\":{\"best\":%.3f,\"median\":%.3f}}\n",
          l.name, backward ? "backward" : "forward", relu ? " with ReLU" : "", dtype_name(t).data(), reps, fused[0],
          med(fused), separate[0], med(separate));
    }
  return 0;
}
