// Example: a module of your own. GatedMlp holds its own parameters (registered under PyTorch-style
// names, so state_dict() and checkpoints name them as torch.nn.Module would) and a child layer;
// its forward is ops calls, which autocast sees one by one (the matmuls in bf16, the sigmoid as
// its input, the loss in f32). Trained a few hundred steps under amp-bf16 on a synthetic task:
// classify 16-dim points by a fixed random teacher. Exits 1 if the loss does not go down.
//   example_custom_module
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "mixprec/mixprec.h"

using namespace mixprec;

namespace {

// proj(value(x) * sigmoid(gate(x))): a gated linear unit (GLU, as in the T5/LLaMA feed-forward).
class GatedMlp : public nn::Module {
 public:
  GatedMlp(int64_t in, int64_t hidden, int64_t out) {
    MemoryScope scope(MemCategory::parameters);  // counted as parameters by the allocator
    const double bound = 1.0 / std::sqrt(double(in));
    w_value = register_parameter("w_value", Tensor::uniform({hidden, in}, default_generator(), -bound, bound));
    w_gate = register_parameter("w_gate", Tensor::uniform({hidden, in}, default_generator(), -bound, bound));
    b_gate = register_parameter("b_gate", Tensor::zeros({hidden}));
    proj = std::make_shared<nn::Linear>(hidden, out);
    register_module("proj", proj);  // its parameters: "proj.weight", "proj.bias"
  }

  Tensor forward(const Tensor& x) override {                           // x [n, in]
    const Tensor value = ops::linear(x, w_value);                      // [n, hidden]
    const Tensor gate = ops::sigmoid(ops::linear(x, w_gate, b_gate));  // [n, hidden]
    return (*proj)(ops::mul(value, gate));                             // [n, out]
  }
  std::string name() const override { return "GatedMlp"; }

  Tensor w_value, w_gate, b_gate;
  std::shared_ptr<nn::Linear> proj;

 protected:
  // Module::set_parameter (weight tying) replaces a registered tensor: keep the handles in step.
  void bind_parameter(const std::string& name, const Tensor& t) override {
    (name == "w_value" ? w_value : name == "w_gate" ? w_gate : b_gate) = t;
  }
};

// n points of N(0, 1)^in, labelled by argmax(x @ teacher): a task a small net learns in seconds.
struct Batch {
  Tensor x, y;
};
Batch make_batch(Generator& gen, const Tensor& teacher, int64_t n) {
  Batch b{Tensor::randn({n, teacher.size(0)}, gen), Tensor()};
  const std::vector<float> logits = ops::matmul(b.x, teacher).to_vector();
  const int64_t classes = teacher.size(1);
  std::vector<int64_t> labels(size_t(n), 0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t c = 1; c < classes; ++c)
      if (logits[size_t(i * classes + c)] > logits[size_t(i * classes + labels[size_t(i)])]) labels[size_t(i)] = c;
  b.y = Tensor::from_vector(labels, {n});
  return b;
}

}  // namespace

int main() {
  try {
    default_generator().manual_seed(0);
    Generator data(1);
    const Tensor teacher = Tensor::randn({16, 4}, data);
    GatedMlp model(16, 64, 4);
    std::printf("%s: %lld parameters:", model.name().c_str(), (long long)model.num_parameters());
    for (const auto& [name, t] : model.named_parameters())
      std::printf(" %s%s", name.c_str(), shape_str(t.shape()).c_str());
    std::printf("\n");

    optim::AdamW opt(model.parameters(), {.lr = 1e-2});
    const amp::Precision p = amp::precision_preset("amp-bf16");
    amp::GradScaler scaler(amp::grad_scaler_options(p));  // disabled for bf16: every call passes through
    double first = 0, last = 0;
    for (int step = 1; step <= 200; ++step) {
      const Batch b = make_batch(data, teacher, 128);
      opt.zero_grad();
      Tensor loss;
      {
        amp::Autocast ac(p.autocast_dtype);
        loss = ops::cross_entropy(model(b.x), b.y);
      }
      scaler.scale(loss).backward();
      scaler.step(opt);
      scaler.update();
      if (step == 1) first = loss.item();
      if (step % 50 == 0) std::printf("step %3d  loss %.4f\n", step, loss.item());
      last = loss.item();
    }
    // The gradients reached the module's own parameters in f32 (autocast casts the weights to bf16
    // for the matmuls; the cast's backward brings the gradient back to the parameter's dtype).
    std::printf("w_value.grad %s, proj.weight.grad %s\n", std::string(dtype_name(model.w_value.grad().dtype())).c_str(),
                std::string(dtype_name(model.proj->weight.grad().dtype())).c_str());
    const bool down = last < 0.5 * first;
    std::printf("loss %.4f -> %.4f: %s\n", first, last, down ? "down" : "NOT DOWN");
    return down ? 0 : 1;
  } catch (const Error& e) {
    std::fprintf(stderr, "example_custom_module: error: %s\n", e.what());
    return 1;
  }
}
