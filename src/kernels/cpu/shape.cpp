// Fast CPU copy: contiguous tensors, a memcpy per block for one dtype, the vectorised bulk
// conversions between f32, bf16 and f16; strided views with a contiguous last dim row by row;
// everything else falls back to the reference.
#include <cstring>

#include "kernels/cpu/f32_blocks.h"
#include "kernels/shape.h"

namespace mixprec::kernels::cpu {
namespace {

// Strided views whose last dim is contiguous in both tensors (a transposed [B, H, T, E] made
// contiguous, a slice of a fused qkv projection's gradient): one memcpy or bulk conversion per
// row, rows in parallel. Other layouts go to the reference.
bool copy_rows(const Tensor& src, Tensor& dst) {
  const int64_t nd = src.dim();
  if (nd < 2) return false;
  const int64_t inner = src.size(nd - 1), n = src.numel();
  if (inner < 8 || src.strides()[size_t(nd - 1)] != 1 || dst.strides()[size_t(nd - 1)] != 1) return false;
  const DType st = src.dtype(), dt = dst.dtype();
  // Same dtype, or a conversion with an f32 side (convert's bulk kernels, no nested OpenMP).
  if (st != dt && !(f32_compute(st) && f32_compute(dt) && (st == DType::f32 || dt == DType::f32))) return false;
  const int64_t ss = int64_t(dtype_size(st)), ds = int64_t(dtype_size(dt)), rows = n / inner;
  const char* s = static_cast<const char*>(src.data_ptr());
  char* d = static_cast<char*>(dst.data_ptr());
  const Shape &shape = src.shape(), &sst = src.strides(), &dst_st = dst.strides();
#pragma omp parallel for schedule(static) if (n >= (int64_t(1) << 15))
  for (int64_t r = 0; r < rows; ++r) {
    int64_t so = 0, doff = 0, rest = r;
    for (int64_t k = nd - 2; k >= 0; --k) {
      const int64_t i = rest % shape[size_t(k)];
      rest /= shape[size_t(k)];
      so += i * sst[size_t(k)];
      doff += i * dst_st[size_t(k)];
    }
    if (st == dt)
      std::memcpy(d + doff * ds, s + so * ss, size_t(inner * ss));
    else
      convert(s + so * ss, st, d + doff * ds, dt, size_t(inner));
  }
  return true;
}

}  // namespace

bool copy(const Tensor& src, Tensor& dst) {
  if (!src.is_contiguous() || !dst.is_contiguous()) return copy_rows(src, dst);
  const int64_t n = src.numel();
  if (src.dtype() == dst.dtype()) {
    const int64_t es = int64_t(dtype_size(src.dtype()));
    const char* s = static_cast<const char*>(src.data_ptr());
    char* d = static_cast<char*>(dst.data_ptr());
    for_blocks(n, [&](int64_t b, int64_t len) { std::memcpy(d + b * es, s + b * es, size_t(len * es)); });
    return true;
  }
  if (!f32_compute(src.dtype()) || !f32_compute(dst.dtype())) return false;
  if (src.dtype() == DType::f32 || dst.dtype() == DType::f32) {
    // One side is f32: convert straight between the tensors, no staging buffer.
    const char* s = static_cast<const char*>(src.data_ptr());
    char* d = static_cast<char*>(dst.data_ptr());
    const int64_t ss = int64_t(dtype_size(src.dtype())), ds = int64_t(dtype_size(dst.dtype()));
    for_blocks(n,
               [&](int64_t b, int64_t len) { convert(s + b * ss, src.dtype(), d + b * ds, dst.dtype(), size_t(len)); });
    return true;
  }
  for_blocks(n, [&](int64_t b, int64_t len) {
    float buf[kBlock];
    load_f32(src.data_ptr(), src.dtype(), b, len, buf);
    store_f32(dst.data_ptr(), dst.dtype(), b, len, buf);
  });
  return true;
}

}  // namespace mixprec::kernels::cpu
