#include "apps/common/run_main.h"

#include <cstdio>
#include <exception>
#include <new>

#include "apps/common/parallel_training.h"
#include "framework/runtime/preemption.h"
#include "comm/error.h"
#include "comm/launcher/exit_codes.h"
#include "framework/checkpoint/checkpoint_error.h"

namespace hsgd::apps {

int run_main(CLI::App& app, int argc, char** argv, const char* program,
             const std::function<int()>& run) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "%s: error: %s\nRun with --help for more information.\n", program,
                 e.what());
    return 2;
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  try {
    // Before run() starts any thread: preemption signals are waited for in one thread only.
    runtime::install_preemption_signals();
    return run();
  } catch (const BadFlag& e) {
    std::fprintf(stderr, "%s: error: %s\n", program, e.what());
    return 2;
  } catch (const checkpoint::CheckpointError& e) {
    std::fprintf(stderr, "%s: error: %s\n", program, e.what());
    // A full disk stays full: a restart would spend itself failing at the same checkpoint.
    return e.kind() == checkpoint::CheckpointError::Kind::kNoSpace ? comm::launcher::kExitWillRepeat
                                                                   : 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr,
                 "%s: error: out of memory (std::bad_alloc); a flag asked for more than "
                 "this machine has (e.g. --hidden or --batch-size)\n",
                 program);
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", program, e.what());
    return 1;
  }
}

}  // namespace hsgd::apps
