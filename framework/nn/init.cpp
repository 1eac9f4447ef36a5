#include "framework/nn/init.h"

#include <cmath>

#include "comm/error.h"
#include "framework/tensor/grad_mode.h"

namespace hsgd::nn::init {
namespace {

int64_t fan(const Tensor& t, FanMode mode) {
  const auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(t);
  const int64_t f = mode == FanMode::kFanIn ? fan_in : fan_out;
  HSGD_CHECK(f > 0, "init: ", mode == FanMode::kFanIn ? "fan_in" : "fan_out", " of shape ",
             shape_str(t.shape()), " is 0, expected a tensor without zero sizes");
  return f;
}

// Copies values of the same shape into t, whatever its strides, without autograd history.
void assign(Tensor& t, const Tensor& values) {
  NoGradGuard no_grad;
  t.copy_(values);
}

}  // namespace

float default_bound(int64_t fan_in) {
  HSGD_CHECK_GT(fan_in, 0, "fan_in must be positive");
  return 1.0f / std::sqrt(static_cast<float>(fan_in));
}

Tensor default_uniform(const Shape& shape, int64_t fan_in, Generator& gen) {
  const float bound = default_bound(fan_in);
  return uniform(shape, -bound, bound, gen);
}

double calculate_gain(Nonlinearity nonlinearity, double param) {
  switch (nonlinearity) {
    case Nonlinearity::kLinear:
    case Nonlinearity::kConv:
    case Nonlinearity::kSigmoid:
      return 1.0;
    case Nonlinearity::kTanh:
      return 5.0 / 3.0;
    case Nonlinearity::kReLU:
      return std::sqrt(2.0);
    case Nonlinearity::kLeakyReLU:
      return std::sqrt(2.0 / (1.0 + param * param));
    case Nonlinearity::kSELU:
      return 3.0 / 4.0;
  }
  HSGD_THROW(InvalidArgument, "calculate_gain: unknown nonlinearity ",
             static_cast<int>(nonlinearity));
}

std::pair<int64_t, int64_t> calculate_fan_in_and_fan_out(const Tensor& t) {
  HSGD_CHECK(t.defined() && t.dim() >= 2,
             "init: fan in and fan out need a tensor with at least 2 dimensions, got shape ",
             t.defined() ? shape_str(t.shape()) : std::string("undefined"));
  int64_t receptive = 1;
  for (int64_t d = 2; d < t.dim(); ++d) receptive *= t.size(d);
  return {t.size(1) * receptive, t.size(0) * receptive};
}

void kaiming_normal_(Tensor& t, Generator& gen, double a, FanMode mode, Nonlinearity nonlinearity) {
  const double sd = calculate_gain(nonlinearity, a) / std::sqrt(static_cast<double>(fan(t, mode)));
  assign(t, normal(t.shape(), 0.0f, static_cast<float>(sd), gen));
}

void kaiming_uniform_(Tensor& t, Generator& gen, double a, FanMode mode,
                      Nonlinearity nonlinearity) {
  const double bound = std::sqrt(3.0) * calculate_gain(nonlinearity, a) /
                       std::sqrt(static_cast<double>(fan(t, mode)));
  assign(t, uniform(t.shape(), -static_cast<float>(bound), static_cast<float>(bound), gen));
}

void xavier_uniform_(Tensor& t, Generator& gen, double gain) {
  HSGD_CHECK(gain >= 0, "xavier_uniform_: gain ", gain, " must be >= 0");
  const double bound =
      gain *
      std::sqrt(6.0 / static_cast<double>(fan(t, FanMode::kFanIn) + fan(t, FanMode::kFanOut)));
  assign(t, uniform(t.shape(), -static_cast<float>(bound), static_cast<float>(bound), gen));
}

void xavier_normal_(Tensor& t, Generator& gen, double gain) {
  HSGD_CHECK(gain >= 0, "xavier_normal_: gain ", gain, " must be >= 0");
  const double sd =
      gain *
      std::sqrt(2.0 / static_cast<double>(fan(t, FanMode::kFanIn) + fan(t, FanMode::kFanOut)));
  assign(t, normal(t.shape(), 0.0f, static_cast<float>(sd), gen));
}

void uniform_(Tensor& t, Generator& gen, double lo, double hi) {
  HSGD_CHECK(t.defined(), "uniform_: the tensor is undefined");
  HSGD_CHECK(lo <= hi, "uniform_: lo ", lo, " must be <= hi ", hi);
  assign(t, uniform(t.shape(), static_cast<float>(lo), static_cast<float>(hi), gen));
}

void normal_(Tensor& t, Generator& gen, double mean, double stddev) {
  HSGD_CHECK(t.defined(), "normal_: the tensor is undefined");
  HSGD_CHECK(stddev >= 0, "normal_: std ", stddev, " must be >= 0");
  assign(t, normal(t.shape(), static_cast<float>(mean), static_cast<float>(stddev), gen));
}

void constant_(Tensor& t, double value) {
  HSGD_CHECK(t.defined(), "constant_: the tensor is undefined");
  t.fill_(static_cast<float>(value));
}

void zeros_(Tensor& t) { constant_(t, 0.0); }

void ones_(Tensor& t) { constant_(t, 1.0); }

}  // namespace hsgd::nn::init
