// Fast CPU kernels of the optimizer family: the fused SGD and AdamW passes (blocks of the
// gradient loaded to f32 and unscaled on the fly, the f32 weights -- the parameter, its master, or
// a buffer for a 16-bit parameter without one -- updated with the f32 state by AVX-512 loops
// bit-identical to the scalar rules, a 16-bit parameter written back rounded once; f64 in f64)
// and the multi-tensor unscale-and-check, parallel over blocks of all tensors; the gradient norm
// and its clipping, the reference's arithmetic without its per-element dtype switch.
#include <algorithm>
#include <array>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "core/parallel.h"
#include "core/simd.h"
#include "kernels/cpu/f32_blocks.h"
#include "kernels/lane_tree.h"
#include "kernels/optim.h"
#include "kernels/ref/access.h"
#include "kernels/ref/optim_scalars.h"
#include "mixprec/convert.h"
#include "mixprec/cpu.h"
#include "optim/rounding.h"

namespace mixprec::kernels::cpu {
namespace {

using optim::f32_to_bf16_stochastic;
using optim::f32_to_f16_stochastic;

constexpr int64_t kUpdateBlock = 2048;  // elements per block: a few 8 KiB f32 buffers stay in L1/L2

// Writes len f32 weights into a 16-bit parameter: round-to-nearest-even, or stochastically with
// the words of `stream` (element e of the parameter takes word e; begin is a multiple of 4).
void store_half(void* dst, DType t, int64_t begin, int64_t len, const float* src, const Generator* stream) {
  uint16_t* p = static_cast<uint16_t*>(dst) + begin;
  if (!stream) {
    if (t == DType::bf16)
      convert_f32_to_bf16(src, p, size_t(len));
    else
      convert_f32_to_f16(src, p, size_t(len));
    return;
  }
  for (int64_t j = 0; j < len; j += 4) {
    const std::array<uint32_t, 4> r = stream->block(uint64_t(begin + j) / 4);
    for (int64_t k = j; k < std::min(len, j + 4); ++k)
      p[k] = t == DType::bf16 ? f32_to_bf16_stochastic(src[k], r[size_t(k - j)])
                              : f32_to_f16_stochastic(src[k], r[size_t(k - j)]);
  }
}

// One block of one tensor in a multi-tensor pass: elements [begin, begin + len) of tensor `index`.
struct Piece {
  size_t index;
  int64_t begin, len;
};

// The blocks of `block` elements (fewer at a tensor's end) of every tensor, in tensor order,
// numel(items[i]) elements each (PyTorch's multi-tensor apply). One parallel region serves a whole
// optimizer step or norm, where one region per tensor paid a thread wake-up each (with
// OMP_WAIT_POLICY=passive, 60-80 us on a KVM guest: docs/hosts.md).
template <class Item, class Numel>
std::vector<Piece> pieces_of(const std::vector<Item>& items, int64_t block, Numel&& numel) {
  std::vector<Piece> out;
  for (size_t i = 0; i < items.size(); ++i) {
    const int64_t n = numel(items[i]);
    for (int64_t begin = 0; begin < n; begin += block) out.push_back({i, begin, std::min(block, n - begin)});
  }
  return out;
}

// Runs rule(w, g, begin, len) over one block of parameter p: w are len weights to update in place
// (f32, or f64 for an f64 parameter), g the len gradients already multiplied by inv_scale. With
// `counting` (a 16-bit parameter whose rounding is tracked), counts the updates that changed the
// f32 weight but left the 16-bit one as it was (rounded away without a master; deferred into the
// master with one).
template <class Rule>
void update_block(const OptimParam& p, float inv_scale, const Generator* stochastic, bool counting, int64_t begin,
                  int64_t len, int64_t& changed, int64_t& stuck, Rule&& rule) {
  const DType pt = p.param.dtype(), gt = p.grad.dtype();
  if (pt == DType::f64) {
    double* w = p.param.data<double>();
    const double* g = p.grad.data<double>();
    double gb[kUpdateBlock];
    for (int64_t j = 0; j < len; ++j) gb[j] = g[begin + j] * double(inv_scale);
    rule(w + begin, gb, begin, len);
    return;
  }
  void* pp = p.param.data_ptr();
  const void* gp = p.grad.data_ptr();
  float* mp = p.master.defined() ? p.master.data<float>() : nullptr;
  alignas(64) float gb[kUpdateBlock];
  alignas(64) float wb[kUpdateBlock];
  const float* g = gb;
  if (gt == DType::f32 && inv_scale == 1.0f) {
    g = static_cast<const float*>(gp) + begin;
  } else {
    load_f32(gp, gt, begin, len, gb);
    if (inv_scale != 1.0f)
      for (int64_t j = 0; j < len; ++j) gb[j] *= inv_scale;
  }
  float* w = wb;
  if (pt == DType::f32)
    w = static_cast<float*>(pp) + begin;
  else if (mp)
    w = mp + begin;
  else
    load_f32(pp, pt, begin, len, wb);
  alignas(64) float w_before[kUpdateBlock];
  alignas(64) float h_before[kUpdateBlock];
  if (counting) {
    std::memcpy(w_before, w, size_t(len) * 4);
    load_f32(pp, pt, begin, len, h_before);
  }
  rule(w, g, begin, len);
  if (is_half(pt)) store_half(pp, pt, begin, len, w, mp ? nullptr : stochastic);
  if (counting) {
    load_f32(pp, pt, begin, len, gb);  // the stored 16-bit weights (g is no longer needed)
    for (int64_t j = 0; j < len; ++j) {
      const bool moved = w[j] != w_before[j];
      changed += moved;
      stuck += moved && gb[j] == h_before[j];
    }
  }
}

// The f32 AdamW rule (rule::adamw), 16 lanes at a time, over the whole 16-element groups of
// [0, len); returns how many elements it did (the scalar rule does the rest). The same
// operations in the same order as the scalar loop (ISO C++ mode: no contraction into FMA; IEEE
// sqrt and division), so the result is bit-identical to it.
__attribute__((target("avx512f"))) int64_t adamw_f32_avx512(float* w, const float* g, float* m, float* v, int64_t len,
                                                            const rule::AdamW<float>& c) {
  const __m512 b1 = _mm512_set1_ps(c.b1), b2 = _mm512_set1_ps(c.b2), one_b1 = _mm512_set1_ps(1.0f - c.b1),
               one_b2 = _mm512_set1_ps(1.0f - c.b2), decay = _mm512_set1_ps(c.decay),
               step = _mm512_set1_ps(c.step_size), bc2 = _mm512_set1_ps(c.inv_sqrt_bc2), eps = _mm512_set1_ps(c.eps);
  int64_t j = 0;
  for (; j + 16 <= len; j += 16) {
    const __m512 gj = _mm512_loadu_ps(g + j);
    const __m512 mj = _mm512_add_ps(_mm512_mul_ps(b1, _mm512_loadu_ps(m + j)), _mm512_mul_ps(one_b1, gj));
    const __m512 vj =
        _mm512_add_ps(_mm512_mul_ps(b2, _mm512_loadu_ps(v + j)), _mm512_mul_ps(_mm512_mul_ps(one_b2, gj), gj));
    _mm512_storeu_ps(m + j, mj);
    _mm512_storeu_ps(v + j, vj);
    const __m512 denom = _mm512_add_ps(_mm512_mul_ps(_mm512_sqrt_ps(vj), bc2), eps);
    const __m512 wj =
        _mm512_sub_ps(_mm512_mul_ps(_mm512_loadu_ps(w + j), decay), _mm512_div_ps(_mm512_mul_ps(step, mj), denom));
    _mm512_storeu_ps(w + j, wj);
  }
  return j;
}

// The f32 SGD rule (rule::sgd), 16 lanes at a time over the whole groups (returns how many
// elements it did), bit-identical to the scalar loop (same operations in the same order, no
// contraction). buf is null without momentum.
__attribute__((target("avx512f"))) int64_t sgd_f32_avx512(float* w, const float* g, float* buf, int64_t len,
                                                          const rule::Sgd<float>& c) {
  const __m512 lr = _mm512_set1_ps(c.lr), wd = _mm512_set1_ps(c.wd), mom = _mm512_set1_ps(c.mom),
               damp = _mm512_set1_ps(c.damp);
  int64_t j = 0;
  for (; j + 16 <= len; j += 16) {
    const __m512 wj = _mm512_loadu_ps(w + j);
    __m512 d = _mm512_add_ps(_mm512_loadu_ps(g + j), _mm512_mul_ps(wd, wj));
    if (buf) {
      const __m512 b =
          c.first ? d : _mm512_add_ps(_mm512_mul_ps(mom, _mm512_loadu_ps(buf + j)), _mm512_mul_ps(damp, d));
      _mm512_storeu_ps(buf + j, b);
      d = c.nesterov ? _mm512_add_ps(d, _mm512_mul_ps(mom, b)) : b;
    }
    _mm512_storeu_ps(w + j, _mm512_sub_ps(wj, _mm512_mul_ps(lr, d)));
  }
  return j;
}

// The same two rules in 8 AVX2 lanes (hosts without AVX-512), bit-identical to the scalar loops
// for the same reasons (no FMA: the products and sums round as the scalar ones do).
__attribute__((target("avx2"))) int64_t adamw_f32_avx2(float* w, const float* g, float* m, float* v, int64_t len,
                                                       const rule::AdamW<float>& c) {
  const __m256 b1 = _mm256_set1_ps(c.b1), b2 = _mm256_set1_ps(c.b2), one_b1 = _mm256_set1_ps(1.0f - c.b1),
               one_b2 = _mm256_set1_ps(1.0f - c.b2), decay = _mm256_set1_ps(c.decay),
               step = _mm256_set1_ps(c.step_size), bc2 = _mm256_set1_ps(c.inv_sqrt_bc2), eps = _mm256_set1_ps(c.eps);
  int64_t j = 0;
  for (; j + 8 <= len; j += 8) {
    const __m256 gj = _mm256_loadu_ps(g + j);
    const __m256 mj = _mm256_add_ps(_mm256_mul_ps(b1, _mm256_loadu_ps(m + j)), _mm256_mul_ps(one_b1, gj));
    const __m256 vj =
        _mm256_add_ps(_mm256_mul_ps(b2, _mm256_loadu_ps(v + j)), _mm256_mul_ps(_mm256_mul_ps(one_b2, gj), gj));
    _mm256_storeu_ps(m + j, mj);
    _mm256_storeu_ps(v + j, vj);
    const __m256 denom = _mm256_add_ps(_mm256_mul_ps(_mm256_sqrt_ps(vj), bc2), eps);
    const __m256 wj =
        _mm256_sub_ps(_mm256_mul_ps(_mm256_loadu_ps(w + j), decay), _mm256_div_ps(_mm256_mul_ps(step, mj), denom));
    _mm256_storeu_ps(w + j, wj);
  }
  return j;
}

__attribute__((target("avx2"))) int64_t sgd_f32_avx2(float* w, const float* g, float* buf, int64_t len,
                                                     const rule::Sgd<float>& c) {
  const __m256 lr = _mm256_set1_ps(c.lr), wd = _mm256_set1_ps(c.wd), mom = _mm256_set1_ps(c.mom),
               damp = _mm256_set1_ps(c.damp);
  int64_t j = 0;
  for (; j + 8 <= len; j += 8) {
    const __m256 wj = _mm256_loadu_ps(w + j);
    __m256 d = _mm256_add_ps(_mm256_loadu_ps(g + j), _mm256_mul_ps(wd, wj));
    if (buf) {
      const __m256 b =
          c.first ? d : _mm256_add_ps(_mm256_mul_ps(mom, _mm256_loadu_ps(buf + j)), _mm256_mul_ps(damp, d));
      _mm256_storeu_ps(buf + j, b);
      d = c.nesterov ? _mm256_add_ps(d, _mm256_mul_ps(mom, b)) : b;
    }
    _mm256_storeu_ps(w + j, _mm256_sub_ps(wj, _mm256_mul_ps(lr, d)));
  }
  return j;
}

// What every fused step does around its rule: the skip, the step count, the rounding streams, and
// one parallel pass over the blocks of all parameters. rule(p, step, w, g, begin, len) updates one
// block of parameter p (update_block's w and g).
template <class Rule>
void fused_step(const std::vector<OptimParam>& params, const OptimStep& s, Rule&& rule) {
  if (skipped(s)) return;
  const int64_t step = scalar<int64_t>(s.step) + 1;
  const float inv = s.scale.defined() ? rule::inv_scale(scalar<float>(s.scale)) : 1.0f;
  std::vector<Generator> streams;
  if (s.stochastic)
    for (const OptimParam& p : params) streams.push_back(optim::rounding_stream(s.seed, uint64_t(step), p.index));
  const std::vector<Piece> pieces =
      pieces_of(params, kUpdateBlock, [](const OptimParam& p) { return p.param.numel(); });
  const bool tracking = s.rounding.defined();
  const int64_t np = int64_t(pieces.size());
  int64_t changed = 0, stuck = 0;
#pragma omp parallel for schedule(static) reduction(+ : changed, stuck) if (detail::parallel_worth(np, 8))
  for (int64_t k = 0; k < np; ++k) {
    const Piece& piece = pieces[size_t(k)];
    const OptimParam& p = params[piece.index];
    update_block(p, inv, s.stochastic ? &streams[piece.index] : nullptr, tracking && is_half(p.param.dtype()),
                 piece.begin, piece.len, changed, stuck,
                 [&](auto* w, const auto* g, int64_t begin, int64_t len) { rule(p, step, w, g, begin, len); });
  }
  scalar<int64_t>(s.step) = step;
  if (tracking) {
    static_cast<int64_t*>(s.rounding.data_ptr())[0] += changed;
    static_cast<int64_t*>(s.rounding.data_ptr())[1] += stuck;
  }
}

}  // namespace

void sgd_step(const std::vector<OptimParam>& params, const SgdOptions& o, const OptimStep& s) {
  uint8_t* ready = o.momentum != 0 ? static_cast<uint8_t*>(o.momentum_ready.data_ptr()) : nullptr;
  const Lanes vectorised = simd_lanes();
  fused_step(params, s, [&](const OptimParam& p, int64_t, auto* w, const auto* gr, int64_t begin, int64_t len) {
    using T = std::remove_pointer_t<decltype(w)>;
    const bool first = ready && !ready[p.index];
    T* buf = ready ? static_cast<T*>(p.state1.data_ptr()) + begin : nullptr;
    const auto c =
        rule::sgd_consts<T>(scalar<double>(p.lr), p.weight_decay, o.momentum, o.dampening, first, o.nesterov);
    int64_t j = 0;
    if constexpr (std::is_same_v<T, float>)
      j = vectorised == Lanes::avx512 ? sgd_f32_avx512(w, gr, buf, len, c)
          : vectorised == Lanes::avx2 ? sgd_f32_avx2(w, gr, buf, len, c)
                                      : 0;
    for (; j < len; ++j) rule::sgd(w[j], gr[j], buf ? buf + j : nullptr, c);
  });
  // After the pass: every block of a parameter read the same `first`.
  if (ready && !skipped(s))
    for (const OptimParam& p : params) ready[p.index] = 1;
}

void adamw_step(const std::vector<OptimParam>& params, const AdamWOptions& o, const OptimStep& s) {
  const Lanes vectorised = simd_lanes();
  fused_step(params, s, [&](const OptimParam& p, int64_t step, auto* w, const auto* gr, int64_t begin, int64_t len) {
    using T = std::remove_pointer_t<decltype(w)>;
    T* m = static_cast<T*>(p.state1.data_ptr()) + begin;
    T* v = static_cast<T*>(p.state2.data_ptr()) + begin;
    const auto c = rule::adamw_consts<T>(scalar<double>(p.lr), p.weight_decay, o.beta1, o.beta2, o.eps, step);
    int64_t j = 0;
    if constexpr (std::is_same_v<T, float>)
      j = vectorised == Lanes::avx512 ? adamw_f32_avx512(w, gr, m, v, len, c)
          : vectorised == Lanes::avx2 ? adamw_f32_avx2(w, gr, m, v, len, c)
                                      : 0;
    for (; j < len; ++j) rule::adamw(w[j], gr[j], m[j], v[j], c);
  });
}

// ------------------------------------------------------------------------ unscale and check

namespace {

constexpr int64_t kCheckBlock = 4096;

struct Chunk {
  const void* src;
  void* dst;  // null: check only
  DType src_t, dst_t;
  int64_t len;
};

// Loads len values of src_t into f32 (f64 is checked and scaled as f64).
bool check_and_scale(const Chunk& c, float inv_scale) {
  alignas(64) float buf[kCheckBlock];
  if (c.src_t == DType::f64) {
    const double* s = static_cast<const double*>(c.src);
    bool ok = true;
    for (int64_t j = 0; j < c.len; ++j) ok &= std::fabs(s[j]) <= DBL_MAX;
    if (c.dst)
      for (int64_t j = 0; j < c.len; ++j) static_cast<double*>(c.dst)[j] = s[j] * double(inv_scale);
    return ok;
  }
  load_f32(c.src, c.src_t, 0, c.len, buf);
  bool ok = true;
  for (int64_t j = 0; j < c.len; ++j) ok &= std::fabs(buf[j]) <= FLT_MAX;  // false for inf and NaN
  if (!c.dst) return ok;
  for (int64_t j = 0; j < c.len; ++j) buf[j] *= inv_scale;
  store_f32(c.dst, c.dst_t, 0, c.len, buf);
  return ok;
}

}  // namespace

void unscale_and_check(const std::vector<Tensor>& src, const std::vector<Tensor>& dst, const Tensor& scale,
                       Tensor& found_inf) {
  const float inv = rule::inv_scale(scalar<float>(scale));
  std::vector<Chunk> chunks;
  for (size_t i = 0; i < src.size(); ++i) {
    const Tensor &g = src[i], &d = dst[i];
    const int64_t es = int64_t(dtype_size(g.dtype())), ds = d.defined() ? int64_t(dtype_size(d.dtype())) : 0;
    for (int64_t b = 0; b < g.numel(); b += kCheckBlock)
      chunks.push_back({static_cast<const char*>(g.data_ptr()) + b * es,
                        d.defined() ? static_cast<char*>(d.data_ptr()) + b * ds : nullptr, g.dtype(),
                        d.defined() ? d.dtype() : g.dtype(), std::min(kCheckBlock, g.numel() - b)});
  }
  // One pass over every block of every gradient (PyTorch's multi-tensor apply).
  bool ok = true;
  const int64_t nc = int64_t(chunks.size());
#pragma omp parallel for schedule(static) reduction(&& : ok) if (detail::parallel_worth(nc, 8))
  for (int64_t c = 0; c < nc; ++c) ok = check_and_scale(chunks[size_t(c)], inv) && ok;
  if (!ok) scalar<float>(found_inf) = 1.0f;
}

}  // namespace mixprec::kernels::cpu

