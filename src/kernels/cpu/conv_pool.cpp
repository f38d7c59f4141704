// Max pooling of a convolution's output read in the oneDNN primitive's own layout (dnnl_conv.h,
// max_pool_from_layout): the pool of kernels::conv2d_max_pool2d_forward, which then never reorders
// the full-size output into NCHW for the pool to read it back. Each task pools one image's run of
// channels (a block of nChw8c / nChw16c, or all channels of NHWC), eight channels side by side in
// vectors, into a tile [output positions][run] that is then transposed 8 x 8 into the NCHW planes
// with its argmax (docs/conv.md, item 6). The window rule is window_max's
// (pool_window.h): ties keep the first tap, a NaN wins and the last NaN stays; the values are
// rounded into the output's dtype before they are compared, so the winners are those of the pool
// over the rounded NCHW output, bit for bit.
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <type_traits>

#include "core/simd.h"
#include "kernels/cpu/dnnl_conv.h"
#include "kernels/pool_window.h"
#include "mixprec/convert.h"

namespace mixprec::kernels::cpu {
namespace {

// The layout of a 4-d [N, C, H, W] buffer: element (n, c, h, w) at n s0 + (c / block) s1 + h s2 +
// w s3 + c % block (block 1: c s1). Channels come in contiguous runs of `run`.
struct Layout {
  int64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0, block = 1, run = 0;

