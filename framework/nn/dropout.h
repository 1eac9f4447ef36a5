#pragma once
// nn::Dropout (inverted dropout, as torch.nn.Dropout).
//
// Usage:
//   auto drop = std::make_shared<nn::Dropout>(0.5, /*seed=*/7);
//   Tensor y = drop->forward(x);      // training: masked and scaled; after eval(): y is x

#include <cstdint>

#include "framework/nn/module.h"

namespace hsgd::nn {

// In training mode zeroes each element with probability p and scales the rest by 1/(1-p); in
// eval mode the identity. The mask stream comes from the module's own Generator(seed), so two
// ranks with the same seed draw the same masks and no global state is involved. The generator is
// registered as the module's "generator" (Module::register_generator): a Checkpointer saves its
// position with the model, so a resumed run draws the masks an uninterrupted one would; it is
// not in state_dict(), which holds torch.nn.Dropout's keys (none).
// p must be in [0, 1) (InvalidArgument otherwise).
class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5, uint64_t seed = 0);
  Tensor forward(const Tensor& x) override;
  double p() const { return p_; }
  Generator& generator() { return gen_; }

 private:
  double p_;
  Generator gen_;
};

}  // namespace hsgd::nn
