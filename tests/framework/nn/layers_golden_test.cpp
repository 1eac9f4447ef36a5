// Forward outputs and gradients of every layer against PyTorch 1.13 (tests/golden/generate.py).
// Each case loads the inputs and weights torch used, computes loss = sum(out * gout) and
// compares out and the gradient of every input and parameter.

#include <gtest/gtest.h>

#include "framework/nn/nn.h"
#include "framework/tensor/ops.h"
#include "tests/framework/nn/layer_golden.h"
#include "tests/golden/golden.h"

namespace hsgd::nn {
namespace {

using golden::expect_close;
using testing::check_forward_backward;
using testing::leaf;

TEST(LayersGoldenTest, ProducesPyTorchValues_Linear) {
  golden::File f("linear");
  Linear fc(5, 4);
  fc.load_state_dict({{"weight", f.tensor("w")}, {"bias", f.tensor("b")}});
  check_forward_backward(fc, f, "linear");
  expect_close(fc.weight().grad(), f.tensor("grad_w"), "linear grad_w");
  expect_close(fc.bias().grad(), f.tensor("grad_b"), "linear grad_b");
}

void check_conv(const std::string& name, Conv2dOptions options) {
  golden::File f(name);
  Conv2d conv(options);
  NamedTensors state = {{"weight", f.tensor("w")}};
  if (options.bias) state.emplace_back("bias", f.tensor("b"));
  conv.load_state_dict(state);
  check_forward_backward(conv, f, name);
  expect_close(conv.weight().grad(), f.tensor("grad_w"), name + " grad_w");
  if (options.bias) expect_close(conv.bias().grad(), f.tensor("grad_b"), name + " grad_b");
}

TEST(LayersGoldenTest, ProducesPyTorchValues_Conv2dStride1NoPadding) {
  check_conv("conv2d_s1p0", {.in_channels = 3, .out_channels = 4, .kernel_size = {3, 3}});
}

TEST(LayersGoldenTest, ProducesPyTorchValues_Conv2dStrideAndPadding) {
  check_conv("conv2d_s2p1", {.in_channels = 3,
                             .out_channels = 5,
                             .kernel_size = {3, 2},
                             .stride = {2, 1},
                             .padding = {1, 2}});
}

TEST(LayersGoldenTest, ProducesPyTorchValues_Conv2dWithoutBias) {
  check_conv("conv2d_nobias", {.in_channels = 2,
                               .out_channels = 3,
                               .kernel_size = {3, 3},
                               .stride = {2, 2},
                               .padding = {1, 1},
                               .bias = false});
}

TEST(LayersGoldenTest, ProducesPyTorchValues_BatchNorm2dTraining) {
  golden::File f("batchnorm2d_train");
  BatchNorm2d bn(3, 1e-5, 0.1);
  bn.load_state_dict({{"weight", f.tensor("weight")},
                      {"bias", f.tensor("bias")},
                      {"running_mean", f.tensor("running_mean0")},
                      {"running_var", f.tensor("running_var0")},
                      {"num_batches_tracked", zeros({})}});
  check_forward_backward(bn, f, "bn train");
  expect_close(bn.weight().grad(), f.tensor("grad_weight"), "bn train grad_weight");
  expect_close(bn.bias().grad(), f.tensor("grad_bias"), "bn train grad_bias");
  expect_close(bn.running_mean(), f.tensor("running_mean"), "bn train running_mean");
  expect_close(bn.running_var(), f.tensor("running_var"), "bn train running_var");
  EXPECT_EQ(bn.num_batches_tracked().item(), 1.0f);
}

TEST(LayersGoldenTest, ProducesPyTorchValues_BatchNorm2dEval) {
  golden::File f("batchnorm2d_eval");
  BatchNorm2d bn(2);
  bn.load_state_dict({{"weight", f.tensor("weight")},
                      {"bias", f.tensor("bias")},
                      {"running_mean", f.tensor("running_mean")},
                      {"running_var", f.tensor("running_var")},
                      {"num_batches_tracked", zeros({})}});
  bn.eval();
  check_forward_backward(bn, f, "bn eval");
  expect_close(bn.weight().grad(), f.tensor("grad_weight"), "bn eval grad_weight");
  expect_close(bn.bias().grad(), f.tensor("grad_bias"), "bn eval grad_bias");
  // Eval mode must not touch the running statistics.
  expect_close(bn.running_mean(), f.tensor("running_mean"), "bn eval running_mean unchanged");
  EXPECT_EQ(bn.num_batches_tracked().item(), 0.0f);
}

TEST(LayersGoldenTest, ProducesPyTorchValues_MaxPool2d) {
  MaxPool2d pool({3, 3}, {2, 2}, {1, 1});
  check_forward_backward(pool, golden::File("max_pool2d"), "max_pool2d k3 s2 p1");
  MaxPool2d pool2({2, 2});
  check_forward_backward(pool2, golden::File("max_pool2d_k2"), "max_pool2d k2");
}

TEST(LayersGoldenTest, ProducesPyTorchValues_AvgPool2d) {
  AvgPool2d pool({3, 3}, {2, 2});
  check_forward_backward(pool, golden::File("avg_pool2d"), "avg_pool2d k3 s2");
  AvgPool2d padded({3, 3}, {2, 2}, {1, 1});
  check_forward_backward(padded, golden::File("avg_pool2d_pad"), "avg_pool2d k3 s2 p1");
}

TEST(LayersGoldenTest, ProducesPyTorchValues_AdaptiveAvgPool2d) {
  AdaptiveAvgPool2d pool({3, 2});
  check_forward_backward(pool, golden::File("adaptive_avg_pool2d"), "adaptive_avg_pool2d 3x2");
  AdaptiveAvgPool2d global({1, 1});
  check_forward_backward(global, golden::File("adaptive_avg_pool2d_1"), "adaptive_avg_pool2d 1x1");
}

TEST(LayersGoldenTest, ProducesPyTorchValues_ReLU) {
  ReLU relu;
  check_forward_backward(relu, golden::File("relu"), "relu");
}

TEST(LayersGoldenTest, ProducesPyTorchValues_LogSoftmax) {
  golden::File f("log_softmax");
  Tensor x = leaf(f, "x");
  Tensor out = log_softmax(x, 1);
  expect_close(out, f.tensor("out"), "log_softmax out");
  sum(mul(out, f.tensor("gout"))).backward();
  expect_close(x.grad(), f.tensor("grad_x"), "log_softmax grad_x");
}

TEST(LayersGoldenTest, ProducesPyTorchValues_CrossEntropy) {
  golden::File f("cross_entropy");
  Tensor logits = leaf(f, "logits");
  Tensor loss = nn::cross_entropy(logits, f.targets("targets"));
  expect_close(loss, f.tensor("loss"), "cross_entropy loss");
  loss.backward();
  expect_close(logits.grad(), f.tensor("grad_logits"), "cross_entropy grad_logits");
}

}  // namespace
}  // namespace hsgd::nn