  // The kernels' tasks over c channels: one image's run of channels each, runs(c) an image.
  struct Task {
    int64_t n, c0, len;  // image n, channels c0 .. c0 + len
    int64_t at;          // the run's first element in the layout
  };
  int64_t runs(int64_t c) const { return (c + run - 1) / run; }
  Task task(int64_t i, int64_t c) const {
    const int64_t gi = i % runs(c), n = i / runs(c), c0 = gi * run;
    return {n, c0, std::min(run, c - c0), n * s0 + (block > 1 ? gi * s1 : 0)};
  }
};

std::optional<Layout> layout_of(const dnnl::memory::desc& md) {
  const dnnl_memory_desc_t& d = md.data;
  if (d.ndims != 4 || d.format_kind != dnnl_blocked || d.offset0 != 0 || d.extra.flags != 0) return std::nullopt;
  if (d.data_type != dnnl_f32 && d.data_type != dnnl_bf16) return std::nullopt;
  const auto& b = d.format_desc.blocking;
  Layout l;
  l.s0 = b.strides[0], l.s1 = b.strides[1], l.s2 = b.strides[2], l.s3 = b.strides[3];
  if (b.inner_nblks == 1 && b.inner_idxs[0] == 1) {
    l.block = l.run = b.inner_blks[0];
  } else if (b.inner_nblks == 0 && l.s1 == 1) {
    l.run = d.dims[1];  // NHWC: all channels of a position side by side
  } else {
    return std::nullopt;  // NCHW (a run of one: nothing to gain) or another blocking
  }
  // A row of one run, its W positions, is contiguous (what a task converts at once): positions
  // `block` apart in a blocked layout, C apart in NHWC.
  if (l.s3 != (l.block > 1 ? l.block : l.run) || l.run < 2) return std::nullopt;
  return l;
}

// v's lanes that win against best's: greater, or a NaN (window_max's scan).
__attribute__((target("avx2"))) inline __m256 wins(__m256 v, __m256 best) {
  return _mm256_or_ps(_mm256_cmp_ps(v, best, _CMP_GT_OQ), _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
}
// Eight int32 taps (each < 256) stored as floats (the tile's argmax goes through the same transposes).
__attribute__((target("avx2"))) inline void store_taps(__m256i a, float* to) {
  _mm256_storeu_ps(to, _mm256_cvtepi32_ps(a));
}

// best[j], arg[j] over the taps of one window, channels j0 .. len: window_max's scan, one lane at a time.
void window_lanes(const float* const* tap, const int32_t* k, int ntaps, int64_t j0, int64_t len, float* best,
                  float* arg) {
  for (int64_t j = j0; j < len; ++j) {
    float b = tap[0][j];
    int32_t a = k[0];
    for (int t = 1; t < ntaps; ++t) {
      const float v = tap[t][j];
      if (v > b || v != v) b = v, a = k[t];
    }
    best[j] = b, arg[j] = float(a);
  }
}

// The same, eight channels at a time from j = 0 where the host has AVX2 (returns where it stopped).
// Always inlined: the 2x2 rows below call it per window with its four taps known.
__attribute__((target("avx2"), always_inline)) inline int64_t window_avx2(const float* const* tap, const int32_t* k,
                                                                          int ntaps, int64_t len, float* best,
                                                                          float* arg) {
  int64_t j = 0;
  for (; j + 8 <= len; j += 8) {
    __m256 b = _mm256_loadu_ps(tap[0] + j);
    __m256i a = _mm256_set1_epi32(k[0]);
    for (int t = 1; t < ntaps; ++t) {
      const __m256 v = _mm256_loadu_ps(tap[t] + j);
      const __m256i take = _mm256_castps_si256(wins(v, b));
      b = _mm256_blendv_ps(b, v, _mm256_castsi256_ps(take));
      a = _mm256_blendv_epi8(a, _mm256_set1_epi32(k[t]), take);
    }
    _mm256_storeu_ps(best + j, b);
    store_taps(a, arg + j);
  }
  return j;
}

__attribute__((target("avx2"))) int64_t any_window_avx2(const float* const* tap, const int32_t* k, int ntaps,
                                                        int64_t len, float* best, float* arg) {
  return window_avx2(tap, k, ntaps, len, best, arg);
}

void window(const float* const* tap, const int32_t* k, int ntaps, int64_t len, float* best, float* arg, bool avx2) {
  if (ntaps == 0) {  // a window wholly on the padding (window_max's start values)
    std::fill(best, best + len, -std::numeric_limits<float>::infinity());
    std::fill(arg, arg + len, float(uint8_t(-1)));  // -1 as the u8 argmax holds it
    return;
  }
  window_lanes(tap, k, ntaps, avx2 ? any_window_avx2(tap, k, ntaps, len, best, arg) : 0, len, best, arg);
}

// One output row of a 2x2, stride-2 pool without padding: input rows r0 and r1 (positions s3 apart),
// output positions `run` apart in best and arg; taps 0 1 / 2 3 in window_max's order. The windows'
// taps are known here: the AVX2 form inlines window_avx2 with its four.
constexpr int32_t kTaps2x2[4] = {0, 1, 2, 3};

// Window ox's taps: (2 ox, 2 ox + 1) of rows r0 and r1.
inline void taps_2x2(const float* r0, const float* r1, int64_t s3, int64_t ox, const float* (&t)[4]) {
  t[0] = r0 + 2 * ox * s3, t[1] = t[0] + s3, t[2] = r1 + 2 * ox * s3, t[3] = t[2] + s3;
}

__attribute__((target("avx2"))) void row_2x2_avx2(const float* r0, const float* r1, int64_t s3, int64_t ow, int64_t len,
                                                  int64_t run, float* best, float* arg) {
  for (int64_t ox = 0; ox < ow; ++ox) {
    const float* t[4];
    taps_2x2(r0, r1, s3, ox, t);
    window_avx2(t, kTaps2x2, 4, len, best + ox * run, arg + ox * run);
  }
}

void row_2x2(const float* r0, const float* r1, int64_t s3, int64_t ow, int64_t len, int64_t run, float* best,
             float* arg, bool avx2) {
  if (avx2) row_2x2_avx2(r0, r1, s3, ow, len, run, best, arg);
  const int64_t j0 = avx2 ? len / 8 * 8 : 0;
  if (j0 == len) return;
  for (int64_t ox = 0; ox < ow; ++ox) {
    const float* t[4];
    taps_2x2(r0, r1, s3, ox, t);
    window_lanes(t, kTaps2x2, 4, j0, len, best + ox * run, arg + ox * run);
  }
}

// dst[c][r] = src[r][c] for r < rows and c < cols (src's rows lds apart, dst's ldd apart), by 8 x 8
// blocks where the host has AVX2. The pool's tile [positions][run] into NCHW planes, and back.
void transpose_f32(const float* src, int64_t lds, int64_t rows, int64_t cols, float* dst, int64_t ldd, bool avx2) {
  const int64_t r8 = avx2 ? rows / 8 * 8 : 0, c8 = avx2 ? cols / 8 * 8 : 0;
  for (int64_t r = 0; r < r8; r += 8)
    for (int64_t c = 0; c < c8; c += 8) transpose_8x8_avx2(src + r * lds + c, lds, dst + c * ldd + r, ldd);
  for (int64_t r = 0; r < rows; ++r)  // the edges: past c8 in the blocks' rows, every column past r8
    for (int64_t c = r < r8 ? c8 : 0; c < cols; ++c) dst[c * ldd + r] = src[r * lds + c];
}

// The tile [plane][run] (channels 0 .. len used) as columns col [len][plane].
void tile_to_columns(const float* tile, int64_t run, int64_t plane, int64_t len, float* col, bool avx2) {
  transpose_f32(tile, run, plane, len, col, plane, avx2);
}

// n taps held as floats (0 .. 255) into bytes.
__attribute__((target("avx2"))) int64_t taps_to_bytes_avx2(const float* f, int64_t n, uint8_t* to) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i a = _mm256_cvttps_epi32(_mm256_loadu_ps(f + i));
    const __m128i w16 = _mm_packs_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(to + i), _mm_packus_epi16(w16, w16));
  }
  return i;
}
void taps_to_bytes(const float* f, int64_t n, uint8_t* to, bool avx2) {
  for (int64_t i = avx2 ? taps_to_bytes_avx2(f, n, to) : 0; i < n; ++i) to[i] = uint8_t(int32_t(f[i]));
}

