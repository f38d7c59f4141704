// A CPU mock of nvcuda::wmma's 16x16x16 fragments for tests/emulated/ (cuda_shim.h first): every
// lane holds the whole tile, loads check the 256-bit alignment WMMA requires, a store waits for
// every lane's loads and is written by lane 0, and mma_sync sums each product in f32 in k order
// (the hardware's order within a 16-wide step is its own: results agree to f32 rounding).
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <type_traits>

#include "mixprec/convert.h"

namespace nvcuda::wmma {

struct row_major {};
struct col_major {};
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
  static_assert(M == 16 && N == 16 && K == 16, "the mock has 16x16x16 fragments only");
  float v[16][16];
};

namespace detail {
inline void check_aligned(const void* p, const char* what) {
  if (reinterpret_cast<uintptr_t>(p) % 32 != 0) {
    std::fprintf(stderr, "wmma mock: %s of a pointer not 256-bit aligned\n", what);
    std::abort();
  }
}
template <class T>
float value(T x) {
  if constexpr (std::is_same_v<T, float>)
    return x;
  else
    return mixprec::to_f32(x);
}
}  // namespace detail

template <class Use, class T, class Layout>
void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout>& f, const T* p, unsigned ld) {
  static_assert(!std::is_same_v<Use, accumulator>);
  detail::check_aligned(p, "load");
  if (ld % 8 != 0) std::abort();
  for (unsigned r = 0; r < 16; ++r)
    for (unsigned c = 0; c < 16; ++c)
      f.v[r][c] = detail::value(std::is_same_v<Layout, row_major> ? p[r * ld + c] : p[c * ld + r]);
}
inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, const float* p, unsigned ld, layout_t l) {
  detail::check_aligned(p, "load");
  if (l != mem_row_major || ld % 4 != 0) std::abort();
  for (unsigned r = 0; r < 16; ++r)
    for (unsigned c = 0; c < 16; ++c) f.v[r][c] = p[r * ld + c];
}
inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f, unsigned ld, layout_t l) {
  detail::check_aligned(p, "store");
  if (l != mem_row_major || ld % 4 != 0) std::abort();
  __syncwarp();  // the warp's loads of this tile before its store (one instruction on a GPU)
  if (::mixprec::emulated::lane() == 0)
    for (unsigned r = 0; r < 16; ++r)
      for (unsigned c = 0; c < 16; ++c) p[r * ld + c] = f.v[r][c];
  __syncwarp();
}
template <class F>
void fill_fragment(F& f, float x) {
  for (auto& row : f.v)
    for (float& e : row) e = x;
}
template <class T, class LA, class LB>
void mma_sync(fragment<accumulator, 16, 16, 16, float>& d, const fragment<matrix_a, 16, 16, 16, T, LA>& a,
              const fragment<matrix_b, 16, 16, 16, T, LB>& b, const fragment<accumulator, 16, 16, 16, float>& c) {
  float out[16][16];
  for (int r = 0; r < 16; ++r)
    for (int n = 0; n < 16; ++n) {
      float s = c.v[r][n];
      for (int k = 0; k < 16; ++k) s += a.v[r][k] * b.v[k][n];
      out[r][n] = s;
    }
  for (int r = 0; r < 16; ++r)
    for (int n = 0; n < 16; ++n) d.v[r][n] = out[r][n];
}

}  // namespace nvcuda::wmma
