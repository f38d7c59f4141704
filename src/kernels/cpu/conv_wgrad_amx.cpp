// The bf16 weight gradient of a wide stride-1 convolution on AMX tiles (conv_paths.cpp's
// wgrad_amx, docs/conv.md item 5): the grid identity of cpu/conv_wgrad_gemm.cpp, each tap's
// product run by TDPBF16PS over operands packed once per chunk of images for all nine taps.
//
// On the grid (conv_wgrad_gemm.cpp's top comment), grad_y's plane at row 0, column 0 of each image's
// hp x wp grid and x's at row pad_h, column pad_w, position t of grad_y's grid pairs with position
// t + o of x's for tap (i, j), o = i wp + j:
//   dW_tap[oc, c] = sum_t dyg[oc, t] xg[c, t + o].
// A (16 output channels x 32 positions a tile) is grad_y's grid, the same for every tap: packed
// once, each tile's 16 rows of 64 bytes side by side. B (16 position pairs x 16 channels x 2) is
// x's grid in AMX's pair layout, shifted by o: a tap whose o is even starts on a pair of the even
// packing ((t, t + 1) from t even), an odd one on the odd packing ((t + 1, t + 2)); both are
// built once, 32 channels a row of 128 bytes, so that every tap reads its B tiles in place.
//
// A block is 32 output channels by 32 channels: four C tiles, two A and two B a step of 32
// positions, the next step's lines asked for (prefetch) while this one's run. Its nine taps run
// one after the other on the same packed A and on B windows o pairs apart, so both stay in the
// core's caches. The f32 sums of a chunk are added to the earlier chunks' (C tiles loaded and
// stored), in chunk order; each sum's order is fixed, whatever the thread count. Channels are
// padded with zeros to multiples of 16: the blocks at their ends may be 16 rows or 16 columns
// (the 420 -> 1000 layer's 1008 x 432 against 1024 x 448).
//
// TDPBF16PS, like oneDNN's AMX kernels that this replaces, treats bf16 subnormal inputs as zero and
// flushes subnormal sums. A non-finite x value meets only its own channel's products, as in the
// matmul form (grad_y's grid is zero wherever a real pair is absent, so a NaN may stand where the
// exact sum has an infinity).
#include <omp.h>

#include <algorithm>
#include <cstring>

#include "core/simd.h"
#include "kernels/cpu/amx_tiles.h"
#include "kernels/cpu/dnnl_conv.h"
#include "mixprec/convert.h"
#include "mixprec/error.h"

#define MIXPREC_AMX_WGRAD __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw")))

