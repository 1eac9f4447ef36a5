// docs/elastic.md, "Your own program" (tests/package/elastic_example_test.sh checks that the two
// are the same): the README's program made elastic and durable with runtime::Runtime.
#include <iostream>

#include "hsgd.h"
using namespace hsgd;

struct Net : nn::Module {
  std::shared_ptr<nn::Linear> fc1 = register_module("fc1", std::make_shared<nn::Linear>(784, 256));
  std::shared_ptr<nn::Linear> fc2 = register_module("fc2", std::make_shared<nn::Linear>(256, 10));
  Tensor forward(const Tensor& x) override {
    return fc2->forward(relu(fc1->forward(x.flatten(1))));
  }
};

int main() {
  runtime::install_preemption_signals();  // SIGUSR1/SIGTERM: checkpoint, then exit 75
  auto model = std::make_shared<Net>();
  runtime::Runtime rt(
      {.parallel = {.mode = runtime::Mode::kHierarchical,
                    .levels = distributed::parse_hierarchy("2:node,16:world"),
                    .warmup_steps = 100},
       .loader = {.batch_size = 64, .shuffle = true},
       .checkpoint = {.dir = "ckpt", .every = 200}});
  rt.register_model(model);
  rt.register_optimizer(std::make_shared<optim::AdamW>(
      model->parameters(), optim::AdamWOptions{.lr = 1e-3, .weight_decay = 1e-2}));
  auto train = std::make_shared<data::FashionMNIST>("/usr/share/datasets/fashion-mnist",
                                                    data::FashionMNIST::Split::kTrain);
  const runtime::RunResult result =
      rt.run(train, [&](runtime::StepContext& step, const data::Batch& batch) {
        Tensor loss = nn::cross_entropy(step.forward(batch.inputs), batch.targets);
        loss.backward();
        nn::utils::clip_grad_norm_(model->parameters(), /*max_norm=*/1.0);
        if (step.world().rank() == 0 && step.step() % 100 == 0) std::cout << loss.item() << "\n";
        return loss;
      });
  if (result.preempted) return 75;  // resumed from ckpt/ by the next start
  std::cout << "replica hash " << result.replica_hash << " at step " << result.step << "\n";
}
