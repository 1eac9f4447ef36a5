// train_gpt: trains a byte-level GPT (models::GPT) on a text, in one process or data-parallel
// under hsgd-run, with the modes, level options, elastic runs, checkpoints and metrics of
// train_mlp and train_resnet (apps/common).
//
// Data: the bytes of --text are the tokens (vocabulary 256, no tokenizer). The first
// (1 - --val-fraction) of them are the training text, the rest the validation text. Both are cut
// into windows of --context tokens (data::NextTokenDataset, stride = context): a window's targets
// are its tokens one position later. Every rank trains on its shard of the training windows
// (DataLoader rank/world_size, same shuffle); --batch-size and --lr are per rank.
// The default text is the King James Bible (public domain), which the build writes from Debian's
// bible-kjv package to <build>/data/kjv.txt.
//
// Evaluation (each epoch end and every --eval-every steps) averages the replicas and computes the
// next-token loss and accuracy over the validation windows (--max-eval limits them): the table's
// test_loss and test_acc, and "final test accuracy: A% test_loss L" at the end, are the
// validation text's, per token. At the end rank 0 prints --sample-tokens bytes that the trained
// model generates after --prompt (temperature --temperature, seeded by --seed).
//
// Exit code 0 on success, 1 on a bad flag value or an unreadable text (the message names it),
// 2 on a malformed or invalid --hierarchy.

#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "apps/common/checkpointing.h"
#include "apps/common/parallel_training.h"
#include "apps/common/run_main.h"
#include "apps/common/training_flags.h"
#include "apps/common/training_run.h"
#include "comm/error.h"
#include "framework/data/subset.h"
#include "framework/data/text.h"
#include "framework/parallel/parallel.h"
#include "models/gpt.h"

#ifndef HSGD_DEFAULT_TEXT
#define HSGD_DEFAULT_TEXT ""
#endif

