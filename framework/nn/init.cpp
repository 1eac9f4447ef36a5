#include "framework/nn/init.h"

#include <cmath>

#include "comm/error.h"

namespace hsgd::nn::init {

float default_bound(int64_t fan_in) {
  HSGD_CHECK_GT(fan_in, 0, "fan_in must be positive");
  return 1.0f / std::sqrt(static_cast<float>(fan_in));
}

Tensor default_uniform(const Shape& shape, int64_t fan_in, Generator& gen) {
  const float bound = default_bound(fan_in);
  return uniform(shape, -bound, bound, gen);
}

}  // namespace hsgd::nn::init
