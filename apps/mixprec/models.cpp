// Model builders with the same layer order (and so state_dict names) as bench/peers/models.py.
#include "models.h"

#include "mixprec/error.h"

namespace mixprec::cli {

const std::vector<std::string>& model_names() {
  static const std::vector<std::string> names = {"mlp"};
  return names;
}

std::shared_ptr<nn::Sequential> build_model(const ModelSpec& s) {
  auto m = std::make_shared<nn::Sequential>();
  if (s.name == "mlp") {
    // Flatten, then Linear/ReLU pairs, then the classifier: 784-1024-1024-10 by default.
    m->push_back(std::make_shared<nn::Flatten>());
    int64_t in = s.image_rows * s.image_cols;
    for (int64_t h : s.hidden) {
      m->push_back(std::make_shared<nn::Linear>(in, h));
      m->push_back(std::make_shared<nn::ReLU>());
      in = h;
    }
    m->push_back(std::make_shared<nn::Linear>(in, s.num_classes));
    return m;
  }
  throw Error(detail::concat("unknown model '", s.name, "'"));
}

}  // namespace mixprec::cli
