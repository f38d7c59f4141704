// Autocast's side facing the ops (internal): the thread's autocast state and the per-op input
// casting that every op calls at entry.
#pragma once
#include <array>
#include <cstddef>
#include <initializer_list>

#include "mixprec/autocast.h"
#include "mixprec/autograd.h"
#include "mixprec/tensor.h"
#include "ops/op_table.h"

namespace mixprec::amp {

// One device type's autocast: whether its innermost guard is enabled, and the lower-class dtype.
struct DeviceAutocast {
  bool enabled = false;
  DType dtype = kDefaultCpuAutocastDType;
};
constexpr size_t kNumDeviceTypes = 3;  // cpu, cuda, fenced
static_assert(size_t(DeviceType::fenced) + 1 == kNumDeviceTypes, "a DeviceType without an autocast state");

struct AutocastState {
  std::array<DeviceAutocast, kNumDeviceTypes> per_type = {
      DeviceAutocast{false, default_autocast_dtype(DeviceType::cpu)},
      DeviceAutocast{false, default_autocast_dtype(DeviceType::cuda)},
      DeviceAutocast{false, default_autocast_dtype(DeviceType::fenced)}};
  int depth = 0;              // live guards of every device type, enabled or not
  bool cache_enabled = true;  // the innermost guard's cache_enabled
  DeviceAutocast& of(DeviceType t) { return per_type[size_t(t)]; }
};
AutocastState& autocast_state();

// Casts `inputs` in place according to op's autocast class (lower-class ops to `dtype`) and, while
// a trace runs (start_trace), records the op with its input and run dtypes. Call it through
// autocast().
// cast_fp32 false leaves an fp32-class op's 16-bit inputs as they are (autocast_widening).
void apply_autocast(OpId op, DType dtype, std::initializer_list<Tensor*> inputs, bool cast_fp32 = true);

// Throws mixprec::Error naming the op and the devices when its defined inputs are not all on
// one device (PyTorch refuses the same; a silent copy would hide a slow transfer).
// Returns the first defined input (nullptr when none is).
[[noreturn]] void throw_mixed_devices(OpId op, std::initializer_list<Tensor*> inputs);
inline const Tensor* check_devices(OpId op, std::initializer_list<Tensor*> inputs) {
  const Tensor* first = nullptr;
  for (Tensor* x : inputs) {
    if (!x->defined()) continue;
    if (first == nullptr)
      first = x;
    else if (!(x->device() == first->device()))
      throw_mixed_devices(op, inputs);
  }
  return first;
}

// At every op's entry: the inputs' devices must agree. Where the autocast of their device type is
// on, and outside the backward pass (which computes in the dtypes the forward chose), applies the
// op's class and feeds the trace; elsewhere it does nothing, so the trace lists only the ops that
// ran under autocast.
inline void autocast(OpId op, std::initializer_list<Tensor*> inputs) {
  const Tensor* first = check_devices(op, inputs);
  if (first == nullptr) return;
  const DeviceAutocast& on = autocast_state().of(first->device().type);
  if (on.enabled && !autograd::in_backward()) apply_autocast(op, on.dtype, inputs);
}

// autocast() for an fp32-class op whose kernels widen 16-bit inputs to f32 as they read them
// (cross_entropy): the same device check and trace, without the f32 copies. Returns the dtype the
// op computes in: f32 where autocast() would have cast a 16-bit first input, else its dtype.
inline DType autocast_widening(OpId op, std::initializer_list<Tensor*> inputs) {
  const Tensor* first = check_devices(op, inputs);
  if (first == nullptr) return DType::f32;
  const DeviceAutocast& on = autocast_state().of(first->device().type);
  if (!on.enabled || autograd::in_backward()) return first->dtype();
  apply_autocast(op, on.dtype, inputs, /*cast_fp32=*/false);
  return is_half(first->dtype()) ? DType::f32 : first->dtype();
}

// The cached 16-bit copies of leaf parameters on this thread (tests check the cache's life).
size_t autocast_cache_size();

// Cast-ahead: the cast of a parameter's weights into 16 bits fused with the optimizer's write of
// them. Autocast's 16-bit copy of an f32 parameter outlives its region as the parameter's shadow;
// an optimizer's fused step takes the f32 parameter as the master of that 16-bit copy, writing
// both from the one updated value (the copy rounded to nearest, the cast's bits), and the next
// region takes the copy instead of casting while the parameter's version says nothing else wrote
// it since (docs/design.md, "Cast-ahead"). On for parameters on a GPU, where each cast is a
// launch and a read of the f32 weights; MIXPREC_CAST_AHEAD=1 turns it on everywhere, =0 off.
namespace ahead {
bool enabled(const Device& d);
// For tests: forces cast-ahead on or off on every device while it lives (the enclosing one's
// setting comes back when it ends).
class Override {
 public:
  explicit Override(bool on);
  ~Override();
  Override(const Override&) = delete;
  Override& operator=(const Override&) = delete;

 private:
  int prev_;
};
// p's shadow where it holds p's current values (its version is p's), else undefined: what the
// optimizer's step writes, and what autocast reads instead of casting. After the step has been
// queued and p's version bumped, shadow_written(p) records that the shadow holds the new values.
Tensor current_shadow(const Tensor& p);
void shadow_written(const Tensor& p);
}  // namespace ahead

}  // namespace mixprec::amp
