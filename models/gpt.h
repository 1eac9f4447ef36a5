#pragma once
// models::GPT: a decoder-only transformer language model (GPT-2's layout, pre-LayerNorm), for
// next-token prediction on token ids.
//
//   x = dropout(wte(ids) + wpe(positions))                      ids (B,T) -> x (B,T,C)
//   for each block:  x = x + dropout(attn.c_proj(causal_attention(attn.c_attn(ln_1(x)))))
//                    x = x + dropout(mlp.c_proj(gelu(mlp.c_fc(ln_2(x)))))
//   logits = lm_head(ln_f(x))                                   (B,T,vocab_size)
//
// causal_attention splits c_attn's (B,T,3C) output into query, key and value, each into n_heads
// heads of C / n_heads, and runs scaled_dot_product_attention(q, k, v, is_causal = true): every
// position attends to itself and the positions before it. There is no dropout on the attention
// probabilities (hsgd's fused attention has none), only on the embeddings and the two residual
// branches, each from its own nn::Dropout. lm_head has no bias and is not tied to wte.
//
// Parameters carry the names of the equivalent PyTorch module (wte.weight, wpe.weight,
// blocks.0.ln_1.weight, blocks.0.attn.c_attn.weight, ..., ln_f.bias, lm_head.weight), so the
// state dict exports to PyTorch. Initialisation (drawn from Generator(seed)): Linear and
// Embedding weights N(0, 0.02), each residual branch's c_proj N(0, 0.02 / sqrt(2 n_layers)),
// biases 0, LayerNorm weight 1 and bias 0. The dropout layers' streams derive from the same seed
// (nn::Module::seed_generators), one per layer.
//
// Usage:
//   auto gpt = std::make_shared<models::GPT>(models::GPTOptions{.vocab_size = 256, .seed = 1});
//   Tensor logits = gpt->forward(batch.input_ids);                         // (B,T,256)
//   Tensor loss = cross_entropy(logits.reshape({-1, 256}), batch.target_ids.reshape({-1}));
//   std::vector<int64_t> more = gpt->generate({84, 104, 101}, 100, gen);   // 100 more tokens
//
// Errors (InvalidArgument naming the value): sizes < 1, d_model not divisible by n_heads,
// dropout outside [0, 1); ids that are not (B,T) with 1 <= T <= context.

#include <cstdint>
#include <memory>
#include <vector>

#include "framework/nn/nn.h"

namespace hsgd::models {

struct GPTOptions {
  int64_t vocab_size = 256;  // byte tokens
  int64_t context = 128;     // the longest sequence (positions of wpe)
  int64_t d_model = 128;
  int64_t n_layers = 4;
  int64_t n_heads = 4;
  double dropout = 0.1;
  uint64_t seed = 0;
};

class GPT : public nn::Module {
 public:
  explicit GPT(const GPTOptions& options);

  // ids (B,T) -> logits (B,T,vocab_size).
  Tensor forward(const IndexTensor& ids) override;
  using nn::Module::forward;

  // Samples `count` tokens after `prompt` (at least one token), one at a time from the
  // softmax of the last position's logits divided by temperature (> 0), each step seeing the
  // last `context` tokens; in eval mode and without autograd, restoring the training mode after.
  // Returns the new tokens only.
  std::vector<int64_t> generate(std::vector<int64_t> prompt, int64_t count, Generator& gen,
                                double temperature = 1.0);

  const GPTOptions& options() const { return options_; }

 private:
  class Block;

  GPTOptions options_;
  std::shared_ptr<nn::Embedding> wte_;  // (vocab_size, C)
  std::shared_ptr<nn::Embedding> wpe_;  // (context, C)
  std::shared_ptr<nn::Dropout> drop_;
  std::vector<std::shared_ptr<Block>> blocks_;
  std::shared_ptr<nn::LayerNorm> ln_f_;
  std::shared_ptr<nn::Linear> lm_head_;  // (vocab_size, C), no bias
};

}  // namespace hsgd::models
