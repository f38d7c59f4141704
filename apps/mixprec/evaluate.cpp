// Test-set accuracy and loss of a model on a device; a language model's validation loss.
#include "evaluate.h"

#include <algorithm>
#include <vector>

#include "mixprec/autocast.h"
#include "mixprec/autograd.h"
#include "mixprec/ops.h"
#include "session.h"

namespace mixprec::cli {

EvalResult evaluate(nn::Module& model, const amp::Precision& precision, const data::Dataset& test, data::Normalize norm,
                    const Device& device) {
  data::LoaderOptions lo;
  lo.batch_size = 1000;
  lo.shuffle = false;
  lo.norm = norm;
  lo.pin_memory = device.is_cuda();
  data::BatchLoader loader(test, lo);
  loader.begin_epoch(0);
  model.eval();
  autograd::NoGradGuard no_grad;
  // Under mpirun the batches are dealt out to the ranks in turn (batch j to rank j % size) and the
  // counts summed over them: every rank gets the whole test set's figures.
  const int64_t rank = world_rank(), ranks = world_size();
  int64_t correct = 0, seen = 0;
  double loss_sum = 0;
  data::HostBatch b;
  for (int64_t j = 0; loader.next(b); ++j) {
    if (j % ranks != rank) continue;
    const data::DeviceBatch d = data::to_device(b, test.rows, test.cols, device);
    const Tensor &x = d.x, &y = d.y;
    Tensor logits, loss;
    {
      amp::Autocast ac(device.type, precision.autocast_dtype, precision.autocast);
      logits = model(x);
      loss = ops::cross_entropy(logits, y, ops::Reduction::sum);
    }
    loss_sum += loss.item();
    const std::vector<float> l = logits.to_vector();
    const int64_t c = logits.size(1);
    for (int64_t i = 0; i < b.n; ++i) {
      const float* row = l.data() + i * c;
      const int64_t pred = std::max_element(row, row + c) - row;
      correct += pred == b.y[size_t(i)];
    }
    seen += b.n;
  }
  model.train();
  std::vector<double> sums = {double(correct), double(seen), loss_sum};
  sum_over_ranks(sums);
  const double n = std::max(sums[1], 1.0);
  return {sums[0] / n, sums[2] / n};
}

double validation_loss(nn::Module& model, const amp::Precision& precision, const data::TextCorpus& corpus,
                       int64_t block_size, int64_t batches, const Device& device) {
  model.eval();
  autograd::NoGradGuard no_grad;
  std::vector<Tensor> losses;
  const int64_t rank = world_rank(), ranks = world_size();  // batch j on rank j % size, as above
  for (int64_t j = rank; j < batches; j += ranks) {
    const data::TextBatch b =
        data::text_batch(corpus, data::TextSplit::val, /*seed=*/0, uint64_t(j * data::kValBatchSize),
                         data::kValBatchSize, block_size, device);
    amp::Autocast ac(device.type, precision.autocast_dtype, precision.autocast);
    losses.push_back(ops::cross_entropy(model(b.x), b.y).reshape({1}));
  }
  model.train();
  // One copy from the device for all the batches.
  double sum = 0;
  if (!losses.empty())
    for (const double l : ops::cat(losses, 0).to_vector_f64()) sum += l;
  std::vector<double> sums = {sum};
  sum_over_ranks(sums);
  return sums[0] / double(batches);
}

}  // namespace mixprec::cli
