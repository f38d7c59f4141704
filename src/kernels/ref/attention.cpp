// Reference attention kernels: the plain unfused math, S = q k^T * scale, the causal mask, a
// softmax, dropout, O = P v, and its backward, accumulating in f32 (f64 for f64 inputs). The
// forward keeps the [B, H, Tq, Tk] probabilities for the backward: the oracle of the fused
// kernels, and the baseline their memory is compared with.
#include <cmath>
#include <vector>

#include "kernels/attention.h"
#include "kernels/ref/access.h"

namespace mixprec::kernels::ref {
namespace {

// A [B, H, T, E] view of any strides, read into the accumulation type.
template <class T>
struct View4 {
  const T* base;
  int64_t h_count, sb, sh, st, se;
  explicit View4(const Tensor& x)
      : base(static_cast<const T*>(x.storage()->data()) + x.offset()),
        h_count(x.size(1)),
        sb(x.strides()[0]),
        sh(x.strides()[1]),
        st(x.strides()[2]),
        se(x.strides()[3]) {}
  acc_t<T> at(int64_t bh, int64_t t, int64_t e) const {
    return load(base + (bh / h_count) * sb + (bh % h_count) * sh + t * st + e * se);
  }
};

// Row i of the scaled scores of head bh, keys 0..last (the rest are masked).
template <class T, class A = acc_t<T>>
void scores_row(const View4<T>& q, const View4<T>& k, int64_t bh, int64_t i, int64_t last, int64_t e_count, A scale,
                A* s) {
  for (int64_t j = 0; j <= last; ++j) {
    A dot = 0;
    for (int64_t e = 0; e < e_count; ++e) dot += q.at(bh, i, e) * k.at(bh, j, e);
    s[j] = dot * scale;
  }
}

// Dropout's factor of element (bh, i, j): 0 or 1/(1-p).
template <class A>
A drop_factor(const AttentionParams& p, int64_t bh, int64_t i, int64_t j, int64_t tq, int64_t tk) {
  if (p.dropout == 0.0) return A(1);
  return attention_keeps(p, bh, i, j, tq, tk) ? A(1.0 / (1.0 - p.dropout)) : A(0);
}

struct Dims {
  int64_t bh, tq, tk, e, ev;
};
Dims dims_of(const Tensor& q, const Tensor& k, const Tensor& v) {
  return {q.size(0) * q.size(1), q.size(2), k.size(2), q.size(3), v.size(3)};
}

}  // namespace

AttentionForward attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p) {
  const Dims d = dims_of(q, k, v);
  const DType acc_dtype = q.dtype() == DType::f64 ? DType::f64 : DType::f32;
  AttentionForward f{Tensor::empty({q.size(0), q.size(1), d.tq, d.ev}, q.dtype()),
                     Tensor::empty({q.size(0), q.size(1), d.tq}, acc_dtype),
                     Tensor::zeros({q.size(0), q.size(1), d.tq, d.tk}, acc_dtype)};
  dispatch_floating(q.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const View4<T> vq(q), vk(k), vv(v);
    T* out = static_cast<T*>(f.out.data_ptr());
    A* lse = static_cast<A*>(f.lse.data_ptr());
    A* probs = static_cast<A*>(f.probs.data_ptr());
#pragma omp parallel for schedule(static)
    for (int64_t bh = 0; bh < d.bh; ++bh) {
      std::vector<A> o(size_t(d.ev));
      for (int64_t i = 0; i < d.tq; ++i) {
        const int64_t last = attention_last_key(p, i, d.tq, d.tk);
        A* prow = probs + (bh * d.tq + i) * d.tk;
        scores_row(vq, vk, bh, i, last, d.e, A(p.scale), prow);
        A mx = -INFINITY;
        for (int64_t j = 0; j <= last; ++j) mx = std::max(mx, prow[j]);
        A total = 0;
        for (int64_t j = 0; j <= last; ++j) total += std::exp(prow[j] - mx);
        const A row_lse = mx + std::log(total);
        lse[bh * d.tq + i] = row_lse;
        for (int64_t j = 0; j <= last; ++j) prow[j] = std::exp(prow[j] - row_lse);
        std::fill(o.begin(), o.end(), A(0));
        for (int64_t j = 0; j <= last; ++j) {
          const A pd = prow[j] * drop_factor<A>(p, bh, i, j, d.tq, d.tk);
          for (int64_t e = 0; e < d.ev; ++e) o[size_t(e)] += pd * vv.at(bh, j, e);
        }
        for (int64_t e = 0; e < d.ev; ++e) store(out + (bh * d.tq + i) * d.ev + e, o[size_t(e)]);
      }
    }
  });
  return f;
}

