// oneDNN matmul on raw pointers with element strides: dst = src @ wei (+ bias) (relu) (+ dst),
// batched, with cached primitives. Not tensor-aware: the op layer maps tensors onto MatmulArgs.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "kernels/cpu/dnnl_common.h"
#include "mixprec/dtype.h"

namespace mixprec::kernels::cpu {

// Strides count elements, not bytes. Transposes are expressed by strides, never by copies:
//   linear forward   y[B,out] = x[B,in] @ W^T  (W [out,in] row-major): wei_stride_k = 1, wei_stride_n = in
//   weight gradient  gW[out,in] = gy^T @ x     (gy [B,out]):          src_stride_m = 1, src_stride_k = out
struct MatmulArgs {
  int64_t batch = 1;  // batched matmul when > 1; a batch stride of 0 broadcasts src or wei
  int64_t m = 0, n = 0, k = 0;
  DType src_t = DType::f32, wei_t = DType::f32, dst_t = DType::f32;  // (f32,f32,f32), (bf16,bf16,bf16), (bf16,bf16,f32)

  const void* src = nullptr;  // [batch][m,k]
  int64_t src_stride_m = 0, src_stride_k = 1, src_stride_batch = 0;
  const void* wei = nullptr;  // [batch][k,n]
  int64_t wei_stride_k = 0, wei_stride_n = 1, wei_stride_batch = 0;
  void* dst = nullptr;  // [batch][m,n], unit stride along n
  int64_t dst_stride_m = 0, dst_stride_batch = 0;

  const void* bias = nullptr;  // [n] contiguous, broadcast over m and batch
  DType bias_t = DType::f32;   // f32, or bf16 when src is bf16
  bool relu = false;           // fused ReLU, applied after the bias
  bool accumulate = false;     // dst += result (sum post-op): gradient accumulation
};

struct MatmulEntry;  // a cached primitive (dnnl_matmul.cpp)

// Whether oneDNN on this CPU computes this dtype combination (never f16: the caller computes
// f16 through f32). Shapes and strides are not judged here; matmul() checks them.
bool matmul_supported(const MatmulArgs& args);

// Whether this host's oneDNN has a bf16 matmul at all: oneDNN 2.6's bf16 kernels need AVX-512
// (avx512_core), native (AVX512-BF16, AMX) or emulated through f32; an AVX2 host has none, and the
// op layer widens bf16 to f32 there (kernels/cpu/matmul.cpp).
bool matmul_has_bf16();

// dst = relu?(src @ wei + bias) + (accumulate ? dst : 0). Products accumulate in f32.
// Throws mixprec::Error on an unsupported dtype combination or an invalid shape/stride.
void matmul(const MatmulArgs& args);

// The oneDNN implementation matmul(args) runs, e.g. "brg:avx512_core_amx_bf16", with
// " +dense(src)" / " +dense(wei)" when an operand is first copied to a dense layout (the fast
// kernels reject layouts with no unit stride). Creates the primitive if needed (counts in stats).
std::string matmul_impl_name(const MatmulArgs& args);

// One product run on one thread of the caller's own OpenMP region (kernels/cpu/matmul_widened.cpp):
// the primitive is created here, before the region, for one thread (oneDNN fixes a primitive's
// thread count at creation; cached apart from matmul()'s), and run() takes the caller's
// scratchpad, so that a run allocates nothing.
class OneThreadMatmul {
 public:
  // `shape`'s pointers need only be non-null; throws mixprec::Error as matmul() does.
  explicit OneThreadMatmul(const MatmulArgs& shape);
  // False where oneDNN would first copy an operand to a dense layout (a per-call allocation).
  bool ok() const;
  size_t scratchpad_bytes() const;
  const std::string& impl() const;
  // The product on these pointers, with the shape, strides and post-ops given at construction.
  void run(const void* src, const void* wei, void* dst, const void* bias, void* scratchpad) const;

 private:
  std::shared_ptr<const MatmulEntry> e_;
};

// The matmul primitive cache (tests check that one shape creates one primitive).
CacheStats matmul_cache_stats();
void matmul_cache_clear();

}  // namespace mixprec::kernels::cpu
