#pragma once
// models::ResNet: residual networks for small images (CIFAR-10 style), built from BasicBlocks.
//
//   conv1 3x3 stride 1 (no bias) -> bn1 -> relu
//   layer1 .. layerS: blocks[s] BasicBlocks of widths[s] channels; the first block of every
//                     stage after the first has stride 2 (halves H and W)
//   adaptive average pool to 1x1 -> flatten -> fc (Linear widths.back() -> num_classes)
//
// BasicBlock: relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)), 3x3 convolutions without
// bias. The shortcut is the identity when the block keeps the shape and otherwise He et al.'s
// "option B" projection, downsample = Sequential(conv 1x1 stride s without bias, BatchNorm2d),
// as torchvision and most PyTorch CIFAR code do. (Option A, zero-padded identity, would give
// ResNet-20 269,722 parameters instead of 272,474.)
//
// Names follow torchvision ("conv1.weight", "layer2.0.downsample.1.running_mean", "fc.bias"), and
// state_dict() has torch's order, so a torch state dict of the twin in
// tests/golden_resnet/torch_resnet.py loads unchanged. Initialisation is PyTorch's default for
// each layer (Conv2d/Linear kaiming-uniform with a = sqrt(5), BatchNorm weight 1 and bias 0),
// drawn in registration order from Generator(seed): the same options give the same model on
// every process. Input height and width are free (the pool adapts); 32x32 is the usual size.
//
// The variants offered, parameter counts checked against PyTorch in tests/models/resnet:
//   resnet_cifar_options(20)  ResNet-20   blocks {3,3,3}    widths {16,32,64}          272,474
//   resnet_cifar_options(32)  ResNet-32   blocks {5,5,5}                               466,906
//   resnet_cifar_options(56)  ResNet-56   blocks {9,9,9}                               855,770
//   resnet18_options()        ResNet-18   blocks {2,2,2,2} widths {64,128,256,512}  11,173,962
//                             (CIFAR variant: 3x3 stride-1 stem, no max-pool)
//
// Usage:
//   auto model = std::make_shared<models::ResNet>(models::resnet_cifar_options(20));
//   Tensor logits = model->forward(x);               // x (N,3,32,32) -> logits (N,10)
//
// Errors (InvalidArgument naming the value): blocks and widths of different or zero length, a
// non-positive entry, in_channels or num_classes < 1, a CIFAR depth that is not 6n+2; forward
// with an input that is not (N,in_channels,H,W).

#include <cstdint>
#include <memory>
#include <vector>

#include "framework/nn/batch_norm.h"
#include "framework/nn/conv.h"
#include "framework/nn/linear.h"
#include "framework/nn/module.h"
#include "framework/nn/sequential.h"

namespace hsgd::models {

struct ResNetOptions {
  std::vector<int64_t> blocks = {3, 3, 3};     // BasicBlocks per stage (ResNet-20)
  std::vector<int64_t> widths = {16, 32, 64};  // output channels of each stage
  int64_t in_channels = 3;
  int64_t num_classes = 10;
  uint64_t seed = 0;
};

// CIFAR ResNet-depth: depth = 6n + 2 (20, 32, 44, 56, 110, ...), blocks {n,n,n}, widths {16,32,64}.
ResNetOptions resnet_cifar_options(int64_t depth, int64_t num_classes = 10, uint64_t seed = 0);
// ResNet-18 for 32x32 inputs: blocks {2,2,2,2}, widths {64,128,256,512}.
ResNetOptions resnet18_options(int64_t num_classes = 10, uint64_t seed = 0);

// One residual block; see the file comment. Built by ResNet, usable alone.
class BasicBlock : public nn::Module {
 public:
  // stride 1 or 2 applies to conv1 and to the projection.
  BasicBlock(int64_t in_channels, int64_t out_channels, int64_t stride, Generator& gen);

  // x (N,in_channels,H,W) -> (N,out_channels,H/stride,W/stride) (rounded up)
  Tensor forward(const Tensor& x) override;

  // Null when the shortcut is the identity.
  const std::shared_ptr<nn::Sequential>& downsample() const { return downsample_; }

 private:
  std::shared_ptr<nn::Conv2d> conv1_, conv2_;
  std::shared_ptr<nn::BatchNorm2d> bn1_, bn2_;
  std::shared_ptr<nn::Sequential> downsample_;  // conv 1x1 + BatchNorm2d, or null
};

class ResNet : public nn::Module {
 public:
  explicit ResNet(const ResNetOptions& options = {});

  // x (N,in_channels,H,W) -> logits (N,num_classes)
  Tensor forward(const Tensor& x) override;

  const ResNetOptions& options() const { return options_; }
  // layer1 .. layerS, each a Sequential of BasicBlocks.
  const std::vector<std::shared_ptr<nn::Sequential>>& stages() const { return stages_; }

 private:
  ResNetOptions options_;
  std::shared_ptr<nn::Conv2d> conv1_;
  std::shared_ptr<nn::BatchNorm2d> bn1_;
  std::vector<std::shared_ptr<nn::Sequential>> stages_;
  std::shared_ptr<nn::Linear> fc_;
};

}  // namespace hsgd::models
