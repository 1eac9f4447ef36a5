// train_resnet: trains a ResNet (or any model of models::make_model) on CIFAR-10 binary files, or
// on a synthetic data set of 3x32x32 images, in one process or data-parallel under hsgd-run
// (--mode ddp | local-sgd | hierarchical, as train_mlp; BatchNorm statistics are averaged with
// the parameters). Prints, per epoch, the mean training loss and accuracy, the test loss and
// accuracy (of the average of the replicas), the time taken and the training throughput.
//
//   train_resnet --data-dir ~/cifar-10-batches-bin --epochs 160 --cosine   # ResNet-20 recipe
//   train_resnet --model resnet18 --data-dir DIR --weight-decay 5e-4
//   train_resnet --synthetic --epochs 1 --max-steps 20                    # no data files needed
//   hsgd-run --nproc-per-node 4 -- train_resnet --data-dir DIR --mode hierarchical
//       --hierarchy 2:2,8:4 --subgroup-size 1 --warmup-steps 200   (one command line)
//
// Exit code 0 on success, 1 on a bad flag value or unreadable data (the message names it), 2 on
// a --mode/--hierarchy setting the job cannot use.

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "apps/common/checkpointing.h"
#include "apps/common/parallel_training.h"
#include "comm/error.h"
#include "comm/init.h"
#include "comm/progress.h"
#include "framework/data/cifar10.h"
#include "framework/data/data_loader.h"
#include "framework/data/synthetic_dataset.h"
#include "framework/nn/functional.h"
#include "framework/tensor/grad_mode.h"
#include "models/registry.h"
#include "optim/lr_scheduler.h"
#include "optim/sgd.h"

