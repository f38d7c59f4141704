// Example: save a training run (model, optimizer, loss scaler, dropout generator) to one
// safetensors file and continue it in a fresh process state, with the same numbers.
//   example_checkpoint [FILE]     (default mixprec_example.st, in the current directory)
#include <cstdio>
#include <memory>
#include <string>

#include "mixprec/mixprec.h"

using namespace mixprec;

namespace {

// The objects of one run: what a training script builds before its loop.
struct Run {
  std::shared_ptr<nn::Sequential> model;
  std::unique_ptr<optim::AdamW> opt;
  amp::GradScaler scaler;

  Run() {
    default_generator().manual_seed(0);
    model = std::make_shared<nn::Sequential>(nn::Linear(16, 32), nn::ReLU(), nn::Dropout(0.1), nn::Linear(32, 4));
    opt = std::make_unique<optim::AdamW>(model->parameters(), optim::AdamWOptions{.lr = 1e-2});
  }
  // One step of PyTorch's AMP loop on batch k of a fixed synthetic data set; returns the loss.
  double step(int k) {
    Generator data(1000 + uint64_t(k));
    const Tensor x = Tensor::randn({32, 16}, data);
    std::vector<int64_t> labels(32);
    for (int64_t i = 0; i < 32; ++i) labels[size_t(i)] = (i + k) % 4;
    const Tensor y = Tensor::from_vector(labels, {32});
    opt->zero_grad();
    Tensor loss;
    {
      amp::Autocast ac(DType::f16);
      loss = ops::cross_entropy((*model)(x), y);
    }
    scaler.scale(loss).backward();
    scaler.step(*opt);
    scaler.update();
    return loss.item();
  }
};

}  // namespace

int main(int argc, char** argv) {
  const std::string path = argc > 1 ? argv[1] : "mixprec_example.st";
  try {
    Run a;
    for (int k = 0; k < 5; ++k) a.step(k);
    // Everything the run needs to continue, plus the caller's own counters under "run.".
    Checkpoint(*a.model, a.opt.get(), &a.scaler).save(path, {{"note", "5 steps"}}, {{"run.step", state_i64(5)}});
    const double next = a.step(5);

    Run b;  // a fresh run (same code), restored from the file
    const io::SafetensorsFile f = Checkpoint(*b.model, b.opt.get(), &b.scaler).load(path);
    const int64_t step = state_to_i64(*find_state(f.tensors, "run.step"));
    const double resumed = b.step(int(step));
    std::printf("step %lld: loss %.9g uninterrupted, %.9g resumed from %s (%s)\n", (long long)step + 1, next, resumed,
                path.c_str(), next == resumed ? "identical" : "DIFFERENT");
    return next == resumed ? 0 : 1;
  } catch (const Error& e) {
    std::fprintf(stderr, "example_checkpoint: error: %s\n", e.what());
    return 1;
  }
}
