#pragma once
// LevelOptions: what one level of a model averager does beside "every `period` steps, groups of
// `group_size` ranks average". The defaults are plain averaging, exactly as torch's averagers
// (and hsgd's existing constructors) do it; each option below goes beyond torch.
//
// - outer (DiLoCo, arXiv 2311.08105): the level keeps an ANCHOR, the parameters at the end of its
//   previous averaging. An averaging allreduces the group mean D of (anchor - local parameters),
//   the "pseudo-gradient", takes one step of torch.optim.SGD (lr, momentum, nesterov; dampening
//   and weight decay 0) on the anchor with gradient D, and sets the parameters to the new anchor.
//   lr 1 with momentum 0 is plain averaging (up to float rounding).
// - overlap_steps = k >= 1 (Streaming DiLoCo, arXiv 2501.18512; delayed averaging): the averaging
//   started at step s runs in the background and is merged k steps later (see averaging_level.h
//   for the exact rule), so training does not wait for the group.
// - compression: kBF16 / kFP16 put 16-bit values on the wire between nodes instead of float32,
//   (value * scale) rounded to nearest even; kInt8 / kInt4 put 8- or 4-bit integers with one
//   float32 step per block of 256 values (compression.h states the formats). Sums are float32
//   within a node and at each step of the ring between the node leaders (compressed_average.h
//   states the rule; a group within one node sums in float32 and rounds nothing). Only the
//   difference to the anchor is compressed, never the parameters themselves, so a compressed
//   level keeps an anchor even without outer (it then behaves as outer lr 1, momentum 0).
//   error_feedback adds this rank's rounding error of an averaging to its payload at the
//   level's next averaging.
// - fragments = F >= 2 (streaming, Streaming DiLoCo): the averaged tensors are split into F
//   fragments of whole parameter tensors with balanced bytes, and fragment f averages at its own
//   step within each period, offset f * period / F, merging merge_delay() steps later; each
//   fragment keeps its own anchor, momentum, residual and averaging in flight. averagers.h
//   states the schedule, fragments.h the split. F = 1 is the whole-model level, bit for bit.
//
// Usage:
//   const LevelOptions level{.period = 16, .group_size = 8,
//                            .outer = OuterOptimizer{.lr = 0.7, .momentum = 0.9, .nesterov = true},
//                            .overlap_steps = 2, .compression = Compression::kBF16};
//   const LevelOptions streaming{.period = 16, .group_size = kWholeGroup,
//                                .compression = Compression::kInt8, .fragments = 4};

#include <cstdint>
#include <optional>
#include <string>

namespace hsgd::distributed {

// What travels on the wire at an averaging.
enum class Compression {
  kNone,  // float32
  kBF16,  // bfloat16: float32's range, 8 significant bits
  kFP16,  // IEEE half: 11 significant bits, |value * scale| saturates at 65504
  kInt8,  // 8-bit integers with a float32 step per block of 256 values (compression.h)
  kInt4,  // 4-bit integers in [-7, 7] with a float32 step per block of 256 values
};
// "none", "bf16", "fp16", "int8", "int4".
const char* to_string(Compression compression);

// The outer optimizer of a level: torch.optim.SGD(lr, momentum, nesterov) applied to the anchor.
struct OuterOptimizer {
  double lr = 1.0;        // > 0
  double momentum = 0.0;  // >= 0
  bool nesterov = false;  // needs momentum > 0 (as torch)

  bool operator==(const OuterOptimizer&) const = default;
};

// A group size meaning "the whole process group", so that one program runs alone and under
// hsgd-run with one hierarchy: {{2, 2}, {8, kWholeGroup}}. The hierarchy text (hierarchy_text.h)
// spells it "world".
inline constexpr int kWholeGroup = 0;
// A group size meaning "the ranks of each node", as the launcher declared them
// (comm/process_group/node_layout.h): {0, 1, 2} and {3} when hsgd-run runs 3 ranks on one node and
// 1 on another, where no contiguous equal groups fit. HierarchicalModelAverager only; the
// hierarchy text spells it "node".
inline constexpr int kNodeGroup = -1;

struct LevelOptions {
  int64_t period = 1;  // >= 1
  // Ranks per averaging group (contiguous ranks), kWholeGroup or kNodeGroup.
  // PeriodicModelAverager: 0 or the group size.
  int group_size = 0;
  // Unset: plain averaging.
  std::optional<OuterOptimizer> outer = std::nullopt;
  int64_t overlap_steps = 0;  // >= 0; 0: the averaging completes within its step
  Compression compression = Compression::kNone;
  // Values are multiplied by it before rounding to 16 bits and divided after (> 0, finite).
  // Useful with kFP16, whose smallest normal value is 6.1e-5. Must be 1 for kInt8 and kInt4,
  // which choose a step per block.
  float compression_scale = 1.0f;
  bool error_feedback = false;  // needs compression
  // >= 1 and <= period; 1: the whole model at once. Last, so that designated initialisers
  // written before it keep compiling.
  int64_t fragments = 1;

  // Field by field: what parse_hierarchy(format_hierarchy(levels)) keeps (hierarchy_text.h).
  bool operator==(const LevelOptions&) const = default;
};

// Plain averaging: no outer optimizer, no overlap, no compression, one fragment. Such a level
// averages exactly as torch's averagers (the existing constructors build only plain levels).
bool is_plain(const LevelOptions& level);
// The steps between the start of an averaging of the level and its merge: overlap_steps, or,
// for a fragmented level (fragments >= 2) with overlap_steps 0, period / fragments (integer
// division), so that each fragment's transfer runs behind the steps until the next fragment
// starts.
int64_t merge_delay(const LevelOptions& level);
// Whether the level keeps an anchor: an outer optimizer or compression.
bool is_anchored(const LevelOptions& level);

// The level in the hierarchy text, format_hierarchy({level}) (hierarchy_text.h): "16:4" for a
// plain level, else with its options after '@', "16:4@outer=0.7/0.9/nesterov,overlap=2,bf16,ef"
// ("fp16=1024" gives a scale). Exact: numbers read back to the last bit, so levels with equal
// descriptions are equal.
std::string describe(const LevelOptions& level);

// The first problem with the options of level `index` (other than period and group size, which
// the averagers check themselves), or "" when there is none. The message starts with
// "<who>: level <index> (<describe>)" and names the bad value, e.g. "... overlap_steps must be
// >= 0, got -1", "... fragments must be >= 1, got 0".
std::string validate_options(const LevelOptions& level, size_t index, const char* who);

}  // namespace hsgd::distributed
