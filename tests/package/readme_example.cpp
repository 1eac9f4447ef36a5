// The program shown in README.md ("A complete program"): DDP with the post-local SGD hook and a
// HierarchicalModelAverager. Built by the package test against the exported build tree (so it
// links), and compiled by check_doc_examples from the README itself; keep the two identical.
// Run it under hsgd-run: hsgd-run --nproc-per-node 4 -- readme_example. The ctest
// package_readme_example runs it as one process (no launcher variables: a world of 1).
#include <iostream>

#include "hsgd.h"
using namespace hsgd;
using namespace hsgd::distributed;

struct Net : nn::Module {  // any model: the same parameters in the same order on every rank
  std::shared_ptr<nn::Linear> fc1 = register_module("fc1", std::make_shared<nn::Linear>(784, 256));
  std::shared_ptr<nn::Linear> fc2 = register_module("fc2", std::make_shared<nn::Linear>(256, 10));
  Tensor forward(const Tensor& x) override {
    return fc2->forward(relu(fc1->forward(x.flatten(1))));
  }
};

int main() {
  auto world = comm::init_process_group(comm::InitOptions::from_env());  // ranks from hsgd-run
  auto model = std::make_shared<Net>();
  DistributedDataParallel ddp(model, world);  // every rank starts from rank 0's weights
  // Gradients are averaged over all ranks for 100 steps, then only within each node ...
  ddp.register_comm_hook(std::make_shared<PostLocalSGDState>(
                             PostLocalSGDState{.process_group = world, .start_localSGD_iter = 100}),
                         post_localSGD_hook);
  // ... and the models within each node every 2 steps, over all ranks every 16 (after step 100).
  auto averager = std::make_shared<HierarchicalModelAverager>(
      std::vector<std::pair<int64_t, int>>{{2, kNodeGroup}, {16, kWholeGroup}}, 100, world);
  optim::PostLocalSGDOptimizer opt(
      std::make_shared<optim::AdamW>(model->parameters(),
                                     optim::AdamWOptions{.lr = 1e-3, .weight_decay = 1e-2}),
      averager);
  auto train = std::make_shared<data::FashionMNIST>("/usr/share/datasets/fashion-mnist",
                                                    data::FashionMNIST::Split::kTrain);
  data::DataLoader loader(
      train,
      {.batch_size = 64, .shuffle = true, .rank = world->rank(), .world_size = world->size()});
  for (const data::Batch& batch : loader) {
    opt.zero_grad();
    Tensor loss = nn::cross_entropy(ddp.forward(batch.inputs), batch.targets);
    loss.backward();
    nn::utils::clip_grad_norm_(model->parameters(), /*max_norm=*/1.0);
    opt.step();  // the AdamW step, then the averager
    if (world->rank() == 0 && averager->step() % 100 == 0) std::cout << loss.item() << std::endl;
  }
  world->shutdown();
}
