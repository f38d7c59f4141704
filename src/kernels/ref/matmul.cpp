// Reference matmul: direct loops accumulating in f64, so it is the exact product of the stored
// values rounded once (the oracle for the oneDNN path).
#include "kernels/matmul.h"
#include "kernels/elementwise_math.h"
#include "kernels/ref/access.h"

namespace mixprec::kernels::ref {

// dst[m,n] = op(a)[m,k] @ op(b)[k,n], or one such product per batch for [batch, ., .] operands:
// inputs rounded to their dtype already; accumulate in f64 so the reference is the exact
// product of the stored values.
void matmul(const Tensor& a, const Tensor& b, Tensor& dst, const MatmulOpts& o) {
  const bool batched = a.dim() == 3;
  MIXPREC_ASSERT(a.dim() == b.dim() && a.dim() == dst.dim() && (a.dim() == 2 || batched), "matmul ranks");
  const int64_t batch = batched ? a.size(0) : 1, r0 = batched ? 1 : 0;  // r0: first matrix dim
  MIXPREC_ASSERT(!batched || (b.size(0) == batch && dst.size(0) == batch), "matmul batch");
  const int64_t m = o.trans_a ? a.size(r0 + 1) : a.size(r0), k = o.trans_a ? a.size(r0) : a.size(r0 + 1);
  const int64_t n = o.trans_b ? b.size(r0) : b.size(r0 + 1);
  MIXPREC_ASSERT((o.trans_b ? b.size(r0 + 1) : b.size(r0)) == k, "matmul inner dims");
  MIXPREC_ASSERT(dst.size(r0) == m && dst.size(r0 + 1) == n && dst.is_contiguous(), "matmul dst");
  const std::vector<double> va = a.to_vector_f64(), vb = b.to_vector_f64();
  std::vector<double> bias;
  if (o.bias) bias = o.bias->to_vector_f64();
  std::vector<double> prev;
  if (o.accumulate) prev = dst.to_vector_f64();
  std::vector<double> out(size_t(batch * m * n)), gelu_in(o.gelu_input ? out.size() : 0);
  const int64_t a_cols = a.size(r0 + 1), b_cols = b.size(r0 + 1);
  const int64_t a_mat = a.size(r0) * a_cols, b_mat = b.size(r0) * b_cols;
  // op(a)'s rows and op(b)'s columns as contiguous rows of k values, so that each sum reads two
  // rows: the same terms, added in the same order. The walk down a transposed operand's columns
  // (a stride of a row per term) took two thirds of MatmulWidened's test (11.3 -> 3.5 s, AMD Zen 3).
  std::vector<double> rows_a(size_t(m * k)), cols_b(size_t(n * k));
  for (int64_t q = 0; q < batch; ++q) {
    const double* pa = va.data() + q * a_mat;
    const double* pb = vb.data() + q * b_mat;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t p = 0; p < k; ++p) rows_a[size_t(i * k + p)] = o.trans_a ? pa[p * a_cols + i] : pa[i * a_cols + p];
    for (int64_t j = 0; j < n; ++j)
      for (int64_t p = 0; p < k; ++p) cols_b[size_t(j * k + p)] = o.trans_b ? pb[j * b_cols + p] : pb[p * b_cols + j];
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        const double* ar = rows_a.data() + i * k;
        const double* bc = cols_b.data() + j * k;
        double s = 0;
        for (int64_t p = 0; p < k; ++p) s += ar[p] * bc[p];
        if (o.bias) s += bias[size_t(j)];
        const size_t at = size_t((q * m + i) * n + j);
        if (o.relu && s < 0) s = 0;  // NaN stays NaN
        if (o.gelu) {
          if (o.gelu_input) gelu_in[at] = s;
          s = gelu_tanh(s);
        }
        if (o.accumulate) s += prev[at];
        out[at] = s;
      }
  }
  convert(out.data(), DType::f64, dst.data_ptr(), dst.dtype(), out.size());
  if (o.gelu_input) {
    MIXPREC_ASSERT(o.gelu_input->shape() == dst.shape() && o.gelu_input->is_contiguous(), "matmul gelu_input");
    convert(gelu_in.data(), DType::f64, o.gelu_input->data_ptr(), o.gelu_input->dtype(), gelu_in.size());
  }
}

}  // namespace mixprec::kernels::ref
