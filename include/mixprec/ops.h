// The differentiable ops (declared with their autocast class in src/ops/ops.def).
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include "mixprec/random.h"
#include "mixprec/tensor.h"

namespace mixprec::ops {

// ---- matmul family (autocast: lower) ----
// [.., m, k] @ [k, n]: leading dims of a are flattened into one product. [.., m, k] @ [.., k, n]:
// one product per batch, the batch dims broadcast as PyTorch's (a repeated operand is copied).
Tensor matmul(const Tensor& a, const Tensor& b);
Tensor linear(const Tensor& x, const Tensor& weight,
              const Tensor& bias = Tensor());  // x[.., in] @ weight[out,in]^T + bias[out]
// relu(linear(x, weight, bias)) as one oneDNN matmul with a ReLU post-op (nn::Sequential runs a
// Linear followed by a ReLU this way): the values and gradients of the two ops, one pass fewer.
// A variant of linear in ops.def (same OpId and autocast class).
Tensor linear_relu(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

// ---- element-wise binary with broadcasting (autocast: promote) ----
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);

// ---- unary ----
Tensor neg(const Tensor& x);
Tensor affine(const Tensor& x, double scale, double shift = 0.0);  // x*scale + shift, input dtype
Tensor exp(const Tensor& x);                                       // fp32 class
Tensor log(const Tensor& x);                                       // fp32 class
Tensor pow(const Tensor& x, double exponent);                      // fp32 class
Tensor sqrt(const Tensor& x);                                      // fp32 class

// ---- activations (autocast: keep) ----
Tensor relu(const Tensor& x);
Tensor gelu(const Tensor& x, bool tanh_approx = false);  // exact erf form by default, as PyTorch
Tensor silu(const Tensor& x);                            // x * sigmoid(x)
Tensor sigmoid(const Tensor& x);                         // 1 / (1 + e^-x)
Tensor tanh(const Tensor& x);
Tensor dropout(const Tensor& x, double p, bool training, Generator* gen = nullptr);

// ---- reductions (autocast: fp32; accumulate in f32, f64 for f64) ----
Tensor sum(const Tensor& x);  // all elements -> scalar
Tensor sum(const Tensor& x, std::vector<int64_t> dims, bool keepdim = false);
Tensor mean(const Tensor& x);
Tensor mean(const Tensor& x, std::vector<int64_t> dims, bool keepdim = false);

// ---- softmax family (autocast: fp32), over dim ----
Tensor softmax(const Tensor& x, int64_t dim = -1);
Tensor log_softmax(const Tensor& x, int64_t dim = -1);

// ---- losses (autocast: fp32), mean reduction ----
enum class Reduction { mean, sum, none };
// log_probs [N, C] and target i64 [N], or log_probs [..., C] and target of the leading shape [...]
// (the class dim LAST, as a GPT's [B, T, V] logits; PyTorch would want [B, V, T]: a documented
// difference). Targets equal to ignore_index contribute nothing (loss and gradient 0); mean
// divides by the number of targets not ignored (PyTorch's rule; 0/0 = NaN when all are ignored,
// as PyTorch). Reduction::none returns the target's shape.
Tensor nll_loss(const Tensor& log_probs, const Tensor& target, Reduction r = Reduction::mean,
                int64_t ignore_index = -100);
// nll_loss(log_softmax(logits, -1), target, r, ignore_index).
Tensor cross_entropy(const Tensor& logits, const Tensor& target, Reduction r = Reduction::mean,
                     int64_t ignore_index = -100);
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction r = Reduction::mean);

// ---- shape and dtype (autocast: keep) ----
Tensor reshape(const Tensor& x, const Shape& shape);
Tensor flatten(const Tensor& x, int64_t start_dim = 1);
Tensor transpose(const Tensor& x, int64_t d0, int64_t d1);
Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end);
// A view of x broadcast to `shape` (PyTorch's expand): dims aligned from the right, size-1 or
// missing leading dims repeat with stride 0, -1 keeps a size. Writing into it writes the shared
// elements; backward sums the gradient over the repeated dims.
Tensor expand(const Tensor& x, const Shape& shape);
Tensor contiguous(const Tensor& x);
// PyTorch's memory formats: contiguous (row-major) or, for a 4-d [N, C, H, W] tensor,
// channels_last (its bytes laid out [N, H, W, C]: the layout of cuDNN's tensor-core convolutions).
enum class MemoryFormat { contiguous, channels_last };
// x itself where it is already laid out so, else a copy that is (x.contiguous(memory_format=...)).
// channels_last needs a 4-d x. conv2d, max_pool2d and the activations keep a channels-last input's
// layout in their outputs and gradients; the other ops read it through its strides.
Tensor contiguous(const Tensor& x, MemoryFormat format);
Tensor cast(const Tensor& x, DType dtype);  // gradient is cast back to x's dtype
// A contiguous copy on `device`; the gradient goes back to x's device. Same as x.to(device).
Tensor to_device(const Tensor& x, const Device& device);

}  // namespace mixprec::ops

// ---- convolution, pooling, normalisation, concatenation (src/ops/{conv,pool,norm,cat}.cpp) ----
namespace mixprec::ops {

// A 2-d size: one value for both dimensions (`3`) or (h, w) (`{3, 5}`), as PyTorch's int-or-tuple.
struct IntPair {
  int64_t h = 0, w = 0;
  IntPair() = default;
  IntPair(int64_t v) : h(v), w(v) {}  // NOLINT(google-explicit-constructor): `.padding = 1` must work
  IntPair(int64_t h_, int64_t w_) : h(h_), w(w_) {}
  bool operator==(const IntPair&) const = default;
};

struct Conv2dOptions {
  IntPair stride = 1, padding = 0, dilation = 1;
  int64_t groups = 1;
  bool relu = false;  // fused ReLU after the bias, in place on the output: relu(conv(x) + b)
  // The output channels-last (NHWC bytes, PyTorch's torch.channels_last) whatever x's layout; an
  // x that is channels-last gives a channels-last output anyway, as in PyTorch.
  bool channels_last = false;
};
// x [N, C, H, W], weight [OC, C/groups, KH, KW], bias [OC] -> [N, OC, OH, OW] (autocast: lower).
// Zero padding; OH = (H + 2*pad - dil*(KH-1) - 1) / stride + 1.
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(), const Conv2dOptions& o = {});

