#include "framework/distributed/model_averaging/hierarchy_text.h"

#include <charconv>
#include <cstdint>
#include <system_error>
#include <type_traits>

#include "comm/error.h"

namespace hsgd::distributed {
namespace {

// Periods and group sizes: larger values are typos (and would overflow int group sizes).
constexpr int64_t kLargest = int64_t{1} << 30;
constexpr const char* kExpectPairs =
    "expected period:group_size pairs separated by commas, e.g. 2:2,8:world";
constexpr const char* kExpectOptions =
    "expected outer=LR[/MOMENTUM[/nesterov]], overlap=K, fragments=F, bf16[=SCALE], fp16[=SCALE], "
    "int8, int4 or ef";
constexpr const char* kExpectOuter = "expected outer=LR[/MOMENTUM[/nesterov]]";

std::vector<std::string_view> split(std::string_view text, char sep) {
  std::vector<std::string_view> parts;
  size_t begin = 0;
  while (true) {
    const size_t end = text.find(sep, begin);
    parts.push_back(text.substr(begin, end == std::string_view::npos ? end : end - begin));
    if (end == std::string_view::npos) return parts;
    begin = end + 1;
  }
}

// Builds the error messages of one text: every message names the text first.
class Errors {
 public:
  explicit Errors(std::string_view text) : text_(text) {}

  [[noreturn]] void fail(const std::string& why, const char* expected) const {
    HSGD_THROW(InvalidArgument, "hierarchy '", text_, "': ", why, "; ", expected);
  }
  [[noreturn]] void fail_level(size_t index, const std::string& why, const char* expected) const {
    fail(str_cat("level ", index, ": ", why), expected);
  }

 private:
  const std::string_view text_;
};

// A period (least 1) or a group size (least 0) in [least, 2^30].
int64_t parse_count(const Errors& errors, std::string_view part, const char* what, int64_t least) {
  int64_t value = 0;
  const auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), value);
  const bool digits = !part.empty() && end == part.data() + part.size();
  if (digits && (ec == std::errc::result_out_of_range || (ec == std::errc() && value > kLargest))) {
    errors.fail(str_cat(what, " '", part, "' is too large (at most ", kLargest, ")"), kExpectPairs);
  }
  if (!digits || ec != std::errc() || value < least) {
    errors.fail(str_cat(what, " '", part, "' is not a positive integer",
                        least == 0 ? " (or 0 / 'world': the whole group, or 'node': each node's "
                                     "ranks)"
                                   : ""),
                kExpectPairs);
  }
  return value;
}

// A number of an option (double, float or int64_t), read exactly as std::to_chars wrote it.
template <typename T>
T parse_number(const Errors& errors, size_t index, std::string_view part, const char* what,
               const char* expected) {
  T value{};
  const auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), value);
  if (part.empty() || end != part.data() + part.size() || ec == std::errc::invalid_argument) {
    errors.fail_level(
        index,
        str_cat(what, " '", part, "' is not ", std::is_integral_v<T> ? "an integer" : "a number"),
        expected);
  }
  if (ec == std::errc::result_out_of_range) {
    errors.fail_level(index, str_cat(what, " '", part, "' is out of range"), expected);
  }
  return value;
}

void parse_outer(const Errors& errors, size_t index, std::string_view value, LevelOptions& level) {
  const std::vector<std::string_view> parts = split(value, '/');
  if (parts.size() > 3 || (parts.size() == 3 && parts[2] != "nesterov")) {
    errors.fail_level(index, str_cat("outer '", value, "' has an unknown part"), kExpectOuter);
  }
  OuterOptimizer outer{.lr =
                           parse_number<double>(errors, index, parts[0], "outer lr", kExpectOuter)};
  if (parts.size() > 1) {
    outer.momentum = parse_number<double>(errors, index, parts[1], "outer momentum", kExpectOuter);
  }
  outer.nesterov = parts.size() == 3;
  level.outer = outer;
}

