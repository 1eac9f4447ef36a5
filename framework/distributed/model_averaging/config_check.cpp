#include "framework/distributed/model_averaging/config_check.h"

#include <sstream>

#include "comm/error.h"
#include "comm/process_group/agreement.h"

namespace hsgd::distributed::detail {

std::string describe(const std::vector<LevelOptions>& levels) {
  std::ostringstream out;
  out << "{";
  for (size_t i = 0; i < levels.size(); ++i) out << (i > 0 ? ", " : "") << describe(levels[i]);
  out << "}";
  return out.str();
}

void check_config_on_all_ranks(comm::ProcessGroup& pg, const char* who,
                               const std::vector<LevelOptions>& levels, int64_t warmup_steps,
                               const std::string& local_error) {
  // describe() names every field of every level, numbers to the last bit, so equal descriptions
  // are equal configurations.
  comm::check_agreement(pg, who, "configurations (period:group_size@options and warm-up)",
                        hsgd::str_cat(describe(levels), " warm-up ", warmup_steps));
  if (!local_error.empty()) HSGD_THROW(InvalidArgument, local_error);
}

}  // namespace hsgd::distributed::detail
