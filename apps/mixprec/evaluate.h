// Test-set evaluation, shared by train (after each epoch) and eval (a checkpoint); the gpt's
// validation loss likewise.
#pragma once
#include <cstdint>

#include "mixprec/data.h"
#include "mixprec/nn.h"
#include "mixprec/precision.h"
#include "mixprec/tensor.h"
#include "mixprec/text.h"

namespace mixprec::cli {

struct EvalResult {
  double accuracy = 0, loss = 0;  // accuracy in [0, 1]; loss: mean cross-entropy
};
// The model (on `device`) in eval mode, then back in train mode, under the precision's autocast
// for that device, batches of 1000. Under mpirun the batches are shared out over the ranks and the
// sums reduced (a collective: every rank calls it); every rank gets the whole set's figures.
EvalResult evaluate(nn::Module& model, const amp::Precision& precision, const data::Dataset& test, data::Normalize norm,
                    const Device& device);

// The mean over `batches` fixed validation batches (data::kValBatchSize rows of block_size, seed 0:
// the same batches in every run) of the mean cross-entropy, nats per character: the model in eval
// mode (then back in train mode), under the precision's autocast for `device`. Sharded over the
// ranks under mpirun, as evaluate.
double validation_loss(nn::Module& model, const amp::Precision& precision, const data::TextCorpus& corpus,
                       int64_t block_size, int64_t batches, const Device& device);

}  // namespace mixprec::cli
