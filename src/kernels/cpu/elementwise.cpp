// Fast CPU element-wise, reduction and softmax kernels: 16-bit inputs are converted to f32 in
// blocks with the vectorised bulk conversions, computed in f32, and stored back rounded once.
// Contiguous layouts only (plus row broadcasting); everything else falls back to the reference.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/f32_blocks.h"
#include "kernels/kernels.h"
#include "kernels/ref/access.h"
#include "kernels/unary_math.h"

namespace mixprec::kernels::cpu {
namespace {

constexpr int64_t kBlock = 4096;  // elements per block: 16 KiB of f32, stays in L1/L2

// f(begin, len) over [0, n) in blocks, in parallel when there is enough work.
template <class F>
void for_blocks(int64_t n, F&& f) {
  const int64_t nb = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (nb >= 4)
  for (int64_t b = 0; b < nb; ++b) f(b * kBlock, std::min(kBlock, n - b * kBlock));
}

template <BinaryOp OP>
void binary_loop(const float* a, const float* b, float* d, int64_t n, int64_t a_mod, int64_t b_mod,
                 int64_t a_off, int64_t b_off) {
  // a_mod/b_mod: period of a broadcast row (0: full operand, indexed like d); a_off/b_off: the
  // position within that row of element 0. Runs between row wrap-arounds vectorise.
  int64_t i = 0;
  while (i < n) {
    int64_t run = n - i;
    if (a_mod) run = std::min(run, a_mod - a_off);
    if (b_mod) run = std::min(run, b_mod - b_off);
    const float* pa = a_mod ? a + a_off : a + i;
    const float* pb = b_mod ? b + b_off : b + i;
    float* pd = d + i;
    for (int64_t j = 0; j < run; ++j) pd[j] = binary_value<float>(OP, pa[j], pb[j]);
    i += run;
    if (a_mod) a_off = (a_off + run) % a_mod;
    if (b_mod) b_off = (b_off + run) % b_mod;
  }
}

}  // namespace

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
    for_blocks(n, [&](int64_t b, int64_t len) {
      convert(s + b * ss, src.dtype(), d + b * ds, dst.dtype(), size_t(len));
    });
    return true;
  }
  for_blocks(n, [&](int64_t b, int64_t len) {
    float buf[kBlock];
    load_f32(src.data_ptr(), src.dtype(), b, len, buf);
    store_f32(dst.data_ptr(), dst.dtype(), b, len, buf);
  });
  return true;
}

// Supports: same shape contiguous; one operand contiguous and the other a contiguous suffix of
// its shape (a bias row or a scalar) broadcast over the leading dims.
bool binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& dst) {
  const DType t = a.dtype();
  if (!f32_compute(t) || b.dtype() != t || dst.dtype() != t) return false;
  if (!a.is_contiguous() || !b.is_contiguous() || !dst.is_contiguous()) return false;
  const int64_t n = dst.numel();
  auto suffix_of = [&](const Tensor& x) -> int64_t {  // period if x broadcasts as a suffix row, else -1
    if (x.numel() == n && x.shape() == dst.shape()) return 0;
    const Shape& xs = x.shape();
    const Shape& ds = dst.shape();
    size_t lead = 0;
    while (lead < xs.size() && xs[lead] == 1) ++lead;  // leading ones broadcast too
    const size_t k = xs.size() - lead;
    if (k > ds.size()) return -1;
    for (size_t i = 0; i < k; ++i)
      if (xs[lead + i] != ds[ds.size() - k + i]) return -1;
    return std::max<int64_t>(x.numel(), 1);
  };
  const int64_t a_mod = suffix_of(a), b_mod = suffix_of(b);
  if (a_mod < 0 || b_mod < 0) return false;
  // A broadcast operand is converted to f32 once, whole; full operands block by block.
  auto whole = [&](const Tensor& x, int64_t mod) {
    std::vector<float> v(static_cast<size_t>(mod));
    if (mod) load_f32(x.data_ptr(), t, 0, mod, v.data());
    return v;
  };
  const std::vector<float> ra = whole(a, a_mod), rb = whole(b, b_mod);
  for_blocks(n, [&](int64_t begin, int64_t len) {
    float xa[kBlock], xb[kBlock], bd[kBlock];
    const float* pa = a_mod ? ra.data() : in_f32(a.data_ptr(), t, begin, len, xa);
    const float* pb = b_mod ? rb.data() : in_f32(b.data_ptr(), t, begin, len, xb);
    float* xd = out_f32(dst.data_ptr(), t, begin, bd);
    const int64_t oa = a_mod ? begin % a_mod : 0, ob = b_mod ? begin % b_mod : 0;
    switch (op) {
      case BinaryOp::add: binary_loop<BinaryOp::add>(pa, pb, xd, len, a_mod, b_mod, oa, ob); break;
      case BinaryOp::sub: binary_loop<BinaryOp::sub>(pa, pb, xd, len, a_mod, b_mod, oa, ob); break;
      case BinaryOp::mul: binary_loop<BinaryOp::mul>(pa, pb, xd, len, a_mod, b_mod, oa, ob); break;
      case BinaryOp::div: binary_loop<BinaryOp::div>(pa, pb, xd, len, a_mod, b_mod, oa, ob); break;
    }
    flush_f32(dst.data_ptr(), t, begin, len, xd);
  });
  return true;
}