// The columns col [len][plane] as the tile [plane][run] (tile_to_columns reversed); lanes len .. run
// of each position (a blocked layout's padded channels) zeroed.
void columns_to_tile(const float* col, int64_t plane, int64_t len, int64_t run, float* tile, bool avx2) {
  transpose_f32(col, plane, len, plane, tile, run, avx2);
  if (len < run)
    for (int64_t q = 0; q < plane; ++q) std::fill(tile + q * run + len, tile + (q + 1) * run, 0.0f);
}

// Eight f32 lanes from eight In values (float, or bf16's bits: widened exactly), and back into
// eight Out values (float, or bf16: values that were bf16, narrowed exactly by dropping the low
// bits).
template <class In>
__attribute__((target("avx2"))) inline __m256 load8(const In* p) {
  if constexpr (std::is_same_v<In, float>) {
    return _mm256_loadu_ps(p);
  } else {
    return bf16_widen_avx2(p);
  }
}
template <class Out>
__attribute__((target("avx2"))) inline void store8(Out* p, __m256 v) {
  if constexpr (std::is_same_v<Out, float>) {
    _mm256_storeu_ps(p, v);
  } else {
    const __m256i hi = _mm256_srli_epi32(_mm256_castps_si256(v), 16);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                     _mm_packus_epi32(_mm256_castsi256_si128(hi), _mm256_extracti128_si256(hi, 1)));
  }
}
template <class In>
float widen(In v) {
  if constexpr (std::is_same_v<In, float>) {
    return v;
  } else {
    return bf16_to_f32(v);
  }
}

