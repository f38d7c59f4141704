// Internal autocast machinery: the per-op input casting that every op calls at entry.
#pragma once
#include <initializer_list>

#include "mixprec/amp.h"
#include "mixprec/tensor.h"
#include "ops/op_table.h"

namespace mixprec::amp {

struct AutocastState {
  bool enabled = false;  // a guard with enabled=true is innermost
  int depth = 0;         // live guards, enabled or not
  DType dtype = kDefaultCpuAutocastDType;
  bool suspended = false;  // inside backward: autocast does not apply
};
AutocastState& autocast_state();

// Casts `inputs` in place according to op's autocast class. Cheap no-op when autocast is off.
void apply_autocast(OpId op, std::initializer_list<Tensor*> inputs);

// Outside autocast, only records the op for the trace if one is running.
inline void autocast(OpId op, std::initializer_list<Tensor*> inputs) {
  const AutocastState& s = autocast_state();
  if (s.enabled && !s.suspended) apply_autocast(op, inputs);
}

// Disables autocast for its scope (the backward pass runs in the dtypes the forward chose).
class AutocastSuspend {
 public:
  AutocastSuspend() : prev_(autocast_state().suspended) { autocast_state().suspended = true; }
  ~AutocastSuspend() { autocast_state().suspended = prev_; }
  AutocastSuspend(const AutocastSuspend&) = delete;
  AutocastSuspend& operator=(const AutocastSuspend&) = delete;

 private:
  bool prev_;
};

}  // namespace mixprec::amp
