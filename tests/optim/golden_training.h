#pragma once
// The optimizer tests' golden runs (sgd_test, adam_test): the model generate.py trains, the
// "init." / "final." entries of a golden file, and a run of its recorded steps with each step's
// loss compared to torch's.
//
// Usage:
//   check_golden("sgd_mlp_plain", make_mlp(), [](nn::Sequential& net) {
//     return std::make_unique<optim::SGD>(net.parameters(), optim::SGDOptions{.lr = 0.1});
//   });

#include <functional>
#include <memory>
#include <string>

#include "framework/nn/nn.h"
#include "framework/train/optimizer.h"
#include "tests/golden/golden.h"

namespace hsgd::testing {

// generate.py's mlp(): Linear(6,8)-ReLU-Linear(8,5)-ReLU-Linear(5,3).
inline std::shared_ptr<nn::Sequential> make_mlp() {
  auto net = std::make_shared<nn::Sequential>();
  net->push_back(std::make_shared<nn::Linear>(6, 8));
  net->push_back(std::make_shared<nn::ReLU>());
  net->push_back(std::make_shared<nn::Linear>(8, 5));
  net->push_back(std::make_shared<nn::ReLU>());
  net->push_back(std::make_shared<nn::Linear>(5, 3));
  return net;
}

// The entries of f whose key starts with prefix, without it ("init.0.weight" -> "0.weight").
inline nn::NamedTensors prefixed(const golden::File& f, const std::string& prefix) {
  nn::NamedTensors out;
  for (const std::string& key : f.keys()) {
    if (key.rfind(prefix, 0) == 0) out.emplace_back(key.substr(prefix.size()), f.tensor(key));
  }
  return out;
}

// Runs the recorded steps [first, last) as generate.py did (inputs "x<step>", targets
// "t<step>"), comparing each loss with "loss<step>".
inline void run_steps(nn::Module& net, Optimizer& opt, const golden::File& f, int first, int last) {
  for (int step = first; step < last; ++step) {
    const std::string s = std::to_string(step);
    opt.zero_grad();
    Tensor loss = nn::cross_entropy(net.forward(f.tensor("x" + s)), f.targets("t" + s));
    loss.backward();
    opt.step();
    golden::expect_close(loss, f.tensor("loss" + s), "loss at step " + s);
  }
}

// The model's tensors equal the file's "final." entries.
inline void expect_final(nn::Module& net, const golden::File& f) {
  for (const auto& [name, expected] : prefixed(f, "final.")) {
    golden::expect_close(nn::find_tensor(net.state_dict(), name), expected, "final " + name);
  }
}

using MakeOptimizer = std::function<std::unique_ptr<Optimizer>(nn::Sequential&)>;

// Loads "init.", runs the 10 recorded steps with the optimizer make builds, checks "final.".
inline void check_golden(const std::string& file, const std::shared_ptr<nn::Sequential>& net,
                         const MakeOptimizer& make) {
  golden::File f(file);
  net->load_state_dict(prefixed(f, "init."));
  std::unique_ptr<Optimizer> opt = make(*net);
  run_steps(*net, *opt, f, 0, 10);
  expect_final(*net, f);
}

}  // namespace hsgd::testing
