// Timing probe (not a test) of a transpose made contiguous (kernels::contig(x.transpose(0, 1)),
// cpu/shape.cpp's copy_tiles) on the gpt's activation shapes, [rows, cols] of bf16 and f32 into
// [cols, rows]: best and median of reps, one line per case. Public API only, so the same file
// times an older build (docs/design.md, Kernels, "Transposes").
//
//   cmake --build build --target transpose_probe
//   OMP_NUM_THREADS=2 build/transpose_probe [reps=50]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "mixprec/ops.h"
#include "mixprec/random.h"
#include "mixprec/tensor.h"

using namespace mixprec;

int main(int argc, char** argv) {
  const int reps = std::max(1, argc > 1 ? std::atoi(argv[1]) : 50);
  Generator gen(1);
  for (DType t : {DType::bf16, DType::f32})
    for (int64_t cols : {128, 384, 512}) {
      const int64_t rows = 4096;
      const Tensor x = Tensor::uniform({rows, cols}, gen, -1, 1, t);
      std::vector<double> ms;
      for (int r = 0; r <= reps; ++r) {  // the first: warm-up
        const auto t0 = std::chrono::steady_clock::now();
        const Tensor y = ops::contiguous(x.transpose(0, 1));
        const double dt = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        if (r > 0) ms.push_back(dt);
      }
      std::sort(ms.begin(), ms.end());
      const double bytes = double(rows * cols) * double(dtype_size(t));
      std::printf("[%lld, %lld] %-4s -> transposed: best %.3f ms (%.1f GB/s read), median %.3f ms\n",
                  static_cast<long long>(rows), static_cast<long long>(cols), std::string(dtype_name(t)).c_str(),
                  ms.front(), bytes / ms.front() * 1e-6, ms[ms.size() / 2]);
    }
  return 0;
}
