// train_resnet: trains a CIFAR-style ResNet (ResNet-20/32/56, ResNet-18; --model) on
// Fashion-MNIST (1x28x28, the default), CIFAR-10 (3x32x32) or a synthetic data set, in one
// process or data-parallel under hsgd-run (--mode ddp | local-sgd | hierarchical, as train_mlp;
// BatchNorm statistics are averaged with the parameters). The model is built for the data set's
// input shape (1 or 3 input channels). Prints, per epoch, the mean training loss and accuracy,
// the test loss and accuracy (of the average of the replicas), the time taken and the training
// throughput (apps/common/training_run.h), with a progress line and --metrics-out records.
//
//   train_resnet --epochs 30                       # ResNet-20 on Fashion-MNIST (Debian's files)
//   train_resnet --dataset cifar10 --data-dir ~/cifar-10-batches-bin --epochs 160
//   train_resnet --model resnet18 --dataset cifar10 --data-dir DIR --weight-decay 5e-4
//   train_resnet --synthetic --epochs 1 --max-steps 20            # no data files needed
//   train_resnet --train-subset 2000 --max-steps 40                # a quick real-data check
//   hsgd-run --nproc-per-node 4 -- train_resnet --mode hierarchical
//       --hierarchy 2:2,8:4 --subgroup-size 1 --warmup-steps 200   (one command line)
//
// Data: --dataset fashion-mnist reads --data-dir (default /usr/share/datasets/fashion-mnist);
// --dataset cifar10 reads the CIFAR-10 binary files in --data-dir. Without --dataset, a given
// --data-dir means CIFAR-10 (as before Fashion-MNIST was supported), else Fashion-MNIST.
// Augmentation of the training set (off with --no-augment): padding (4 pixels for 32x32, 2 for
// 28x28) + random crop back to the image size + horizontal flip, drawn per (seed, epoch, example)
// (data::RandomCropFlip), so a resumed run sees the same images as an uninterrupted one.
//
// Defaults: batch 128 per rank, lr 0.1, momentum 0.9, cosine schedule, weight decay 1e-4 (5e-4
// for resnet18 unless --weight-decay is given).
// --optimizer adamw trains with AdamW (--lr, decoupled --weight-decay, --beta1/--beta2/--eps)
// instead of SGD; give it its own --lr (around 1e-3).
//
// Exit code 0 on success, 1 on a bad flag value or unreadable data (the message names it), 2 on
// a --mode/--hierarchy setting the job cannot use.

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "apps/common/checkpointing.h"
#include "apps/common/parallel_training.h"
#include "apps/common/run_main.h"
#include "apps/common/training_flags.h"
#include "apps/common/training_run.h"
#include "comm/error.h"
#include "framework/data/cifar10.h"
#include "framework/data/data_loader.h"
#include "framework/data/fashion_mnist.h"
#include "framework/data/subset.h"
#include "framework/data/synthetic_dataset.h"
#include "framework/data/transforms.h"
#include "models/registry.h"

