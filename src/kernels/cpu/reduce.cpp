// Fast CPU reductions: sums over leading dims or everything in f32 blocks (partials combined in
// f64), and the finiteness check, under OpenMP.
#include <algorithm>
#include <cmath>

#include "core/parallel.h"
#include "core/simd.h"
#include "kernels/cpu/f32_blocks.h"
#include "kernels/reduce.h"
#include "kernels/ref/access.h"
#include "mixprec/cpu.h"

namespace mixprec::kernels::cpu {
namespace {

// a[i] += row[i] over len values of an f32 or bf16 row, the bf16 ones widened in registers (exactly:
// their bits moved up): the same f32 additions as the converted-block loop, without a conversion
// call per row, which cost more than the sum itself on the gpt's bias gradients ([4096, 128..512]
// bf16 rows; 16 sums took 3.1 ms of its amp-bf16 step against 2.8 ms for twice the bytes in f32).
__attribute__((target("avx512f"))) void add_row_avx512(float* a, const void* row, DType t, int64_t len) {
  int64_t i = 0;
  if (t == DType::f32) {
    const auto* v = static_cast<const float*>(row);
    for (; i < len; i += 16) {
      const __mmask16 m = first_lanes(len - i);
      _mm512_mask_storeu_ps(a + i, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, v + i)));
    }
    return;
  }
  const auto* v = static_cast<const uint16_t*>(row);
  for (; i + 16 <= len; i += 16)
    _mm512_storeu_ps(a + i, _mm512_add_ps(_mm512_loadu_ps(a + i),
                                          bf16_widen_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + i)))));
  for (; i < len; ++i) a[i] += bf16_to_f32(v[i]);
}

// The same in 8 lanes (AVX2 hosts): the gpt's 16 bf16 bias-gradient sums, `mixprec bench --model
// gpt --precision amp-bf16 --profile` in alternating runs on the AVX2 kind (AMD Zen 3, 2026-12-06),
// 3.2-5.2 -> 1.3-1.9 ms (the conversion call per row, as above).
__attribute__((target("avx2"))) void add_row_avx2(float* a, const void* row, DType t, int64_t len) {
  int64_t i = 0;
  if (t == DType::f32) {
    const auto* v = static_cast<const float*>(row);
    for (; i + 8 <= len; i += 8) _mm256_storeu_ps(a + i, _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(v + i)));
    for (; i < len; ++i) a[i] += v[i];
    return;
  }
  const auto* v = static_cast<const uint16_t*>(row);
  for (; i + 8 <= len; i += 8) _mm256_storeu_ps(a + i, _mm256_add_ps(_mm256_loadu_ps(a + i), bf16_widen_avx2(v + i)));
  for (; i < len; ++i) a[i] += bf16_to_f32(v[i]);
}

}  // namespace

// Sums over a set of leading dims (bias gradients: [N, C] -> [C]), or over everything.
bool sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, Tensor& dst) {
  const DType t = x.dtype();
  if (!f32_compute(t) || !x.is_contiguous() || dst.dtype() == DType::f64) return false;
  for (size_t i = 0; i < dims.size(); ++i)
    if (dims[i] != int64_t(i)) return false;
  int64_t rows = 1, cols = 1;  // cols from the kept dims: numel / rows breaks when rows == 0
  for (int64_t d = 0; d < x.dim(); ++d) (d < int64_t(dims.size()) ? rows : cols) *= x.size(d);
  std::vector<float> acc(size_t(cols), 0.f);
  if (cols == 1) {
    // Whole-tensor sum: per-block partial sums in f32, combined in f64 so the order of blocks
    // does not matter much.
    const int64_t n = x.numel();
    const int64_t nb = (n + kBlock - 1) / kBlock;
    std::vector<double> partial(size_t(nb), 0.0);
    for_blocks(n, [&](int64_t begin, int64_t len) {
      float buf[kBlock];
      const float* v = in_f32(x.data_ptr(), t, begin, len, buf);
      float s = 0.f;
      for (int64_t i = 0; i < len; ++i) s += v[i];
      partial[size_t(begin / kBlock)] = s;
    });
    double s = 0;
    for (double v : partial) s += v;
    acc[0] = float(s);
  } else {
    // Column sums over chunks of rows, each chunk's in f32, the chunks combined in f64 in order:
    // the chunks keep both threads busy when the columns are few (a bias gradient: [B T, C]), and
    // their size depends on the rows alone, so the result does not depend on the thread count.
    const int64_t chunk = std::max<int64_t>(64, (rows + 63) / 64), chunks = (rows + chunk - 1) / chunk;
    const int64_t cb = std::min(kBlock, cols), nb = (cols + cb - 1) / cb;
    std::vector<float> part(size_t(chunks * cols), 0.f);
    const Lanes lanes = (t == DType::f32 || t == DType::bf16) ? simd_lanes() : Lanes::none;
    const auto add_row = lanes == Lanes::avx512 ? add_row_avx512 : add_row_avx2;
#pragma omp parallel for schedule(static) if (detail::parallel_worth(rows * cols, 1 << 15))
    for (int64_t task = 0; task < chunks * nb; ++task) {
      const int64_t r0 = (task / nb) * chunk, r1 = std::min(rows, r0 + chunk);
      const int64_t c0 = (task % nb) * cb, len = std::min(cb, cols - c0);
      float* a = part.data() + (task / nb) * cols + c0;
      if (lanes != Lanes::none) {
        const char* base = static_cast<const char*>(x.data_ptr());
        const int64_t es = int64_t(dtype_size(t));
        for (int64_t r = r0; r < r1; ++r) {
          const char* row = base + (r * cols + c0) * es;
          // The next rows (fetch_ahead): the gpt's 16 bf16 bias-gradient sums, `mixprec bench
          // --model gpt --precision amp-bf16 --profile` in alternating runs on the AMX host
          // (2026-12-05), 1.47-1.50 -> 1.21-1.26 ms a step.
          fetch_ahead(row, len * es);
          add_row(a, row, t, len);
        }
        continue;
      }
      float buf[kBlock];
      for (int64_t r = r0; r < r1; ++r) {
        const float* v = in_f32(x.data_ptr(), t, r * cols + c0, len, buf);
        for (int64_t i = 0; i < len; ++i) a[i] += v[i];
      }
    }
    std::vector<double> total(size_t(cols), 0.0);
    for (int64_t k = 0; k < chunks; ++k)
      for (int64_t c = 0; c < cols; ++c) total[size_t(c)] += part[size_t(k * cols + c)];
    for (int64_t c = 0; c < cols; ++c) acc[size_t(c)] = float(total[size_t(c)]);
  }
  (void)keepdim;
  convert(acc.data(), DType::f32, dst.data_ptr(), dst.dtype(), acc.size());
  return true;
}

bool all_finite(const Tensor& x, bool& finite) {
  if (!x.is_contiguous()) return false;
  finite = dispatch_floating(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* p = x.data<T>();
    bool ok = true;
    const int64_t n = x.numel();
#pragma omp parallel for reduction(&& : ok) if (detail::parallel_worth(n, (1 << 16) + 1))
    for (int64_t i = 0; i < n; ++i) ok = ok && std::isfinite(double(load(p + i)));
    return ok;
  });
  return true;
}

}  // namespace mixprec::kernels::cpu
