#include "models/gpt.h"

#include <algorithm>
#include <cmath>

#include "comm/error.h"
#include "framework/tensor/grad_mode.h"
#include "framework/tensor/nn_ops.h"
#include "framework/tensor/ops.h"

namespace hsgd::models {

namespace {

void init_linear(nn::Linear& linear, Generator& gen, double stddev) {
  Tensor w = linear.weight();
  nn::init::normal_(w, gen, 0.0, stddev);
  if (Tensor b = linear.bias(); b.defined()) nn::init::zeros_(b);
}

// A Linear (in -> out) registered as `name` under parent, initialised N(0, stddev).
std::shared_ptr<nn::Linear> linear(nn::Module& parent, const std::string& name, int64_t in,
                                   int64_t out, bool bias, Generator& gen, double stddev) {
  auto l = parent.register_module(name, std::make_shared<nn::Linear>(in, out, bias, gen));
  init_linear(*l, gen, stddev);
  return l;
}

constexpr double kInitStd = 0.02;

}  // namespace

// ---- the transformer block ----

class GPT::Block : public nn::Module {
 public:
  Block(const GPTOptions& o, Generator& gen) : Module("GPTBlock"), n_heads_(o.n_heads) {
    const int64_t c = o.d_model;
    const double proj_std = kInitStd / std::sqrt(2.0 * static_cast<double>(o.n_layers));
    ln_1_ = register_module("ln_1", std::make_shared<nn::LayerNorm>(std::vector<int64_t>{c}));
    auto attn = register_module("attn", std::make_shared<nn::Module>("CausalSelfAttention"));
    c_attn_ = linear(*attn, "c_attn", c, 3 * c, true, gen, kInitStd);
    attn_proj_ = linear(*attn, "c_proj", c, c, true, gen, proj_std);
    ln_2_ = register_module("ln_2", std::make_shared<nn::LayerNorm>(std::vector<int64_t>{c}));
    auto mlp = register_module("mlp", std::make_shared<nn::Module>("MLP"));
    c_fc_ = linear(*mlp, "c_fc", c, 4 * c, true, gen, kInitStd);
    mlp_proj_ = linear(*mlp, "c_proj", 4 * c, c, true, gen, proj_std);
    attn_drop_ = register_module("attn_dropout", std::make_shared<nn::Dropout>(o.dropout));
    mlp_drop_ = register_module("mlp_dropout", std::make_shared<nn::Dropout>(o.dropout));
  }

  // x (B,T,C) -> (B,T,C)
  Tensor forward(const Tensor& x) override {
    const Tensor h = x + attn_drop_->forward(attn_proj_->forward(attention(ln_1_->forward(x))));
    return h + mlp_drop_->forward(mlp_proj_->forward(gelu(c_fc_->forward(ln_2_->forward(h)))));
  }

 private:
  // h (B,T,C) -> causal self-attention over n_heads heads, (B,T,C)
  Tensor attention(const Tensor& h) {
    const int64_t b = h.size(0), t = h.size(1), c = h.size(2), d = c / n_heads_;
    // q, k and v (B,T,C) are c_attn's three blocks of rows, one product each: slicing a single
    // (B,T,3C) output would give each slice's gradient as a zero-filled (B,T,3C) tensor, three of
    // them summed, where the weight's slices cost (3C,C) each.
    const Tensor w = c_attn_->weight(), bias = c_attn_->bias();
    auto heads = [&](int64_t i) {
      const Tensor x = linear(h, w.narrow(0, i * c, c), bias.narrow(0, i * c, c));  // (B,T,C)
      return x.reshape({b, t, n_heads_, d}).transpose(1, 2);                        // (B,H,T,D)
    };
    // The heads are read in place and y is a (B,H,T,D) view of a (B,T,H,D) buffer, so the
    // reshape below is a view too.
    const Tensor y = scaled_dot_product_attention(heads(0), heads(1), heads(2), /*is_causal=*/true);
    return y.transpose(1, 2).reshape({b, t, c});
  }

