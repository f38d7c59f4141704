// Kernels of the attention family (ops/attention.cpp): scaled dot-product attention over
// q [B, H, Tq, E], k [B, H, Tk, E], v [B, H, Tk, Ev] (any strides), forward and backward, with a
// causal mask and dropout on the probabilities. Reference: ref/attention.cpp (unfused, keeps the
// [B, H, Tq, Tk] probabilities); fast: cpu/attention.cpp (fused, keeps only the log-sum-exp; its forward
// and backward in cpu/attention_forward.cpp and cpu/attention_backward.cpp);
// CUDA: cuda/attention.cu; dispatch: attention.cpp.
#pragma once
#include <cstdint>

#include "core/philox.h"
#include "kernels/backend.h"
#include "mixprec/tensor.h"

namespace mixprec::kernels {

struct AttentionParams {
  bool causal = false;
  double scale = 1.0;
  double dropout = 0.0;  // probability of dropping a probability; 0: no dropout
  // The Philox words of the dropout's one use of its generator (Generator::reserve of
  // B * H * Tq * Tk words): element (b, h, i, j) takes word ((b * H + h) * Tq + i) * Tk + j.
  uint64_t seed = 0, stream = 0, first_block = 0;
};

// The last key query i may see: Tk - 1, or i + max(Tk - Tq, 0) when causal (so every row sees
// key 0: no row is fully masked).
MIXPREC_HOST_DEVICE inline int64_t attention_last_key(const AttentionParams& p, int64_t i, int64_t tq, int64_t tk) {
  if (!p.causal) return tk - 1;
  const int64_t last = i + (tk > tq ? tk - tq : 0);
  return last < tk - 1 ? last : tk - 1;
}

// Whether dropout keeps element (bh, i, j) (bh = b * H + h): the same bit on every backend and
// device, recomputed by the backward instead of stored.
MIXPREC_HOST_DEVICE inline uint64_t attention_dropout_word(int64_t bh, int64_t i, int64_t j, int64_t tq, int64_t tk) {
  return uint64_t(bh * tq + i) * uint64_t(tk) + uint64_t(j);
}
MIXPREC_HOST_DEVICE inline bool attention_keeps_word(const AttentionParams& p, const detail::PhiloxWords& block,
                                                     uint64_t w) {
  return !detail::dropout_drops(block.w[w % 4], p.dropout);
}
MIXPREC_HOST_DEVICE inline detail::PhiloxWords attention_dropout_block(const AttentionParams& p, uint64_t w) {
  return detail::philox_block(p.seed, p.stream, p.first_block + w / 4);
}
MIXPREC_HOST_DEVICE inline bool attention_keeps(const AttentionParams& p, int64_t bh, int64_t i, int64_t j, int64_t tq,
                                                int64_t tk) {
  const uint64_t w = attention_dropout_word(bh, i, j, tq, tk);
  return attention_keeps_word(p, attention_dropout_block(p, w), w);
}

// What the forward keeps for the backward: the output [B, H, Tq, Ev] (contiguous, q's dtype), the
// log-sum-exp of each row's scaled scores [B, H, Tq] (f32; f64 for f64 inputs) and, from the
// reference only, the probabilities before dropout [B, H, Tq, Tk] (same dtype as lse).
struct AttentionForward {
  Tensor out, lse, probs;
};
struct AttentionGrads {
  Tensor dq, dk, dv;  // in the dtypes of q, k, v; contiguous unless written into given views
};

AttentionForward attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p);
// grad_out: [B, H, Tq, Ev] in the output's dtype. Uses fwd.probs where the forward kept them, else
// recomputes the probabilities block by block from fwd.lse. `into`: views of q's, k's and v's
// shapes and dtypes on their device (the thirds of a packed qkv's gradient) that receive the
// gradients, which are then returned: the fused CPU kernel writes its rows there, the others
// copy.
AttentionGrads attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionForward& fwd,
                                  const Tensor& grad_out, const AttentionParams& p,
                                  const AttentionGrads* into = nullptr);

namespace ref {
AttentionForward attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p);
AttentionGrads attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionForward& fwd,
                                  const Tensor& grad_out, const AttentionParams& p);
}  // namespace ref

namespace cpu {  // false where the case is not supported (f64; a host with neither AVX-512 nor AVX2 and FMA)
bool attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p,
                       AttentionForward& dst);
// dst's tensors that are given with q's, k's, v's shapes and dtypes and unit-stride rows are
// written in place; the others are allocated contiguous.
bool attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionForward& fwd,
                        const Tensor& grad_out, const AttentionParams& p, AttentionGrads& dst);
// For tests: while one lives, bf16 attention on this thread runs the bf16-tile kernels with their
// AVX512-BF16 instructions emulated in AVX-512F (the same results but for subnormals, which the
// instructions flush), on any AVX-512 host: the only way a host without AVX512-BF16, which runs
// bf16 on f32 tiles, exercises that path's tiling, pairing and masks.
class EmulatedBf16Tiles {
 public:
  EmulatedBf16Tiles();
  ~EmulatedBf16Tiles();
  EmulatedBf16Tiles(const EmulatedBf16Tiles&) = delete;
  EmulatedBf16Tiles& operator=(const EmulatedBf16Tiles&) = delete;

 private:
  bool previous_;
};
// For tests: while one lives, the bf16-tile forward on this thread (dropout aside, which always
// takes the row form) transposes its scores (on) or keeps them in rows (off), whatever the host:
// cpu/attention_forward.cpp's forward_transposed, the default where the products run on AMX.
class TransposedScores {
 public:
  explicit TransposedScores(bool on);
  ~TransposedScores();
  TransposedScores(const TransposedScores&) = delete;
  TransposedScores& operator=(const TransposedScores&) = delete;

 private:
  int previous_;
};
}  // namespace cpu

namespace cuda {  // src/kernels/cuda/attention.cu: flash-style, lse kept, f32 math
AttentionForward attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p);
AttentionGrads attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionForward& fwd,
                                  const Tensor& grad_out, const AttentionParams& p);
}  // namespace cuda

}  // namespace mixprec::kernels
