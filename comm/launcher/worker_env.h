#pragma once
// The environment hsgd-run gives each worker: the launcher's own environment plus the torchrun
// variables. Overriding is deliberate: a stale RANK inherited from an outer job must not leak in.
//
// Variables set: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT (the rendezvous store), HSGD_RUN_ID and HSGD_JOB_ID (both the
// --rdzv-id: init_process_group uses the first for its per-attempt key prefix, the second as the
// store's job namespace), HSGD_RESTART_COUNT, HSGD_MAX_RESTARTS, and HSGD_RDZV_TOKEN /
// HSGD_TOKEN_FILE when the store needs a token (HSGD_INSECURE=1 instead when the job runs
// insecure; an inherited HSGD_INSECURE is removed otherwise), HSGD_PROGRESS_FILE
// (comm/process_group/worker_progress.h; empty when hsgd-run watches no progress). When
// local_world_size > 1, OMP_NUM_THREADS, HSGD_NUM_THREADS and OPENBLAS_NUM_THREADS are set to 1
// unless the user set them: P workers with P threads each would oversubscribe the cores. `extra`
// adds more (elastic mode, elastic_agent.h).
//
// Usage:
//   auto env = build_worker_env(current_environment(), WorkerEnvOptions{.rank = 3});

#include <map>
#include <string>
#include <vector>

namespace hsgd::comm::launcher {

struct WorkerEnvOptions {
  int rank = 0;
  int local_rank = 0;
  int world_size = 1;
  int local_world_size = 1;
  int group_rank = 0;  // node rank
  int group_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  std::string run_id = "default";
  int restart_count = 0;
  int max_restarts = 0;
  std::string token{};          // empty: the store has no token
  std::string token_file{};     // where the token came from, if a file
  bool insecure = false;        // HSGD_INSECURE=1: the job's connections are plain TCP
  std::string progress_file{};  // HSGD_PROGRESS_FILE (worker_progress.h); empty: none
  std::map<std::string, std::string> extra{};  // further variables, set last (elastic mode)
};

// The process environment as "NAME=value" entries.
std::vector<std::string> current_environment();

// Returns base with the worker variables set (replacing existing entries of the same name).
std::vector<std::string> build_worker_env(const std::vector<std::string>& base,
                                          const WorkerEnvOptions& options);

}  // namespace hsgd::comm::launcher
