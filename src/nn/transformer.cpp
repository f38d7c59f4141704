// The GPT modules (nanoGPT's model.py in mixprec's ops): attention, MLP, Block, GPT, GPT-2 init.
#include "mixprec/transformer.h"

#include <cmath>
#include <utility>

#include "mixprec/autocast.h"
#include "mixprec/autograd.h"
#include "mixprec/error.h"
#include "mixprec/random.h"

namespace mixprec::nn {
namespace {

// nanoGPT's `transformer` ModuleDict: a holder of named children, never called itself.
class ModuleDict : public Module {
 public:
  void add(const std::string& name, std::shared_ptr<Module> m) { register_module(name, std::move(m)); }
  Tensor forward(const Tensor&) override { throw Error("ModuleDict: a container, not a layer"); }
  std::string name() const override { return "ModuleDict"; }
};

void check_config(const GPTConfig& c) {
  MIXPREC_CHECK(c.vocab_size > 0 && c.block_size > 0 && c.n_layer > 0 && c.n_head > 0 && c.n_embd > 0,
                "GPTConfig: vocab_size ", c.vocab_size, ", block_size ", c.block_size, ", n_layer ", c.n_layer,
                ", n_head ", c.n_head, ", n_embd ", c.n_embd, " must all be positive");
  MIXPREC_CHECK(c.n_embd % c.n_head == 0, "GPTConfig: n_embd ", c.n_embd, " is not a multiple of n_head ", c.n_head);
  MIXPREC_CHECK(c.dropout >= 0 && c.dropout < 1, "GPTConfig: dropout ", c.dropout, " must be in [0, 1)");
}

// Overwrites t (in place: every handle stays valid) with N(0, std^2) drawn in f32, or a constant.
void init_normal(Tensor t, double std) {
  const autograd::NoGradGuard no_grad;
  t.copy_(Tensor::randn(t.shape(), default_generator(), DType::f32, std));
}
void init_constant(Tensor t, double value) {
  const autograd::NoGradGuard no_grad;
  t.fill_(value);
}

}  // namespace

CausalSelfAttention::CausalSelfAttention(const GPTConfig& c)
    : n_head_(c.n_head), n_embd_(c.n_embd), dropout_(c.dropout) {
  c_attn = std::make_shared<Linear>(c.n_embd, 3 * c.n_embd, LinearOptions{.bias = c.bias});
  c_proj = std::make_shared<Linear>(c.n_embd, c.n_embd, LinearOptions{.bias = c.bias});
  resid_dropout_ = std::make_shared<Dropout>(c.dropout);
  register_module("c_attn", c_attn);
  register_module("c_proj", c_proj);
  register_module("resid_dropout", resid_dropout_);
}

Tensor CausalSelfAttention::forward(const Tensor& x) {
  MIXPREC_CHECK(x.dim() == 3 && x.size(2) == n_embd_, "CausalSelfAttention: input must be [B, T, ", n_embd_, "], got ",
                shape_str(x.shape()));
  const int64_t B = x.size(0), T = x.size(1), C = n_embd_, H = n_head_;
  // q, k, v: the thirds of c_attn's output, each seen as [B, H, T, E] without a copy (views), and
  // their gradients written into one [B, T, 3C] tensor.
  const Tensor qkv = (*c_attn)(x);
  ops::AttentionOptions o;
  o.causal = true;
  o.dropout = is_training() ? dropout_ : 0.0;
  const Tensor y = ops::packed_qkv_attention(qkv, H, o);  // [B, H, T, E]
  return (*resid_dropout_)((*c_proj)(y.transpose(1, 2).reshape({B, T, C})));
}

MLP::MLP(const GPTConfig& c) {
  c_fc = std::make_shared<Linear>(c.n_embd, 4 * c.n_embd, LinearOptions{.bias = c.bias});
  c_proj = std::make_shared<Linear>(4 * c.n_embd, c.n_embd, LinearOptions{.bias = c.bias});
  dropout_ = std::make_shared<Dropout>(c.dropout);
  register_module("c_fc", c_fc);
  register_module("gelu", std::make_shared<GELU>(/*tanh_approx=*/true));
  register_module("c_proj", c_proj);
  register_module("dropout", dropout_);
}

Tensor MLP::forward(const Tensor& x) { return (*dropout_)((*c_proj)(ops::gelu((*c_fc)(x), /*tanh_approx=*/true))); }

Block::Block(const GPTConfig& c) {
  // nanoGPT's LayerNorm(ndim, bias): bias=False drops the bias parameter.
  const LayerNormOptions ln{.eps = 1e-5, .elementwise_affine = true};
  ln_1 = std::make_shared<LayerNorm>(Shape{c.n_embd}, ln);
  attn = std::make_shared<CausalSelfAttention>(c);
  ln_2 = std::make_shared<LayerNorm>(Shape{c.n_embd}, ln);
  mlp = std::make_shared<MLP>(c);
  register_module("ln_1", ln_1);
  register_module("attn", attn);
  register_module("ln_2", ln_2);
  register_module("mlp", mlp);
}

// A norm's output as the Linear after it reads it. Under autocast that Linear casts its f32 input to
// the autocast dtype: the norm writes that dtype itself instead (ops::layer_norm's out_dtype: the
// same bits, no f32 copy written and read again, and the gradient comes back in 16 bits without a
// cast pass; docs/transformer.md, Memory, and docs/design.md, "Layer norm under autocast").
static Tensor norm_for_linear(LayerNorm& norm, const Tensor& x) {
  const DeviceType t = x.device().type;
  if (!amp::is_autocast_enabled(t) || x.dtype() != DType::f32 || !is_half(amp::autocast_dtype(t))) return norm(x);
  return norm.forward(x, amp::autocast_dtype(t));
}

Tensor Block::forward(const Tensor& x) { return forward_owned(x); }

Tensor Block::forward_owned(Tensor x) {
  const Tensor h = ops::add(x, (*attn)(norm_for_linear(*ln_1, x)));
  x = Tensor();
  return ops::add(h, (*mlp)(norm_for_linear(*ln_2, h)));
}

GPT::GPT(const GPTConfig& c) : config_(c) {
  check_config(c);
  MIXPREC_CHECK(c.bias, "GPT: bias=false is not supported yet (LayerNorm has no bias-free form here)");
  MemoryScope scope(MemCategory::parameters);
  auto wte = std::make_shared<Embedding>(c.vocab_size, c.n_embd);
  wte_ = wte;
  wpe_ = std::make_shared<Embedding>(c.block_size, c.n_embd);
  drop_ = std::make_shared<Dropout>(c.dropout);
  h_ = std::make_shared<Sequential>();
  for (int64_t i = 0; i < c.n_layer; ++i) h_->push_back(std::make_shared<Block>(c));
  ln_f_ = std::make_shared<LayerNorm>(Shape{c.n_embd});
  auto transformer = std::make_shared<ModuleDict>();
  transformer->add("wte", wte_);
  transformer->add("wpe", wpe_);
  transformer->add("drop", drop_);
  transformer->add("h", h_);
  transformer->add("ln_f", ln_f_);
  register_module("transformer", transformer);
  // nanoGPT's head, Linear(n_embd, vocab_size, bias=False), whose weight is the token embedding's
  // (weight tying): state_dict() holds lm_head.weight beside transformer.wte.weight, parameters()
  // lists the tensor once.
  lm_head_ = std::make_shared<Linear>(c.n_embd, c.vocab_size, LinearOptions{.bias = false});
  register_module("lm_head", lm_head_);
  set_parameter("lm_head.weight", wte->weight);

  // GPT-2's initialisation (nanoGPT's _init_weights, then the scaled residual projections), in
  // parameter order: the draws depend on nothing but the seed and the config.
  const double proj_std = 0.02 / std::sqrt(2.0 * double(c.n_layer));
  for (const auto& [name, t] : named_parameters()) {
    const bool is_norm = name.find(".ln_") != std::string::npos;
    const bool is_bias = name.ends_with(".bias"), is_proj = name.ends_with(".c_proj.weight");
    if (is_norm) {
      init_constant(t, is_bias ? 0.0 : 1.0);
    } else if (is_bias) {
      init_constant(t, 0.0);
    } else {
      init_normal(t, is_proj ? proj_std : 0.02);
    }
  }
}

Tensor GPT::forward(const Tensor& idx) {
  MIXPREC_CHECK(idx.dim() == 2 && idx.dtype() == DType::i64, "GPT: input must be i64 token indices [B, T], got ",
                dtype_name(idx.dtype()), " ", shape_str(idx.shape()));
  const int64_t T = idx.size(1);
  MIXPREC_CHECK(T >= 1 && T <= config_.block_size, "GPT: a sequence of ", T, " tokens does not fit block_size ",
                config_.block_size);
  const Tensor pos = Tensor::arange(T, DType::i64, idx.device());
  // [B, T, C] + [T, C]: the position embedding broadcasts over the batch.
  Tensor x = (*drop_)(ops::add((*wte_)(idx), (*wpe_)(pos)));
  // The blocks in order, each handed the residual stream to own (Block::forward_owned): under
  // autocast an f32 block input nothing saved dies inside the block, not after it (the amp-bf16
  // forward's peak is the last block's second residual add: docs/transformer.md, Memory).
  for (const auto& [name, m] : h_->children()) {
    auto* block = dynamic_cast<Block*>(m.get());
    x = block ? block->forward_owned(std::move(x)) : (*m)(x);
  }
  x = norm_for_linear(*ln_f_, x);
  return (*lm_head_)(x);
}

}  // namespace mixprec::nn
