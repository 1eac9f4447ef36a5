#include "optim/sgd.h"

#include <gtest/gtest.h>

#include <functional>
#include <memory>

#include "comm/error.h"
#include "framework/nn/nn.h"
#include "framework/parallel/parallel.h"
#include "framework/tensor/generator.h"
#include "framework/tensor/ops.h"
#include "tests/golden/golden.h"
#include "tests/optim/golden_training.h"

namespace hsgd::optim {
namespace {

using golden::expect_close;
using testing::check_golden;
using testing::expect_final;
using testing::make_mlp;
using testing::prefixed;
using testing::run_steps;

// generate.py's convnet().
std::shared_ptr<nn::Sequential> make_convnet() {
  auto net = std::make_shared<nn::Sequential>();
  net->push_back(std::make_shared<nn::Conv2d>(nn::Conv2dOptions{
      .in_channels = 2, .out_channels = 4, .kernel_size = {3, 3}, .padding = {1, 1}}));
  net->push_back(std::make_shared<nn::BatchNorm2d>(4));
  net->push_back(std::make_shared<nn::ReLU>());
  net->push_back(std::make_shared<nn::MaxPool2d>(Size2{2, 2}));
  net->push_back(std::make_shared<nn::Flatten>());
  net->push_back(std::make_shared<nn::Linear>(36, 3));
  return net;
}

TEST(SGDTest, ProducesPyTorchValues_MLPWithNesterovAndWeightDecay) {
  check_golden("sgd_mlp_nesterov", make_mlp(), [](nn::Sequential& net) {
    return std::make_unique<SGD>(
        net.parameters(),
        SGDOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-2, .nesterov = true});
  });
}

TEST(SGDTest, ProducesPyTorchValues_MLPWithDampeningAndWeightDecay) {
  check_golden("sgd_mlp_dampening", make_mlp(), [](nn::Sequential& net) {
    return std::make_unique<SGD>(
        net.parameters(),
        SGDOptions{.lr = 0.05, .momentum = 0.9, .dampening = 0.3, .weight_decay = 5e-3});
  });
}

TEST(SGDTest, ProducesPyTorchValues_MLPPlain) {
  check_golden("sgd_mlp_plain", make_mlp(), [](nn::Sequential& net) {
    return std::make_unique<SGD>(net.parameters(), SGDOptions{.lr = 0.2});
  });
}

TEST(SGDTest, ProducesPyTorchValues_MLPWithParamGroups) {
  check_golden("sgd_mlp_groups", make_mlp(), [](nn::Sequential& net) {
    std::vector<Tensor> rest = net[2]->parameters();
    for (const Tensor& p : net[4]->parameters()) rest.push_back(p);
    std::vector<ParamGroup> groups = {
        {.params = net[0]->parameters(), .lr = 0.03, .weight_decay = 1e-2},
        {.params = rest, .nesterov = true}};
    return std::make_unique<SGD>(groups, SGDOptions{.lr = 0.1, .momentum = 0.9});
  });
}

TEST(SGDTest, ProducesPyTorchValues_ConvBatchNormPoolLinear) {
  check_golden("sgd_convnet", make_convnet(), [](nn::Sequential& net) {
    return std::make_unique<SGD>(
        net.parameters(),
        SGDOptions{.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-3, .nesterov = true});
  });
}

TEST(SGDTest, StateDict_ResumingMidwayReproducesTenSteps) {
  golden::File f("sgd_mlp_nesterov");
  const SGDOptions options{.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-2, .nesterov = true};
  auto net = make_mlp();
  net->load_state_dict(prefixed(f, "init."));
  StateDict saved;
  nn::NamedTensors saved_model;
  {
    SGD opt(net->parameters(), options);
    run_steps(*net, opt, f, 0, 5);
    saved = opt.state_dict();
    for (auto& [name, t] : net->state_dict()) saved_model.emplace_back(name, t.clone());
  }
  EXPECT_TRUE(saved.contains("state.0.momentum_buffer"));
  EXPECT_EQ(saved.get_double("param_groups.0.lr"), 0.1);
  // A fresh model and optimizer (other lr, no buffers) restored from the saved state.
  auto resumed = make_mlp();
  resumed->load_state_dict(saved_model);
  SGD opt(resumed->parameters(), {.lr = 0.5});
  opt.load_state_dict(saved);
  EXPECT_EQ(*opt.param_groups()[0].lr, 0.1);
  EXPECT_TRUE(*opt.param_groups()[0].nesterov);
  run_steps(*resumed, opt, f, 5, 10);
  expect_final(*resumed, f);
}

TEST(SGDTest, StateDict_BuffersAreCopies) {
  Tensor p = ones({2});
  p.set_requires_grad(true);
  SGD opt({p}, {.lr = 0.1, .momentum = 0.9});
  p.set_grad(full({2}, 1.0f));
  opt.step();
  StateDict state = opt.state_dict();
  opt.step();  // changes the live buffer
  EXPECT_EQ(state.get_tensor("state.0.momentum_buffer").to_vector(), std::vector<float>(2, 1.0f));
  EXPECT_NE(opt.momentum_buffer(0).to_vector(), std::vector<float>(2, 1.0f));
}

TEST(SGDTest, LoadStateDict_RejectsMismatchedGroupsAndShapes) {
  Tensor a = ones({2}), b = ones({3});
  a.set_requires_grad(true);
  b.set_requires_grad(true);
  SGD two({a, b}, {.lr = 0.1, .momentum = 0.9});
  SGD one({a}, {.lr = 0.1});
  EXPECT_THROW(one.load_state_dict(two.state_dict()), InvalidArgument);
  StateDict bad = two.state_dict();
  bad.set("state.1.momentum_buffer", zeros({4}));
  try {
    two.load_state_dict(bad);
    ADD_FAILURE() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("state.1.momentum_buffer"), std::string::npos) << e.what();
  }
  StateDict wrong_type = two.state_dict();
  wrong_type.set("param_groups.0.lr", int64_t{1});
  EXPECT_THROW(two.load_state_dict(wrong_type), InvalidArgument);
  EXPECT_EQ(*two.param_groups()[0].lr, 0.1);  // untouched after the failures
}

