// The models the CLI trains, built from flags: mlp, cnn (--channels) and cnn-bn.
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
  int64_t image_rows = 28, image_cols = 28, num_classes = 10;
};

// Each model's default recipe, used where --batch-size / --lr are not given. The small nets
// learn better from more, smaller steps: docs/design.md (CLI), docs/conv.md (Accuracy).
struct Recipe {
  int64_t batch_size = 512;
  double adamw_lr = 1e-3;
  double sgd_lr = 0.05;
};

const std::vector<std::string>& model_names();
Recipe default_recipe(const std::string& model);
std::shared_ptr<nn::Sequential> build_model(const ModelSpec& spec);

}  // namespace mixprec::cli
