// StateDict helpers: look-up, the one-line check of a loaded entry, 0-d integer scalars.
#include "mixprec/state_dict.h"

#include "mixprec/error.h"

namespace mixprec {

const Tensor* find_state(const StateDict& sd, const std::string& key) {
  for (const auto& [k, t] : sd)
    if (k == key) return &t;
  return nullptr;
}

void check_state(const std::string& owner, const std::string& key, const Tensor& t, DType dtype, const Shape& shape) {
  MIXPREC_CHECK(t.defined(), owner, ".load_state_dict: '", key, "' is an undefined tensor, expected ",
                dtype_name(dtype), " ", shape_str(shape));
  MIXPREC_CHECK(t.dtype() == dtype && t.shape() == shape, owner, ".load_state_dict: '", key, "' is ",
                dtype_name(t.dtype()), " ", shape_str(t.shape()), ", expected ", dtype_name(dtype), " ",
                shape_str(shape));
}

Tensor state_i64(int64_t value) { return Tensor::from_vector(std::vector<int64_t>{value}, {}); }

int64_t state_to_i64(const Tensor& t) {
  MIXPREC_ASSERT(t.dtype() == DType::i64 && t.numel() == 1);
  return t.to_vector_i64()[0];
}

}  // namespace mixprec