// The 2x2/2 pool that tiles its input exactly, eight channels at a time (runs of whole eights): one
// image's run of channels, gy and arg at its first plane, `to` at its first position. Each eight
// channels' gradients and argmax are transposed into [output position][8] (f32: gt, at), then
// every output position's four inputs are stored at once, each the gradient where its tap won and
// +0 elsewhere: the values max_pool2d_backward writes there, each input reached by one window.
// With relu_y (the pooled output after a ReLU, at the run's first plane), each gradient is first
// kept where relu_y > 0 and +0 elsewhere (the ReLU's backward). The argmax's taps from tap p0 (the
// run's first plane's). scratch: 26 out_plane floats.
template <class In, class Out>
__attribute__((target("avx2"))) void unpool_run_2x2_avx2(const In* gy, const In* relu_y, const ArgmaxTaps& argmax,
                                                         int64_t p0, const PoolGeometry& g, int64_t len, int64_t run,
                                                         float* scratch, Out* to) {
  const int64_t out_plane = g.oh * g.ow;
  const __m256 tap[4] = {_mm256_set1_ps(0), _mm256_set1_ps(1), _mm256_set1_ps(2), _mm256_set1_ps(3)};
  float* gt = scratch;                  // [out_plane][8]
  float* at = gt + out_plane * 8;       // [out_plane][8]
  float* rows = at + out_plane * 8;     // eight channels' argmax as floats [8][out_plane]
  float* zeros = rows + 8 * out_plane;  // the gradient of a channel past len (a partial block's padding)
  auto* taps_buf = reinterpret_cast<uint8_t*>(zeros + out_plane);  // a channel's taps, unpacked
  if (len < run) std::fill(zeros, zeros + out_plane, 0.0f);
  for (int64_t j0 = 0; j0 < run; j0 += 8) {
    // Channels j0 .. j0 + 8 as rows [8][out_plane] (those past len zero), transposed into [q][8].
    for (int64_t j = 0; j < 8; ++j) {
      float* r = rows + j * out_plane;
      if (j0 + j >= len) {
        std::fill(r, r + out_plane, 0.0f);
        continue;
      }
      const uint8_t* a = argmax.taps(p0 + (j0 + j) * out_plane, out_plane, taps_buf);
      int64_t q = 0;
      for (; q + 8 <= out_plane; q += 8)
        _mm256_storeu_ps(
            r + q, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(a + q)))));
      for (; q < out_plane; ++q) r[q] = float(a[q]);
    }
    int64_t q0 = 0;
    for (; q0 + 8 <= out_plane; q0 += 8) {
      transpose_8x8_avx2(rows + q0, out_plane, at + q0 * 8, 8);
      alignas(32) float blk[64];
      for (int64_t j = 0; j < 8; ++j) {  // channel j's gradients q0 .. q0 + 8
        const int64_t at_q = (j0 + j) * out_plane + q0;
        __m256 v = j0 + j < len ? load8(gy + at_q) : _mm256_loadu_ps(zeros + q0);
        if (relu_y != nullptr && j0 + j < len)
          v = _mm256_and_ps(v, _mm256_cmp_ps(load8(relu_y + at_q), _mm256_setzero_ps(), _CMP_GT_OQ));
        _mm256_store_ps(blk + j * 8, v);
      }
      transpose_8x8_avx2(blk, 8, gt + q0 * 8, 8);
    }
    for (int64_t q = q0; q < out_plane; ++q)
      for (int64_t j = 0; j < 8; ++j) {
        at[q * 8 + j] = rows[j * out_plane + q];
        const int64_t i = (j0 + j) * out_plane + q;
        const bool passes = j0 + j < len && (relu_y == nullptr || widen(relu_y[i]) > 0.0f);
        gt[q * 8 + j] = passes ? widen(gy[i]) : 0.0f;
      }
    for (int64_t oy = 0; oy < g.oh; ++oy)
      for (int64_t ox = 0; ox < g.ow; ++ox) {
        const int64_t q = oy * g.ow + ox;
        const __m256 v = _mm256_loadu_ps(gt + q * 8), a = _mm256_loadu_ps(at + q * 8);
        Out* d0 = to + (2 * oy * g.w + 2 * ox) * run + j0;
        Out* d1 = d0 + g.w * run;
        store8(d0, _mm256_and_ps(v, _mm256_cmp_ps(a, tap[0], _CMP_EQ_OQ)));
        store8(d0 + run, _mm256_and_ps(v, _mm256_cmp_ps(a, tap[1], _CMP_EQ_OQ)));
        store8(d1, _mm256_and_ps(v, _mm256_cmp_ps(a, tap[2], _CMP_EQ_OQ)));
        store8(d1 + run, _mm256_and_ps(v, _mm256_cmp_ps(a, tap[3], _CMP_EQ_OQ)));
      }
  }
}

}  // namespace

