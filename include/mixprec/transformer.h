// A GPT (decoder-only transformer) in nanoGPT's shape and names: CausalSelfAttention, MLP, the
// pre-norm Block, and GPT with its token embedding tied to the output head; GPT-2's initialisation.
// state_dict() keys are nanoGPT's (transformer.wte.weight, transformer.h.0.attn.c_attn.weight,
// ..., lm_head.weight), so checkpoints load into bench/peers/gpt.py's model.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "mixprec/nn.h"

namespace mixprec::nn {

struct GPTConfig {
  int64_t vocab_size = 0;
  int64_t block_size = 128;  // the longest context
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t n_embd = 128;
  double dropout = 0.0;  // on the embeddings, the attention probabilities and each residual branch
  bool bias = true;      // in the Linears and LayerNorms
};

// Multi-head causal self-attention: one Linear makes q, k and v (c_attn, C -> 3C), the fused
// attention op runs the heads (causal, dropout on the probabilities while training), c_proj mixes
// them back (C -> C), then residual dropout. [B, T, C] -> [B, T, C].
class CausalSelfAttention : public Module {
 public:
  explicit CausalSelfAttention(const GPTConfig& c);
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "CausalSelfAttention"; }
  std::shared_ptr<Linear> c_attn, c_proj;

 private:
  int64_t n_head_, n_embd_;
  double dropout_;
  std::shared_ptr<Dropout> resid_dropout_;
};

// c_fc (C -> 4C), GELU (tanh form), c_proj (4C -> C), dropout.
class MLP : public Module {
 public:
  explicit MLP(const GPTConfig& c);
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "MLP"; }
  std::shared_ptr<Linear> c_fc, c_proj;

 private:
  std::shared_ptr<Dropout> dropout_;
};

// Pre-norm residual block: x + attn(ln_1(x)), then + mlp(ln_2(x)).
class Block : public Module {
 public:
  explicit Block(const GPTConfig& c);
  Tensor forward(const Tensor& x) override;
  // forward, owning its input: x is released once the attention branch has been added to it, so
  // under autocast (where ln_1 keeps x̂, not x) the f32 input does not live through the MLP branch.
  Tensor forward_owned(Tensor x);
  std::string name() const override { return "Block"; }
  std::shared_ptr<LayerNorm> ln_1, ln_2;
  std::shared_ptr<CausalSelfAttention> attn;
  std::shared_ptr<MLP> mlp;
};

// forward(idx i64 [B, T], T <= block_size) -> logits [B, T, vocab_size]. Parameters: every unique
// tensor (wpe included; nanoGPT's get_num_params leaves wpe out), lm_head.weight being
// transformer.wte.weight. Initialised as GPT-2: Linear and Embedding weights N(0, 0.02), biases 0,
// every c_proj.weight N(0, 0.02 / sqrt(2 n_layer)), LayerNorm 1 and 0, drawn from
// default_generator().
class GPT : public Module {
 public:
  explicit GPT(const GPTConfig& c);
  Tensor forward(const Tensor& idx) override;
  std::string name() const override { return "GPT"; }
  const GPTConfig& config() const { return config_; }

 private:
  GPTConfig config_;
  std::shared_ptr<Module> wte_, wpe_;
  std::shared_ptr<Dropout> drop_;
  std::shared_ptr<Sequential> h_;
  std::shared_ptr<LayerNorm> ln_f_;
  std::shared_ptr<Linear> lm_head_;
};

}  // namespace mixprec::nn