namespace mixprec::kernels::cpu {
namespace {

constexpr int64_t kChunkPositions = 4096;  // grid positions per chunk of images, at least one image

// C[16 MR x 16 NR] (+)= A[16 MR x 32 steps] B over `steps` steps of 32 positions (MR, NR 1 or 2:
// a 16-row or 16-column block at the channels' ends). a0, a1: the first step's tiles of rows 0-15
// and 16-31 (each step's tile 512 elements after the last); b: the first step's 16 pair rows of 32
// channels (128 bytes a row; the step's next pairs 1024 elements on); c: row 0, column 0 of the
// sums, ldc floats a row. Tiles: C 0-3 (row block r, column block k: 2 r + k), A 4-5, B 6-7.
template <int MR, int NR>
MIXPREC_AMX_WGRAD void block(const uint16_t* a0, const uint16_t* a1, const uint16_t* b, int64_t steps, float* c,
                             int64_t ldc, bool first) {
  const int64_t cs = ldc * int64_t(sizeof(float));
  if (first) {
    _tile_zero(0);
    if (NR == 2) _tile_zero(1);
    if (MR == 2) _tile_zero(2);
    if (MR == 2 && NR == 2) _tile_zero(3);
  } else {
    _tile_loadd(0, c, cs);
    if (NR == 2) _tile_loadd(1, c + 16, cs);
    if (MR == 2) _tile_loadd(2, c + 16 * ldc, cs);
    if (MR == 2 && NR == 2) _tile_loadd(3, c + 16 * ldc + 16, cs);
  }
  for (int64_t s = 0; s < steps; ++s) {
    // The next step's lines: without them the tile loads waited on L2 (1.14 against 1.56 TFLOP/s on
    // the 420 -> 1000 layer's shapes, 2 cores; docs/conv.md).
    const char* na0 = reinterpret_cast<const char*>(a0 + (s + 1) * 512);
    const char* na1 = reinterpret_cast<const char*>(a1 + (s + 1) * 512);
    const char* nb = reinterpret_cast<const char*>(b + (s + 1) * 1024);
    for (int l = 0; l < 16; ++l) {
      _mm_prefetch(na0 + 64 * l, _MM_HINT_T0);
      if (MR == 2) _mm_prefetch(na1 + 64 * l, _MM_HINT_T0);
      _mm_prefetch(nb + 128 * l, _MM_HINT_T0);
      if (NR == 2) _mm_prefetch(nb + 128 * l + 64, _MM_HINT_T0);
    }
    _tile_loadd(4, a0 + s * 512, 64);
    if (MR == 2) _tile_loadd(5, a1 + s * 512, 64);
    _tile_loadd(6, b + s * 1024, 128);
    if (NR == 2) _tile_loadd(7, b + s * 1024 + 32, 128);
    _tile_dpbf16ps(0, 4, 6);
    if (NR == 2) _tile_dpbf16ps(1, 4, 7);
    if (MR == 2) _tile_dpbf16ps(2, 5, 6);
    if (MR == 2 && NR == 2) _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c, cs);
  if (NR == 2) _tile_stored(1, c + 16, cs);
  if (MR == 2) _tile_stored(2, c + 16 * ldc, cs);
  if (MR == 2 && NR == 2) _tile_stored(3, c + 16 * ldc + 16, cs);
}

using BlockFn = void (*)(const uint16_t*, const uint16_t*, const uint16_t*, int64_t, float*, int64_t, bool);
constexpr BlockFn kBlocks[2][2] = {{block<1, 1>, block<1, 2>}, {block<2, 1>, block<2, 2>}};

// The 32-bit words of 16 rows (row r at src + r * ld bytes), 16 words from each, transposed: word
// k of row r stored at dst + k * 128 + 4 r bytes (one pair row of B, 16 of its channels).
__attribute__((target("avx512f"))) void words_16x16(const char* src, int64_t ld, char* dst) {
  __m512 v[16];
  for (int r = 0; r < 16; ++r) v[r] = _mm512_castsi512_ps(_mm512_loadu_si512(src + r * ld));
  transpose_16x16(v);
  for (int k = 0; k < 16; ++k) _mm512_storeu_ps(dst + k * 128, v[k]);
}

}  // namespace

void backward_weights_amx(const Tensor& grad_y, const Tensor& x, const ConvGeometry& g, ConvGrads& out) {
  Tensor& weight_grad = out.weight;
  const bool with_bias = out.bias.defined();
  MIXPREC_ASSERT(x.dtype() == DType::bf16 && grad_y.dtype() == DType::bf16, "wgrad on AMX: bf16 operands");
  const WgradGrid grid = wgrad_grid(g);
  MIXPREC_ASSERT(g.oh <= grid.hp && g.ow <= grid.wp && g.pad_h <= grid.hp - g.h && g.pad_w <= grid.wp - g.w,
                 "wgrad on AMX: a geometry the grid does not hold");
  const int64_t taps = g.kh * g.kw, image = grid.hp * grid.wp;
  const int64_t images = std::clamp<int64_t>(kChunkPositions / image, 1, g.n);
  const int64_t kp = (images * image + 31) / 32 * 32;  // a full chunk's positions, whole steps
  const int64_t steps = kp / 32;
  // Channels in 16s (the A tiles' rows, the B tiles' columns), blocks of 32 with a 16 at the end.
  const int64_t ocp = (g.oc + 15) / 16 * 16, cp = (g.c + 15) / 16 * 16;
  const int64_t ob = (ocp + 31) / 32, cb = (cp + 31) / 32;
  // Pairs of x's grid a chunk's last step can reach (the last tap's o is grid.lead), whole 16s, and
  // the row its words are read from (both packings; one step past the end for the prefetches).
  const int64_t pairs = (kp + grid.lead) / 32 * 16 + 32;
  const int64_t xlen = 2 * pairs + 32;
  // Every buffer before the parallel regions (an OutOfMemory cannot leave one).
  WorkspaceBuffer a_buf(size_t(ocp * kp) * 2), b_buf(size_t(2 * cb * pairs * 64) * 2);
  WorkspaceBuffer sums_buf(size_t(taps * ocp * cp) * sizeof(float));
  WorkspaceBuffer bias_buf(with_bias ? size_t(g.oc) * sizeof(float) : 0);
  auto* const bias_sums = static_cast<float*>(bias_buf.data());
  if (with_bias) std::fill(bias_sums, bias_sums + g.oc, 0.f);
  const int threads = omp_get_max_threads();
  const int64_t row_elems = std::max(kp, 16 * xlen);  // a thread's grid rows: one of A's, 16 of B's
  WorkspaceBuffer rows_buf(size_t(threads * row_elems) * 2);
  auto* const a = static_cast<uint16_t*>(a_buf.data());
  auto* const b = static_cast<uint16_t*>(b_buf.data());
  auto* const sums = static_cast<float*>(sums_buf.data());
  const auto* const xs = static_cast<const uint16_t*>(x.data_ptr());
  const auto* const ys = static_cast<const uint16_t*>(grad_y.data_ptr());

  for (int64_t n0 = 0; n0 < g.n; n0 += images) {
    const int64_t count = std::min(images, g.n - n0);
    const int64_t run = (count * image + 31) / 32;  // this chunk's steps (fewer in a short last one)
#pragma omp parallel
    {
      uint16_t* const rows = static_cast<uint16_t*>(rows_buf.data()) + omp_get_thread_num() * row_elems;
      // A: each output channel's grid row cut into its steps' tile rows (zeros past the channels).
#pragma omp for schedule(static)
      for (int64_t oc = 0; oc < ocp; ++oc) {
        uint16_t* tile_row = a + ((oc / 16) * steps * 16 + oc % 16) * 32;
        if (oc >= g.oc) {
          for (int64_t s = 0; s < run; ++s) std::memset(tile_row + s * 512, 0, 64);
          continue;
        }
        lay_on_grid(ys, g.oc, oc, n0, count, g.oh, g.ow, grid, 0, 0, kp, 2, rows);
        // The bias gradient from the planes just read, in image order (conv_bias_gradient's bits).
        if (with_bias)
          for (int64_t n = 0; n < count; ++n)
            bias_sums[oc] += conv_bias_plane_sum(ys + ((n0 + n) * g.oc + oc) * g.oh * g.ow, g.oh * g.ow);
        for (int64_t s = 0; s < run; ++s) std::memcpy(tile_row + s * 512, rows + s * 32, 64);
      }
      // B: 16 channels' grid rows at a time, their 32-bit words (pairs) transposed into pair rows,
      // from t even (packing 0) and from t odd (packing 1, the rows read one element on).
#pragma omp for schedule(static)
      for (int64_t c16 = 0; c16 < cp / 16; ++c16) {
        for (int64_t r = 0; r < 16; ++r) {
          const int64_t c = c16 * 16 + r;
          if (c < g.c)
            lay_on_grid(xs, g.c, c, n0, count, g.h, g.w, grid, g.pad_h, g.pad_w, xlen, 2, rows + r * xlen);
          else
            std::memset(rows + r * xlen, 0, size_t(xlen) * 2);
        }
        for (int64_t par = 0; par < 2; ++par) {
          char* dst = reinterpret_cast<char*>(b + ((par * cb + c16 / 2) * pairs) * 64 + (c16 % 2) * 32);
          const char* src = reinterpret_cast<const char*>(rows + par);
          for (int64_t j = 0; j < pairs; j += 16) words_16x16(src + j * 4, xlen * 2, dst + j * 128);
        }
      }
      // The products: 32 x 32 blocks, the nine taps of a block in turn.
      amx::configure();  // every tile 16 rows of 64 bytes (amx_tiles.h)
#pragma omp for schedule(static) collapse(2)
      for (int64_t i = 0; i < ob; ++i)
        for (int64_t j = 0; j < cb; ++j) {
          const uint16_t* a0 = a + (2 * i) * steps * 512;
          const uint16_t* a1 = a0 + steps * 512;
          const BlockFn run_block = kBlocks[ocp - 32 * i > 16][cp - 32 * j > 16];
          for (int64_t tap = 0; tap < taps; ++tap) {
            const int64_t o = (tap / g.kw) * grid.wp + tap % g.kw, par = o % 2;
            const uint16_t* bt = b + ((par * cb + j) * pairs + (o - par) / 2) * 64;
            run_block(a0, a1, bt, run, sums + (tap * ocp + 32 * i) * cp + 32 * j, cp, n0 == 0);
          }
        }
      amx::release();
    }
  }

  // [tap][oc][c] -> [oc][c][tap], rounded once into the gradient's dtype, a row of C x taps at a time.
  char* const dst = static_cast<char*>(weight_grad.data_ptr());
  const size_t out_size = dtype_size(weight_grad.dtype());
  const int64_t row_len = g.c * taps;
  WorkspaceBuffer out_rows(size_t(threads * row_len) * sizeof(float));
#pragma omp parallel for schedule(static)
  for (int64_t oc = 0; oc < g.oc; ++oc) {
    float* row = static_cast<float*>(out_rows.data()) + omp_get_thread_num() * row_len;
    for (int64_t tap = 0; tap < taps; ++tap) {
      const float* src = sums + (tap * ocp + oc) * cp;
      for (int64_t c = 0; c < g.c; ++c) row[c * taps + tap] = src[c];
    }
    convert(row, DType::f32, dst + size_t(oc * row_len) * out_size, weight_grad.dtype(), size_t(row_len));
  }
  if (with_bias) convert(bias_sums, DType::f32, out.bias.data_ptr(), out.bias.dtype(), size_t(g.oc));
}

}  // namespace mixprec::kernels::cpu
