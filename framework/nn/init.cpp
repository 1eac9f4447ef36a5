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

uint64_t default_seed(const char* kind, const Shape& shape) {
  // FNV-1a over the kind and the sizes: stable across compilers, unlike std::hash.
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](uint64_t byte) { h = (h ^ byte) * 1099511628211ull; };
  for (const char* p = kind; *p != '\0'; ++p) mix(static_cast<unsigned char>(*p));
  for (int64_t d : shape) {
    for (int i = 0; i < 8; ++i) mix((static_cast<uint64_t>(d) >> (8 * i)) & 0xff);
  }
  return h;
}

}  // namespace hsgd::nn::init
