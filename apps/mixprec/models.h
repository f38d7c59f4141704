// The models the CLI trains, built from flags: mlp, cnn (--channels) and cnn-bn on images, and gpt
// (--layers, --heads, --d-model, --block-size, --dropout) on text.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "mixprec/nn.h"

namespace mixprec::cli {

struct ModelSpec {
  std::string name = "mlp";
  std::vector<int64_t> hidden = {1024, 1024};  // mlp hidden widths
  std::vector<int64_t> channels = {8, 16};     // cnn conv widths
  bool channels_last = false;                  // cnn: NHWC activations (a layout, not part of the model's identity)
  int64_t image_rows = 28, image_cols = 28, num_classes = 10;
  // gpt
  int64_t layers = 4, heads = 4, d_model = 128, block_size = 128;
  double dropout = 0.0;
  int64_t vocab_size = 0;  // the text's (train, eval), the checkpoint's (sample), --vocab-size (bench)
  bool is_gpt() const { return name == "gpt"; }
};

// Each model's default recipe, used where --batch-size / --lr are not given. The small nets
// learn better from more, smaller steps: docs/design.md (CLI), docs/conv.md (Accuracy).
struct Recipe {
  int64_t batch_size = 512;
  double adamw_lr = 1e-3;
  double sgd_lr = 0.05;
  double weight_decay = 0.0;  // gpt: on the parameters of dim >= 2 only (nanoGPT's two groups)
  double beta2 = 0.999;       // AdamW's (PyTorch's default)
  double clip_grad_norm = 0;  // 0: off
  int64_t lr_warmup = 0;      // steps
  double min_lr = 0;          // where the cosine schedule ends
};

const std::vector<std::string>& model_names();
Recipe default_recipe(const std::string& model);
std::shared_ptr<nn::Module> build_model(const ModelSpec& spec);

}  // namespace mixprec::cli
