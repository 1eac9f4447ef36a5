// The training program shown in README.md ("A training program"), compiled by the package
// test so the README cannot drift from the API. Run with a directory to train one epoch.
#include <iostream>

#include "hsgd.h"  // umbrella header for applications

using namespace hsgd;

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "/usr/share/datasets/fashion-mnist";
  auto model = std::make_shared<models::MLP>(models::MLPOptions{.sizes = {784, 512, 256, 10}});
  optim::SGD sgd(model->parameters(), optim::SGDOptions{.lr = 0.05, .momentum = 0.9});
  auto train = std::make_shared<data::FashionMNIST>(dir, data::FashionMNIST::Split::kTrain);
  data::DataLoader loader(train, {.batch_size = 64, .shuffle = true, .seed = 0});
  for (const data::Batch& batch : loader) {
    sgd.zero_grad();
    Tensor loss = nn::cross_entropy(model->forward(batch.inputs), batch.targets);
    loss.backward();
    sgd.step();
  }
  std::cout << "trained one epoch\n";
}