// ------------------------------------------------------------------- gradient norm, clipping
// The reference's arithmetic exactly (blocks of kNormBlock values, each summed in f64 in its lanes
// (rule::kNormLanes, lane_tree_sum), the blocks added in order; the clip factor applied in f64 and rounded once),
// without its per-element dtype switch: bit-identical results, tested against it.
namespace mixprec::kernels::cpu {
namespace {

bool norm_fast_case(const std::vector<Tensor>& grads) {
  for (const Tensor& g : grads)
    if (!g.is_contiguous() || !is_floating(g.dtype())) return false;
  return true;
}

// The reference's blocks of kNormBlock values of every gradient, in gradient order.
std::vector<Piece> norm_pieces(const std::vector<Tensor>& grads) {
  return pieces_of(grads, kNormBlock, [](const Tensor& g) { return g.numel(); });
}

// The inf norm's part of a block: the largest |value|, NaN propagating.
template <class T>
double block_max_abs(const T* p, int64_t n) {
  double s = 0;
  for (int64_t e = 0; e < n; ++e) s = rule::nan_max(s, std::fabs(double(load(p + e))));
  return s;
}
// The sum of squares of a block in the reference's lanes: 16 elements a step, element j of the
// step into lane j, a ragged tail into lanes 0, 1, ...: each square and addition is the
// reference's (squares of f32, bf16 and f16 values are exact in f64; an f64 one rounds alike).
template <class T>
[[gnu::always_inline]] inline double block_sum_sq(const T* p, int64_t n) {
  double acc[rule::kNormLanes] = {};
  int64_t e = 0;
  for (; e + rule::kNormLanes <= n; e += rule::kNormLanes)
    for (int j = 0; j < rule::kNormLanes; ++j) {
      const double v = double(load(p + e + j));
      acc[j] += v * v;
    }
  for (int j = 0; e < n; ++e, ++j) {
    const double v = double(load(p + e));
    acc[j] += v * v;
  }
  return lane_tree_sum<rule::kNormLanes>(acc);
}
// f32 in 512-bit lanes where the host has AVX-512 (the master gradients); the same operations.
__attribute__((target("avx512f"))) double block_sum_sq_f32_avx512(const float* p, int64_t n) {
  return block_sum_sq(p, n);
}
template <class T>
double block_sum_sq_any(const T* p, int64_t n) {
  if constexpr (std::is_same_v<T, float>)
    if (simd_lanes() == Lanes::avx512) return block_sum_sq_f32_avx512(p, n);
  return block_sum_sq(p, n);
}

}  // namespace

bool grad_norm(const std::vector<Tensor>& grads, double norm_type, Tensor& out) {
  const bool is_inf = std::isinf(norm_type);
  if ((!is_inf && norm_type != 2.0) || !norm_fast_case(grads)) return false;
  // Every block of every gradient in one parallel pass; the partials are then added in the
  // reference's order.
  const std::vector<Piece> pieces = norm_pieces(grads);
  const int64_t np = int64_t(pieces.size());
  std::vector<double> partial(pieces.size(), 0.0);
#pragma omp parallel for schedule(static) if (detail::parallel_worth(np, 8))
  for (int64_t k = 0; k < np; ++k) {
    const Piece& piece = pieces[size_t(k)];
    const Tensor& g = grads[piece.index];
    dispatch_floating(g.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* p = static_cast<const T*>(g.data_ptr()) + piece.begin;
      partial[size_t(k)] = is_inf ? block_max_abs<T>(p, piece.len) : block_sum_sq_any<T>(p, piece.len);
    });
  }
  double acc = 0;
  for (const double s : partial) acc = is_inf ? rule::nan_max(acc, s) : acc + s;
  out = Tensor::empty({}, DType::f64);
  *static_cast<double*>(out.data_ptr()) = is_inf ? acc : std::sqrt(acc);
  return true;
}

