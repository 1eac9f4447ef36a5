#include "framework/distributed/model_averaging/config_check.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <span>
#include <sstream>

#include "comm/error.h"

namespace hsgd::distributed::detail {
namespace {

constexpr int kShownLevels = 8;
// Words per level: period, group size, then the options (level_options.h).
constexpr int kLevelWords = 10;
// Record layout, one per rank: digest, warm-up, level count, then the kLevelWords of the first
// kShownLevels levels (zeros beyond). The digest covers all levels; the rest is for messages.
constexpr int kRecordSize = 3 + kLevelWords * kShownLevels;

int64_t fnv1a(const std::vector<int64_t>& words) {
  uint64_t h = 1469598103934665603ull;
  for (int64_t w : words) {
    for (int byte = 0; byte < 8; ++byte) {
      h ^= (static_cast<uint64_t>(w) >> (8 * byte)) & 0xffu;
      h *= 1099511628211ull;
    }
  }
  return static_cast<int64_t>(h);
}

int64_t bits_of(double value) {
  int64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

double double_of(int64_t bits) {
  double value = 0;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

void append_level(const LevelOptions& level, std::vector<int64_t>& out) {
  const OuterOptimizer outer = level.outer.value_or(OuterOptimizer{});
  out.insert(out.end(), {level.period, level.group_size, level.outer.has_value() ? 1 : 0,
                         bits_of(outer.lr), bits_of(outer.momentum), outer.nesterov ? 1 : 0,
                         level.overlap_steps, static_cast<int64_t>(level.compression),
                         bits_of(level.compression_scale), level.error_feedback ? 1 : 0});
}

LevelOptions level_of(std::span<const int64_t> words) {
  LevelOptions level{.period = words[0], .group_size = static_cast<int>(words[1])};
  if (words[2] != 0) {
    level.outer = OuterOptimizer{
        .lr = double_of(words[3]), .momentum = double_of(words[4]), .nesterov = words[5] != 0};
  }
  level.overlap_steps = words[6];
  level.compression = static_cast<Compression>(words[7]);
  level.compression_scale = static_cast<float>(double_of(words[8]));
  level.error_feedback = words[9] != 0;
  return level;
}

std::vector<int64_t> make_record(const std::vector<LevelOptions>& levels, int64_t warmup_steps) {
  std::vector<int64_t> words{warmup_steps, static_cast<int64_t>(levels.size())};
  for (const LevelOptions& level : levels) append_level(level, words);
  std::vector<int64_t> record(kRecordSize, 0);
  record[0] = fnv1a(words);
  record[1] = warmup_steps;
  record[2] = static_cast<int64_t>(levels.size());
  for (int i = 0; i < kShownLevels && i < static_cast<int>(levels.size()); ++i) {
    std::copy_n(words.begin() + 2 + i * kLevelWords, kLevelWords,
                record.begin() + 3 + i * kLevelWords);
  }
  return record;
}

std::string describe_record(std::span<const int64_t> record) {
  std::ostringstream out;
  out << "{";
  const int64_t n = record[2];
  for (int64_t i = 0; i < n && i < kShownLevels; ++i) {
    out << (i > 0 ? ", " : "") << describe(level_of(record.subspan(3 + i * kLevelWords)));
  }
  if (n > kShownLevels) out << ", ... (" << n << " levels)";
  out << "} warm-up " << record[1];
  return out.str();
}

}  // namespace

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
  const std::vector<int64_t> mine = make_record(levels, warmup_steps);
  std::vector<int64_t> all(static_cast<size_t>(kRecordSize) * pg.size());
  pg.allgather(std::span<const int64_t>(mine), std::span<int64_t>(all), "averager config check")
      ->wait(pg.work_timeout());

  // Group ranks by digest, in rank order, to name who passed what.
  std::map<int64_t, std::vector<int>> ranks_by_digest;
  std::vector<int64_t> first_seen;
  for (int r = 0; r < pg.size(); ++r) {
    const int64_t digest = all[static_cast<size_t>(r) * kRecordSize];
    if (ranks_by_digest.find(digest) == ranks_by_digest.end()) first_seen.push_back(digest);
    ranks_by_digest[digest].push_back(r);
  }
  if (first_seen.size() > 1) {
    std::ostringstream msg;
    msg << who << ": the ranks of group '" << pg.name()
        << "' passed different configurations (period:group_size@options and warm-up):";
    for (int64_t digest : first_seen) {
      const std::vector<int>& ranks = ranks_by_digest[digest];
      msg << " ranks [";
      for (size_t i = 0; i < ranks.size(); ++i) msg << (i > 0 ? ", " : "") << ranks[i];
      const size_t at = static_cast<size_t>(ranks.front()) * kRecordSize;
      msg << "] have " << describe_record(std::span<const int64_t>(all).subspan(at, kRecordSize))
          << ";";
    }
    msg << " every rank must pass the same (this is rank " << pg.rank() << ")";
    HSGD_THROW(InvalidArgument, msg.str());
  }
  if (!local_error.empty()) HSGD_THROW(InvalidArgument, local_error);
}

}  // namespace hsgd::distributed::detail