// One item after '@' (or after the comma that continues a level's options).
void parse_option(const Errors& errors, size_t index, std::string_view item, LevelOptions& level) {
  const size_t eq = item.find('=');
  const std::string_view key = item.substr(0, eq);
  const bool has_value = eq != std::string_view::npos;
  const std::string_view value = has_value ? item.substr(eq + 1) : std::string_view();
  if (key == "outer" && has_value) {
    parse_outer(errors, index, value, level);
  } else if (key == "overlap" && has_value) {
    level.overlap_steps =
        parse_number<int64_t>(errors, index, value, "overlap", "expected overlap=K, K >= 0");
  } else if (key == "fragments" && has_value) {
    level.fragments =
        parse_number<int64_t>(errors, index, value, "fragments", "expected fragments=F, F >= 1");
  } else if ((key == "bf16" || key == "fp16")) {
    level.compression = key == "bf16" ? Compression::kBF16 : Compression::kFP16;
    if (has_value) {
      level.compression_scale = parse_number<float>(errors, index, value, "scale",
                                                    "expected bf16[=SCALE] or fp16[=SCALE]");
    }
  } else if ((key == "int8" || key == "int4") && !has_value) {
    level.compression = key == "int8" ? Compression::kInt8 : Compression::kInt4;
  } else if (key == "ef" && !has_value) {
    level.error_feedback = true;
  } else if (key == "scale") {
    errors.fail_level(index, str_cat("option '", item, "' needs a compression"),
                      "expected bf16=SCALE or fp16=SCALE");
  } else {
    errors.fail_level(index, str_cat("unknown level option '", item, "'"), kExpectOptions);
  }
}

bool is_option_key(std::string_view item) {
  const std::string_view key = item.substr(0, item.find('='));
  return key == "outer" || key == "overlap" || key == "fragments" || key == "bf16" ||
         key == "fp16" || key == "int8" || key == "int4" || key == "ef" || key == "scale";
}

// The shortest text that std::from_chars reads back as `value` (the same double or float). Such
// a text has at most 24 characters ("-2.2250738585072014e-308"), so to_chars cannot run out.
template <typename T>
std::string shortest(T value) {
  char text[32];
  return std::string(text, std::to_chars(text, text + sizeof(text), value).ptr);
}

void append_level(const LevelOptions& level, std::string& out) {
  out += str_cat(level.period, ":");
  if (level.group_size == kWholeGroup) {
    out += "world";
  } else if (level.group_size == kNodeGroup) {
    out += "node";
  } else {
    out += str_cat(level.group_size);
  }
  const char* sep = "@";
  const auto next = [&](const std::string& option) {
    out += sep;
    out += option;
    sep = ",";
  };
  if (level.outer) {
    next(str_cat("outer=", shortest(level.outer->lr), "/", shortest(level.outer->momentum),
                 level.outer->nesterov ? "/nesterov" : ""));
  }
  if (level.overlap_steps != 0) next(str_cat("overlap=", level.overlap_steps));
  if (level.fragments != 1) next(str_cat("fragments=", level.fragments));
  const std::string scale =
      level.compression_scale != 1.0f ? str_cat("=", shortest(level.compression_scale)) : "";
  if (level.compression != Compression::kNone) {
    next(str_cat(to_string(level.compression), scale));
  } else if (!scale.empty()) {
    next(str_cat("scale", scale));
  }
  if (level.error_feedback) next("ef");
}

}  // namespace

std::vector<LevelOptions> parse_hierarchy(std::string_view text) {
  const Errors errors(text);
  if (text.empty()) errors.fail("empty", kExpectPairs);
  std::vector<LevelOptions> levels;
  bool in_options = false;  // whether the last level started options with '@'
  std::string_view last_pair;
  for (const std::string_view item : split(text, ',')) {
    if (item.find(':') == std::string_view::npos) {
      if (in_options) {
        parse_option(errors, levels.size() - 1, item, levels.back());
      } else if (is_option_key(item)) {
        const std::string_view example = last_pair.empty() ? "16:4" : last_pair;
        errors.fail(
            str_cat("option '", item, "' must follow '@' on a level, e.g. ", example, "@", item),
            kExpectPairs);
      } else {
        errors.fail(str_cat("entry '", item, "' has no ':'"), kExpectPairs);
      }
      continue;
    }
    const size_t at = item.find('@');
    const std::string_view pair = item.substr(0, at);
    const size_t colon = pair.find(':');
    if (colon == std::string_view::npos) {
      errors.fail(str_cat("entry '", item, "' has no ':' before '@'"), kExpectPairs);
    }
    const std::string_view size = pair.substr(colon + 1);
    LevelOptions level{.period = parse_count(errors, pair.substr(0, colon), "period", 1)};
    level.group_size = size == "world" ? kWholeGroup
                       : size == "node"
                           ? kNodeGroup
                           : static_cast<int>(parse_count(errors, size, "group size", 0));
    levels.push_back(level);
    last_pair = pair;
    in_options = at != std::string_view::npos;
    if (in_options) parse_option(errors, levels.size() - 1, item.substr(at + 1), levels.back());
  }
  return levels;
}

std::string format_hierarchy(const std::vector<LevelOptions>& levels) {
  std::string out;
  for (const LevelOptions& level : levels) {
    if (!out.empty()) out += ",";
    append_level(level, out);
  }
  return out;
}

}  // namespace hsgd::distributed