struct Pool2dOptions {
  IntPair stride = 0;    // 0: the kernel size, as PyTorch's default
  IntPair padding = 0;   // at most half the kernel; max pooling pads with -inf, avg with 0
  IntPair dilation = 1;  // max pooling only
  bool ceil_mode = false;
  bool count_include_pad = true;  // avg pooling only
};
// max_pool2d(conv2d(x, weight, bias, c), kernel_size, p) as one op (autocast: lower, as conv2d): the
// same values and gradients, bit for bit. On the CPU the pool reads the convolution's output in
// oneDNN's own layout, so the full-size output is never reordered into NCHW nor kept (nn::Sequential
// runs Conv2d [, ReLU], MaxPool2d [, ReLU] this way). With c.relu, the ReLU rides on the op (on
// the pooled output, or in mixprec's first-layer kernel), and its gradient's mask is taken from the
// pooled output (a window's maximum is the value its winner had): the values and gradients of
// max_pool2d(conv2d(...)) with c.relu, which are those of relu(max_pool2d(conv2d(...)))).
// Channels-last or an unbatched x run the two ops.
Tensor conv2d_max_pool2d(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dOptions& c,
                         IntPair kernel_size, const Pool2dOptions& p = {});
// Pooling over [N, C, H, W] (or [C, H, W]) windows (autocast: keep). max_pool2d keeps the argmax of
// each window for backward (one byte per output when the window has at most 256 elements).
Tensor max_pool2d(const Tensor& x, IntPair kernel_size, const Pool2dOptions& o = {});
Tensor avg_pool2d(const Tensor& x, IntPair kernel_size, const Pool2dOptions& o = {});
// Output [N, C, OH, OW]; window i covers [floor(i*H/OH), ceil((i+1)*H/OH)), as PyTorch.
Tensor adaptive_avg_pool2d(const Tensor& x, IntPair output_size);

// Batch normalisation over dim 1 of [N, C, ...] (autocast: fp32). Training: normalises with the
// batch mean and biased variance, and updates running_mean/var in place (running = (1-m)*running +
// m*batch, unbiased variance) when they are defined. Eval: normalises with the running statistics.
// weight/bias [C] may be undefined (affine=false).
Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                  const Tensor& bias, bool training, double momentum = 0.1, double eps = 1e-5);
// Layer normalisation over the trailing dims `normalized_shape` (autocast: fp32). With out_dtype
// (floating) the output is rounded once to it in the same pass: layer_norm(...).to(out_dtype) fused
// (the same bits where the kernels compute in f32; the f64 reference rounds its value once), and
// its backward takes the gradient in out_dtype and gives x's in x's dtype. A pre-norm block under
// autocast asks for the autocast dtype, which its first Linear would cast to.
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5, std::optional<DType> out_dtype = std::nullopt);

// Concatenation along dim (autocast: promote; mixed floating dtypes promote as in PyTorch).
Tensor cat(const std::vector<Tensor>& xs, int64_t dim = 0);

// ---- embedding (autocast: keep; family embedding) ----
// weight [V, D], indices i64 of any shape S -> S + [D], in weight's dtype (a gather of rows).
// Backward (to weight only): the rows of the gradient scatter-added into a [V, D] gradient,
// accumulated in f32, returned in weight's dtype. An index outside [0, V) throws one line naming
// embedding (on a GPU: flagged and reported at the next sync, as nll_loss's bad targets are).
Tensor embedding(const Tensor& weight, const Tensor& indices);
// ---- attention (autocast: lower; family attention: src/ops/attention.cpp) ----
struct AttentionOptions {
  bool causal = false;                         // query i attends to keys j <= i (+ Tk - Tq when Tk > Tq, as PyTorch's)
  double dropout = 0.0;                        // on the attention probabilities (training only: pass 0 in eval)
  std::optional<double> scale = std::nullopt;  // default 1/sqrt(E)
  Generator* gen = nullptr;                    // of the dropout mask (default_generator() when null)
};
// q [B, H, Tq, E], k [B, H, Tk, E], v [B, H, Tk, Ev] -> [B, H, Tq, Ev] (PyTorch 2's
// scaled_dot_product_attention). Inputs may be non-contiguous views (the GPT passes
// qkv.view(B,T,3,H,E) sliced and transposed). q, k, v share a dtype (autocast makes them so).
// The fast CPU kernel is fused (FlashAttention's blocks and online softmax) and keeps only the
// output and the log-sum-exp of each row for the backward, so its saved memory grows linearly with
// the sequence; dropout's mask is recomputed from the generator's counter-based words, not stored.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o = {});
// The same on a packed projection qkv [B, T, 3 C] (a transformer's c_attn output): q, k and v are
// its thirds seen as [B, H, T, C / H] (views, no copy), the result [B, H, T, C / H]. Its backward
// writes the three gradients into one [B, T, 3 C] tensor, where three views' backwards would each
// make a zeroed qkv-sized gradient and the engine sum them. A variant of
// scaled_dot_product_attention in ops.def (same OpId and autocast class).
Tensor packed_qkv_attention(const Tensor& qkv, int64_t heads, const AttentionOptions& o = {});

}  // namespace mixprec::ops
