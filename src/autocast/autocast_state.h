// Autocast's side facing the ops (internal): the thread's autocast state and the per-op input
// casting that every op calls at entry.
#pragma once
#include <cstddef>
#include <initializer_list>

#include "mixprec/autocast.h"
#include "mixprec/autograd.h"
#include "mixprec/tensor.h"
#include "ops/op_table.h"

namespace mixprec::amp {

struct AutocastState {
  bool enabled = false;  // a guard with enabled=true is innermost
  int depth = 0;         // live guards, enabled or not
  DType dtype = kDefaultCpuAutocastDType;
  bool cache_enabled = true;  // the innermost guard's cache_enabled
};
AutocastState& autocast_state();

// Casts `inputs` in place according to op's autocast class and, while a trace runs
// (start_trace), records the op with its input and run dtypes. Call it through autocast().
void apply_autocast(OpId op, std::initializer_list<Tensor*> inputs);

// Throws mixprec::Error naming the op and the devices when its defined inputs are not all on
// one device (PyTorch refuses the same; a silent copy would hide a slow transfer).
[[noreturn]] void throw_mixed_devices(OpId op, std::initializer_list<Tensor*> inputs);
inline void check_devices(OpId op, std::initializer_list<Tensor*> inputs) {
  const Tensor* first = nullptr;
  for (Tensor* x : inputs) {
    if (!x->defined()) continue;
    if (first == nullptr)
      first = x;
    else if (!(x->device() == first->device()))
      throw_mixed_devices(op, inputs);
  }
}

// At every op's entry: the inputs' devices must agree. Inside an autocast region, and outside the backward pass (which
// computes in the dtypes the forward chose), applies the op's class and feeds the trace;
// elsewhere it does nothing, so the trace lists only the ops that ran under autocast.
inline void autocast(OpId op, std::initializer_list<Tensor*> inputs) {
  check_devices(op, inputs);
  if (autocast_state().enabled && !autograd::in_backward()) apply_autocast(op, inputs);
}

// The cached 16-bit copies of leaf parameters on this thread (tests check the cache's life).
size_t autocast_cache_size();

}  // namespace mixprec::amp