bool unpool_writes_layout(const dnnl::memory::desc& md, const PoolGeometry& g, DType t) {
  const std::optional<Layout> l = layout_of(md);
  if (!l || g.argmax_dtype() != DType::u8 || g.adaptive) return false;
  const dnnl_memory_desc_t& d = md.data;
  if (d.dims[0] != g.n || d.dims[1] != g.c || d.dims[2] != g.h || d.dims[3] != g.w) return false;
  // One run's positions, every row of it, side by side: the tile a task writes is contiguous.
  if (l->s2 != g.w * l->s3) return false;
  if (d.data_type == dnnl_bf16) return t == DType::bf16;
  return t == DType::f32 || t == DType::bf16 || t == DType::f16;
}

void max_unpool_to_layout(const Tensor& grad_pooled, const ArgmaxTaps& argmax, const PoolGeometry& g,
                          const dnnl::memory::desc& md, void* dst, const Tensor* relu_y) {
  const Layout l = *layout_of(md);
  const DType t = grad_pooled.dtype();
  const bool dst_bf16 = md.data.data_type == dnnl_bf16;
  const bool avx2 = simd_lanes() != Lanes::none;
  const int64_t tasks = g.n * l.runs(g.c);
  const int64_t in_plane = g.h * g.w, out_plane = g.oh * g.ow, tile = in_plane * l.run;
  const int threads = std::max(1, std::min<int>(omp_get_max_threads(), int(tasks)));
  // The cnns' pool (2x2/2, the input tiled exactly) into runs of whole eights, from f32 or bf16:
  // unpool_run_2x2_avx2.
  if (avx2 && (t == DType::f32 || t == DType::bf16) && g.is_2x2_stride2() && g.h == 2 * g.oh && g.w == 2 * g.ow &&
      l.run % 8 == 0) {
    const size_t per_thread = (size_t(out_plane * 26) * sizeof(float) + 63) / 64 * 64;
    WorkspaceBuffer scratch(per_thread * size_t(threads));
    const auto run_all = [&](const auto* gy, auto* out) {
      using In = std::remove_cv_t<std::remove_pointer_t<decltype(gy)>>;
      const In* ry = relu_y != nullptr ? static_cast<const In*>(relu_y->data_ptr()) : nullptr;
#pragma omp parallel for num_threads(threads) schedule(static)
      for (int64_t task = 0; task < tasks; ++task) {
        float* mine =
            reinterpret_cast<float*>(static_cast<char*>(scratch.data()) + per_thread * size_t(omp_get_thread_num()));
        const Layout::Task r = l.task(task, g.c);
        const int64_t p0 = (r.n * g.c + r.c0) * out_plane;
        unpool_run_2x2_avx2(gy + p0, ry != nullptr ? ry + p0 : nullptr, argmax, p0, g, r.len, l.run, mine, out + r.at);
      }
    };
    if (t == DType::f32)
      run_all(grad_pooled.data<float>(), static_cast<float*>(dst));
    else if (dst_bf16)
      run_all(static_cast<const uint16_t*>(grad_pooled.data_ptr()), static_cast<uint16_t*>(dst));
    else
      run_all(static_cast<const uint16_t*>(grad_pooled.data_ptr()), static_cast<float*>(dst));
    return;
  }
  // Per thread: the run's planes as columns [run][in_plane] (f32), one 16-bit plane, max_unpool_plane's
  // scratch, and an f32 tile where the destination is bf16; allocated before the parallel region.
  const int64_t half_plane = t == DType::f32 ? 0 : (in_plane + 1) / 2;  // floats holding a 16-bit plane
  const int64_t unpool_floats = 2 * out_plane + in_plane, taps_floats = (out_plane + 3) / 4;
  const int64_t floats = tile + half_plane + unpool_floats + taps_floats + (dst_bf16 ? tile : 0);
  const size_t per_thread = (size_t(floats) * sizeof(float) + 63) / 64 * 64;
  WorkspaceBuffer scratch(per_thread * size_t(threads));
  const size_t es = dtype_size(t), dst_es = dst_bf16 ? 2 : 4;
  const auto* gy = static_cast<const char*>(grad_pooled.data_ptr());
  const auto* ry = relu_y != nullptr ? static_cast<const char*>(relu_y->data_ptr()) : nullptr;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t task = 0; task < tasks; ++task) {
    float* col =
        reinterpret_cast<float*>(static_cast<char*>(scratch.data()) + per_thread * size_t(omp_get_thread_num()));
    float* half = col + tile;
    float* unpool_scratch = half + half_plane;
    auto* taps_buf = reinterpret_cast<uint8_t*>(unpool_scratch + unpool_floats);
    const Layout::Task r = l.task(task, g.c);
    for (int64_t j = 0; j < r.len; ++j) {
      const int64_t p = r.n * g.c + r.c0 + j;  // the plane's index in NCHW
      float* to = col + j * in_plane;
      const size_t at = size_t(p * out_plane) * es;
      const void* mask = ry != nullptr ? ry + at : nullptr;
      const uint8_t* taps = argmax.taps(p * out_plane, out_plane, taps_buf);
      if (t == DType::f32) {
        max_unpool_plane(gy + at, taps, g, t, to, unpool_scratch, mask);
      } else {  // routed in t (max_pool2d_backward's bits), then widened: exact
        max_unpool_plane(gy + at, taps, g, t, half, unpool_scratch, mask);
        convert(half, t, to, DType::f32, size_t(in_plane));
      }
    }
    char* run_dst = static_cast<char*>(dst) + size_t(r.at) * dst_es;
    if (!dst_bf16) {
      columns_to_tile(col, in_plane, r.len, l.run, reinterpret_cast<float*>(run_dst), avx2);
    } else {  // bf16 values widened above: narrowed again exactly
      float* f32_tile = unpool_scratch + unpool_floats + taps_floats;
      columns_to_tile(col, in_plane, r.len, l.run, f32_tile, avx2);
      convert(f32_tile, DType::f32, run_dst, DType::bf16, size_t(tile));
    }
  }
}

