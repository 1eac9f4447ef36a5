#pragma once
// nn::Dropout (inverted dropout, as torch.nn.Dropout).
//
// Usage:
//   auto net = std::make_shared<nn::Sequential>();
//   net->push_back(std::make_shared<nn::Linear>(784, 256));
//   net->push_back(std::make_shared<nn::Dropout>(0.1));   // stream "1.generator"
//   net->push_back(std::make_shared<nn::Linear>(256, 10));
//   net->seed_generators(42);                             // optional: the tree's seed
//   Tensor y = net->forward(x);        // training: masked and scaled; after eval(): no dropout
//
//   nn::Dropout fixed(0.5, /*seed=*/7);                   // a stream of its own, seeded with 7

#include <cstdint>
#include <optional>

#include "framework/nn/module.h"

namespace hsgd::nn {

// In training mode zeroes each element with probability p and scales the rest by 1/(1-p); in
// eval mode the identity. The masks come from the module's own Generator, registered as its
// "generator" (Module::register_generator), so no global state is involved:
// - without a seed, the stream derives from the module tree's seed and the generator's dotted
//   name (module.h, "Random streams"): every dropout layer of a model draws its own masks, the
//   same model built with the same seed draws the same ones, and ranks agree unless each is
//   seeded on its own (seed_generators(seed + rank));
// - with a seed, the stream is Generator(seed) and the tree's seed does not change it.
// A Checkpointer saves the stream's position with the model, so a resumed run draws the masks an
// uninterrupted one would; it is not in state_dict(), which holds torch.nn.Dropout's keys (none).
// p must be in [0, 1) (InvalidArgument otherwise).
class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5, std::optional<uint64_t> seed = std::nullopt);
  Tensor forward(const Tensor& x) override;
  double p() const { return p_; }
  Generator& generator() { return gen_; }

 private:
  double p_;
  Generator gen_;
};

}  // namespace hsgd::nn
