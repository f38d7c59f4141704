// Model builders with the same layer order (and so state_dict names) as bench/peers/models.py
// and bench/peers/gpt.py.
#include "models.h"

#include "mixprec/error.h"
#include "mixprec/transformer.h"

namespace mixprec::cli {

const std::vector<std::string>& model_names() {
  static const std::vector<std::string> names = {"mlp", "cnn", "cnn-bn", "gpt"};
  return names;
}

Recipe default_recipe(const std::string& model) {
  Recipe r;  // mlp: batch 512, AdamW lr 1e-3
  if (model == "cnn") {
    r.batch_size = 64;  // the tutorial's batch; lr 2e-3 under the default cosine schedule
    r.adamw_lr = 2e-3;
  } else if (model == "cnn-bn") {
    r.batch_size = 128;
  } else if (model == "gpt") {
    // nanoGPT's recipe for a small character model (its shakespeare_char config, scaled down).
    r.batch_size = 32;
    r.weight_decay = 0.1;
    r.beta2 = 0.95;
    r.clip_grad_norm = 1.0;
    r.lr_warmup = 100;
    r.min_lr = 1e-4;
  }
  return r;
}

namespace {

std::shared_ptr<nn::Sequential> mlp(const ModelSpec& s) {
  // Flatten, then Linear/ReLU pairs, then the classifier: 784-1024-1024-10 by default.
  auto m = std::make_shared<nn::Sequential>();
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

// The PyTorch tutorial CNN: two 3x3 conv/ReLU/2x2-max-pool stages and a linear classifier;
// --channels 420,1000 gives the wide version of the AMP demonstration.
std::shared_ptr<nn::Sequential> cnn(const ModelSpec& s) {
  MIXPREC_CHECK(s.channels.size() == 2, "--channels: cnn needs exactly 2 widths (c1,c2), got ", s.channels.size());
  const int64_t c1 = s.channels[0], c2 = s.channels[1];
  auto m = std::make_shared<nn::Sequential>();
  const nn::Conv2dOptions conv{.padding = 1, .channels_last = s.channels_last};
  m->push_back(std::make_shared<nn::Conv2d>(1, c1, 3, conv));                                               // 0
  m->push_back(std::make_shared<nn::ReLU>());                                                               // 1
  m->push_back(std::make_shared<nn::MaxPool2d>(2));                                                         // 2
  m->push_back(std::make_shared<nn::Conv2d>(c1, c2, 3, conv));                                              // 3
  m->push_back(std::make_shared<nn::ReLU>());                                                               // 4
  m->push_back(std::make_shared<nn::MaxPool2d>(2));                                                         // 5
  m->push_back(std::make_shared<nn::Flatten>());                                                            // 6
  m->push_back(std::make_shared<nn::Linear>(c2 * (s.image_rows / 4) * (s.image_cols / 4), s.num_classes));  // 7
  return m;
}

// A stronger small conv net: two (conv-BN-ReLU) x2 + max-pool stages (32, then 64 channels),
// dropout, a 128-unit hidden layer. Layer order fixed by bench/peers/models.py:cnn_bn.
std::shared_ptr<nn::Sequential> cnn_bn(const ModelSpec& s) {
  auto m = std::make_shared<nn::Sequential>();
  auto conv_bn_relu = [&](int64_t in, int64_t out) {
    m->push_back(std::make_shared<nn::Conv2d>(in, out, 3, nn::Conv2dOptions{.padding = 1}));
    m->push_back(std::make_shared<nn::BatchNorm2d>(out));
    m->push_back(std::make_shared<nn::ReLU>());
  };
  conv_bn_relu(1, 32);                                                                            // 0-2
  conv_bn_relu(32, 32);                                                                           // 3-5
  m->push_back(std::make_shared<nn::MaxPool2d>(2));                                               // 6
  conv_bn_relu(32, 64);                                                                           // 7-9
  conv_bn_relu(64, 64);                                                                           // 10-12
  m->push_back(std::make_shared<nn::MaxPool2d>(2));                                               // 13
  m->push_back(std::make_shared<nn::Flatten>());                                                  // 14
  m->push_back(std::make_shared<nn::Dropout>(0.25));                                              // 15
  m->push_back(std::make_shared<nn::Linear>(64 * (s.image_rows / 4) * (s.image_cols / 4), 128));  // 16
  m->push_back(std::make_shared<nn::ReLU>());                                                     // 17
  m->push_back(std::make_shared<nn::Dropout>(0.25));                                              // 18
  m->push_back(std::make_shared<nn::Linear>(128, s.num_classes));                                 // 19
  return m;
}

}  // namespace

std::shared_ptr<nn::Module> build_model(const ModelSpec& s) {
  if (s.is_gpt()) {
    MIXPREC_CHECK(s.vocab_size > 0, "gpt: the vocabulary size is unknown (no text, checkpoint or --vocab-size)");
    return std::make_shared<nn::GPT>(nn::GPTConfig{.vocab_size = s.vocab_size,
                                                   .block_size = s.block_size,
                                                   .n_layer = s.layers,
                                                   .n_head = s.heads,
                                                   .n_embd = s.d_model,
                                                   .dropout = s.dropout});
  }
  if (s.name == "mlp") return mlp(s);
  if (s.name == "cnn") return cnn(s);
  if (s.name == "cnn-bn") return cnn_bn(s);
  throw Error(detail::concat("unknown model '", s.name, "'"));
}

}  // namespace mixprec::cli
