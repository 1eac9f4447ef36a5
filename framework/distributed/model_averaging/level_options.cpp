#include "framework/distributed/model_averaging/level_options.h"

#include <algorithm>
#include <cmath>

#include "comm/error.h"
#include "framework/distributed/model_averaging/hierarchy_text.h"

namespace hsgd::distributed {

const char* to_string(Compression compression) {
  switch (compression) {
    case Compression::kNone:
      return "none";
    case Compression::kBF16:
      return "bf16";
    case Compression::kFP16:
      return "fp16";
    case Compression::kInt8:
      return "int8";
    case Compression::kInt4:
      return "int4";
  }
  return "unknown";
}

bool is_plain(const LevelOptions& level) {
  return !level.outer.has_value() && level.overlap_steps == 0 &&
         level.compression == Compression::kNone && level.fragments == 1;
}

int64_t merge_delay(const LevelOptions& level) {
  if (level.fragments <= 1 || level.overlap_steps > 0) return level.overlap_steps;
  return std::max<int64_t>(1, level.period / level.fragments);
}

bool is_anchored(const LevelOptions& level) {
  return level.outer.has_value() || level.compression != Compression::kNone;
}

std::string describe(const LevelOptions& level) { return format_hierarchy({level}); }

std::string validate_options(const LevelOptions& level, size_t index, const char* who) {
  using hsgd::str_cat;
  const std::string at = str_cat(who, ": level ", index, " (", describe(level), "): ");
  if (level.overlap_steps < 0) {
    return str_cat(at, "overlap_steps must be >= 0, got ", level.overlap_steps);
  }
  if (level.fragments < 1) return str_cat(at, "fragments must be >= 1, got ", level.fragments);
  if (level.fragments > level.period) {
    return str_cat(at, "fragments ", level.fragments, " must be at most the period ", level.period,
                   " so that each fragment averages at its own step of the period");
  }
  if (level.outer) {
    const OuterOptimizer& outer = *level.outer;
    if (!(outer.lr > 0) || !std::isfinite(outer.lr)) {
      return str_cat(at, "outer lr must be > 0 and finite, got ", outer.lr);
    }
    if (!(outer.momentum >= 0) || !std::isfinite(outer.momentum)) {
      return str_cat(at, "outer momentum must be >= 0 and finite, got ", outer.momentum);
    }
    if (outer.nesterov && outer.momentum == 0) {
      return str_cat(at, "outer nesterov needs a momentum > 0, got momentum 0");
    }
  }
  if (!(level.compression_scale > 0) || !std::isfinite(level.compression_scale)) {
    return str_cat(at, "compression_scale must be > 0 and finite, got ", level.compression_scale);
  }
  if (level.compression == Compression::kNone) {
    if (level.compression_scale != 1.0f) {
      return str_cat(at, "compression_scale ", level.compression_scale,
                     " needs a 16-bit compression (bf16 or fp16)");
    }
    if (level.error_feedback)
      return str_cat(at, "error_feedback needs a compression (bf16, fp16, int8 or int4)");
  } else if ((level.compression == Compression::kInt8 || level.compression == Compression::kInt4) &&
             level.compression_scale != 1.0f) {
    return str_cat(at, "compression_scale ", level.compression_scale, " does not apply to ",
                   to_string(level.compression), ", which chooses a step per block of values");
  } else if (level.group_size == 1) {
    return str_cat(at, "compression ", to_string(level.compression),
                   " needs a group of at least 2 ranks, got group size 1");
  }
  return "";
}

}  // namespace hsgd::distributed
