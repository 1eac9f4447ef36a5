#pragma once
// Internal to the averagers: the collective check that every rank of a group was given the same
// averaging configuration.
//
// Why a collective at construction: an averager whose ranks disagree (a typo in one launch
// script, a rank reading another config file) would otherwise either hang in new_subgroups or
// allreduce with the wrong peers and silently train a different model. The check is an
// agreement check (comm/process_group/agreement.h) of describe(levels) and the warm-up: one
// allgather of 2 int64 per rank, once. It covers the level options (outer optimizer, overlap,
// compression, error feedback) bit for bit, since describe() prints numbers to the last bit.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "comm/process_group/process_group.h"
#include "framework/distributed/model_averaging/level_options.h"

namespace hsgd::distributed::detail {

// "{2:2, 4:8}" for messages ("{2:2, 16:8@outer=0.7/0.9/nesterov}" with options).
std::string describe(const std::vector<LevelOptions>& levels);

// Every rank of pg calls this with its own configuration and the validation error it found
// locally ("" if none). Throws hsgd::InvalidArgument on EVERY rank:
// - when the ranks' configurations differ (naming which ranks passed what), else
// - with local_error when it is non-empty (all ranks then found the same error).
// It communicates before throwing, so a rank with a bad configuration never leaves its peers
// waiting in a later collective.
void check_config_on_all_ranks(comm::ProcessGroup& pg, const char* who,
                               const std::vector<LevelOptions>& levels, int64_t warmup_steps,
                               const std::string& local_error);

}  // namespace hsgd::distributed::detail
