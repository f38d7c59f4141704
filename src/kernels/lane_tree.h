// The sum of N lanes as a fixed tree: lane j with lane j + N/2, then j + N/4, ... down to one. The
// order wherever a lane-wise sum must give the same bits in every form that computes it: layer
// norm's rows (cpu/norm.cpp, compiled for AVX-512, AVX2 and the baseline, and its registers' form)
// and grad_norm's blocks (the reference and the fast kernel, kernels/optim.h). Always inlined, so a
// caller compiled for AVX-512 runs it in its own lanes.
#pragma once

namespace mixprec::kernels {

template <int N, class T>
__attribute__((always_inline)) inline T lane_tree_sum(const T* acc) {
  static_assert(N >= 2 && (N & (N - 1)) == 0, "a power of two lanes");
  T t[N / 2];
  for (int j = 0; j < N / 2; ++j) t[j] = acc[j] + acc[j + N / 2];
  for (int w = N / 4; w >= 1; w /= 2)
    for (int j = 0; j < w; ++j) t[j] = t[j] + t[j + w];
  return t[0];
}

}  // namespace mixprec::kernels