bool pool_reads_layout(const dnnl::memory::desc& md, const PoolGeometry& g) {
  return layout_of(md).has_value() && g.argmax_dtype() == DType::u8 && !g.adaptive;
}

void max_pool_from_layout(const dnnl::memory::desc& md, const void* src, const PoolGeometry& g, Tensor& dst,
                          Tensor& argmax) {
  const Layout l = *layout_of(md);
  const bool src_bf16 = md.data.data_type == dnnl_bf16;
  const DType out_t = dst.dtype();
  MIXPREC_ASSERT(!src_bf16 || out_t == DType::bf16, "conv pool: a bf16 output pools into bf16");
  // Rows are converted into f32 first where they are bf16, or f32 to be rounded into a 16-bit output.
  const bool convert_rows = src_bf16 || out_t != DType::f32;
  const bool two_by_two = g.is_2x2_stride2();
  const bool avx2 = simd_lanes() != Lanes::none;
  // A task: one image's run of channels, every output row of it.
  const int64_t tasks = g.n * l.runs(g.c);
  const int64_t row = g.w * l.s3;  // one input row of a run, padded channels included
  const int64_t plane = g.oh * g.ow;
  const int threads = std::max(1, std::min<int>(omp_get_max_threads(), int(tasks)));
  // Per thread: the window's rows in f32 (when converted), a 16-bit staging row, the pooled tile
  // [oh ow][run] and its argmax, one output plane; allocated before the parallel region (an
  // OutOfMemory cannot leave it).
  const int64_t rows_floats = convert_rows ? g.kh * row : 0, stage_halves = convert_rows ? row : 0;
  const int64_t tile = plane * l.run;
  const size_t per_thread =
      (size_t(rows_floats + 4 * tile) * sizeof(float) + size_t(stage_halves) * sizeof(uint16_t) + 63) / 64 * 64;
  WorkspaceBuffer scratch(per_thread * size_t(threads));
  const size_t es = src_bf16 ? 2 : 4;
  const auto* base = static_cast<const char*>(src);
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t task = 0; task < tasks; ++task) {
    char* mine = static_cast<char*>(scratch.data()) + per_thread * size_t(omp_get_thread_num());
    float* rows = reinterpret_cast<float*>(mine);
    float* tile_v = rows + rows_floats;  // [plane][run]: values, then argmax
    float* tile_a = tile_v + tile;
    float* col_v = tile_a + tile;  // [len][plane]: the same, one channel's plane after another
    float* col_a = col_v + tile;
    uint16_t* stage = reinterpret_cast<uint16_t*>(col_a + tile);
    const Layout::Task run = l.task(task, g.c);
    const int64_t n = run.n, c0 = run.c0, len = run.len;
    for (int64_t oy = 0; oy < g.oh; ++oy) {
      // Row ky of the window in f32: the buffer's own row, or the source's where it is f32 already.
      const float* row_of[256];
      for (int64_t ky = 0; ky < g.kh; ++ky) {
        const int64_t iy = oy * g.stride_h - g.pad_h + ky * g.dil_h;
        row_of[ky] = nullptr;
        if (iy < 0 || iy >= g.h) continue;
        const char* s = base + size_t(run.at + iy * l.s2) * es;
        if (!convert_rows) {
          row_of[ky] = reinterpret_cast<const float*>(s);
          continue;
        }
        float* r = rows + ky * row;
        if (src_bf16) {
          convert(s, DType::bf16, r, DType::f32, size_t(row));
        } else {  // the f32 road: each value rounded into the output's dtype, as the NCHW output holds it
          convert(s, DType::f32, stage, out_t, size_t(row));
          convert(stage, out_t, r, DType::f32, size_t(row));
        }
        row_of[ky] = r;
      }
      float* tv = tile_v + oy * g.ow * l.run;
      float* ta = tile_a + oy * g.ow * l.run;
      if (two_by_two) {
        row_2x2(row_of[0], row_of[1], l.s3, g.ow, len, l.run, tv, ta, avx2);
        continue;
      }
      const float* tap[256];
      int32_t k[256];
      for (int64_t ox = 0; ox < g.ow; ++ox) {
        int ntaps = 0;
        for_each_tap(g, oy, ox, [&](int64_t ky, int64_t kx, int64_t, int64_t ix) {
          tap[ntaps] = row_of[ky] + ix * l.s3;
          k[ntaps++] = int32_t(ky * g.kw + kx);
        });
        window(tap, k, ntaps, len, tv + ox * l.run, ta + ox * l.run, avx2);
      }
    }
    // The tile [oh ow][run] into the NCHW planes of channels c0 .. c0 + len (each plane contiguous).
    tile_to_columns(tile_v, l.run, plane, len, col_v, avx2);
    tile_to_columns(tile_a, l.run, plane, len, col_a, avx2);
    const int64_t at = (n * g.c + c0) * plane;
    taps_to_bytes(col_a, len * plane, argmax.data<uint8_t>() + at, avx2);
    // Exact: the values are the output dtype's already.
    convert(col_v, DType::f32, static_cast<char*>(dst.data_ptr()) + size_t(at) * dtype_size(out_t), out_t,
            size_t(len * plane));
  }
}

}  // namespace mixprec::kernels::cpu
