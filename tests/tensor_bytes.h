// A tensor's bytes in logical order, for tests that compare results bit for bit.
#pragma once
#include <cstdint>
#include <vector>

#include "mixprec/tensor.h"

namespace mixprec::testutil {

inline std::vector<uint8_t> bytes_of(const Tensor& t) {
  const Tensor c = t.detach().to(Device::cpu()).contiguous();  // any device
  const auto* p = static_cast<const uint8_t*>(c.data_ptr());
  return std::vector<uint8_t>(p, p + c.nbytes());
}

}  // namespace mixprec::testutil
