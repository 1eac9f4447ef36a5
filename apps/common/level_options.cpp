#include "apps/common/level_options.h"

#include "apps/common/parallel_training.h"
#include "framework/distributed/model_averaging/hierarchy_text.h"

namespace hsgd::apps {

using distributed::Compression;
using distributed::LevelOptions;
using distributed::OuterOptimizer;

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
                 "top level: values on the wire (none, bf16, fp16, int8, int4)")
      ->capture_default_str()
      ->check(CLI::IsMember({"none", "bf16", "fp16", "int8", "int4"}));
  app.add_option("--compression-scale", flags.compression_scale,
                 "top level: values are multiplied by it before rounding to 16 bits (bf16, fp16)")
      ->capture_default_str();
  app.add_flag("--error-feedback", flags.error_feedback,
               "top level: add the rounding error to the next averaging's payload");
}

bool any_set(const LevelFlags& flags) {
  return flags.outer_lr != 0 || flags.outer_momentum != 0 || flags.outer_nesterov ||
         flags.overlap_steps != 0 || flags.compression != "none" ||
         flags.compression_scale != 1.0f || flags.error_feedback;
}

std::vector<LevelOptions> parse_hierarchy_flag(const std::string& hierarchy) {
  try {
    return distributed::parse_hierarchy(hierarchy);
  } catch (const InvalidArgument& e) {
    throw BadFlag("--" + std::string(e.what()));  // the message starts "hierarchy '...'"
  }
}

std::vector<LevelOptions> make_level_options(const std::vector<std::pair<int64_t, int>>& pairs,
                                             const std::string& hierarchy,
                                             const LevelFlags& flags) {
  std::vector<LevelOptions> levels(pairs.size());
  if (!hierarchy.empty()) {
    levels = parse_hierarchy_flag(hierarchy);
    if (levels.size() != pairs.size()) {
      throw BadFlag("--hierarchy '" + hierarchy + "' has " + std::to_string(levels.size()) +
                    " levels, but " + std::to_string(pairs.size()) +
                    " period:group_size pairs were given for it");
    }
  }
  for (size_t i = 0; i < pairs.size(); ++i) {
    levels[i].period = pairs[i].first;
    levels[i].group_size = pairs[i].second;
  }
  if (any_set(flags) && !levels.empty()) {
    const LevelOptions& given = levels.back();
    if (given != LevelOptions{.period = given.period, .group_size = given.group_size}) {
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
                      : flags.compression == "int8" ? Compression::kInt8
                      : flags.compression == "int4" ? Compression::kInt4
                                                    : Compression::kNone;
    top.compression_scale = flags.compression_scale;
    top.error_feedback = flags.error_feedback;
  }
  return levels;
}

}  // namespace hsgd::apps