AttentionGrads attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionForward& fwd,
                                  const Tensor& grad_out, const AttentionParams& p) {
  const Dims d = dims_of(q, k, v);
  AttentionGrads g{Tensor::empty(q.shape(), q.dtype()), Tensor::empty(k.shape(), k.dtype()),
                   Tensor::empty(v.shape(), v.dtype())};
  dispatch_floating(q.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const View4<T> vq(q), vk(k), vv(v), vgo(grad_out);
    const A* lse = static_cast<const A*>(fwd.lse.data_ptr());
    const A* probs = fwd.probs.defined() ? static_cast<const A*>(fwd.probs.data_ptr()) : nullptr;
    T* dq = static_cast<T*>(g.dq.data_ptr());
    T* dk = static_cast<T*>(g.dk.data_ptr());
    T* dv = static_cast<T*>(g.dv.data_ptr());
    const A scale = A(p.scale);
#pragma omp parallel for schedule(static)
    for (int64_t bh = 0; bh < d.bh; ++bh) {
      std::vector<A> gq(size_t(d.tq * d.e), A(0)), gk(size_t(d.tk * d.e), A(0)), gv(size_t(d.tk * d.ev), A(0));
      std::vector<A> prow(size_t(d.tk)), ds(size_t(d.tk));
      for (int64_t i = 0; i < d.tq; ++i) {
        const int64_t last = attention_last_key(p, i, d.tq, d.tk);
        if (probs) {
          std::copy(probs + (bh * d.tq + i) * d.tk, probs + (bh * d.tq + i) * d.tk + last + 1, prow.begin());
        } else {  // recomputed from the log-sum-exp, as the fused kernels do
          scores_row(vq, vk, bh, i, last, d.e, scale, prow.data());
          for (int64_t j = 0; j <= last; ++j) prow[size_t(j)] = std::exp(prow[size_t(j)] - lse[bh * d.tq + i]);
        }
        // dP = dO v^T through dropout; dv += P_dropped^T dO; D = sum_j P dP; dS = P (dP - D).
        A dot = 0;
        for (int64_t j = 0; j <= last; ++j) {
          const A f = drop_factor<A>(p, bh, i, j, d.tq, d.tk), pj = prow[size_t(j)];
          A dp = 0;
          for (int64_t e = 0; e < d.ev; ++e) {
            const A go = vgo.at(bh, i, e);
            dp += go * vv.at(bh, j, e);
            gv[size_t(j * d.ev + e)] += pj * f * go;
          }
          ds[size_t(j)] = dp * f;
          dot += pj * ds[size_t(j)];
        }
        for (int64_t j = 0; j <= last; ++j) {
          const A s = prow[size_t(j)] * (ds[size_t(j)] - dot) * scale;
          for (int64_t e = 0; e < d.e; ++e) {
            gq[size_t(i * d.e + e)] += s * vk.at(bh, j, e);
            gk[size_t(j * d.e + e)] += s * vq.at(bh, i, e);
          }
        }
      }
      for (int64_t n = 0; n < d.tq * d.e; ++n) store(dq + bh * d.tq * d.e + n, gq[size_t(n)]);
      for (int64_t n = 0; n < d.tk * d.e; ++n) store(dk + bh * d.tk * d.e + n, gk[size_t(n)]);
      for (int64_t n = 0; n < d.tk * d.ev; ++n) store(dv + bh * d.tk * d.ev + n, gv[size_t(n)]);
    }
  });
  return g;
}

}  // namespace mixprec::kernels::ref
