// Elements of a tensor as f32, a block at a time. The fast kernels compute in f32 on f32, bf16
// and f16 data: a 16-bit block is converted into a buffer (the vectorised bulk conversions), an
// f32 block is used in place, and results are rounded once on the way back.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/parallel.h"
#include "mixprec/convert.h"
#include "mixprec/tensor.h"

namespace mixprec::kernels::cpu {

constexpr int64_t kBlock = 4096;  // elements per block: 16 KiB of f32, stays in L1/L2

// f(begin, len) over [0, n) in blocks, in parallel when there is enough work.
template <class F>
void for_blocks(int64_t n, F&& f) {
  const int64_t nb = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (detail::parallel_worth(nb, 4))
  for (int64_t b = 0; b < nb; ++b) f(b * kBlock, std::min(kBlock, n - b * kBlock));
}

inline bool f32_compute(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; }

inline const char* elem_ptr(const void* base, DType t, int64_t i) {
  return static_cast<const char*>(base) + i * int64_t(dtype_size(t));
}

// base[begin, begin + len) of dtype t -> f32 dst.
inline void load_f32(const void* base, DType t, int64_t begin, int64_t len, float* dst) {
  convert(elem_ptr(base, t, begin), t, dst, DType::f32, size_t(len));
}
// f32 src -> base[begin, begin + len) of dtype t, rounded to nearest even.
inline void store_f32(void* base, DType t, int64_t begin, int64_t len, const float* src) {
  convert(src, DType::f32, const_cast<char*>(elem_ptr(base, t, begin)), t, size_t(len));
}

// An input block: f32 in place, 16-bit converted into buf.
inline const float* in_f32(const void* base, DType t, int64_t begin, int64_t len, float* buf) {
  if (t == DType::f32) return static_cast<const float*>(base) + begin;
  load_f32(base, t, begin, len, buf);
  return buf;
}
// Where to compute an output block: straight into an f32 destination, else into buf, which
// flush_f32 then rounds into the destination.
inline float* out_f32(void* base, DType t, int64_t begin, float* buf) {
  return t == DType::f32 ? static_cast<float*>(base) + begin : buf;
}
inline void flush_f32(void* base, DType t, int64_t begin, int64_t len, const float* buf) {
  if (t != DType::f32) store_f32(base, t, begin, len, buf);
}

// Tensor forms (contiguous tensors; element offsets), with a buffer that grows to the block.
inline const float* in_f32(const Tensor& x, int64_t begin, int64_t len, std::vector<float>& buf) {
  if (x.dtype() != DType::f32 && buf.size() < size_t(len)) buf.resize(size_t(len));
  return in_f32(x.data_ptr(), x.dtype(), begin, len, buf.data());
}
inline void store_f32(Tensor& x, int64_t begin, int64_t len, const float* src) {
  store_f32(x.data_ptr(), x.dtype(), begin, len, src);
}

// The element-wise map of the unary and activation families over contiguous x and dst of one
// dtype: f(src, dst, len) on each block in f32 (in place for f32, through buffers for 16-bit).
template <class F>
void map_f32_blocks(const Tensor& x, Tensor& dst, F&& f) {
  const DType t = x.dtype();
  for_blocks(x.numel(), [&](int64_t begin, int64_t len) {
    float bx[kBlock], bo[kBlock];
    const float* v = in_f32(x.data_ptr(), t, begin, len, bx);
    float* o = out_f32(dst.data_ptr(), t, begin, bo);
    f(v, o, len);
    flush_f32(dst.data_ptr(), t, begin, len, o);
  });
}

// The same for an element-wise backward: f(grad, saved, dst, len), all three of one dtype.
template <class F>
void map_grad_f32_blocks(const Tensor& grad, const Tensor& saved, Tensor& dst, F&& f) {
  const DType t = saved.dtype();
  for_blocks(saved.numel(), [&](int64_t begin, int64_t len) {
    float bg[kBlock], bx[kBlock], bo[kBlock];
    const float* g = in_f32(grad.data_ptr(), t, begin, len, bg);
    const float* v = in_f32(saved.data_ptr(), t, begin, len, bx);
    float* o = out_f32(dst.data_ptr(), t, begin, bo);
    f(g, v, o, len);
    flush_f32(dst.data_ptr(), t, begin, len, o);
  });
}

}  // namespace mixprec::kernels::cpu
