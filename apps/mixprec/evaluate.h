// Test-set evaluation, shared by train (after each epoch) and eval (a checkpoint).
#pragma once
#include <cstdint>

#include "mixprec/data.h"
#include "mixprec/nn.h"
#include "mixprec/precision.h"
#include "mixprec/tensor.h"

namespace mixprec::cli {

struct EvalResult {
  double accuracy = 0, loss = 0;  // accuracy in [0, 1]; loss: mean cross-entropy
};
// The model (on `device`) in eval mode, then back in train mode, under the precision's autocast
// for that device, batches of 1000.
EvalResult evaluate(nn::Module& model, const amp::Precision& precision, const data::Dataset& test, data::Normalize norm,
                    const Device& device);

}  // namespace mixprec::cli
