// Fast CPU copy: contiguous tensors, a memcpy per block for one dtype, the vectorised bulk
// conversions between f32, bf16 and f16; everything else falls back to the reference.
#include <cstring>

#include "kernels/cpu/f32_blocks.h"
#include "kernels/shape.h"

namespace mixprec::kernels::cpu {

bool copy(const Tensor& src, Tensor& dst) {
  if (!src.is_contiguous() || !dst.is_contiguous()) return false;
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
