// StateDict: the named tensors that a Module, an Optimizer, a GradScaler and a Generator save
// and restore (PyTorch's state_dict flattened to dotted names, in order; scalars are 0-d tensors),
// so that one checkpoint writer stores them all. Layouts: docs/design.md, "State dicts".
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "mixprec/tensor.h"

namespace mixprec {

using StateDict = std::vector<std::pair<std::string, Tensor>>;

// The tensor named key, or null.
const Tensor* find_state(const StateDict& sd, const std::string& key);

// Throws mixprec::Error, one line naming the key:
//   "<owner>.load_state_dict: '<key>' is <dtype> <shape>, expected <dtype> <shape>"
void check_state(const std::string& owner, const std::string& key, const Tensor& t, DType dtype, const Shape& shape);

// 0-d tensors for scalar state, and their values back (after check_state).
Tensor state_i64(int64_t value);
int64_t state_to_i64(const Tensor& t);

}  // namespace mixprec
