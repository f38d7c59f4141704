// Fast CPU copy: contiguous tensors, a memcpy per block for one dtype, the vectorised bulk
// conversions between f32, bf16 and f16; strided views with a contiguous last dim row by row;
// views whose unit-stride dim is another one (a transpose) in tiles; everything else falls back
// to the reference.
#include <omp.h>

#include <cstring>
#include <vector>

#include "core/parallel.h"
#include "core/simd.h"
#include "kernels/cpu/f32_blocks.h"
#include "kernels/shape.h"

namespace mixprec::kernels::cpu {
namespace {

// The copy's dtypes: one, or a conversion with an f32 side (convert's bulk kernels).
bool copyable(DType st, DType dt) {
  return st == dt || (f32_compute(st) && f32_compute(dt) && (st == DType::f32 || dt == DType::f32));
}

// Strided views whose last dim is contiguous in both tensors (a transposed [B, H, T, E] made
// contiguous, a slice of a fused qkv projection's gradient): one memcpy or bulk conversion per
// row, rows in parallel. Other layouts go to the reference.
bool copy_rows(const Tensor& src, Tensor& dst) {
  const int64_t nd = src.dim();
  if (nd < 2) return false;
  const int64_t inner = src.size(nd - 1), n = src.numel();
  if (inner < 8 || src.strides()[size_t(nd - 1)] != 1 || dst.strides()[size_t(nd - 1)] != 1) return false;
  const DType st = src.dtype(), dt = dst.dtype();
  if (!copyable(st, dt)) return false;  // (convert's bulk kernels: no nested OpenMP)
  const int64_t ss = int64_t(dtype_size(st)), ds = int64_t(dtype_size(dt)), rows = n / inner;
  const char* s = static_cast<const char*>(src.data_ptr());
  char* d = static_cast<char*>(dst.data_ptr());
  const Shape &shape = src.shape(), &sst = src.strides(), &dst_st = dst.strides();
  if (rows == 0) return true;
    // Each thread a range of rows, walked with an odometer over the leading dims: the offsets of
    // its first row from one division per dim, then additions (a division per dim and row cost more
    // than a 128-byte row's copy).
#pragma omp parallel if (detail::parallel_worth(n, int64_t(1) << 15))
  {
    const int64_t threads = omp_get_num_threads(), id = omp_get_thread_num();
    const int64_t r0 = rows * id / threads, r1 = rows * (id + 1) / threads;
    std::vector<int64_t> idx(size_t(nd - 1), 0);
    int64_t so = 0, doff = 0;
    for (int64_t k = nd - 2, rest = r0; k >= 0; --k) {
      idx[size_t(k)] = rest % shape[size_t(k)];
      rest /= shape[size_t(k)];
      so += idx[size_t(k)] * sst[size_t(k)];
      doff += idx[size_t(k)] * dst_st[size_t(k)];
    }
    for (int64_t r = r0; r < r1; ++r) {
      if (st == dt)
        std::memcpy(d + doff * ds, s + so * ss, size_t(inner * ss));
      else
        convert(s + so * ss, st, d + doff * ds, dt, size_t(inner));
      for (int64_t k = nd - 2; k >= 0; --k) {  // the next row's offsets
        so += sst[size_t(k)];
        doff += dst_st[size_t(k)];
        if (++idx[size_t(k)] < shape[size_t(k)]) break;
        so -= shape[size_t(k)] * sst[size_t(k)];
        doff -= shape[size_t(k)] * dst_st[size_t(k)];
        idx[size_t(k)] = 0;
      }
    }
  }
  return true;
}

constexpr int64_t kTile = 32;

// One kTile x kTile tile: src's unit-stride dim p (np elements from s, stride 1) against the last
// dim (nl elements, stride sl in src, 1 in dst, dst rows dp apart). Read down p, which is
// contiguous, into a tile of src's dtype; write each dst row from it (a copy or a conversion).
template <class E>
void copy_tile(const E* s, int64_t sl, int64_t np, int64_t nl, char* d, int64_t dp, DType st, DType dt) {
  E tile[kTile * kTile];
  for (int64_t j = 0; j < nl; ++j)
    for (int64_t i = 0; i < np; ++i) tile[i * kTile + j] = s[j * sl + i];
  const int64_t ds = int64_t(dtype_size(dt));
  for (int64_t i = 0; i < np; ++i) {
    if (st == dt)
      std::memcpy(d + i * dp * ds, tile + i * kTile, size_t(nl) * sizeof(E));
    else
      convert(tile + i * kTile, st, d + i * dp * ds, dt, size_t(nl));
  }
}

// Views whose last dim is contiguous in dst but not in src, where another dim p of src has unit
// stride: a transpose made contiguous (x.transpose(0, 1).contiguous(), the widened operand of a
// transposed matmul). Element by element through the reference, [384, 4096] of bf16 took 58 ms
// to f32 on an AVX-512 Xeon; here each kTile x kTile tile of (p, last) is read along p and
// written along the last dim, tiles in parallel.
bool copy_tiles(const Tensor& src, Tensor& dst) {
  const int64_t nd = src.dim(), last = nd - 1;
  if (nd < 2 || !copyable(src.dtype(), dst.dtype())) return false;
  const Shape &shape = src.shape(), &sst = src.strides(), &dst_st = dst.strides();
  if (dst_st[size_t(last)] != 1 || sst[size_t(last)] == 1) return false;
  int64_t p = -1;
  for (int64_t k = 0; k < last && p < 0; ++k)
    if (sst[size_t(k)] == 1 && shape[size_t(k)] > 1) p = k;
  if (p < 0) return false;
  const int64_t np = shape[size_t(p)], nl = shape[size_t(last)];
  if (np < 2 || nl < 2) return false;  // not a transpose: rows or copy_rows
  const int64_t outer = src.numel() / (np * nl), tp = (np + kTile - 1) / kTile, tl = (nl + kTile - 1) / kTile;
  const DType st = src.dtype(), dt = dst.dtype();
  const int64_t ss = int64_t(dtype_size(st)), ds = int64_t(dtype_size(dt));
  const char* s = static_cast<const char*>(src.data_ptr());
  char* d = static_cast<char*>(dst.data_ptr());
  const int64_t tiles = outer * tp * tl;
  // One dtype of 2 or 4 bytes on AVX-512: the tiles through registers (core/simd.h), 4-5x the scalar
  // tile's rate on 16-bit and 2-3x on 32-bit elements (docs/design.md, "Transposes").
  const bool avx512 = simd_lanes() == Lanes::avx512 && st == dt;
  const bool fast16 = avx512 && ss == 2 && mixprec::cpu::has_avx512bw(), fast32 = avx512 && ss == 4;
#pragma omp parallel for schedule(static) if (detail::parallel_worth(src.numel(), int64_t(1) << 15))
  for (int64_t t = 0; t < tiles; ++t) {
    int64_t rest = t / (tp * tl);
    const int64_t ip = (t / tl) % tp * kTile, il = t % tl * kTile;
    int64_t so = ip + il * sst[size_t(last)], doff = ip * dst_st[size_t(p)] + il;
    for (int64_t k = last - 1; k >= 0; --k) {  // the outer index over every dim but p and last
      if (k == p) continue;
      const int64_t i = rest % shape[size_t(k)];
      rest /= shape[size_t(k)];
      so += i * sst[size_t(k)];
      doff += i * dst_st[size_t(k)];
    }
    const int64_t n_p = std::min(kTile, np - ip), n_l = std::min(kTile, nl - il);
    const int64_t sl = sst[size_t(last)], dp = dst_st[size_t(p)];
    char* out = d + doff * ds;
    switch (ss) {
      case 1:
        copy_tile(reinterpret_cast<const uint8_t*>(s) + so, sl, n_p, n_l, out, dp, st, dt);
        break;
      case 2:
        if (fast16)
          transpose_32x32_16bit(reinterpret_cast<const uint16_t*>(s) + so, sl, n_l, n_p,
                                reinterpret_cast<uint16_t*>(out), dp);
        else
          copy_tile(reinterpret_cast<const uint16_t*>(s) + so, sl, n_p, n_l, out, dp, st, dt);
        break;
      case 4:
        if (fast32)  // 16 x 16 blocks of the tile
          for (int64_t bl = 0; bl < n_l; bl += 16)
            for (int64_t bp = 0; bp < n_p; bp += 16)
              transpose_16x16_32bit(reinterpret_cast<const float*>(s) + so + bl * sl + bp, sl,
                                    std::min<int64_t>(16, n_l - bl), std::min<int64_t>(16, n_p - bp),
                                    reinterpret_cast<float*>(out) + bp * dp + bl, dp);
        else
          copy_tile(reinterpret_cast<const uint32_t*>(s) + so, sl, n_p, n_l, out, dp, st, dt);
        break;
      default:
        copy_tile(reinterpret_cast<const uint64_t*>(s) + so, sl, n_p, n_l, out, dp, st, dt);
        break;
    }
  }
  return true;
}

}  // namespace

bool copy(const Tensor& src, Tensor& dst) {
  if (!src.is_contiguous() || !dst.is_contiguous()) return copy_rows(src, dst) || copy_tiles(src, dst);
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
