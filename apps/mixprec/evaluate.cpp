// Test-set accuracy and loss of a model, and host batches as tensors.
#include "evaluate.h"

#include <algorithm>
#include <vector>

#include "mixprec/allocator.h"
#include "mixprec/autocast.h"
#include "mixprec/autograd.h"
#include "mixprec/ops.h"

namespace mixprec::cli {

Tensor batch_images(const data::HostBatch& b, int64_t rows, int64_t cols) {
  MemoryScope scope(MemCategory::data);
  Tensor x = Tensor::empty({b.n, 1, rows, cols});
  std::copy(b.x.begin(), b.x.end(), x.data<float>());
  return x;
}
Tensor batch_labels(const data::HostBatch& b) {
  MemoryScope scope(MemCategory::data);
  return Tensor::from_vector(b.y, {b.n});
}

EvalResult evaluate(nn::Module& model, const amp::Precision& precision, const data::Dataset& test,
                    data::Normalize norm) {
  data::LoaderOptions lo;
  lo.batch_size = 1000;
  lo.shuffle = false;
  lo.norm = norm;
  data::BatchLoader loader(test, lo);
  loader.begin_epoch(0);
  model.eval();
  autograd::NoGradGuard no_grad;
  int64_t correct = 0, seen = 0;
  double loss_sum = 0;
  data::HostBatch b;
  while (loader.next(b)) {
    Tensor x = batch_images(b, test.rows, test.cols), y = batch_labels(b);
    Tensor logits, loss;
    {
      amp::Autocast ac(precision.autocast_dtype, precision.autocast);
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

}  // namespace mixprec::cli