bool unary(UnaryOp op, const Tensor& x, UnaryParams p, Tensor& dst) {
  const DType t = x.dtype();
  if (!f32_compute(t) || !x.is_contiguous() || !dst.is_contiguous()) return false;
  if (op == UnaryOp::relu && relu_forward(x, dst)) return true;  // AVX-512, on the raw bits
  const float a = float(p.a), b = float(p.b);
  for_blocks(x.numel(), [&](int64_t begin, int64_t len) {
    float bx[kBlock], bo[kBlock];
    const float* v = in_f32(x.data_ptr(), t, begin, len, bx);
    float* o = out_f32(dst.data_ptr(), t, begin, bo);
    switch (op) {
      case UnaryOp::relu:
        for (int64_t i = 0; i < len; ++i) o[i] = v[i] > 0.f ? v[i] : (v[i] != v[i] ? v[i] : 0.f);
        break;
      case UnaryOp::neg:
        for (int64_t i = 0; i < len; ++i) o[i] = -v[i];
        break;
      case UnaryOp::affine:
        for (int64_t i = 0; i < len; ++i) o[i] = v[i] * a + b;
        break;
      default:
        for (int64_t i = 0; i < len; ++i) o[i] = unary_value<float>(op, v[i], p);
        break;
    }
    flush_f32(dst.data_ptr(), t, begin, len, o);
  });
  return true;
}

bool unary_grad(UnaryGradOp op, const Tensor& grad, const Tensor& x, UnaryParams p, Tensor& dst) {
  const DType t = x.dtype();
  if (!f32_compute(t) || grad.dtype() != t) return false;
  if (op == UnaryGradOp::relu && relu_mask(grad, x, dst)) return true;  // AVX-512, on the raw bits
  for_blocks(x.numel(), [&](int64_t begin, int64_t len) {
    float bg[kBlock], bx[kBlock], bo[kBlock];
    const float* g = in_f32(grad.data_ptr(), t, begin, len, bg);
    const float* v = in_f32(x.data_ptr(), t, begin, len, bx);
    float* o = out_f32(dst.data_ptr(), t, begin, bo);
    if (op == UnaryGradOp::relu) {
      for (int64_t i = 0; i < len; ++i) o[i] = v[i] > 0.f ? g[i] : 0.f;
    } else {
      for (int64_t i = 0; i < len; ++i) o[i] = g[i] * unary_derivative<float>(op, v[i], p);
    }
    flush_f32(dst.data_ptr(), t, begin, len, o);
  });
  return true;
}

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
    // Column sums: each thread owns a range of columns and walks the rows.
    const int64_t cb = std::max<int64_t>(16, std::min<int64_t>(kBlock, cols));
    const int64_t nb = (cols + cb - 1) / cb;
#pragma omp parallel for schedule(static) if (rows * cols >= (1 << 15))
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t c0 = b * cb, len = std::min(cb, cols - c0);
      float buf[kBlock];
      for (int64_t r = 0; r < rows; ++r) {
        const float* v = in_f32(x.data_ptr(), t, r * cols + c0, len, buf);
        for (int64_t i = 0; i < len; ++i) acc[size_t(c0 + i)] += v[i];
      }
    }
  }
  (void)keepdim;
  convert(acc.data(), DType::f32, dst.data_ptr(), dst.dtype(), acc.size());
  return true;
}

bool softmax_lastdim(const Tensor& x, bool log, Tensor& dst) {
  const DType t = x.dtype();
  if (!f32_compute(t) || !x.is_contiguous() || x.dim() == 0) return false;
  const int64_t cols = x.size(-1), rows = cols ? x.numel() / cols : 0;
  if (cols > kBlock) return false;
#pragma omp parallel for schedule(static) if (rows * cols >= (1 << 15))
  for (int64_t r = 0; r < rows; ++r) {
    float v[kBlock];
    load_f32(x.data_ptr(), t, r * cols, cols, v);
    float mx = -INFINITY;
    for (int64_t c = 0; c < cols; ++c) mx = std::max(mx, v[c]);
    float total = 0.f;
    for (int64_t c = 0; c < cols; ++c) total += std::exp(v[c] - mx);
    const float lse = mx + std::log(total);
    for (int64_t c = 0; c < cols; ++c) v[c] = log ? v[c] - lse : std::exp(v[c] - lse);
    store_f32(dst.data_ptr(), t, r * cols, cols, v);
  }
  return true;
}

bool softmax_lastdim_backward(const Tensor& y, const Tensor& grad_y, bool log, Tensor& dst) {
  const DType t = y.dtype();
  if (!f32_compute(t) || grad_y.dtype() != t || !y.is_contiguous() || !grad_y.is_contiguous() || y.dim() == 0)
    return false;
  const int64_t cols = y.size(-1), rows = cols ? y.numel() / cols : 0;
  if (cols > kBlock) return false;
#pragma omp parallel for schedule(static) if (rows * cols >= (1 << 15))
  for (int64_t r = 0; r < rows; ++r) {
    float yv[kBlock], g[kBlock];
    load_f32(y.data_ptr(), t, r * cols, cols, yv);
    load_f32(grad_y.data_ptr(), t, r * cols, cols, g);
    float dot = 0.f;
    for (int64_t c = 0; c < cols; ++c) dot += log ? g[c] : g[c] * yv[c];
    for (int64_t c = 0; c < cols; ++c) g[c] = log ? g[c] - std::exp(yv[c]) * dot : yv[c] * (g[c] - dot);
    store_f32(dst.data_ptr(), t, r * cols, cols, g);
  }
  return true;
}

}  // namespace mixprec::kernels::cpu