namespace {

using namespace hsgd;

constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

struct Flags {
  std::string model = "resnet20";
  std::string dataset;  // fashion-mnist | cifar10; empty: cifar10 when --data-dir is given
  std::string data_dir;
  bool synthetic = false;
  bool no_augment = false;
  apps::TrainingFlags training{.batch_size = 128, .lr = 0.1, .weight_decay = 1e-4};
  apps::ParallelFlags parallel;
  apps::CheckpointFlags checkpoint;
};

struct Data {
  std::string name;
  std::shared_ptr<const data::Dataset> train, test;
  data::BatchTransform augment;  // empty: none
};

Data load_data(const Flags& flags) {
  const uint64_t seed = flags.training.seed;
  Data out;
  if (flags.synthetic) {
    data::SyntheticOptions options{
        .size = 2048, .example_shape = {3, 32, 32}, .num_classes = 10, .noise = 4.0f, .seed = seed};
    out.name = "synthetic data";
    out.train = std::make_shared<data::SyntheticDataset>(options);
    options.size = 512;  // same seed: the same class centroids
    out.test = std::make_shared<data::SyntheticDataset>(options);
  } else if (flags.dataset == "cifar10") {
    HSGD_CHECK(!flags.data_dir.empty(),
               "--dataset cifar10 needs --data-dir (the CIFAR-10 binary files)");
    const data::CIFAR10Options options;  // normalised with the CIFAR-10 mean and std
    out.name = "CIFAR-10 " + flags.data_dir;
    out.train =
        std::make_shared<data::CIFAR10>(flags.data_dir, data::CIFAR10::Split::kTrain, options);
    out.test =
        std::make_shared<data::CIFAR10>(flags.data_dir, data::CIFAR10::Split::kTest, options);
    // torchvision's RandomCrop(32, padding=4) + RandomHorizontalFlip: black padding, normalised.
    std::vector<float> black;
    for (size_t c = 0; c < 3; ++c) black.push_back(-options.mean[c] / options.std[c]);
    out.augment = data::RandomCropFlip({.padding = 4, .fill = black, .seed = seed});
  } else {
    const std::string dir = flags.data_dir.empty() ? kFashionMnistDir : flags.data_dir;
    const data::FashionMNISTOptions options{.normalize = true};
    out.name = "Fashion-MNIST " + dir;
    out.train =
        std::make_shared<data::FashionMNIST>(dir, data::FashionMNIST::Split::kTrain, options);
    out.test = std::make_shared<data::FashionMNIST>(dir, data::FashionMNIST::Split::kTest, options);
    // Pad 2 pixels of black (normalised), crop back to 28x28, flip left-right.
    out.augment =
        data::RandomCropFlip({.padding = 2, .fill = {-options.mean / options.std}, .seed = seed});
  }
  if (flags.no_augment) out.augment = nullptr;
  if (flags.training.train_subset > 0) {
    out.train = data::first_n(out.train, flags.training.train_subset);
  }
  return out;
}

int run(Flags flags) {
  const apps::TrainingFlags& training = flags.training;
  apps::check_training_flags(training);
  apps::apply_thread_flag(training);
  if (flags.dataset.empty()) flags.dataset = flags.data_dir.empty() ? "fashion-mnist" : "cifar10";
  const Data data = load_data(flags);
  auto model = models::make_model(
      flags.model,
      {.num_classes = 10, .input_shape = data.train->example_shape(), .seed = training.seed});
  int64_t num_params = 0;
  for (const Tensor& p : model->parameters()) num_params += p.numel();
  return apps::train_and_report(
      training, flags.parallel, flags.checkpoint,
      {.program = "train_resnet",
       .model = model,
       .average_buffers = model->buffers(),
       .train = data.train,
       .test = data.test,
       .loader = {.batch_size = training.batch_size,
                  .shuffle = true,
                  .seed = training.seed,
                  .drop_last = true,
                  .transform = data.augment,
                  .prefetch = training.prefetch},
       .model_name = flags.model,
       .print_header = [&](const runtime::GenerationEvent& e) {
         const Shape shape = data.train->example_shape();
         std::printf(
             "train_resnet: %s (%lld parameters, input %s), %s: %lld train / %lld test examples, "
             "batch %lld, lr %g, %s, %s lr%s\n",
             flags.model.c_str(), static_cast<long long>(num_params), shape_str(shape).c_str(),
             data.name.c_str(), static_cast<long long>(data.train->size()),
             static_cast<long long>(data.test->size()), static_cast<long long>(training.batch_size),
             training.lr, apps::describe_optimizer(training).c_str(), training.schedule.c_str(),
             data.augment ? ", crop + flip augmentation" : "");
         if (e.world_size > 1 || flags.parallel.mode != "ddp") {
           std::printf("train_resnet: %s, batch %lld per rank, %lld batches per rank per epoch\n",
                       apps::describe_parallel(flags.parallel, e.world_size, *e.parallel).c_str(),
                       static_cast<long long>(training.batch_size),
                       static_cast<long long>(e.batches_per_epoch));
         }
       }});
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  CLI::App app{
      "Train a ResNet on Fashion-MNIST or CIFAR-10, in one process or data-parallel under "
      "hsgd-run (DDP, post-local SGD, hierarchical model averaging)."};
  app.add_option("--model", flags.model, "mlp, resnet20, resnet32, resnet56 or resnet18")
      ->capture_default_str();
  app.add_option("--dataset", flags.dataset,
                 "fashion-mnist or cifar10 (default: cifar10 when --data-dir is given, else "
                 "fashion-mnist)")
      ->check(CLI::IsMember({"fashion-mnist", "cifar10"}));
  app.add_option("--data-dir", flags.data_dir,
                 "Directory with the data set's files (Fashion-MNIST: default " +
                     std::string(kFashionMnistDir) +
                     "; CIFAR-10: data_batch_1.bin ... test_batch.bin)");
  app.add_flag("--synthetic", flags.synthetic,
               "Use a synthetic data set (3x32x32) instead of files");
  app.add_flag("--no-augment", flags.no_augment, "No random crop / flip of the training images");
  apps::add_training_flags(app, flags.training);
  apps::add_parallel_flags(app, flags.parallel);
  apps::add_checkpoint_flags(app, flags.checkpoint);
  return apps::run_main(app, argc, argv, "train_resnet", [&] { return run(flags); });
}
