// Test-set evaluation, shared by train (after each epoch) and eval (a checkpoint), and the
// conversion of a host batch into tensors.
#pragma once
#include <cstdint>

#include "mixprec/data.h"
#include "mixprec/nn.h"
#include "mixprec/precision.h"
#include "mixprec/tensor.h"

namespace mixprec::cli {

Tensor batch_images(const data::HostBatch& b, int64_t rows, int64_t cols);
Tensor batch_labels(const data::HostBatch& b);

struct EvalResult {
  double accuracy = 0, loss = 0;  // accuracy in [0, 1]; loss: mean cross-entropy
};
// The model in eval mode (then back in train mode) under the precision's autocast, batches of 1000.
EvalResult evaluate(nn::Module& model, const amp::Precision& precision, const data::Dataset& test,
                    data::Normalize norm);

}  // namespace mixprec::cli