namespace {

using namespace hsgd;

struct Flags {
  std::string text = HSGD_DEFAULT_TEXT;
  double val_fraction = 0.1;
  models::GPTOptions gpt{.vocab_size = 256,
                         .context = 128,
                         .d_model = 128,
                         .n_layers = 4,
                         .n_heads = 4,
                         .dropout = 0.1};
  std::string prompt = "And God said";
  int64_t sample_tokens = 200;
  double temperature = 0.8;
  apps::TrainingFlags training{.batch_size = 32,
                               .lr = 1e-3,
                               .optimizer = "adamw",
                               .weight_decay = 0.1,
                               .beta2 = 0.99,
                               .schedule = "cosine",
                               .max_eval = 256};
  apps::ParallelFlags parallel;
  apps::CheckpointFlags checkpoint;
};

struct Data {
  std::shared_ptr<const data::Dataset> train, val;
  int64_t train_tokens = 0, val_tokens = 0;
};

Data load_data(const Flags& flags) {
  HSGD_CHECK_AS(apps::BadFlag, !flags.text.empty(),
                "--text: no text given, and this build has no default (the bible-kjv package's "
                "'bible' program was not found when it was configured); expected a text file");
  HSGD_CHECK_AS(apps::BadFlag, flags.val_fraction > 0 && flags.val_fraction < 1, "--val-fraction ",
                flags.val_fraction, " must be in (0, 1)");
  std::shared_ptr<const std::vector<int64_t>> tokens;
  try {
    tokens = std::make_shared<const std::vector<int64_t>>(data::byte_tokens(flags.text));
  } catch (const InvalidArgument& e) {
    throw apps::BadFlag(std::string("--text: ") + e.what());
  }
  const auto n = static_cast<int64_t>(tokens->size());
  const auto split = static_cast<int64_t>(static_cast<double>(n) * (1 - flags.val_fraction));
  const int64_t t = flags.gpt.context;
  Data out;
  out.train_tokens = split;
  out.val_tokens = n - split;
  out.train = std::make_shared<data::NextTokenDataset>(tokens, 0, split, t, t);
  out.val = std::make_shared<data::NextTokenDataset>(tokens, split, n, t, t);
  HSGD_CHECK_AS(apps::BadFlag, out.train->size() > 0 && out.val->size() > 0, "--text '", flags.text,
                "': ", n, " bytes hold no window of --context ", t,
                " tokens in both the training and the validation part (--val-fraction ",
                flags.val_fraction, "); expected a longer text or a shorter context");
  if (flags.training.train_subset > 0) {
    out.train = data::first_n(out.train, flags.training.train_subset);
  }
  return out;
}

std::string printable(const std::vector<int64_t>& bytes) {
  std::string out;
  for (int64_t b : bytes) out += (b == '\n' || (b >= 32 && b < 127)) ? static_cast<char>(b) : '?';
  return out;
}

int run(const Flags& flags) {
  const apps::TrainingFlags& training = flags.training;
  apps::check_training_flags(training);
  apps::apply_thread_flag(training);
  models::GPTOptions options = flags.gpt;
  options.seed = training.seed;
  std::shared_ptr<models::GPT> model;
  try {
    model = std::make_shared<models::GPT>(options);
  } catch (const InvalidArgument& e) {
    throw apps::BadFlag(std::string("--d-model/--layers/--heads/--context/--dropout: ") + e.what());
  }
  HSGD_CHECK_AS(apps::BadFlag, !flags.prompt.empty(), "--prompt must not be empty");
  HSGD_CHECK_AS(apps::BadFlag, flags.sample_tokens >= 0 && flags.temperature > 0,
                "--sample-tokens ", flags.sample_tokens, " must be >= 0 and --temperature ",
                flags.temperature, " > 0");
  const Data data = load_data(flags);
  const std::string arch = str_cat("gpt d", options.d_model, " l", options.n_layers, " h",
                                   options.n_heads, " t", options.context);
  int64_t params = 0;
  for (const Tensor& p : model->parameters()) params += p.numel();
  return apps::train_and_report(
      training, flags.parallel, flags.checkpoint,
      {.program = "train_gpt",
       .model = model,
       .train = data.train,
       .test = data.val,
       .loader = {.batch_size = training.batch_size,
                  .shuffle = true,
                  .seed = training.seed,
                  .prefetch = training.prefetch},
       .model_name = arch,
       .print_header =
           [&](const runtime::GenerationEvent& e) {
             std::printf(
                 "train_gpt: GPT d_model %lld, %lld layers, %lld heads, context %lld, dropout %g "
                 "(%lld parameters); %s: %lld training / %lld validation bytes (%lld / %lld "
                 "windows), batch %lld, lr %g, %s, %s lr, %d threads\n",
                 static_cast<long long>(options.d_model), static_cast<long long>(options.n_layers),
                 static_cast<long long>(options.n_heads), static_cast<long long>(options.context),
                 options.dropout, static_cast<long long>(params), flags.text.c_str(),
                 static_cast<long long>(data.train_tokens), static_cast<long long>(data.val_tokens),
                 static_cast<long long>(data.train->size()),
                 static_cast<long long>(data.val->size()),
                 static_cast<long long>(training.batch_size), training.lr,
                 apps::describe_optimizer(training).c_str(), training.schedule.c_str(),
                 get_num_threads());
             std::printf(
                 "train_gpt: test_loss and test_acc are the validation text's next-byte "
                 "loss and accuracy%s\n",
                 training.max_eval > 0
                     ? str_cat(" (its first ", training.max_eval, " windows)").c_str()
                     : "");
             if (e.world_size > 1 || flags.parallel.mode != "ddp") {
               std::printf(
                   "train_gpt: %s, %lld batches per rank per epoch\n",
                   apps::describe_parallel(flags.parallel, e.world_size, *e.parallel).c_str(),
                   static_cast<long long>(e.batches_per_epoch));
             }
           },
       .print_footer =
           [&](const runtime::RunResult&) {
             if (flags.sample_tokens == 0) return;
             const std::string& p = flags.prompt;
             Generator gen(training.seed);
             const std::vector<int64_t> more =
                 model->generate(std::vector<int64_t>(p.begin(), p.end()), flags.sample_tokens, gen,
                                 flags.temperature);
             std::printf("sample (temperature %g):\n%s%s\n", flags.temperature, p.c_str(),
                         printable(more).c_str());
           }});
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  CLI::App app{
      "Train a byte-level GPT on a text, in one process or data-parallel under hsgd-run (DDP, "
      "post-local SGD, hierarchical model averaging with an outer optimizer)."};
  app.add_option("--text", flags.text, "The text to train on (its bytes are the tokens)")
      ->capture_default_str();
  app.add_option("--val-fraction", flags.val_fraction,
                 "The last fraction of the text, held out for validation")
      ->capture_default_str();
  app.add_option("--context", flags.gpt.context, "Tokens per window (the model's context)")
      ->capture_default_str();
  app.add_option("--d-model", flags.gpt.d_model, "Width of the model")->capture_default_str();
  app.add_option("--layers", flags.gpt.n_layers, "Transformer blocks")->capture_default_str();
  app.add_option("--heads", flags.gpt.n_heads, "Attention heads (must divide --d-model)")
      ->capture_default_str();
  app.add_option("--dropout", flags.gpt.dropout, "Dropout of the embeddings and residual branches")
      ->capture_default_str();
  app.add_option("--prompt", flags.prompt, "The start of the text sampled at the end")
      ->capture_default_str();
  app.add_option("--sample-tokens", flags.sample_tokens, "Bytes sampled at the end (0: none)")
      ->capture_default_str();
  app.add_option("--temperature", flags.temperature, "Temperature of the sample")
      ->capture_default_str();
  apps::add_training_flags(app, flags.training);
  apps::add_parallel_flags(app, flags.parallel);
  apps::add_checkpoint_flags(app, flags.checkpoint);
  return apps::run_main(app, argc, argv, "train_gpt", [&] { return run(flags); });
}
