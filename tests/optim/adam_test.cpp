// optim::Adam and optim::AdamW: 10-step trajectories against torch.optim.Adam / AdamW
// (tests/golden/generate_nn_optim.py), param groups, state_dict round trips, errors, and a small
// model of Embedding / LayerNorm / ModuleList / GELU / SiLU / BatchNorm1d trained with AdamW,
// clip_grad_norm_ and label-smoothed cross_entropy against torch.

#include "optim/adam.h"

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>

#include "comm/error.h"
#include "framework/nn/nn.h"
#include "framework/tensor/generator.h"
#include "framework/tensor/nn_ops.h"
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

// Layer 0 in one group with its own lr, weight decay and betas; layers 2 and 4 with amsgrad and
// their own eps (generate_nn_optim.py's groups()).
std::vector<ParamGroup> mlp_groups(nn::Sequential& net) {
  std::vector<Tensor> rest = net[2]->parameters();
  for (const Tensor& p : net[4]->parameters()) rest.push_back(p);
  return {{.params = net[0]->parameters(),
           .lr = 3e-3,
           .weight_decay = 0.0,
           .options = {{"beta1", 0.8}, {"beta2", 0.9}}},
          {.params = rest, .options = {{"amsgrad", 1}, {"eps", 1e-4}}}};
}

TEST(AdamTest, ProducesPyTorchValues_Defaults) {
  check_golden("adam_mlp", make_mlp(), [](nn::Sequential& net) {
    return std::make_unique<Adam>(net.parameters(), AdamOptions{.lr = 1e-2});
  });
}

TEST(AdamTest, ProducesPyTorchValues_WeightDecayAmsgradBetasEps) {
  check_golden("adam_mlp_wd_amsgrad", make_mlp(), [](nn::Sequential& net) {
    return std::make_unique<Adam>(
        net.parameters(),
        AdamOptions{
            .lr = 5e-3, .betas = {0.8, 0.99}, .eps = 1e-6, .weight_decay = 1e-2, .amsgrad = true});
  });
}

TEST(AdamWTest, ProducesPyTorchValues_DecoupledWeightDecay) {
  check_golden("adamw_mlp", make_mlp(), [](nn::Sequential& net) {
    return std::make_unique<AdamW>(net.parameters(), AdamWOptions{.lr = 1e-2, .weight_decay = 0.1});
  });
}

TEST(AdamWTest, ProducesPyTorchValues_AmsgradDefaultWeightDecay) {
  check_golden("adamw_mlp_amsgrad", make_mlp(), [](nn::Sequential& net) {
    return std::make_unique<AdamW>(net.parameters(), AdamWOptions{.lr = 2e-2, .amsgrad = true});
  });
}

TEST(AdamWTest, ProducesPyTorchValues_ParamGroups) {
  check_golden("adamw_mlp_groups", make_mlp(), [](nn::Sequential& net) {
    return std::make_unique<AdamW>(mlp_groups(net), AdamWOptions{.lr = 1e-2, .weight_decay = 0.05});
  });
}

TEST(AdamWTest, GroupsGetDefaultsFilledIn) {
  auto net = make_mlp();
  AdamW opt(mlp_groups(*net), AdamWOptions{.lr = 1e-2, .weight_decay = 0.05});
  const std::vector<ParamGroup>& g = opt.param_groups();
  ASSERT_EQ(g.size(), 2u);
  EXPECT_EQ(*g[0].lr, 3e-3);
  EXPECT_EQ(*g[0].weight_decay, 0.0);
  EXPECT_EQ(g[0].options.at("beta1"), 0.8);
  EXPECT_EQ(g[0].options.at("eps"), 1e-8);
  EXPECT_EQ(g[0].options.at("amsgrad"), 0.0);
  EXPECT_EQ(*g[1].lr, 1e-2);
  EXPECT_EQ(*g[1].weight_decay, 0.05);
  EXPECT_EQ(g[1].options.at("beta2"), 0.999);
  EXPECT_EQ(g[1].options.at("amsgrad"), 1.0);
}