TEST(SGDTest, Step_SkipsParametersWithoutGradient) {
  Tensor a = ones({2}), b = ones({2});
  a.set_requires_grad(true);
  b.set_requires_grad(true);
  SGD opt({a, b}, {.lr = 0.5, .momentum = 0.9, .weight_decay = 0.1});
  a.set_grad(full({2}, 1.0f));
  opt.step();
  // a: d = 1 + 0.1 * 1 = 1.1 -> 1 - 0.55; b untouched (weight decay must not move it either).
  EXPECT_FLOAT_EQ(a.to_vector()[0], 1.0f - 0.5f * 1.1f);
  EXPECT_EQ(b.to_vector(), std::vector<float>(2, 1.0f));
  EXPECT_FALSE(opt.momentum_buffer(1).defined());
}

// The one-pass update of contiguous parameters must equal, bit for bit, the step-by-step form,
// which SGD still uses for a non-contiguous parameter: a transposed view of the same values.
TEST(SGDTest, FusedUpdate_EqualsStepByStepFormBitForBit) {
  struct Case {
    SGDOptions options;
    const char* name;
  };
  const Case cases[] = {
      {{.lr = 0.1}, "plain"},
      {{.lr = 0.1, .weight_decay = 0.01}, "weight decay"},
      {{.lr = 0.1, .momentum = 0.9}, "momentum"},
      {{.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.01}, "dampening"},
      {{.lr = 0.1, .momentum = 0.9, .nesterov = true}, "nesterov"},
      {{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true}, "nesterov+decay"},
  };
  const int threads_before = get_num_threads();
  for (int threads : {1, 3}) {
    set_num_threads(threads);
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(c.name) + " at " + std::to_string(threads) + " threads");
      Generator gen(7);
      const Tensor x = randn({257, 401}, gen);  // several runs of the update's grain
      Tensor fused = x.clone();
      Tensor stored = x.t().contiguous();  // (401, 257)
      Tensor strided = stored.t();         // x's values and shape, not contiguous
      ASSERT_FALSE(strided.is_contiguous());
      fused.set_requires_grad(true);
      strided.set_requires_grad(true);
      SGD a({fused}, c.options), b({strided}, c.options);
      for (int step = 0; step < 3; ++step) {
        const Tensor g = randn({257, 401}, gen);
        fused.set_grad(g.clone());
        strided.set_grad(g.clone());
        a.step();
        b.step();
      }
      EXPECT_EQ(fused.to_vector(), strided.contiguous().to_vector());
      if (c.options.momentum != 0) {
        EXPECT_EQ(a.momentum_buffer(0).to_vector(), b.momentum_buffer(0).contiguous().to_vector());
      }
      EXPECT_NE(fused.to_vector(), x.to_vector());  // the steps moved it
    }
  }
  set_num_threads(threads_before);
}

TEST(SGDTest, ZeroGrad_ZeroesGradients) {
  Tensor a = ones({2});
  a.set_requires_grad(true);
  SGD opt({a}, {.lr = 0.5});
  a.set_grad(full({2}, 3.0f));
  opt.zero_grad();
  EXPECT_EQ(a.grad().to_vector(), std::vector<float>(2, 0.0f));
}

TEST(SGDTest, InvalidOptions_AreRejectedWithTheValue) {
  Tensor a = ones({2});
  a.set_requires_grad(true);
  auto expect_message = [&](SGDOptions o, const std::string& fragment) {
    try {
      SGD opt({a}, o);
      ADD_FAILURE() << "expected InvalidArgument for " << fragment;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  expect_message({.lr = 0.1, .nesterov = true}, "nesterov");
  expect_message({.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .nesterov = true}, "dampening 0.1");
  expect_message({.lr = -1}, "learning rate -1");
  expect_message({.lr = 0.1, .momentum = -0.5}, "momentum -0.5");
  expect_message({.lr = 0.1, .weight_decay = -2}, "weight_decay -2");
  EXPECT_THROW(SGD(std::vector<Tensor>{}, SGDOptions{.lr = 0.1}), InvalidArgument);
  std::vector<ParamGroup> dup = {{.params = {a}}, {.params = {a}}};
  EXPECT_THROW(SGD(dup, SGDOptions{.lr = 0.1}), InvalidArgument);
}

}  // namespace
}  // namespace hsgd::optim