  int64_t n_heads_;
  std::shared_ptr<nn::LayerNorm> ln_1_, ln_2_;
  std::shared_ptr<nn::Linear> c_attn_, attn_proj_, c_fc_, mlp_proj_;
  std::shared_ptr<nn::Dropout> attn_drop_, mlp_drop_;
};

// ---- the model ----

GPT::GPT(const GPTOptions& options) : Module("GPT"), options_(options) {
  const GPTOptions& o = options_;
  HSGD_CHECK(
      o.vocab_size >= 1 && o.context >= 1 && o.d_model >= 1 && o.n_layers >= 1 && o.n_heads >= 1,
      "GPT: vocab_size ", o.vocab_size, ", context ", o.context, ", d_model ", o.d_model,
      ", n_layers ", o.n_layers, " and n_heads ", o.n_heads, " must be at least 1");
  HSGD_CHECK(o.d_model % o.n_heads == 0, "GPT: d_model ", o.d_model,
             " must be divisible by n_heads ", o.n_heads);
  HSGD_CHECK(o.dropout >= 0 && o.dropout < 1, "GPT: dropout ", o.dropout, " must be in [0, 1)");
  Generator gen(o.seed);
  wte_ = register_module("wte", std::make_shared<nn::Embedding>(o.vocab_size, o.d_model, gen));
  wpe_ = register_module("wpe", std::make_shared<nn::Embedding>(o.context, o.d_model, gen));
  for (Tensor w : {wte_->weight(), wpe_->weight()}) nn::init::normal_(w, gen, 0.0, kInitStd);
  drop_ = register_module("drop", std::make_shared<nn::Dropout>(o.dropout));
  auto blocks = register_module("blocks", std::make_shared<nn::ModuleList>());
  for (int64_t i = 0; i < o.n_layers; ++i) {
    blocks_.push_back(blocks->push_back(std::make_shared<Block>(o, gen)));
  }
  ln_f_ = register_module("ln_f", std::make_shared<nn::LayerNorm>(std::vector<int64_t>{o.d_model}));
  lm_head_ = linear(*this, "lm_head", o.d_model, o.vocab_size, false, gen, kInitStd);
  seed_generators(o.seed);  // each dropout layer's stream derives from the model's seed
}

Tensor GPT::forward(const IndexTensor& ids) {
  HSGD_CHECK(ids.defined() && ids.dim() == 2 && ids.size(1) >= 1 && ids.size(1) <= options_.context,
             "GPT: ids must be (B,T) with 1 <= T <= context ", options_.context, ", got ",
             ids.defined() ? shape_str(ids.shape()) : std::string("undefined"));
  const int64_t t = ids.size(1);
  Tensor x = drop_->forward(wte_->forward(ids) + wpe_->weight().narrow(0, 0, t));  // (B,T,C)
  for (const auto& block : blocks_) x = block->forward(x);
  return lm_head_->forward(ln_f_->forward(x));  // (B,T,V)
}

std::vector<int64_t> GPT::generate(std::vector<int64_t> prompt, int64_t count, Generator& gen,
                                   double temperature) {
  HSGD_CHECK(!prompt.empty(), "GPT::generate: the prompt is empty; expected at least one token");
  HSGD_CHECK(count >= 0 && temperature > 0, "GPT::generate: count ", count,
             " must be >= 0 and temperature ", temperature, " > 0");
  const bool was_training = is_training();
  eval();
  NoGradGuard no_grad;
  std::vector<int64_t> out;
  for (int64_t n = 0; n < count; ++n) {
    const auto len = static_cast<int64_t>(prompt.size());
    const int64_t t = std::min(len, options_.context);
    IndexTensor ids(std::vector<int64_t>(prompt.end() - t, prompt.end()), {1, t});
    const Tensor last = forward(ids).narrow(1, t - 1, 1).reshape({-1});  // (V)
    const std::vector<float> p =
        softmax(last * static_cast<float>(1.0 / temperature), 0).to_vector();
    float u = gen.uniform(0.0f, 1.0f);
    int64_t next = static_cast<int64_t>(p.size()) - 1;
    for (size_t v = 0; v < p.size(); ++v) {
      if (u < p[v]) {
        next = static_cast<int64_t>(v);
        break;
      }
      u -= p[v];
    }
    out.push_back(next);
    prompt.push_back(next);
  }
  train(was_training);
  return out;
}

}  // namespace hsgd::models
