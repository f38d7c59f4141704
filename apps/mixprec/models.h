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

const std::vector<std::string>& model_names();
std::shared_ptr<nn::Sequential> build_model(const ModelSpec& spec);

}  // namespace mixprec::cli
