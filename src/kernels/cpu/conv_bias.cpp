// The bias gradient of a convolution whose weight gradient oneDNN computes without it
// (conv2d_backward's wgrad-as-forward and split paths): see dnnl_conv.h for the order of the sums.
// Each plane's eight partial sums are the eight lanes of one AVX2 vector, four images' planes go
// at once (independent chains), and their sums are added in image order: the scalar loop's bits.
#include <immintrin.h>
#include <omp.h>

#include <type_traits>
#include <vector>

#include "kernels/cpu/dnnl_conv.h"
#include "mixprec/convert.h"

namespace mixprec::kernels::cpu {
namespace {

// Plane sums of f32 or bf16 (bits) values, the order of dnnl_conv.h.
template <class T>
float value(const T* p, int64_t i) {
  if constexpr (std::is_same_v<T, float>)
    return p[i];
  else
    return bf16_to_f32(p[i]);
}

template <class T>
float plane_sum_scalar(const T* p, int64_t plane) {
  float part[8] = {};
  int64_t i = 0;
  for (; i + 8 <= plane; i += 8)
    for (int l = 0; l < 8; ++l) part[l] += value(p, i + l);
  float s = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
  for (; i < plane; ++i) s += value(p, i);
  return s;
}

template <class T>
__attribute__((target("avx2"))) inline __m256 load8(const T* p) {
  if constexpr (std::is_same_v<T, float>) {
    return _mm256_loadu_ps(p);
  } else {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}

// The sums of K planes p[0..K) (independent chains), each in the scalar order.
template <int K, class T>
__attribute__((target("avx2"))) void plane_sums(const T* const* p, int64_t plane, float* out) {
  __m256 part[K];
  for (int k = 0; k < K; ++k) part[k] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= plane; i += 8)
    for (int k = 0; k < K; ++k) part[k] = _mm256_add_ps(part[k], load8(p[k] + i));
  for (int k = 0; k < K; ++k) {
    alignas(32) float l[8];
    _mm256_store_ps(l, part[k]);
    float s = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
    for (int64_t j = i; j < plane; ++j) s += value(p[k], j);
    out[k] = s;
  }
}

template <class T>
float channel_sum(const T* y, const ConvGeometry& g, int64_t o, bool avx2) {
  const int64_t plane = g.oh * g.ow;
  auto at = [&](int64_t n) { return y + (n * g.oc + o) * plane; };
  float total = 0.f;
  int64_t n = 0;
  if (avx2) {
    for (; n + 4 <= g.n; n += 4) {
      const T* p[4] = {at(n), at(n + 1), at(n + 2), at(n + 3)};
      float s[4];
      plane_sums<4>(p, plane, s);
      for (float v : s) total += v;
    }
  }
  for (; n < g.n; ++n) total += plane_sum_scalar(at(n), plane);
  return total;
}

}  // namespace

float conv_bias_plane_sum(const uint16_t* plane_bf16, int64_t plane) {
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (!avx2) return plane_sum_scalar(plane_bf16, plane);
  const uint16_t* p[1] = {plane_bf16};
  float s = 0.f;
  plane_sums<1>(p, plane, &s);
  return s;
}

void conv_bias_gradient(const Tensor& grad_y, const ConvGeometry& g, Tensor& bias) {
  static const bool avx2 = __builtin_cpu_supports("avx2");
  std::vector<float> sums(size_t(g.oc));
  const bool bf16 = grad_y.dtype() == DType::bf16;
  const auto* y16 = static_cast<const uint16_t*>(grad_y.data_ptr());
  const auto* y32 = static_cast<const float*>(grad_y.data_ptr());
#pragma omp parallel for schedule(static)
  for (int64_t o = 0; o < g.oc; ++o)
    sums[size_t(o)] = bf16 ? channel_sum(y16, g, o, avx2) : channel_sum(y32, g, o, avx2);
  convert(sums.data(), DType::f32, bias.data_ptr(), bias.dtype(), size_t(g.oc));
}

}  // namespace mixprec::kernels::cpu
