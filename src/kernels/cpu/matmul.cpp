// Fast CPU matmul glue: tensors -> oneDNN MatmulArgs (f32; bf16 where the host has AVX512-BF16
// or AMX-BF16). oneDNN has no f16 matmul on CPU, so f16 operands are widened to f32, multiplied,
// and the result rounded to f16 once on store: f16 storage, range and rounding stay real (design
// decision 4). bf16 on a host without either takes the same road: oneDNN's own bf16 matmul there
// (gemm:jit converting to f32, with packing buffers outside our allocator) ran the MLP's amp-bf16
// step at 2.7x the time of its fp32 step on an AVX-512 Xeon without BF16 (2026-11-27). So do large
// bf16 products on Intel's AVX512-BF16 without AMX (bf16_in_f32). The road runs a block per thread
// where matmul_widened takes the shape, else as whole tensors.
#include "kernels/matmul.h"
#include "kernels/activation.h"
#include "kernels/cpu/dnnl_common.h"
#include "kernels/cpu/dnnl_matmul.h"
#include "kernels/cpu/matmul_widened.h"
#include "kernels/shape.h"

namespace mixprec::kernels::cpu {
namespace {

// On the by_size kind (dnnl_common.h: Intel's AVX512-BF16 without AMX) a bf16 product computes in
// f32 where it has the work to pay for its casts: at least 2^26 flops and 64 flops per element of
// its operands and result. A bf16 matmul through mixprec's kernel on each road, best of 7
// interleaved (`bench/bf16_road_probe matmul`, Emerald Rapids guest, 2 cores, 2026-12-03), f32/bf16
// time by m x k x n, two runs: the MLP's 512 x 784 x 1024 0.64-0.81, 512 x 1024 x 1024 0.74-0.75,
// 1024 x 512 x 1024 0.70-0.80; the gpt's 4096 x 128 x 384 0.90-0.95, 128 x 4096 x 512 0.80-0.96,
// 4096 x 128 x 81 0.90-1.25; 1024^3 0.70-0.71. Losses: 512 x 1024 x 10 1.75-2.43, 256 x 3136 x 10
// 1.49-3.12 (19 flops an element), 256^3 1.06-1.11, 128^3 1.14-1.22 (fewer than 2^26 flops).
constexpr double kBf16InF32MinFlops = double(int64_t(1) << 26), kBf16InF32MinFlopsPerElement = 64;

bool large_product(int64_t batch, int64_t m, int64_t k, int64_t n) {
  const double flops = 2.0 * double(batch) * double(m) * double(k) * double(n);
  const double elements = double(batch) * (double(m) * double(k) + double(k) * double(n) + double(m) * double(n));
  return flops >= kBf16InF32MinFlops && flops >= kBf16InF32MinFlopsPerElement * elements;
}

}  // namespace

bool matmul(const Tensor& a, const Tensor& b, Tensor& dst, const MatmulOpts& o) {
  // A fused ReLU runs after the product, on every road, not as oneDNN's post-op: its jit form
  // (max(x, 0)) makes a NaN +0 on AVX-512 hosts, where mixprec's ReLU and PyTorch's keep it
  // (docs/conv.md, "The fused ReLU"). With `accumulate` (no caller asks for both) the post-op stays,
  // since dst = relu(a b) + dst needs the ReLU before the sum.
  if (o.relu && !o.accumulate) {
    MatmulOpts plain = o;
    plain.relu = false;
    if (!kernels::cpu::matmul(a, b, dst, plain)) return false;
    relu_inplace(dst.data_ptr(), dst.dtype(), dst.numel());
    return true;
  }
  const DType t = a.dtype();
  const int64_t rank = a.dim(), r0 = rank - 2;  // [m, k] or [batch, m, k]
  if (o.gelu) return false;                     // no op fuses GELU on the CPU yet: the reference serves the tests
  if (b.dtype() != t || (rank != 2 && rank != 3) || b.dim() != rank || dst.dim() != rank || !dst.is_contiguous())
    return false;
  if (rank == 3 && (b.size(0) != a.size(0) || dst.size(0) != a.size(0))) return false;
  const int64_t m = dst.size(r0), n = dst.size(r0 + 1), k = o.trans_a ? a.size(r0) : a.size(r0 + 1);
  if (t == DType::f16 || (t == DType::bf16 && bf16_in_f32(large_product(rank == 3 ? dst.size(0) : 1, m, k, n)))) {
    if (dst.dtype() != t && !(t == DType::bf16 && dst.dtype() == DType::f32)) return false;
    if (matmul_widened(a, b, dst, o)) return true;
    Tensor a32 = kernels::cast(a, DType::f32), b32 = kernels::cast(b, DType::f32);
    Tensor bias32 = o.bias ? kernels::cast(*o.bias, DType::f32) : Tensor();
    MatmulOpts o32 = o;
    o32.bias = o.bias ? &bias32 : nullptr;
    if (dst.dtype() == DType::f32) return kernels::cpu::matmul(a32, b32, dst, o32);  // bf16 @ bf16 -> f32
    Tensor d32 = o.accumulate ? kernels::cast(dst, DType::f32) : Tensor::empty(dst.shape(), DType::f32);
    if (!kernels::cpu::matmul(a32, b32, d32, o32)) return false;
    kernels::copy(d32, dst);
    return true;
  }
  if (t != DType::f32 && t != DType::bf16) return false;
  if (dst.dtype() != t && !(t == DType::bf16 && dst.dtype() == DType::f32)) return false;
  MatmulArgs args;
  const auto as = [&](int64_t d) { return a.strides()[size_t(r0 + d)]; };
  const auto bs = [&](int64_t d) { return b.strides()[size_t(r0 + d)]; };
  args.m = m;
  args.n = n;
  args.k = k;
  args.src_t = args.wei_t = t;
  args.dst_t = dst.dtype();
  args.src = a.data_ptr();
  args.src_stride_m = o.trans_a ? as(1) : as(0);
  args.src_stride_k = o.trans_a ? as(0) : as(1);
  args.wei = b.data_ptr();
  args.wei_stride_k = o.trans_b ? bs(1) : bs(0);
  args.wei_stride_n = o.trans_b ? bs(0) : bs(1);
  args.dst = dst.data_ptr();
  args.dst_stride_m = args.n;
  if (rank == 3) {
    args.batch = a.size(0);
    args.src_stride_batch = a.strides()[0];
    args.wei_stride_batch = b.strides()[0];
    args.dst_stride_batch = args.m * args.n;
    // oneDNN cannot broadcast both operands: one product does for every batch then.
    if (args.batch > 1 && args.src_stride_batch == 0 && args.wei_stride_batch == 0) return false;
  }
  Tensor bias;
  if (o.bias) {
    bias = kernels::contig(*o.bias);
    if (bias.dtype() != DType::f32 && bias.dtype() != t) bias = kernels::cast(bias, DType::f32);
    args.bias = bias.data_ptr();
    args.bias_t = bias.dtype();
  }
  args.relu = o.relu;
  args.accumulate = o.accumulate;
  if (!matmul_supported(args)) return false;
  cpu::matmul(args);
  return true;
}

}  // namespace mixprec::kernels::cpu
