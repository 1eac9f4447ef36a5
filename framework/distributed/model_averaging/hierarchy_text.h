#pragma once
// The hierarchy as text: one grammar, read by parse_hierarchy and written by format_hierarchy,
// so that what a program is given, what it prints and what the ranks compare (config_check.h)
// are the same words.
//
//   hierarchy := level {',' level}
//   level     := PERIOD ':' GROUP ['@' option {',' option}]
//   GROUP     := a positive integer | 'world' or 0 (kWholeGroup) | 'node' (kNodeGroup)
//   option    := 'outer=' LR ['/' MOMENTUM ['/nesterov']]   outer SGD on the level's anchor
//              | 'overlap=' K                              merge the averaging K steps later
//              | 'fragments=' F                            stream the level in F fragments
//              | ('bf16' | 'fp16') ['=' SCALE]             16-bit values on the wire
//              | 'int8' | 'int4'                           8-/4-bit values, a step per block
//              | 'ef'                                      error feedback
// e.g. "2:node,16:world@outer=0.7/0.9/nesterov,overlap=2,bf16,ef" or
// "2:node,16:world@fragments=4,int8". PERIOD is 1 to 2^30, a group
// size at most 2^30. A comma-separated item without ':' continues the options of the level
// before it, which must have started them with '@'. The options mean the fields of LevelOptions
// (level_options.h); parse_hierarchy checks only the grammar, the averagers check the values
// (validate_options).
//
// format_hierarchy writes the canonical text: every level as describe() prints it, numbers in
// the shortest form that reads back to the same double (float for SCALE), options in the order
// above, "outer=LR/MOMENTUM" always with the momentum. So parse_hierarchy(format_hierarchy(x))
// == x for every list the averagers accept. A compression scale without a compression (which
// they refuse) prints as "scale=S", which parse_hierarchy refuses.
//
// Usage:
//   std::vector<LevelOptions> levels = parse_hierarchy("2:node,16:world@outer=0.7,bf16");
//   // levels[1].outer->lr == 0.7, levels[1].compression == Compression::kBF16
//   format_hierarchy(levels);   // "2:node,16:world@outer=0.7/0,bf16"

#include <string>
#include <string_view>
#include <vector>

#include "framework/distributed/model_averaging/level_options.h"

namespace hsgd::distributed {

// The levels of `text`, in order. Throws hsgd::InvalidArgument whose message starts with
// "hierarchy '<text>': " and names the bad item and what was expected, e.g.
// "hierarchy '2:x': group size 'x' is not a positive integer (...); expected period:group_size
// pairs separated by commas, e.g. 2:2,8:world".
std::vector<LevelOptions> parse_hierarchy(std::string_view text);

// The canonical text of `levels` (see above); "" for no levels.
std::string format_hierarchy(const std::vector<LevelOptions>& levels);

}  // namespace hsgd::distributed
