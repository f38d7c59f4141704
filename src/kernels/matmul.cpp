// Dispatch of the matmul family (matmul.h): cuBLASLt for GPU tensors; on the CPU oneDNN where it
// supports the case, else the reference.
#include "kernels/matmul.h"

#include <atomic>

namespace mixprec::kernels {
namespace {
std::atomic<bool> g_allow_tf32{false};  // PyTorch's default since 1.12: fp32 matmuls are true fp32
}  // namespace

void set_allow_tf32(bool on) { g_allow_tf32.store(on, std::memory_order_relaxed); }
bool allow_tf32() { return g_allow_tf32.load(std::memory_order_relaxed); }

void matmul(const Tensor& a, const Tensor& b, Tensor& dst, const MatmulOpts& o) {
  const Tensor none;
  const DeviceScope on({&a, &b, &dst, o.bias ? o.bias : &none, o.gelu_input ? o.gelu_input : &none});
  if (profile::detail::on()) {  // dst [.., m, n] = op(a) [.., m, k] @ op(b) [.., k, n]
    const int64_t k = o.trans_a ? a.size(-2) : a.size(-1);
    profile::detail::add_flops(2.0 * double(dst.numel()) * double(k));
  }
#ifdef MIXPREC_WITH_CUDA
  if (on.cuda()) return cuda::matmul(a, b, dst, o);
#endif
  if (use_fast() && cpu::matmul(a, b, dst, o)) return;
  note_reference();
  ref::matmul(a, b, dst, o);
}

}  // namespace mixprec::kernels
