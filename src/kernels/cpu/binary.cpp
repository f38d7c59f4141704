// Fast CPU binary kernels: 16-bit inputs converted to f32 in blocks, computed in f32, rounded
// once on store. Same-shape operands, or one broadcast as a suffix row or scalar.
#include <algorithm>

#include "kernels/binary.h"
#include "kernels/cpu/f32_blocks.h"
#include "kernels/elementwise_math.h"

namespace mixprec::kernels::cpu {
namespace {

template <BinaryOp OP>
void binary_loop(const float* a, const float* b, float* d, int64_t n, int64_t a_mod, int64_t b_mod, int64_t a_off,
                 int64_t b_off) {
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

// Supports: same shape contiguous; one operand contiguous and the other a contiguous suffix of
// its shape (a bias row or a scalar) broadcast over the leading dims.
bool binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& dst) {
  // Each operand is read in its own dtype (a mixed pair computes in f32, as after casting the
  // narrower one: the widening is exact); dst is in the promoted dtype.
  const DType ta = a.dtype(), tb = b.dtype(), t = dst.dtype();
  if (!f32_compute(ta) || !f32_compute(tb) || t != promote_floating(ta, tb)) return false;
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
    if (mod) load_f32(x.data_ptr(), x.dtype(), 0, mod, v.data());
    return v;
  };
  const std::vector<float> ra = whole(a, a_mod), rb = whole(b, b_mod);
  for_blocks(n, [&](int64_t begin, int64_t len) {
    float xa[kBlock], xb[kBlock], bd[kBlock];
    const float* pa = a_mod ? ra.data() : in_f32(a.data_ptr(), ta, begin, len, xa);
    const float* pb = b_mod ? rb.data() : in_f32(b.data_ptr(), tb, begin, len, xb);
    float* xd = out_f32(dst.data_ptr(), t, begin, bd);
    const int64_t oa = a_mod ? begin % a_mod : 0, ob = b_mod ? begin % b_mod : 0;
    switch (op) {
      case BinaryOp::add:
        binary_loop<BinaryOp::add>(pa, pb, xd, len, a_mod, b_mod, oa, ob);
        break;
      case BinaryOp::sub:
        binary_loop<BinaryOp::sub>(pa, pb, xd, len, a_mod, b_mod, oa, ob);
        break;
      case BinaryOp::mul:
        binary_loop<BinaryOp::mul>(pa, pb, xd, len, a_mod, b_mod, oa, ob);
        break;
      case BinaryOp::div:
        binary_loop<BinaryOp::div>(pa, pb, xd, len, a_mod, b_mod, oa, ob);
        break;
    }
    flush_f32(dst.data_ptr(), t, begin, len, xd);
  });
  return true;
}

}  // namespace mixprec::kernels::cpu
