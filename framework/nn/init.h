#pragma once
// Parameter initialisation, as torch.nn.init, drawn from a Generator: the one passed to the
// module or function, or the process-wide default generator (framework/tensor/generator.h,
// manual_seed) for modules built without one. The distributions match torch; the values do not
// (different random streams).
//
// PyTorch initialises Linear and Conv2d weights with kaiming_uniform_(a = sqrt(5)), whose bound
// gain * sqrt(3 / fan_in) with gain = sqrt(2 / (1 + a^2)) simplifies to 1 / sqrt(fan_in), and
// their biases with U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
//
// The in-place functions fill an existing tensor (a module's parameter, say) without recording
// autograd history, and take torch's defaults: kaiming_* a = 0, mode fan_in, nonlinearity
// leaky_relu (so gain sqrt(2)); xavier_uniform_ gain 1. Fans are torch's: fan_in = size(1) *
// receptive field, fan_out = size(0) * receptive field, receptive field = product of the sizes
// after the first two.
//
// Usage:
//   hsgd::Generator gen(0);
//   auto fc = std::make_shared<nn::Linear>(256, 128, true, gen);
//   Tensor w = fc->weight();
//   init::kaiming_normal_(w, gen, 0, init::FanMode::kFanOut, init::Nonlinearity::kReLU);
//   init::xavier_uniform_(w, gen);
//   Tensor b = fc->bias();
//   init::zeros_(b);
//
// Errors (InvalidArgument naming the value): fans of a tensor with fewer than 2 dimensions (as
// torch), a zero fan, a negative gain.

#include <cstdint>
#include <utility>

#include "framework/tensor/tensor.h"

namespace hsgd::nn::init {

enum class FanMode { kFanIn, kFanOut };
enum class Nonlinearity { kLinear, kConv, kSigmoid, kTanh, kReLU, kLeakyReLU, kSELU };

// 1 / sqrt(fan_in): the bound of PyTorch's default weight and bias initialisation.
float default_bound(int64_t fan_in);

// A (shape) tensor with values from U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
Tensor default_uniform(const Shape& shape, int64_t fan_in, Generator& gen);

// torch.nn.init.calculate_gain: 1 for linear/conv/sigmoid, 5/3 for tanh, sqrt(2) for relu,
// sqrt(2 / (1 + param^2)) for leaky_relu (param: the negative slope, default 0.01 as torch),
// 3/4 for selu.
double calculate_gain(Nonlinearity nonlinearity, double param = 0.01);

// (fan_in, fan_out) of a tensor with at least 2 dimensions.
std::pair<int64_t, int64_t> calculate_fan_in_and_fan_out(const Tensor& t);

// N(0, std^2), std = gain / sqrt(fan), gain = calculate_gain(nonlinearity, a).
void kaiming_normal_(Tensor& t, Generator& gen, double a = 0, FanMode mode = FanMode::kFanIn,
                     Nonlinearity nonlinearity = Nonlinearity::kLeakyReLU);
// U(-bound, bound), bound = sqrt(3) * gain / sqrt(fan).
void kaiming_uniform_(Tensor& t, Generator& gen, double a = 0, FanMode mode = FanMode::kFanIn,
                      Nonlinearity nonlinearity = Nonlinearity::kLeakyReLU);
// U(-bound, bound), bound = gain * sqrt(6 / (fan_in + fan_out)).
void xavier_uniform_(Tensor& t, Generator& gen, double gain = 1.0);
// N(0, std^2), std = gain * sqrt(2 / (fan_in + fan_out)).
void xavier_normal_(Tensor& t, Generator& gen, double gain = 1.0);
void uniform_(Tensor& t, Generator& gen, double lo = 0.0, double hi = 1.0);
void normal_(Tensor& t, Generator& gen, double mean = 0.0, double stddev = 1.0);
void constant_(Tensor& t, double value);
void zeros_(Tensor& t);
void ones_(Tensor& t);

}  // namespace hsgd::nn::init
