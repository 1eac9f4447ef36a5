#include "apps/common/level_options.h"

#include <charconv>
#include <cstdlib>
#include <string_view>

#include "apps/common/parallel_training.h"

namespace hsgd::apps {
namespace {

using distributed::Compression;
using distributed::LevelOptions;
using distributed::OuterOptimizer;

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> parts;
  size_t begin = 0;
  while (begin <= text.size()) {
    size_t end = text.find(sep, begin);
    if (end == std::string::npos) end = text.size();
    parts.push_back(text.substr(begin, end - begin));
    begin = end + 1;
  }
  return parts;
}

// The '@' options of each level ("" when none), one per level of the hierarchy text.
std::vector<std::string> option_specs(const std::string& hierarchy) {
  std::vector<std::string> specs;
  bool has_at = false;  // whether the current level started options with '@'
  for (const std::string& item : split(hierarchy, ',')) {
    if (item.find(':') != std::string::npos || specs.empty()) {
      const size_t at = item.find('@');
      has_at = at != std::string::npos;
      specs.push_back(has_at ? item.substr(at + 1) : "");
    } else if (!has_at) {
      throw BadFlag("--hierarchy '" + hierarchy + "': option '" + item +
                    "' must follow '@' on a level, e.g. 16:4@" + item);
    } else {
      specs.back() += "," + item;
    }
  }
  return specs;
}

double parse_number(const std::string& text, const std::string& what, const std::string& flag) {
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size()) {
    throw BadFlag(flag + ": " + what + " '" + text + "' is not a number");
  }
  return value;
}

void parse_item(const std::string& item, LevelOptions& level, const std::string& flag) {
  const size_t eq = item.find('=');
  const std::string key = item.substr(0, eq);
  const std::string value = eq == std::string::npos ? "" : item.substr(eq + 1);
  if (key == "outer" && !value.empty()) {
    const std::vector<std::string> parts = split(value, '/');
    OuterOptimizer outer{.lr = parse_number(parts[0], "outer lr", flag)};
    if (parts.size() > 1) outer.momentum = parse_number(parts[1], "outer momentum", flag);
    if (parts.size() > 2 && parts[2] != "nesterov") {
      throw BadFlag(flag + ": outer '" + value + "': expected LR[/MOMENTUM[/nesterov]]");
    }
    outer.nesterov = parts.size() > 2;
    if (parts.size() > 3) {
      throw BadFlag(flag + ": outer '" + value + "': expected LR[/MOMENTUM[/nesterov]]");
    }
    level.outer = outer;
  } else if (key == "overlap" && !value.empty()) {
    const double k = parse_number(value, "overlap", flag);
    if (k != static_cast<double>(static_cast<int64_t>(k))) {
      throw BadFlag(flag + ": overlap '" + value + "' is not an integer");
    }
    level.overlap_steps = static_cast<int64_t>(k);
  } else if (key == "bf16" || key == "fp16") {
    level.compression = key == "bf16" ? Compression::kBF16 : Compression::kFP16;
    if (eq != std::string::npos) {
      level.compression_scale = static_cast<float>(parse_number(value, "scale", flag));
    }
  } else if (key == "ef" && eq == std::string::npos) {
    level.error_feedback = true;
  } else {
    throw BadFlag(flag + ": unknown level option '" + item +
                  "'; expected outer=LR[/MOMENTUM[/nesterov]], overlap=K, bf16[=S], fp16[=S] "
                  "or ef");
  }
}

}  // namespace

