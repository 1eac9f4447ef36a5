#include "apps/common/training_flags.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <utility>

#include "apps/common/parallel_training.h"
#include "comm/error.h"
#include "framework/parallel/parallel.h"

namespace hsgd::apps {

void add_training_flags(CLI::App& app, TrainingFlags& flags) {
  app.add_option("--epochs", flags.epochs, "Number of epochs")->capture_default_str();
  app.add_option("--threads", flags.threads,
                 "Intra-op threads of this process (kernels and BLAS); 0: HSGD_NUM_THREADS, else "
                 "OMP_NUM_THREADS, else all cores (hsgd-run sets 1 per worker when a node runs "
                 "several)")
      ->capture_default_str();
  app.add_option("--batch-size", flags.batch_size, "Examples per batch and rank")
      ->capture_default_str();
  app.add_option("--lr", flags.lr, "Learning rate")->capture_default_str();
  app.add_option(
         "--optimizer", flags.optimizer,
         "sgd (torch.optim.SGD: --momentum, --nesterov, L2 --weight-decay) or adamw "
         "(torch.optim.AdamW: --beta1, --beta2, --eps, decoupled --weight-decay; it usually "
         "wants a far smaller --lr, around 1e-3)")
      ->capture_default_str()
      ->check(CLI::IsMember({"sgd", "adamw"}));
  app.add_option("--momentum", flags.momentum, "SGD momentum (--optimizer sgd)")
      ->capture_default_str();
  app.add_option("--weight-decay", flags.weight_decay,
                 "Weight decay: an L2 penalty with sgd, decoupled (p -= lr * wd * p) with adamw")
      ->capture_default_str();
  app.add_flag("--nesterov", flags.nesterov, "Nesterov momentum (--optimizer sgd)");
  app.add_option("--beta1", flags.beta1, "AdamW's first-moment decay (--optimizer adamw)")
      ->capture_default_str();
  app.add_option("--beta2", flags.beta2, "AdamW's second-moment decay (--optimizer adamw)")
      ->capture_default_str();
  app.add_option("--eps", flags.eps, "AdamW's denominator term (--optimizer adamw)")
      ->capture_default_str();
  app.add_option("--schedule", flags.schedule,
                 "Learning-rate schedule: cosine (annealed to 0 over the run, per step) or "
                 "constant")
      ->capture_default_str()
      ->check(CLI::IsMember({"cosine", "constant"}));
  app.add_option("--seed", flags.seed, "Seed of the initialisation, shuffle and augmentation")
      ->capture_default_str();
  app.add_option("--max-steps", flags.max_steps, "Stop after this many steps (0: no limit)")
      ->capture_default_str();
  app.add_option("--train-subset", flags.train_subset,
                 "Train on the first N examples of the training set (0: all)")
      ->capture_default_str();
  app.add_option("--log-every", flags.log_every,
                 "Progress every N steps, counted from the start: a line redrawn in place on a "
                 "terminal, else a plain '  step N loss L ...' line; also the --metrics-out "
                 "records (0: none)")
      ->capture_default_str();
  app.add_option("--eval-every", flags.eval_every,
                 "Also evaluate every N steps of an epoch and print 'eval:' lines with the "
                 "training seconds so far, evaluations excluded (0: epoch ends only, no lines)")
      ->capture_default_str();
  app.add_flag("--allow-nonfinite-loss", flags.allow_nonfinite_loss,
               "Keep training when the loss becomes NaN or infinite (default: stop with an error "
               "naming the step)");
  app.add_option("--max-eval", flags.max_eval, "Test examples per evaluation (0: all)")
      ->capture_default_str();
  app.add_option("--metrics-out", flags.metrics_out,
                 "Rank 0 writes one JSON object per line to FILE (step, epoch, wall_s, "
                 "train_loss, lr, samples_per_s, test_loss/test_accuracy when evaluated, "
                 "averaging per level); a resumed run appends");
  app.add_option("--prefetch", flags.prefetch,
                 "Training batches loaded ahead on a background thread while the model trains "
                 "(DataLoaderOptions::prefetch; the same batches either way; 0: load each batch "
                 "when it is needed)")
      ->capture_default_str();
}

void apply_thread_flag(const TrainingFlags& flags) {
  if (flags.threads > 0) {
    set_num_threads(flags.threads);
  } else {
    get_num_threads();  // reads HSGD_NUM_THREADS now: a bad value stops the run before it starts
  }
}

void check_training_flags(const TrainingFlags& flags) {
  HSGD_CHECK_AS(BadFlag, flags.threads >= 0, "--threads ", flags.threads,
                " must be at least 0 (0: HSGD_NUM_THREADS, else all cores)");
  HSGD_CHECK_AS(BadFlag, flags.batch_size >= 1, "--batch-size ", flags.batch_size,
                " must be at least 1");
  HSGD_CHECK_AS(BadFlag, flags.epochs >= 1, "--epochs ", flags.epochs, " must be at least 1");
  HSGD_CHECK_AS(BadFlag, flags.max_steps >= 0, "--max-steps ", flags.max_steps,
                " must not be negative");
  HSGD_CHECK_AS(BadFlag, flags.train_subset >= 0, "--train-subset ", flags.train_subset,
                " must not be negative");
  HSGD_CHECK_AS(BadFlag, flags.log_every >= 0, "--log-every ", flags.log_every,
                " must be at least 0");
  HSGD_CHECK_AS(BadFlag, flags.eval_every >= 0, "--eval-every ", flags.eval_every,
                " must be at least 0");
  HSGD_CHECK_AS(BadFlag, flags.max_eval >= 0, "--max-eval ", flags.max_eval, " must be at least 0");
  HSGD_CHECK_AS(BadFlag, flags.prefetch >= 0, "--prefetch ", flags.prefetch, " must be at least 0");
  HSGD_CHECK_AS(BadFlag, std::isfinite(flags.lr) && flags.lr >= 0, "--lr ", flags.lr,
                " must be a finite number >= 0");
  HSGD_CHECK_AS(BadFlag, std::isfinite(flags.momentum) && flags.momentum >= 0, "--momentum ",
                flags.momentum, " must be a finite number >= 0");
  HSGD_CHECK_AS(BadFlag, std::isfinite(flags.weight_decay), "--weight-decay ", flags.weight_decay,
                " must be a finite number");
  HSGD_CHECK_AS(BadFlag, flags.optimizer == "sgd" || flags.optimizer == "adamw", "--optimizer '",
                flags.optimizer, "' must be sgd or adamw");
  HSGD_CHECK_AS(BadFlag, flags.optimizer == "sgd" || !flags.nesterov,
                "--nesterov applies to --optimizer sgd only, got --optimizer ", flags.optimizer);
  HSGD_CHECK_AS(BadFlag, flags.beta1 >= 0 && flags.beta1 < 1, "--beta1 ", flags.beta1,
                " must be in [0, 1)");
  HSGD_CHECK_AS(BadFlag, flags.beta2 >= 0 && flags.beta2 < 1, "--beta2 ", flags.beta2,
                " must be in [0, 1)");
  HSGD_CHECK_AS(BadFlag, std::isfinite(flags.eps) && flags.eps >= 0, "--eps ", flags.eps,
                " must be a finite number >= 0");
}

optim::SGDOptions sgd_options(const TrainingFlags& flags) {
  return {.lr = flags.lr,
          .momentum = flags.momentum,
          .weight_decay = flags.weight_decay,
          .nesterov = flags.nesterov};
}

optim::AdamWOptions adamw_options(const TrainingFlags& flags) {
  return {.lr = flags.lr,
          .betas = {flags.beta1, flags.beta2},
          .eps = flags.eps,
          .weight_decay = flags.weight_decay};
}

std::shared_ptr<Optimizer> make_optimizer(const TrainingFlags& flags, std::vector<Tensor> params) {
  if (flags.optimizer == "adamw") {
    return std::make_shared<optim::AdamW>(std::move(params), adamw_options(flags));
  }
  HSGD_CHECK_AS(BadFlag, flags.optimizer == "sgd", "--optimizer '", flags.optimizer,
                "' must be sgd or adamw");
  return std::make_shared<optim::SGD>(std::move(params), sgd_options(flags));
}

std::string describe_optimizer(const TrainingFlags& flags) {
  std::ostringstream out;
  if (flags.optimizer == "adamw") {
    out << "AdamW betas " << flags.beta1 << "/" << flags.beta2 << ", eps " << flags.eps;
  } else {
    out << "SGD momentum " << flags.momentum << (flags.nesterov ? " nesterov" : "");
  }
  out << ", weight decay " << flags.weight_decay;
  return out.str();
}

std::unique_ptr<optim::LRScheduler> make_scheduler(const TrainingFlags& flags, Optimizer& optimizer,
                                                   int64_t planned_steps) {
  if (flags.schedule != "cosine") return nullptr;
  return std::make_unique<optim::CosineAnnealingLR>(
      optimizer, optim::CosineAnnealingLROptions{.t_max = planned_steps});
}

}  // namespace hsgd::apps
