// The weight gradient of a wide stride-1 convolution (bf16 or f32) as one matrix product per tap, over
// zero-padded copies of x and grad_y laid on a shared grid (see conv.cpp's wgrad_as_gemm and
// docs/conv.md).
//
// dW[oc, c, i, j] = sum over images n and output positions (oh, ow) of
// dy[n, oc, oh, ow] * x[n, c, oh + i - pad_h, ow + j - pad_w]. Lay every image's planes on a grid
// of hp x wp positions, hp = h + max(top, bottom pad) and wp = w + max(left, right pad), one image
// after the other: x's plane sits at row pad_h, column pad_w of its image's grid, grad_y's at row
// 0, column 0, zeros elsewhere. The zeros after a row (or an image) are the next row's (image's)
// leading zeros too, so they serve as both the right (bottom) padding of one and the left (top)
// padding of the next. Then position r of grad_y's grid pairs, for tap (i, j), with position
// r + o of x's, o = i * wp + j, for every r: each tap is one product over all positions,
//   dW_tap[oc, c] = sum_s dyg[oc, s - o] * xg[c, s],
// a [OC x K] by [K x C] matmul over the K >= R + lead positions of a row (R = n hp wp; lead, the
// last tap's o), whose A operand is grad_y's grid read o elements early. grad_y's rows start with
// lead zeros and both grids' rows are K long, so each tap's A and the one B are dense, which
// oneDNN 2.6's brgemm matmul needs; with other leading dimensions it runs gemm:jit, which mallocs
// per-thread packing buffers (0.6 MB a thread for the 64 -> 2304 layer of the memory test) outside
// the scratchpad we pass, and so outside the allocator and the budget. A's window runs lead - o
// elements into the next row: its leading zeros, so a non-finite value meets only its own
// channel's products. On the AVX512-BF16 kind oneDNN's matmuls run these sums faster than its
// convolutions, in bf16 and in f32, the zero positions (K over n oh ow: 16% for 14 x 14 planes)
// included. f32 accumulation; one rounding into the gradient's dtype.
//
// The images go in chunks of about kWgradChunkPositions positions, each chunk's products added to
// the sums of the chunks before, so the grids take a few MB whatever the batch (the 420 -> 1000
// layer: 24 images, 15 MB in bf16; a whole batch of 64 would take 41 MB, more than the blocked
// copies of oneDNN's convolutions). oneDNN's bf16 gemm ran chunks of 8 to 64 images of that layer
// at the same rate (660-750 GFLOP/s, 2026-12-02), its f32 one whole eights of images.
#include <omp.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/dnnl_conv.h"
#include "kernels/cpu/dnnl_matmul.h"
#include "mixprec/convert.h"
#include "mixprec/error.h"

