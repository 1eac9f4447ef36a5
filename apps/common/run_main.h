#pragma once
// The examples' main: command-line parsing and exit codes in one place.
//
// Usage:
//   int main(int argc, char** argv) {
//     CLI::App app{"train_mlp: ..."};
//     int64_t epochs = 1;
//     app.add_option("--epochs", epochs, "passes over the data");
//     return apps::run_main(app, argc, argv, "train_mlp", [&] { return epochs > 0 ? 0 : 1; });
//   }
//
// Exit codes: 0 on success (and for --help); 2 on a usage error (CLI11's parse errors, e.g. an
// unknown flag or --batch-size 0, and apps::BadFlag), 1 on a runtime error (hsgd::Error,
// std::bad_alloc, any other std::exception), except for a checkpoint that found its disk full
// (checkpoint::CheckpointError of kind kNoSpace): comm::launcher::kExitWillRepeat (78), so that
// hsgd-run does not spend its restarts on a failure every attempt would repeat. Every error is
// printed to stderr as
// "<program>: error: <message>", and nothing escapes main (no abort, no CLI11-specific codes).
// stdout is line-buffered, so a killed program loses no printed line, even into a pipe.
// SIGUSR1 and SIGTERM are watched from before run() starts (install_preemption_signals,
// framework/runtime/preemption.h): a run with checkpoints stops on them after a checkpoint and returns
// kExitPreempted (75); without checkpoints they end the program as they would by default.

#include <CLI/CLI.hpp>
#include <functional>

namespace hsgd::apps {

int run_main(CLI::App& app, int argc, char** argv, const char* program,
             const std::function<int()>& run);

}  // namespace hsgd::apps
