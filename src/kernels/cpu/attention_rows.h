// What the two fused CPU attentions share (internal to the attention kernels): rows of the
// [B, H, T, E] views, and the second kernel, for hosts with AVX2 but no AVX-512
// (cpu/attention_rows.cpp).
#pragma once
#include <algorithm>
#include <cstdint>

#include "kernels/attention.h"
#include "mixprec/dtype.h"
#include "mixprec/tensor.h"

namespace mixprec::kernels::cpu::attn {

// Rows of a [B, H, T, E] view of any strides (the inputs, and the gradients written into views).
struct Rows {
  char* base;
  DType t;
  int64_t h_count, t_count, sb, sh, st, se;
  explicit Rows(const Tensor& x)
      : base(static_cast<char*>(x.data_ptr())),
        t(x.dtype()),
        h_count(x.size(1)),
        t_count(x.size(2)),
        sb(x.strides()[0]),
        sh(x.strides()[1]),
        st(x.strides()[2]),
        se(x.strides()[3]) {}
  char* row(int64_t bh, int64_t i) const {
    return base + size_t((bh / h_count) * sb + (bh % h_count) * sh + i * st) * dtype_size(t);
  }
};

// Dropout's keep bits of keys [j0, j0 + 16) of row (bh, i): the words of attention_keeps, one
// Philox block per four.
inline uint32_t keep_bits(const AttentionParams& p, int64_t bh, int64_t i, int64_t j0, int64_t tq, int64_t tk) {
  uint32_t bits = 0;
  const int64_t n = std::min<int64_t>(16, tk - j0);
  uint64_t w = attention_dropout_word(bh, i, j0, tq, tk);
  detail::PhiloxWords block = attention_dropout_block(p, w);
  for (int64_t l = 0; l < n; ++l, ++w) {
    if (l > 0 && w % 4 == 0) block = attention_dropout_block(p, w);
    if (attention_keeps_word(p, block, w)) bits |= 1u << l;
  }
  return bits;
}

// The fused attention of AVX2 hosts: FlashAttention-2's algorithm on blocks of query rows, each
// row against all the keys it sees (the row's scores in a buffer of Tk floats: nothing of size
// Tq x Tk), in f32 with FMA on 8 lanes; the same results as attention_forward/attention_backward
// (kernels/attention.h) within the tests' bounds. dst.out and dst.lse are allocated by the caller;
// dst's gradients are written in place (any strides).
void forward_rows(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p, AttentionForward& dst);
void backward_rows(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionForward& fwd,
                   const Tensor& grad_out, const AttentionParams& p, AttentionGrads& dst);

}  // namespace mixprec::kernels::cpu::attn