namespace mixprec::kernels::cpu {

int64_t wgrad_stride(const WgradGrid& grid, int64_t images) {
  return (images * grid.hp * grid.wp + grid.lead + 31) / 32 * 32;  // 64-byte rows
}

WgradGrid wgrad_grid(const ConvGeometry& g) {
  WgradGrid grid;
  const int64_t pad_b = g.oh - 1 + g.kh - g.h - g.pad_h, pad_r = g.ow - 1 + g.kw - g.w - g.pad_w;
  grid.hp = g.h + std::max(g.pad_h, pad_b);
  grid.wp = g.w + std::max(g.pad_w, pad_r);
  const int64_t image = grid.hp * grid.wp;
  // Whole eights of images: oneDNN's f32 gemm ran chunks of 16, 24, 32, 40 and 48 images of the
  // 420 -> 1000 layer at 341-353 GFLOP/s, and of 19 or 27 at 264-309.
  const int64_t eights = (kWgradChunkPositions + 8 * image - 1) / (8 * image);
  grid.images = std::clamp<int64_t>(8 * eights, 1, std::max<int64_t>(g.n, 1));
  grid.positions = grid.images * image;
  grid.lead = (g.kh - 1) * grid.wp + g.kw - 1;
  grid.stride = wgrad_stride(grid, grid.images);
  return grid;
}

// Channel ch of images n0 .. n0 + count of src ([N, channels, h, w], es-byte elements) onto a grid
// row of len positions: each image's plane at row top, column left of the image's hp x wp grid,
// zeros elsewhere (zero bits are 0 in both dtypes). The position is top * wp + left along the row:
// grad_y's planes go at left = lead, after its leading zeros.
void lay_on_grid(const void* src, int64_t channels, int64_t ch, int64_t n0, int64_t count, int64_t h, int64_t w,
                 const WgradGrid& grid, int64_t top, int64_t left, int64_t len, size_t es, void* row) {
  const char* s = static_cast<const char*>(src);
  char* r = static_cast<char*>(row);
  std::memset(r, 0, size_t(len) * es);
  for (int64_t n = 0; n < count; ++n)
    for (int64_t i = 0; i < h; ++i)
      std::memcpy(r + size_t(n * grid.hp * grid.wp + (i + top) * grid.wp + left) * es,
                  s + size_t((((n0 + n) * channels + ch) * h + i) * w) * es, size_t(w) * es);
}

void backward_weights_as_gemm(const Tensor& grad_y, const Tensor& x, const ConvGeometry& g, Tensor& weight_grad) {
  const DType t = x.dtype();
  MIXPREC_ASSERT((t == DType::bf16 || t == DType::f32) && grad_y.dtype() == t, "wgrad as gemm: bf16 or f32 operands");
  const WgradGrid grid = wgrad_grid(g);
  MIXPREC_ASSERT(g.oh <= grid.hp && g.ow <= grid.wp && g.pad_h <= grid.hp - g.h && g.pad_w <= grid.wp - g.w,
                 "wgrad as gemm: a geometry the grid does not hold");
  const int64_t taps = g.kh * g.kw;
  const size_t es = dtype_size(t);
  // Every buffer before the parallel regions (an OutOfMemory cannot leave one): one chunk of
  // images' grids, whatever the batch, and the f32 sums of every tap. grad_y's reaches `lead`
  // elements past its last row: the last tap's window.
  WorkspaceBuffer xg_buf(size_t(g.c * grid.stride) * es), yg_buf(size_t(g.oc * grid.stride + grid.lead) * es);
  WorkspaceBuffer products(size_t(taps * g.oc * g.c) * sizeof(float));
  const int64_t row_len = g.c * taps;
  WorkspaceBuffer rows(size_t(omp_get_max_threads() * row_len) * sizeof(float));
  char* const xg = static_cast<char*>(xg_buf.data());
  char* const yg = static_cast<char*>(yg_buf.data());
  auto* const dw = static_cast<float*>(products.data());
  const char* const xs = static_cast<const char*>(x.data_ptr());
  const char* const ys = static_cast<const char*>(grad_y.data_ptr());
  std::memset(yg + size_t(g.oc * grid.stride) * es, 0, size_t(grid.lead) * es);

  for (int64_t n0 = 0; n0 < g.n; n0 += grid.images) {
    const int64_t count = std::min(grid.images, g.n - n0);
    const int64_t stride = wgrad_stride(grid, count);
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < g.c; ++c)
      lay_on_grid(xs, g.c, c, n0, count, g.h, g.w, grid, g.pad_h, g.pad_w, stride, es, xg + size_t(c * stride) * es);
#pragma omp parallel for schedule(static)
    for (int64_t oc = 0; oc < g.oc; ++oc)
      lay_on_grid(ys, g.oc, oc, n0, count, g.oh, g.ow, grid, 0, grid.lead, stride, es, yg + size_t(oc * stride) * es);
    if (stride < grid.stride)  // a short last chunk: the last row's window reads up to `lead` past it
      std::memset(yg + size_t(g.oc * stride) * es, 0, size_t(grid.lead) * es);
    // Each tap's sums over this chunk, added to the earlier chunks' (in chunk order): x's grid as
    // laid, grad_y's read from lead - o, both dense (see the top of the file).
    for (int64_t tap = 0; tap < taps; ++tap) {
      const int64_t offset = (tap / g.kw) * grid.wp + tap % g.kw;
      MatmulArgs m;
      m.m = g.oc, m.n = g.c, m.k = stride;
      m.src_t = m.wei_t = t;
      m.dst_t = DType::f32;
      m.src = yg + size_t(grid.lead - offset) * es, m.src_stride_m = stride, m.src_stride_k = 1;
      m.wei = xg, m.wei_stride_k = 1, m.wei_stride_n = stride;
      m.dst = dw + tap * g.oc * g.c, m.dst_stride_m = g.c;
      m.accumulate = n0 > 0;
      matmul(m);
    }
  }

  // [tap][oc][c] -> [oc][c][tap], rounded once into the gradient's dtype, a row of C x taps at a time.
  char* const out = static_cast<char*>(weight_grad.data_ptr());
  const size_t out_size = dtype_size(weight_grad.dtype());
#pragma omp parallel for schedule(static)
  for (int64_t oc = 0; oc < g.oc; ++oc) {
    float* row = static_cast<float*>(rows.data()) + omp_get_thread_num() * row_len;
    for (int64_t tap = 0; tap < taps; ++tap) {
      const float* src = dw + (tap * g.oc + oc) * g.c;
      for (int64_t c = 0; c < g.c; ++c) row[c * taps + tap] = src[c];
    }
    convert(row, DType::f32, out + size_t(oc * row_len) * out_size, weight_grad.dtype(), size_t(row_len));
  }
}

}  // namespace mixprec::kernels::cpu
