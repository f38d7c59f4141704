// Example: the largest batch a model of your own trains with in a memory budget, in fp32 and with
// bf16 autocast, through the library's search (mixprec/memory_budget.h): doubling the batch, then
// bisecting, each attempt a whole training step under the allocator's budget.
//   build/example_memory_budget [BUDGET_MIB]     (default 32)
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "mixprec/mixprec.h"

using namespace mixprec;

namespace {

// A user-defined model: an input projection, one residual GELU block, a classifier.
class ResidualMlp : public nn::Module {
 public:
  ResidualMlp(int64_t in, int64_t width, int64_t classes)
      : proj_(std::make_shared<nn::Linear>(in, width)),
        block_(std::make_shared<nn::Linear>(width, width)),
        head_(std::make_shared<nn::Linear>(width, classes)) {
    register_module("proj", proj_);
    register_module("block", block_);
    register_module("head", head_);
  }
  Tensor forward(const Tensor& x) override {
    const Tensor h = ops::relu((*proj_)(x));
    return (*head_)(ops::add(h, ops::gelu((*block_)(h))));
  }
  std::string name() const override { return "ResidualMlp"; }

 private:
  std::shared_ptr<nn::Linear> proj_, block_, head_;
};

constexpr int64_t kInputs = 256, kWidth = 512, kClasses = 10;

// The largest batch of one precision preset: the model, optimizer and scaler as a training script
// makes them, and one step of PyTorch's AMP loop per attempt.
BatchFit largest_batch(const amp::Precision& p, int64_t budget_bytes) {
  default_generator().manual_seed(0);
  auto model = std::make_shared<ResidualMlp>(kInputs, kWidth, kClasses);
  amp::apply_precision(*model, p);
  optim::AdamW opt(model->parameters(), optim::AdamWOptions{.lr = 1e-3, .half = amp::half_param_options(p)});
  amp::GradScaler scaler(amp::grad_scaler_options(p));
  Generator data(1);
  auto step = [&](int64_t batch) {
    Tensor x, y;
    {
      MemoryScope scope(MemCategory::data);  // the batch counts against the budget too
      x = Tensor::randn({batch, kInputs}, data);
      std::vector<int64_t> labels(static_cast<size_t>(batch));
      for (auto& l : labels) l = int64_t(data.uniform_below(kClasses));
      y = Tensor::from_vector(labels, {batch});
    }
    try {
      opt.zero_grad();
      Tensor loss;
      {
        amp::Autocast ac(p.autocast_dtype, p.autocast);
        loss = ops::cross_entropy((*model)(x), y);
      }
      scaler.scale(loss).backward();
      scaler.step(opt);
      scaler.update();
    } catch (const OutOfMemory&) {
      // Give the attempt up as a loop that retries smaller would: no gradients, no half iteration.
      opt.zero_grad();
      scaler.reset_iteration();
      throw;
    }
  };
  return find_largest_batch(step, budget_bytes, int64_t(1) << 20);
}

double mib(int64_t bytes) { return double(bytes) / double(1 << 20); }

}  // namespace

int main(int argc, char** argv) {
  const long budget_mib = argc > 1 ? std::strtol(argv[1], nullptr, 10) : 32;
  if (budget_mib <= 0) {
    std::fprintf(stderr, "example_memory_budget: the budget must be a whole number of MiB > 0, got '%s'\n", argv[1]);
    return 2;
  }
  try {
    int64_t fp32_batch = 0;
    for (const char* name : {"fp32", "amp-bf16"}) {
      const BatchFit fit = largest_batch(amp::precision_preset(name), int64_t(budget_mib) << 20);
      if (fp32_batch == 0) fp32_batch = fit.batch;
      const auto at_peak = [&](MemCategory c) { return mib(fit.stats.at_peak_bytes[size_t(c)]); };
      std::printf(
          "%-8s largest batch %6lld in %ld MiB (x%.2f), %lld steps tried; at its peak %.1f MiB: "
          "activations %.1f, temporaries %.1f, data %.1f, parameters %.1f, optimizer state %.1f\n",
          name, (long long)fit.batch, budget_mib, fp32_batch > 0 ? double(fit.batch) / double(fp32_batch) : 0.0,
          (long long)fit.attempts, mib(fit.stats.peak_total), at_peak(MemCategory::activations),
          at_peak(MemCategory::temporaries), at_peak(MemCategory::data), at_peak(MemCategory::parameters),
          at_peak(MemCategory::optimizer_state));
      if (fit.batch == 0) {
        std::fprintf(stderr, "example_memory_budget: not even a batch of 1 fits in %ld MiB\n", budget_mib);
        return 1;
      }
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "example_memory_budget: %s\n", e.what());
    return 1;
  }
  return 0;
}