void add_level_flags(CLI::App& app, LevelFlags& flags) {
  app.add_option("--outer-lr", flags.outer_lr,
                 "local-sgd/hierarchical: outer SGD (DiLoCo) on the top level with this lr "
                 "(0: plain averaging)")
      ->capture_default_str();
  app.add_option("--outer-momentum", flags.outer_momentum, "momentum of the outer SGD")
      ->capture_default_str();
  app.add_flag("--outer-nesterov", flags.outer_nesterov, "Nesterov momentum for the outer SGD");
  app.add_option("--overlap-steps", flags.overlap_steps,
                 "top level: merge each averaging this many steps later, training meanwhile")
      ->capture_default_str();
  app.add_option("--compression", flags.compression,
                 "top level: values on the wire (none, bf16, fp16)")
      ->capture_default_str()
      ->check(CLI::IsMember({"none", "bf16", "fp16"}));
  app.add_option("--compression-scale", flags.compression_scale,
                 "top level: values are multiplied by it before rounding to 16 bits")
      ->capture_default_str();
  app.add_flag("--error-feedback", flags.error_feedback,
               "top level: add the rounding error to the next averaging's payload");
}

bool any_set(const LevelFlags& flags) {
  return flags.outer_lr != 0 || flags.outer_momentum != 0 || flags.outer_nesterov ||
         flags.overlap_steps != 0 || flags.compression != "none" ||
         flags.compression_scale != 1.0f || flags.error_feedback;
}

std::string strip_level_options(const std::string& hierarchy) {
  std::string out;
  for (const std::string& item : split(hierarchy, ',')) {
    if (item.find(':') == std::string::npos && !out.empty()) continue;  // an option
    out += (out.empty() ? "" : ",") + item.substr(0, item.find('@'));
  }
  return out;
}

std::vector<LevelOptions> make_level_options(const std::vector<std::pair<int64_t, int>>& pairs,
                                             const std::string& hierarchy,
                                             const LevelFlags& flags) {
  std::vector<std::string> specs =
      hierarchy.empty() ? std::vector<std::string>(pairs.size()) : option_specs(hierarchy);
  if (specs.size() != pairs.size()) {
    throw BadFlag("--hierarchy '" + hierarchy + "': " + std::to_string(specs.size()) +
                  " levels with options for " + std::to_string(pairs.size()) + " levels");
  }
  std::vector<LevelOptions> levels;
  for (size_t i = 0; i < pairs.size(); ++i) {
    LevelOptions level{.period = pairs[i].first, .group_size = pairs[i].second};
    if (!specs[i].empty()) {
      for (const std::string& item : split(specs[i], ',')) {
        parse_item(item, level, "--hierarchy '" + hierarchy + "' level " + std::to_string(i));
      }
    }
    levels.push_back(level);
  }
  if (any_set(flags) && !levels.empty()) {
    if (!specs.back().empty()) {
      throw BadFlag("--hierarchy '" + hierarchy +
                    "' gives the top level options after '@' and --outer-lr/--outer-momentum/"
                    "--overlap-steps/--compression... give them too; give them in one place");
    }
    if (flags.outer_lr == 0 && (flags.outer_momentum != 0 || flags.outer_nesterov)) {
      // Without this the level would read as outer lr 0, a value nobody gave.
      throw BadFlag(
          std::string(flags.outer_momentum != 0 ? "--outer-momentum" : "--outer-nesterov") +
          " needs --outer-lr (the outer SGD's learning rate; --outer-lr 0, the default, "
          "means no outer optimizer, so the momentum would do nothing)");
    }
    LevelOptions& top = levels.back();
    if (flags.outer_lr != 0 || flags.outer_momentum != 0 || flags.outer_nesterov) {
      top.outer = OuterOptimizer{
          .lr = flags.outer_lr, .momentum = flags.outer_momentum, .nesterov = flags.outer_nesterov};
    }
    top.overlap_steps = flags.overlap_steps;
    top.compression = flags.compression == "bf16"   ? Compression::kBF16
                      : flags.compression == "fp16" ? Compression::kFP16
                                                    : Compression::kNone;
    top.compression_scale = flags.compression_scale;
    top.error_feedback = flags.error_feedback;
  }
  return levels;
}

}  // namespace hsgd::apps
