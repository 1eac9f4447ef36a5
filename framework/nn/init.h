#pragma once
// Parameter initialisation matching PyTorch's defaults, drawn from a Generator: the one passed
// to the module, or the process-wide default generator (framework/tensor/generator.h,
// manual_seed) for modules built without one.
//
// PyTorch initialises Linear and Conv2d weights with kaiming_uniform_(a = sqrt(5)), whose bound
// gain * sqrt(3 / fan_in) with gain = sqrt(2 / (1 + a^2)) simplifies to 1 / sqrt(fan_in), and
// their biases with U(-1/sqrt(fan_in), 1/sqrt(fan_in)). The distributions match torch; the
// values do not (different random streams).

#include <cstdint>

#include "framework/tensor/tensor.h"

namespace hsgd::nn::init {

// 1 / sqrt(fan_in): the bound of PyTorch's default weight and bias initialisation.
float default_bound(int64_t fan_in);

// A (shape) tensor with values from U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
Tensor default_uniform(const Shape& shape, int64_t fan_in, Generator& gen);

}  // namespace hsgd::nn::init