bool clip_by_norm(const std::vector<Tensor>& grads, const Tensor& total, double max_norm) {
  if (!norm_fast_case(grads) || !total.device().is_cpu()) return false;
  const double coef = rule::clip_coef(*static_cast<const double*>(total.data_ptr()), max_norm);
  if (coef == 1.0) return true;  // multiplying by 1 changes nothing
  const std::vector<Piece> pieces = norm_pieces(grads);
  const int64_t np = int64_t(pieces.size());
#pragma omp parallel for schedule(static) if (detail::parallel_worth(np, 8))
  for (int64_t k = 0; k < np; ++k) {
    const Piece& piece = pieces[size_t(k)];
    const Tensor& g = grads[piece.index];
    const int64_t begin = piece.begin, len = piece.len;
    const DType d = g.dtype();
    if (d == DType::f32) {
      float* p = g.data<float>() + begin;
      for (int64_t e = 0; e < len; ++e) p[e] = float(double(p[e]) * coef);
    } else if (d == DType::f64) {
      double* p = g.data<double>() + begin;
      for (int64_t e = 0; e < len; ++e) p[e] *= coef;
    } else {
      // 16 bits: the products in f64, rounded once by convert (as the reference's store).
      double buf[kNormBlock];
      auto* p = static_cast<uint16_t*>(g.data_ptr()) + begin;
      for (int64_t e = 0; e < len; ++e) buf[e] = double(d == DType::bf16 ? bf16_to_f32(p[e]) : f16_to_f32(p[e])) * coef;
      convert(buf, DType::f64, p, d, len);
    }
  }
  return true;
}

}  // namespace mixprec::kernels::cpu
