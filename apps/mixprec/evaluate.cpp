// Test-set accuracy and loss of a model on a device; a language model's validation loss.
#include "evaluate.h"

#include <algorithm>
#include <vector>

#include "mixprec/autocast.h"
#include "mixprec/autograd.h"
#include "mixprec/ops.h"

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
  int64_t correct = 0, seen = 0;
  double loss_sum = 0;
  data::HostBatch b;
  while (loader.next(b)) {
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
  return {double(correct) / double(std::max<int64_t>(seen, 1)), loss_sum / double(std::max<int64_t>(seen, 1))};
}

double validation_loss(nn::Module& model, const amp::Precision& precision, const data::TextCorpus& corpus,
                       int64_t block_size, int64_t batches, const Device& device) {
  model.eval();
  autograd::NoGradGuard no_grad;
  std::vector<Tensor> losses;
  for (int64_t j = 0; j < batches; ++j) {
    const data::TextBatch b =
        data::text_batch(corpus, data::TextSplit::val, /*seed=*/0, uint64_t(j * data::kValBatchSize),
                         data::kValBatchSize, block_size, device);
    amp::Autocast ac(device.type, precision.autocast_dtype, precision.autocast);
    losses.push_back(ops::cross_entropy(model(b.x), b.y).reshape({1}));
  }
  model.train();
  // One copy from the device for all the batches.
  const std::vector<double> v = ops::cat(losses, 0).to_vector_f64();
  double sum = 0;
  for (const double l : v) sum += l;
  return sum / double(batches);
}

}  // namespace mixprec::cli