// Runs 4 steps, saves, restores into a fresh model + optimizer and runs steps 4..9 there: the
// result must be torch's 10-step trajectory, so every state entry survived the round trip.
template <typename Opt, typename Options>
void check_resume(const std::string& file, Options options, bool groups) {
  golden::File f(file);
  auto make = [&](nn::Sequential& net) {
    return groups ? std::make_unique<Opt>(mlp_groups(net), options)
                  : std::make_unique<Opt>(net.parameters(), options);
  };
  auto first = make_mlp();
  first->load_state_dict(prefixed(f, "init."));
  auto opt1 = make(*first);
  run_steps(*first, *opt1, f, 0, 4);
  const StateDict saved = opt1->state_dict();
  const nn::NamedTensors weights = first->state_dict();

  size_t index = 0;
  for (const ParamGroup& g : opt1->param_groups()) {
    const bool amsgrad = g.options.at("amsgrad") != 0;
    for (size_t i = 0; i < g.params.size(); ++i, ++index) {
      const std::string prefix = "state." + std::to_string(index) + ".";
      EXPECT_EQ(saved.get_int(prefix + "step"), 4) << prefix;
      EXPECT_TRUE(saved.contains(prefix + "exp_avg")) << prefix;
      EXPECT_TRUE(saved.contains(prefix + "exp_avg_sq")) << prefix;
      EXPECT_EQ(saved.contains(prefix + "max_exp_avg_sq"), amsgrad) << prefix;
    }
  }

  auto second = make_mlp();
  second->load_state_dict(weights);
  Options other = options;
  other.lr = 0.5;  // overwritten by the saved group entries
  auto opt2 = groups ? std::make_unique<Opt>(mlp_groups(*second), other)
                     : std::make_unique<Opt>(second->parameters(), other);
  opt2->load_state_dict(saved);
  EXPECT_EQ(*opt2->param_groups()[0].lr, *opt1->param_groups()[0].lr);
  run_steps(*second, *opt2, f, 4, 10);
  expect_final(*second, f);
  EXPECT_EQ(opt2->state(0).step, 10);
}

TEST(AdamTest, StateDict_ResumingMidwayReproducesTenSteps) {
  check_resume<Adam>(
      "adam_mlp_wd_amsgrad",
      AdamOptions{
          .lr = 5e-3, .betas = {0.8, 0.99}, .eps = 1e-6, .weight_decay = 1e-2, .amsgrad = true},
      false);
}

TEST(AdamWTest, StateDict_ResumingMidwayReproducesTenSteps_Groups) {
  check_resume<AdamW>("adamw_mlp_groups", AdamWOptions{.lr = 1e-2, .weight_decay = 0.05}, true);
}

TEST(AdamTest, SkipsParametersWithoutGradient) {
  Tensor a = ones({2}).set_requires_grad(true);
  Tensor b = ones({3}).set_requires_grad(true);
  Adam opt({a, b}, AdamOptions{.lr = 0.1});
  a.set_grad(ones({2}));
  opt.step();
  // First Adam step moves by lr * m_hat / (sqrt(v_hat) + eps) = lr * 1 / (1 + 1e-8).
  EXPECT_NEAR(a.to_vector()[0], 0.9f, 1e-6);
  EXPECT_EQ(b.to_vector()[0], 1.0f);
  EXPECT_EQ(opt.state(0).step, 1);
  EXPECT_EQ(opt.state(1).step, 0);
  EXPECT_FALSE(opt.state(1).exp_avg.defined());
  const StateDict state = opt.state_dict();
  EXPECT_TRUE(state.contains("state.0.step"));
  EXPECT_FALSE(state.contains("state.1.step"));
}

template <typename Fn>
void expect_invalid(Fn fn, std::initializer_list<std::string> fragments) {
  try {
    fn();
    ADD_FAILURE() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    for (const std::string& f : fragments) {
      EXPECT_NE(std::string(e.what()).find(f), std::string::npos)
          << "message '" << e.what() << "' lacks '" << f << "'";
    }
  }
}

TEST(AdamTest, RejectsBadHyperParameters_NamingValueAndExpectation) {
  std::vector<Tensor> p = {zeros({2}).set_requires_grad(true)};
  expect_invalid([&] { Adam(p, {.lr = -0.1}); }, {"Adam: invalid learning rate -0.1", ">= 0"});
  expect_invalid(
      [&] {
        AdamW(p, {.betas = {1.0, 0.999}});
      },
      {"AdamW: invalid beta1 1", "0 <= beta1 < 1"});
  expect_invalid([&] { Adam(p, {.betas = {0.9, -0.5}}); }, {"beta2 -0.5"});
  expect_invalid([&] { Adam(p, {.eps = -1e-8}); }, {"eps -1e-08", ">= 0"});
  expect_invalid([&] { AdamW(p, {.weight_decay = -1}); }, {"weight_decay -1"});
  expect_invalid(
      [&] {
        Adam({ParamGroup{.params = p, .options = {{"beta3", 0.5}}}}, {});
      },
      {"unknown option 'beta3'", "beta1, beta2, eps, amsgrad"});
  expect_invalid(
      [&] {
        Adam({ParamGroup{.params = p, .options = {{"amsgrad", 2}}}}, {});
      },
      {"amsgrad 2", "0 or 1"});
  expect_invalid([&] { Adam({ParamGroup{.params = p, .momentum = 0.9}}, {}); }, {"momentum"});
  expect_invalid(
      [&] {
        Adam({ParamGroup{.params = p}, ParamGroup{.params = p}}, {});
      },
      {"group 1", "another group"});
  expect_invalid([&] { Adam(std::vector<Tensor>{}, {}); }, {"no parameters"});
}

