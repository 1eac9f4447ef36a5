#pragma once
// Parameter initialisation matching PyTorch's defaults, drawn from an explicit Generator (hsgd
// has no global random state, so several ranks in one process never share a stream).
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

// A seed for a module built without an explicit Generator, derived from its kind and sizes, so
// that every process builds identical modules. Pass a Generator for independent layers.
uint64_t default_seed(const char* kind, const Shape& shape);

}  // namespace hsgd::nn::init