namespace {

using namespace hsgd;
using Clock = std::chrono::steady_clock;

struct Flags {
  std::string model = "resnet20";
  std::string data_dir;
  bool synthetic = false;
  int64_t epochs = 1;
  int64_t batch_size = 128;
  double lr = 0.1;
  double momentum = 0.9;
  double weight_decay = -1;  // < 0: 1e-4 for the CIFAR ResNets (He et al.), 5e-4 otherwise
  bool nesterov = false;
  bool cosine = false;
  bool no_augment = false;
  uint64_t seed = 0;
  int64_t max_steps = 0;  // 0: no limit
  int64_t max_eval = 0;   // test examples evaluated per epoch, 0: all
  int64_t log_every = 0;
  apps::ParallelFlags parallel;
  apps::CheckpointFlags checkpoint;
};

struct Data {
  std::shared_ptr<const data::Dataset> train, test;
};

Data load_data(const Flags& flags) {
  if (flags.synthetic) {
    data::SyntheticOptions options{.size = 2048,
                                   .example_shape = {3, 32, 32},
                                   .num_classes = 10,
                                   .noise = 4.0f,
                                   .seed = flags.seed};
    auto train = std::make_shared<data::SyntheticDataset>(options);
    options.size = 512;  // same seed: the same class centroids
    return {train, std::make_shared<data::SyntheticDataset>(options)};
  }
  HSGD_CHECK(!flags.data_dir.empty(),
             "--data-dir (the CIFAR-10 binary files) or --synthetic is "
             "required");
  return {std::make_shared<data::CIFAR10>(
              flags.data_dir, data::CIFAR10::Split::kTrain,
              data::CIFAR10Options{.augment = !flags.no_augment, .seed = flags.seed}),
          std::make_shared<data::CIFAR10>(flags.data_dir, data::CIFAR10::Split::kTest)};
}

struct Eval {
  double loss = 0, accuracy = 0;
};

Eval evaluate(nn::Module& model, const data::Dataset& test, int64_t max_examples) {
  NoGradGuard no_grad;
  model.eval();
  data::DataLoader loader(std::shared_ptr<const data::Dataset>(&test, [](const data::Dataset*) {}),
                          {.batch_size = 500});
  const int64_t limit = max_examples > 0 ? std::min(max_examples, test.size()) : test.size();
  Eval out;
  int64_t seen = 0;
  for (int64_t i = 0; i < loader.num_batches() && seen < limit; ++i) {
    data::Batch batch = loader.batch(i);
    const int64_t n = std::min<int64_t>(static_cast<int64_t>(batch.targets.size()), limit - seen);
    if (n < static_cast<int64_t>(batch.targets.size())) {
      batch.inputs = batch.inputs.narrow(0, 0, n);
      batch.targets.resize(static_cast<size_t>(n));
    }
    const Tensor logits = model.forward(batch.inputs);
    out.loss += nn::cross_entropy(logits, batch.targets).item() * static_cast<double>(n);
    out.accuracy += nn::accuracy(logits, batch.targets) * static_cast<double>(n);
    seen += n;
  }
  model.train();
  if (seen > 0) {
    out.loss /= static_cast<double>(seen);
    out.accuracy /= static_cast<double>(seen);
  }
  return out;
}

int run(Flags flags) {
  HSGD_CHECK(flags.epochs >= 1, "--epochs ", flags.epochs, " must be at least 1");
  HSGD_CHECK(flags.max_steps >= 0, "--max-steps ", flags.max_steps, " must not be negative");
  if (flags.weight_decay < 0) flags.weight_decay = flags.model == "resnet18" ? 5e-4 : 1e-4;
  const comm::InitOptions init = comm::InitOptions::from_env();
  const std::shared_ptr<comm::ProcessGroup> world = comm::init_process_group(init);
  const int world_size = world->size();
  const bool lead = world->rank() == 0;
  const Data data = load_data(flags);
  auto model = models::make_model(
      flags.model,
      {.num_classes = 10, .input_shape = data.train->example_shape(), .seed = flags.seed});
  int64_t num_params = 0;
  for (const Tensor& p : model->parameters()) num_params += p.numel();

  const apps::Parallel parallel =
      apps::make_parallel(model, world, flags.parallel, model->buffers());
  const std::shared_ptr<Optimizer> optimizer_ptr = parallel.wrap(std::make_shared<optim::SGD>(
      model->parameters(), optim::SGDOptions{.lr = flags.lr,
                                             .momentum = flags.momentum,
                                             .weight_decay = flags.weight_decay,
                                             .nesterov = flags.nesterov}));
  Optimizer& optimizer = *optimizer_ptr;
  data::DataLoader loader(data.train, {.batch_size = flags.batch_size,
                                       .shuffle = true,
                                       .seed = flags.seed,
                                       .drop_last = true,
                                       .rank = world->rank(),
                                       .world_size = world_size});
  int64_t total_steps = flags.epochs * loader.num_batches();
  if (flags.max_steps > 0) total_steps = std::min(total_steps, flags.max_steps);
  std::unique_ptr<optim::LRScheduler> scheduler;
  if (flags.cosine) {
    scheduler = std::make_unique<optim::CosineAnnealingLR>(
        optimizer, optim::CosineAnnealingLROptions{.t_max = total_steps});
  }

  if (lead) {
    std::printf(
        "train_resnet: %s (%lld parameters), %s: %lld train / %lld test examples, batch "
        "%lld, lr %g, momentum %g, weight decay %g%s\n",
        flags.model.c_str(), static_cast<long long>(num_params),
        flags.synthetic ? "synthetic data" : flags.data_dir.c_str(),
        static_cast<long long>(data.train->size()), static_cast<long long>(data.test->size()),
        static_cast<long long>(flags.batch_size), flags.lr, flags.momentum, flags.weight_decay,
        flags.cosine ? ", cosine schedule" : "");
    if (world_size > 1 || flags.parallel.mode != "ddp") {
      std::printf("train_resnet: %s, batch %lld per rank, %lld batches per rank per epoch\n",
                  parallel.describe(world_size, flags.parallel).c_str(),
                  static_cast<long long>(flags.batch_size),
                  static_cast<long long>(loader.num_batches()));
    }
  }
  // The replicas' parameters and BatchNorm statistics, averaged for each evaluation.
  std::vector<Tensor> state = model->parameters();
  for (const Tensor& b : model->buffers()) state.push_back(b);
  apps::RunCheckpoints checkpoints(flags.checkpoint, world,
                                   {.mode = flags.parallel.mode,
                                    .hierarchy = flags.parallel.hierarchy,
                                    .model = flags.model,
                                    .local_world_size = init.local_world_size},
                                   {.model = model,
                                    .optimizer = optimizer_ptr,
                                    .scheduler = scheduler.get(),
                                    .loader = &loader,
                                    .parallel = &parallel,
                                    .warmup_steps = flags.parallel.warmup_steps});
  // Steps trained so far: 0, or the step of the checkpoint resumed from (a checkpoint taken at
  // the end of an epoch resumes at the start of the next).
  int64_t step = checkpoints.resume();
  int64_t first_epoch = 0;
  if (step > 0) {
    first_epoch = loader.epoch();
    if (loader.position() >= loader.num_batches()) ++first_epoch;
  }
  if (lead) {
    std::printf("%5s %7s %10s %9s %10s %9s %8s %9s\n", "epoch", "steps", "train_loss", "train_acc",
                "test_loss", "test_acc", "time_s", "images/s");
  }
  Eval eval;
  if (first_epoch >= flags.epochs || step >= total_steps) {  // nothing left to train
    apps::with_average(state, *world, /*keep=*/true, [&] {
      if (lead) eval = evaluate(*model, *data.test, flags.max_eval);
    });
  }
  for (int64_t epoch = first_epoch; epoch < flags.epochs && step < total_steps; ++epoch) {
    loader.set_epoch(epoch);
    const auto start = Clock::now();
    double loss_sum = 0, correct = 0, train_seconds = 0;
    int64_t images = 0, steps = 0;
    for (const data::Batch& batch : loader) {
      if (step >= total_steps) break;
      const auto step_start = Clock::now();
      optimizer.zero_grad();
      const Tensor logits = parallel.forward(*model, batch.inputs);
      Tensor loss = nn::cross_entropy(logits, batch.targets);
      loss.backward();
      optimizer.step();
      if (scheduler) scheduler->step();
      train_seconds += std::chrono::duration<double>(Clock::now() - step_start).count();
      const auto n = static_cast<int64_t>(batch.targets.size());
      loss_sum += loss.item() * static_cast<double>(n);
      correct += nn::accuracy(logits, batch.targets) * static_cast<double>(n);
      images += n;
      ++step;
      ++steps;
      comm::report_progress(step);  // hsgd-run's hang detection and lost-step count
      checkpoints.after_step(step, loader.position() == loader.num_batches());
      if (lead && flags.log_every > 0 && step % flags.log_every == 0) {
        std::printf("  step %lld loss %.4f\n", static_cast<long long>(step), loss.item());
        std::fflush(stdout);
      }
    }
    // Sums over ranks: every rank ran the same number of steps on its shard.
    std::vector<double> sums{loss_sum, correct, static_cast<double>(images), train_seconds};
    if (world_size > 1) world->allreduce(std::span<double>(sums))->wait();
    loss_sum = sums[0];
    correct = sums[1];
    images = static_cast<int64_t>(sums[2]);
    train_seconds = sums[3] / world_size;  // images/s of the whole job
    const bool last = epoch + 1 == flags.epochs || step >= total_steps;
    apps::with_average(state, *world, /*keep=*/last, [&] {
      if (lead) eval = evaluate(*model, *data.test, flags.max_eval);
    });
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    const double denom = images > 0 ? static_cast<double>(images) : 1.0;
    if (lead)
      std::printf("%5lld %7lld %10.4f %8.2f%% %10.4f %8.2f%% %8.2f %9.1f\n",
                  static_cast<long long>(epoch + 1), static_cast<long long>(steps),
                  loss_sum / denom, 100 * correct / denom, eval.loss, 100 * eval.accuracy, seconds,
                  train_seconds > 0 ? static_cast<double>(images) / train_seconds : 0.0);
    std::fflush(stdout);
  }
  checkpoints.finish();
  if (lead) {
    std::printf("final test accuracy: %.2f%%\n", 100 * eval.accuracy);
    if (parallel.averager) apps::print_averaging_stats(*parallel.averager);
    std::fflush(stdout);
  }
  // No rank leaves while a peer may still have a collective in flight.
  world->shutdown();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  CLI::App app{
      "Train a ResNet on CIFAR-10, in one process or data-parallel under hsgd-run (DDP, "
      "post-local SGD, hierarchical model averaging)."};
  app.add_option("--model", flags.model, "mlp, resnet20, resnet32, resnet56 or resnet18")
      ->capture_default_str();
  app.add_option("--data-dir", flags.data_dir,
                 "Directory with the CIFAR-10 binary files (data_batch_1.bin ... test_batch.bin)");
  app.add_flag("--synthetic", flags.synthetic, "Use a synthetic data set instead of files");
  app.add_option("--epochs", flags.epochs, "Number of epochs")->capture_default_str();
  app.add_option("--batch-size", flags.batch_size, "Examples per batch")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--lr", flags.lr, "Learning rate")->capture_default_str();
  app.add_option("--momentum", flags.momentum, "SGD momentum")->capture_default_str();
  app.add_option("--weight-decay", flags.weight_decay,
                 "L2 weight decay (default 1e-4, 5e-4 for resnet18)");
  app.add_flag("--nesterov", flags.nesterov, "Nesterov momentum");
  app.add_flag("--cosine", flags.cosine, "Cosine-anneal the learning rate to 0 over the run");
  app.add_flag("--no-augment", flags.no_augment, "No random crop / flip of CIFAR-10 images");
  app.add_option("--seed", flags.seed, "Seed of the initialisation, shuffle and augmentation")
      ->capture_default_str();
  app.add_option("--max-steps", flags.max_steps, "Stop after this many steps (0: no limit)");
  app.add_option("--max-eval", flags.max_eval, "Test examples per evaluation (0: all)");
  app.add_option("--log-every", flags.log_every, "Print the loss every N steps (0: never)");
  apps::add_parallel_flags(app, flags.parallel);
  apps::add_checkpoint_flags(app, flags.checkpoint);
  CLI11_PARSE(app, argc, argv);
  // One line at a time even into a pipe (hsgd-run, CI): a killed worker loses no output.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  try {
    return run(flags);
  } catch (const apps::BadFlag& e) {
    std::fprintf(stderr, "train_resnet: error: %s\n", e.what());
    return 2;
  } catch (const hsgd::Error& e) {
    std::fprintf(stderr, "train_resnet: error: %s\n", e.what());
    return 1;
  }
}