TEST(AdamTest, LoadStateDict_RejectsMismatches) {
  Tensor a = ones({2}).set_requires_grad(true);
  Adam opt({a}, AdamOptions{.lr = 0.1});
  a.set_grad(ones({2}));
  opt.step();
  const StateDict saved = opt.state_dict();

  Tensor b = ones({3}).set_requires_grad(true);
  Adam other({b}, AdamOptions{});
  expect_invalid([&] { other.load_state_dict(saved); }, {"state.0.exp_avg", "[2]", "[3]"});
  EXPECT_EQ(other.state(0).step, 0);  // unchanged

  // amsgrad needs max_exp_avg_sq for stepped parameters.
  Tensor c = ones({2}).set_requires_grad(true);
  Adam ams({c}, AdamOptions{.amsgrad = true});
  StateDict without_ams = saved;
  without_ams.set("param_groups.0.options.amsgrad", 1.0);
  expect_invalid([&] { ams.load_state_dict(without_ams); }, {"state.0.max_exp_avg_sq", "missing"});

  Adam two({ParamGroup{.params = {ones({2}).set_requires_grad(true)}},
            ParamGroup{.params = {ones({2}).set_requires_grad(true)}}},
           AdamOptions{});
  expect_invalid([&] { two.load_state_dict(saved); }, {"1 parameter groups", "this optimizer 2"});
}

// ---- a small model of the new layers, trained with AdamW + clip_grad_norm_ ----

// generate_nn_optim.py's TinyTokenModel (no bias in front of the BatchNorm: its gradient is zero
// up to rounding, which Adam turns into full steps of arbitrary sign).
class TinyTokenModel : public nn::Module {
 public:
  TinyTokenModel() : Module("TinyTokenModel") {
    emb_ = register_module("emb", std::make_shared<nn::Embedding>(11, 6));
    norm_ = register_module("norm", std::make_shared<nn::LayerNorm>(std::vector<int64_t>{6}));
    blocks_ = register_module("blocks", std::make_shared<nn::ModuleList>());
    blocks_->push_back(std::make_shared<nn::Linear>(6, 8));
    blocks_->push_back(std::make_shared<nn::Linear>(8, 5));
    head_ = register_module("head", std::make_shared<nn::Linear>(5, 3, /*bias=*/false));
    bn_ = register_module("bn", std::make_shared<nn::BatchNorm1d>(3));
  }
  Tensor forward(const Tensor& idx) override {
    Tensor h = norm_->forward(emb_->forward(idx));
    h = gelu((*blocks_)[0]->forward(h), "tanh");
    h = silu((*blocks_)[1]->forward(h));
    return bn_->forward(head_->forward(mean(h, 1)));
  }

 private:
  std::shared_ptr<nn::Embedding> emb_;
  std::shared_ptr<nn::LayerNorm> norm_;
  std::shared_ptr<nn::ModuleList> blocks_;
  std::shared_ptr<nn::Linear> head_;
  std::shared_ptr<nn::BatchNorm1d> bn_;
};

TEST(AdamWTest, ProducesPyTorchValues_TokenModelWithClipping) {
  golden::File f("token_model_adamw");
  TinyTokenModel model;
  model.load_state_dict(prefixed(f, "init."));  // strict: the names match torch's
  AdamW opt(model.parameters(), AdamWOptions{.lr = 1e-2, .weight_decay = 0.05});
  for (int step = 0; step < 8; ++step) {
    const std::string s = std::to_string(step);
    opt.zero_grad();
    Tensor loss = nn::cross_entropy(model.forward(f.tensor("x" + s)), f.targets("t" + s),
                                    {.ignore_index = 0, .label_smoothing = 0.1});
    loss.backward();
    const double norm = nn::utils::clip_grad_norm_(model.parameters(), 1.0);
    opt.step();
    expect_close(loss, f.tensor("loss" + s), "loss at step " + s);
    EXPECT_NEAR(norm, f.scalar("norm" + s), 1e-4 * f.scalar("norm" + s)) << "norm at step " << s;
  }
  for (const auto& [name, expected] : prefixed(f, "final.")) {
    expect_close(nn::find_tensor(model.state_dict(), name), expected, "final " + name);
  }
}

}  // namespace
}  // namespace hsgd::optim
