#include "models/resnet.h"

#include <string>

#include "comm/error.h"
#include "framework/tensor/nn_ops.h"
#include "framework/tensor/ops.h"

namespace hsgd::models {
namespace {

std::shared_ptr<nn::Conv2d> conv3x3(int64_t in, int64_t out, int64_t stride, Generator& gen) {
  return std::make_shared<nn::Conv2d>(nn::Conv2dOptions{.in_channels = in,
                                                        .out_channels = out,
                                                        .kernel_size = {3, 3},
                                                        .stride = {stride, stride},
                                                        .padding = {1, 1},
                                                        .bias = false},
                                      gen);
}

}  // namespace

ResNetOptions resnet_cifar_options(int64_t depth, int64_t num_classes, uint64_t seed) {
  HSGD_CHECK(depth >= 8 && (depth - 2) % 6 == 0, "resnet_cifar_options: depth ", depth,
             " must be 6n+2 with n >= 1 (20, 32, 44, 56, 110, ...)");
  const int64_t n = (depth - 2) / 6;
  return {.blocks = {n, n, n}, .widths = {16, 32, 64}, .num_classes = num_classes, .seed = seed};
}

ResNetOptions resnet18_options(int64_t num_classes, uint64_t seed) {
  return {.blocks = {2, 2, 2, 2},
          .widths = {64, 128, 256, 512},
          .num_classes = num_classes,
          .seed = seed};
}

// ---- BasicBlock ----

BasicBlock::BasicBlock(int64_t in_channels, int64_t out_channels, int64_t stride, Generator& gen)
    : Module("BasicBlock") {
  HSGD_CHECK(stride == 1 || stride == 2, "BasicBlock: stride ", stride, " must be 1 or 2");
  // Registration order is torchvision's, which fixes both the parameter order and the order in
  // which the initial weights are drawn.
  conv1_ = register_module("conv1", conv3x3(in_channels, out_channels, stride, gen));
  bn1_ = register_module("bn1", std::make_shared<nn::BatchNorm2d>(out_channels));
  conv2_ = register_module("conv2", conv3x3(out_channels, out_channels, 1, gen));
  bn2_ = register_module("bn2", std::make_shared<nn::BatchNorm2d>(out_channels));
  if (stride != 1 || in_channels != out_channels) {
    downsample_ = register_module("downsample", std::make_shared<nn::Sequential>());
    downsample_->push_back(
        std::make_shared<nn::Conv2d>(nn::Conv2dOptions{.in_channels = in_channels,
                                                       .out_channels = out_channels,
                                                       .kernel_size = {1, 1},
                                                       .stride = {stride, stride},
                                                       .bias = false},
                                     gen));
    downsample_->push_back(std::make_shared<nn::BatchNorm2d>(out_channels));
  }
}

Tensor BasicBlock::forward(const Tensor& x) {
  Tensor out = bn1_->forward_relu(conv1_->forward(x));  // relu(bn1(conv1(x))), (N,out,H/s,W/s)
  out = conv2_->forward(out);
  const Tensor shortcut = downsample_ ? downsample_->forward(x) : x;
  return bn2_->forward_add_relu(out, shortcut);  // relu(bn2(out) + shortcut)
}

// ---- ResNet ----

ResNet::ResNet(const ResNetOptions& options) : Module("ResNet"), options_(options) {
  HSGD_CHECK(!options.blocks.empty() && options.blocks.size() == options.widths.size(),
             "ResNet: blocks (", options.blocks.size(), " stages) and widths (",
             options.widths.size(), " stages) must have the same non-zero length");
  for (size_t s = 0; s < options.blocks.size(); ++s) {
    HSGD_CHECK(options.blocks[s] > 0 && options.widths[s] > 0, "ResNet: stage ", s + 1, " has ",
               options.blocks[s], " blocks of width ", options.widths[s],
               "; both must be positive");
  }
  HSGD_CHECK(options.in_channels > 0, "ResNet: in_channels ", options.in_channels,
             " must be positive");
  HSGD_CHECK(options.num_classes > 0, "ResNet: num_classes ", options.num_classes,
             " must be positive");

  Generator gen(options.seed);
  conv1_ = register_module("conv1", conv3x3(options.in_channels, options.widths[0], 1, gen));
  bn1_ = register_module("bn1", std::make_shared<nn::BatchNorm2d>(options.widths[0]));
  int64_t channels = options.widths[0];
  for (size_t s = 0; s < options.blocks.size(); ++s) {
    auto stage =
        register_module("layer" + std::to_string(s + 1), std::make_shared<nn::Sequential>());
    for (int64_t b = 0; b < options.blocks[s]; ++b) {
      const int64_t stride = (s > 0 && b == 0) ? 2 : 1;
      stage->push_back(std::make_shared<BasicBlock>(channels, options.widths[s], stride, gen));
      channels = options.widths[s];
    }
    stages_.push_back(stage);
  }
  fc_ =
      register_module("fc", std::make_shared<nn::Linear>(channels, options.num_classes, true, gen));
}

Tensor ResNet::forward(const Tensor& x) {
  HSGD_CHECK(x.defined() && x.dim() == 4 && x.size(1) == options_.in_channels,
             "ResNet: input must be (N,", options_.in_channels, ",H,W), got shape ",
             x.defined() ? shape_str(x.shape()) : "undefined");
  Tensor h = bn1_->forward_relu(conv1_->forward(x));  // relu(bn1(conv1(x))), (N,widths[0],H,W)
  for (const auto& stage : stages_) h = stage->forward(h);
  h = adaptive_avg_pool2d(h, {1, 1}).flatten(1);  // (N,widths.back())
  return fc_->forward(h);                         // (N,num_classes)
}

}  // namespace hsgd::models
