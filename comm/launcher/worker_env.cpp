#include "comm/launcher/worker_env.h"

#include <unistd.h>

#include <map>

namespace hsgd::comm::launcher {

std::vector<std::string> current_environment() {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
  return env;
}

std::vector<std::string> build_worker_env(const std::vector<std::string>& base,
                                          const WorkerEnvOptions& o) {
  // An ordered map keeps the output deterministic (handy in tests and in `env` dumps).
  std::map<std::string, std::string> vars;
  for (const auto& entry : base) {
    auto eq = entry.find('=');
    if (eq == std::string::npos || eq == 0) continue;
    vars[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  auto set = [&](const std::string& name, const std::string& value) { vars[name] = value; };
  set("RANK", std::to_string(o.rank));
  set("LOCAL_RANK", std::to_string(o.local_rank));
  set("WORLD_SIZE", std::to_string(o.world_size));
  set("LOCAL_WORLD_SIZE", std::to_string(o.local_world_size));
  set("GROUP_RANK", std::to_string(o.group_rank));
  set("GROUP_WORLD_SIZE", std::to_string(o.group_world_size));
  set("MASTER_ADDR", o.master_addr);
  set("MASTER_PORT", std::to_string(o.master_port));
  set("HSGD_RUN_ID", o.run_id);
  set("HSGD_JOB_ID", o.run_id);
  set("HSGD_RESTART_COUNT", std::to_string(o.restart_count));
  set("HSGD_MAX_RESTARTS", std::to_string(o.max_restarts));
  if (!o.token.empty()) set("HSGD_RDZV_TOKEN", o.token);
  if (!o.token_file.empty()) set("HSGD_TOKEN_FILE", o.token_file);
  // Never inherited: an outer job's choice is not this one's.
  if (o.insecure) {
    set("HSGD_INSECURE", "1");
    vars.erase("HSGD_RDZV_TOKEN");
    vars.erase("HSGD_TOKEN_FILE");
  } else {
    vars.erase("HSGD_INSECURE");
  }
  // Always replaced: an inherited file (hsgd-run inside a worker) belongs to the outer job.
  set("HSGD_PROGRESS_FILE", o.progress_file);
  if (o.local_world_size > 1) {
    for (const char* name : {"OMP_NUM_THREADS", "HSGD_NUM_THREADS", "OPENBLAS_NUM_THREADS"}) {
      if (!vars.contains(name)) set(name, "1");
    }
  }
  for (const auto& [name, value] : o.extra) set(name, value);
  std::vector<std::string> env;
  env.reserve(vars.size());
  for (const auto& [name, value] : vars) env.push_back(name + "=" + value);
  return env;
}

}  // namespace hsgd::comm::launcher
