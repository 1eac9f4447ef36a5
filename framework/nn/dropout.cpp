#include "framework/nn/dropout.h"

#include "comm/error.h"
#include "framework/tensor/nn_ops.h"

namespace hsgd::nn {

Dropout::Dropout(double p, std::optional<uint64_t> seed)
    : Module("Dropout"), p_(p), gen_(seed.value_or(0)) {
  HSGD_CHECK(p >= 0.0 && p < 1.0, "Dropout: probability p = ", p, " must be in [0, 1)");
  register_generator("generator", gen_, seed ? GeneratorSeed::kOwn : GeneratorSeed::kFromTree);
}

Tensor Dropout::forward(const Tensor& x) { return dropout(x, p_, is_training(), gen_); }

}  // namespace hsgd::nn
